//! Calls for a tool whose handler is not registered yet: they wait for it (bounded), then are admitted as usual.
//!
//! A call for an unknown tool waits when the open visit is still loading (a world may register its tools when its
//! session finishes loading), or always when the plugin sets
//! [`tool_wait`](crate::AgentToolsPlugin::tool_wait). It waits until the tool is registered, or until its wait
//! passes: then it fails with `TOOL_NOT_FOUND`, saying how long it waited (`WORLD_LOADING_TIMEOUT` if the world
//! is still loading then). Waiting only for the load, it waits at most [`LOADED_GRACE`] more once the load has
//! finished, and fails with the load's error (`INTERNAL`) at once if the load failed. A call made while a visit was
//! open is admitted into that visit only (a location-scoped one at that location only): if the visit ends first, it
//! ends with `VISIT_ENDED` as the visit's calls do; one made with no world open ends with `WORLD_CLOSED` when the
//! game exits. The wait counts toward the call's own timeout: once admitted, its deadline is its arrival plus its
//! timeout.
//! Otherwise an unknown tool is rejected at once (a typo should not hang). While it waits, the conversation is
//! `WaitingToolResult` and the call shows in the snapshot's `pending_calls`. A conversation may have as many calls
//! waiting as it may have in flight ([`AgentToolsPlugin::max_in_flight_per_conversation`]): beyond, a call gets
//! `BUSY` at once.
//!
//! [`AgentToolsPlugin::max_in_flight_per_conversation`]: crate::AgentToolsPlugin::max_in_flight_per_conversation

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::call::{
    admit_since, load_failed, visit_ended_while_waiting, Admitted, Arrival, CallLife, CallOutcome, CallRequest,
    CallerSeat,
};
use crate::error::{ErrorCode, ToolError};
use crate::host::{HostShared, VisitPhase};
use crate::ids::{ConversationId, VisitId};
use crate::lifecycle::VisitInfo;
use crate::signal::OnceSignal;
use crate::tool::shown_name;

/// A call that waits for its tool, and then for its outcome.
pub(crate) struct WaitingCall {
    pub outcome: OnceSignal<CallOutcome>,
    pub cancel: CancellationToken,
    /// Why its conversation cancelled it, if it did ([`WaitCancel`]); otherwise its caller did.
    why: Arc<Mutex<Option<String>>>,
    /// The admitted execution once the tool appeared (with the caller's seat among its callers), and whether the
    /// caller left it.
    slot: Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    life: Option<(Arc<CallLife>, CallerSeat)>,
    /// Its tool came and it is being admitted ([`admit_waiting`]): its admission decides its outcome.
    admitting: bool,
    /// The caller left (`true`: it cancelled): it leaves the execution once, as soon as there is one.
    left: Option<bool>,
}

impl WaitingCall {
    /// Cancels the call, wherever it is (an execution it joined goes on while another caller waits for it: see
    /// [`CallLife::leave`]). Returns whether it had not ended yet.
    pub(crate) fn cancel(&self) -> bool {
        let live = !self.outcome.is_set();
        self.cancel.cancel();
        self.leave(true) && live
    }

    /// The caller leaves (cancelling, or only no longer observing): once. Returns whether this was its leaving.
    pub(crate) fn leave(&self, cancel: bool) -> bool {
        let mut slot = self.slot.lock();
        if slot.left.is_some() {
            return false;
        }
        slot.left = Some(cancel);
        if let Some((life, seat)) = &slot.life {
            life.leave(seat, cancel.then_some(CallLife::CANCELLED_BY_AGENT));
        }
        true
    }

    /// The request id of the execution, once admitted.
    pub(crate) fn request(&self) -> Option<crate::ids::RequestId> {
        self.slot.lock().life.as_ref().map(|(life, _)| life.coords.request)
    }

    /// The execution was admitted: a caller that already left leaves it now.
    fn admitted(&self, life: &Arc<CallLife>, seat: &CallerSeat) {
        let mut slot = self.slot.lock();
        slot.life = Some((life.clone(), seat.clone()));
        if let Some(cancel) = slot.left {
            life.leave(seat, cancel.then_some(CallLife::CANCELLED_BY_AGENT));
        }
    }

    /// Its visit ended before it was admitted: it ends with `error`, and stops waiting. One being admitted is left
    /// to its admission: refused once the exit began, or among the visit's calls, which the exit ends.
    fn end_unadmitted(&self, error: ToolError) {
        let slot = self.slot.lock();
        if slot.life.is_none() && !slot.admitting {
            self.outcome.set(Err(error));
            self.cancel.cancel();
        }
    }
}

/// How the conversation cancels one of its calls waiting for its tool, saying why (the player cancelled the turn,
/// the agent the task).
#[derive(Clone, Default)]
pub(crate) struct WaitCancel {
    token: CancellationToken,
    why: Arc<Mutex<Option<String>>>,
}

impl WaitCancel {
    /// Cancels the call, for `why`. Returns whether it was not cancelled yet.
    pub(crate) fn cancel(&self, why: &str) -> bool {
        // Under the reason's lock: of two cancels at once, one counts, and its reason is the one given.
        let mut given = self.why.lock();
        if self.token.is_cancelled() {
            return false;
        }
        *given = Some(why.to_string());
        self.token.cancel();
        true
    }

    /// Cancels the call because its conversation ended (the call's error says so).
    pub(crate) fn end(&self) {
        self.token.cancel();
    }
}

/// The calls waiting for their tool, with the visit each was made in (if any): the visit's exit ends its calls
/// at once, so their clients hear `VISIT_ENDED` within the exit (an exit at `AppExit` has no later frame to wake
/// them in), and the game's exit ends the ones made with no world open (their answers go out before the
/// transports stop).
#[derive(Default)]
pub(crate) struct WaitingCalls(Mutex<Waiting>);

#[derive(Default)]
struct Waiting {
    calls: Vec<(Option<VisitId>, Weak<WaitingCall>)>,
    /// The game is exiting: no call waits from now on.
    closed: bool,
}

impl WaitingCalls {
    fn add(&self, visit: Option<VisitId>, call: &Arc<WaitingCall>) -> Result<(), ToolError> {
        let mut waiting = self.0.lock();
        if waiting.closed {
            return Err(game_exiting());
        }
        waiting.calls.retain(|(_, call)| call.upgrade().is_some_and(|call| !call.outcome.is_set()));
        waiting.calls.push((visit, Arc::downgrade(call)));
        Ok(())
    }

    /// The game is exiting (after its visit's exit): every call still waiting for its tool ends with
    /// `WORLD_CLOSED`, and one arriving from now on is refused so.
    pub(crate) fn close(&self) {
        let ended = {
            let mut waiting = self.0.lock();
            waiting.closed = true;
            std::mem::take(&mut waiting.calls)
        };
        for call in ended.iter().filter_map(|(_, call)| call.upgrade()) {
            call.end_unadmitted(game_exiting());
        }
    }

    /// Ends every call made in visit `info` that still waits for its tool, with `VISIT_ENDED`. Called by the exit
    /// once admission is closed (a call arriving after that is refused at once: [`wait_for_tool`]).
    pub(crate) fn end_visit(&self, info: &VisitInfo) {
        let ended: Vec<Weak<WaitingCall>> = {
            let mut waiting = self.0.lock();
            let (ended, kept): (Vec<_>, Vec<_>) =
                waiting.calls.drain(..).partition(|(visit, _)| *visit == Some(info.visit));
            waiting.calls = kept;
            ended.into_iter().map(|(_, call)| call).collect()
        };
        for call in ended.iter().filter_map(Weak::upgrade) {
            call.end_unadmitted(visit_ended_while_waiting(info));
        }
    }
}

/// How long a call waiting for its tool only because the world was loading ([`tool_wait`]) still waits once the load
/// has finished: a world that registers its tools as its session finishes loading does so within a frame or two.
const LOADED_GRACE: Duration = Duration::from_secs(1);

/// The plugin's [`tool_wait`](crate::AgentToolsPlugin::tool_wait), if it set one (`Duration::ZERO` is none).
fn configured_tool_wait(host: &HostShared) -> Option<Duration> {
    host.config.tool_wait.filter(|wait| !wait.is_zero())
}

/// How long a call for the unknown tool may wait for it, or `None` if it should be rejected at once.
pub(crate) fn tool_wait(host: &HostShared, request: &CallRequest) -> Option<Duration> {
    let configured = configured_tool_wait(host);
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
    let call = Arc::new(WaitingCall {
        outcome: OnceSignal::new(),
        cancel: CancellationToken::new(),
        why: Arc::default(),
        slot: Mutex::default(),
    });
    // The visit open now (if any) is the one it was made for: it is admitted into no other, and its exit ends it.
    // Under the state lock, as the exit's first step is: a call either is among those the exit ends, or finds
    // the visit closing and is refused.
    let (made_in, loading) = {
        let state = host.state.lock();
        match state.visit.as_ref() {
            Some(open) if open.closing => {
                let error = ToolError::with_code(
                    ErrorCode::WorldClosed,
                    format!("world `{}` is closing: calls are no longer admitted", open.info.world),
                );
                call.outcome.set(Err(error));
                return call;
            }
            open => {
                // The game's exit ends every call still waiting; one arriving after that is refused.
                if let Err(error) = host.waiting_calls.add(open.map(|open| open.info.visit), &call) {
                    call.outcome.set(Err(error));
                    return call;
                }
                // Waiting only because this visit is loading: its load's end ends the wait too (`run`).
                let waits_for_load = configured_tool_wait(host).is_none();
                let loading = open
                    .filter(|open| waits_for_load && open.phase() == VisitPhase::Loading)
                    .and_then(|open| open.ready.clone());
                (open.map(|open| open.info.clone()), loading)
            }
        }
    };
    let arrival = Arrival { at: std::time::Instant::now(), made_in };
    // Counted among its conversation's waiting calls now, not once its task runs: a `cancel_task` or an end that
    // follows at once finds it.
    let hub = &host.conversations;
    let cancel = WaitCancel { token: call.cancel.clone(), why: call.why.clone() };
    let started =
        hub.pending_started(conversation, &request.tool, request.task.clone(), cancel, host.config.max_in_flight);
    let place = match started.unwrap_or_else(|| Err(hub.refusal(conversation))) {
        Ok(key) => WaitingPlace { host: host.clone(), conversation: conversation.clone(), key: Some(key) },
        Err(mut error) => {
            error.details.tool.get_or_insert_with(|| shown_name(&request.tool));
            call.outcome.set(Err(error));
            return call;
        }
    };
    let waited = Wait { wait, loading };
    let task = run(host.clone(), conversation.clone(), request, waited, call.clone(), arrival, place);
    host.runtime.spawn(task);
    call
}

/// A call's place among its conversation's waiting calls, given back once it stops waiting, or when its task is
/// dropped (the runtime stopped before it ran).
struct WaitingPlace {
    host: Arc<HostShared>,
    conversation: ConversationId,
    key: Option<u64>,
}

impl WaitingPlace {
    fn give_back(&mut self) {
        if let Some(key) = self.key.take() {
            self.host.conversations.pending_finished(&self.conversation, key);
        }
    }
}

impl Drop for WaitingPlace {
    fn drop(&mut self) {
        self.give_back();
    }
}

/// How long a call waits for its tool, and the readiness of the loading visit it waits for instead of a tool, if
/// it waits only because that visit was loading (no [`tool_wait`] set).
struct Wait {
    wait: Duration,
    loading: Option<crate::completion::Completion>,
}

async fn run(
    host: Arc<HostShared>,
    conversation: ConversationId,
    request: CallRequest,
    Wait { wait, mut loading }: Wait,
    call: Arc<WaitingCall>,
    arrival: Arrival,
    mut place: WaitingPlace,
) {
    // If the runtime stops (the game exits) while this waits, the caller still gets an outcome (rule H13).
    let _stopped = OutcomeOnDrop(call.clone());
    let tool = request.tool.clone();
    let mut deadline = crate::deadline::after_tokio(tokio::time::Instant::now(), wait);
    // The load ended (and its grace began) before the tool came.
    let mut load_ended = false;
    let found = loop {
        let registered = host.tool_or_visit_came.notified();
        tokio::pin!(registered);
        registered.as_mut().enable();
        // Cancelled as its tool came (both woke this task): not admitted.
        if call.cancel.is_cancelled() {
            break Err(cancelled(&conversation, &host, &call));
        }
        // One made with no world open runs in the visit that opens: until one does, its tool alone is not enough (a
        // tool registered in `open`, or in an `OnEnter` system before the host's transitions, comes first).
        let registered_now = host.tools.contains(&tool);
        if registered_now && (arrival.made_in.is_some() || host.state.lock().visit.is_some()) {
            break Ok(());
        }
        let load_ends = async {
            match &loading {
                Some(ready) => ready.finished().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = call.cancel.cancelled() => break Err(cancelled(&conversation, &host, &call)),
            _ = &mut registered => {}
            loaded = load_ends => {
                loading = None;
                match loaded {
                    // As a call admitted meanwhile fails.
                    Err(error) => break Err(load_failed(&error)),
                    Ok(()) => {
                        deadline = deadline.min(tokio::time::Instant::now() + LOADED_GRACE);
                        load_ended = true;
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                // Waited for its whole wait, or until the grace after the load ended.
                let waited = match load_ended {
                    true => Duration::from_millis(arrival.at.elapsed().as_millis() as u64),
                    false => wait,
                };
                break Err(match registered_now {
                    true => no_world_came(waited),
                    false => not_registered(&host, &tool, waited),
                })
            }
        }
    };
    let outcome = match found {
        Err(error) => {
            place.give_back();
            Err(error)
        }
        Ok(()) => {
            tracing::debug!(tool = %tool, conversation = %conversation, "the tool a call waited for was registered");
            let admitted = admit_waiting(&host, &conversation, request, arrival, &call);
            // Admission counted the call as executing first: the status never dips between waiting and running.
            place.give_back();
            match admitted {
                Ok(Admitted::Running { life, seat, .. }) => {
                    tokio::select! {
                        biased;
                        // Its conversation ended or cancelled the task: it stops waiting, whether or not the
                        // execution goes on for a caller of another conversation.
                        _ = seat.withdrawn.cancelled() => life.withdrawn_outcome(Some(&seat)),
                        outcome = life.outcome().wait() => outcome,
                        // This caller stops waiting (the execution ended, or goes on for another caller). Cancelled
                        // by its conversation or task rather than by `cancel`, it leaves the execution here.
                        _ = call.cancel.cancelled() => {
                            call.leave(true);
                            // Whoever left first (this task, or `cancel` on the caller's thread) decided under
                            // the call's lock: stopped waiting (the seat says so), or it had ended.
                            match seat.withdrawn.is_cancelled() {
                                true => life.withdrawn_outcome(Some(&seat)),
                                false => life.outcome().get().unwrap_or_else(|| {
                                    Err(ToolError::with_code(ErrorCode::Cancelled, CallLife::CANCELLED_BY_AGENT)
                                        .locate(&life.coords))
                                }),
                            }
                        }
                    }
                }
                Ok(Admitted::Retained(_, outcome)) => outcome,
                Err(error) => Err(error),
            }
        }
    };
    // Every way the wait ends names the call's tool, as an admission's refusals do.
    call.outcome.set(outcome.map_err(|mut error| {
        error.details.tool.get_or_insert_with(|| shown_name(&tool));
        error
    }));
}

/// Admits `call`, whose tool came. Marked as being admitted first, under the call's lock: a visit's exit ending the
/// calls still waiting meanwhile leaves it to this admission, which refuses it (`VISIT_ENDED`: the exit began) or
/// counts it among the visit's calls, which the exit ends. Either way it has one outcome, and never "it was not
/// run" for a call that ran.
pub(crate) fn admit_waiting(
    host: &Arc<HostShared>,
    conversation: &ConversationId,
    request: CallRequest,
    arrival: Arrival,
    call: &WaitingCall,
) -> Result<Admitted, ToolError> {
    call.slot.lock().admitting = true;
    let admitted = admit_since(host, conversation, request, arrival);
    if let Ok(Admitted::Running { life, seat, .. }) = &admitted {
        call.admitted(life, seat);
    }
    admitted
}

fn game_exiting() -> ToolError {
    ToolError::with_code(ErrorCode::WorldClosed, "the game is exiting: calls are no longer admitted")
}

/// Resolves the call if its task is dropped before it set an outcome (the plugin's runtime stopped without
/// `AppExit`): with its execution's outcome if it was admitted (its driver, dropped too, ends it `VISIT_ENDED`: the
/// caller reads what its conversation was told), else `INTERNAL`.
struct OutcomeOnDrop(Arc<WaitingCall>);

impl Drop for OutcomeOnDrop {
    fn drop(&mut self) {
        if self.0.outcome.is_set() {
            return;
        }
        let admitted = self.0.slot.lock().life.as_ref().map(|(life, _)| life.clone());
        let outcome = match admitted {
            Some(life) => life.outcome().get().unwrap_or_else(|| Err(crate::call::game_stopped().locate(&life.coords))),
            None => Err(ToolError::internal("the game stopped while the call waited for its tool")),
        };
        self.0.outcome.set(outcome);
    }
}

fn not_registered(host: &HostShared, tool: &str, wait: Duration) -> ToolError {
    let shown = shown_name(tool);
    if host.status().is_some_and(|status| status.phase == VisitPhase::Loading) {
        // The world may register it when it has loaded: not a missing tool, a load that took longer.
        return ToolError::with_code(
            ErrorCode::WorldLoadingTimeout,
            format!("the world was still loading after {wait:?}, and tool `{shown}` is not registered yet; try again when it has loaded"),
        )
        .with_detail("waited_ms", wait.as_millis() as u64);
    }
    let mut error = match host.tools.get(tool) {
        Err(error) => error,
        Ok(_) => ToolError::with_code(ErrorCode::ToolNotFound, format!("no tool named `{shown}`")),
    };
    error.message = format!("{} (waited {wait:?} for it to be registered)", error.message);
    error.with_detail("waited_ms", wait.as_millis() as u64)
}

/// A call made with no world open whose tool was registered, but no world opened within its wait.
fn no_world_came(wait: Duration) -> ToolError {
    ToolError::with_code(
        ErrorCode::NoWorld,
        format!("no world is open: the player must enter a world before tools can run (waited {wait:?} for one)"),
    )
    .with_detail("waited_ms", wait.as_millis() as u64)
}

fn cancelled(conversation: &ConversationId, host: &HostShared, call: &WaitingCall) -> ToolError {
    if !host.conversations.accepts(conversation) {
        return host.conversations.refusal(conversation);
    }
    let message = match call.why.lock().as_deref() {
        Some(why) => format!("{why} while the call waited for its tool"),
        None => "the agent cancelled the call while it waited for its tool".to_string(),
    };
    ToolError::with_code(ErrorCode::Cancelled, message)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{admit, Admitted, CallRequest};
    use crate::tool::AgentTool;
    use crate::{CallContext, NoArgs};

    fn waiting() -> Arc<WaitingCall> {
        Arc::new(WaitingCall {
            outcome: OnceSignal::new(),
            cancel: CancellationToken::new(),
            why: Arc::default(),
            slot: Mutex::default(),
        })
    }

    #[test]
    fn cancel_task_ends_a_call_made_a_moment_ago_that_waits_for_its_tool() {
        // The test's runtime runs nothing until driven: the call's task has not run when the task is cancelled.
        let (host, _jobs, _feed, runtime) = crate::host::test_host(None);
        let conversation = ConversationId::new("agent");
        let request = CallRequest::new("late", serde_json::json!({})).task("T");
        let call = wait_for_tool(&host, &conversation, request, Duration::from_secs(600));
        assert_eq!(host.cancel_task(&conversation, &crate::ids::TaskId::new("T")), 1, "found, though just made");
        let outcome = runtime.block_on(call.outcome.wait());
        assert_eq!(outcome.map_err(|error| error.code), Err(ErrorCode::Cancelled));
        // Its place among the calls waiting for a tool is given back.
        assert!(!host.conversations.waits_for_tools(&conversation), "its place given back");
    }

    #[test]
    fn h13_a_waiting_call_dropped_after_its_execution_was_admitted_reads_the_executions_end() {
        let (host, _jobs, _feed, _runtime) = crate::host::test_host(None);
        let noop = AgentTool::new("noop", "Does nothing.", |_: CallContext<()>, _: NoArgs| async { Ok(()) });
        host.register_tool(Arc::new(noop)).expect("registered");
        let conversation = ConversationId::new("agent");
        let admitted = |host: &Arc<HostShared>| match admit(
            host,
            &conversation,
            CallRequest::new("noop", serde_json::json!({})),
        ) {
            Ok(Admitted::Running { life, seat, .. }) => (life, seat),
            _ => panic!("admitted"),
        };
        // The runtime stops with both tasks: the waiting one dropped first, its execution still running.
        let (life, seat) = admitted(&host);
        let call = waiting();
        call.admitted(&life, &seat);
        drop(OutcomeOnDrop(call.clone()));
        let code = |call: &WaitingCall| call.outcome.get().and_then(|outcome| outcome.err()).map(|error| error.code);
        assert_eq!(code(&call), Some(ErrorCode::VisitEnded), "it ran: not that it stopped waiting for its tool");
        // Its execution ended first: what it ended with.
        let (life, seat) = admitted(&host);
        life.finish(Err(ToolError::with_code(ErrorCode::Timeout, "slow")));
        let call = waiting();
        call.admitted(&life, &seat);
        drop(OutcomeOnDrop(call.clone()));
        assert_eq!(code(&call), Some(ErrorCode::Timeout));
        // Never admitted: it stopped while it waited.
        let call = waiting();
        drop(OutcomeOnDrop(call.clone()));
        assert_eq!(code(&call), Some(ErrorCode::Internal));
    }
}
