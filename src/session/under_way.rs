//! [`UnderWay`]: operations of a kind the game's exit waits for (bounded by its deadline).

use std::sync::Arc;

/// How many operations of a kind are under way, and a signal when one finishes.
#[derive(Default)]
pub(crate) struct UnderWay {
    under_way: parking_lot::Mutex<usize>,
    finished: parking_lot::Condvar,
}

impl UnderWay {
    /// Counts an operation until the returned guard is dropped (it finished, or its future was dropped).
    pub(crate) fn begin(this: &Arc<Self>) -> impl Drop + Send + use<> {
        *this.under_way.lock() += 1;
        struct Finished(Arc<UnderWay>);
        impl Drop for Finished {
            fn drop(&mut self) {
                let mut under_way = self.0.under_way.lock();
                *under_way = under_way.saturating_sub(1);
                self.0.finished.notify_all();
            }
        }
        Finished(this.clone())
    }

    /// Waits until none is under way, or `until`; returns how many are still under way.
    pub(crate) fn wait_until_none(&self, until: std::time::Instant) -> usize {
        let mut under_way = self.under_way.lock();
        while *under_way > 0 {
            if self.finished.wait_until(&mut under_way, until).timed_out() {
                break;
            }
        }
        *under_way
    }
}
