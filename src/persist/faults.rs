//! [`WriteFaults`]: a test hook that delays or fails a write (or a read of a primary save). Off by default;
//! production code never sleeps.

use std::io;

use crate::ids::WorldId;

/// Called on the store's I/O thread after a document's new content is written to its temporary file (not yet
/// synced: the commit that follows syncs it), just before it replaces the primary. Returning an error fails the
/// save (the temporary file is discarded and the previous save stays as it was); blocking here delays it.
///
/// Install with [`WorldStore::set_write_faults`](super::WorldStore::set_write_faults). Closures implement it:
///
/// ```
/// # use bevy_agent_tools::WorldId;
/// # use bevy_agent_tools::persist::WriteFaults;
/// let fail_alpha = |world: &WorldId, _document: &str| -> std::io::Result<()> {
///     if world.as_str() == "alpha" { Err(std::io::Error::other("injected")) } else { Ok(()) }
/// };
/// let _: &dyn WriteFaults = &fail_alpha;
/// ```
pub trait WriteFaults: Send + Sync + 'static {
    /// Decides what happens to this write.
    fn before_commit(&self, world: &WorldId, document: &str) -> io::Result<()>;

    /// Called on the store's I/O thread before each read of a document's primary save (by a load, or by a save
    /// that keeps it as the previous one): an error is taken as what reading the file returned (the disk's
    /// `EIO`, say). Reads as they are by default.
    fn before_read(&self, world: &WorldId, document: &str) -> io::Result<()> {
        let _ = (world, document);
        Ok(())
    }

    /// Called on a blocking thread before the save from two saves ago is freed, which happens after the save that
    /// superseded it is reported and before the world's next operation runs: an error leaves the file for the
    /// world's next lock holder to remove; blocking here delays the world's next operation, not the save's report.
    fn before_freeing(&self, world: &WorldId, document: &str) -> io::Result<()> {
        let _ = (world, document);
        Ok(())
    }
}

impl<F> WriteFaults for F
where
    F: Fn(&WorldId, &str) -> io::Result<()> + Send + Sync + 'static,
{
    fn before_commit(&self, world: &WorldId, document: &str) -> io::Result<()> {
        self(world, document)
    }
}
