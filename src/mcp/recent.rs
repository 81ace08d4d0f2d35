//! Names that stand for conversations, with when each was last used, a bounded number of them: the identities of
//! sessionless clients (`naming::client_identity`) and the handles `begin_conversation` mints (`handles`). Beyond
//! the bound, the one used longest ago that may go is forgotten and its conversation ends, so that clients sending
//! ever new names cannot grow the game's memory; one with calls in flight is passed over, so no client's running
//! calls are cancelled to make room for another's. A forgotten client that comes back simply reopens its
//! conversation; a forgotten handle is refused (`CONVERSATION_NOT_FOUND`).

use std::collections::HashMap;
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
    clock: u64,
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
        let mut recent = self.recent.lock();
        recent.clock += 1;
        let now = recent.clock;
        recent.last_used.get_mut(identity).map(|used| *used = now).is_some()
    }

    /// Notes a request of client `identity`; returns the identity forgotten to make room for it, if one was,
    /// whose conversation the caller ends: the one used longest ago of those `may_forget` allows (none: all are
    /// kept until a later request finds one).
    pub(crate) fn used(&self, identity: &str, may_forget: impl Fn(&str) -> bool) -> Option<String> {
        let mut recent = self.recent.lock();
        recent.clock += 1;
        let now = recent.clock;
        match recent.last_used.get_mut(identity) {
            Some(used) => *used = now,
            None => {
                recent.last_used.insert(identity.to_owned(), now);
            }
        }
        if recent.last_used.len() <= self.kept {
            return None;
        }
        let oldest = recent
            .last_used
            .iter()
            .filter(|(old, _)| old.as_str() != identity && may_forget(old))
            .min_by_key(|(_, used)| **used)
            .map(|(old, _)| old.clone())?;
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
}
