//! The conversations of sessionless clients named by their identity (`naming::client_identity`): a bounded
//! number stays open. Beyond it, the one used longest ago is forgotten and its conversation ends, so that clients
//! sending ever new names cannot grow the game's memory; a forgotten client that comes back simply reopens its
//! conversation.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// How many client identities keep their conversation open.
const KEPT: usize = 1_000;

/// The client identities seen, with when each was last used.
#[derive(Clone)]
pub(crate) struct ClientConversations {
    recent: Arc<Mutex<Recent>>,
    kept: usize,
}

#[derive(Default)]
struct Recent {
    last_used: HashMap<String, u64>,
    clock: u64,
}

impl Default for ClientConversations {
    fn default() -> Self {
        Self::keeping(KEPT)
    }
}

impl ClientConversations {
    pub(crate) fn keeping(kept: usize) -> Self {
        Self { recent: Arc::default(), kept }
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
        let clients = ClientConversations::keeping(2);
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
        let clients = ClientConversations::keeping(1);
        assert_eq!(clients.used("a/1", |_| true), None);
        assert_eq!(clients.used("b/1", |old| old != "a/1"), None, "a is kept: both stay for now");
        assert_eq!(clients.used("c/1", |old| old != "a/1").as_deref(), Some("b/1"), "the oldest that may go");
        assert_eq!(clients.used("d/1", |old| old == "d/1").as_deref(), None, "never the one just used");
    }
}
