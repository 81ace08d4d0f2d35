//! The callers waiting for one call, grouped by the conversation each called from (rule H12): the call's first
//! caller, and the retries of its operation that joined it, from the same conversation or from another one that
//! names the same task.
//!
//! A caller that cancels leaves; the call is cancelled when the last caller waiting for it cancels. A
//! conversation that ends, or cancels the task, withdraws its own callers only: the call goes on while a caller
//! of another conversation still waits for it (a client that reconnected under a new session and retried), and
//! is cancelled when none is left.
//!
//! The book's lock is a leaf: taken under the host's state lock (admission, a task's cancel) or a call's step lock
//! (a withdrawal), it never calls out while held.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::ids::ConversationId;
use crate::sync::Mutex;

/// One caller's place among the callers of a call.
#[derive(Clone, Debug)]
pub(crate) struct CallerSeat {
    conversation: ConversationId,
    /// The group of its conversation's callers it joined: a conversation that withdrew and called again joins a
    /// new group, which the old seats never count against.
    group: u64,
    /// Fires when this caller stopped waiting: its conversation withdrew it, or (the caller cancels this token
    /// itself) it cancelled while other callers still wait.
    pub withdrawn: CancellationToken,
    /// Set when the caller cancelled itself: what it reads then stays what it read first, whatever its
    /// conversation does later.
    cancelled_itself: Arc<AtomicBool>,
    /// Set when the caller left (it stopped waiting, or stopped observing).
    left: Arc<AtomicBool>,
}

impl CallerSeat {
    /// The conversation it called from.
    pub(crate) fn conversation(&self) -> &ConversationId {
        &self.conversation
    }

    /// The caller cancelled itself (before it cancels [`withdrawn`](Self::withdrawn)).
    pub(crate) fn mark_cancelled(&self) {
        self.cancelled_itself.store(true, Ordering::SeqCst);
    }

    /// Whether the caller still waits for the call: it has not left, and its conversation has not withdrawn it.
    pub(crate) fn waits(&self) -> bool {
        !self.left.load(Ordering::SeqCst) && !self.withdrawn.is_cancelled()
    }
}

/// The callers of one call.
#[derive(Default)]
pub(crate) struct Callers {
    book: Mutex<Book>,
}

#[derive(Default)]
struct Book {
    waiting: HashMap<ConversationId, Group>,
    next_group: u64,
    /// Why each withdrawn group was withdrawn, and whether its withdrawal ended the call.
    withdrawn: HashMap<u64, (String, bool)>,
    /// The last caller left or was withdrawn, and that ends the call (decided here, then ended under the call's
    /// step lock): a retry can no longer join it to keep it going ([`Callers::try_join`]).
    ending: bool,
}

struct Group {
    id: u64,
    callers: usize,
    withdrawn: CancellationToken,
}

/// What a caller's leaving did.
pub(crate) struct Left {
    /// It was the last caller of its conversation waiting for the call.
    pub conversation_gone: bool,
    /// No caller of any conversation is left waiting for it.
    pub none_left: bool,
}

/// What a conversation's withdrawal did.
#[must_use = "the withdrawn callers wait until the withdrawal is told (`Withdrawal::tell`)"]
pub(crate) struct Withdrawal {
    /// The group of callers it withdrew, if the conversation had callers waiting for the call, and the token that
    /// tells them: cancel it (with [`Withdrawal::tell`]) once what they are to read is recorded.
    pub group: Option<(u64, CancellationToken)>,
    /// It ends the call: no caller is left waiting for it (asked for with `ends_if_last`).
    pub ends: bool,
}

impl Withdrawal {
    /// Whether the conversation had callers waiting for the call.
    pub(crate) fn had_callers(&self) -> bool {
        self.group.is_some()
    }

    /// Tells the withdrawn callers they stopped waiting.
    pub(crate) fn tell(&self) {
        if let Some((_, withdrawn)) = &self.group {
            withdrawn.cancel();
        }
    }
}

impl Callers {
    /// One more caller from `conversation` waits for the call, unless its last caller is ending it this moment
    /// (its outcome is set as soon as the one ending it has the call's step lock, which it holds already).
    pub(crate) fn try_join(&self, conversation: &ConversationId) -> Option<CallerSeat> {
        let mut book = self.book.lock();
        (!book.ending).then(|| Self::seat(&mut book, conversation))
    }

    /// One more caller from `conversation` waits for the call (and reads its end, if it is ending).
    pub(crate) fn join(&self, conversation: &ConversationId) -> CallerSeat {
        Self::seat(&mut self.book.lock(), conversation)
    }

    fn seat(book: &mut Book, conversation: &ConversationId) -> CallerSeat {
        let Book { waiting, next_group, .. } = book;
        let group = waiting.entry(conversation.clone()).or_insert_with(|| {
            *next_group += 1;
            Group { id: *next_group, callers: 0, withdrawn: CancellationToken::new() }
        });
        group.callers += 1;
        CallerSeat {
            conversation: conversation.clone(),
            group: group.id,
            withdrawn: group.withdrawn.child_token(),
            cancelled_itself: Arc::default(),
            left: Arc::default(),
        }
    }

    /// The caller of `seat` leaves (each leaves once); a caller its conversation already withdrew changes nothing.
    /// With `ends_if_last`, the call ends if no caller is left then (it cancelled): decided under the book's lock,
    /// so no retry joins in between ([`try_join`](Self::try_join)).
    pub(crate) fn leave(&self, seat: &CallerSeat, ends_if_last: bool) -> Left {
        seat.left.store(true, Ordering::SeqCst);
        let mut book = self.book.lock();
        let Some(group) = book.waiting.get_mut(&seat.conversation).filter(|group| group.id == seat.group) else {
            return Left { conversation_gone: false, none_left: false };
        };
        group.callers -= 1;
        let conversation_gone = group.callers == 0;
        if conversation_gone {
            book.waiting.remove(&seat.conversation);
        }
        let none_left = book.waiting.is_empty();
        book.ending |= none_left && ends_if_last;
        Left { conversation_gone, none_left }
    }

    /// `conversation` withdraws its callers, because of `why`: each of them stops waiting once the returned
    /// withdrawal is told ([`Withdrawal::tell`]), after the caller recorded whether that ended the call. With
    /// `ends_if_last: Some(own)`, the call ends if no caller is left then and the conversation had callers or
    /// the call is its own (`own`) ([`Withdrawal::ends`]): decided under the book's lock, as for
    /// [`leave`](Self::leave).
    pub(crate) fn withdraw(&self, conversation: &ConversationId, why: &str, ends_if_last: Option<bool>) -> Withdrawal {
        let mut book = self.book.lock();
        let group = book.waiting.remove(conversation);
        if let Some(group) = &group {
            book.withdrawn.insert(group.id, (why.to_owned(), false));
        }
        let none_left = book.waiting.is_empty();
        let ends = none_left && ends_if_last.is_some_and(|own| own || group.is_some());
        book.ending |= ends;
        Withdrawal { group: group.map(|group| (group.id, group.withdrawn)), ends }
    }

    /// The withdrawal of `group` ended the call: its callers read the call's outcome, not that it goes on.
    pub(crate) fn ended_by(&self, group: u64) {
        if let Some((_, ended)) = self.book.lock().withdrawn.get_mut(&group) {
            *ended = true;
        }
    }

    /// Whether the call still counts as `owner`'s (its conversation's) in flight: a caller of `owner` waits for it,
    /// or no caller of another conversation does (a keyed call its caller dropped so that a retry joins it). One
    /// `owner` withdrew from while another conversation waits goes on for that one, not for `owner`.
    pub(crate) fn counts_for(&self, owner: &ConversationId) -> bool {
        let book = self.book.lock();
        book.waiting.contains_key(owner) || book.waiting.is_empty()
    }

    /// Why the conversation of `seat` withdrew it, and whether that ended the call, if it did and the caller had not
    /// cancelled itself first.
    pub(crate) fn why_withdrawn(&self, seat: &CallerSeat) -> Option<(String, bool)> {
        if seat.cancelled_itself.load(Ordering::SeqCst) {
            return None;
        }
        self.book.lock().withdrawn.get(&seat.group).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h12_a_withdrawn_conversation_that_calls_again_joins_a_new_group_its_old_seats_never_leave() {
        let callers = Callers::default();
        let (a, b) = (ConversationId::from("a"), ConversationId::from("b"));
        let old = callers.join(&a);
        let other = callers.join(&b);
        let withdrawal = callers.withdraw(&a, "a ended", Some(true));
        assert!(withdrawal.had_callers() && !withdrawal.ends, "b still waits");
        assert!(!old.withdrawn.is_cancelled() && old.waits(), "told only once what it reads is recorded");
        withdrawal.tell();
        assert!(old.withdrawn.is_cancelled() && !old.waits());
        assert_eq!(callers.why_withdrawn(&old), Some(("a ended".to_string(), false)));
        let again = callers.join(&a);
        assert!(!callers.leave(&old, true).conversation_gone, "the old seat leaves nothing");
        let left = callers.leave(&again, true);
        assert!(left.conversation_gone && !left.none_left, "a's new group is gone, b still waits");
        let late = callers.try_join(&a).expect("the call goes on for b: a retry may join it");
        assert!(!callers.leave(&late, true).none_left, "b still waits");
        assert!(callers.leave(&other, true).none_left, "the last caller left");
        assert!(callers.try_join(&a).is_none(), "ending: no retry joins it any more");
        assert_eq!(callers.why_withdrawn(&other), None);
    }
}
