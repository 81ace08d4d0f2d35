//! Private files: what only the user who runs the game may read or change. The MCP token, and the agent sessions'
//! records and histories (which may say what the player typed, and which name the agent program a resumed session
//! starts).
//!
//! Their defaults live in a directory of the user's own inside the system's temporary directory
//! (`bevy_agent_tools-<uid>`, mode 0700 on Unix), never loose in a shared `/tmp`, where another user could have
//! created the path first. Files are written atomically with mode 0600 from their creation, and on Unix a file is
//! read back only if this user owns it and no one else may write it.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The user's own directory for the crate's defaults: `<temp>/bevy_agent_tools-<uid>` on Unix (Linux's `/tmp` is
/// shared; macOS's temporary directory is per-user already, the name is the same there), `<temp>/bevy_agent_tools`
/// on Windows (per-user). Only the path: [`ensure_dir`] creates and checks it.
pub(crate) fn default_dir() -> PathBuf {
    #[cfg(unix)]
    let name = format!("bevy_agent_tools-{}", current_user());
    #[cfg(not(unix))]
    let name = "bevy_agent_tools".to_string();
    std::env::temp_dir().join(name)
}

/// Creates `dir` (and its parents) if it is missing, the directory itself with mode 0700; then, on Unix, checks
/// that it is a directory (not a link to one) that this user owns, and closes it to others if it was open to them
/// (a directory made before this check existed). A directory someone else owns is refused rather than used:
/// what they left in it is theirs.
pub(crate) fn ensure_dir(dir: &Path) -> io::Result<()> {
    if let Some(parent) = dir.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    match builder.create(dir) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(error),
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let meta = std::fs::symlink_metadata(dir)?;
        if let Some(why) = foreign_dir(meta.file_type().is_dir(), meta.uid(), current_user()) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} {why}: not used (its owner or an administrator can remove it; or choose another place)",
                    dir.display()
                ),
            ));
        }
        if meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(|error| {
                io::Error::new(
                    error.kind(),
                    format!("could not close {} to other users (mode 700): {error}; {NO_UNIX_MODES}", dir.display()),
                )
            })?;
        }
    }
    Ok(())
}

/// Replaces the file at `path` with `bytes` atomically and durably (file and directory synced), in a directory that
/// must exist (`NotFound` otherwise: a write that comes after its folder was deleted never makes it again). The new
/// file has mode 0600 from its creation (no moment where others could open it) and takes neither the mode nor the
/// owner of the file it replaces; a link at `path` is replaced, not followed.
pub(crate) fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    // Refused before a temporary file is made: a failed rename would leave that copy behind.
    if std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_dir()) {
        return Err(io::Error::new(io::ErrorKind::IsADirectory, format!("{} is a directory", path.display())));
    }
    #[cfg_attr(not(unix), allow(unused_mut))]
    let mut options = atomic_write_file::OpenOptions::new();
    #[cfg(unix)]
    {
        use atomic_write_file::unix::OpenOptionsExt as _;
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        options.preserve_mode(false).preserve_owner(false);
    }
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    // Synced here first: a sync that fails drops the file, which removes its temporary copy (`commit` marks the
    // file done before it syncs, and so would leave the copy behind, one per failed write: a full disk's history
    // saves, say). `commit` syncs again, a clean file at no cost, and renames it.
    file.sync_all()?;
    file.commit()
}

/// Reads the file at `path`, which this user must own and no one else may write (on Unix): a file someone else
/// could have written, a link or anything but a plain file in its place, is refused with `PermissionDenied`,
/// saying why. A missing file is `NotFound`, as usual.
#[cfg_attr(not(any(feature = "acp", feature = "openai")), allow(dead_code))]
pub(crate) fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = match crate::plain_file::open(path)? {
        Ok(file) => file,
        Err(why) => return Err(io::Error::new(io::ErrorKind::PermissionDenied, why)),
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let meta = file.metadata()?;
        if let Some(why) = untrusted_file(meta.uid(), meta.mode(), current_user()) {
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{} {why}", path.display())));
        }
    }
    let mut bytes = Vec::new();
    io::Read::read_to_end(&mut file, &mut bytes)?;
    Ok(bytes)
}

/// What to do where the file system keeps no Unix permissions (everything looks open to everyone there).
#[cfg(unix)]
const NO_UNIX_MODES: &str = "a file system without Unix permissions (FAT, exFAT, a Windows drive under WSL) cannot \
    keep it private: keep it on one that can";

/// The effective user id of this process.
#[cfg(unix)]
fn current_user() -> u32 {
    // SAFETY: `geteuid` takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// Why a directory is not this user's own, if it is not.
#[cfg(unix)]
fn foreign_dir(is_dir: bool, owner: u32, user: u32) -> Option<String> {
    if !is_dir {
        Some("is not a directory (a link or a file is in its place)".into())
    } else if owner != user {
        Some(format!("belongs to user {owner}, not to this user ({user})"))
    } else {
        None
    }
}

/// Why a file may have been written by someone else, if it may.
#[cfg(unix)]
#[cfg_attr(not(any(feature = "acp", feature = "openai")), allow(dead_code))]
fn untrusted_file(owner: u32, mode: u32, user: u32) -> Option<String> {
    if owner != user {
        Some(format!("belongs to user {owner}, not to this user ({user}): not trusted"))
    } else if mode & 0o022 != 0 {
        Some(format!("may be written by other users (mode {:o}): not trusted; {NO_UNIX_MODES}", mode & 0o777))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_whose_folder_is_gone_is_not_written_and_the_folder_not_made() {
        let dir = tempfile::tempdir().expect("temp dir");
        let gone = dir.path().join("chat-0123abcd");
        assert_eq!(write(&gone.join("session.json"), b"{}").unwrap_err().kind(), io::ErrorKind::NotFound);
        assert!(!gone.exists());
    }

    #[test]
    fn files_are_private_from_their_creation_whatever_they_replace() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("nested").join("token");
        std::fs::create_dir_all(path.parent().expect("a folder")).expect("made");
        std::fs::write(&path, b"an older file, readable by all").expect("written");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
        write(&path, b"first").expect("written");
        write(&path, b"second").expect("replaced");
        assert_eq!(read(&path).expect("read"), b"second");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("metadata").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_file_others_may_write_is_not_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("session.json");
        std::fs::write(&path, b"{}").expect("written");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let error = read(&path).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        assert!(error.to_string().contains("may be written by other users (mode 666)"), "{error}");
        assert!(untrusted_file(current_user() + 1, 0o600, current_user()).is_some_and(|why| why.contains("belongs")));
        assert_eq!(untrusted_file(current_user(), 0o644, current_user()), None);
    }

    #[cfg(unix)]
    #[test]
    fn a_link_in_place_of_a_private_file_is_replaced_on_write_and_refused_on_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = dir.path().join("someone-elses-file");
        std::fs::write(&target, b"kept").expect("written");
        let path = dir.path().join("token");
        std::os::unix::fs::symlink(&target, &path).expect("link");
        let error = read(&path).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied, "{error}");
        assert!(error.to_string().contains("is a link: not followed"), "{error}");
        write(&path, b"token").expect("written");
        assert_eq!(std::fs::read(&target).expect("target"), b"kept", "the link's target is untouched");
        assert!(!std::fs::symlink_metadata(&path).expect("metadata").file_type().is_symlink());
    }

    #[test]
    fn a_directory_in_place_of_a_private_file_is_refused_and_leaves_no_copy() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("token");
        std::fs::create_dir(&path).expect("made");
        assert_eq!(write(&path, b"token").unwrap_err().kind(), io::ErrorKind::IsADirectory);
        let names: Vec<_> =
            std::fs::read_dir(dir.path()).expect("listed").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names, ["token"], "no temporary copy of the token left behind");
    }

    #[cfg(unix)]
    #[test]
    fn a_fifo_in_place_of_a_private_file_is_refused_without_blocking() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("session.json");
        let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("a C path");
        // SAFETY: `name` is a valid NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
        let error = read(&path).unwrap_err();
        assert!(error.to_string().contains("not a plain file"), "{error}");
    }

    #[cfg(unix)]
    #[test]
    fn a_private_dir_is_made_0700_closed_if_open_and_refused_if_not_the_users() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |dir: &Path| std::fs::metadata(dir).expect("metadata").permissions().mode() & 0o777;
        let root = tempfile::tempdir().expect("temp dir");
        let dir = root.path().join("bevy_agent_tools-test");
        ensure_dir(&dir).expect("made");
        assert_eq!(mode(&dir), 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        ensure_dir(&dir).expect("already there: closed to others");
        assert_eq!(mode(&dir), 0o700);

        let link = root.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).expect("link");
        let error = ensure_dir(&link).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::PermissionDenied);
        assert!(error.to_string().contains("not a directory"), "{error}");

        let user = current_user();
        assert!(foreign_dir(true, user + 1, user).is_some_and(|why| why.contains("belongs to user")));
        assert_eq!(foreign_dir(true, user, user), None);
    }

    #[cfg(unix)]
    #[test]
    fn the_default_dir_is_the_users_own() {
        assert!(default_dir().ends_with(format!("bevy_agent_tools-{}", current_user())));
    }
}
