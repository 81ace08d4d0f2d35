//! [`WorldBinding`]: resolves a call to its own visit; `current()` is for observers only.

use std::marker::PhantomData;
use std::sync::Arc;

use bevy::prelude::Resource;

use crate::call::CallContext;
use crate::error::{ErrorCode, ToolError};
use crate::host::{HostShared, VisitStatus};
use crate::lifecycle::{VisitInfo, WorldLifecycle};

/// The handle the plugin gives back for a registered [`WorldLifecycle`]: a resource, cheap to clone. A plugin's
/// `build` returns nothing, so the game takes it from the world once the plugin is added:
/// `app.world().resource::<WorldBinding<MyLifecycle>>().clone()`, or `Res<WorldBinding<MyLifecycle>>` in a system.
///
/// [`resolve`](Self::resolve) answers for a call's *captured* visit, never for whichever world is open now
/// (rule H9). [`current`](Self::current) is for observers (a HUD, logs): never apply a result through it.
#[derive(Resource)]
pub struct WorldBinding<L: WorldLifecycle> {
    host: Arc<HostShared>,
    _lifecycle: PhantomData<fn(L)>,
}

impl<L: WorldLifecycle> std::fmt::Debug for WorldBinding<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorldBinding").field("visit", &self.host.status()).finish()
    }
}

impl<L: WorldLifecycle> Clone for WorldBinding<L> {
    fn clone(&self) -> Self {
        Self { host: self.host.clone(), _lifecycle: PhantomData }
    }
}

impl<L: WorldLifecycle> WorldBinding<L> {
    pub(crate) fn new(host: Arc<HostShared>) -> Self {
        Self { host, _lifecycle: PhantomData }
    }

    /// The visit open now, and its phase. For observers only.
    pub fn current(&self) -> Option<VisitStatus> {
        self.host.status()
    }

    /// The call's own visit, with its current location, if the call is live and its visit is still open and
    /// admitting. Otherwise the error the call's next `on_client` would get.
    pub fn resolve(&self, call: &CallContext<L::Session>) -> Result<VisitInfo, ToolError> {
        let captured = call.visit();
        if !call.is_active() {
            // Exactly what its next `on_client` answers: VISIT_ENDED after an exit, LOCATION_CHANGED after a
            // travel (`Location` scope), CANCELLED, TIMEOUT, or the handler's own outcome.
            return Err(call.end_error());
        }
        let state = self.host.state.lock();
        match state.visit.as_ref() {
            Some(open) if open.info.visit == captured.visit && !open.closing => Ok(open.info.clone()),
            _ => Err(ToolError::with_code(
                ErrorCode::VisitEnded,
                format!("the call's visit {} of world `{}` is no longer open", captured.visit, captured.world),
            )),
        }
    }
}
