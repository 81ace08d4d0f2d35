//! The tool handlers still running, counted so that the exit can let them finish (rule H10): a handler whose call
//! ended (`ended()` fired at the world's exit) may still be cleaning up what it started, and the plugin's runtime
//! stopping would drop it mid-way.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// How many call drivers are running (each until its handler has returned, or it is dropped). Counted without a
/// lock (every call passes here); the lock is only for the exit's wait and the last driver's wake-up.
#[derive(Default)]
pub(crate) struct RunningHandlers {
    count: AtomicUsize,
    waiting: Mutex<()>,
    none: Condvar,
}

impl RunningHandlers {
    /// Counts a driver until the returned guard is dropped.
    pub(crate) fn enter(self: &Arc<Self>) -> RunningHandler {
        self.count.fetch_add(1, Ordering::SeqCst);
        RunningHandler(self.clone())
    }

    /// Waits until none runs, or until `until`; returns how many still run.
    pub(crate) fn wait_none(&self, until: Instant) -> usize {
        let mut waiting = self.waiting.lock();
        // The last driver takes the lock before it wakes the waiter: its end is not missed between the look at
        // the count and the wait.
        while self.count.load(Ordering::SeqCst) > 0 && !self.none.wait_until(&mut waiting, until).timed_out() {}
        self.count.load(Ordering::SeqCst)
    }
}

/// One running driver, counted in [`RunningHandlers`] while it lives.
pub(crate) struct RunningHandler(Arc<RunningHandlers>);

impl Drop for RunningHandler {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            let _waiting = self.0.waiting.lock();
            self.0.none.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_wait_ends_when_the_last_handler_ends_or_at_its_time() {
        let running = Arc::new(RunningHandlers::default());
        assert_eq!(running.wait_none(Instant::now()), 0);
        let (first, second) = (running.enter(), running.enter());
        assert_eq!(running.wait_none(Instant::now() + Duration::from_millis(10)), 2, "at its time");
        drop(first);
        let ending = std::thread::spawn(move || drop(second));
        // Woken by the last one's end, not at its time (which would return 0 as well).
        let (waited, limit) = (Instant::now(), Duration::from_secs(60));
        assert_eq!(running.wait_none(waited + limit), 0, "when the last one ends");
        assert!(waited.elapsed() < limit / 2, "woken when it ended: {:?}", waited.elapsed());
        ending.join().expect("ended");
    }
}
