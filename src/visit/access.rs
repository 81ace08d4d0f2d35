//! The open visit's session for the game's own main-thread code.

use bevy::prelude::{Mut, World};

use super::VisitSlot;
use crate::lifecycle::{VisitInfo, WorldLifecycle};

/// Reaches the open visit's session from the game's own main-thread code: a HUD that shows what the tools
/// changed, input or game rules that change it. Tools reach it through
/// [`CallContext::on_client`](crate::CallContext::on_client), and the lifecycle's own methods are handed it.
///
/// ```
/// # use bevy::prelude::*;
/// # use bevy_agent_tools::prelude::*;
/// struct Garden { flowers: u32 }
/// # struct Gardens;
/// # impl WorldLifecycle for Gardens {
/// #     type Session = Garden;
/// #     fn open(&self, _: &VisitInfo, _: &mut World) -> Result<Opened<Garden>, OpenError> {
/// #         Ok(Opened::ready(Garden { flowers: 0 }))
/// #     }
/// #     fn close(&self, _: Garden, _: &mut World) -> Completion { Completion::done() }
/// # }
///
/// /// An exclusive system: the player waters the garden, which grows a flower.
/// fn water(world: &mut World) {
///     let grown = world.with_visit_session::<Gardens, _>(|_visit, garden, _world| {
///         garden.flowers += 1;
///         garden.flowers
///     });
///     if let Some(flowers) = grown {
///         info!("{flowers} flowers");
///     }
/// }
/// ```
pub trait VisitSessionExt {
    /// Runs `f` with the open visit (its world, visit id and current location), its session, and the rest of the
    /// world, on the main thread, and returns what `f` returns. `None` when no visit of lifecycle `L` is open,
    /// and inside a tool's step or one of the lifecycle's own methods (which have the session already). A session
    /// still loading (`Opened::loading`) is lent too, as `tick` gets it: check its readiness yourself.
    fn with_visit_session<L: WorldLifecycle, R>(
        &mut self,
        f: impl FnOnce(&VisitInfo, &mut L::Session, &mut World) -> R,
    ) -> Option<R>;
}

impl VisitSessionExt for World {
    fn with_visit_session<L: WorldLifecycle, R>(
        &mut self,
        f: impl FnOnce(&VisitInfo, &mut L::Session, &mut World) -> R,
    ) -> Option<R> {
        // Out of the world while a step or a lifecycle method runs (they hold the slot): nothing to lend then.
        if !self.contains_resource::<VisitSlot<L>>() {
            return None;
        }
        self.resource_scope(|world, mut slot: Mut<VisitSlot<L>>| {
            let open = slot.open.as_mut()?;
            Some(f(&open.info, &mut open.session, world))
        })
    }
}
