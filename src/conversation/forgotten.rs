//! [`Forgotten`]: where the event sequence of a conversation the host forgot goes on if it comes back.
//!
//! The host keeps a bounded number of ended conversations; a client may come back to one it forgot (an MCP client
//! after a thousand others ended, by its handle or its name). Its events must go on numbering after its last
//! ones: a HUD ignores an event whose sequence is not newer than the last it saw (DESIGN §6). The last sequence of
//! each of the [`FORGOTTEN_KEPT`] most recently forgotten conversations is kept by id; beyond that, every new
//! conversation starts after the highest sequence of those no longer kept, so none ever restarts below it.

use std::collections::{HashMap, VecDeque};

use crate::ids::ConversationId;

/// How many forgotten conversations' last sequence numbers are kept by id.
pub(crate) const FORGOTTEN_KEPT: usize = 4096;

/// What a conversation created again takes from the one forgotten by its id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Last {
    /// The sequence of its last event: its next one is after it.
    pub sequence: u64,
    /// The last sequence its agent reported with: a report at or below it stays stale.
    pub agent_sequence: u64,
    /// It had ended (the host forgets ended conversations): it comes back ended, so that reopening it publishes
    /// `Ended → Idle` as for one never forgotten.
    pub ended: bool,
}

/// The last sequence numbers of forgotten conversations.
#[derive(Default)]
pub(crate) struct Forgotten {
    last: HashMap<ConversationId, Last>,
    /// The order they were forgotten in (an id re-created and forgotten again may appear twice: its earlier place
    /// only lets it go sooner, which raises `floor`, never lowers a number).
    order: VecDeque<ConversationId>,
    /// The highest last sequence of the conversations no longer kept by id.
    floor: u64,
}

impl Forgotten {
    /// Notes that conversation `id` was forgotten as `last` says.
    pub(crate) fn remember(&mut self, id: ConversationId, last: Last) {
        self.last.insert(id.clone(), last);
        self.order.push_back(id);
        while self.order.len() > FORGOTTEN_KEPT {
            let Some(old) = self.order.pop_front() else { break };
            if let Some(last) = self.last.remove(&old) {
                self.floor = self.floor.max(last.sequence);
            }
        }
    }

    /// Where conversation `id`, created now, starts: after its own last if it was forgotten (and still kept by
    /// id), else as a new one, its sequence at least that of every conversation no longer kept.
    pub(crate) fn start_of(&mut self, id: &ConversationId) -> Last {
        let last = self.last.remove(id).unwrap_or_default();
        Last { sequence: last.sequence.max(self.floor), ..last }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversation_created_again_goes_on_after_its_last_sequence_even_once_no_longer_kept_by_id() {
        let mut forgotten = Forgotten::default();
        let id = |n: usize| ConversationId::new(format!("c{n}"));
        let ended = |sequence: u64| Last { sequence, agent_sequence: 2, ended: true };
        let new = |sequence: u64| Last { sequence, ..Last::default() };
        assert_eq!(forgotten.start_of(&id(0)), new(0), "a new conversation starts at the beginning");
        forgotten.remember(id(0), ended(40));
        assert_eq!(forgotten.start_of(&id(0)), ended(40), "as it was forgotten");
        forgotten.remember(id(0), ended(45));
        for n in 1..=FORGOTTEN_KEPT {
            forgotten.remember(id(n), ended(3));
        }
        assert_eq!(forgotten.last.len(), FORGOTTEN_KEPT, "bounded");
        assert_eq!(forgotten.start_of(&id(0)), new(45), "no longer kept by id: after the floor");
        assert_eq!(forgotten.start_of(&id(FORGOTTEN_KEPT + 1)), new(45), "every new one starts there too");
        assert_eq!(forgotten.start_of(&id(7)), Last { sequence: 45, ..ended(3) });
    }
}
