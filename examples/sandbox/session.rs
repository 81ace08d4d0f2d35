//! The sandbox's [`WorldLifecycle`]: a visit loads its world's save in the background (open never blocks the main
//! thread), and saves it through the [`WorldStore`] when the player leaves.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bevy::prelude::*;
use bevy_agent_tools::persist::{Loaded, WorldStore};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::{VisitId, WorldId};
use parking_lot::Mutex;
use schemars::JsonSchema;
use serde::Serialize;

use crate::view::WorldView;
use crate::world::{Dimension, Palette, Pos, SaveDoc, WorldState, SAVE_FORMAT};

/// The one document a world's save is kept in.
pub const SAVE_DOCUMENT: &str = "sandbox";

/// How many tower reports a visit keeps.
const TOWER_LOG_LEN: usize = 16;

/// The sandbox's worlds.
pub struct Sandbox {
    palette: Arc<Palette>,
    /// How often a changed world is saved while the player is in it (a crash loses at most this much).
    autosave: Duration,
}

/// How often a changed world is saved while the player is in it, by default.
pub const AUTOSAVE_EVERY: Duration = Duration::from_secs(30);

impl Sandbox {
    pub fn new(palette: Arc<Palette>) -> Self {
        Self { palette, autosave: AUTOSAVE_EVERY }
    }

    /// Saves a changed world every `every` while the player is in it.
    pub fn autosave_every(mut self, every: Duration) -> Self {
        self.autosave = every;
        self
    }
}

/// One visit's state.
pub struct Visit {
    pub world: WorldId,
    pub visit: VisitId,
    pub location: Location,
    palette: Arc<Palette>,
    /// The save, until it is turned into `state` (the first time a tool or `tick` needs it).
    save: Loaded<SaveDoc>,
    ready: Completion,
    state: Option<WorldState>,
    /// What `build_tower` calls did in this visit, newest last.
    pub towers: TowerLog,
    /// The world's changes the latest autosave made (under way or done) holds ([`WorldState::changes`]).
    autosaved: u64,
    /// When the next autosave may be made.
    next_autosave: Instant,
    /// The autosave under way, and the changes it holds.
    autosaving: Option<(Completion, u64)>,
    /// The changes the latest autosave that finished made durable.
    durable: u64,
}

impl Visit {
    /// Saves the world if it changed since its last save and that was long enough ago (a save of a world is made
    /// after the one before it: rule H7). One that fails is said, and made again at the next turn.
    fn autosave(&mut self, world: &mut World, every: Duration) {
        if let Some((saving, changes)) = &self.autosaving {
            match saving.result() {
                None => return,
                Some(Ok(())) => self.durable = *changes,
                Some(Err(error)) => {
                    // A console line, written off the main thread: `tick` never waits for a reader.
                    crate::output::say(format_args!(
                        "autosave-failed world={} visit={} error={:?}",
                        self.world,
                        self.visit.0,
                        error.to_string()
                    ));
                    self.autosaved = 0;
                }
            }
            self.autosaving = None;
        }
        let (Some(state), Some(store)) = (&self.state, world.get_resource::<WorldStore>()) else { return };
        if state.changes() == self.autosaved || Instant::now() < self.next_autosave {
            return;
        }
        self.autosaving = Some((store.save(&self.world, SAVE_DOCUMENT, state.to_save()), state.changes()));
        self.autosaved = state.changes();
        self.next_autosave = Instant::now() + every;
    }

    /// The world's state; `INTERNAL` only if the host ran a step before the load finished (it never does).
    pub fn state(&mut self) -> Result<&mut WorldState, ToolError> {
        if self.state.is_none() {
            // A save a newer sandbox wrote is neither read as this one's nor saved over.
            if let Some(format) = self.newer_save() {
                return Err(ToolError::internal(format!(
                    "world `{}` was saved by a newer sandbox (save format {format}; this one reads {SAVE_FORMAT}): \
                     it is not loaded, and its save is left as it is",
                    self.world
                )));
            }
            let doc = self.save.get_mut().map(std::mem::take).ok_or_else(|| match self.ready.result() {
                Some(Err(error)) => ToolError::internal(format!("world `{}` could not be loaded: {error}", self.world)),
                _ => ToolError::internal(format!("world `{}` is still loading", self.world)),
            })?;
            let (state, warnings) = WorldState::from_save(self.world.as_str(), self.palette.clone(), doc);
            for warning in warnings {
                warn!(world = %self.world, "left out of the save: {warning}");
            }
            self.state = Some(state);
        }
        self.state.as_mut().ok_or_else(|| ToolError::internal("the world state vanished"))
    }

    /// The save's format, if a newer sandbox wrote it.
    fn newer_save(&self) -> Option<u32> {
        self.save.get().map(|doc| doc.format).filter(|format| *format > SAVE_FORMAT)
    }

    /// Where the player stands, how many notes and changed cells the world has.
    fn summary(&mut self) -> Result<(Pos, usize, usize), ToolError> {
        let dimension = self.dimension()?;
        let state = self.state()?;
        Ok((state.arrive(dimension), state.notes().len(), state.changed_cells()))
    }

    /// The dimension the player is in now.
    pub fn dimension(&self) -> Result<Dimension, ToolError> {
        Dimension::parse(self.location.dimension.as_str()).map_err(ToolError::internal)
    }
}

/// A shared log of tower builds. The handler writes to it directly (not through `on_client`), so it can still
/// record how its build ended after its call ended and its steps no longer run.
#[derive(Clone, Default)]
pub struct TowerLog(Arc<Mutex<Vec<TowerReport>>>);

/// What one `build_tower` call did.
#[derive(Clone, Debug, Serialize, JsonSchema)]
pub struct TowerReport {
    /// The call's request id.
    pub request: u64,
    pub dimension: Dimension,
    pub x: i32,
    pub z: i32,
    pub block: String,
    /// How many blocks were asked for.
    pub height: u32,
    /// How many were placed.
    pub placed: u32,
    /// `building`, `finished`, or the error code that stopped it (`LOCATION_CHANGED`, `CANCELLED`, ...).
    pub status: String,
}

impl TowerLog {
    pub fn start(&self, report: TowerReport) {
        let mut log = self.0.lock();
        if log.len() >= TOWER_LOG_LEN {
            log.remove(0);
        }
        log.push(report);
    }

    pub fn update(&self, request: u64, change: impl FnOnce(&mut TowerReport)) {
        if let Some(report) = self.0.lock().iter_mut().rev().find(|r| r.request == request) {
            change(report);
        }
    }

    /// Marks every tower still building as stopped by `code` (travel ends them all: they are location tools).
    pub fn stop_building(&self, code: &str) {
        for report in self.0.lock().iter_mut().filter(|r| r.status == "building") {
            report.status = code.to_string();
        }
    }

    pub fn last(&self) -> Option<TowerReport> {
        self.0.lock().last().cloned()
    }
}

/// What the console's `status` shows about the open visit, refreshed every frame by `tick`.
#[derive(Resource, Default, Clone, Debug)]
pub struct VisitSummary(pub Option<Summary>);

#[derive(Clone, Debug)]
pub struct Summary {
    pub visit: VisitId,
    /// `None` while the save is loading; the error if it could not be loaded.
    pub loaded: Option<Result<(Pos, usize, usize), String>>,
    /// The visit's changes to the world so far.
    pub changes: u64,
    /// How many of them the latest autosave that finished made durable.
    pub autosaved: u64,
}

impl WorldLifecycle for Sandbox {
    type Session = Visit;

    fn open(&self, visit: &VisitInfo, world: &mut World) -> Result<Opened<Visit>, OpenError> {
        let store = world
            .get_resource::<WorldStore>()
            .ok_or_else(|| OpenError::new("the sandbox has no world store: add WorldStorePlugin"))?;
        store.world_dir(&visit.world)?;
        Dimension::parse(visit.location.dimension.as_str()).map_err(OpenError::new)?;
        let (save, ready) = store.load_in_background(&visit.world, SAVE_DOCUMENT, SaveDoc::default);
        let session = Visit {
            world: visit.world.clone(),
            visit: visit.visit,
            location: visit.location.clone(),
            palette: self.palette.clone(),
            save,
            ready: ready.clone(),
            state: None,
            towers: TowerLog::default(),
            autosaved: 0,
            next_autosave: Instant::now() + self.autosave,
            autosaving: None,
            durable: 0,
        };
        Ok(Opened::loading(session, ready))
    }

    fn tick(&self, session: &mut Visit, world: &mut World) {
        let loaded = session.ready.result().map(|result| match result {
            Err(error) => Err(error.to_string()),
            Ok(()) => session.summary().map_err(|error| error.message),
        });
        let ready = matches!(loaded, Some(Ok(_)));
        if ready {
            session.autosave(world, self.autosave);
        }
        let (changes, autosaved) = (session.state.as_ref().map_or(0, WorldState::changes), session.durable);
        world.insert_resource(VisitSummary(Some(Summary { visit: session.visit, loaded, changes, autosaved })));
        // With `--window`: the player and the chunks the window needs (the headless sandbox has no view).
        if let (true, Some(mut view), Ok(dimension)) =
            (ready, world.get_resource_mut::<WorldView>(), session.dimension())
        {
            let visit = session.visit;
            if let Ok(state) = session.state() {
                view.feed(visit, dimension, state);
            }
        }
    }

    fn relocated(&self, session: &mut Visit, _from: &Location, to: &Location, _world: &mut World) {
        session.location = to.clone();
        session.towers.stop_building("LOCATION_CHANGED");
    }

    fn close(&self, session: Visit, world: &mut World) -> Completion {
        world.insert_resource(VisitSummary(None));
        if let Some(mut view) = world.get_resource_mut::<WorldView>() {
            view.clear();
        }
        let Some(state) = session.state else {
            // The save never loaded (or the visit ended before a frame saw it loaded): nothing changed, and the
            // files stay as they are. A world that failed to load says so rather than "saved".
            return match (session.ready.result(), session.newer_save()) {
                (Some(Err(error)), _) => Completion::failed(format!(
                    "world `{}` did not load ({error}): nothing was saved, its files are as they were",
                    session.world
                )),
                (_, Some(format)) => Completion::failed(format!(
                    "world `{}` was saved by a newer sandbox (save format {format}): nothing was saved, its files \
                     are as they were",
                    session.world
                )),
                _ => Completion::done(),
            };
        };
        match world.get_resource::<WorldStore>() {
            Some(store) => store.save(&session.world, SAVE_DOCUMENT, state.to_save()),
            None => {
                Completion::failed(format!("world `{}` was not saved: the sandbox has no world store", session.world))
            }
        }
    }
}
