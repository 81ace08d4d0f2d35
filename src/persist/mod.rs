//! Persistence: the world store. A directory per world under a data directory, typed documents written and read
//! asynchronously on the plugin's runtime, atomic durable writes with a previous save to fall back to, same-world
//! ordering across visits, and a lock file per world.
//!
//! The pattern for a [`WorldLifecycle`](crate::WorldLifecycle): `open` starts the load with
//! [`WorldStore::load_in_background`] and returns `Opened::loading(session, ready)`; `close` moves the session's
//! state into [`WorldStore::save`] and returns its [`Completion`](crate::Completion), which resolves when the
//! data is durable, with no further frame needed (rules H3, H6, H7).
//!
//! ```
//! use bevy::prelude::*;
//! use bevy_agent_tools::prelude::*;
//! use bevy_agent_tools::persist::{Loaded, WorldStore};
//!
//! struct Farm;
//! struct FarmSession { world: bevy_agent_tools::WorldId, crops: Loaded<Vec<u32>> }
//!
//! impl WorldLifecycle for Farm {
//!     type Session = FarmSession;
//!     fn open(&self, visit: &VisitInfo, world: &mut World) -> Result<Opened<FarmSession>, OpenError> {
//!         let store = world.resource::<WorldStore>();
//!         let (crops, ready) = store.load_in_background(&visit.world, "crops", Vec::new);
//!         Ok(Opened::loading(FarmSession { world: visit.world.clone(), crops }, ready))
//!     }
//!     fn close(&self, session: FarmSession, world: &mut World) -> Completion {
//!         let Some(crops) = session.crops.take() else { return Completion::done() };
//!         world.resource::<WorldStore>().save(&session.world, "crops", crops)
//!     }
//! }
//! ```
//!
//! What is on disk, and why it survives a crash at any moment: see [`WorldStore`]. JSON by default; a game whose
//! saves are large collections of small records can choose the faster, smaller binary [`Codec::Postcard`] (with
//! [`WorldStorePlugin::codec`] or [`WorldStore::with_codec`]), and older JSON saves keep loading.

mod codec;
mod depth;
mod envelope;
mod error;
mod faults;
mod files;
mod finite;
mod loaded;
mod name;
mod plugin;
mod records;
mod store;
pub(crate) mod turns;

pub use codec::Codec;
pub use error::{NameKind, StoreError};
pub use faults::WriteFaults;
pub use loaded::Loaded;
pub use plugin::WorldStorePlugin;
pub use store::WorldStore;
