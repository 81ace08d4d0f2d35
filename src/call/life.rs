//! The life of one admitted call: its coordinates, its deadline, how it ends, and its one terminal outcome
//! (rule H13).

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::sync::{Mutex, MutexGuard};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::callers::{CallerSeat, Callers};
use super::{Cleanup, Job, Progress, ProgressSink};
use crate::conversation::ConversationHub;
use crate::error::{ErrorCode, ToolError};
use crate::ids::{ConversationId, OperationId, RequestId, TaskId};
use crate::lifecycle::{Location, VisitInfo};
use crate::replay::ReplayKey;
use crate::signal::OnceSignal;
use crate::tool::ToolScope;

/// Where a call belongs: fixed at admission, never changed.
#[derive(Clone, Debug)]
pub(crate) struct CallCoordinates {
    pub request: RequestId,
    pub tool: String,
    pub scope: ToolScope,
    pub conversation: ConversationId,
    pub task: TaskId,
    pub operation: Option<OperationId>,
    /// The key the call's outcome is retained under, when it has an operation id.
    pub replay_key: Option<ReplayKey>,
    /// The visit and location at admission.
    pub visit: VisitInfo,
}

/// A successful tool result, with the visit and location revision it observed (rule H11).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallOutput {
    /// The tool's output, as JSON.
    pub value: serde_json::Value,
    /// The visit the call belonged to, and the location its last main-thread step observed (the admission
    /// location if it never took one).
    pub observed: VisitInfo,
}

/// How a call ended: exactly one per admitted call.
pub type CallOutcome = Result<CallOutput, ToolError>;

pub(crate) struct CallLife {
    pub coords: CallCoordinates,
    /// When it was admitted.
    pub started: Instant,
    pub deadline: Instant,
    /// Told of the outcome before anyone waiting for it, so the conversation's status is already current.
    hub: Arc<ConversationHub>,
    /// Where its progress reports go: its callers' sinks (its first caller's, and those of the retries that joined
    /// it), each while its caller waits ([`report_progress`](Self::report_progress)).
    progress: Mutex<Vec<(CallerSeat, ProgressSink)>>,
    /// Fires when the call ends, for any reason. `ended()` waits on it.
    ended: CancellationToken,
    /// Held by the pump across check-and-run of an `on_client` step, and by `finish`: an end can never slip in
    /// between the check and the closure (rule H8).
    step: Mutex<Option<ToolError>>,
    observed: Mutex<Location>,
    /// Details the handler recorded, merged into whatever error ends the call.
    details: Mutex<serde_json::Map<String, serde_json::Value>>,
    outcome: OnceSignal<CallOutcome>,
    /// Set when the handler is about to run (never after the call ended): from then on the outcome is retained
    /// for replays of its operation; a call that ended before is not (rule H12).
    handler_started: AtomicBool,
    /// The callers waiting for the call that have not left, by conversation: its first caller, and the retries of
    /// its operation that joined it (rule H12). A cancel, or a conversation's end, cancels the call only when no
    /// other caller is left waiting for it.
    callers: Callers,
    /// `on_end` cleanups, sent to the main thread when the call ends.
    cleanups: Mutex<Cleanups>,
    /// Set (under the conversations' lock) once the conversations were told of the outcome: a retry that joins
    /// after that is not recorded as a call in flight of its conversation.
    pub(crate) finished_in_hub: AtomicBool,
}

struct Cleanups {
    /// Set when the call ended: why (`None`: it succeeded). A cleanup registered after that is sent at once.
    ended: Option<Option<ToolError>>,
    waiting: Vec<Cleanup>,
    jobs: super::JobSender,
}

impl CallLife {
    pub(crate) fn new(
        coords: CallCoordinates,
        started: Instant,
        deadline: Instant,
        hub: Arc<ConversationHub>,
        jobs: super::JobSender,
    ) -> Self {
        let observed = Mutex::new(coords.visit.location.clone());
        Self {
            coords,
            started,
            deadline,
            hub,
            progress: Mutex::new(Vec::new()),
            ended: CancellationToken::new(),
            step: Mutex::new(None),
            observed,
            details: Mutex::new(serde_json::Map::new()),
            outcome: OnceSignal::new(),
            handler_started: AtomicBool::new(false),
            callers: Callers::default(),
            cleanups: Mutex::new(Cleanups { ended: None, waiting: Vec::new(), jobs }),
            finished_in_hub: AtomicBool::new(false),
        }
    }

    /// Keeps `cleanup` for the main thread, to run when the call ends (at once if it already ended).
    pub(crate) fn on_end(&self, cleanup: Cleanup) {
        let mut cleanups = self.cleanups.lock();
        match &cleanups.ended {
            None => cleanups.waiting.push(cleanup),
            Some(reason) => {
                let job = self.cleanup_job(vec![cleanup], reason.clone());
                // Only fails once the game stopped: nothing is left to clean up in.
                let _ = cleanups.jobs.send(job);
            }
        }
    }

    /// Why a call ends when its agent cancels it: by asking, or, over MCP 2026-07-28, by closing the stream that
    /// carried the call (which its client must then send again: a retry with its `operation_id` reads this).
    pub(crate) const CANCELLED_BY_AGENT: &'static str =
        "the agent cancelled the call, or closed the connection that carried it";

    /// One more caller from `conversation` waits for the call: its first caller at admission, or a retry of its
    /// operation that joined it. It gets the call's progress reports in `progress`, if it has one, for as long as it
    /// waits.
    pub(crate) fn join(&self, conversation: &ConversationId, progress: Option<ProgressSink>) -> CallerSeat {
        let seat = self.callers.join(conversation);
        self.listen(&seat, progress);
        seat
    }

    /// [`join`](Self::join), unless the call's last caller is ending it this moment ([`Callers::try_join`]).
    pub(crate) fn try_join(&self, conversation: &ConversationId, progress: Option<ProgressSink>) -> Option<CallerSeat> {
        let seat = self.callers.try_join(conversation)?;
        self.listen(&seat, progress);
        Some(seat)
    }

    fn listen(&self, seat: &CallerSeat, progress: Option<ProgressSink>) {
        if let Some(sink) = progress {
            let mut listeners = self.progress.lock();
            listeners.retain(|(seat, _)| seat.waits());
            listeners.push((seat.clone(), sink));
        }
    }

    /// Hands `progress` to its first caller's sink and to those of the joined callers still waiting.
    pub(crate) fn report_progress(&self, progress: &Progress) {
        let sinks: Vec<ProgressSink> =
            self.progress.lock().iter().filter(|(seat, _)| seat.waits()).map(|(_, sink)| sink.clone()).collect();
        for sink in sinks {
            sink.send(progress.clone());
        }
    }

    /// Whether the call counts among its conversation's calls in flight ([`Callers::counts_for`]).
    pub(crate) fn counts_for_its_conversation(&self) -> bool {
        self.callers.counts_for(&self.coords.conversation)
    }

    /// The caller of `seat` leaves (each leaves once). With `cancel` (why), it cancelled the call: that ends the
    /// call when no other caller is left waiting for it, so a retry that gives up never cancels the work another
    /// caller still waits for; otherwise the caller stops waiting, and reads `CANCELLED` from now on, decided under
    /// the same lock as the call's end (so the last caller of a conversation to leave reads what that
    /// conversation's `CallFinished` said, even when the call finishes just after). Without, it only stopped
    /// observing (a keyed call dropped so that its retry can join it): the call runs on.
    pub(crate) fn leave(&self, seat: &CallerSeat, cancel: Option<&str>) -> Left {
        let Some(why) = cancel else {
            self.callers.leave(seat, false);
            return Left::StoppedWaiting;
        };
        // Under the step lock, as an end (see `withdraw`).
        let mut step = self.lock_for_end();
        if self.outcome.is_set() {
            return Left::AlreadyEnded;
        }
        // Under the step lock, the outcome unset: no caller left means this ends the call.
        let left = self.callers.leave(seat, true);
        if left.none_left {
            return match self.end_under(&mut step, Err(self.cancelled(why))) {
                true => Left::EndedIt,
                false => Left::AlreadyEnded,
            };
        }
        if left.conversation_gone {
            // Every caller of that conversation cancelled: the call goes on for others, not as its call.
            self.hub.call_withdrawn(seat.conversation(), self);
        }
        seat.mark_cancelled();
        seat.withdrawn.cancel();
        Left::StoppedWaiting
    }

    /// `conversation` ended or cancelled the call's task (`why`): its callers stop waiting, with `CANCELLED`.
    /// The call is cancelled when no caller of another conversation is left waiting for it; otherwise it goes on,
    /// and `conversation` sees it finish `CANCELLED` now (if it is its own call). Returns whether this ended the
    /// call, or stopped it for `conversation`.
    pub(crate) fn withdraw(&self, conversation: &ConversationId, why: &str) -> bool {
        // Under the step lock, as an end: a call that already has its outcome keeps it for every caller.
        let mut step = self.lock_for_end();
        if self.outcome.is_set() {
            return false;
        }
        // A retry of `conversation` that joined the call and already left it: the call is not its to end.
        let own = self.coords.conversation == *conversation;
        let withdrawal = self.callers.withdraw(conversation, why, Some(own));
        let stopped = if withdrawal.ends {
            let ended = self.end_under(&mut step, Err(self.cancelled(why)));
            if let (true, Some((group, _))) = (ended, &withdrawal.group) {
                self.callers.ended_by(*group);
            }
            ended
        } else {
            // It goes on without `conversation`, which sees it finish now. Still under the step lock: the
            // conversation's `CallFinished` says what its callers read.
            let stopped = self.hub.call_withdrawn(conversation, self);
            // A `rejoin` that raced this (it still found the call in flight) joined a new group: withdrawn too.
            self.callers.withdraw(conversation, why, None).tell();
            stopped
        };
        // Only now are its callers told: what they read is recorded.
        withdrawal.tell();
        drop(step);
        // Wakes the callers that block on the outcome, so that the withdrawn ones see they stopped.
        self.outcome.nudge();
        stopped || withdrawal.had_callers()
    }

    /// The outcome of the caller of `seat` once it stopped waiting: the call's `CANCELLED` if its withdrawal ended
    /// the call; else `CANCELLED` saying why, and that the call goes on for the other callers of its operation, so
    /// its effect is unknown (`effect_unknown`): it may yet apply, and a retry under a new operation id would apply
    /// it twice.
    pub(crate) fn withdrawn_outcome(&self, seat: Option<&CallerSeat>) -> CallOutcome {
        // Decided at the withdrawal, under the step lock: the same whenever it is read.
        let withdrawn = seat.and_then(|seat| self.callers.why_withdrawn(seat));
        if let Some((why, true)) = &withdrawn {
            // Its own end (set by now, unless it ends as the call's own step returns).
            return self.outcome.get().unwrap_or_else(|| Err(self.cancelled(why).locate(&self.coords)));
        }
        let why = withdrawn.as_ref().map_or(Self::CANCELLED_BY_AGENT, |(why, _)| why.as_str());
        let error = ToolError::with_code(ErrorCode::Cancelled, why);
        Err(effect_unknown(error, "the call goes on for the other callers of its operation").locate(&self.coords))
    }

    /// Ends the call with `outcome` unless it already ended. Commits first, then notifies. Returns whether this
    /// was the call's terminal outcome. From inside the call's own main-thread step (a tool that ends its own
    /// conversation or task there), which holds the step lock, the end is applied as soon as the step returns.
    pub(crate) fn finish(&self, outcome: CallOutcome) -> bool {
        if self.in_own_step() {
            // The first end asked for wins, as with the lock.
            return !self.outcome.is_set()
                && DEFERRED.with(|deferred| {
                    let mut deferred = deferred.borrow_mut();
                    let first = deferred.is_none();
                    deferred.get_or_insert(outcome);
                    first
                });
        }
        let mut step = self.step.lock();
        self.finish_locked(&mut step, outcome)
    }

    /// Whether this thread runs the call's own main-thread step, which holds the step lock.
    fn in_own_step(&self) -> bool {
        IN_STEP.with(Cell::get) == std::ptr::from_ref(self) as usize
    }

    /// The step lock, for a decision that may end the call; `None` inside the call's own step, which holds it.
    fn lock_for_end(&self) -> Option<MutexGuard<'_, Option<ToolError>>> {
        (!self.in_own_step()).then(|| self.step.lock())
    }

    /// Ends the call under the lock [`lock_for_end`](Self::lock_for_end) gave (inside its own step: as soon as
    /// the step returns).
    fn end_under(&self, step: &mut Option<MutexGuard<'_, Option<ToolError>>>, outcome: CallOutcome) -> bool {
        match step.as_mut() {
            Some(step) => self.finish_locked(step, outcome),
            None => self.finish(outcome),
        }
    }

    fn finish_locked(&self, step: &mut MutexGuard<'_, Option<ToolError>>, outcome: CallOutcome) -> bool {
        if self.outcome.is_set() {
            return false;
        }
        let outcome = outcome.map_err(|mut error| {
            for (key, value) in self.details.lock().iter() {
                error.details.extra.entry(key.clone()).or_insert_with(|| value.clone());
            }
            // The revision its last step observed, as a success records it (rule H11): an error after travel
            // says where it was found.
            error.details.revision.get_or_insert(self.observed.lock().revision);
            error.locate(&self.coords)
        });
        **step = Some(match &outcome {
            Ok(_) => ToolError::with_code(
                ErrorCode::Cancelled,
                "the call already finished: its context can no longer reach the world",
            ),
            Err(error) => error.clone(),
        });
        let reason = outcome.as_ref().err().cloned();
        // Commit, then notify: the conversation learns of the outcome before the caller does.
        self.hub.call_finished(self, &outcome);
        self.outcome.set(outcome);
        self.ended.cancel();
        self.send_cleanups(reason);
        true
    }

    fn send_cleanups(&self, reason: Option<ToolError>) {
        let mut cleanups = self.cleanups.lock();
        cleanups.ended = Some(reason.clone());
        let waiting = std::mem::take(&mut cleanups.waiting);
        if !waiting.is_empty() {
            let _ = cleanups.jobs.send(self.cleanup_job(waiting, reason));
        }
    }

    fn cleanup_job(&self, cleanups: Vec<Cleanup>, reason: Option<ToolError>) -> Job {
        Job::Cleanup { visit: self.coords.visit.visit, request: self.coords.request, cleanups, reason }
    }

    /// `CANCELLED` from outside the handler (its callers, its conversation, its task), saying `why`. Once the
    /// handler started, what it did before it stopped stays done, and a retry of its operation gets this outcome
    /// (rule H12): it says the effect is unknown (`effect_unknown` in its details), not "nothing happened". (A
    /// handler's own `CANCELLED` is its own word on what it did.)
    pub(crate) fn cancelled(&self, why: &str) -> ToolError {
        let error = ToolError::with_code(ErrorCode::Cancelled, why);
        match self.handler_started() {
            true => effect_unknown(error, "its handler had started"),
            false => error,
        }
    }

    /// Ends the call with an error built from its coordinates.
    pub(crate) fn fail(&self, code: ErrorCode, message: impl Into<String>) -> bool {
        self.finish(Err(ToolError::with_code(code, message)))
    }

    /// Locks the call for one main-thread step. Returns the guard if the call is live.
    pub(crate) fn begin_step(&self) -> Result<StepGuard<'_>, ToolError> {
        let guard = self.step.lock();
        if let Some(error) = guard.as_ref() {
            return Err(error.clone());
        }
        let outer = IN_STEP.with(|in_step| in_step.replace(std::ptr::from_ref(self) as usize));
        Ok(StepGuard { life: self, guard, outer })
    }

    /// Marks the handler started, unless the call already ended (then `false`: it must not run). Under the step
    /// lock, which `finish` holds too: an end comes either before this (the handler never runs, and a retry of its
    /// operation runs anew) or after (the outcome is the operation's, retained).
    pub(crate) fn begin_handler(&self) -> bool {
        let step = self.step.lock();
        if step.is_some() {
            return false;
        }
        self.handler_started.store(true, Ordering::Release);
        true
    }

    /// Whether the handler was started (see [`begin_handler`](Self::begin_handler)).
    pub(crate) fn handler_started(&self) -> bool {
        self.handler_started.load(Ordering::Acquire)
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    pub(crate) fn ended_token(&self) -> &CancellationToken {
        &self.ended
    }

    /// Why the call ended (`CANCELLED` if it has not recorded a reason).
    pub(crate) fn end_error(&self) -> ToolError {
        self.step.lock().clone().unwrap_or_else(|| {
            ToolError::with_code(ErrorCode::Cancelled, "the call was cancelled").locate(&self.coords)
        })
    }

    pub(crate) fn outcome(&self) -> &OnceSignal<CallOutcome> {
        &self.outcome
    }

    pub(crate) fn set_detail(&self, key: String, value: serde_json::Value) {
        self.details.lock().insert(key, value);
    }

    pub(crate) fn observed(&self) -> VisitInfo {
        VisitInfo { location: self.observed.lock().clone(), ..self.coords.visit.clone() }
    }
}

/// One main-thread step of a live call. While it is held, the call cannot end.
pub(crate) struct StepGuard<'a> {
    life: &'a CallLife,
    guard: MutexGuard<'a, Option<ToolError>>,
    /// The step this thread ran before this one (none: steps do not nest), restored at the end.
    outer: usize,
}

crate::sync::thread_local! {
    /// The call whose main-thread step this thread runs (its address; 0 for none).
    static IN_STEP: Cell<usize> = const { Cell::new(0) };
    /// An end of that call asked for from inside its step, applied when the step returns.
    static DEFERRED: RefCell<Option<CallOutcome>> = const { RefCell::new(None) };
}

impl Drop for StepGuard<'_> {
    fn drop(&mut self) {
        IN_STEP.with(|in_step| in_step.set(self.outer));
        if let Some(outcome) = DEFERRED.with(RefCell::take) {
            self.life.finish_locked(&mut self.guard, outcome);
        }
    }
}

impl StepGuard<'_> {
    pub(crate) fn observe(&self, location: &Location) {
        *self.life.observed.lock() = location.clone();
    }

    /// Ends the call from inside its step (e.g. a failed recheck, a panicking closure).
    pub(crate) fn finish(mut self, error: ToolError) {
        // An end asked for during the step came first.
        let outcome = DEFERRED.with(RefCell::take).unwrap_or(Err(error));
        self.life.finish_locked(&mut self.guard, outcome);
    }
}

/// What a caller's [`CallLife::leave`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Left {
    /// It cancelled the call: no other caller was waiting for it.
    EndedIt,
    /// The call goes on for other callers (or this one only stopped observing it): a caller that cancelled reads
    /// `CANCELLED` from now on.
    StoppedWaiting,
    /// The call had already ended: the caller reads its outcome.
    AlreadyEnded,
}

/// `error` (a `CANCELLED`), saying the call's effect is unknown because of `why` (`effect_unknown` in its details):
/// an agent inspects the game before it retries, rather than take it for "nothing happened".
fn effect_unknown(mut error: ToolError, why: &str) -> ToolError {
    error.message.push_str(&format!("; {why}, so its effect is unknown: inspect the game's state before retrying"));
    error.details.extra.insert("effect_unknown".into(), serde_json::Value::Bool(true));
    error
}
