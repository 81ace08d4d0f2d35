//! Names that stand for conversations, with when each was last used, a bounded number of them: the identities of
//! sessionless clients (`naming::client_identity`) and the handles `begin_conversation` mints (`handles`). Beyond
//! the bound, the one used longest ago that may go is forgotten and its conversation ends, so that clients sending
//! ever new names cannot grow the game's memory; one with calls in flight is passed over, so no client's running
//! calls are cancelled to make room for another's. A forgotten client that comes back simply reopens its
//! conversation; a forgotten handle is refused (`CONVERSATION_NOT_FOUND`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

/// How many client identities keep their conversation open.
const KEPT: usize = 1_000;

/// The names seen, with when each was last used.
#[derive(Clone)]
pub(crate) struct RecentNames {
    recent: Arc<Mutex<Recent>>,
    kept: usize,
}

#[derive(Default)]
struct Recent {
    last_used: HashMap<String, u64>,
    /// The same names by when each was last used (each use has a clock value of its own): the one to forget is
    /// found from the oldest on, not by reading them all.
    by_use: BTreeMap<u64, String>,
    clock: u64,
}

impl Recent {
    /// Notes a use of `name` now; whether it was known.
    fn note(&mut self, name: &str, known_only: bool) -> bool {
        self.clock += 1;
        let now = self.clock;
        match self.last_used.get_mut(name) {
            Some(used) => {
                let name = self.by_use.remove(used).unwrap_or_else(|| name.to_owned());
                *used = now;
                self.by_use.insert(now, name);
                true
            }
            None if known_only => false,
            None => {
                self.last_used.insert(name.to_owned(), now);
                self.by_use.insert(now, name.to_owned());
                false
            }
        }
    }
}

impl Default for RecentNames {
    fn default() -> Self {
        Self::keeping(KEPT)
    }
}

impl RecentNames {
    pub(crate) fn keeping(kept: usize) -> Self {
        Self { recent: Arc::default(), kept }
    }

    /// Notes a use of `identity` if it is known; returns whether it is.
    pub(crate) fn touch(&self, identity: &str) -> bool {
        self.recent.lock().note(identity, true)
    }

    /// Notes a request of client `identity`; returns the identity forgotten to make room for it, if one was,
    /// whose conversation the caller ends: the one used longest ago of those `may_forget` allows (none: all are
    /// kept until a later request finds one).
    pub(crate) fn used(&self, identity: &str, may_forget: impl Fn(&str) -> bool) -> Option<String> {
        let mut recent = self.recent.lock();
        recent.note(identity, false);
        if recent.last_used.len() <= self.kept {
            return None;
        }
        let (&used, _) = recent.by_use.iter().find(|(_, old)| old.as_str() != identity && may_forget(old))?;
        let oldest = recent.by_use.remove(&used)?;
        recent.last_used.remove(&oldest);
        Some(oldest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_used_longest_ago_is_forgotten_once_more_are_kept() {
        let clients = RecentNames::keeping(2);
        let any = |_: &str| true;
        assert_eq!(clients.used("a/1", any), None);
        assert_eq!(clients.used("b/1", any), None);
        assert_eq!(clients.used("a/1", any), None, "a known client adds nothing");
        assert_eq!(clients.used("c/1", any).as_deref(), Some("b/1"), "b was used longest ago (a since)");
        assert_eq!(clients.used("a/1", any), None);
        assert_eq!(clients.used("b/1", any).as_deref(), Some("c/1"), "a forgotten client comes back");
    }

    #[test]
    fn a_client_that_may_not_be_forgotten_is_passed_over_and_the_newest_never_goes() {
        let clients = RecentNames::keeping(1);
        assert_eq!(clients.used("a/1", |_| true), None);
        assert_eq!(clients.used("b/1", |old| old != "a/1"), None, "a is kept: both stay for now");
        assert_eq!(clients.used("c/1", |old| old != "a/1").as_deref(), Some("b/1"), "the oldest that may go");
        assert_eq!(clients.used("d/1", |old| old == "d/1").as_deref(), None, "never the one just used");
    }

    #[test]
    fn making_room_asks_about_the_oldest_names_only_not_every_name_kept() {
        // Each ask takes the conversations' lock (is a call in flight?): a mint of the 10,001st handle asked it
        // 10,000 times.
        let names = RecentNames::keeping(1_000);
        for n in 0..1_000 {
            assert_eq!(names.used(&format!("h{n}"), |_| true), None);
        }
        let asked = std::cell::Cell::new(0);
        let forgotten = names.used("new", |old| {
            asked.set(asked.get() + 1);
            old != "h0"
        });
        assert_eq!(forgotten.as_deref(), Some("h1"), "the oldest that may go");
        assert_eq!(asked.get(), 2, "asked about h0, then h1");
    }
}
