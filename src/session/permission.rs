//! Permission requests from agents: decided by the session's policy, or put to the player with a deadline (at most
//! [`MAX_WAITING_PER_SESSION`] of a session at once; past it, denied without asking). A request put to the player
//! is published ([`PermissionRequested`]) and, however it ends, settled once
//! ([`PermissionSettled`]): answered, timed out, or withdrawn (with its turn or session, or by the agent).
//!
//! The book's lock is taken after a session's state lock (a request is put, or withdrawn, under it) and before
//! the conversation hub's (requests and settlements are published under it, so they are in order).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::backend::PermissionDecision;
use super::PermissionPolicy;
use crate::agent::AgentHandle;
use crate::conversation::{ConversationEvent, PermissionOutcome, PermissionRequested, PermissionSettled};
use crate::ids::ConversationId;

/// The most requests of one session put to the player at once: past it, the agent's next request is denied
/// without asking (an agent that asks in a loop does not fill the player's screen with prompts).
const MAX_WAITING_PER_SESSION: usize = 16;

/// A request from the agent: what it would do, where its answer goes, and the token the agent's taking it back
/// cancels.
pub(crate) struct Asking {
    pub(crate) tool: String,
    pub(crate) kind: Option<String>,
    pub(crate) input: Option<String>,
    pub(crate) details: Vec<crate::PermissionDetail>,
    pub(crate) reply: oneshot::Sender<PermissionDecision>,
    pub(crate) withdrawn: CancellationToken,
}

struct Asked {
    session: ConversationId,
    reply: oneshot::Sender<PermissionDecision>,
    /// Stops the request's timeout once it is settled (answered, withdrawn) and dropped, so that no task waits out
    /// the timeout of every request ever made.
    _settled: tokio_util::sync::DropGuard,
}

/// The requests waiting for the player's answer.
pub(crate) struct PermissionBook {
    waiting: Arc<Mutex<HashMap<u64, Asked>>>,
    agent: AgentHandle,
    runtime: tokio::runtime::Handle,
}

/// Whoever takes a request out of the waiting ones answers the agent (`decision`) and publishes the
/// settlement, still holding the lock it was taken under: exactly one of the player, the timeout and a
/// withdrawal does, and a withdrawal (a session's end) finds every earlier settlement already published.
fn settle(
    agent: &AgentHandle,
    request: u64,
    asked: Asked,
    outcome: PermissionOutcome,
    decision: PermissionDecision,
) -> bool {
    // Published before the agent hears the answer: what the agent says about it comes after the settlement.
    let settled = PermissionSettled { session: asked.session, request, outcome, sequence: 0 };
    agent.host().conversations.publish_chat(ConversationEvent::PermissionSettled(settled));
    asked.reply.send(decision).is_ok()
}

impl PermissionBook {
    pub(crate) fn new(agent: AgentHandle, runtime: tokio::runtime::Handle) -> Self {
        Self { waiting: Arc::default(), agent, runtime }
    }

    pub(crate) fn decide(&self, session: ConversationId, policy: PermissionPolicy, timeout: Duration, asking: Asking) {
        let Asking { tool, kind, input, details, reply, withdrawn } = asking;
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
                let requested =
                    PermissionRequested { session: session.clone(), request, tool, kind, input, details, sequence: 0 };
                let settled = CancellationToken::new();
                {
                    // Published before anyone can take it out: its settlement follows it.
                    let mut waiting = self.waiting.lock();
                    if waiting.values().filter(|asked| asked.session == session).count() >= MAX_WAITING_PER_SESSION {
                        tracing::warn!(
                            %session,
                            request,
                            "the agent has {MAX_WAITING_PER_SESSION} permission requests waiting for the player: \
                             this one is denied without asking"
                        );
                        let _ = reply.send(PermissionDecision::Deny);
                        return;
                    }
                    waiting.insert(request, Asked { session, reply, _settled: settled.clone().drop_guard() });
                    self.agent.host().conversations.publish_chat(ConversationEvent::PermissionRequested(requested));
                }
                let (waiting, agent) = (self.waiting.clone(), self.agent.clone());
                self.runtime.spawn(async move {
                    let timed_out = tokio::select! {
                        () = tokio::time::sleep(timeout) => true,
                        () = withdrawn.cancelled() => false,
                        () = settled.cancelled() => return,
                    };
                    let mut waiting = waiting.lock();
                    let Some(asked) = waiting.remove(&request) else { return };
                    let session = &asked.session;
                    if timed_out {
                        tracing::info!(%session, request, ?timeout, "no answer to the permission request: denied");
                        settle(&agent, request, asked, PermissionOutcome::TimedOut, PermissionDecision::Deny);
                    } else {
                        tracing::info!(%session, request, "the agent took its permission request back: withdrawn");
                        settle(&agent, request, asked, PermissionOutcome::Withdrawn, PermissionDecision::Cancelled);
                    }
                });
            }
        }
    }

    /// The player's answer. Returns false if the request is not waiting (answered, timed out, or unknown).
    pub(crate) fn answer(&self, request: u64, allow: bool) -> bool {
        let mut waiting = self.waiting.lock();
        let Some(asked) = waiting.remove(&request) else { return false };
        let (outcome, decision) = if allow {
            (PermissionOutcome::Allowed, PermissionDecision::Allow)
        } else {
            (PermissionOutcome::Denied, PermissionDecision::Deny)
        };
        settle(&self.agent, request, asked, outcome, decision)
    }

    /// Withdraws every request of `session` still waiting, answering the agent `decision`: `cancelled` when its
    /// turn was cancelled, ended or failed, or the session ends (which cancels its turn: what ACP asks of a client
    /// that cancels a turn). The agent is not left waiting for a player who will not be asked again.
    pub(crate) fn withdraw_all(&self, session: &ConversationId, decision: PermissionDecision) {
        let mut waiting = self.waiting.lock();
        let mut withdrawn: Vec<(u64, Asked)> = waiting.extract_if(|_, asked| &asked.session == session).collect();
        withdrawn.sort_by_key(|(request, _)| *request);
        for (request, asked) in withdrawn {
            settle(&self.agent, request, asked, PermissionOutcome::Withdrawn, decision);
        }
    }
}
