//! [`AgentHandle`]: the in-process way to be an agent. Every transport and every test goes through it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bevy::prelude::Resource;
use serde_json::Value;

use crate::call::{admit, Admitted, CallLife, CallOutcome, CallRequest, InputContext, Job};
use crate::error::{ErrorCode, ToolError};
use crate::host::{HostShared, VisitStatus};
use crate::ids::{ConversationId, RequestId, TaskId};
use crate::tool::ToolInfo;

/// The in-process agent side of the host: list tools, open conversations, call tools, observe the visit.
/// `Clone + Send + Sync`; a resource of the app, and usable from any thread.
///
/// ```no_run
/// # use bevy::prelude::*;
/// # use bevy_agent_tools::prelude::*;
/// # fn demo(app: &App) {
/// let agent = app.world().resource::<AgentHandle>().clone();
/// let conversation = agent.conversation("my-agent");
/// let call = conversation.call("look_around", serde_json::json!({}));
/// // `call` is a future; it resolves with exactly one outcome.
/// # }
/// ```
#[derive(Resource, Clone)]
pub struct AgentHandle {
    host: Arc<HostShared>,
}

impl AgentHandle {
    pub(crate) fn new(host: Arc<HostShared>) -> Self {
        Self { host }
    }

    /// The registered tools.
    pub fn tools(&self) -> Vec<ToolInfo> {
        self.host.tools.list()
    }

    /// The open visit, for observers.
    pub fn visit(&self) -> Option<VisitStatus> {
        self.host.status()
    }

    /// A conversation named `id`. Opening, reconnecting or dropping a conversation never opens or closes a visit
    /// (rule H1).
    pub fn conversation(&self, id: impl Into<ConversationId>) -> Conversation {
        Conversation { host: self.host.clone(), id: id.into() }
    }

    /// How many `on_client` steps are queued for the main thread now.
    pub fn queued_steps(&self) -> usize {
        self.host.jobs.len()
    }

    /// The plugin's tokio runtime.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.host.runtime
    }
}

/// One agent connection. Cheap to clone.
#[derive(Clone)]
pub struct Conversation {
    host: Arc<HostShared>,
    id: ConversationId,
}

impl Conversation {
    /// The conversation's id.
    pub fn id(&self) -> &ConversationId {
        &self.id
    }

    /// Calls `tool` with `arguments` (a JSON object). Admission happens now; the returned [`Call`] resolves with
    /// the outcome.
    pub fn call(&self, tool: impl Into<String>, arguments: Value) -> Call {
        self.request(CallRequest::new(tool, arguments))
    }

    /// Makes a call described in full.
    pub fn request(&self, request: CallRequest) -> Call {
        match admit(&self.host, &self.id, request) {
            Ok(Admitted::Running { life, owner }) => Call::running(life, owner),
            Ok(Admitted::Retained(outcome)) => Call::ready(None, outcome),
            Err(error) => Call::ready(error.details.request, Err(error)),
        }
    }

    /// Cancels every live call of `task` in this conversation; returns how many ended.
    pub fn cancel_task(&self, task: impl Into<TaskId>) -> usize {
        self.host.cancel_task(&self.id, &task.into())
    }

    /// Records one input (a player prompt, or an agent turn that says it is one) and asks the open session for
    /// its observation on the main thread (rule H14). Each input asks once; no earlier answer is reused. Resolves
    /// by the host's default timeout at the latest.
    pub fn observe_input(&self) -> impl Future<Output = Result<InputContext, ToolError>> + Send + 'static {
        let host = self.host.clone();
        async move {
            let visit = {
                let state = host.state.lock();
                match state.visit.as_ref() {
                    None => return Err(ToolError::with_code(ErrorCode::NoWorld, "no world is open")),
                    Some(open) if open.closing => {
                        return Err(ToolError::with_code(ErrorCode::WorldClosed, "the world is closing"))
                    }
                    Some(open) => open.info.visit,
                }
            };
            let (reply, answer) = tokio::sync::oneshot::channel();
            if host.jobs.send(Job::InputContext { visit, reply }).is_err() {
                return Err(ToolError::with_code(ErrorCode::VisitEnded, "the game stopped"));
            }
            let timeout = host.config.default_timeout;
            let waited = host.runtime.spawn(async move { tokio::time::timeout(timeout, answer).await });
            match waited.await {
                Ok(Ok(Ok(answer))) => answer,
                Ok(Ok(Err(_))) => {
                    Err(ToolError::with_code(ErrorCode::VisitEnded, "the visit ended before the input was observed"))
                }
                Ok(Err(_)) => Err(ToolError::with_code(ErrorCode::Timeout, format!("no frame ran within {timeout:?}"))),
                Err(_) => Err(ToolError::with_code(ErrorCode::VisitEnded, "the game stopped")),
            }
        }
    }
}

/// A call in flight: a future that resolves with the call's one outcome.
///
/// Dropping it before it resolves cancels the call (its handler's `ended()` fires) — unless the call carries an
/// operation id: a keyed operation keeps running so that a retry with the same id gets its outcome. [`Call::cancel`]
/// cancels either kind; [`Call::detach`] stops observing without cancelling. Cancel-safe to poll.
#[must_use = "a call is cancelled when dropped; await it, or detach it"]
pub struct Call {
    request: Option<RequestId>,
    life: Option<Arc<CallLife>>,
    /// Whether dropping this handle cancels the execution.
    cancel_on_drop: bool,
    ready: Option<CallOutcome>,
    waiting: Option<Pin<Box<dyn Future<Output = CallOutcome> + Send>>>,
}

impl Call {
    fn running(life: Arc<CallLife>, owner: bool) -> Self {
        let waiter = life.clone();
        Self {
            request: Some(life.coords.request),
            cancel_on_drop: owner && life.coords.operation.is_none(),
            life: Some(life),
            ready: None,
            waiting: Some(Box::pin(async move { waiter.outcome().wait().await })),
        }
    }

    fn ready(request: Option<RequestId>, outcome: CallOutcome) -> Self {
        Self { request, life: None, cancel_on_drop: false, ready: Some(outcome), waiting: None }
    }

    /// The request id of the execution this call observes (for a duplicate, the first call's).
    pub fn request_id(&self) -> Option<RequestId> {
        self.request
    }

    /// Whether the call runs (or joined a running execution), as opposed to a rejection or a retained outcome.
    pub fn is_running(&self) -> bool {
        self.life.is_some()
    }

    /// The outcome, if the call has ended.
    pub fn try_outcome(&self) -> Option<CallOutcome> {
        match &self.life {
            Some(life) => life.outcome().get(),
            None => self.ready.clone(),
        }
    }

    /// Blocks this thread until the call ends or `timeout` passes. Do not use it on the main thread of a running
    /// app: the call may need a frame to finish.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<CallOutcome> {
        match &self.life {
            Some(life) => life.outcome().wait_until(Instant::now() + timeout),
            None => self.ready.clone(),
        }
    }

    /// Cancels the call: it ends with `CANCELLED` unless it already ended. Returns whether this ended it.
    pub fn cancel(&self) -> bool {
        self.life.as_ref().is_some_and(|life| life.fail(ErrorCode::Cancelled, "the agent cancelled the call"))
    }

    /// Stops observing the call without cancelling it.
    pub fn detach(mut self) {
        self.cancel_on_drop = false;
    }
}

impl Future for Call {
    type Output = CallOutcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<CallOutcome> {
        if let Some(outcome) = &self.ready {
            return Poll::Ready(outcome.clone());
        }
        match self.waiting.as_mut() {
            Some(waiting) => waiting.as_mut().poll(cx),
            None => Poll::Ready(Err(ToolError::internal("the call has no outcome to wait for"))),
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if let Some(life) = self.life.as_ref().filter(|_| self.cancel_on_drop) {
            life.fail(ErrorCode::Cancelled, "the caller stopped waiting for the call");
        }
    }
}
