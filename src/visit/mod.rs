//! Visits: the main-thread side of the host. Applies enter, travel and exit in order, keeps the one session of
//! the open visit, and calls the game's [`WorldLifecycle`] at the right moments (rules H1–H5).

mod access;
mod binding;
mod follow;
mod messages;
mod transitions;

use std::sync::Arc;

use bevy::prelude::*;
use crossbeam_channel::Receiver;

pub use access::{VisitSession, VisitSessionExt};
pub use binding::WorldBinding;
pub(crate) use follow::{follow_state, StateTarget};
pub use messages::{
    EnterWorld, ExitWorld, TravelTo, VisitClosed, VisitClosing, VisitLoadFailed, VisitOpened, VisitRelocated,
    VisitSaved, WorldOpenFailed,
};
pub(crate) use transitions::{
    apply_followed_transitions, apply_transitions, collect_transitions, PendingTransitions, Transition,
};

use crate::call::Job;
use crate::completion::Completion;
use crate::host::HostShared;
use crate::ids::DimensionId;
use crate::lifecycle::{VisitInfo, WorldLifecycle};

/// The open visit's session, owned by the main thread.
pub(crate) struct OpenSession<S> {
    pub info: VisitInfo,
    pub session: S,
    /// The app's [`WorldStore`](crate::persist::WorldStore) when the visit opened, if it has one: it keeps the world
    /// until the visit has closed.
    pub store: Option<crate::persist::WorldStore>,
}

/// The main thread's view of visits for lifecycle `L`: the session, the job queue, outstanding completions.
#[derive(Resource)]
pub(crate) struct VisitSlot<L: WorldLifecycle> {
    pub lifecycle: Arc<L>,
    pub host: Arc<HostShared>,
    pub open: Option<OpenSession<L::Session>>,
    pub jobs: Receiver<Job>,
    /// `every_frame` steps that were not done: they run again at the start of the next frame's pump.
    /// (In a mutex only so that the resource is `Sync`; the main thread alone touches it, through `get_mut`.)
    pub next_frame: parking_lot::Mutex<Vec<Job>>,
    pub default_dimension: DimensionId,
    /// Close completions not yet resolved, waited for on `AppExit`.
    pub closing: Vec<(VisitInfo, Completion)>,
    /// The open visit's readiness while its session loads: a failure is reported once ([`VisitLoadFailed`]).
    pub loading: Option<(VisitInfo, Completion)>,
    pub shut_down: bool,
    /// Built by the [`testing`](crate::testing) harness: a test that ends with a world open loses nothing.
    pub test_app: bool,
}

impl<L: WorldLifecycle> Drop for VisitSlot<L> {
    /// An app that ends without the plugin's exit (`ScheduleRunnerPlugin::run_once`, a loop of the game's own that
    /// stops calling `update`, an `AppExit` written after the frame's last systems and not followed by
    /// [`run_pending_exit`](crate::run_pending_exit), a panic that unwinds the app) drops the open world unsaved:
    /// said, as nothing else would show it.
    fn drop(&mut self) {
        let Some(open) = self.open.as_ref().filter(|_| !self.shut_down && !self.test_app) else { return };
        let (world, visit) = (&open.info.world, open.info.visit);
        if std::thread::panicking() {
            tracing::error!(%world, %visit, "the app unwound from a panic while a world was open: it was not saved");
        } else {
            tracing::error!(
                %world,
                %visit,
                "the app ended while a world was open without the plugin's exit (no AppExit, or one written after \
                 the frame's last systems): its `close` never ran and it was not saved (end the game by writing \
                 AppExit in a system, or call bevy_agent_tools::run_pending_exit after writing it elsewhere)"
            );
        }
    }
}
