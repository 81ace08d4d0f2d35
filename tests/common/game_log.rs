//! What a game running on its own thread wrote for a test (one line per message its systems read), and waits on
//! it that wake when lines are written: no polling. Every wait is bounded.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Lines written by a game's systems, in the order written. Cheap to clone: clones share the lines.
#[derive(Clone, Default)]
pub struct GameLog(Arc<(Mutex<Vec<String>>, Condvar)>);

impl GameLog {
    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.0 .0.lock().clone()
    }

    /// Appends `lines` and wakes every wait.
    pub fn write(&self, lines: impl IntoIterator<Item = String>) {
        let (written, changed) = &*self.0;
        let mut written = written.lock();
        let before = written.len();
        written.extend(lines);
        if written.len() > before {
            changed.notify_all();
        }
    }

    /// Waits until `find` finds something in the lines, and returns it; fails the test, naming `what` and showing
    /// the lines, if nothing is found within `within`.
    pub fn wait_until<T>(&self, what: &str, within: Duration, mut find: impl FnMut(&[String]) -> Option<T>) -> T {
        let until = Instant::now() + within;
        let (written, changed) = &*self.0;
        let mut lines = written.lock();
        loop {
            if let Some(found) = find(&lines) {
                return found;
            }
            if changed.wait_until(&mut lines, until).timed_out() {
                match find(&lines) {
                    Some(found) => return found,
                    None => panic!("{what}: not within {within:?} in {:#?}", *lines),
                }
            }
        }
    }

    /// The first line containing `what`, waiting for it up to `within`.
    pub fn wait_for(&self, what: &str, within: Duration) -> String {
        self.wait_until(&format!("a line with {what:?}"), within, |lines| {
            lines.iter().find(|line| line.contains(what)).cloned()
        })
    }
}
