//! The messages the game drives visits with, and the messages the host writes back for a HUD or logs.

use std::sync::atomic::{AtomicU64, Ordering};

use bevy::prelude::Message;

use crate::completion::Completion;
use crate::ids::{DimensionId, VisitId, WorldId};
use crate::lifecycle::{Location, OpenError, VisitInfo};

/// Messages written in one frame are applied in the order they were created, whatever their type.
static ORDER: AtomicU64 = AtomicU64::new(0);

pub(crate) fn next_order() -> u64 {
    ORDER.fetch_add(1, Ordering::Relaxed)
}

/// The player enters a world. If a visit is open, it is exited first (then this one opens): for the open world
/// too, which is then closed (saved) and opened again as a new visit, whose calls start afresh. A game that writes
/// it on entering a play state (after a pause menu, say) should write it only when the player is not in that world
/// already; [`follow_state`](crate::AgentToolsPlugin::follow_state) does nothing for the world already open.
///
/// Messages written in one frame apply in the order they were made (with [`new`](Self::new)), whatever their type.
#[derive(Message, Clone, Debug)]
pub struct EnterWorld {
    /// The world to enter.
    pub world_id: WorldId,
    /// The dimension to start in; the plugin's default dimension when `None`.
    pub dimension: Option<DimensionId>,
    pub(crate) order: u64,
}

impl EnterWorld {
    /// Enter `world` in the default dimension.
    pub fn new(world: impl Into<WorldId>) -> Self {
        Self { world_id: world.into(), dimension: None, order: next_order() }
    }

    /// Enter in `dimension` instead of the default one.
    pub fn in_dimension(mut self, dimension: impl Into<DimensionId>) -> Self {
        self.dimension = Some(dimension.into());
        self
    }
}

/// The player travels to another dimension (or is teleported within one): the visit's location revision
/// increments and `WorldLifecycle::relocated` runs. Ignored when no visit is open.
#[derive(Message, Clone, Debug)]
pub struct TravelTo {
    /// Where the player arrives.
    pub dimension: DimensionId,
    pub(crate) order: u64,
}

impl TravelTo {
    /// Travel to `dimension`.
    pub fn new(dimension: impl Into<DimensionId>) -> Self {
        Self { dimension: dimension.into(), order: next_order() }
    }
}

/// The player leaves the world: admission closes, every call of the visit ends, `close` runs. Ignored when no
/// visit is open.
#[derive(Message, Clone, Debug)]
pub struct ExitWorld {
    pub(crate) order: u64,
}

impl ExitWorld {
    /// Leave the open world.
    pub fn new() -> Self {
        Self { order: next_order() }
    }
}

impl Default for ExitWorld {
    fn default() -> Self {
        Self::new()
    }
}

/// A visit opened (its session may still be loading).
#[derive(Message, Clone, Debug)]
pub struct VisitOpened {
    /// The visit.
    pub info: VisitInfo,
}

/// The player relocated inside a visit.
#[derive(Message, Clone, Debug)]
pub struct VisitRelocated {
    /// The visit.
    pub visit: VisitId,
    /// Where the player was.
    pub from: Location,
    /// Where the player is now.
    pub to: Location,
}

/// A visit is closing: admission just closed (new calls get `WORLD_CLOSED`); next, its calls end and `close`
/// runs, then [`VisitClosed`] follows in the same frame.
#[derive(Message, Clone, Debug)]
pub struct VisitClosing {
    /// The visit, at its last location.
    pub info: VisitInfo,
}

/// A visit ended. `completion` resolves when its `close` work is durable.
#[derive(Message, Clone, Debug)]
pub struct VisitClosed {
    /// The visit, at its last location.
    pub info: VisitInfo,
    /// Resolves when persistence and release finished.
    pub completion: Completion,
}

/// A visit's close work finished: its `close` completion resolved. `result` carries a failed save's error; the
/// game keeps running either way.
#[derive(Message, Clone, Debug)]
pub struct VisitSaved {
    /// The visit that was closed.
    pub info: VisitInfo,
    /// Whether persistence and release succeeded.
    pub result: crate::completion::CompletionResult,
}

/// The session of a visit that opened loading ([`Opened::loading`](crate::Opened::loading)) failed to load: its
/// readiness completion failed. The visit stays open (its calls get `INTERNAL` saying why) until the game exits
/// it, which it usually should, telling the player.
#[derive(Message, Clone, Debug)]
pub struct VisitLoadFailed {
    /// The visit.
    pub info: VisitInfo,
    /// Why.
    pub error: crate::completion::CompletionError,
}

/// `WorldLifecycle::open` failed (or panicked). No visit is open.
#[derive(Message, Clone, Debug)]
pub struct WorldOpenFailed {
    /// The world that failed to open.
    pub world: WorldId,
    /// The visit id it would have had (never reused).
    pub visit: VisitId,
    /// Why.
    pub error: OpenError,
}
