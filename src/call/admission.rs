//! Admission: deciding whether a call may start, binding it to the open visit, and driving it to exactly one
//! outcome (rule H13).
//!
//! The order of checks: the tool exists (`TOOL_NOT_FOUND`), its arguments parse (`INVALID_INPUT`), a visit is
//! open (`NO_WORLD`) and not exiting (`WORLD_CLOSED`). Nothing has run when any of these rejects. An admitted
//! call is recorded in its conversation (which turns `WaitingToolResult`) and runs inside a `tracing` span
//! (`agent_tool_call`) carrying visit, revision, conversation, request and tool. It waits for a loading session
//! (`WORLD_LOADING_TIMEOUT`), then its handler runs on the plugin's runtime.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::{Duration, Instant};

use serde_json::Value;
use tracing::Instrument;

use super::{CallCoordinates, CallCore, CallLife, CallOutcome, CallOutput, CallerSeat, ProgressSink};
use crate::completion::Completion;
use crate::error::{ErrorCode, ToolError};
use crate::host::HostShared;
use crate::ids::{ConversationId, OperationId, RequestId, TaskId};
use crate::lifecycle::VisitInfo;
use crate::panic::{panic_message, CatchUnwind};
use crate::replay::{canonical_arguments, Begin, ReplayKey};
use crate::tool::{require_confirmation, BoxFuture, PreparedCall, ToolScope};

/// One tool invocation, as an agent asks for it.
#[derive(Clone, Debug)]
pub struct CallRequest {
    /// The tool's name.
    pub tool: String,
    /// The arguments: a JSON object.
    pub arguments: Value,
    /// The task the call belongs to; the conversation id when `None`.
    pub task: Option<TaskId>,
    /// A key that makes retries of one operation run once.
    pub operation: Option<OperationId>,
    /// Overrides the tool's timeout.
    pub timeout: Option<Duration>,
    /// Where the handler's progress reports go.
    pub progress: Option<ProgressSink>,
}

impl CallRequest {
    /// A call of `tool` with `arguments`.
    pub fn new(tool: impl Into<String>, arguments: Value) -> Self {
        Self { tool: tool.into(), arguments, task: None, operation: None, timeout: None, progress: None }
    }

    /// Puts the call in a task.
    pub fn task(mut self, task: impl Into<TaskId>) -> Self {
        self.task = Some(task.into());
        self
    }

    /// Gives the call an operation id.
    pub fn operation(mut self, operation: impl Into<OperationId>) -> Self {
        self.operation = Some(operation.into());
        self
    }

    /// Sends the handler's progress reports to `sink`; a retry that joins its operation's running execution
    /// (rule H12) gets that execution's reports from then on, while it waits.
    pub fn progress(mut self, sink: ProgressSink) -> Self {
        self.progress = Some(sink);
        self
    }

    /// Overrides the tool's timeout for this call.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// A call that passed admission.
pub(crate) enum Admitted {
    /// A live execution. `owner` is false for a duplicate that joined another call's execution; `seat` is the
    /// caller's place among the execution's waiting callers.
    Running { life: Arc<CallLife>, owner: bool, seat: CallerSeat },
    /// A duplicate of a finished operation: the request id of the call that ran it, and its retained outcome.
    Retained(RequestId, CallOutcome),
}

/// Admits `request` for `conversation`, or says why not. Never blocks on the main thread.
pub(crate) fn admit(
    host: &Arc<HostShared>,
    conversation: &ConversationId,
    request: CallRequest,
) -> Result<Admitted, ToolError> {
    admit_inner(host, conversation, request, None)
}

/// Where and when a call that waited for its tool arrived.
pub(crate) struct Arrival {
    /// When: its deadline counts from then, so the wait is part of its timeout.
    pub at: Instant,
    /// The visit open then, and its location: the call was made for them (rules H5, H9), so it is admitted into
    /// that visit only, and a location-scoped one only at that location. `None`: no visit was open (it is
    /// admitted into the visit open when its tool appears, as a call made then would be).
    pub made_in: Option<VisitInfo>,
}

/// [`admit`] a call that arrived earlier (one that waited for its tool).
pub(crate) fn admit_since(
    host: &Arc<HostShared>,
    conversation: &ConversationId,
    request: CallRequest,
    arrival: Arrival,
) -> Result<Admitted, ToolError> {
    admit_inner(host, conversation, request, Some(arrival))
}

fn admit_inner(
    host: &Arc<HostShared>,
    conversation: &ConversationId,
    request: CallRequest,
    arrival: Option<Arrival>,
) -> Result<Admitted, ToolError> {
    let (arrived, made_in) = match arrival {
        Some(arrival) => (Some(arrival.at), arrival.made_in),
        None => (None, None),
    };
    let request_id = host.next_request_id();
    let rejected = |mut error: ToolError| {
        error.details.request.get_or_insert(request_id);
        error.details.tool.get_or_insert_with(|| crate::tool::shown_name(&request.tool));
        error
    };
    let tool = host.tools.get(&request.tool).map_err(rejected)?;
    let info = tool.info();
    let confirmed = request.arguments.get("confirm") == Some(&Value::Bool(true));
    // `null` arguments are `{}` to the tool (`object_arguments`): one operation either way.
    let canonical = request.operation.as_ref().map(|_| match &request.arguments {
        Value::Null => canonical_arguments(&Value::Object(Default::default())),
        arguments => canonical_arguments(arguments),
    });
    let prepared = tool.prepare(request.arguments).map_err(rejected)?;
    if info.requires_confirmation && !confirmed {
        return Err(rejected(require_confirmation(false).unwrap_err()));
    }
    let timeout = request.timeout.or(info.timeout).unwrap_or(host.config.default_timeout);
    let admitted_at = Instant::now();
    let deadline = crate::deadline::after(arrived.unwrap_or(admitted_at).min(admitted_at), timeout);
    if arrived.is_some() && deadline <= admitted_at {
        // It waited for its tool past its own timeout (one the tool sets was unknown while it waited): refused,
        // not admitted, so nothing of it runs and nothing is retained for a retry.
        return Err(rejected(ToolError::with_code(
            ErrorCode::Timeout,
            format!("the call waited for its tool past its timeout of {timeout:?}; it was not run"),
        )));
    }

    let (life, ready, accepted, seat) = {
        let mut state = host.state.lock();
        if let Some(made_in) = &made_in {
            // A visit whose exit has begun has ended for a call made in it (`VISIT_ENDED`, as the exit answers the
            // calls still waiting for their tool), not closed to it (`WORLD_CLOSED` is for calls made now).
            let open = state.visit.as_ref().filter(|open| !open.closing).map(|open| &open.info);
            moved_since(made_in, open, info.scope).map_err(rejected)?;
        }
        let Some(open) = state.visit.as_mut() else {
            return Err(rejected(ToolError::with_code(
                ErrorCode::NoWorld,
                "no world is open: the player must enter a world before tools can run",
            )));
        };
        if open.closing {
            let mut error = rejected(ToolError::with_code(
                ErrorCode::WorldClosed,
                format!("world `{}` is closing: calls are no longer admitted", open.info.world),
            ));
            error.details.visit = Some(open.info.visit);
            error.details.world = Some(open.info.world.clone());
            return Err(error);
        }
        // From here a refusal names the visit and location it was refused in (DESIGN §5), as the call's end would.
        let (visit, world, revision) = (open.info.visit, open.info.world.clone(), open.info.location.revision);
        let rejected = |error: ToolError| {
            let mut error = rejected(error);
            error.details.visit.get_or_insert(visit);
            error.details.world.get_or_insert_with(|| world.clone());
            error.details.revision.get_or_insert(revision);
            error
        };
        let task = request.task.clone().unwrap_or_else(|| TaskId::of_conversation(conversation));
        // A read-only tool keys nothing (its schema offers no `operation_id`): reading again reads the world as it
        // is now, where a kept outcome would be the world as it was.
        let keyed = request.operation.clone().filter(|_| !info.annotations.read_only);
        let replay_key = keyed.map(|operation| ReplayKey {
            tool: info.name.clone(),
            task: task.clone(),
            location: (info.scope == ToolScope::Location).then_some(open.info.location.revision),
            operation,
        });
        if let (Some(key), Some(canonical)) = (&replay_key, &canonical) {
            // An execution that ended before its handler started leaves no trace (rule H12): its key is free, for
            // these arguments or others (its entry is forgotten a moment later anyway).
            open.replay.forget(key, |running| running.outcome().is_set() && !running.handler_started());
            let mut begun = open.replay.begin(key, canonical, admitted_at);
            if matches!(begun, Begin::Full) {
                // Executions that ended (their callers may hold the outcome already) whose entries are completed a
                // moment later make room now, as they will then (under the lock: a rare path, a full table).
                let ended = |life: &Arc<CallLife>| {
                    let outcome = life.outcome().get()?;
                    Some(life.handler_started().then(|| {
                        let bytes = crate::replay::retained_bytes(&outcome);
                        ((life.coords.request, outcome), bytes)
                    }))
                };
                if open.replay.settle_ended(ended, admitted_at) {
                    begun = open.replay.begin(key, canonical, admitted_at);
                }
            }
            match begun {
                Begin::Fresh => {}
                // An execution that already has its outcome (its table entry is completed a moment later)
                // answers like a retained one.
                Begin::Join(life) => match life.outcome().get() {
                    Some(outcome) if life.handler_started() => {
                        return Ok(Admitted::Retained(life.coords.request, outcome))
                    }
                    // It ended before its handler started (its entry is forgotten a moment later): not retained
                    // (rule H12), so this one runs.
                    Some(_) => open.replay.forget(key, |running| Arc::ptr_eq(running, &life)),
                    None => {
                        // Its last caller may be ending it this moment (its outcome is set as soon as the one ending
                        // it has the call's step lock, which it holds). As after that end: a handler that never
                        // started leaves no trace (this one runs, below); one that started answers with that end,
                        // which this caller reads once it is set, as a caller that joined before it would.
                        let progress = request.progress.clone();
                        let seat = life
                            .try_join(conversation, progress.clone())
                            .or_else(|| life.handler_started().then(|| life.join(conversation, progress)));
                        match seat {
                            Some(seat) => {
                                // Under the state lock, as a start: a conversation that ends withdraws this caller.
                                if !host.conversations.call_joined(conversation, &life) {
                                    life.leave(&seat, None);
                                    return Err(rejected(host.conversations.refusal(conversation)));
                                }
                                return Ok(Admitted::Running { life, owner: false, seat });
                            }
                            None => open.replay.forget(key, |running| Arc::ptr_eq(running, &life)),
                        }
                    }
                },
                Begin::Retained((first, outcome)) => return Ok(Admitted::Retained(first, outcome)),
                Begin::Conflict => return Err(rejected(conflict(key))),
                Begin::Full => {
                    return Err(rejected(ToolError::with_code(
                        ErrorCode::Busy,
                        "too many keyed operations are in flight in this world; wait for some to finish",
                    )))
                }
            }
        }
        // Only a new execution counts against the limit: a retry that joins one, or gets its retained outcome,
        // adds none.
        if let Some(in_flight) = open.calls.at_limit(conversation, host.config.max_in_flight) {
            return Err(rejected(
                ToolError::with_code(
                    ErrorCode::Busy,
                    format!("this conversation already has {in_flight} calls in flight; wait for one to finish"),
                )
                .with_detail("limit", host.config.max_in_flight),
            ));
        }
        let coords = CallCoordinates {
            request: request_id,
            tool: info.name.clone(),
            scope: info.scope,
            conversation: conversation.clone(),
            task,
            operation: request.operation.clone(),
            replay_key: replay_key.clone(),
            visit: open.info.clone(),
        };
        let life =
            Arc::new(CallLife::new(coords, admitted_at, deadline, host.conversations.clone(), host.jobs.clone()));
        let seat = life.join(conversation, request.progress.clone());
        open.calls.insert(life.clone());
        if let (Some(key), Some(canonical)) = (replay_key, &canonical) {
            open.replay.start(key, canonical, life.clone());
        }
        // Under the state lock: an exit cannot end the call before its conversation knows it started.
        let accepted = host.conversations.call_started(&life);
        (life, open.ready.clone(), accepted, seat)
    };
    if !accepted {
        life.finish(Err(host.conversations.refusal(conversation)));
    }
    let span = tracing::info_span!(
        "agent_tool_call",
        visit = %life.coords.visit.visit,
        revision = life.coords.visit.location.revision.0,
        conversation = %life.coords.conversation,
        request = %life.coords.request,
        tool = %life.coords.tool,
    );
    let driver = drive(host.clone(), life.clone(), prepared, ready, timeout).instrument(span);
    // Admitted from a task of the plugin's own runtime (the MCP server's, or a handler calling a tool): poll the
    // driver once in place, so a handler that finishes without waiting answers with no hop to another task. What
    // is still pending then is spawned; its next poll registers the task's own waker.
    let on_own_runtime = tokio::runtime::Handle::try_current().is_ok_and(|current| current.id() == host.runtime.id());
    if on_own_runtime {
        let mut driver = Box::pin(driver);
        if driver.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending() {
            host.runtime.spawn(driver);
        }
    } else {
        host.runtime.spawn(driver);
    }
    Ok(Admitted::Running { life, owner: true, seat })
}

/// Refuses a call made in visit `made_in` (it waited for its tool) when that visit is no longer the open one, or
/// when the player relocated since and its tool is location-scoped: it was made for them, not for where the game is
/// now. Nothing of it runs.
fn moved_since(made_in: &VisitInfo, open: Option<&VisitInfo>, scope: ToolScope) -> Result<(), ToolError> {
    let open = match open {
        Some(open) if open.visit == made_in.visit => open,
        _ => return Err(visit_ended_while_waiting(made_in)),
    };
    let (then, now) = (made_in.location.revision, open.location.revision);
    if scope == ToolScope::Location && then != now {
        return Err(ToolError::with_code(
            ErrorCode::LocationChanged,
            format!("the player relocated ({then} → {now}) while the call waited for its tool; it was not run"),
        )
        .with_detail("current_revision", now));
    }
    Ok(())
}

/// The error of a call made in visit `made_in` whose visit ended while it waited for its tool.
pub(crate) fn visit_ended_while_waiting(made_in: &VisitInfo) -> ToolError {
    let mut error = ToolError::with_code(
        ErrorCode::VisitEnded,
        format!(
            "the visit of world `{}` this call was made in ended while it waited for its tool; it was not run",
            made_in.world
        ),
    );
    error.details.visit = Some(made_in.visit);
    error.details.world = Some(made_in.world.clone());
    error
}

fn conflict(key: &ReplayKey) -> ToolError {
    ToolError::with_code(
        ErrorCode::OperationConflict,
        format!(
            "operation `{}` of task `{}` was already used with other arguments; use a new operation_id for a new operation",
            key.operation, key.task
        ),
    )
    .with_detail("operation_id", &key.operation)
    .with_detail("task_id", &key.task)
    .with_detail("location_revision", key.location)
    .with_detail("arguments_differ", true)
}

/// Runs an admitted call to its outcome. The call has one even if the driver never ends: dropped unfinished (the
/// plugin's runtime stopped without `AppExit`, as when the app is dropped or unwinds from a panic), the call ends
/// with `VISIT_ENDED` (rule H13), so that a caller waiting on another thread or runtime is answered.
fn drive(
    host: Arc<HostShared>,
    life: Arc<CallLife>,
    prepared: PreparedCall,
    ready: Option<Completion>,
    timeout: Duration,
) -> impl Future<Output = ()> {
    // Made before the driver's first poll: a driver dropped unpolled ends its call too.
    let running = host.running.enter();
    let mut unended = EndsOnDrop(Some((host, life)));
    async move {
        let _running = running;
        let Some((host, life)) = unended.0.as_ref() else { return };
        let (outcome, unfinished) = run(host, life, prepared, ready, timeout).await;
        if !life.finish(outcome) {
            tracing::debug!(request = %life.coords.request, "the call had already ended; its late result was dropped");
        }
        host.release_call(life);
        let Some((_, life)) = unended.0.take() else { return };
        after_the_outcome(&life, unfinished).await;
    }
}

/// What a call (or an input observation) waiting for the open visit's session to load gets when the load failed
/// (`VisitPhase::LoadFailed`).
pub(crate) fn load_failed(error: &crate::completion::CompletionError) -> ToolError {
    ToolError::internal(format!("the world failed to load: {error}"))
}

/// The outcome of a call whose driver the plugin's runtime dropped as it stopped, before the call ended.
pub(crate) fn game_stopped() -> ToolError {
    ToolError::with_code(ErrorCode::VisitEnded, "the game stopped before the call ended")
}

/// Ends the call of a driver dropped before its outcome.
struct EndsOnDrop(Option<(Arc<HostShared>, Arc<CallLife>)>);

impl Drop for EndsOnDrop {
    fn drop(&mut self) {
        let Some((host, life)) = self.0.take() else { return };
        if life.finish(Err(game_stopped())) {
            tracing::debug!(request = %life.coords.request, "the call's driver was dropped: the game stopped");
        }
        host.release_call(&life);
    }
}

/// What is left of a call once it has its outcome.
async fn after_the_outcome(life: &CallLife, unfinished: Option<Handler>) {
    // A handler still running after its call ended keeps running to clean up (rule H10); what it returns is
    // dropped, and a panic in it is caught.
    if let Some(handler) = unfinished {
        if let Err(panic) = handler.await {
            tracing::warn!(request = %life.coords.request, "a tool's handler panicked after its call ended: {}",
                panic_message(&*panic));
        }
    }
}

type Handler = CatchUnwind<BoxFuture<Result<Value, ToolError>>>;

/// Runs the call to its outcome. The handler runs inline in this task (a trivial handler finishes on its first
/// poll without touching the timer or the end signal); if the call ends first, the unfinished handler is returned.
async fn run(
    host: &Arc<HostShared>,
    life: &Arc<CallLife>,
    prepared: PreparedCall,
    ready: Option<Completion>,
    timeout: Duration,
) -> (CallOutcome, Option<Handler>) {
    let deadline = tokio::time::Instant::from_std(life.deadline);
    if let Some(ready) = ready {
        tokio::select! {
            biased;
            _ = life.ended_token().cancelled() => return (Err(life.end_error()), None),
            loaded = ready.finished() => if let Err(error) = loaded {
                return (Err(load_failed(&error)), None);
            },
            _ = tokio::time::sleep_until(deadline) => return (Err(ToolError::with_code(
                ErrorCode::WorldLoadingTimeout,
                format!("the world was still loading after {timeout:?}; try again when it has loaded"),
            )), None),
        }
    }
    if !life.begin_handler() {
        return (Err(life.end_error()), None);
    }
    // The handler's synchronous part (before its first await) is the game author's code too: catch it as well.
    let core = CallCore { life: life.clone(), host: host.clone() };
    let mut handler = match catch_unwind(AssertUnwindSafe(|| prepared(core))) {
        Ok(future) => CatchUnwind(future),
        Err(panic) => return (Err(panicked(life, &*panic)), None),
    };
    let outcome = tokio::select! {
        biased;
        joined = &mut handler => return (match joined {
            Ok(result) => result.map(|value| CallOutput { value, observed: life.observed() }),
            Err(panic) => Err(panicked(life, &*panic)),
        }, None),
        _ = life.ended_token().cancelled() => Err(life.end_error()),
        _ = tokio::time::sleep_until(deadline) => Err(ToolError::with_code(
            ErrorCode::Timeout,
            format!("the call timed out after {timeout:?}; its effect is unknown: inspect the game's state before retrying"),
        )),
    };
    (outcome, Some(handler))
}

/// The call's `INTERNAL` for its handler's panic, logged as an error: the game's bug, which the game's log keeps
/// with the call's tool and request (the default panic hook's line on stderr names neither).
fn panicked(life: &CallLife, panic: &(dyn std::any::Any + Send)) -> ToolError {
    let message = panic_message(panic);
    let (tool, request) = (&life.coords.tool, life.coords.request);
    tracing::error!(tool, %request, conversation = %life.coords.conversation, panic = %message, "a tool's handler panicked");
    ToolError::internal(format!("the tool's handler panicked: {message}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::AgentTool;
    use crate::{CallContext, NoArgs};

    #[test]
    fn h5_a_call_made_in_a_visit_whose_exit_began_while_it_waited_for_its_tool_is_visit_ended_not_world_closed() {
        let (host, _jobs, _feed, _runtime) = crate::host::test_host(None);
        let made_in = host.state.lock().visit.as_ref().expect("open").info.clone();
        // The exit has begun (admission closed) and has not yet ended the calls waiting for their tool, when the
        // tool this one waited for comes.
        host.state.lock().visit.as_mut().expect("open").closing = true;
        let late = AgentTool::new("late", "Registered late.", |_: CallContext<()>, _: NoArgs| async { Ok(()) });
        host.register_tool(Arc::new(late)).expect("registered");
        let arrival = Arrival { at: Instant::now(), made_in: Some(made_in) };
        let request = CallRequest::new("late", serde_json::json!({}));
        let refused = admit_since(&host, &ConversationId::new("agent"), request, arrival);
        let Err(error) = refused else { panic!("not admitted") };
        assert_eq!(error.code, ErrorCode::VisitEnded, "{error:?}");
    }
}
