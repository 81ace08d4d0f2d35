//! One world's directory, used only from blocking I/O threads and only inside the world's queue: the lock
//! file, the primary and previous save of each document, atomic durable replacement.
//!
//! Layout of `<data dir>/<world>/`:
//!
//! | file | what |
//! | --- | --- |
//! | `world.lock` | held (`flock`) while this process uses the world; holds its pid |
//! | `<doc>.json` | the primary save, in an [envelope](super::envelope) |
//! | `<doc>.json.prev` | the save before it, loaded if the primary is damaged |
//! | `.<doc>.json.*` | temporary files; a crash can leave them, the next lock holder removes them |

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use atomic_write_file::AtomicWriteFile;

use super::envelope;
use super::error::StoreError;
use super::faults::WriteFaults;
use crate::ids::WorldId;

const LOCK_FILE: &str = "world.lock";

/// Where an intact document was found.
pub(crate) enum Found {
    /// The primary file.
    Primary(PathBuf, Vec<u8>),
    /// The previous save, because the primary was damaged or missing.
    Previous(PathBuf, Vec<u8>),
}

pub(crate) struct WorldFiles {
    world: WorldId,
    dir: PathBuf,
    /// Held for as long as the store lives: the OS releases it if the process dies, so a crash never leaves a
    /// stale lock behind.
    lock: Option<File>,
    /// Documents whose primary this process wrote or read intact: no need to re-read them before rotating.
    intact: HashSet<String>,
}

impl WorldFiles {
    pub(crate) fn new(world: WorldId, dir: PathBuf) -> Self {
        Self { world, dir, lock: None, intact: HashSet::new() }
    }

    pub(crate) fn primary(&self, document: &str) -> PathBuf {
        self.dir.join(format!("{document}.json"))
    }

    pub(crate) fn previous(&self, document: &str) -> PathBuf {
        self.dir.join(format!("{document}.json.prev"))
    }

    fn error(&self, action: &'static str, path: &Path, error: std::io::Error) -> StoreError {
        StoreError::io(&self.world, action, path, error)
    }

    /// Takes the world's lock file if this process does not hold it yet. `std`'s `File::try_lock` (stable since
    /// Rust 1.89, `flock` on Unix, `LockFileEx` on Windows) does what `fs4` or `fd-lock` would, without a
    /// dependency.
    pub(crate) fn ensure_locked(&mut self) -> Result<(), StoreError> {
        if self.lock.is_some() {
            return Ok(());
        }
        fs::create_dir_all(&self.dir).map_err(|e| self.error("creating the world directory", &self.dir, e))?;
        let path = self.dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| self.error("opening the lock file", &path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut text = String::new();
                let holder = file.read_to_string(&mut text).ok().and_then(|_| text.trim().parse().ok());
                return Err(StoreError::Locked { world: self.world.clone(), lock_file: path, holder });
            }
            Err(TryLockError::Error(e)) => return Err(self.error("locking", &path, e)),
        }
        // The pid is only for the other process's error message: best effort, no sync needed.
        let _ = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| write!(file, "{}", std::process::id()));
        self.lock = Some(file);
        self.remove_leftover_temporaries();
        Ok(())
    }

    /// Temporary files of writes a crash interrupted. Safe to remove: we hold the lock, and nothing we are
    /// writing right now exists (we are inside the world's queue).
    fn remove_leftover_temporaries(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.contains(".json") {
                if let Err(error) = fs::remove_file(entry.path()) {
                    tracing::warn!(world = %self.world, file = %name, %error, "could not remove a leftover temporary file");
                }
            }
        }
    }

    /// Replaces `document` durably with `header` + `payload`, keeping the current primary as the previous save.
    pub(crate) fn write(
        &mut self,
        document: &str,
        header: &[u8],
        payload: &[u8],
        faults: Option<&dyn WriteFaults>,
    ) -> Result<(), StoreError> {
        self.ensure_locked()?;
        self.keep_previous(document)?;
        let path = self.primary(document);
        // `atomic-write-file` writes a temporary file in the same directory, and on commit fsyncs it, renames it
        // over the target and fsyncs the directory: exactly the durable replace we need (`tempfile::persist`
        // syncs neither). Dropping it uncommitted removes the temporary file.
        let mut file =
            AtomicWriteFile::open(&path).map_err(|e| self.error("creating a temporary file for", &path, e))?;
        file.write_all(header).and_then(|()| file.write_all(payload)).map_err(|e| self.error("writing", &path, e))?;
        if let Some(faults) = faults {
            faults.before_commit(&self.world, document).map_err(|e| self.error("writing", &path, e))?;
        }
        file.commit().map_err(|e| self.error("committing", &path, e))?;
        self.intact.insert(document.to_string());
        Ok(())
    }

    /// Makes the current primary the previous save, durably, before it is replaced. A hard link shares the
    /// bytes instead of copying them; a damaged primary is never rotated in, so `.prev` stays the last good save.
    fn keep_previous(&mut self, document: &str) -> Result<(), StoreError> {
        let primary = self.primary(document);
        if !self.intact.contains(document) {
            match fs::read(&primary) {
                Ok(bytes) => {
                    if let Err(damage) = envelope::open(&bytes) {
                        tracing::warn!(world = %self.world, document, %damage, "the current save is damaged; keeping the previous one");
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(self.error("reading", &primary, e)),
            }
        }
        let previous = self.previous(document);
        let staging = self.dir.join(format!(".{document}.json.prev-link"));
        let _ = fs::remove_file(&staging);
        if fs::hard_link(&primary, &staging).is_err() {
            // File systems without hard links: copy and sync instead.
            fs::copy(&primary, &staging)
                .and_then(|_| File::open(&staging)?.sync_all())
                .map_err(|e| self.error("copying the current save to", &staging, e))?;
        }
        fs::rename(&staging, &previous).map_err(|e| self.error("keeping the previous save as", &previous, e))?;
        self.sync_dir()
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| self.error("syncing the directory", &self.dir, e))
    }

    /// The intact content of `document`: the primary, or the previous save (with a warning) if the primary is
    /// damaged or missing. `None` if the document was never saved.
    pub(crate) fn read(&mut self, document: &str) -> Result<Option<Found>, StoreError> {
        self.ensure_locked()?;
        let primary = self.primary(document);
        let damage = match fs::read(&primary) {
            Ok(bytes) => match envelope::open(&bytes) {
                Ok(payload) => {
                    let payload = payload.to_vec();
                    self.intact.insert(document.to_string());
                    return Ok(Some(Found::Primary(primary, payload)));
                }
                Err(damage) => damage,
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "missing".to_string(),
            Err(e) => return Err(self.error("reading", &primary, e)),
        };
        self.intact.remove(document);
        let previous = self.previous(document);
        let previous_damage = match fs::read(&previous) {
            Ok(bytes) => match envelope::open(&bytes) {
                Ok(payload) => {
                    tracing::warn!(
                        world = %self.world, document, %damage, fallback = %previous.display(),
                        "the save is damaged; loading the previous save"
                    );
                    return Ok(Some(Found::Previous(previous.clone(), payload.to_vec())));
                }
                Err(previous_damage) => previous_damage,
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "missing".to_string(),
            Err(e) => return Err(self.error("reading", &previous, e)),
        };
        if damage == "missing" && previous_damage == "missing" {
            return Ok(None);
        }
        Err(StoreError::Damaged {
            world: self.world.clone(),
            document: document.to_string(),
            primary: damage,
            previous: previous_damage,
        })
    }
}
