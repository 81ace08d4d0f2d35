//! MCP 2025-11-25 sessions are conversations. The two end together:
//!
//! - a client that deletes its session, or a session that expires (no request from its client for the
//!   configured idle time, and no call in flight), ends its conversation: its calls in flight end with
//!   `CANCELLED`; the visit is untouched;
//! - a conversation that ends on the game's side (`AgentHandle::end_conversation`, the host's idle timeout) closes
//!   its session, so the client learns it at its next request (HTTP 404) and starts a new one.
//!
//! Expiry is ours, not rmcp's: rmcp's own keep-alive closes a session's worker but leaves the session in its
//! manager, where nothing observes it. Everything else is rmcp's [`LocalSessionManager`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_core::Stream;
use parking_lot::Mutex;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionId, SessionManager};
use tokio_util::sync::CancellationToken;

use super::naming::conversation_id;
use crate::agent::AgentHandle;
use crate::conversation::{ConversationEvent, ConversationStatus};
use crate::ids::ConversationId;

/// rmcp's [`LocalSessionManager`] (with its keep-alive off), tying each session's life to its conversation's.
pub(crate) struct ConversationSessions {
    inner: LocalSessionManager,
    agent: AgentHandle,
    idle_timeout: Option<Duration>,
    /// Each open session's conversation and when its client was last heard from.
    open: Mutex<HashMap<SessionId, Tracked>>,
}

struct Tracked {
    conversation: ConversationId,
    last_seen: Instant,
}

impl ConversationSessions {
    /// Sessions that expire after `idle_timeout` without a request (never when `None`).
    pub(crate) fn new(agent: AgentHandle, idle_timeout: Option<Duration>) -> Self {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = None;
        Self { inner, agent, idle_timeout, open: Mutex::new(HashMap::new()) }
    }

    /// Starts the two tasks that keep sessions and conversations in step, until `stop`: closing sessions that
    /// expired, and closing the session of a conversation that ended on the game's side.
    pub(crate) fn spawn_upkeep(self: &Arc<Self>, runtime: &tokio::runtime::Handle, stop: CancellationToken) {
        if let Some(idle_timeout) = self.idle_timeout {
            let sessions = self.clone();
            let stop = stop.clone();
            // Checked four times per timeout: a session ends at most a quarter of the timeout late.
            let period = (idle_timeout / 4).max(Duration::from_millis(10));
            runtime.spawn(async move {
                let mut ticks = tokio::time::interval(period);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = ticks.tick() => {}
                    }
                    for id in sessions.expired(Instant::now()) {
                        tracing::info!(session = %id, ?idle_timeout, "the MCP session expired: ending its conversation");
                        let _ = sessions.close_session(&id).await;
                    }
                }
            });
        }
        let sessions = self.clone();
        let mut events = self.agent.subscribe();
        runtime.spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => return,
                    event = events.next() => event,
                };
                match event {
                    Some(ConversationEvent::Status(change)) if change.status == ConversationStatus::Ended => {
                        if let Some(id) = sessions.session_of(&change.conversation) {
                            // Closing an already closed session (the client deleted it) does nothing.
                            let _ = sessions.inner.close_session(&id).await;
                            sessions.open.lock().remove(&id);
                        }
                    }
                    Some(_) => {}
                    None => return,
                }
            }
        });
    }

    /// The sessions whose client has been silent for the idle timeout at `now`, leaving out those whose
    /// conversation has a call in flight (a long tool call is not silence).
    pub(crate) fn expired(&self, now: Instant) -> Vec<SessionId> {
        let Some(idle_timeout) = self.idle_timeout else { return Vec::new() };
        let mut open = self.open.lock();
        let mut expired = Vec::new();
        for (id, tracked) in open.iter_mut() {
            if now.saturating_duration_since(tracked.last_seen) < idle_timeout {
                continue;
            }
            if self.agent.conversation_status(&tracked.conversation) == Some(ConversationStatus::WaitingToolResult) {
                tracked.last_seen = now;
                continue;
            }
            expired.push(id.clone());
        }
        expired
    }

    fn session_of(&self, conversation: &ConversationId) -> Option<SessionId> {
        let open = self.open.lock();
        open.iter().find(|(_, tracked)| &tracked.conversation == conversation).map(|(id, _)| id.clone())
    }

    /// The client was heard from in session `id` (unknown ids are rmcp's to refuse, not ours to track).
    fn seen(&self, id: &SessionId) {
        if let Some(tracked) = self.open.lock().get_mut(id) {
            tracked.last_seen = Instant::now();
        }
    }
}

impl SessionManager for ConversationSessions {
    type Error = <LocalSessionManager as SessionManager>::Error;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let created = self.inner.create_session().await?;
        let conversation = conversation_id(None, Some(created.0.as_ref()), None, None);
        self.open.lock().insert(created.0.clone(), Tracked { conversation, last_seen: Instant::now() });
        Ok(created)
    }

    fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<ServerJsonRpcMessage, Self::Error>> + Send {
        self.seen(id);
        self.inner.initialize_session(id, message)
    }

    fn has_session(&self, id: &SessionId) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        self.inner.has_session(id)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.open.lock().remove(id);
        let closed = self.inner.close_session(id).await;
        // A session that never called a tool has no conversation: nothing to end.
        let _ = self.agent.end_conversation(&conversation_id(None, Some(id.as_ref()), None, None));
        closed
    }

    fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>> + Send
    {
        self.seen(id);
        self.inner.create_stream(id, message)
    }

    fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.seen(id);
        self.inner.accept_message(id, message)
    }

    fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> impl Future<Output = Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>> + Send
    {
        self.seen(id);
        self.inner.create_standalone_stream(id)
    }

    fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> impl Future<Output = Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>> + Send
    {
        self.seen(id);
        self.inner.resume(id, last_event_id)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::prelude::*;
    use crate::testing::{headless_app, AgentTestAppExt, CounterGame, Gate};
    use crate::NoArgs;

    #[test]
    fn a_session_with_a_call_in_flight_never_expires_and_a_silent_one_does() {
        let gate = Gate::new();
        let held = AgentTool::new("held", "Waits at the gate.", {
            let gate = gate.clone();
            move |_: CallContext<u64>, _: NoArgs| {
                let gate = gate.clone();
                async move {
                    gate.pass().await;
                    Ok(())
                }
            }
        });
        let mut app = headless_app(AgentToolsPlugin::new(CounterGame).with_tool(held));
        app.enter_world("alpha");
        let timeout = Duration::from_secs(60);
        let sessions = ConversationSessions::new(app.agent(), Some(timeout));
        let (busy, silent): (SessionId, SessionId) = ("busy".into(), "silent".into());
        let start = Instant::now();
        for id in [&busy, &silent] {
            let conversation = conversation_id(None, Some(id.as_ref()), None, None);
            sessions.open.lock().insert(id.clone(), Tracked { conversation, last_seen: start });
        }
        let call = app.agent().conversation(conversation_id(None, Some("busy"), None, None)).call("held", json!({}));
        app.run_until("the call is in its handler", |_| gate.arrived() == 1);

        assert!(sessions.expired(start + timeout / 2).is_empty(), "nobody expires before the timeout");
        let later = start + timeout * 2;
        assert_eq!(sessions.expired(later), vec![silent.clone()], "the call in flight keeps its session");

        gate.open();
        assert!(app.run_until_resolved(&call).is_ok());
        let mut expired = sessions.expired(later + timeout);
        expired.sort();
        assert_eq!(expired, vec![busy, silent], "silent for a whole timeout after its call finished");
    }
}
