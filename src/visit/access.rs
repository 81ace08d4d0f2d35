//! The open visit's session for the game's own main-thread code.

use bevy::ecs::system::SystemParam;
use bevy::prelude::{Mut, ResMut, World};

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

/// The open visit and its session as a system parameter, for the game's ordinary systems (a HUD, game rules) that
/// want [`Query`](bevy::prelude::Query) and [`Res`](bevy::prelude::Res) beside it rather than an exclusive system
/// ([`VisitSessionExt`]). Empty when no visit of lifecycle `L` is open. A session still loading
/// (`Opened::loading`) is lent too, as `tick` gets it: check its readiness yourself. It borrows the host's slot
/// mutably, so such systems do not run in parallel with each other or with the host's sets.
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
/// #[derive(Resource)]
/// struct Watering(bool);
///
/// fn water(watering: Res<Watering>, mut garden: VisitSession<Gardens>) {
///     if let Some((_visit, garden)) = garden.get_mut().filter(|_| watering.0) {
///         garden.flowers += 1;
///     }
/// }
/// # let mut app = App::new();
/// # app.add_systems(Update, water);
/// ```
#[derive(SystemParam)]
pub struct VisitSession<'w, L: WorldLifecycle> {
    slot: Option<ResMut<'w, VisitSlot<L>>>,
}

impl<L: WorldLifecycle> std::fmt::Debug for VisitSession<'_, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VisitSession").field("visit", &self.get().map(|(visit, _)| visit)).finish_non_exhaustive()
    }
}

impl<L: WorldLifecycle> VisitSession<'_, L> {
    /// The open visit (its world, visit id and current location) and its session; `None` when none is open.
    pub fn get(&self) -> Option<(&VisitInfo, &L::Session)> {
        let open = self.slot.as_ref()?.open.as_ref()?;
        Some((&open.info, &open.session))
    }

    /// The open visit and its session, to change; `None` when none is open.
    pub fn get_mut(&mut self) -> Option<(&VisitInfo, &mut L::Session)> {
        let open = self.slot.as_mut()?.open.as_mut()?;
        Some((&open.info, &mut open.session))
    }
}
