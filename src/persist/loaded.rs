//! [`Loaded`]: a session's slot for a document that is still loading.

use std::sync::{Arc, OnceLock};

/// A document a session loads in the background, from
/// [`WorldStore::load_in_background`](super::WorldStore::load_in_background).
///
/// Empty until the load finishes; filled before the readiness completion resolves. The host runs no tool step
/// on a session before its readiness completion resolved, so tools can rely on [`get`](Self::get) and
/// [`get_mut`](Self::get_mut) returning `Some`. What runs whether or not the world has loaded can see `None`:
/// `tick` (every frame), `relocated` (a travel while the world loads), `close` (the player left before the load
/// finished, or it failed) and the game's own `with_visit_session`. A panic there is not caught (`tick` and
/// `relocated`): take `None` as "not loaded yet", never `unwrap` it.
pub struct Loaded<T> {
    slot: Arc<OnceLock<T>>,
}

/// Fills a [`Loaded`] slot from the store's task.
pub(crate) struct Filler<T> {
    slot: Arc<OnceLock<T>>,
}

impl<T> Loaded<T> {
    pub(crate) fn pending() -> (Self, Filler<T>) {
        let slot = Arc::new(OnceLock::new());
        (Self { slot: slot.clone() }, Filler { slot })
    }

    /// An already loaded slot (e.g. a brand-new world that needs no load).
    pub fn ready(value: T) -> Self {
        Self { slot: Arc::new(OnceLock::from(value)) }
    }

    /// Whether the document arrived.
    pub fn is_loaded(&self) -> bool {
        self.slot.get().is_some()
    }

    /// The document, once loaded.
    pub fn get(&self) -> Option<&T> {
        self.slot.get()
    }

    /// The document, mutably, once loaded.
    pub fn get_mut(&mut self) -> Option<&mut T> {
        // The store's task drops its handle on the slot before it resolves the readiness completion.
        Arc::get_mut(&mut self.slot).and_then(OnceLock::get_mut)
    }

    /// The document, taken out (e.g. to move it into a save snapshot in `close`).
    pub fn take(self) -> Option<T> {
        Arc::try_unwrap(self.slot).ok().and_then(OnceLock::into_inner)
    }
}

impl<T> Filler<T> {
    /// Fills the slot, and lets go of it so the session has it to itself.
    pub(crate) fn fill(self, value: T) {
        let _ = self.slot.set(value);
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Loaded<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded").field("value", &self.slot.get()).finish()
    }
}
