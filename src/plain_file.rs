//! Plain files: a path opened only if a plain file is there, never through a link (which could point anywhere)
//! and never blocking on a FIFO. For what the crate reads from folders others could have put things in: a save
//! pack someone shared, a session folder.

use std::io;
use std::path::Path;

/// Opens the file at `path` for reading if it is a plain file; `Ok(Err(why))` if something else is in its place:
/// a link (not followed), a FIFO (whose open does not block here) or a device, a directory. A missing file is
/// `NotFound`, as usual.
pub(crate) fn open(path: &Path) -> io::Result<Result<std::fs::File, String>> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NOFOLLOW | libc::O_NONBLOCK);
    // Elsewhere a link is looked for first (Windows opens what a link points to).
    if cfg!(not(unix)) && is_link(path) {
        return Ok(Err(format!("{} is a link: not followed", path.display())));
    }
    let file = match options.open(path) {
        Ok(file) => file,
        Err(_) if is_link(path) => return Ok(Err(format!("{} is a link: not followed", path.display()))),
        Err(error) => return Err(error),
    };
    if !file.metadata()?.is_file() {
        return Ok(Err(format!("{} is not a plain file: not read", path.display())));
    }
    Ok(Ok(file))
}

/// Whether `path` is a link itself (not what it points to).
pub(crate) fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_symlink())
}
