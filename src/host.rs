//! The state the host shares between the main thread and agent threads: admission, the open visit's live calls,
//! the tool registry, the queue of main-thread jobs, and the runtime handlers run on.
//!
//! Only the main thread changes the visit (enter, travel, exit); agent threads only read it to admit calls.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::sync::Mutex;
use crossbeam_channel::Receiver;

use crate::call::{CallLife, CallOutcome, Job, JobSender};
use crate::completion::Completion;
use crate::conversation::{ConversationEvent, ConversationHub};
use crate::ids::{ConversationId, RequestId, TaskId, VisitId};
use crate::lifecycle::VisitInfo;
use crate::replay::{ReplayRetention, ReplayTable};
use crate::tool::{ErasedTool, ToolRegistry};

/// Where the open visit is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VisitPhase {
    /// `open` returned a session that is still loading: calls are admitted and wait for it.
    Loading,
    /// Calls are admitted and run.
    Open,
    /// The session that was loading failed to load ([`VisitLoadFailed`](crate::VisitLoadFailed)): calls get
    /// `INTERNAL` saying why, until the game exits the world (which it usually should, telling the player).
    LoadFailed,
    /// Exit began: admission is closed (`WORLD_CLOSED`) and `close` is running.
    Closing,
}

/// What an observer may know about the current visit.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VisitStatus {
    /// The visit and its current location.
    pub info: VisitInfo,
    /// Where it is in its life.
    pub phase: VisitPhase,
}

pub(crate) struct OpenVisit {
    pub info: VisitInfo,
    /// The session's readiness, when it loads asynchronously.
    pub ready: Option<Completion>,
    pub closing: bool,
    /// Cancelled as the visit's exit begins (with `closing`), for what waits on the visit outside a call.
    pub exiting: tokio_util::sync::CancellationToken,
    pub calls: LiveCalls,
    /// Keyed operations of this visit (rule H12); it ends with the visit.
    pub replay: ReplayTable<Arc<CallLife>, (RequestId, CallOutcome)>,
}

/// The calls of a visit that have not reached their outcome, with a count per conversation kept in step so that
/// admission checks the in-flight limit in constant time.
#[derive(Default)]
pub(crate) struct LiveCalls {
    by_request: HashMap<RequestId, Arc<CallLife>>,
    per_conversation: HashMap<ConversationId, usize>,
}

impl LiveCalls {
    pub(crate) fn insert(&mut self, life: Arc<CallLife>) {
        *self.per_conversation.entry(life.coords.conversation.clone()).or_default() += 1;
        if let Some(replaced) = self.by_request.insert(life.coords.request, life) {
            // Request ids are unique per host, so this does not happen; keep the counts right regardless.
            self.uncount(&replaced.coords.conversation);
        }
    }

    pub(crate) fn remove(&mut self, request: &RequestId) -> Option<Arc<CallLife>> {
        let life = self.by_request.remove(request)?;
        self.uncount(&life.coords.conversation);
        Some(life)
    }

    /// Removes and returns the calls `take` selects.
    pub(crate) fn remove_where(&mut self, mut take: impl FnMut(&CallLife) -> bool) -> Vec<Arc<CallLife>> {
        let selected: Vec<RequestId> =
            self.by_request.iter().filter(|(_, life)| take(life)).map(|(request, _)| *request).collect();
        selected.iter().filter_map(|request| self.remove(request)).collect()
    }

    /// Removes and returns every call.
    pub(crate) fn take_all(&mut self) -> Vec<Arc<CallLife>> {
        self.per_conversation.clear();
        self.by_request.drain().map(|(_, life)| life).collect()
    }

    /// The calls, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<CallLife>> {
        self.by_request.values()
    }

    /// How many calls `conversation` has here (a call stays a moment after its outcome, until it is forgotten).
    pub(crate) fn in_flight(&self, conversation: &ConversationId) -> usize {
        self.per_conversation.get(conversation).copied().unwrap_or(0)
    }

    /// How many calls `conversation` has without an outcome, if at least `limit`: a call whose outcome its caller
    /// already has never counts (its caller may call again at once), nor one it stopped waiting for that goes on
    /// for another conversation's retry of its operation. Counted one by one only at the limit.
    pub(crate) fn at_limit(&self, conversation: &ConversationId, limit: usize) -> Option<usize> {
        if self.in_flight(conversation) < limit {
            return None;
        }
        let unfinished = self
            .by_request
            .values()
            .filter(|life| {
                &life.coords.conversation == conversation
                    && !life.outcome().is_set()
                    && life.counts_for_its_conversation()
            })
            .count();
        (unfinished >= limit).then_some(unfinished)
    }

    fn uncount(&mut self, conversation: &ConversationId) {
        if let Some(count) = self.per_conversation.get_mut(conversation) {
            *count -= 1;
            if *count == 0 {
                self.per_conversation.remove(conversation);
            }
        }
    }
}

impl OpenVisit {
    pub(crate) fn phase(&self) -> VisitPhase {
        if self.closing {
            VisitPhase::Closing
        } else {
            match self.ready.as_ref().map(Completion::result) {
                Some(None) => VisitPhase::Loading,
                Some(Some(Err(_))) => VisitPhase::LoadFailed,
                None | Some(Some(Ok(()))) => VisitPhase::Open,
            }
        }
    }
}

#[derive(Default)]
pub(crate) struct HostState {
    /// `None` between visits.
    pub visit: Option<OpenVisit>,
    last_visit: u64,
}

impl HostState {
    pub(crate) fn next_visit_id(&mut self) -> VisitId {
        self.last_visit += 1;
        VisitId(self.last_visit)
    }
}

/// Host settings, fixed when the plugin is built.
#[derive(Clone, Debug)]
pub(crate) struct HostConfig {
    pub default_timeout: Duration,
    pub pump_budget: Duration,
    pub replay: ReplayRetention,
    /// Calls one conversation may have in flight at once (`BUSY` beyond).
    pub max_in_flight: usize,
    /// How long a call for a tool that is not registered waits for it, even when no visit is loading.
    pub tool_wait: Option<Duration>,
    /// A conversation with no calls and no activity for this long ends.
    pub idle_timeout: Option<Duration>,
}

pub(crate) struct HostShared {
    pub state: Mutex<HostState>,
    pub tools: ToolRegistry,
    pub jobs: JobSender,
    pub runtime: tokio::runtime::Handle,
    pub config: HostConfig,
    /// The conversations, their status and events.
    pub conversations: Arc<ConversationHub>,
    /// Wakes calls waiting for their tool when one is registered, and when a visit opens (a call made with no world
    /// open waits for one too).
    pub tool_or_visit_came: tokio::sync::Notify,
    /// Counts changes of the tool list after start-up (registrations, removals): transports tell their clients the
    /// list changed.
    pub tools_changed: tokio::sync::watch::Sender<u64>,
    /// The calls made in the open visit that wait for their tool: its exit ends them.
    pub waiting_calls: crate::conversation::WaitingCalls,
    /// The lifecycle's session type: registered tools must be for it.
    pub session_type: (std::any::TypeId, &'static str),
    /// Counts frames (pump runs): `CallContext::next_frame` waits for it to move.
    pub frames: tokio::sync::watch::Sender<u64>,
    /// The calls' drivers still running, their handlers with them: the exit lets them finish (rule H10).
    pub running: Arc<crate::call::RunningHandlers>,
    next_request: AtomicU64,
}

impl HostShared {
    /// The shared state, the main thread's end of the job queue, and the feed of conversation events for the
    /// game's messages.
    pub(crate) fn new(
        runtime: tokio::runtime::Handle,
        config: HostConfig,
        session_type: (std::any::TypeId, &'static str),
    ) -> (Arc<Self>, Receiver<Job>, Receiver<ConversationEvent>) {
        let (jobs, queue) = crossbeam_channel::unbounded();
        let jobs = JobSender::new(jobs);
        let (conversations, feed) = ConversationHub::new(config.idle_timeout, jobs.clone());
        let host = Self {
            state: Mutex::new(HostState::default()),
            tools: ToolRegistry::default(),
            jobs,
            runtime,
            config,
            conversations: Arc::new(conversations),
            tool_or_visit_came: tokio::sync::Notify::new(),
            tools_changed: tokio::sync::watch::Sender::new(0),
            waiting_calls: Default::default(),
            session_type,
            frames: tokio::sync::watch::Sender::new(0),
            running: Arc::default(),
            next_request: AtomicU64::new(1),
        };
        (Arc::new(host), queue, feed)
    }

    /// Registers a tool (replacing one of the same name) and wakes the calls waiting for a tool. Refuses a tool
    /// for another session type than the lifecycle's.
    pub(crate) fn register_tool(&self, tool: Arc<dyn ErasedTool>) -> Result<(), String> {
        let (wanted, wanted_name) = self.session_type;
        let (given, given_name) = tool.session_type();
        if wanted != given {
            return Err(format!(
                "agent tool `{}` is for sessions of type {given_name}, but the lifecycle's session is {wanted_name}",
                tool.info().name
            ));
        }
        crate::tool::check_name(tool.info())?;
        if let Some(mistake) = tool.mistake() {
            return Err(mistake);
        }
        crate::tool::check_arguments(tool.info())?;
        self.tools.insert(tool);
        self.tool_or_visit_came.notify_waiters();
        self.tools_changed.send_modify(|registered| *registered += 1);
        Ok(())
    }

    /// Removes tool `name` (see [`AgentHandle::unregister_tool`](crate::AgentHandle::unregister_tool)).
    pub(crate) fn unregister_tool(&self, name: &str) -> bool {
        let removed = self.tools.remove(name);
        if removed {
            self.tools_changed.send_modify(|changes| *changes += 1);
        }
        removed
    }

    pub(crate) fn next_request_id(&self) -> RequestId {
        RequestId(self.next_request.fetch_add(1, Ordering::Relaxed))
    }

    pub(crate) fn status(&self) -> Option<VisitStatus> {
        let state = self.state.lock();
        state.visit.as_ref().map(|visit| VisitStatus { info: visit.info.clone(), phase: visit.phase() })
    }

    /// How many calls `conversation` has in flight in the open visit (for the race tests).
    #[cfg(all(test, feature = "shuttle"))]
    pub(crate) fn in_flight(&self, conversation: &ConversationId) -> usize {
        let state = self.state.lock();
        state.visit.as_ref().map_or(0, |open| open.calls.in_flight(conversation))
    }

    /// Whether `conversation`'s next call would get `BUSY`.
    pub(crate) fn is_busy(&self, conversation: &ConversationId) -> bool {
        let state = self.state.lock();
        let open = state.visit.as_ref();
        open.is_some_and(|open| open.calls.at_limit(conversation, self.config.max_in_flight).is_some())
    }

    /// Forgets a call that reached its outcome, and retains that outcome for its operation key (if it has one
    /// and its handler started; a call that never ran leaves no trace, so a retry can run).
    pub(crate) fn release_call(&self, life: &CallLife) {
        // Counted before the lock: an outcome can be large.
        let retained = life.coords.replay_key.as_ref().filter(|_| life.handler_started());
        let retained = retained.and_then(|_| life.outcome().get()).map(|outcome| {
            let bytes = crate::replay::retained_bytes(&outcome);
            (outcome, bytes)
        });
        let mut state = self.state.lock();
        let Some(open) = state.visit.as_mut().filter(|open| open.info.visit == life.coords.visit.visit) else {
            return;
        };
        open.calls.remove(&life.coords.request);
        if let Some(key) = &life.coords.replay_key {
            match retained {
                Some((outcome, bytes)) => {
                    let own = |running: &Arc<CallLife>| std::ptr::eq(&**running, life);
                    open.replay.complete_own(key, own, (life.coords.request, outcome), bytes, std::time::Instant::now())
                }
                None => open.replay.forget(key, |running| std::ptr::eq(&**running, life)),
            }
        }
    }

    /// The first step of an exit: closes admission (`WORLD_CLOSED` from now on) and takes every call of the visit,
    /// for the caller to end. A call admitted before this is among them; one that finishes meanwhile is not.
    pub(crate) fn begin_exit(&self) -> Vec<Arc<CallLife>> {
        let mut state = self.state.lock();
        match state.visit.as_mut() {
            Some(visit) => {
                visit.closing = true;
                visit.exiting.cancel();
                visit.calls.take_all()
            }
            None => Vec::new(),
        }
    }

    /// Ends the live calls of one task of one conversation with `CANCELLED`: its own, those still waiting for
    /// their tool, and the executions its retries joined. An execution a caller of another conversation (same
    /// task) still waits for goes on for it (rule H12); only this conversation stops waiting. Returns how many calls ended for this conversation.
    pub(crate) fn cancel_task(&self, conversation: &ConversationId, task: &TaskId) -> usize {
        self.cancel_calls(conversation, Some(task), "the agent cancelled the task")
    }

    /// Ends the live calls of `conversation` (of one `task` of it, or all) with `CANCELLED`, saying `why`, as
    /// [`cancel_task`](Self::cancel_task) does, and its calls still waiting for their tool. Returns how many calls
    /// ended for this conversation.
    pub(crate) fn cancel_calls(&self, conversation: &ConversationId, task: Option<&TaskId>, why: &str) -> usize {
        // Calls still waiting for their tool first: one admitted from now on leaves its execution at once.
        let waiting = self.conversations.cancel_pending(conversation, task, why);
        let lives: Vec<Arc<CallLife>> = {
            let state = self.state.lock();
            let Some(open) = state.visit.as_ref() else { return waiting };
            open.calls
                .iter()
                .filter(|life| task.is_none_or(|task| &life.coords.task == task))
                .filter(|life| self.conversations.live_call(conversation, life.coords.request).is_some())
                .cloned()
                .collect()
        };
        lives.iter().filter(|life| life.withdraw(conversation, why)).count() + waiting
    }
}

/// A host with world `alpha`'s visit 1 open in the overworld (revision 0), no tools, and conversation `agent`
/// open, for unit tests of what reads the host's state; the main thread's ends of its jobs and its conversation
/// events; and the runtime its handle is of (not running: drivers spawned on it wait, and go when it is dropped).
#[cfg(test)]
pub(crate) fn test_host(
    idle_timeout: Option<Duration>,
) -> (Arc<HostShared>, Receiver<Job>, Receiver<ConversationEvent>, tokio::runtime::Runtime) {
    use crate::ids::{DimensionId, LocationRevision, VisitId, WorldId};
    use crate::lifecycle::Location;
    use crate::replay::{ReplayRetention, ReplayTable};

    let config = HostConfig {
        default_timeout: Duration::from_secs(600),
        pump_budget: Duration::from_millis(1),
        replay: ReplayRetention::default(),
        max_in_flight: 32,
        tool_wait: None,
        idle_timeout,
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    let (host, jobs, feed) = HostShared::new(runtime.handle().clone(), config, (std::any::TypeId::of::<()>(), "()"));
    let overworld = Location { dimension: DimensionId::new("overworld"), revision: LocationRevision(0) };
    host.state.lock().visit = Some(OpenVisit {
        info: VisitInfo { visit: VisitId(1), world: WorldId::new("alpha"), location: overworld },
        ready: None,
        closing: false,
        exiting: Default::default(),
        calls: Default::default(),
        replay: ReplayTable::new(ReplayRetention::default()),
    });
    host.conversations.open(&ConversationId::new("agent"));
    (host, jobs, feed, runtime)
}
