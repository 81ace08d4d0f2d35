//! What in-game agent sessions (`acp`, `openai` features) do with their conversations: the game holds them.

use super::*;

/// What in-game agent sessions (`acp`, `openai` features) do with their conversations.
#[cfg_attr(not(any(feature = "acp", feature = "openai")), allow(dead_code))]
impl ConversationHub {
    /// Opens `id` as a conversation the game owns (an in-game agent session): the idle timeout never ends it.
    pub(crate) fn open_held(&self, id: &ConversationId) {
        self.open(id);
        if let Some(entry) = self.inner.lock().conversations.get_mut(id) {
            entry.held = true;
        }
    }

    /// Creates `id` as a game-owned conversation restored from a record: ended or idle, without an event (its
    /// status is the record's, not a transition).
    pub(crate) fn restore_held(&self, id: &ConversationId, ended: bool) {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        let entry = inner.entry(id, now);
        entry.held = true;
        if ended && !entry.facts.ended {
            entry.facts.ended = true;
            entry.status = ConversationStatus::Ended;
            entry.ended_at = Some(now);
        } else if !ended && entry.facts.ended {
            // Forgotten ended, as another conversation by that id: the record says what it is now.
            entry.facts.reactivate();
            entry.status = ConversationStatus::Idle;
            entry.ended_at = None;
        }
    }

    /// Publishes an event of an in-game agent session (chat, errors, permission requests) in its conversation's
    /// sequence. Ignored for an unknown conversation.
    pub(crate) fn publish_chat(&self, event: ConversationEvent) {
        let id = event.conversation().clone();
        self.publish_chat_then_set(&id, vec![event], None, StatusSource::Host);
    }

    /// Stops admitting calls of the in-game agent session `id`, for `why` (or, `None`, admits them again: it went
    /// live again). Its calls already admitted are the session's to cancel.
    pub(crate) fn suspend(&self, id: &ConversationId, why: Option<Suspension>) {
        if let Some(entry) = self.inner.lock().conversations.get_mut(id) {
            entry.suspended = why;
        }
    }

    /// Admits calls of `id` again if they were stopped for `why` only (a failure that came since stays).
    pub(crate) fn end_suspension(&self, id: &ConversationId, why: Suspension) {
        if let Some(entry) = self.inner.lock().conversations.get_mut(id).filter(|entry| entry.suspended == Some(why)) {
            entry.suspended = None;
        }
    }

    /// Forgets `id`, which never became a session (its agent failed to start) or whose session the game forgot
    /// (it ended first): nothing is published.
    pub(crate) fn forget(&self, id: &ConversationId) {
        self.inner.lock().forget(id);
    }

    /// A status the host sets on behalf of a conversation the game drives (an in-game agent session's turn
    /// started, its backend failed): applied like an agent's report, published with source `Host`.
    /// `Ended` is not set this way: see [`end`](Self::end).
    pub(crate) fn host_sets(&self, id: &ConversationId, status: ConversationStatus) -> Reported {
        self.publish_chat_then_set(id, Vec::new(), Some(status), StatusSource::Host)
    }

    /// Publishes `events` of an in-game agent session, then sets `status` as [`host_sets`](Self::host_sets)
    /// does but with `source` (`Agent` for what its agent reported: the end of a turn), as one step: whoever
    /// sees the last of them (a reply completed, an error) and then asks for the status gets the status that
    /// follows them.
    pub(crate) fn publish_chat_then_set(
        &self,
        id: &ConversationId,
        events: Vec<ConversationEvent>,
        status: Option<ConversationStatus>,
        source: StatusSource,
    ) -> Reported {
        let mut inner = self.inner.lock();
        let HubInner { conversations, watchers, .. } = &mut *inner;
        let Some(entry) = conversations.get_mut(id) else { return Reported::Refused };
        entry.last_activity = Instant::now();
        for event in events {
            publish(&self.game, watchers, entry, event);
        }
        let Some(status) = status else { return Reported::Unchanged };
        if status == ConversationStatus::Ended || !entry.facts.agent_reports(status) {
            return Reported::Refused;
        }
        if update(&self.game, watchers, id, entry, source) {
            Reported::Changed
        } else {
            Reported::Unchanged
        }
    }
}
