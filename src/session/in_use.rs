//! A session is open in one copy of the game at a time: each copy holds a lock on the session's folder
//! (`<data_dir>/<id>/session.lock`, `flock` on Unix, `LockFileEx` on Windows) while it has the session, so a
//! second copy of the game (or a second app sharing the data directory) that resumes the same kept session is
//! refused (`SESSION_BUSY`) instead of running a second agent on it and writing over its history. The lock goes
//! with the process, however it ends.

use std::collections::HashMap;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{ErrorCode, ToolError};

const LOCK_FILE: &str = "session.lock";

/// The sessions this copy of the game holds, by id.
#[derive(Clone, Default)]
pub(crate) struct InUse {
    held: Arc<Mutex<HashMap<String, File>>>,
}

impl InUse {
    /// Takes session `id`'s lock in its folder `dir` (which exists), unless this copy holds it already.
    /// `SESSION_BUSY` if another copy holds it.
    pub(crate) fn hold(&self, id: &str, dir: &Path) -> Result<(), ToolError> {
        let mut held = self.held.lock();
        if held.contains_key(id) {
            return Ok(());
        }
        let path = dir.join(LOCK_FILE);
        let unusable = |error: std::io::Error| {
            ToolError::internal(format!("could not lock session `{id}` ({}): {error}", path.display()))
        };
        let mut file =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(unusable)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let holder: Option<u32> = file.read_to_string(&mut text).ok().and_then(|_| text.trim().parse().ok());
                let by = holder.map(|pid| format!(" (process {pid})")).unwrap_or_default();
                return Err(ToolError::with_code(
                    ErrorCode::SessionBusy,
                    format!(
                        "session `{id}` is open in another copy of the game{by}: a session is open in one at a \
                         time; close it there first"
                    ),
                )
                .with_detail("session", id)
                .with_detail("holder_pid", holder));
            }
            Err(TryLockError::Error(error)) => return Err(unusable(error)),
        }
        // The pid is only for the other copy's error message: best effort.
        let _ = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| write!(file, "{}", std::process::id()));
        held.insert(id.to_string(), file);
        Ok(())
    }

    /// Lets session `id` go (before its folder is deleted: on Windows an open file keeps it).
    pub(crate) fn let_go(&self, id: &str) {
        self.held.lock().remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_held_by_one_copy_is_busy_for_another_until_it_lets_go() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (first, second) = (InUse::default(), InUse::default());
        first.hold("chat-1", dir.path()).expect("free");
        first.hold("chat-1", dir.path()).expect("held already by this copy");
        let busy = second.hold("chat-1", dir.path()).expect_err("held by the first");
        assert_eq!(busy.code, ErrorCode::SessionBusy);
        assert!(busy.message.contains(&format!("process {}", std::process::id())), "{}", busy.message);
        first.let_go("chat-1");
        second.hold("chat-1", dir.path()).expect("free again");
    }
}
