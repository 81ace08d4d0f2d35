//! Permission requests from agents: decided by the session's policy, or put to the player with a deadline.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::backend::PermissionDecision;
use super::PermissionPolicy;
use crate::agent::AgentHandle;
use crate::conversation::{ConversationEvent, PermissionRequested};
use crate::ids::ConversationId;

struct Asked {
    session: ConversationId,
    reply: oneshot::Sender<PermissionDecision>,
}

/// The requests waiting for the player's answer.
pub(crate) struct PermissionBook {
    waiting: Arc<Mutex<HashMap<u64, Asked>>>,
    agent: AgentHandle,
    runtime: tokio::runtime::Handle,
}

impl PermissionBook {
    pub(crate) fn new(agent: AgentHandle, runtime: tokio::runtime::Handle) -> Self {
        Self { waiting: Arc::default(), agent, runtime }
    }

    pub(crate) fn decide(
        &self,
        session: ConversationId,
        policy: PermissionPolicy,
        timeout: Duration,
        tool: String,
        reply: oneshot::Sender<PermissionDecision>,
    ) {
        let request = super::core::next_permission_request();
        tracing::info!(%session, request, %tool, ?policy, "the agent asks permission");
        match policy {
            PermissionPolicy::Deny => {
                let _ = reply.send(PermissionDecision::Deny);
            }
            PermissionPolicy::Allow => {
                let _ = reply.send(PermissionDecision::Allow);
            }
            PermissionPolicy::AskPlayer => {
                self.waiting.lock().insert(request, Asked { session: session.clone(), reply });
                let requested = PermissionRequested { session, request, tool, sequence: 0 };
                self.agent.host().conversations.publish_chat(ConversationEvent::PermissionRequested(requested));
                let waiting = self.waiting.clone();
                self.runtime.spawn(async move {
                    tokio::time::sleep(timeout).await;
                    if let Some(asked) = waiting.lock().remove(&request) {
                        tracing::info!(request, ?timeout, "no answer to the permission request: denied");
                        let _ = asked.reply.send(PermissionDecision::Deny);
                    }
                });
            }
        }
    }

    /// The player's answer. Returns false if the request is not waiting (answered, timed out, or unknown).
    pub(crate) fn answer(&self, request: u64, allow: bool) -> bool {
        let Some(asked) = self.waiting.lock().remove(&request) else { return false };
        let decision = if allow { PermissionDecision::Allow } else { PermissionDecision::Deny };
        asked.reply.send(decision).is_ok()
    }

    /// Denies every request of `session` still waiting (it ended).
    pub(crate) fn deny_all(&self, session: &ConversationId) {
        self.settle_all(session, PermissionDecision::Deny);
    }

    /// Answers every request of `session` still waiting `cancelled` (its turn was cancelled or failed): the agent
    /// is not left waiting for a player who will not be asked again.
    pub(crate) fn cancel_all(&self, session: &ConversationId) {
        self.settle_all(session, PermissionDecision::Cancelled);
    }

    fn settle_all(&self, session: &ConversationId, decision: PermissionDecision) {
        // Answered outside the lock: a reply wakes the agent's side.
        let settled: Vec<Asked> =
            self.waiting.lock().extract_if(|_, asked| &asked.session == session).map(|(_, asked)| asked).collect();
        for asked in settled {
            let _ = asked.reply.send(decision);
        }
    }
}
