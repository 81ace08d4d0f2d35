//! Session records: what the game must remember to resume a session after a restart (its configuration, the
//! backend's id for it, whether it ended), one small JSON file per session, `<data_dir>/<id>/session.json`,
//! replaced atomically and durably (file and directory synced), readable only by the user, and read back only
//! if the user owns it and no one else may write it (`crate::private`): a record names the program its session
//! starts.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::runs::Owner;
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
    /// How many runs of the game took the session up after the run that created it (a record without it: none).
    #[serde(default)]
    pub runs: u64,
    /// The run of the game that last wrote it: the start-up sweep leaves a session of a run still going alone (an
    /// ended session lets its folder's lock go, and its game may still resume it).
    #[serde(default)]
    pub owner: Option<Owner>,
    /// The game's instructions have yet to reach the agent (it takes no system prompt, and no turn that carried
    /// them ended): they go with the session's next turn. A record without it: they had.
    #[serde(default)]
    pub instructions_owed: bool,
}

/// Where records live.
#[derive(Clone)]
pub(crate) struct Records {
    pub data_dir: PathBuf,
    /// The default data dir's parent, the user's own temporary directory: made private before use.
    private_root: Option<PathBuf>,
    runtime: tokio::runtime::Handle,
    /// New sessions given up on after they connected (their `create` dropped while their first record was
    /// being written), and sessions forgotten: a write of theirs still under way is dropped, not left as a folder
    /// nobody knows (or a forgotten session brought back). Its lock is held by each record write and folder
    /// removal, so one never runs into the other.
    abandoned: Arc<Mutex<HashSet<String>>>,
    /// The removals of new sessions' folders under way ([`remove_new`](Self::remove_new)): the game's exit waits
    /// for them, since the runtime's stop drops a blocking task that has not started yet.
    pub removing: Arc<super::under_way::UnderWay>,
}

impl Records {
    /// Records under `data_dir`, or under the default (`<the user's own temporary directory>/sessions`).
    pub(crate) fn new(data_dir: Option<PathBuf>, runtime: tokio::runtime::Handle) -> Self {
        match data_dir {
            Some(data_dir) => {
                // Made absolute once: a session's working directory is its ACP `cwd`, which must be absolute, and
                // a game that changes its current directory later keeps finding its sessions.
                let data_dir = std::path::absolute(&data_dir).unwrap_or(data_dir);
                Self { data_dir, private_root: None, runtime, abandoned: Arc::default(), removing: Arc::default() }
            }
            None => {
                let root = crate::private::default_dir();
                let data_dir = root.join("sessions");
                let (abandoned, removing) = (Arc::default(), Arc::default());
                Self { data_dir, private_root: Some(root), runtime, abandoned, removing }
            }
        }
    }

    /// Whether the records are in the default folder, inside the system's temporary directory (which the system
    /// may clean), the game having set no `data_dir`.
    pub(crate) fn in_temporary_dir(&self) -> bool {
        self.private_root.is_some()
    }

    fn path(&self, id: &str) -> Result<PathBuf, ToolError> {
        check_id(id)?;
        Ok(super::config::session_dir(&self.data_dir, id).join(FILE))
    }

    /// Session `id`'s folder, `<data_dir>/<id>`, made if missing and the user's alone (mode 0700 on Unix; with the
    /// default data dir, the folders above it too). One this user does not own is refused.
    pub(crate) fn session_dir(&self, id: &str) -> std::io::Result<PathBuf> {
        if let Some(root) = &self.private_root {
            crate::private::ensure_dir(root)?;
            crate::private::ensure_dir(&self.data_dir)?;
        }
        let dir = super::config::session_dir(&self.data_dir, id);
        crate::private::ensure_dir(&dir)?;
        Ok(dir)
    }

    /// Deletes (blocking) the folders of sessions that were not kept (`auto_end_on_disconnect`) and that no copy
    /// of the game has open: a game that did not exit cleanly (a crash, a kill) could not delete them itself, and
    /// nothing resumes them. On Unix only, where a session open in another copy is known by its lock.
    pub(crate) fn sweep_unkept(&self) {
        #[cfg(unix)]
        {
            let Ok(entries) = std::fs::read_dir(&self.data_dir) else { return };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if check_id(&name).is_err() || !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    continue;
                }
                // Read first without the lock: a kept session, or a folder whose record is not written yet, is
                // never locked here (a lock would refuse this copy's own resume or create of it meanwhile).
                if !self.unkept_record(&entry.path()) {
                    continue;
                }
                // Open in a copy of the game (this one included), gone, or not lockable here: not ours to delete.
                let Ok(lock) = super::in_use::lock(&name, &entry.path()) else { continue };
                if !lock.is_real() || !self.unkept_record(&entry.path()) {
                    continue;
                }
                match remove_folder(&entry.path()) {
                    Ok(()) => {
                        tracing::info!(session = %name, "deleted a session not kept, left by a game that did not exit")
                    }
                    Err(error) => {
                        tracing::warn!(session = %name, %error, "could not delete a session that was not kept")
                    }
                }
            }
            super::runs::remove_ended(&self.data_dir);
        }
    }

    /// Whether the folder `dir` holds a readable record of a session that was not kept, of a game process that is
    /// no longer running.
    #[cfg(unix)]
    fn unkept_record(&self, dir: &Path) -> bool {
        let record = crate::private::read(&dir.join(FILE)).ok();
        let record: Option<Record> = record.and_then(|bytes| serde_json::from_slice(&bytes).ok());
        record.is_some_and(|record| {
            record.config.auto_end_on_disconnect
                && !record.owner.is_some_and(|owner| super::runs::running(&self.data_dir, owner))
        })
    }

    /// Session `id`'s folder if it exists (and `id` is one the game mints).
    pub(crate) fn existing_dir(&self, id: &str) -> Option<PathBuf> {
        check_id(id).ok()?;
        let dir = super::config::session_dir(&self.data_dir, id);
        std::fs::symlink_metadata(&dir).is_ok_and(|meta| meta.is_dir()).then_some(dir)
    }

    /// Writes `record` on a blocking thread (file I/O never blocks the main thread or the runtime) and resolves
    /// when it is durable, so records of one session are written in the order they were made. A failure is
    /// logged: the session goes on, only its resumption after a restart is lost.
    pub(crate) async fn save(&self, record: Record) {
        let Ok(path) = self.path(&record.id) else { return };
        let records = self.clone();
        let written = self.runtime.spawn_blocking(move || {
            let abandoned = records.abandoned.lock();
            if abandoned.contains(&record.id) {
                return;
            }
            let dir = records.session_dir(&record.id);
            // Before the record names this run: another copy's sweep reads the run as going from the first.
            #[cfg(unix)]
            if dir.is_ok() && record.owner.is_some() {
                super::runs::mark_going(&records.data_dir);
            }
            if let Err(error) = dir.and_then(|_| write(&path, &record)) {
                tracing::error!(session = %record.id, path = %path.display(), %error, "could not save the session's record");
            }
        });
        let _ = written.await;
    }

    /// Deletes session `id`'s folder (`<data_dir>/<id>`: record, history, working directory), on a blocking
    /// thread: only a real folder that holds a record, or that a session of this run made (`of_this_run`), never
    /// anything else of the data dir (a game's own folder, a file, a link). `SESSION_NOT_FOUND` otherwise.
    /// A record write still under way for it (a `resume` dropped while it wrote) waits for the removal and is then
    /// dropped, as every later one is: a forgotten session never comes back.
    pub(crate) async fn forget(&self, id: &str, of_this_run: bool) -> Result<(), ToolError> {
        check_id(id)?;
        let dir = super::config::session_dir(&self.data_dir, id);
        let (abandoned, id_owned) = (self.abandoned.clone(), id.to_string());
        let removed = self.runtime.spawn_blocking(move || {
            {
                // A write under way finishes first; every later one sees the mark and is dropped. Not held for the
                // removal (a large working directory): a new session given up on takes it at once.
                let mut writes = abandoned.lock();
                let is_folder = std::fs::symlink_metadata(&dir).is_ok_and(|meta| meta.is_dir());
                let has_record = std::fs::symlink_metadata(dir.join(FILE)).is_ok_and(|meta| meta.is_file());
                if !is_folder || !(has_record || of_this_run) {
                    return Ok(false);
                }
                writes.insert(id_owned.clone());
            }
            // The record goes last: a removal that fails leaves it, and the session, whose writes count again.
            remove_folder(&dir).map(|()| true).inspect_err(|_| {
                abandoned.lock().remove(&id_owned);
            })
        });
        match removed.await.map_err(std::io::Error::other).and_then(|removed| removed) {
            Ok(true) => Ok(()),
            Ok(false) => Err(not_found(id)),
            Err(error) => Err(ToolError::internal(format!("could not delete session `{id}`'s folder: {error}"))),
        }
    }

    /// Removes the folder of a new session `id` that never became one (its start failed, or its `create` was
    /// dropped), on a blocking thread: a game whose agent cannot start is not left a folder per attempt.
    /// `connected`: its agent had started, so its first record may be being written: that write is dropped.
    pub(crate) fn remove_new(&self, id: &str, connected: bool) {
        if check_id(id).is_err() {
            return;
        }
        if connected {
            self.abandoned.lock().insert(id.to_string());
        }
        let dir = super::config::session_dir(&self.data_dir, id);
        let abandoned = self.abandoned.clone();
        let under_way = super::under_way::UnderWay::begin(&self.removing);
        self.runtime.spawn_blocking(move || {
            let _under_way = under_way;
            let _writes = abandoned.lock();
            if let Err(error) = remove_folder(&dir) {
                tracing::warn!(path = %dir.display(), %error, "could not remove the folder of a session that did not start");
            }
        });
    }

    /// Reads the record of session `id`: `SESSION_NOT_FOUND` if there is none.
    pub(crate) async fn load(&self, id: &str) -> Result<Record, ToolError> {
        let path = self.path(id)?;
        let id = id.to_string();
        let read = self.runtime.spawn_blocking(move || crate::private::read(&path).map(|bytes| (bytes, path)));
        match read.await {
            Ok(Ok((bytes, path))) => {
                let record: Record = serde_json::from_slice(&bytes).map_err(|error| {
                    ToolError::with_code(
                        ErrorCode::SessionNotFound,
                        format!("the record of session `{id}` at {} is unreadable: {error}", path.display()),
                    )
                })?;
                // A folder copied or renamed: its record is another session's, whose agent session it would drive
                // too.
                if record.id != id {
                    return Err(ToolError::with_code(
                        ErrorCode::SessionNotFound,
                        format!(
                            "the record at {} is session `{}`'s, not `{id}`'s: not used",
                            path.display(),
                            record.id
                        ),
                    )
                    .with_detail("session", id.as_str()));
                }
                Ok(record)
            }
            Ok(Err(error)) if error.kind() == std::io::ErrorKind::NotFound => Err(not_found(&id)),
            // Someone else could have written it (and chosen the program it starts): not used.
            Ok(Err(error)) if error.kind() == std::io::ErrorKind::PermissionDenied => Err(ToolError::with_code(
                ErrorCode::SessionNotFound,
                format!("the record of session `{id}` is not used: {error}"),
            )
            .with_detail("session", id.as_str())),
            Ok(Err(error)) => Err(ToolError::internal(format!("could not read the record of session `{id}`: {error}"))),
            Err(error) => Err(ToolError::internal(format!("could not read the record of session `{id}`: {error}"))),
        }
    }
}

/// Removes `dir` and what is in it; a folder already gone is removed. The record goes last: a removal that fails
/// part-way (a file the agent left read-only, one still open on Windows) leaves the record, so the session is
/// still known and `forget` can be asked again. A file that lands meanwhile (a history written at the end of a
/// turn, an agent writing in its working directory as it is stopped): again, three times.
fn remove_folder(dir: &Path) -> std::io::Result<()> {
    let mut attempts = 0;
    loop {
        match remove_record_last(dir, &remove_entry) {
            Ok(()) => return Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(_) if attempts < 3 => attempts += 1,
            Err(error) => return Err(error),
        }
    }
}

/// Removes one entry of a session's folder (`is_dir`: a folder, not a link to one).
fn remove_entry(path: &Path, is_dir: bool) -> std::io::Result<()> {
    match is_dir {
        true => std::fs::remove_dir_all(path),
        false => std::fs::remove_file(path),
    }
}

/// Removes what is in `dir` but the record (with `remove`), then the record, then `dir`.
fn remove_record_last(dir: &Path, remove: &dyn Fn(&Path, bool) -> std::io::Result<()>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name() == FILE {
            continue;
        }
        // Not followed: a link is removed, never what it points to.
        match remove(&entry.path(), entry.file_type()?.is_dir()) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
    }
    match std::fs::remove_file(dir.join(FILE)) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    std::fs::remove_dir(dir)
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
    // What the game makes (`chat-<hex>`): lower case only, so that on a file system that ignores case (macOS,
    // Windows) no two ids name one folder, and the in-use locks, keyed by the id, see one session once.
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_';
    if id.len() > 64 || !id.chars().all(allowed) {
        return Err(not_found(id));
    }
    Ok(())
}

fn write(path: &Path, record: &Record) -> std::io::Result<()> {
    crate::private::write(path, &serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_data_dir_is_made_absolute_so_a_sessions_working_directory_is_a_valid_acp_cwd() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        let records = Records::new(Some(PathBuf::from("data/agent-sessions")), runtime.handle().clone());
        assert!(records.data_dir.is_absolute(), "{}", records.data_dir.display());
        assert!(records.data_dir.ends_with("data/agent-sessions"));
    }

    #[test]
    fn a_folder_removal_that_fails_part_way_keeps_the_record_so_it_can_be_asked_again() {
        let dir = tempfile::tempdir().expect("temp dir");
        let session = dir.path().join("chat-1");
        std::fs::create_dir_all(session.join("workspace").join("stuck")).expect("made");
        std::fs::write(session.join(FILE), b"{}").expect("written");
        std::fs::write(session.join("history.json"), b"[]").expect("written");
        // The working directory cannot be removed now (a file the agent left read-only, one open on Windows).
        let stuck = |path: &Path, is_dir: bool| match path.ends_with("workspace") {
            true => Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied)),
            false => remove_entry(path, is_dir),
        };
        assert!(remove_record_last(&session, &stuck).is_err());
        assert!(session.join(FILE).exists(), "the record stays while anything else is left");
        remove_folder(&session).expect("asked again, it goes");
        assert!(!session.exists());
    }

    #[cfg(unix)]
    #[test]
    fn a_link_in_a_session_folder_is_removed_and_never_followed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let session = dir.path().join("chat-1");
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).expect("made");
        std::fs::write(outside.join("keep"), b"x").expect("written");
        std::fs::create_dir(&session).expect("made");
        std::os::unix::fs::symlink(&outside, session.join("link")).expect("linked");
        remove_folder(&session).expect("removed");
        assert!(outside.join("keep").exists(), "what the link pointed to is untouched");
    }

    #[cfg(unix)]
    #[test]
    fn the_start_up_sweep_deletes_unkept_sessions_only_of_games_no_longer_running() {
        let dir = tempfile::tempdir().expect("temp dir");
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        let records = Records::new(Some(dir.path().to_path_buf()), runtime.handle().clone());
        // Another copy of the game, still running, whose ended session let its folder's lock go.
        let mut other = std::process::Command::new("sleep").arg("60").spawn().expect("a running process");
        let config = super::super::SessionConfig::acp("agent", ["--acp"]);
        let (this, pid) = (super::super::runs::this_run(), std::process::id());
        // Another container's game sharing the data directory, going, with the same pid as this one: its run file
        // is locked.
        let container = Owner { pid, run: this.run.wrapping_add(2) };
        std::fs::create_dir_all(dir.path().join(".runs")).expect("made");
        let run_file = std::fs::File::create(dir.path().join(".runs").join(format!("{:016x}.lock", container.run)));
        let run_file = run_file.expect("made");
        run_file.lock().expect("locked");
        let owners = [
            ("chat-running", Some(Owner { pid: other.id(), run: 1 })),
            ("chat-mine", Some(this)),
            ("chat-earlier", Some(Owner { pid, run: this.run.wrapping_add(1) })),
            ("chat-old", None),
            ("chat-container", Some(container)),
        ];
        for (id, owner) in owners {
            let folder = records.session_dir(id).expect("made");
            let record = Record {
                id: id.into(),
                config: config.clone(),
                backend_session: None,
                ended: true,
                runs: 0,
                owner,
                instructions_owed: false,
            };
            write(&folder.join(FILE), &record).expect("written");
        }
        records.sweep_unkept();
        let _ = other.kill();
        let _ = other.wait();
        assert!(dir.path().join("chat-running").exists(), "its game still runs, and may resume it");
        assert!(dir.path().join("chat-mine").exists(), "this run's, ended before the sweep came to it");
        assert!(!dir.path().join("chat-earlier").exists(), "this pid, another run: an earlier process's");
        assert!(!dir.path().join("chat-old").exists(), "a record from before owners were written");
        assert!(dir.path().join("chat-container").exists(), "its run file is locked: its game still runs");
        drop(run_file);
        records.sweep_unkept();
        assert!(!dir.path().join("chat-container").exists(), "its game has ended");
    }

    #[test]
    fn ids_that_are_not_the_games_own_never_name_a_path() {
        // Upper case too: on a file system that ignores case, `CHAT-AB12` would open `chat-ab12`'s folder as
        // another session.
        for id in ["../etc", "a/b", "..", "x y", &"z".repeat(65), "CHAT-AB12", "Chat-1"] {
            assert_eq!(check_id(id).unwrap_err().code, ErrorCode::SessionNotFound, "{id}");
        }
        assert_eq!(check_id("").unwrap_err().code, ErrorCode::InvalidInput);
        assert!(check_id("chat-0123abcd").is_ok());
    }

    #[test]
    fn a_record_written_after_its_session_was_forgotten_does_not_bring_it_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().expect("a runtime");
        let records = Records::new(Some(dir.path().to_path_buf()), runtime.handle().clone());
        let record = Record {
            id: "chat-gone".into(),
            config: super::super::SessionConfig::acp("agent", ["--acp"]),
            backend_session: Some("agent-session-1".into()),
            ended: true,
            runs: 0,
            owner: None,
            instructions_owed: false,
        };
        runtime.block_on(records.save(record.clone()));
        runtime.block_on(records.forget("chat-gone", false)).expect("forgotten");
        // A write of a `resume` dropped while it ran, coming after the removal.
        runtime.block_on(records.save(record));
        assert!(!dir.path().join("chat-gone").exists(), "the folder is not made again");
        assert_eq!(runtime.block_on(records.load("chat-gone")).unwrap_err().code, ErrorCode::SessionNotFound);
    }

    #[test]
    fn a_record_in_a_folder_of_another_sessions_id_is_not_used() {
        // A session's folder copied or renamed: resumed under the new name, it would drive the other session's
        // agent session too.
        let dir = tempfile::tempdir().expect("temp dir");
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().expect("a runtime");
        let records = Records::new(Some(dir.path().to_path_buf()), runtime.handle().clone());
        let config = super::super::SessionConfig::acp("agent", ["--acp"]);
        let record = |id: &str| Record {
            id: id.into(),
            config: config.clone(),
            backend_session: Some("agent-session-1".into()),
            ended: false,
            runs: 0,
            owner: None,
            instructions_owed: false,
        };
        write(&records.session_dir("chat-a").expect("made").join(FILE), &record("chat-a")).expect("written");
        write(&records.session_dir("chat-b").expect("made").join(FILE), &record("chat-a")).expect("written");
        assert_eq!(runtime.block_on(records.load("chat-a")).expect("its own"), record("chat-a"));
        let error = runtime.block_on(records.load("chat-b")).expect_err("another session's record");
        assert_eq!(error.code, ErrorCode::SessionNotFound);
        assert!(error.message.contains("is session `chat-a`'s, not `chat-b`'s"), "{}", error.message);
    }

    #[cfg(unix)]
    #[test]
    fn the_default_data_dir_and_every_session_folder_are_the_users_alone() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |dir: &Path| std::fs::metadata(dir).expect("metadata").permissions().mode() & 0o777;
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        let records = Records::new(None, runtime.handle().clone());
        assert!(records.data_dir.starts_with(crate::private::default_dir()));
        let id = format!("chat-test-{}", std::process::id());
        let folder = records.session_dir(&id).expect("made");
        assert_eq!(folder, records.data_dir.join(&id));
        for dir in [crate::private::default_dir(), records.data_dir.clone(), folder.clone()] {
            assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        }
        std::fs::remove_dir(folder).expect("removed");

        let chosen = tempfile::tempdir().expect("temp dir");
        let records = Records::new(Some(chosen.path().join("sessions")), runtime.handle().clone());
        let folder = records.session_dir("chat-0123abcd").expect("made");
        assert_eq!(mode(&folder), 0o700, "a chosen data dir's session folders too");
    }
}
