//! One world's directory, used only from blocking I/O threads and only inside the world's queue: the lock
//! file, the primary and previous save of each document, atomic durable replacement.
//!
//! Layout of `<data dir>/<world>/`:
//!
//! | file | what |
//! | --- | --- |
//! | `world.lock` | held (`flock`) while this process uses the world; holds its pid |
//! | `<doc>.json` | the primary save, in an [envelope](super::envelope) (named `.json` whatever its codec: the header says which) |
//! | `<doc>.json.prev` | the save before it, loaded if the primary is damaged |
//! | `<doc>.json.unreadable-N` | a primary the disk could not read (at a load that then took the previous save, or when a save replaced it), kept for a person to recover (Unix: where the disk's `EIO` is known) |
//! | `.<doc>.json.*` | temporary files, and the save from two saves ago until it is freed; a crash can leave them, the next lock holder removes them |

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use atomic_write_file::AtomicWriteFile;

use super::codec::{Codec, EncodeError};
use super::envelope;
use super::error::StoreError;
use super::faults::WriteFaults;
use crate::ids::WorldId;

const LOCK_FILE: &str = "world.lock";

/// How much of a payload is buffered before it goes to the file.
const WRITE_BUFFER: usize = 256 * 1024;
/// How much is written before the kernel is asked to start writing it to disk.
const WRITEBACK_CHUNK: u64 = 1024 * 1024;

/// Where a document's payload is serialized to: buffered, checksummed, written with early writeback.
pub(crate) type PayloadSink<'a> = BufWriter<envelope::PayloadWriter<EarlyWriteback<'a>>>;

/// Writes a file sequentially from `position` and, every [`WRITEBACK_CHUNK`] bytes, asks the kernel to start writing
/// the chunk to disk without waiting for it (`sync_file_range(SYNC_FILE_RANGE_WRITE)` on Linux; elsewhere the
/// final fsync does all the work). This only starts I/O early: durability still comes from the commit's fsync.
pub(crate) struct EarlyWriteback<'a> {
    file: &'a File,
    /// The file's offset: where the next write goes.
    position: u64,
    /// Where the range not yet handed to the kernel begins.
    unsynced: u64,
}

impl<'a> EarlyWriteback<'a> {
    fn new(file: &'a File, position: u64) -> Self {
        Self { file, position, unsynced: position }
    }

    #[cfg(target_os = "linux")]
    fn start_writeback(&mut self) {
        use std::os::fd::AsRawFd;
        let (offset, len) = (self.unsynced, self.position - self.unsynced);
        // SAFETY: `sync_file_range` only reads its integer arguments; the descriptor is valid for as long as
        // `self.file` is borrowed. Its result is advisory: a failure here leaves all the work to the fsync.
        let _ = unsafe {
            libc::sync_file_range(
                self.file.as_raw_fd(),
                offset as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            )
        };
        self.unsynced = self.position;
    }

    #[cfg(not(target_os = "linux"))]
    fn start_writeback(&mut self) {
        self.unsynced = self.position;
    }
}

impl Write for EarlyWriteback<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // At most up to the next chunk boundary: a large write (a long string is written in one piece) is split,
        // so the disk starts on its first chunks while the rest is still being copied.
        let room = (WRITEBACK_CHUNK - (self.position - self.unsynced)) as usize;
        let written = self.file.write(&buf[..buf.len().min(room)])?;
        self.position += written as u64;
        if self.position - self.unsynced >= WRITEBACK_CHUNK {
            self.start_writeback();
        }
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An intact document: where it was found, the codec its envelope names, its payload.
pub(crate) struct Found {
    pub path: PathBuf,
    /// As the header says (`json` when it names none); the store decides whether it knows it.
    pub codec: String,
    pub payload: Vec<u8>,
}

impl Found {
    fn new(path: PathBuf, opened: envelope::Opened<'_>) -> Self {
        Self { path, codec: opened.codec.to_string(), payload: opened.payload.to_vec() }
    }
}

pub(crate) struct WorldFiles {
    world: WorldId,
    dir: PathBuf,
    /// Held for as long as these files are the store's (until the store lets the world go, or is dropped): the OS
    /// releases it if the process dies, so a crash never leaves a stale lock behind.
    lock: Option<File>,
    /// Documents whose primary this process wrote or read intact: no need to re-read them before rotating.
    intact: HashSet<String>,
    /// Documents whose primary a load could not read, so it took the previous save: the next save keeps that
    /// primary aside (it may be the newest save, readable again), whether or not it reads by then.
    unread: HashSet<String>,
    /// Saves from two saves ago, still linked under a temporary name: freed after the save that superseded them
    /// is reported ([`take_superseded`](Self::take_superseded)), not inside it.
    superseded: Vec<Superseded>,
}

/// A save two saves old, linked under a temporary name until it is freed.
pub(crate) struct Superseded {
    /// The document it was a save of.
    pub document: String,
    /// Its temporary name.
    pub link: PathBuf,
}

/// Numbers superseded saves' links: unique within the process, so a link another visit of the same world left for
/// its task to remove is never reused (the next lock holder removes any a crash left).
static SUPERSEDED: AtomicU64 = AtomicU64::new(0);

impl WorldFiles {
    /// The files of `world` in `dir`; `unread` are the documents a load could not read when the world was last in
    /// use ([`take_unread`](Self::take_unread)).
    pub(crate) fn new(world: WorldId, dir: PathBuf, unread: HashSet<String>) -> Self {
        Self { world, dir, lock: None, intact: HashSet::new(), unread, superseded: Vec::new() }
    }

    /// The saves the last operations superseded, for the caller to remove once it has reported them (any thread,
    /// any time: nothing else uses these names, and a file left behind is removed by the next lock holder).
    pub(crate) fn take_superseded(&mut self) -> Vec<Superseded> {
        std::mem::take(&mut self.superseded)
    }

    /// The documents whose primary a load could not read and no save has replaced yet: kept by the store while the
    /// world is let go, so the world's next save still keeps that primary aside.
    pub(crate) fn take_unread(&mut self) -> HashSet<String> {
        std::mem::take(&mut self.unread)
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
        create_dir_durably(&self.dir).map_err(|e| self.error("creating the world directory", &self.dir, e))?;
        // A link is not followed, for the folder or its lock file: a world's folder from a save pack someone
        // shared could hold one pointing anywhere, and the lock file is truncated and the folder's temporary
        // files removed.
        if crate::plain_file::is_link(&self.dir) {
            return Err(self.error("opening the world directory", &self.dir, not_followed()));
        }
        let path = self.dir.join(LOCK_FILE);
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NOFOLLOW | libc::O_NONBLOCK);
        // Elsewhere a link is looked for first: the open would create the file a dangling one names.
        let opened = match (cfg!(not(unix)) && crate::plain_file::is_link(&path)).then(not_followed) {
            Some(refused) => Err(refused),
            None => options.open(&path),
        };
        let opened = match opened {
            Err(_) if crate::plain_file::is_link(&path) => Err(not_followed()),
            Ok(file) if !file.metadata().is_ok_and(|meta| meta.is_file()) => {
                Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a plain file: not used"))
            }
            opened => opened,
        };
        let mut file = opened.map_err(|e| self.error("opening the lock file", &path, e))?;
        // Tried again only while the lock file names this process (its own lock, let go a moment ago): another
        // process's is refused at once.
        match crate::file_lock::try_lock(&file, |file| lock_holder(file) == Some(std::process::id())) {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let holder = lock_holder(&file);
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
                // (A superseded save may be removed by its own task meanwhile.)
                let removed = fs::remove_file(entry.path()).or_else(|error| match error.kind() {
                    std::io::ErrorKind::NotFound => Ok(()),
                    _ => Err(error),
                });
                if let Err(error) = removed {
                    tracing::warn!(world = %self.world, file = %name, %error, "could not remove a leftover temporary file");
                }
            }
        }
    }

    /// Replaces `document` durably with what `encode` writes in `codec`, keeping the current primary as the
    /// previous save.
    ///
    /// The payload is streamed into a temporary file in the world's directory after a reserved header; the kernel
    /// is asked to start writing each chunk to disk as soon as it is written ([`EarlyWriteback`]), so
    /// serialization overlaps the disk and the final fsync waits only for the tail. Then the header is filled in,
    /// the current primary is kept as `.prev`, and `atomic-write-file` commits: it fsyncs the temporary file,
    /// renames it over the primary and fsyncs the directory (`tempfile::persist` syncs neither). A failure
    /// anywhere before the rename leaves the primary as it was, and the temporary file is removed (a failure of
    /// the commit's fsync, a full disk say, comes after `.prev` became the primary too: the save before is gone
    /// then, the primary is not).
    pub(crate) fn write(
        &mut self,
        document: &str,
        codec: Codec,
        encode: impl FnOnce(&mut PayloadSink<'_>) -> Result<(), EncodeError>,
        faults: Option<&dyn WriteFaults>,
    ) -> Result<(), StoreError> {
        self.ensure_locked()?;
        let path = self.primary(document);
        let file = save_options().open(&path).map_err(|e| self.error("creating a temporary file for", &path, e))?;
        let header_len = envelope::header_len(codec);
        let written = (|| {
            let mut out = file.as_file();
            out.write_all(&vec![b' '; header_len]).map_err(EncodeError::Io)?;
            let sink = envelope::PayloadWriter::new(EarlyWriteback::new(out, header_len as u64), codec);
            // Buffered first: the checksum and the file see large chunks, not the serializer's many small writes.
            let mut payload = BufWriter::with_capacity(WRITE_BUFFER, sink);
            encode(&mut payload)?;
            let header = payload.into_inner().map_err(|error| error.into_error()).and_then(|sink| sink.finish());
            header
                .and_then(|header| out.seek(SeekFrom::Start(0)).and_then(|_| out.write_all(&header)))
                .map_err(EncodeError::Io)
        })();
        match written {
            Ok(()) => {}
            Err(EncodeError::Io(error)) => return Err(self.error("writing", &path, error)),
            Err(EncodeError::Codec(message)) => {
                return Err(StoreError::Encode { world: self.world.clone(), document: document.to_string(), message })
            }
        }
        if let Some(faults) = faults {
            faults.before_commit(&self.world, document).map_err(|e| self.error("writing", &path, e))?;
        }
        self.keep_previous(document, faults)?;
        if let Err(error) = file.commit() {
            // `atomic-write-file` leaves its temporary file once its commit began (a failed fsync, a full disk):
            // removed here, or each failed save would fill the disk further. This world's writes take turns, so
            // no other temporary file of it is in use.
            self.remove_leftover_temporaries();
            return Err(self.error("committing", &path, error));
        }
        self.intact.insert(document.to_string());
        // Only once the primary kept aside is replaced: a failed commit leaves it the primary, still unloaded.
        self.unread.remove(document);
        Ok(())
    }

    /// Makes the current primary the previous save, before it is replaced. A hard link shares the
    /// bytes instead of copying them; a damaged primary is never rotated in, so `.prev` stays the last good save.
    fn keep_previous(&mut self, document: &str, faults: Option<&dyn WriteFaults>) -> Result<(), StoreError> {
        let primary = self.primary(document);
        self.move_folder_aside(document, &primary)?;
        if self.unread.contains(document) {
            // Not read again: the game built on the previous save, whatever the primary holds.
            self.keep_aside(document, "the current save could not be read when it was loaded");
            return Ok(());
        }
        if !self.intact.contains(document) {
            match self.read_primary(document, faults) {
                Ok(bytes) => {
                    if let Err(damage) = envelope::open(&bytes) {
                        tracing::warn!(world = %self.world, document, %damage, "the current save is damaged; keeping the previous one");
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                // A bad sector, or a network file system's failure that outlasted the retries: kept aside, not
                // replaced (it may be the newest save, readable again later), and `.prev` kept.
                Err(e) if disk_could_not_read(&e) => {
                    self.keep_aside(document, &format!("the current save cannot be read ({e})"));
                    return Ok(());
                }
                // Something else in its place (a link, a FIFO; a folder was moved aside): replaced, and `.prev`
                // kept.
                Err(e) if is_damage(&e) => {
                    tracing::warn!(world = %self.world, document, error = %e, "the current save is not a save; keeping the previous one");
                    return Ok(());
                }
                Err(e) => return Err(self.error("reading", &primary, e)),
            }
        }
        let previous = self.previous(document);
        let staging = self.dir.join(format!(".{document}.json.prev-link"));
        let _ = fs::remove_file(&staging);
        if fs::hard_link(&primary, &staging).is_err() {
            // File systems without hard links: copy and sync instead.
            // Synced through a handle that may write: Windows refuses to flush a read-only one.
            fs::copy(&primary, &staging)
                .and_then(|_| OpenOptions::new().write(true).open(&staging)?.sync_all())
                .map_err(|e| self.error("copying the current save to", &staging, e))?;
        }
        self.supersede(document, &previous);
        self.move_folder_aside(document, &previous)?;
        // No directory fsync of its own: the commit that follows fsyncs the directory, which makes this rename
        // durable too. Until then the old primary is still in place, so nothing depends on `.prev` yet.
        fs::rename(&staging, &previous).map_err(|e| self.error("keeping the previous save as", &previous, e))?;
        // Loaded if the next primary is damaged: not left for other users to rewrite, as a save that came so.
        only_its_owner_writes(&previous);
        Ok(())
    }

    /// Links the save from two saves ago (the current `.prev`) under a temporary name, so that the rename over it
    /// frees nothing: its blocks are freed once this save is durable and reported ([`take_superseded`]). Freeing a
    /// file can take longer than writing one (a file system mounted with `discard` trims the blocks then: 1.7 ms
    /// for 2.6 MB on this project's CI machines), and nothing needs to wait for it. Where hard links fail, the
    /// rename frees it as before.
    ///
    /// [`take_superseded`]: Self::take_superseded
    fn supersede(&mut self, document: &str, previous: &Path) {
        let link = self.dir.join(format!(".{document}.json.superseded-{}", SUPERSEDED.fetch_add(1, Ordering::Relaxed)));
        if fs::hard_link(previous, &link).is_ok() {
            self.superseded.push(Superseded { document: document.to_string(), link });
        }
    }

    /// `<path>.unreadable-N`, the first number free (an earlier one is never replaced), if one of the first 1,000 is.
    fn aside(&self, path: &Path) -> Option<PathBuf> {
        let name = path.file_name()?.to_string_lossy();
        (1..=1_000)
            .map(|n| self.dir.join(format!("{name}.unreadable-{n}")))
            .find(|aside| fs::symlink_metadata(aside).is_err())
    }

    /// A folder where a save of `document` goes (the primary or `.prev`: put there by a person or a sync tool):
    /// a file cannot be renamed over it, so that no save of the document could ever be made, it is moved aside,
    /// contents and all, as `<its name>.unreadable-N` ([`aside`](Self::aside)), and the save takes its place.
    fn move_folder_aside(&self, document: &str, path: &Path) -> Result<(), StoreError> {
        if !fs::symlink_metadata(path).is_ok_and(|meta| meta.is_dir()) {
            return Ok(());
        }
        let moving = "moving aside the folder at";
        let aside = self.aside(path).ok_or_else(|| {
            self.error(moving, path, std::io::Error::other("1,000 are kept aside already: remove some"))
        })?;
        fs::rename(path, &aside).map_err(|e| self.error(moving, path, e))?;
        tracing::warn!(world = %self.world, document, folder = %path.display(), aside = %aside.display(), "a folder was where the save goes: moved aside");
        Ok(())
    }

    /// Keeps `document`'s primary as `<doc>.json.unreadable-N` (the first number free: an earlier one is never
    /// replaced): a hard link, or where there are none a copy, synced under a temporary name first (a crash or a
    /// failure part way leaves no partial copy under the name); `why` goes in the warning.
    fn keep_aside(&self, document: &str, why: &str) {
        let primary = self.primary(document);
        let Some(aside) = self.aside(&primary) else {
            tracing::warn!(world = %self.world, document, "{why}, and 1,000 copies are kept aside already; the previous save is kept");
            return;
        };
        // This world's writes take turns: nothing else names a file here meanwhile.
        let kept = fs::hard_link(&primary, &aside).or_else(|linking| {
            if linking.kind() == std::io::ErrorKind::NotFound {
                return Err(linking);
            }
            let staging = self.dir.join(format!(".{document}.json.unreadable-copy"));
            fs::copy(&primary, &staging)
                .and_then(|_| OpenOptions::new().write(true).open(&staging)?.sync_all())
                .and_then(|()| fs::rename(&staging, &aside))
                .inspect_err(|_| drop(fs::remove_file(&staging)))
        });
        match kept {
            Ok(()) => {
                tracing::warn!(world = %self.world, document, aside = %aside.display(), "{why}: kept aside, and the previous save kept")
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                tracing::warn!(world = %self.world, document, %error, "{why}, nor could it be kept aside; the previous save is kept")
            }
        }
    }

    /// The intact content of `document`: the primary, or the previous save (with a warning) if the primary is
    /// damaged or missing. `None` if the document was never saved.
    pub(crate) fn read(
        &mut self,
        document: &str,
        faults: Option<&dyn WriteFaults>,
    ) -> Result<Option<Found>, StoreError> {
        self.ensure_locked()?;
        let primary = self.primary(document);
        let mut unread = false;
        let damage = match self.read_primary(document, faults) {
            Ok(bytes) => match envelope::open(&bytes) {
                Ok(opened) => {
                    let found = Found::new(primary, opened);
                    self.intact.insert(document.to_string());
                    self.unread.remove(document);
                    return Ok(Some(found));
                }
                Err(damage) => damage,
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "missing".to_string(),
            // A bad sector, or a folder in its place: the previous save is tried, as for damage.
            Err(e) if is_damage(&e) => {
                unread = disk_could_not_read(&e);
                format!("unreadable ({e})")
            }
            Err(e) => return Err(self.error("reading", &primary, e)),
        };
        self.intact.remove(document);
        let previous = self.previous(document);
        let previous_damage = match read_save(&previous) {
            Ok(bytes) => match envelope::open(&bytes) {
                Ok(opened) => {
                    tracing::warn!(
                        world = %self.world, document, %damage, fallback = %previous.display(),
                        "the save is damaged; loading the previous save"
                    );
                    if unread {
                        self.unread.insert(document.to_string());
                    }
                    return Ok(Some(Found::new(previous.clone(), opened)));
                }
                Err(previous_damage) => previous_damage,
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "missing".to_string(),
            Err(e) if is_damage(&e) => format!("unreadable ({e})"),
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

/// How often, and after how long, a read of a primary save that failed with what [`is_damage`] calls damage is
/// tried again before it is taken as damage: a network file system's passing failure (an NFS soft mount, a CIFS
/// reconnect, a FUSE backend) reads as the disk's `EIO` too, and loading the previous save for it would have the
/// next save replace the newest one.
const READ_RETRIES: [std::time::Duration; 3] = [
    std::time::Duration::from_millis(50),
    std::time::Duration::from_millis(200),
    std::time::Duration::from_millis(800),
];

impl WorldFiles {
    /// The bytes of `document`'s primary save, read again after a failure that looks like damage
    /// ([`READ_RETRIES`]).
    fn read_primary(&self, document: &str, faults: Option<&dyn WriteFaults>) -> std::io::Result<Vec<u8>> {
        let read = || match faults.map(|faults| faults.before_read(&self.world, document)) {
            Some(Err(error)) => Err(error),
            _ => read_save(&self.primary(document)),
        };
        let mut result = read();
        for wait in READ_RETRIES {
            match &result {
                Err(error) if disk_could_not_read(error) => {
                    std::thread::sleep(wait);
                    result = read();
                }
                _ => break,
            }
        }
        result
    }
}

/// The process id the holder of a world's lock wrote into its lock file, if it can be read.
fn lock_holder(mut file: &File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().and_then(|()| file.read_to_string(&mut text)).ok()?;
    text.trim().parse().ok()
}

fn not_followed() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, "a link: not followed (move what it points to here instead)")
}

/// Takes away the write permission of others from the kept save at `path` (a save that came world-writable, in a
/// shared save pack, keeps its mode when it is kept aside). Best effort: a save that cannot be changed stays as it
/// is.
fn only_its_owner_writes(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = fs::symlink_metadata(path) {
            let mode = meta.permissions().mode();
            if meta.is_file() && mode & 0o022 != 0 {
                let _ = fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o7755));
            }
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

/// How a save is written: readable by all, writable by its owner alone (less what the umask takes away), whatever
/// mode the save it replaces had: one that came world-writable (in a shared save pack) does not stay so for
/// other users of the machine to rewrite.
fn save_options() -> atomic_write_file::OpenOptions {
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut options = AtomicWriteFile::options();
    #[cfg(unix)]
    {
        use atomic_write_file::unix::OpenOptionsExt as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        options.preserve_mode(false).mode(0o644);
    }
    options
}

/// The bytes of the save at `path`. Something other than a plain file in its place (a link, which could point
/// anywhere, a FIFO, whose read would block the world's queue, a device, a folder) reads as damage
/// (`InvalidData`), as a bad file does: the previous save is tried, and the next save replaces it.
fn read_save(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file =
        crate::plain_file::open(path)?.map_err(|why| std::io::Error::new(std::io::ErrorKind::InvalidData, why))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Whether a read error is damage ([`is_damage`]) that the disk reported (its `EIO`), not something else in the
/// file's place (a folder, a link, a FIFO): it may pass (a network file system's), so the read is tried again and
/// the file is not given up.
fn disk_could_not_read(error: &std::io::Error) -> bool {
    /// `EIO` on Linux and macOS: the disk could not read it.
    #[cfg(unix)]
    const EIO: i32 = 5;
    #[cfg(unix)]
    return error.raw_os_error() == Some(EIO);
    #[cfg(not(unix))]
    {
        let _ = error;
        false
    }
}

/// Whether a read error means the file itself is bad (the disk's I/O error, a folder in its place), as damage
/// does, rather than something about this process (no permission, no file descriptors left), which a load must
/// not take for damage: it would load the previous save, and the next save would replace this one for good.
fn is_damage(error: &std::io::Error) -> bool {
    disk_could_not_read(error)
        || matches!(error.kind(), std::io::ErrorKind::IsADirectory | std::io::ErrorKind::InvalidData)
}

/// Makes `dir` and its missing parents, then (on Unix) syncs the folder each new one was made in: a new
/// directory's entry is durable only once its parent is, and a world's first save is durable only with its
/// directory. (Windows has no directory sync; NTFS journals the entry.)
fn create_dir_durably(dir: &Path) -> std::io::Result<()> {
    let mut made = Vec::new();
    let mut next = Some(dir);
    while let Some(at) = next.filter(|at| !at.as_os_str().is_empty() && fs::symlink_metadata(at).is_err()) {
        made.push(at);
        next = at.parent();
    }
    fs::create_dir_all(dir)?;
    #[cfg(unix)]
    for at in made.iter().rev() {
        let parent = at.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
        File::open(parent)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_world_directory_is_made_with_its_missing_parents_and_making_it_again_is_fine() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("saves").join("alpha");
        create_dir_durably(&dir).unwrap();
        assert!(dir.is_dir());
        create_dir_durably(&dir).unwrap();
        std::fs::write(root.path().join("file"), b"x").unwrap();
        assert!(create_dir_durably(&root.path().join("file").join("alpha")).is_err(), "a file in the way");
    }
}
