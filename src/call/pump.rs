//! The main-thread pump: runs queued `on_client` steps in FIFO order within a per-frame time budget, each
//! rechecked right before it runs (rule H8). A frame has one step point, [`AgentToolsSystems::Pump`], and, when the
//! app's runner waits between frames ([`AgentToolsRunnerPlugin`]), a second one in that wait; both take from the
//! same queue and share the frame's budget.
//!
//! [`AgentToolsSystems::Pump`]: crate::AgentToolsSystems::Pump
//! [`AgentToolsRunnerPlugin`]: crate::AgentToolsRunnerPlugin

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use bevy::ecs::schedule::ScheduleLabel;
use bevy::prelude::*;
use crossbeam_channel::Receiver;

use super::{CallLife, InputContext, Job};
use crate::error::{ErrorCode, ToolError};
use crate::lifecycle::WorldLifecycle;
use crate::panic::panic_message;
use crate::tool::ToolScope;
use crate::visit::{OpenSession, VisitSlot};

/// What the pump did in the last frame, at all of the frame's step points (the frame's
/// [`Pump`](crate::AgentToolsSystems::Pump) and, under a runner that serves steps between frames, the wait after it).
/// Read it for a HUD or a test.
#[derive(Resource, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PumpStats {
    /// Steps taken off the queue in the last frame (run or rejected).
    pub last_frame: usize,
    /// Steps left for later frames when the last frame's budget ran out.
    pub left_queued: usize,
    /// Steps taken off the queue since the app started.
    pub total: u64,
    /// How long the pump ran in the last frame, all its points together (the budget is checked against this
    /// after every step).
    pub last_frame_time: Duration,
}

impl PumpStats {
    /// Starts a frame's figures (the frame's own step point runs first).
    fn new_frame(&mut self) {
        self.last_frame = 0;
        self.last_frame_time = Duration::ZERO;
    }

    /// Adds one step point's work to the frame's figures.
    fn add(&mut self, elapsed: Duration, taken: usize, left_queued: usize) {
        self.last_frame_time += elapsed;
        self.last_frame += taken;
        self.left_queued = left_queued;
        self.total += taken as u64;
    }
}

/// The pump-only schedule the between-frames step point runs: [`run_jobs_between_frames`], nothing else.
#[derive(ScheduleLabel, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BetweenFrames;

/// The frame's step budget, shared by its step points, and what the between-frames wait watches.
#[derive(Resource)]
pub(crate) struct PumpWindow {
    /// Time spent on steps since this frame's `Pump` opened the window.
    pub spent: Duration,
    pub budget: Duration,
    /// Whether steps may run between frames at all ([`StepPoints`](crate::StepPoints)).
    pub between_frames: bool,
    /// An `every_frame` step was met between frames: it waits for the frame's pump, and so does every step
    /// queued after it (FIFO), until the next frame opens a new window.
    pub held: bool,
    /// The step queue (a second receiver: waiting on it takes nothing).
    pub queue: Receiver<Job>,
}

impl PumpWindow {
    /// Whether the between-frames point may run a step now: it is on, and the frame's budget is not spent.
    pub fn may_run(&self) -> bool {
        self.between_frames && !self.held && self.spent < self.budget
    }
}

/// The frame's step point: runs queued steps until the queue is empty or the budget is spent. At least one queued
/// step runs per frame, whatever the `every_frame` steps spent, so a zero budget (or a costly repeating step)
/// still lets the queue make progress; steps that do not fit wait, in order.
///
/// It opens the frame's budget window: time spent between the previous frame and this one does not count here.
/// The `every_frame` steps of the previous frame run first, each once; one that is not done waits for the next
/// frame, so none runs twice in a frame. The frame count `next_frame` waits on moves before any step runs.
pub(crate) fn run_jobs<L: WorldLifecycle>(world: &mut World) {
    let started = Instant::now();
    let (taken, left_queued) = world.resource_scope(|world, mut slot: Mut<VisitSlot<L>>| {
        slot.host.frames.send_modify(|frame| *frame += 1);
        let budget = slot.host.config.pump_budget;
        let mut taken = 0;
        let mut from_queue = 0;
        let mut again = std::mem::take(slot.next_frame.get_mut()).into_iter();
        for job in again.by_ref() {
            taken += 1;
            slot.run(world, job);
            if started.elapsed() >= budget {
                break;
            }
        }
        // Those the budget left out keep their turn, ahead of the steps that were due next frame anyway.
        let late: Vec<Job> = again.collect();
        if !late.is_empty() {
            let due = std::mem::replace(slot.next_frame.get_mut(), late);
            slot.next_frame.get_mut().extend(due);
        }
        while from_queue == 0 || started.elapsed() < budget {
            let Ok(job) = slot.jobs.try_recv() else { break };
            taken += 1;
            from_queue += 1;
            slot.run(world, job);
        }
        // `every_frame` steps that are not done need the next frame: a loop that sleeps between events must run it.
        if !slot.next_frame.get_mut().is_empty() {
            slot.host.jobs.wake();
        }
        (taken, slot.jobs.len() + slot.next_frame.get_mut().len())
    });
    let elapsed = started.elapsed();
    let mut window = world.resource_mut::<PumpWindow>();
    window.spent = elapsed;
    window.held = false;
    let mut stats = world.resource_mut::<PumpStats>();
    stats.new_frame();
    stats.add(elapsed, taken, left_queued);
}

/// The between-frames step point: runs queued steps, in order, while the frame's budget has time left (no step
/// is guaranteed here: the frame's own point guarantees one).
///
/// `every_frame` steps run only in the frame's pump, so that a game counting frames (`FrameCount`, which moves in
/// `Last`) never sees two runs in one: the first one met here is moved, unrun, to the front of the next frame's
/// pump, and the steps queued after it wait for that pump too, keeping their order.
pub(crate) fn run_jobs_between_frames<L: WorldLifecycle>(world: &mut World) {
    let started = Instant::now();
    let (spent, budget) = {
        let window = world.resource::<PumpWindow>();
        if !window.may_run() {
            return;
        }
        (window.spent, window.budget)
    };
    let (taken, left_queued, held) = world.resource_scope(|world, mut slot: Mut<VisitSlot<L>>| {
        let (mut taken, mut held) = (0, false);
        while spent + started.elapsed() < budget {
            let Ok(job) = slot.jobs.try_recv() else { break };
            if matches!(job, Job::EveryFrame { .. }) {
                slot.next_frame.get_mut().push(job);
                held = true;
                break;
            }
            taken += 1;
            slot.run(world, job);
        }
        (taken, slot.jobs.len() + slot.next_frame.get_mut().len(), held)
    });
    let elapsed = started.elapsed();
    let mut window = world.resource_mut::<PumpWindow>();
    window.spent = spent + elapsed;
    window.held |= held;
    world.resource_mut::<PumpStats>().add(elapsed, taken, left_queued);
}

impl<L: WorldLifecycle> VisitSlot<L> {
    fn run(&mut self, world: &mut World, job: Job) {
        match job {
            Job::Call { life, run } => {
                step(&life, self.open.as_mut(), "on_client", |open| run(world, &mut open.session));
            }
            Job::EveryFrame { life, mut run } => {
                let done = step(&life, self.open.as_mut(), "every_frame", |open| run(world, &mut open.session));
                if done == Some(false) {
                    self.next_frame.get_mut().push(Job::EveryFrame { life, run });
                }
            }
            Job::Cleanup { visit, request, cleanups, reason } => match self.open.as_mut() {
                Some(open) if open.info.visit == visit => {
                    run_cleanups(world, &mut open.session, request, cleanups, reason)
                }
                _ => tracing::debug!(%request, "a call's on_end cleanup was dropped: its visit had closed"),
            },
            // Nobody waits for the observation any more (the in-game session sent its text without one): the game
            // is not asked for it.
            Job::InputContext { reply, .. } if reply.is_closed() => {}
            Job::InputContext { visit, reply } => {
                let answer = match self.open.as_ref().filter(|open| open.info.visit == visit) {
                    Some(open) => {
                        let lifecycle = self.lifecycle.clone();
                        catch_unwind(AssertUnwindSafe(|| lifecycle.input_context(&open.session, world)))
                            .map(|observation| InputContext { observed: open.info.clone(), observation })
                            .map_err(|panic| {
                                ToolError::internal(format!("input_context panicked: {}", panic_message(&*panic)))
                            })
                    }
                    None => Err(ToolError::with_code(
                        ErrorCode::VisitEnded,
                        "the visit ended before the input was observed",
                    )),
                };
                let _ = reply.send(answer);
            }
        }
    }
}

/// One main-thread step of a call (rule H8): begun, so that the call cannot end while it runs; rechecked;
/// the location it observes recorded; then run, a panic caught. `Some` with what the step returned when it ran
/// and succeeded (the step is over by then); `None` when the call has its outcome (a refusal, the step's error or
/// its panic) or had ended already.
pub(crate) fn step<S, T>(
    life: &CallLife,
    open: Option<&mut OpenSession<S>>,
    kind: &str,
    run: impl FnOnce(&mut OpenSession<S>) -> Result<T, ToolError>,
) -> Option<T> {
    let step = life.begin_step().ok()?;
    let open = match recheck(life, open) {
        Ok(open) => open,
        Err(error) => {
            step.finish(error);
            return None;
        }
    };
    step.observe(&open.info.location);
    match catch_unwind(AssertUnwindSafe(|| run(open))) {
        Ok(Ok(value)) => Some(value),
        Ok(Err(error)) => {
            step.finish(error);
            None
        }
        Err(panic) => {
            let message = panic_message(&*panic);
            tracing::error!(request = %life.coords.request, tool = %life.coords.tool, %message, "an {kind} step panicked");
            step.finish(ToolError::internal(format!("the tool's main-thread step panicked: {message}")));
            None
        }
    }
}

/// Runs a call's `on_end` cleanups, each caught if it panics.
pub(crate) fn run_cleanups(
    world: &mut World,
    session: &mut dyn std::any::Any,
    request: crate::ids::RequestId,
    cleanups: Vec<super::Cleanup>,
    reason: Option<ToolError>,
) {
    for cleanup in cleanups {
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| cleanup(world, &mut *session, reason.as_ref()))) {
            tracing::error!(%request, message = %panic_message(&*panic), "a call's on_end cleanup panicked");
        }
    }
}

/// The checks of rule H8 that depend on the main thread's view: deadline, visit, location revision.
fn recheck<'a, S>(life: &CallLife, open: Option<&'a mut OpenSession<S>>) -> Result<&'a mut OpenSession<S>, ToolError> {
    if Instant::now() >= life.deadline {
        return Err(ToolError::with_code(
            ErrorCode::Timeout,
            // Earlier steps of the call may have run: a retained TIMEOUT says its effect is unknown (rule H12).
            "the call timed out before a main-thread step ran (that step did not run; earlier ones may have): its \
             effect is unknown: inspect the game's state before retrying",
        ));
    }
    let Some(open) = open.filter(|open| open.info.visit == life.coords.visit.visit) else {
        return Err(ToolError::with_code(
            ErrorCode::VisitEnded,
            format!("the call's visit of world `{}` ended before its main-thread step ran", life.coords.visit.world),
        ));
    };
    let admitted = life.coords.visit.location.revision;
    if life.coords.scope == ToolScope::Location && open.info.location.revision != admitted {
        return Err(ToolError::with_code(
            ErrorCode::LocationChanged,
            format!("the player relocated ({admitted} → {}) before the step ran", open.info.location.revision),
        )
        .with_detail("current_revision", open.info.location.revision));
    }
    Ok(open)
}

/// The pump's recheck on its own. Over the host's API it sits behind the call's end: exit and travel end the
/// calls they strand before the pump runs, and the driver's timer ends a call at its deadline. These tests keep
/// the recheck itself honest, so that it still refuses when one of those paths misses a call.
#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::recheck;
    use crate::call::{CallCoordinates, CallLife, JobSender};
    use crate::conversation::ConversationHub;
    use crate::error::ErrorCode;
    use crate::ids::{ConversationId, DimensionId, LocationRevision, RequestId, TaskId, VisitId, WorldId};
    use crate::lifecycle::{Location, VisitInfo};
    use crate::tool::ToolScope;
    use crate::visit::OpenSession;

    fn visit(id: u64, revision: u64) -> VisitInfo {
        VisitInfo {
            visit: VisitId(id),
            world: WorldId::new("alpha"),
            location: Location { dimension: DimensionId::new("overworld"), revision: LocationRevision(revision) },
        }
    }

    fn life(scope: ToolScope, deadline: Instant) -> CallLife {
        let conversation = ConversationId::new("a");
        let coords = CallCoordinates {
            request: RequestId(1),
            tool: "t".into(),
            scope,
            task: TaskId::of_conversation(&conversation),
            conversation,
            operation: None,
            replay_key: None,
            visit: visit(1, 0),
        };
        let (jobs, _queue) = crossbeam_channel::unbounded();
        let jobs = JobSender::new(jobs);
        let (hub, _feed) = ConversationHub::new(None, jobs.clone());
        CallLife::new(coords, Instant::now(), deadline, Arc::new(hub), jobs)
    }

    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn pump_recheck_refuses_a_step_whose_deadline_passed_with_timeout() {
        let mut open = OpenSession { info: visit(1, 0), session: (), store: None };
        let error = recheck(&life(ToolScope::World, Instant::now()), Some(&mut open)).err().expect("refused");
        assert_eq!(error.code, ErrorCode::Timeout);
        assert!(recheck(&life(ToolScope::World, later()), Some(&mut open)).is_ok(), "in time it passes");
    }

    #[test]
    fn pump_recheck_refuses_a_step_of_another_visit_or_of_none_with_visit_ended() {
        let mut other = OpenSession { info: visit(2, 0), session: (), store: None };
        let error = recheck(&life(ToolScope::World, later()), Some(&mut other)).err().expect("refused");
        assert_eq!(error.code, ErrorCode::VisitEnded);
        let error = recheck::<()>(&life(ToolScope::World, later()), None).err().expect("refused");
        assert_eq!(error.code, ErrorCode::VisitEnded);
    }

    #[test]
    fn pump_recheck_refuses_a_location_step_after_a_relocation_but_not_a_world_step() {
        let mut moved = OpenSession { info: visit(1, 1), session: (), store: None };
        let error = recheck(&life(ToolScope::Location, later()), Some(&mut moved)).err().expect("refused");
        assert_eq!(error.code, ErrorCode::LocationChanged);
        assert!(recheck(&life(ToolScope::World, later()), Some(&mut moved)).is_ok(), "World scope survives travel");
    }
}
