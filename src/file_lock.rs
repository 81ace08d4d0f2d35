//! Taking a file lock (`flock`) this process may itself have let go of a moment ago. A process another thread of
//! the game was starting (an ACP agent, say) holds a copy of every open file until it runs its program, the locked
//! one too, and with it the lock: tried again for a little while before the lock is called held.

use std::fs::{File, TryLockError};
use std::time::Duration;

/// How many more times a held lock is tried, [`RETRY`] apart (100 ms in all).
const TRIES: u32 = 20;
const RETRY: Duration = Duration::from_millis(5);

/// Locks `file`, trying again while it is held and `may_be_ours(file)` says the holder may be this process.
pub(crate) fn try_lock(file: &File, mut may_be_ours: impl FnMut(&File) -> bool) -> Result<(), TryLockError> {
    let mut tries = 0;
    loop {
        match file.try_lock() {
            Err(TryLockError::WouldBlock) if tries < TRIES && may_be_ours(file) => {
                tries += 1;
                std::thread::sleep(RETRY);
            }
            locked => return locked,
        }
    }
}
