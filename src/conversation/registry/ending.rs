//! Ending conversations: by the host, once idle, when their in-game agent session goes, or after the idle
//! timeout.

use super::*;

impl ConversationHub {
    /// Ends `id` (by the host): publishes `Ended` once, ends its calls. Ending an ended conversation succeeds
    /// without a second event.
    #[cfg_attr(not(any(feature = "acp", feature = "openai")), allow(dead_code))]
    pub(crate) fn end(&self, id: &ConversationId) -> Result<(), ToolError> {
        self.end_if(id, |_| Ok(true)).map(|_| ())
    }

    /// Ends `id` if `still` says so, decided under the same lock as the end (a call admitted meanwhile is seen).
    /// Returns whether it ended it.
    fn end_if(
        &self,
        id: &ConversationId,
        still: impl FnOnce(&mut Entry) -> Result<bool, ToolError>,
    ) -> Result<bool, ToolError> {
        let orphans = {
            let mut inner = self.inner.lock();
            let HubInner { conversations, watchers, .. } = &mut *inner;
            let entry = conversations.get_mut(id).ok_or_else(|| not_found(id))?;
            if !still(entry)? {
                return Ok(false);
            }
            end_entry(&self.game, watchers, id, entry, StatusSource::Host)
        };
        orphans.end(id);
        self.forget_old_ended();
        Ok(true)
    }

    /// Ends `id` once no call of it is in flight or waits for its tool: now if none is (decided under the lock a
    /// call's admission takes), else when its last one finishes, unless it is [opened](Self::open) again first (an
    /// MCP client's conversation its transport no longer names: a call admitted just before is not cancelled, and
    /// the conversation does not outlive it). Returns whether it ended now.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn end_once_idle(&self, id: &ConversationId) -> bool {
        self.end_if(id, |entry| {
            let idle = entry.active.is_empty() && entry.pending.is_empty();
            entry.end_when_idle = !idle;
            Ok(idle)
        })
        .unwrap_or(false)
    }

    /// [`end`](Self::end) as the public API asks it: an in-game agent session's conversation is ended by ending the
    /// session (its agent stopped, its credential revoked), never alone.
    pub(crate) fn end_unheld(&self, id: &ConversationId) -> Result<(), ToolError> {
        let refuse = |entry: &mut Entry| match entry.held {
            false => Ok(true),
            true => Err(ToolError::with_code(
                ErrorCode::InvalidInput,
                format!(
                    "conversation `{id}` is an in-game agent session's: end the session (`AgentSession::end`, \
                     `SessionRequest::End`), which ends its conversation with its agent"
                ),
            )
            .with_detail("conversation", id)),
        };
        self.end_if(id, refuse).map(|_| ())
    }

    /// Leaves the conversations `owned` says a transport keeps to that transport: the idle timeout never ends them.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn leave_to_transport(&self, owned: TransportOwned) {
        self.inner.lock().transport_owned = Some(owned);
    }

    /// Ends every conversation that had no call in flight and no activity for the idle timeout (neither one the
    /// game holds nor one a transport keeps).
    pub(crate) fn end_idle(&self, now: Instant) {
        let Some(timeout) = self.idle_timeout else { return };
        let idle: Vec<ConversationId> = {
            let inner = self.inner.lock();
            let transport_owned = |id: &ConversationId| inner.transport_owned.as_ref().is_some_and(|owned| owned(id));
            inner
                .conversations
                .iter()
                .filter(|(id, entry)| !entry.held && !transport_owned(id) && is_idle(entry, now, timeout))
                .map(|(id, _)| id.clone())
                .collect()
        };
        for id in idle {
            // Checked again as it ends: a call admitted since (from another thread) keeps it.
            if self.end_if(&id, |entry| Ok(!entry.held && is_idle(entry, now, timeout))).unwrap_or(false) {
                tracing::info!(conversation = %id, ?timeout, "the conversation was idle too long; it ended");
            }
        }
    }
}
