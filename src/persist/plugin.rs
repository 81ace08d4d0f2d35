//! [`WorldStorePlugin`]: inserts a [`WorldStore`] resource running on the plugin's runtime.

use std::path::PathBuf;

use bevy::prelude::*;

use super::store::WorldStore;
use crate::runtime::AgentRuntime;

/// Inserts a [`WorldStore`] over a data directory as a resource, running on the
/// [`AgentRuntime`]. Add it after [`AgentToolsPlugin`](crate::AgentToolsPlugin); a lifecycle reaches the store
/// with `world.resource::<WorldStore>()` in `open` and `close`.
pub struct WorldStorePlugin {
    root: PathBuf,
}

impl WorldStorePlugin {
    /// A store over `root` (one subdirectory per world).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
}

impl Plugin for WorldStorePlugin {
    fn build(&self, app: &mut App) {
        let Some(runtime) = app.world().get_resource::<AgentRuntime>() else {
            panic!("add AgentToolsPlugin before WorldStorePlugin: the store runs on its runtime");
        };
        let store = WorldStore::new(self.root.clone(), runtime.handle().clone());
        app.insert_resource(store);
    }
}
