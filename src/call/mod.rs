//! Calls: [`CallContext`] (what a handler gets), `on_client` marshaling to the main thread, the main-thread pump
//! with its per-frame budget, and the driver that gives every admitted call exactly one outcome.

mod admission;
mod callers;
mod context;
mod life;
mod progress;
mod pump;
mod queue;
mod running;

use std::any::Any;
use std::sync::Arc;

use bevy::prelude::World;

pub use admission::CallRequest;
pub(crate) use admission::{
    admit, admit_since, game_stopped, load_failed, visit_ended_while_waiting, Admitted, Arrival,
};
pub(crate) use callers::CallerSeat;
pub use context::{CallContext, Ended};
pub(crate) use life::{CallCoordinates, CallLife, Left};
pub use life::{CallOutcome, CallOutput};
pub use progress::{Progress, ProgressSink};
#[cfg(all(test, feature = "shuttle"))]
pub(crate) use pump::step;
pub use pump::PumpStats;
pub(crate) use pump::{run_cleanups, run_jobs, run_jobs_between_frames, BetweenFrames, PumpWindow};
#[cfg(feature = "winit")]
pub(crate) use queue::winit_wake;
pub(crate) use queue::{notice_sleeping_loop, JobSender};
pub(crate) use running::RunningHandlers;

use crate::error::ToolError;
use crate::host::HostShared;
use crate::ids::{RequestId, VisitId};
use crate::lifecycle::VisitInfo;

/// What a handler's context is made of, before it is given its session type.
#[derive(Clone)]
pub(crate) struct CallCore {
    pub life: Arc<CallLife>,
    pub host: Arc<HostShared>,
}

/// A closure bound for the main thread, with what the pump rechecks before running it.
pub(crate) type ClientStep = Box<dyn FnOnce(&mut World, &mut dyn Any) -> Result<(), ToolError> + Send>;

/// A step run once per frame until it says it is done (`Ok(true)`).
pub(crate) type FrameStep = Box<dyn FnMut(&mut World, &mut dyn Any) -> Result<bool, ToolError> + Send>;

/// A main-thread cleanup of a call that ended: the world, the session, and why it ended (`None`: it succeeded).
pub(crate) type Cleanup = Box<dyn FnOnce(&mut World, &mut dyn Any, Option<&ToolError>) + Send>;

/// Work for the main-thread pump.
pub(crate) enum Job {
    /// One `on_client` step of a call.
    Call { life: Arc<CallLife>, run: ClientStep },
    /// An `every_frame` step of a call: after a frame in which it was not done, it runs again next frame.
    EveryFrame { life: Arc<CallLife>, run: FrameStep },
    /// The `on_end` cleanups of a call that ended: they run if its visit is still open, whatever else changed.
    Cleanup { visit: VisitId, request: RequestId, cleanups: Vec<Cleanup>, reason: Option<ToolError> },
    /// Ask the session for an input context (rule H14).
    InputContext { visit: VisitId, reply: tokio::sync::oneshot::Sender<Result<InputContext, ToolError>> },
}

/// An observation taken for one input (rule H14).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InputContext {
    /// The visit and location it was taken in.
    pub observed: VisitInfo,
    /// What `WorldLifecycle::input_context` returned for this input; `None` means there is none.
    pub observation: Option<serde_json::Value>,
}
