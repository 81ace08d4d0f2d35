//! Session records: what the game must remember to resume a session after a restart (its configuration, the
//! backend's id for it, whether it ended), one small JSON file per session, `<data_dir>/<id>/session.json`,
//! replaced atomically and durably (file and directory synced), readable only by the user.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::SessionConfig;
use crate::error::{ErrorCode, ToolError};

const FILE: &str = "session.json";

/// One session's record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Record {
    pub id: String,
    pub config: SessionConfig,
    pub backend_session: Option<String>,
    pub ended: bool,
}

/// Where records live.
#[derive(Clone)]
pub(crate) struct Records {
    pub data_dir: PathBuf,
    runtime: tokio::runtime::Handle,
}

impl Records {
    pub(crate) fn new(data_dir: PathBuf, runtime: tokio::runtime::Handle) -> Self {
        Self { data_dir, runtime }
    }

    fn path(&self, id: &str) -> Result<PathBuf, ToolError> {
        check_id(id)?;
        Ok(super::config::session_dir(&self.data_dir, id).join(FILE))
    }

    /// Writes `record` on a blocking thread (file I/O never blocks the main thread or the runtime) and resolves
    /// when it is durable, so records of one session are written in the order they were made. A failure is
    /// logged: the session goes on, only its resumption after a restart is lost.
    pub(crate) async fn save(&self, record: Record) {
        let Ok(path) = self.path(&record.id) else { return };
        let written = self.runtime.spawn_blocking(move || {
            if let Err(error) = write(&path, &record) {
                tracing::error!(session = %record.id, path = %path.display(), %error, "could not save the session's record");
            }
        });
        let _ = written.await;
    }

    /// Reads the record of session `id`: `SESSION_NOT_FOUND` if there is none.
    pub(crate) async fn load(&self, id: &str) -> Result<Record, ToolError> {
        let path = self.path(id)?;
        let id = id.to_string();
        let read = self.runtime.spawn_blocking(move || std::fs::read(&path).map(|bytes| (bytes, path)));
        match read.await {
            Ok(Ok((bytes, path))) => serde_json::from_slice(&bytes).map_err(|error| {
                ToolError::with_code(
                    ErrorCode::SessionNotFound,
                    format!("the record of session `{id}` at {} is unreadable: {error}", path.display()),
                )
            }),
            Ok(Err(error)) if error.kind() == std::io::ErrorKind::NotFound => Err(not_found(&id)),
            Ok(Err(error)) => Err(ToolError::internal(format!("could not read the record of session `{id}`: {error}"))),
            Err(error) => Err(ToolError::internal(format!("could not read the record of session `{id}`: {error}"))),
        }
    }
}

pub(crate) fn not_found(id: &str) -> ToolError {
    ToolError::with_code(
        ErrorCode::SessionNotFound,
        format!("no agent session `{id}` is known: remove the stale id, or create a new session"),
    )
    .with_detail("session", id)
}

/// Session ids name folders: only what the game itself mints passes (letters, digits, `-`, `_`).
fn check_id(id: &str) -> Result<(), ToolError> {
    if id.is_empty() {
        return Err(ToolError::invalid_input("session", "the session id is empty"));
    }
    if id.len() > 64 || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(not_found(id));
    }
    Ok(())
}

fn write(path: &Path, record: &Record) -> std::io::Result<()> {
    write_private(path, &serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?)
}

/// Replaces the file at `path` with `bytes` atomically and durably (file and directory synced), readable only by
/// the user: what sessions keep on disk (records, histories) may say what the player typed.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = atomic_write_file::AtomicWriteFile::open(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.as_file().set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    file.write_all(bytes)?;
    file.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_are_not_the_games_own_never_name_a_path() {
        for id in ["../etc", "a/b", "..", "x y", &"z".repeat(65)] {
            assert_eq!(check_id(id).unwrap_err().code, ErrorCode::SessionNotFound, "{id}");
        }
        assert_eq!(check_id("").unwrap_err().code, ErrorCode::InvalidInput);
        assert!(check_id("chat-0123abcd").is_ok());
    }
}
