//! [`WorldLifecycle`]: the one trait a game author implements for their per-visit state, and what the host
//! tells it: [`VisitInfo`], [`Location`], [`Opened`].

use std::fmt;

use bevy::prelude::World;
use serde::{Deserialize, Serialize};

use crate::completion::Completion;
use crate::ids::{DimensionId, LocationRevision, VisitId, WorldId};

/// Where the player is inside a visit: a dimension, and a revision that increments on every relocation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Location {
    /// The dimension.
    pub dimension: DimensionId,
    /// Increments on every relocation; 0 when the visit opens.
    pub revision: LocationRevision,
}

/// One visit: which world, which visit, and where the player was when this was taken.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct VisitInfo {
    /// The visit: unique for the process lifetime.
    pub visit: VisitId,
    /// The world (save) being visited.
    pub world: WorldId,
    /// The location.
    pub location: Location,
}

/// Why `open` failed. The host logs it, writes a [`WorldOpenFailed`](crate::WorldOpenFailed) message, holds no
/// session, and keeps admission closed (rule H4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenError {
    message: String,
}

impl OpenError {
    /// An error saying what failed.
    pub fn new(message: impl fmt::Display) -> Self {
        Self { message: message.to_string() }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OpenError {}

/// A [`WorldStore`](crate::persist::WorldStore) refusal in `open` (`store.world_dir(&visit.world)?`), as its words.
impl From<crate::persist::StoreError> for OpenError {
    fn from(error: crate::persist::StoreError) -> Self {
        Self::new(error)
    }
}

/// What `open` hands back: a session, ready now or still loading.
///
/// A session that loads asynchronously is returned at once with a readiness [`Completion`]; calls that arrive
/// meanwhile wait for it, bounded by their timeout (rule H3).
pub struct Opened<S> {
    pub(crate) session: S,
    pub(crate) ready: Option<Completion>,
}

impl<S> std::fmt::Debug for Opened<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened").field("loading", &self.ready.is_some()).finish_non_exhaustive()
    }
}

impl<S> Opened<S> {
    /// A session that is ready for calls now.
    pub fn ready(session: S) -> Self {
        Self { session, ready: None }
    }

    /// A session still loading: calls wait until `ready` resolves. If it fails, calls get `INTERNAL` with its
    /// message, the failure is logged and a [`VisitLoadFailed`](crate::VisitLoadFailed) message tells the game,
    /// which should exit the visit.
    pub fn loading(session: S, ready: Completion) -> Self {
        Self { session, ready: Some(ready) }
    }
}

impl<S> From<S> for Opened<S> {
    fn from(session: S) -> Self {
        Self::ready(session)
    }
}

/// The game author's per-world state, and the callbacks the host makes around it.
///
/// `open`, `tick`, `relocated`, `input_context` and the beginning of `close` run on the Bevy main thread and must
/// not block on files, network or locks held by I/O (rule H3): start I/O on a runtime and hand back a
/// [`Completion`] instead.
///
/// A panic in `open`, `close` or `input_context` is caught, since each failure has a defined outcome: no visit
/// ([`WorldOpenFailed`](crate::WorldOpenFailed)), a failed save completion, an `INTERNAL` call. One in `tick`,
/// `relocated` or `shutdown` is not: it takes the game down as a panic in any of the game's systems does (a
/// `tick` that panics would panic again every frame, and a session left half-changed is not safe to save).
///
/// ```
/// use bevy::prelude::World;
/// use bevy_agent_tools::prelude::*;
///
/// struct Farm;
/// struct FarmSession { crops: u32 }
///
/// impl WorldLifecycle for Farm {
///     type Session = FarmSession;
///     fn open(&self, _visit: &VisitInfo, _world: &mut World) -> Result<Opened<FarmSession>, OpenError> {
///         Ok(Opened::ready(FarmSession { crops: 0 }))
///     }
///     fn close(&self, _session: FarmSession, _world: &mut World) -> Completion {
///         Completion::done()
///     }
/// }
/// ```
pub trait WorldLifecycle: Send + Sync + 'static {
    /// The per-visit state. Exactly one per visit.
    type Session: Send + Sync + 'static;

    /// Called once per visit, on the main thread, when the player enters a world. Releasing what it allocated
    /// before failing is its own job (rule H4).
    fn open(&self, visit: &VisitInfo, world: &mut World) -> Result<Opened<Self::Session>, OpenError>;

    /// Called every frame while the visit is open (also while it loads).
    fn tick(&self, session: &mut Self::Session, world: &mut World) {
        let _ = (session, world);
    }

    /// Called after dimension travel, on the same session. `to.revision` is `from.revision + 1`. A travel while the
    /// world loads calls it with the session still loading (`Opened::loading`).
    fn relocated(&self, session: &mut Self::Session, from: &Location, to: &Location, world: &mut World) {
        let _ = (session, from, to, world);
    }

    /// Called once when the visit ends, after admission closed, every call of the visit ended and their
    /// [`on_end`](crate::CallContext::on_end) cleanups ran. Take what must be saved, start the I/O off the main
    /// thread, and return a [`Completion`] that resolves when it is durable.
    ///
    /// The visit ends on [`ExitWorld`](crate::ExitWorld), on [`EnterWorld`](crate::EnterWorld) (for any world,
    /// the open one too: it is closed and opened again as a new visit), and on `AppExit` (the window
    /// closed, Ctrl+C): then too `close` runs, and the plugin waits for its completion (bounded by
    /// [`exit_deadline`](crate::AgentToolsPlugin::exit_deadline)) before the process goes on to exit.
    fn close(&self, session: Self::Session, world: &mut World) -> Completion;

    /// A small observation for one input (rule H14). `None` means there is none; the host never reuses an older
    /// value. It is data, not an instruction channel.
    fn input_context(&self, session: &Self::Session, world: &World) -> Option<serde_json::Value> {
        let _ = (session, world);
        None
    }

    /// Called exactly once on `AppExit`, after every outstanding close completed (or missed its deadline).
    /// Stop shared workers here.
    fn shutdown(&self) -> Completion {
        Completion::done()
    }
}
