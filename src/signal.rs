//! A value set once and awaited by many: blocking with a deadline from any thread, or asynchronously on tokio.
//! The one primitive behind [`Completion`](crate::Completion) and the outcome of a call.

use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use tokio::sync::Notify;

pub(crate) struct OnceSignal<T> {
    value: Mutex<Option<T>>,
    changed: Condvar,
    notify: Notify,
}

impl<T: Clone> OnceSignal<T> {
    pub(crate) fn new() -> Self {
        Self { value: Mutex::new(None), changed: Condvar::new(), notify: Notify::new() }
    }

    /// Sets the value if none was set; returns whether this call set it.
    pub(crate) fn set(&self, value: T) -> bool {
        let mut slot = self.value.lock();
        if slot.is_some() {
            return false;
        }
        *slot = Some(value);
        drop(slot);
        self.changed.notify_all();
        self.notify.notify_waiters();
        true
    }

    pub(crate) fn get(&self) -> Option<T> {
        self.value.lock().clone()
    }

    pub(crate) fn is_set(&self) -> bool {
        self.value.lock().is_some()
    }

    /// Blocks until set or until `deadline`; `None` if still unset then.
    pub(crate) fn wait_until(&self, deadline: Instant) -> Option<T> {
        self.wait_until_or(deadline, || false)
    }

    /// Blocks until set, until `stop` says so, or until `deadline`; `None` if still unset then. Whoever makes
    /// `stop` true wakes the waiter with [`nudge`](Self::nudge).
    ///
    /// On a worker of the plugin's runtime (a tool's handler that blocks instead of awaiting), the wait runs in
    /// `block_in_place`: a task spawned from that worker (the save the handler waits for, often) waits in the
    /// worker's own slot, which no other worker takes, so it would never run while the worker blocks.
    pub(crate) fn wait_until_or(&self, deadline: Instant, stop: impl Fn() -> bool) -> Option<T> {
        if let Some(value) = self.get() {
            return Some(value);
        }
        let wait = || {
            let mut slot = self.value.lock();
            while slot.is_none() && !stop() {
                if self.changed.wait_until(&mut slot, deadline).timed_out() {
                    break;
                }
            }
            slot.clone()
        };
        match crate::runtime::on_agent_runtime() {
            true => tokio::task::block_in_place(wait),
            false => wait(),
        }
    }

    /// Wakes the blocked waiters of [`wait_until_or`](Self::wait_until_or) to look at their `stop` again.
    pub(crate) fn nudge(&self) {
        // Under the lock: a waiter between its check and its wait cannot miss this.
        let _slot = self.value.lock();
        self.changed.notify_all();
    }

    /// Waits until set. Cancel-safe.
    pub(crate) async fn wait(&self) -> T {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(value) = self.get() {
                return value;
            }
            notified.await;
        }
    }
}
