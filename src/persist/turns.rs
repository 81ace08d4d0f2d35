//! [`Turns`]: one world's operations in the order they were called (rule H7). An operation takes its place in
//! line when it is *called* (under a lock, on the caller's thread), not when its task first runs, so a load
//! called after a save always runs after it, however the runtime schedules their tasks.

use crate::completion::{Completer, Completion};
use crate::sync::Mutex;

/// The line of one world's operations: the completion of the last one that took a turn.
#[derive(Default)]
pub(crate) struct Turns {
    tail: Mutex<Option<Completion>>,
}

/// One operation's place in line.
pub(crate) struct Turn {
    /// Resolves when the operation before this one finished (`None`: nothing was before it).
    pub previous: Option<Completion>,
    /// Complete it when this operation finished, whatever its outcome: the next one starts then.
    pub done: Completer,
}

impl Turns {
    /// A line whose first operation waits for `before` (the world's lock file being closed by the queue before).
    pub(crate) fn after(before: Option<Completion>) -> Self {
        Self { tail: Mutex::new(before) }
    }

    /// Takes the next place in line.
    pub(crate) fn take(&self) -> Turn {
        let (done, turn) = Completion::pending();
        let previous = self.tail.lock().replace(turn);
        Turn { previous, done }
    }

    /// The last operation's completion, if any was called.
    pub(crate) fn last(&self) -> Option<Completion> {
        self.tail.lock().clone()
    }
}

impl Turn {
    /// Waits for the operation before this one (its outcome belongs to its own caller).
    pub(crate) async fn wait(&mut self) {
        if let Some(previous) = self.previous.take() {
            let _ = previous.finished().await;
        }
    }
}
