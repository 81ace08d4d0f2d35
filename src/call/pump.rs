//! The main-thread pump: runs queued `on_client` steps in FIFO order within a per-frame time budget, each
//! rechecked right before it runs (rule H8).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use bevy::prelude::*;

use super::{CallLife, InputContext, Job};
use crate::error::{ErrorCode, ToolError};
use crate::lifecycle::WorldLifecycle;
use crate::panic::panic_message;
use crate::tool::ToolScope;
use crate::visit::{OpenSession, VisitSlot};

/// What the pump did in the last frame. Read it for a HUD or a test.
#[derive(Resource, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PumpStats {
    /// Steps taken off the queue in the last frame (run or rejected).
    pub last_frame: usize,
    /// Steps left for later frames when the last frame's budget ran out.
    pub left_queued: usize,
    /// Steps taken off the queue since the app started.
    pub total: u64,
    /// How long the pump ran in the last frame (the budget is checked against this after every step).
    pub last_frame_time: Duration,
}

/// Runs queued steps until the queue is empty or the budget is spent. At least one step runs per frame, so a
/// zero budget still makes progress; steps that do not fit wait for the next frame, in order.
pub(crate) fn run_jobs<L: WorldLifecycle>(world: &mut World) {
    let started = Instant::now();
    let (taken, left_queued) = world.resource_scope(|world, mut slot: Mut<VisitSlot<L>>| {
        let budget = slot.host.config.pump_budget;
        let mut taken = 0;
        while taken == 0 || started.elapsed() < budget {
            let Ok(job) = slot.jobs.try_recv() else { break };
            taken += 1;
            slot.run(world, job);
        }
        (taken, slot.jobs.len())
    });
    let elapsed = started.elapsed();
    let mut stats = world.resource_mut::<PumpStats>();
    stats.last_frame_time = elapsed;
    stats.last_frame = taken;
    stats.left_queued = left_queued;
    stats.total += taken as u64;
}

impl<L: WorldLifecycle> VisitSlot<L> {
    fn run(&mut self, world: &mut World, job: Job) {
        match job {
            Job::Call { life, run } => {
                // The call cannot end while `step` is held: check and run are one step.
                let Ok(step) = life.begin_step() else { return };
                let open = match recheck(&life, self.open.as_mut()) {
                    Ok(open) => open,
                    Err(error) => return step.finish(error),
                };
                step.observe(&open.info.location);
                match catch_unwind(AssertUnwindSafe(|| run(world, &mut open.session))) {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => step.finish(error),
                    Err(panic) => {
                        let message = panic_message(&*panic);
                        tracing::error!(request = %life.coords.request, tool = %life.coords.tool, %message, "an on_client step panicked");
                        step.finish(ToolError::internal(format!("the tool's main-thread step panicked: {message}")));
                    }
                }
            }
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

/// The checks of rule H8 that depend on the main thread's view: deadline, visit, location revision.
fn recheck<'a, S>(life: &CallLife, open: Option<&'a mut OpenSession<S>>) -> Result<&'a mut OpenSession<S>, ToolError> {
    if Instant::now() >= life.deadline {
        return Err(ToolError::with_code(
            ErrorCode::Timeout,
            "the call timed out before its main-thread step ran; the step did not run",
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
