//! Runs of the game: which run wrote a session's record, and whether it is still going, so the start-up sweep
//! leaves alone the sessions of a copy of the game that may still resume them (an ended session lets its folder's
//! lock go).
//!
//! A run says it is going with a file of its own, `<data_dir>/.runs/<run>.lock`, locked (`flock`) from before it
//! writes its first record until the process ends, however it ends. Another copy reads that lock, which holds
//! across PID namespaces (two containers sharing the data directory, each running its game as pid 1) where a pid
//! does not. A run with no such file (written by a build from before them, or whose file could not be made) is
//! judged by its pid, as before. On Unix only, as the sweep is.

#[cfg(unix)]
use std::fs::{self, File, OpenOptions, TryLockError};
#[cfg(unix)]
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The folder of run files inside the data directory (not a session id, so the sweep passes over it).
#[cfg(unix)]
const RUNS: &str = ".runs";

/// A run of the game: its process, and a number drawn at its start (a later process may get the same pid).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Owner {
    pub pid: u32,
    pub run: u64,
}

/// This run of the game.
pub(crate) fn this_run() -> Owner {
    static RUN: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let run = *RUN.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // Keyed at random per process: a number no other run draws.
        std::collections::hash_map::RandomState::new().build_hasher().finish()
    });
    Owner { pid: std::process::id(), run }
}

#[cfg(unix)]
fn run_file(data_dir: &Path, run: u64) -> PathBuf {
    data_dir.join(RUNS).join(format!("{run:016x}.lock"))
}

/// Says (blocking) that this run is going, in `data_dir`: its run file, made and locked once per data directory and
/// held until the process ends. Best effort: without it, another copy judges this run by its pid.
#[cfg(unix)]
pub(crate) fn mark_going(data_dir: &Path) {
    static HELD: parking_lot::Mutex<Vec<(PathBuf, File)>> = parking_lot::Mutex::new(Vec::new());
    let mut held = HELD.lock();
    if held.iter().any(|(dir, _)| dir == data_dir) {
        return;
    }
    match take_run_file(data_dir) {
        Ok(file) => held.push((data_dir.to_path_buf(), file)),
        Err(error) => tracing::warn!(
            data_dir = %data_dir.display(), %error,
            "could not mark this run of the game as going: another copy judges it by its process id"
        ),
    }
}

/// Makes this run's file, locked before it has its name: another copy never finds it unlocked while this run goes.
#[cfg(unix)]
fn take_run_file(data_dir: &Path) -> std::io::Result<File> {
    let path = run_file(data_dir, this_run().run);
    let Some(runs) = path.parent() else { return Err(std::io::ErrorKind::InvalidInput.into()) };
    crate::private::ensure_dir(runs)?;
    let staging = runs.join(format!(".{:016x}.lock", this_run().run));
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&staging)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Err(std::io::ErrorKind::WouldBlock.into()),
        Err(TryLockError::Error(error)) => return Err(error),
    }
    fs::rename(&staging, &path)?;
    Ok(file)
}

/// Whether run `owner` is still going: this one, or another copy of the game whose run file is locked; by its pid
/// if it has no run file (a pid reused by another program reads as going, which only leaves a folder for a later
/// sweep).
#[cfg(unix)]
pub(crate) fn running(data_dir: &Path, owner: Owner) -> bool {
    let this = this_run();
    if owner == this {
        return true;
    }
    if let Some(going) = locked(&run_file(data_dir, owner.run)) {
        return going;
    }
    if owner.pid == this.pid {
        // An earlier process that had the same pid (a container runs its game as pid 1).
        return false;
    }
    let Ok(pid) = libc::pid_t::try_from(owner.pid) else { return false };
    // SAFETY: signal 0 sends nothing; `kill` only checks that the process exists and may be signalled.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    alive || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether the run file at `path` is locked (its run goes on); `None` if there is none, or it cannot be locked here.
#[cfg(unix)]
fn locked(path: &Path) -> Option<bool> {
    let file = OpenOptions::new().read(true).write(true).open(path).ok()?;
    match file.try_lock() {
        Ok(()) => Some(false),
        Err(TryLockError::WouldBlock) => Some(true),
        Err(TryLockError::Error(_)) => None,
    }
}

/// Removes (blocking) the run files of runs that are over, after the start-up sweep read them: one is left by every
/// run that wrote a record. (Not a file being named: those start with a dot.)
#[cfg(unix)]
pub(crate) fn remove_ended(data_dir: &Path) {
    let Ok(entries) = fs::read_dir(data_dir.join(RUNS)) else { return };
    let own = run_file(data_dir, this_run().run);
    for entry in entries.flatten() {
        let path = entry.path();
        if path == own {
            // Never locked a second time here: where `flock` is emulated with a process's POSIX locks (NFS), that
            // second descriptor's close would release this run's own lock.
            continue;
        }
        let named = entry.file_name().to_str().is_some_and(|name| !name.starts_with('.') && name.ends_with(".lock"));
        if named && locked(&path) == Some(false) {
            let _ = fs::remove_file(&path);
        }
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_run_whose_file_is_locked_is_going_whatever_its_pid_and_one_whose_file_is_not_is_over() {
        let dir = tempfile::tempdir().expect("temp dir");
        mark_going(dir.path());
        assert!(run_file(dir.path(), this_run().run).exists(), "this run's file");
        assert!(running(dir.path(), this_run()));

        // Another container's game, pid 1 there as here, going: its file is locked.
        let other = Owner { pid: this_run().pid, run: this_run().run.wrapping_add(1) };
        let path = run_file(dir.path(), other.run);
        let file = File::create(&path).expect("made");
        file.lock().expect("locked");
        assert!(running(dir.path(), other), "its file is locked");
        remove_ended(dir.path());
        assert!(path.exists(), "the file of a run still going is kept");
        drop(file);
        assert!(!running(dir.path(), other), "its process ended: the lock went with it");
        remove_ended(dir.path());
        assert!(!path.exists(), "the file of a run that is over is removed");
        assert!(run_file(dir.path(), this_run().run).exists(), "and this run's is kept");
        assert!(!running(dir.path(), other), "without a file, this pid with another run number: an earlier process");
    }
}
