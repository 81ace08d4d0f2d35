//! The locks at the places where threads meet: a call's step lock (a main-thread step against an end from any
//! thread), its callers' book (retries joining and leaving), the host's state (admission and release against
//! exit), the conversations' hub (a call recorded against its conversation ending), and a world's turn in the
//! store (a save against the next load). `parking_lot`'s normally; under the `shuttle` feature, shuttle's, so
//! the race tests in `races` can explore thread interleavings through them and replay a failing schedule.

#[cfg(not(feature = "shuttle"))]
pub(crate) use parking_lot::{Mutex, MutexGuard};
/// Thread-local storage of the threads that meet at those locks (shuttle's threads under `shuttle`).
#[cfg(not(feature = "shuttle"))]
pub(crate) use std::thread_local;

#[cfg(feature = "shuttle")]
pub(crate) use shuttle::thread_local;

#[cfg(feature = "shuttle")]
pub(crate) use controlled::{Mutex, MutexGuard};

/// Where another thread may run between two steps that take no lock of [`Mutex`]'s (a check, then a send on a
/// channel): nothing normally; under `shuttle`, a point where its schedules switch threads.
pub(crate) fn may_switch_threads() {
    // (shuttle's `sleep` switches as a lock does: it does not model time, nor ask to let others go first.)
    #[cfg(feature = "shuttle")]
    shuttle::thread::sleep(std::time::Duration::ZERO);
}

#[cfg(feature = "shuttle")]
mod controlled {
    use std::ops::{Deref, DerefMut};
    use std::sync::PoisonError;

    /// shuttle's mutex with `parking_lot`'s API (no poisoning: a panic fails the shuttle test anyway).
    #[derive(Default)]
    pub(crate) struct Mutex<T>(shuttle::sync::Mutex<T>);

    /// shuttle's guard, which also lets another thread run just after it unlocks (shuttle switches threads only
    /// at its own operations: without this, what a thread does between an unlock and its next lock would look
    /// atomic to the tests, where real threads can be preempted). A point where the schedule may switch, not a
    /// yield: shuttle's PCT scheduler always switches away from a thread that yields, so with a yield at every
    /// unlock no thread would ever get through two locks while another waits.
    pub(crate) struct MutexGuard<'a, T>(Option<shuttle::sync::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(shuttle::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;

        fn deref(&self) -> &T {
            match &self.0 {
                Some(guard) => guard,
                None => unreachable!("a guard is held until it is dropped"),
            }
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            match &mut self.0 {
                Some(guard) => guard,
                None => unreachable!("a guard is held until it is dropped"),
            }
        }
    }

    impl<T> Drop for MutexGuard<'_, T> {
        fn drop(&mut self) {
            self.0 = None;
            super::may_switch_threads();
        }
    }
}
