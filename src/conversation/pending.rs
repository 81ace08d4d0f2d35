//! Calls for a tool whose handler is not registered yet: they wait for it (bounded), then are admitted as usual.
//!
//! A call for an unknown tool waits when the open visit is still loading (a world may register its tools when its
//! session finishes loading), or always when the plugin sets
//! [`tool_wait`](crate::AgentToolsPlugin::tool_wait). It waits until the tool is registered, or until its wait
//! passes: then it fails with `TOOL_NOT_FOUND`, saying how long it waited. Otherwise an unknown tool is rejected at
//! once (a typo should not hang). While it waits, the conversation is `WaitingToolResult` and the call shows in
//! the snapshot's `pending_calls`.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::call::{admit, Admitted, CallLife, CallOutcome, CallRequest};
use crate::error::{ErrorCode, ToolError};
use crate::host::{HostShared, VisitPhase};
use crate::ids::ConversationId;
use crate::signal::OnceSignal;

/// A call that waits for its tool, and then for its outcome.
pub(crate) struct WaitingCall {
    pub outcome: OnceSignal<CallOutcome>,
    pub cancel: CancellationToken,
    /// The admitted execution, once the tool appeared.
    pub life: Mutex<Option<Arc<CallLife>>>,
}

impl WaitingCall {
    /// Cancels the call, wherever it is. Returns whether it had not ended yet.
    pub(crate) fn cancel(&self) -> bool {
        let live = !self.outcome.is_set();
        self.cancel.cancel();
        if let Some(life) = self.life.lock().as_ref() {
            return life.fail(ErrorCode::Cancelled, "the agent cancelled the call");
        }
        live
    }
}

/// How long a call for the unknown tool may wait for it, or `None` if it should be rejected at once.
pub(crate) fn tool_wait(host: &HostShared, request: &CallRequest) -> Option<Duration> {
    let configured = host.config.tool_wait.filter(|wait| !wait.is_zero());
    let loading = host.status().is_some_and(|status| status.phase == VisitPhase::Loading);
    match (configured, loading) {
        (Some(wait), _) => Some(request.timeout.unwrap_or(wait)),
        (None, true) => Some(request.timeout.unwrap_or(host.config.default_timeout)),
        (None, false) => None,
    }
}

/// Starts waiting for `request`'s tool on the runtime.
pub(crate) fn wait_for_tool(
    host: &Arc<HostShared>,
    conversation: &ConversationId,
    request: CallRequest,
    wait: Duration,
) -> Arc<WaitingCall> {
    let call =
        Arc::new(WaitingCall { outcome: OnceSignal::new(), cancel: CancellationToken::new(), life: Mutex::new(None) });
    let task = run(host.clone(), conversation.clone(), request, wait, call.clone());
    host.runtime.spawn(task);
    call
}

async fn run(
    host: Arc<HostShared>,
    conversation: ConversationId,
    request: CallRequest,
    wait: Duration,
    call: Arc<WaitingCall>,
) {
    // If the runtime stops (the game exits) while this waits, the caller still gets an outcome (rule H13).
    let _stopped = OutcomeOnDrop(call.clone());
    let hub = &host.conversations;
    let tool = request.tool.clone();
    let Some(key) = hub.pending_started(&conversation, &tool, request.task.clone(), call.cancel.clone()) else {
        call.outcome.set(Err(ended(&conversation)));
        return;
    };
    let deadline = crate::deadline::after_tokio(tokio::time::Instant::now(), wait);
    let found = loop {
        let registered = host.tool_registered.notified();
        tokio::pin!(registered);
        registered.as_mut().enable();
        if host.tools.get(&tool).is_ok() {
            break Ok(());
        }
        tokio::select! {
            biased;
            _ = call.cancel.cancelled() => break Err(cancelled(&conversation, &host)),
            _ = &mut registered => {}
            _ = tokio::time::sleep_until(deadline) => break Err(not_registered(&host, &tool, wait)),
        }
    };
    let outcome = match found {
        Err(error) => {
            hub.pending_finished(&conversation, key);
            Err(error)
        }
        Ok(()) => {
            tracing::debug!(tool = %tool, conversation = %conversation, "the tool a call waited for was registered");
            let admitted = admit(&host, &conversation, request);
            // Admission counted the call as executing first: the status never dips between waiting and running.
            hub.pending_finished(&conversation, key);
            match admitted {
                Ok(Admitted::Running { life, owner }) => {
                    *call.life.lock() = Some(life.clone());
                    tokio::select! {
                        biased;
                        outcome = life.outcome().wait() => outcome,
                        _ = call.cancel.cancelled() => {
                            if owner {
                                life.fail(ErrorCode::Cancelled, "the agent cancelled the call");
                            }
                            life.outcome().wait().await
                        }
                    }
                }
                Ok(Admitted::Retained(_, outcome)) => outcome,
                Err(error) => Err(error),
            }
        }
    };
    call.outcome.set(outcome);
}

/// Resolves the call with `INTERNAL` if its task is dropped before it set an outcome.
struct OutcomeOnDrop(Arc<WaitingCall>);

impl Drop for OutcomeOnDrop {
    fn drop(&mut self) {
        self.0.outcome.set(Err(ToolError::internal("the game stopped while the call waited for its tool")));
    }
}

fn not_registered(host: &HostShared, tool: &str, wait: Duration) -> ToolError {
    let mut error = match host.tools.get(tool) {
        Err(error) => error,
        Ok(_) => ToolError::with_code(ErrorCode::ToolNotFound, format!("no tool named `{tool}`")),
    };
    error.message = format!("{} (waited {wait:?} for it to be registered)", error.message);
    error.with_detail("waited_ms", wait.as_millis() as u64)
}

fn cancelled(conversation: &ConversationId, host: &HostShared) -> ToolError {
    if host.conversations.accepts(conversation) {
        ToolError::with_code(ErrorCode::Cancelled, "the agent cancelled the call while it waited for its tool")
    } else {
        ended(conversation)
    }
}

/// The error of a call made on an ended conversation.
pub(crate) fn ended(conversation: &ConversationId) -> ToolError {
    ToolError::with_code(
        ErrorCode::Cancelled,
        format!("conversation `{conversation}` has ended: resume it (or open it again) before calling tools"),
    )
    .with_detail("conversation", conversation)
    .with_detail("conversation_ended", true)
}
