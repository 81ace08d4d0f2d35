//! [`WorldStorePlugin`]: inserts a [`WorldStore`] resource running on the plugin's runtime.

use std::path::PathBuf;

use bevy::prelude::*;

use super::codec::Codec;
use super::store::WorldStore;
use crate::runtime::AgentRuntime;

/// Inserts a [`WorldStore`] over a data directory as a resource, running on the
/// [`AgentRuntime`] of the [`AgentToolsPlugin`](crate::AgentToolsPlugin), which it needs (added before or after it:
/// the store is there once both are); a lifecycle reaches the store with `world.resource::<WorldStore>()` in
/// `open` and `close`.
///
/// ```
/// # use bevy::prelude::*;
/// # use bevy_agent_tools::persist::{Codec, WorldStorePlugin};
/// # fn add(app: &mut App) {
/// app.add_plugins(WorldStorePlugin::new("saves").codec(Codec::Postcard));
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct WorldStorePlugin {
    root: PathBuf,
    codec: Codec,
}

impl WorldStorePlugin {
    /// A store over `root` (one subdirectory per world), saving JSON.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into(), codec: Codec::default() }
    }

    /// Saves in `codec` instead of JSON ([`WorldStore::with_codec`]). Saves already on disk keep loading whatever
    /// codec wrote them; read [`Codec`] for what postcard cannot encode before you switch.
    pub fn codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }
}

impl Plugin for WorldStorePlugin {
    /// Inserts the store, on the [`AgentToolsPlugin`](crate::AgentToolsPlugin)'s runtime: now, or when that plugin
    /// is added, if it was not yet.
    fn build(&self, app: &mut App) {
        let plugin = self.clone();
        crate::plugin::when_host_built(app, move |app| plugin.insert(app));
    }

    /// # Panics
    ///
    /// If the app has no `AgentToolsPlugin`: the store runs on its runtime.
    fn finish(&self, app: &mut App) {
        if !app.world().contains_resource::<WorldStore>() {
            crate::plugin::host_missing("WorldStorePlugin");
        }
    }
}

impl WorldStorePlugin {
    fn insert(&self, app: &mut App) {
        let runtime = app.world().resource::<AgentRuntime>().handle().clone();
        app.insert_resource(WorldStore::new(self.root.clone(), runtime).with_codec(self.codec).managed());
    }
}
