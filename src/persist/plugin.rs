//! [`WorldStorePlugin`]: inserts a [`WorldStore`] resource running on the plugin's runtime.

use std::path::PathBuf;

use bevy::prelude::*;

use super::codec::Codec;
use super::store::WorldStore;
use crate::runtime::AgentRuntime;

/// Inserts a [`WorldStore`] over a data directory as a resource, running on the
/// [`AgentRuntime`]. Add it after [`AgentToolsPlugin`](crate::AgentToolsPlugin); a lifecycle reaches the store
/// with `world.resource::<WorldStore>()` in `open` and `close`.
///
/// ```
/// # use bevy::prelude::*;
/// # use bevy_agent_tools::persist::{Codec, WorldStorePlugin};
/// # fn add(app: &mut App) {
/// app.add_plugins(WorldStorePlugin::new("saves").codec(Codec::Postcard));
/// # }
/// ```
#[derive(Debug)]
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
    fn build(&self, app: &mut App) {
        let Some(runtime) = app.world().get_resource::<AgentRuntime>() else {
            panic!("add AgentToolsPlugin before WorldStorePlugin: the store runs on its runtime");
        };
        let store = WorldStore::new(self.root.clone(), runtime.handle().clone()).with_codec(self.codec).managed();
        app.insert_resource(store);
    }
}
