//! A session is open in one copy of the game at a time: each copy locks the session's folder (`<data_dir>/<id>`,
//! `flock` on the folder itself) while it has the session (from its start or re-attach until it ends, is
//! forgotten, or the game exits; `resume` takes an ended one's again), so a second copy of the game (or a second app sharing
//! the data directory) that resumes or forgets the same kept session is refused (`SESSION_BUSY`) instead of
//! running a second agent on it, writing over its history, or deleting it under the first. The lock goes with the
//! process, however it ends; nothing is written for it, so deleting the folder leaves nothing behind (a copy that
//! comes after the deletion finds no folder: `SESSION_NOT_FOUND`). On Unix only: elsewhere (and on file systems
//! without locks) sessions are not locked.

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::ToolError;

/// A lock on a session's folder, taken on a blocking thread and kept by [`InUse::keep`] (dropped, it lets go).
/// Where the folder cannot be locked (no locks on its file system), it holds nothing.
pub(crate) struct Lock {
    // Held for its lock; read by the start-up sweep (Unix only).
    #[cfg_attr(not(unix), allow(dead_code))]
    folder: Option<File>,
}

impl Lock {
    /// Whether the folder is really locked (another copy of the game would be refused).
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(crate) fn is_real(&self) -> bool {
        self.folder.is_some()
    }
}

/// The sessions this copy of the game has open, by id.
#[derive(Clone, Default)]
pub(crate) struct InUse {
    held: Arc<Mutex<HashMap<String, Lock>>>,
}

impl InUse {
    /// Whether this copy holds session `id`.
    pub(crate) fn holds(&self, id: &str) -> bool {
        self.held.lock().contains_key(id)
    }

    /// Keeps `lock` as session `id`'s (one already kept stays).
    pub(crate) fn keep(&self, id: &str, lock: Lock) {
        self.held.lock().entry(id.to_string()).or_insert(lock);
    }

    /// Lets session `id` go.
    pub(crate) fn let_go(&self, id: &str) {
        self.held.lock().remove(id);
    }
}

/// Locks session `id`'s folder `dir` (blocking: call it on a blocking thread). `SESSION_NOT_FOUND` if the folder
/// is not there, `SESSION_BUSY` if another copy of the game holds it.
pub(crate) fn lock(id: &str, dir: &Path) -> Result<Lock, ToolError> {
    #[cfg(unix)]
    {
        use std::fs::TryLockError;
        let folder = match File::open(dir) {
            Ok(folder) => folder,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(super::record::not_found(id));
            }
            Err(error) => return Err(unlockable(id, dir, error)),
        };
        // A lock this copy let go of a moment ago may still be held by a process being started: the folder's lock
        // names no holder, so any holder may be this copy.
        match crate::file_lock::try_lock(&folder, |_| true) {
            Ok(()) => Ok(Lock { folder: Some(folder) }),
            Err(TryLockError::WouldBlock) => Err(ToolError::with_code(
                crate::error::ErrorCode::SessionBusy,
                format!(
                    "session `{id}` is open in another copy of the game: a session is open in one at a time; close \
                     it there first"
                ),
            )
            .with_detail("session", id)),
            // A file system without locks (some network mounts): not locked, as elsewhere.
            Err(TryLockError::Error(error)) if unsupported(&error) => {
                // Once per run: a property of the file system, not of the session.
                static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        session = id,
                        %error,
                        "sessions' folders cannot be locked on this file system: two copies of the game could open \
                         the same session (said once)"
                    );
                }
                Ok(Lock { folder: None })
            }
            Err(TryLockError::Error(error)) => Err(unlockable(id, dir, error)),
        }
    }
    #[cfg(not(unix))]
    {
        if !dir.is_dir() {
            return Err(super::record::not_found(id));
        }
        Ok(Lock { folder: None })
    }
}

#[cfg(unix)]
fn unsupported(error: &std::io::Error) -> bool {
    error.kind() == std::io::ErrorKind::Unsupported
        || matches!(error.raw_os_error(), Some(code) if code == libc::ENOLCK || code == libc::EOPNOTSUPP)
}

#[cfg(unix)]
fn unlockable(id: &str, dir: &Path, error: std::io::Error) -> ToolError {
    ToolError::with_code(
        crate::error::ErrorCode::AgentUnavailable,
        format!("could not lock session `{id}`'s folder {}: {error}", dir.display()),
    )
    .with_detail("session", id)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn a_session_held_by_one_copy_is_busy_for_another_until_it_lets_go_and_gone_once_deleted() {
        let dir = tempfile::tempdir().expect("temp dir");
        let folder = dir.path().join("chat-1");
        std::fs::create_dir(&folder).expect("made");
        let (first, second) = (InUse::default(), InUse::default());
        first.keep("chat-1", lock("chat-1", &folder).expect("free"));
        assert!(first.holds("chat-1"));
        let busy = lock("chat-1", &folder).err().expect("held by the first");
        assert_eq!(busy.code, ErrorCode::SessionBusy);
        first.let_go("chat-1");
        second.keep("chat-1", lock("chat-1", &folder).expect("free again"));
        // Deleted while held (as `forget` does): the next copy finds nothing, and nothing is left behind.
        std::fs::remove_dir(&folder).expect("removed while locked");
        second.let_go("chat-1");
        assert_eq!(lock("chat-1", &folder).err().expect("gone").code, ErrorCode::SessionNotFound);
        assert!(!folder.exists());
    }
}
