//! [`AgentHandle`]: the in-process way to be an agent. Every transport and every test goes through it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bevy::platform::cell::SyncCell;
use bevy::prelude::Resource;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::call::{admit, Admitted, CallLife, CallOutcome, CallRequest, CallerSeat, InputContext, Job, Left};
use crate::conversation::{
    tool_wait, wait_for_tool, ConversationSnapshot, ConversationStatus, Reported, Subscription, WaitingCall,
};
use crate::error::{ErrorCode, ToolError};
use crate::host::{HostShared, VisitStatus};
use crate::ids::{ConversationId, RequestId, TaskId};
use crate::tool::{AgentTool, ToolInfo};

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
    /// Sets how the host wakes the game's loop when agent work needs a frame (an `on_client` step, an
    /// `every_frame` step, an `on_end` cleanup was queued; an `every_frame` step is not done; a handler awaits
    /// `next_frame`; a conversation event is on its way to the game's messages: a status change, an in-game
    /// agent's chat or permission request, or the answer to a `SessionRequest`; it may be called while the host
    /// holds its own locks, so it must only signal the loop, never call back into this handle), for a game whose
    /// loop sleeps until something happens: `wake` is called from any thread, the main thread included, and
    /// should make the loop run a frame soon. With the feature `winit` the plugin sets it for Bevy's
    /// `WinitPlugin` itself. The first wake set stays: `false` if one was set already.
    pub fn set_wake(&self, wake: impl Fn() + Send + Sync + 'static) -> bool {
        self.host.jobs.set_wake(Box::new(wake))
    }

    pub(crate) fn new(host: Arc<HostShared>) -> Self {
        Self { host }
    }

    /// The registered tools.
    pub fn tools(&self) -> Vec<ToolInfo> {
        self.host.tools.list()
    }

    /// Whether a tool named `name` is registered.
    #[cfg_attr(not(any(feature = "acp", feature = "mcp")), allow(dead_code))]
    pub(crate) fn is_registered(&self, name: &str) -> bool {
        self.host.tools.contains(name)
    }

    /// The open visit, for observers.
    pub fn visit(&self) -> Option<VisitStatus> {
        self.host.status()
    }

    /// Opens the conversation named `id`: a new one starts `Idle`; a known one is reattached; an ended one is
    /// reactivated (`Ended → Idle`, published by the host), unless it is an ended in-game agent session's (it stays
    /// ended until the session is resumed). Opening, reconnecting or dropping a conversation never
    /// opens or closes a visit (rule H1). To reattach without reactivating, and to get a snapshot, use
    /// [`resume`](Self::resume).
    pub fn conversation(&self, id: impl Into<ConversationId>) -> Conversation {
        let id = id.into();
        self.host.conversations.open(&id);
        Conversation { host: self.host.clone(), id }
    }

    /// A handle on conversation `id` that neither creates nor reactivates it.
    #[cfg_attr(not(any(feature = "acp", feature = "openai")), allow(dead_code))]
    pub(crate) fn conversation_handle(&self, id: &ConversationId) -> Conversation {
        Conversation { host: self.host.clone(), id: id.clone() }
    }

    /// Conversation `id`, created `Idle` if unknown; an ended one stays ended (its calls are refused), as does one
    /// the host forgot after it ended.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn conversation_unless_ended(&self, id: &ConversationId) -> Conversation {
        self.host.conversations.open_unless_ended(id);
        Conversation { host: self.host.clone(), id: id.clone() }
    }

    /// Reattaches to a conversation the host knows, as it is (an ended one stays ended): returns its
    /// authoritative [`ConversationSnapshot`] (status, active and pending calls, visit and revision) and a
    /// [`Subscription`] that delivers every event after the snapshot, without gaps or duplicates.
    ///
    /// An empty id is `INVALID_INPUT`; an unknown one is `CONVERSATION_NOT_FOUND` (nothing is created).
    pub fn resume(&self, id: impl Into<ConversationId>) -> Result<Resumed, ToolError> {
        let id = id.into();
        let (snapshot, events) = {
            // The state lock first (the host's lock order): the visit and the snapshot are of the same instant.
            let state = self.host.state.lock();
            let visit = state.visit.as_ref().map(|open| open.info.clone());
            self.host.conversations.attach(&id, visit)?
        };
        Ok(Resumed { conversation: Conversation { host: self.host.clone(), id }, snapshot, events })
    }

    /// The status of conversation `id`, if the host knows it.
    pub fn conversation_status(&self, id: &ConversationId) -> Option<ConversationStatus> {
        self.host.conversations.status(id)
    }

    /// Every conversation's events from now on (status changes; calls started, progressing and finished; in-game
    /// agent sessions' chat and permission requests), in publication order per conversation.
    pub fn subscribe(&self) -> Subscription {
        self.host.conversations.subscribe_all()
    }

    /// Registers a tool while the game runs (for example when a world's session finished loading). Calls waiting
    /// for it are admitted at once. A tool of the same name is replaced. Fails if the tool is for another session
    /// type than the lifecycle's, has an empty name or the MCP transport's own `begin_conversation`, takes arguments
    /// that cannot be an object (`()`: use [`NoArgs`](crate::NoArgs)), or has an argument named `operation_id`,
    /// `task_id` or `conversation`, in any of its shapes (the transports take those out of every call), or its
    /// [`argument_enum`](crate::AgentTool::argument_enum) names an argument it does not have.
    /// `AgentToolsPlugin::with_tool` panics at start-up for the same.
    pub fn register_tool<S: Send + Sync + 'static>(&self, tool: AgentTool<S>) -> Result<(), ToolError> {
        self.host.register_tool(Arc::new(tool)).map_err(ToolError::internal)
    }

    /// Removes the tool named `name` (a world's own tool, registered when it loaded, once the player left it):
    /// clients are told the list changed, and a call for it from now on gets `TOOL_NOT_FOUND` (or waits for it to
    /// be registered again, see [`AgentToolsPlugin::tool_wait`](crate::AgentToolsPlugin::tool_wait)). Its calls
    /// already admitted run on. Returns whether it was registered.
    pub fn unregister_tool(&self, name: &str) -> bool {
        self.host.unregister_tool(name)
    }

    pub(crate) fn host(&self) -> &Arc<HostShared> {
        &self.host
    }

    /// Ends conversation `id` (its calls in flight end with `CANCELLED`, as [`Conversation::end`] says; the visit
    /// is untouched). Ending an ended conversation succeeds; an unknown one is `CONVERSATION_NOT_FOUND`; an
    /// in-game agent session's is `INVALID_INPUT` (end the session instead, which ends its conversation).
    pub fn end_conversation(&self, id: &ConversationId) -> Result<(), ToolError> {
        self.host.conversations.end_unheld(id)
    }

    /// Whether `conversation` has its limit of calls in flight (its next call would get `BUSY`).
    pub fn is_busy(&self, conversation: &ConversationId) -> bool {
        self.host.is_busy(conversation)
    }

    /// How many jobs are queued for the main thread now: `on_client` steps, and the host's own work there (a call's
    /// clean-up, a tool's request for the player's input context). An `every_frame` step counts until its first
    /// run, not while it waits for its next frame.
    pub fn queued_steps(&self) -> usize {
        self.host.jobs.len()
    }

    /// The plugin's tokio runtime.
    pub fn runtime(&self) -> &tokio::runtime::Handle {
        &self.host.runtime
    }
}

impl std::fmt::Debug for AgentHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentHandle").field("visit", &self.visit()).finish_non_exhaustive()
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
    /// the outcome. As over MCP, an `operation_id` or `task_id` among the arguments is the call's (see
    /// [`CallRequest::from_wire`]), not the tool's.
    ///
    /// Dropping the returned [`Call`] before it resolves cancels the call (`let _ = conversation.call(..)` too),
    /// unless it carries an operation id (see [`Call`]).
    /// From a game system, keep it (in a `Local`, a resource or a component) and read
    /// [`try_outcome`](Call::try_outcome) in later frames, or [`detach`](Call::detach) it and read
    /// [`CallFinished`](crate::CallFinished).
    pub fn call(&self, tool: impl Into<String>, arguments: Value) -> Call {
        self.request(CallRequest::new(tool, arguments))
    }

    /// Makes a call described in full. On an ended conversation it is rejected (`CANCELLED`, with
    /// `conversation_ended` in its details) until [`resume`](Self::resume). A call for a tool that is not
    /// registered yet may wait for it: see [`AgentToolsPlugin::tool_wait`](crate::AgentToolsPlugin::tool_wait).
    ///
    /// An `operation_id` or `task_id` left in [`CallRequest::arguments`] is taken out into the request (it must
    /// agree with one set with [`CallRequest::operation`] or [`CallRequest::task`]: `INVALID_INPUT` if not).
    pub fn request(&self, mut request: CallRequest) -> Call {
        if !self.host.conversations.accepts(&self.id) {
            let mut refusal = self.host.conversations.refusal(&self.id);
            refusal.details.tool = Some(crate::tool::shown_name(&request.tool));
            return Call::ready(None, Err(refusal));
        }
        if let Err(mut error) = request.take_wire_ids() {
            error.details.tool = Some(crate::tool::shown_name(&request.tool));
            return Call::ready(None, Err(error));
        }
        let wait = (!self.host.tools.contains(&request.tool)).then(|| tool_wait(&self.host, &request)).flatten();
        if let Some(wait) = wait {
            let cancel_on_drop = request.operation.is_none();
            return Call::waiting(wait_for_tool(&self.host, &self.id, request, wait), cancel_on_drop);
        }
        match admit(&self.host, &self.id, request) {
            Ok(Admitted::Running { life, owner, seat }) => Call::running(life, Some(seat), owner),
            Ok(Admitted::Retained(first, outcome)) => Call::ready(Some(first), outcome),
            Err(error) => Call::ready(error.details.request, Err(error)),
        }
    }

    /// The conversation's status now.
    pub fn status(&self) -> ConversationStatus {
        // A conversation the host forgot (long ended) is ended.
        self.host.conversations.status(&self.id).unwrap_or(ConversationStatus::Ended)
    }

    /// The agent started a turn: `Running`.
    pub fn turn_started(&self) -> Reported {
        self.host.conversations.report(&self.id, ConversationStatus::Running, None)
    }

    /// The agent's turn ended: `Idle`.
    pub fn turn_ended(&self) -> Reported {
        self.host.conversations.report(&self.id, ConversationStatus::Idle, None)
    }

    /// The agent side failed: `Error`, until it reports a turn again (`Running` or `Idle`).
    pub fn report_error(&self) -> Reported {
        self.host.conversations.report(&self.id, ConversationStatus::Error, None)
    }

    /// Reports a status the agent side observed, with its own per-conversation `sequence` number: a report whose
    /// sequence is not newer than the last one seen for this conversation is ignored ([`Reported::Stale`]).
    /// Reporting `Ended` ends the conversation, as [`end`](Self::end) does (and is [`Reported::Refused`] for an
    /// in-game agent session's conversation, as `end` is). Only a resume leaves `Ended`.
    pub fn report(&self, status: ConversationStatus, sequence: u64) -> Reported {
        self.host.conversations.report(&self.id, status, Some(sequence))
    }

    /// Ends the conversation: publishes `Ended` once and ends its in-flight calls (`CANCELLED`; their `ended()`
    /// fires). A keyed execution that a retry from another conversation still waits for (same task and operation
    /// id) goes on for that retry: only this conversation's callers stop waiting (rule H12). Never touches the
    /// visit. Ending an ended conversation succeeds without a second event. `CONVERSATION_NOT_FOUND` if the host
    /// no longer knows it. `INVALID_INPUT` for an in-game agent session's conversation: ending it here would leave
    /// the session live with its agent and credential; end the session (`AgentSession::end`), which ends it.
    pub fn end(&self) -> Result<(), ToolError> {
        self.host.conversations.end_unheld(&self.id)
    }

    /// The explicit `Ended → Idle`: reactivates this ended conversation (a no-op on an active one).
    /// `CONVERSATION_NOT_FOUND` if the host no longer knows it; `SESSION_ENDED` for the ended conversation of an
    /// in-game agent session, which only resuming the session reactivates (`AgentSession::resume`, or
    /// `AgentSessions::resume_session` after a restart).
    pub fn resume(&self) -> Result<(), ToolError> {
        let held = self.host.conversations.is_held(&self.id);
        if held && self.status() == ConversationStatus::Ended {
            return Err(ToolError::with_code(
                ErrorCode::SessionEnded,
                format!("conversation `{}` is an ended in-game agent session's: resume the session instead", self.id),
            ));
        }
        self.host.conversations.reactivate(&self.id)
    }

    /// Observes one of this conversation's calls that is still in flight (as listed in a snapshot's
    /// `active_calls`), for example after a reconnect: the returned [`Call`] resolves with its outcome. Dropping it
    /// does not cancel the call. `None` if the call already finished (its outcome is then in the
    /// [`CallFinished`](crate::CallFinished) event; a keyed call's outcome is also retained for a retry).
    pub fn rejoin(&self, request: RequestId) -> Option<Call> {
        let hub = &self.host.conversations;
        hub.live_call(&self.id, request).and_then(|life| {
            if life.coords.operation.is_some() {
                // Another caller waiting for a keyed execution: the others' cancels no longer end it while this
                // one waits. Unless the conversation ended (or cancelled the task) meanwhile: its end withdrew
                // the callers it had, and must not leave this one waiting.
                // (None: its last caller is ending it this moment.)
                let seat = life.try_join(&self.id, None)?;
                if !hub.accepts(&self.id) || hub.live_call(&self.id, request).is_none() {
                    life.leave(&seat, None);
                    return None;
                }
                Some(Call::running(life, Some(seat), false))
            } else {
                // An observer of the conversation's own call: its owner's cancel or drop still ends it.
                Some(Call::running(life, None, false))
            }
        })
    }

    /// The conversation's snapshot and its events after it: what [`AgentHandle::resume`] returns.
    pub fn subscribe(&self) -> Result<(ConversationSnapshot, Subscription), ToolError> {
        let state = self.host.state.lock();
        let visit = state.visit.as_ref().map(|open| open.info.clone());
        self.host.conversations.attach(&self.id, visit)
    }

    /// Cancels every live call of `task` in this conversation (those still waiting for their tool too), and stops
    /// its retries' waits for executions they joined; returns how many calls ended for this conversation. A keyed
    /// execution that a retry from another conversation still waits for goes on for it (rule H12).
    pub fn cancel_task(&self, task: impl Into<TaskId>) -> usize {
        self.host.cancel_task(&self.id, &task.into())
    }

    /// Records one input (a player prompt, or an agent turn that says it is one) and asks the open session for
    /// its observation on the main thread (rule H14). Each input asks once; no earlier answer is reused. A session
    /// still loading (`Opened::loading`) is asked once it has loaded, as a call's steps wait for it (H3):
    /// `WORLD_LOADING_TIMEOUT` if it has not by then, `INTERNAL` if its load failed. Resolves by the host's
    /// default timeout at the latest.
    pub fn observe_input(&self) -> impl Future<Output = Result<InputContext, ToolError>> + Send + 'static {
        let host = self.host.clone();
        async move {
            let (visit, ready, exiting) = {
                let state = host.state.lock();
                match state.visit.as_ref() {
                    None => return Err(ToolError::with_code(ErrorCode::NoWorld, "no world is open")),
                    Some(open) if open.closing => {
                        return Err(ToolError::with_code(ErrorCode::WorldClosed, "the world is closing"))
                    }
                    Some(open) => (open.info.visit, open.ready.clone(), open.exiting.clone()),
                }
            };
            let timeout = host.config.default_timeout;
            let jobs = host.jobs.clone();
            let left = || ToolError::with_code(ErrorCode::VisitEnded, "the visit ended before the input was observed");
            let observed = async move {
                let deadline = crate::deadline::after_tokio(tokio::time::Instant::now(), timeout);
                if let Some(ready) = ready {
                    tokio::select! {
                        biased;
                        () = exiting.cancelled() => return Err(left()),
                        loaded = ready.finished() => if let Err(error) = loaded {
                            return Err(crate::call::load_failed(&error));
                        },
                        () = tokio::time::sleep_until(deadline) => return Err(ToolError::with_code(
                            ErrorCode::WorldLoadingTimeout,
                            format!("the world was still loading after {timeout:?}"),
                        )),
                    }
                }
                let (reply, answer) = tokio::sync::oneshot::channel();
                if jobs.send(Job::InputContext { visit, reply }).is_err() {
                    return Err(ToolError::with_code(ErrorCode::VisitEnded, "the game stopped"));
                }
                match tokio::time::timeout_at(deadline, answer).await {
                    Ok(Ok(answer)) => answer,
                    Ok(Err(_)) => Err(left()),
                    Err(_) => Err(ToolError::with_code(
                        ErrorCode::Timeout,
                        format!("the game did not answer within {timeout:?}"),
                    )),
                }
            };
            // Dropped with the returned future (an in-game session stops waiting after 500 ms): the game is not
            // asked later for an input that went without its observation.
            crate::runtime::on_tokio(&host.runtime, observed)
                .await
                .unwrap_or_else(|_| Err(ToolError::with_code(ErrorCode::VisitEnded, "the game stopped")))
        }
    }
}

/// What [`AgentHandle::resume`] returns: the reattached conversation, its authoritative snapshot, and its events
/// after the snapshot.
pub struct Resumed {
    /// The conversation.
    pub conversation: Conversation,
    /// Its state when it was reattached.
    pub snapshot: ConversationSnapshot,
    /// Its events after the snapshot: the first has sequence `snapshot.sequence + 1`.
    pub events: Subscription,
}

impl std::fmt::Debug for Resumed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resumed").field("snapshot", &self.snapshot).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Conversation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conversation").field("id", &self.id).field("status", &self.status()).finish()
    }
}

/// A call in flight: a future that resolves with the call's one outcome.
///
/// Dropping it before it resolves cancels the call (its handler's `ended()` fires) — unless the call carries an
/// operation id: a keyed operation keeps running so that a retry with the same id gets its outcome. [`Call::cancel`]
/// cancels either kind (a retry that joined a running operation only stops waiting while another caller still waits
/// for it); [`Call::detach`] stops observing without cancelling. Cancel-safe to poll.
#[must_use = "a call is cancelled when dropped; await it, or detach it"]
pub struct Call {
    request: Option<RequestId>,
    life: Option<Arc<CallLife>>,
    /// Whether dropping this handle cancels the execution.
    cancel_on_drop: bool,
    /// Its place among the execution's waiting callers (an observer of an unkeyed call has none).
    seat: Option<CallerSeat>,
    /// Set once this caller left the execution (cancelled, or dropped): it leaves once.
    left: AtomicBool,
    /// Fires when this caller stopped waiting (it cancelled, or its conversation ended or cancelled the task),
    /// whether or not the execution goes on for others.
    withdrawn: CancellationToken,
    ready: Option<CallOutcome>,
    /// A call that waits for its tool to be registered.
    pending: Option<Arc<WaitingCall>>,
    /// Made on the first poll. Only ever used through `&mut`, so a `Call` is `Sync` (it can be kept in a
    /// resource or a component) without its future being so.
    waiting: Option<SyncCell<Pin<Box<dyn Future<Output = CallOutcome> + Send>>>>,
}

impl Call {
    /// Whether the call still runs (has no outcome yet), as a probe another thread can keep: the MCP transport
    /// waits at exit for the responses of calls that ended, not for those still running.
    #[cfg(feature = "mcp")]
    pub(crate) fn running_probe(&self) -> crate::mcp::RunningProbe {
        match (&self.pending, &self.life) {
            (Some(pending), _) => {
                let pending = pending.clone();
                Arc::new(move || !pending.outcome.is_set())
            }
            (None, Some(life)) => {
                let life = life.clone();
                Arc::new(move || !life.outcome().is_set())
            }
            (None, None) => Arc::new(|| false),
        }
    }

    pub(crate) fn running(life: Arc<CallLife>, seat: Option<CallerSeat>, owner: bool) -> Self {
        let mut call = Self::empty();
        call.request = Some(life.coords.request);
        call.cancel_on_drop = owner && life.coords.operation.is_none();
        if let Some(seat) = &seat {
            call.withdrawn = seat.withdrawn.clone();
        }
        (call.life, call.seat) = (Some(life), seat);
        call
    }

    fn ready(request: Option<RequestId>, outcome: CallOutcome) -> Self {
        let mut call = Self::empty();
        (call.request, call.ready) = (request, Some(outcome));
        call
    }

    fn waiting(pending: Arc<WaitingCall>, cancel_on_drop: bool) -> Self {
        let mut call = Self::empty();
        (call.cancel_on_drop, call.pending) = (cancel_on_drop, Some(pending));
        call
    }

    fn empty() -> Self {
        Self {
            request: None,
            life: None,
            cancel_on_drop: false,
            seat: None,
            left: AtomicBool::new(false),
            withdrawn: CancellationToken::new(),
            ready: None,
            pending: None,
            waiting: None,
        }
    }

    /// The request id of the execution this call observes (for a duplicate, the first call's). A call waiting
    /// for its tool has none until it is admitted.
    pub fn request_id(&self) -> Option<RequestId> {
        match &self.pending {
            Some(pending) => pending.request(),
            None => self.request,
        }
    }

    /// Whether the call runs (or joined a running execution, or waits for its tool), as opposed to a rejection
    /// or a retained outcome.
    pub fn is_running(&self) -> bool {
        self.life.is_some() || self.pending.is_some()
    }

    /// The outcome, if the call has ended.
    pub fn try_outcome(&self) -> Option<CallOutcome> {
        if let Some(pending) = &self.pending {
            return pending.outcome.get();
        }
        match &self.life {
            Some(life) if self.withdrawn.is_cancelled() => Some(life.withdrawn_outcome(self.seat.as_ref())),
            Some(life) => life.outcome().get(),
            None => self.ready.clone(),
        }
    }

    /// Blocks this thread until the call ends or `timeout` passes. Do not use it on the main thread of a running
    /// app: the call may need a frame to finish.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<CallOutcome> {
        if let Some(pending) = &self.pending {
            return pending.outcome.wait_until(crate::deadline::after(Instant::now(), timeout));
        }
        match &self.life {
            Some(life) => {
                let deadline = crate::deadline::after(Instant::now(), timeout);
                let outcome = life.outcome().wait_until_or(deadline, || self.withdrawn.is_cancelled());
                match self.withdrawn.is_cancelled() {
                    true => Some(life.withdrawn_outcome(self.seat.as_ref())),
                    false => outcome,
                }
            }
            None => self.ready.clone(),
        }
    }

    /// Cancels the call: it ends with `CANCELLED` unless it already ended. Returns whether this ended it (for this
    /// caller).
    ///
    /// A keyed call may share its execution with retries of the same operation (rule H12): the execution is
    /// cancelled when the last caller still waiting for it cancels; until then, a caller that cancels only stops
    /// waiting (its outcome is `CANCELLED`) and the others still get the execution's outcome.
    pub fn cancel(&self) -> bool {
        if let Some(pending) = &self.pending {
            return pending.cancel();
        }
        let Some(life) = &self.life else { return false };
        let Some(seat) = &self.seat else {
            return life.finish(Err(life.cancelled(CallLife::CANCELLED_BY_AGENT)));
        };
        if life.outcome().is_set() || self.withdrawn.is_cancelled() || self.left.swap(true, Ordering::SeqCst) {
            return false;
        }
        match life.leave(seat, Some(CallLife::CANCELLED_BY_AGENT)) {
            // The last caller waiting: the execution ended, `CANCELLED`.
            Left::EndedIt => true,
            // It ended first: this caller gets its outcome.
            Left::AlreadyEnded => false,
            // Other callers still wait for the execution: this one stopped waiting (its seat says so).
            Left::StoppedWaiting => {
                life.outcome().nudge();
                true
            }
        }
    }

    /// Stops observing the call without cancelling it.
    pub fn detach(mut self) {
        self.cancel_on_drop = false;
    }
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("request", &self.request)
            .field("resolved", &self.try_outcome().is_some())
            .finish_non_exhaustive()
    }
}

impl Future for Call {
    type Output = CallOutcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<CallOutcome> {
        if let Some(outcome) = &self.ready {
            return Poll::Ready(outcome.clone());
        }
        // The waiting future is made on the first poll: a caller that blocks with `wait_timeout` never needs it.
        if self.waiting.is_none() {
            self.waiting = match (&self.pending, &self.life) {
                (Some(pending), _) => {
                    let pending = pending.clone();
                    Some(SyncCell::new(Box::pin(async move { pending.outcome.wait().await })))
                }
                (None, Some(life)) => {
                    let (life, withdrawn, seat) = (life.clone(), self.withdrawn.clone(), self.seat.clone());
                    Some(SyncCell::new(Box::pin(async move {
                        // Withdrawn first: a caller that cancelled while the execution ran gets `CANCELLED`, even
                        // polled after the execution ended, as `try_outcome` says.
                        tokio::select! {
                            biased;
                            _ = withdrawn.cancelled() => life.withdrawn_outcome(seat.as_ref()),
                            outcome = life.outcome().wait() => outcome,
                        }
                    })))
                }
                (None, None) => None,
            };
        }
        match self.waiting.as_mut() {
            Some(waiting) => waiting.get().as_mut().poll(cx),
            None => Poll::Ready(Err(ToolError::internal("the call has no outcome to wait for"))),
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if let Some(pending) = &self.pending {
            if self.cancel_on_drop {
                pending.cancel();
            } else {
                pending.leave(false);
            }
        }
        let seat = self.seat.as_ref().filter(|_| !self.left.swap(true, Ordering::SeqCst));
        if let (Some(life), Some(seat)) = (&self.life, seat) {
            life.leave(seat, self.cancel_on_drop.then_some("the caller stopped waiting for the call"));
        }
    }
}
