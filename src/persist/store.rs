//! [`WorldStore`]: a directory per world, typed documents, one ordered queue per world.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bevy::prelude::Resource;
use parking_lot::{Mutex, RwLock};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use super::codec::{Codec, EncodeError};
use super::error::{NameKind, StoreError};
use super::faults::WriteFaults;
use super::files::{PayloadSink, Superseded, WorldFiles};
use super::loaded::Loaded;
use super::name;
use super::records;
use super::turns::Turns;
use crate::completion::Completion;
use crate::ids::WorldId;

/// A cheap-to-clone handle over a data directory holding one subdirectory per world.
///
/// - **Typed documents**: any `serde` type, stored in a checksummed envelope, encoded as JSON unless the store is
///   set to another [`Codec`] with [`with_codec`](Self::with_codec). A load decodes with the codec the file names,
///   so saves written in another codec (or before codecs existed) keep loading.
/// - **Off the main thread**: [`save`](Self::save) takes an owned snapshot and returns at once; serialization and
///   I/O run on the tokio runtime given to [`new`](Self::new) (the plugin's [`AgentRuntime`](crate::AgentRuntime)).
///   The returned [`Completion`] resolves when the data is durable, and never waits for a frame (rule H6).
/// - **Atomic and durable**: temporary file, fsync, rename, fsync of the directory. The current save becomes
///   `<doc>.json.prev` before it is replaced; a damaged primary falls back to it, with a warning. The save from
///   two saves ago is freed after the new one is reported durable, before the world's next operation (freeing a
///   file's blocks can take as long as writing them; nothing needs to wait for it).
/// - **Ordered per world** (rule H7): operations on one world run one at a time, in the order they were
///   *called* (not polled), across visits, so a load issued by the next visit's `open` sees the save issued by
///   the previous visit's `close`. Different worlds never wait for each other.
/// - **Locked per world**: the first operation on a world takes `<world>/world.lock`; another game process gets
///   [`StoreError::Locked`]. Within this process, visits share the lock through clones of one store, so create
///   one store per data directory and clone it. The app's store (the resource, which the
///   [`WorldStorePlugin`](super::WorldStorePlugin) inserts) holds a world's lock while a visit of it is open or
///   closing, or an operation of it is queued or running, and lets it go as soon as neither is so: a visit's close
///   completion resolves after that, and a world read from a menu is not kept either (its next operation takes the
///   lock again). A store no visit has used holds each world it touched until its last clone is dropped. The OS
///   releases every lock if the process dies. So a game that goes through many worlds in one run holds no file
///   open for each one it left.
/// - **Names are paths**: a world id names a directory and a document a file in it, so both are 1 to 64
///   characters of `a-z`, `0-9`, `_` and `-` (a lower-case UUID fits; Windows' device names such as `con` are
///   refused); anything else is [`StoreError::InvalidName`]. Check a name the player chose with
///   [`check_world`](Self::check_world) before entering a world by it.
///
/// ```no_run
/// # use bevy_agent_tools::{WorldId, persist::WorldStore};
/// # let runtime = tokio::runtime::Runtime::new().unwrap();
/// let store = WorldStore::new("saves", runtime.handle().clone());
/// let world = WorldId::new("alpha");
/// store.save(&world, "player", vec![1, 2, 3]).wait().unwrap();
/// let player: Option<Vec<u8>> = runtime.block_on(store.load(&world, "player")).unwrap();
/// assert_eq!(player, Some(vec![1, 2, 3]));
/// ```
#[derive(Resource, Clone)]
pub struct WorldStore {
    shared: Arc<Shared>,
    /// How this handle (and its clones) encodes what it saves.
    codec: Codec,
}

struct Shared {
    root: PathBuf,
    runtime: Handle,
    faults: RwLock<Option<Arc<dyn WriteFaults>>>,
    worlds: Mutex<Worlds>,
}

/// The worlds in use, under one lock: a world's queue is made, counted and let go only under it.
#[derive(Default)]
struct Worlds {
    queues: HashMap<WorldId, InUse>,
    /// Visits open or closing, by world. Counted once the app's host has used this store for a visit (`managed`).
    visits: HashMap<WorldId, usize>,
    /// Whether the app's host uses this store for its visits (the plugin's store from the start, another from its
    /// first visit): then a world no visit uses is let go whenever nothing of it is queued or running. A store the
    /// host never used keeps each world until it is dropped.
    managed: bool,
    /// Worlds let go, each with what its next queue starts after: its lock file closed (it would be found locked by
    /// this very process before) and its last operation's freeing of a superseded save done. Taken by the world's
    /// next queue; those resolved are dropped whenever a world is let go.
    retiring: HashMap<WorldId, Completion>,
    /// Of the worlds let go, the documents a load could not read ([`WorldFiles::take_unread`]).
    unread: HashMap<WorldId, std::collections::HashSet<String>>,
}

/// A world's queue, and how many operations hold it (queued or running).
struct InUse {
    queue: Arc<WorldQueue>,
    operations: usize,
}

/// A world taken out of use ([`Worlds::take_if_idle`]): its queue, to close its files outside the map's lock, and
/// the close to report.
struct Retired {
    queue: Arc<WorldQueue>,
    closed: crate::completion::Completer,
}

impl Worlds {
    /// Takes `world` out of use if the host manages this store, no visit of it is open or closing and no operation
    /// holds it: its queue is returned for the caller to drop outside the map's lock (closing the lock file may be
    /// a network round trip, and the main thread takes this lock to queue any world's operations), and the world's
    /// next queue waits for that.
    fn take_if_idle(&mut self, world: &WorldId) -> Option<Retired> {
        let idle = self.queues.get(world).is_some_and(|in_use| in_use.operations == 0);
        if !(self.managed && idle && !self.visits.contains_key(world)) {
            return None;
        }
        let queue = self.queues.remove(world)?.queue;
        // No operation holds the queue: its files are free.
        let unread = queue.files.lock().take_unread();
        if !unread.is_empty() {
            self.unread.insert(world.clone(), unread);
        }
        let (closed, closing) = Completion::pending();
        // The last operation reports before it frees the save two saves ago (`enqueue`): the next queue waits for
        // that too, as the same queue's next operation would.
        let after = Completion::all(std::iter::once(closing).chain(queue.turns.last()));
        self.retiring.retain(|_, after| !after.is_done());
        self.retiring.insert(world.clone(), after);
        Some(Retired { queue, closed })
    }
}

impl Shared {
    /// One of `world`'s visits is over: the world is let go if nothing else uses it (blocking: it may close the
    /// world's lock file).
    fn visit_ended(&self, world: &WorldId) {
        self.let_go_if_idle(world, |worlds| match worlds.visits.get_mut(world) {
            Some(visits) if *visits > 1 => *visits -= 1,
            Some(_) => drop(worlds.visits.remove(world)),
            None => {}
        });
    }

    /// An operation is done with `queue` (finished, failed, panicked or dropped): the world is let go if nothing
    /// else uses it (blocking, as [`visit_ended`](Self::visit_ended)).
    fn operation_done(&self, queue: Arc<WorldQueue>) {
        // Dropped first (the map keeps its own while the count is above 0): once the count reaches 0, the map's is
        // the last reference, and letting the world go closes the files.
        let world = queue.world.clone();
        drop(queue);
        self.let_go_if_idle(&world, |worlds| {
            if let Some(in_use) = worlds.queues.get_mut(&world) {
                in_use.operations = in_use.operations.saturating_sub(1);
            }
        });
    }

    /// Makes `change` to what uses `world`, under the map's lock, then lets the world go if nothing uses it any more
    /// ([`Worlds::take_if_idle`]): its files are closed outside the lock (the last reference to its queue: no
    /// operation holds it), and the close reported.
    fn let_go_if_idle(&self, world: &WorldId, change: impl FnOnce(&mut Worlds)) {
        let retired = {
            let mut worlds = self.worlds.lock();
            change(&mut worlds);
            worlds.take_if_idle(world)
        };
        let Some(Retired { queue, closed }) = retired else { return };
        drop(queue);
        closed.succeed();
    }
}

/// An operation's hold on its world's queue, counted in [`Worlds`] from when it is queued until it is dropped: its
/// file work done, or the operation dropped unrun (its task never ran, or it panicked).
struct Held {
    shared: Arc<Shared>,
    queue: Option<Arc<WorldQueue>>,
}

impl std::ops::Deref for Held {
    type Target = WorldQueue;

    fn deref(&self) -> &WorldQueue {
        // Taken only by `drop`.
        self.queue.as_deref().unwrap_or_else(|| unreachable!("a held queue is there until it is dropped"))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(queue) = self.queue.take() {
            self.shared.operation_done(queue);
        }
    }
}

/// One world's queue: the completion of the last operation called, and the files, used by one operation at a time.
struct WorldQueue {
    world: WorldId,
    turns: Turns,
    files: Mutex<WorldFiles>,
}

impl std::fmt::Debug for WorldStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorldStore").field("root", &self.root()).field("codec", &self.codec).finish()
    }
}

impl WorldStore {
    /// Whether `world` can be saved under its id: [`StoreError::InvalidName`] saying why not. Checks the name only
    /// (no I/O): a game can refuse a save name the player typed before a visit's load fails on it.
    ///
    /// ```
    /// # use bevy_agent_tools::{WorldId, persist::WorldStore};
    /// assert!(WorldStore::check_world(&WorldId::new("3f2b8c1e-9d4a-4e7b-8f00-6a1d2c3b4e5f")).is_ok());
    /// assert!(WorldStore::check_world(&WorldId::new("My World")).is_err());
    /// ```
    pub fn check_world(world: &WorldId) -> Result<(), StoreError> {
        name::check(NameKind::World, world.as_str())
    }

    /// A store over `root` (created when first written), running its work on `runtime`. Does no I/O.
    pub fn new(root: impl Into<PathBuf>, runtime: Handle) -> Self {
        Self {
            shared: Arc::new(Shared {
                root: root.into(),
                runtime,
                faults: RwLock::new(None),
                worlds: Mutex::new(Worlds::default()),
            }),
            codec: Codec::default(),
        }
    }

    /// This store, saving in `codec` from now on. Loading is unaffected: a document is always decoded with the
    /// codec its file names, so switching never strands an existing save (see [`Codec`] for what postcard
    /// cannot encode). The codec belongs to this handle and the clones made from it; other clones of the same
    /// store share its worlds, order and locks but keep their own codec.
    ///
    /// ```no_run
    /// # use bevy_agent_tools::persist::{Codec, WorldStore};
    /// # let runtime = tokio::runtime::Runtime::new().unwrap();
    /// let store = WorldStore::new("saves", runtime.handle().clone()).with_codec(Codec::Postcard);
    /// ```
    pub fn with_codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// This store is the app's, whose host counts its visits: from now on it lets go of a world nothing uses, also
    /// one read (from a menu) before any visit opened.
    pub(crate) fn managed(self) -> Self {
        self.shared.worlds.lock().managed = true;
        self
    }

    /// The codec this handle saves in.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// The data directory.
    pub fn root(&self) -> &Path {
        &self.shared.root
    }

    /// Installs a fault-injection hook for tests (all clones see it). Off by default.
    pub fn set_write_faults(&self, faults: impl WriteFaults) {
        *self.shared.faults.write() = Some(Arc::new(faults));
    }

    /// Removes the fault-injection hook.
    pub fn clear_write_faults(&self) {
        *self.shared.faults.write() = None;
    }

    /// The directory of `world`, after checking its name.
    pub fn world_dir(&self, world: &WorldId) -> Result<PathBuf, StoreError> {
        name::check(NameKind::World, world.as_str())?;
        Ok(self.shared.root.join(world.as_str()))
    }

    /// The primary file of `document` in `world` (`<document>.json`, whatever the codec).
    pub fn document_path(&self, world: &WorldId, document: &str) -> Result<PathBuf, StoreError> {
        name::check(NameKind::Document, document)?;
        Ok(self.world_dir(world)?.join(format!("{document}.json")))
    }

    /// Saves `snapshot` as `document` of `world`. Returns at once: call it from `close` on the main thread with
    /// an owned snapshot. The completion resolves when the new content is durable, or fails with the
    /// [`StoreError`]'s message; until then, and if it fails, the previous save stays loadable.
    pub fn save<T: Serialize + Send + 'static>(&self, world: &WorldId, document: &str, snapshot: T) -> Completion {
        self.save_with(world, document, move |codec, sink| codec.encode(&snapshot, sink))
    }

    /// Saves a sequence of records as `document` of `world`, like [`save`](Self::save) but encoded on up to four
    /// threads: for bulk state (blocks, tiles, entities) of many thousands of records, where encoding, not the
    /// disk, is most of a save's time. Runs of records are encoded in parallel and written in order while later
    /// runs are still being encoded; the file holds exactly what `save` would write for the same `Vec`, so the
    /// document loads with [`load`](Self::load)`::<Vec<T>>` (or [`load_in_background`](Self::load_in_background)),
    /// and a game can switch between the two calls without touching its saves.
    ///
    /// The threads are started for the save and end with it (one per core, at most four, and at least 4,096
    /// records each: a smaller document is encoded on one thread like `save`), at the plugin's
    /// [`WorkerPriority`](crate::WorkerPriority). At most two runs per thread wait in memory for the disk.
    /// Ordering, durability, the checksum, the previous save and the errors are `save`'s (the first record in
    /// the document's order that fails, or panics, decides the error). It uses every core it gets for the few
    /// milliseconds of encoding: a game that would rather keep a core for its frame saves with `save`. It gains
    /// only where cores are free: with both cores of a two-core machine busy, a save measured slower than `save`.
    ///
    /// ```no_run
    /// # use bevy_agent_tools::{WorldId, persist::{Codec, WorldStore}};
    /// # let runtime = tokio::runtime::Runtime::new().unwrap();
    /// #[derive(serde::Serialize, serde::Deserialize)]
    /// struct Block { x: i32, y: i32, z: i32, kind: u8 }
    ///
    /// let store = WorldStore::new("saves", runtime.handle().clone()).with_codec(Codec::Postcard);
    /// let world = WorldId::new("alpha");
    /// let blocks: Vec<Block> = (0..200_000).map(|i| Block { x: i, y: 0, z: 0, kind: 1 }).collect();
    /// store.save_records(&world, "blocks", blocks).wait().unwrap();
    /// let loaded: Option<Vec<Block>> = runtime.block_on(store.load(&world, "blocks")).unwrap();
    /// assert_eq!(loaded.map(|blocks| blocks.len()), Some(200_000));
    /// ```
    pub fn save_records<T: Serialize + Send + Sync + 'static>(
        &self,
        world: &WorldId,
        document: &str,
        records: Vec<T>,
    ) -> Completion {
        // How many threads is decided off the main thread: asking the OS for the cores can read files (cgroups).
        self.save_with(world, document, move |codec, sink| {
            records::encode(codec, &records, records::threads_for(records.len()), sink)
        })
    }

    /// Queues a save whose payload `encode` writes; its completion resolves when the save is durable.
    fn save_with(
        &self,
        world: &WorldId,
        document: &str,
        encode: impl FnOnce(Codec, &mut PayloadSink<'_>) -> Result<(), EncodeError> + Send + 'static,
    ) -> Completion {
        let queue = match self.queue(world, document) {
            Ok(queue) => queue,
            Err(error) => return Completion::failed(error),
        };
        let (completer, completion) = Completion::pending();
        // The queued task resolves the completion itself: one spawn is all the caller's thread does.
        self.write(queue, document, encode, move |result| completer.complete(result.map_err(Into::into)));
        completion
    }

    /// Like [`save`](Self::save), with the typed error. The write is queued when this is called; awaiting the
    /// future only observes it (dropping it does not cancel the write).
    pub fn save_async<T: Serialize + Send + 'static>(
        &self,
        world: &WorldId,
        document: &str,
        snapshot: T,
    ) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let encode = move |codec: Codec, sink: &mut PayloadSink<'_>| codec.encode(&snapshot, sink);
        let queued = self.queue(world, document).map(|queue| self.write(queue, document, encode, |result| result));
        async move { joined(queued?).await }
    }

    /// Queues a save whose payload `encode` writes in this handle's codec.
    fn write<O: Send + 'static>(
        &self,
        queue: Held,
        document: &str,
        encode: impl FnOnce(Codec, &mut PayloadSink<'_>) -> Result<(), EncodeError> + Send + 'static,
        finish: impl FnOnce(Result<(), StoreError>) -> O + Send + 'static,
    ) -> Queued<O> {
        let (doc, shared, codec) = (document.to_string(), self.shared.clone(), self.codec);
        // Serialized while it is written (streamed into the file in the world's turn), not into memory first
        // (`save_records` holds a few runs).
        let work = move |files: &mut WorldFiles| {
            let faults = shared.faults.read().clone();
            files.write(&doc, codec, |sink| encode(codec, sink), faults.as_deref())
        };
        self.enqueue(queue, work, finish)
    }

    /// Loads `document` of `world`: `None` if it was never saved. Waits for every operation on `world` called
    /// before it (an in-flight save of the previous visit included); queued when called, not when polled.
    pub fn load<T: DeserializeOwned + Send + 'static>(
        &self,
        world: &WorldId,
        document: &str,
    ) -> impl Future<Output = Result<Option<T>, StoreError>> + Send + 'static {
        let queued = self.queue(world, document).map(|queue| self.read(queue, document, |result| result));
        async move { joined(queued?).await }
    }

    fn read<T: DeserializeOwned + Send + 'static, O: Send + 'static>(
        &self,
        queue: Held,
        document: &str,
        finish: impl FnOnce(Result<Option<T>, StoreError>) -> O + Send + 'static,
    ) -> Queued<O> {
        let (world, doc, shared) = (queue.world.clone(), document.to_string(), self.shared.clone());
        let work = move |files: &mut WorldFiles| {
            let faults = shared.faults.read().clone();
            let Some(found) = files.read(&doc, faults.as_deref())? else { return Ok(None) };
            // The file's codec, not this handle's: a store switched to another codec still loads older saves.
            let Some(codec) = Codec::from_name(&found.codec) else {
                return Err(StoreError::UnknownCodec { world, document: doc, path: found.path, codec: found.codec });
            };
            codec.decode(&found.payload).map(Some).map_err(|message| StoreError::Decode {
                world,
                document: doc,
                path: found.path,
                message,
            })
        };
        self.enqueue(queue, work, finish)
    }

    /// Starts loading `document` for a session returned by `open`, without blocking: returns the session's
    /// [`Loaded`] slot and the readiness [`Completion`] to hand to [`Opened::loading`](crate::Opened::loading).
    /// The slot is filled (with `if_absent()` if the document was never saved) before the completion resolves,
    /// so a tool step, which runs only once the session is ready, always sees the data.
    pub fn load_in_background<T: DeserializeOwned + Send + Sync + 'static>(
        &self,
        world: &WorldId,
        document: &str,
        if_absent: impl FnOnce() -> T + Send + 'static,
    ) -> (Loaded<T>, Completion) {
        let (loaded, filler) = Loaded::pending();
        let queue = match self.queue(world, document) {
            Ok(queue) => queue,
            Err(error) => return (loaded, Completion::failed(error)),
        };
        let (completer, ready) = Completion::pending();
        self.read(queue, document, move |result: Result<Option<T>, StoreError>| match result {
            Ok(value) => {
                filler.fill(value.unwrap_or_else(if_absent));
                completer.succeed();
            }
            Err(error) => completer.fail(error),
        });
        (loaded, ready)
    }

    /// Resolves when every operation called so far, on every world, has finished (successfully or not: each
    /// operation reports its own outcome). Useful in [`WorldLifecycle::shutdown`](crate::WorldLifecycle::shutdown).
    pub fn flush(&self) -> Completion {
        // The last turns, not the queues: a queue held here would keep a world's lock file open past its release.
        let turns: Vec<_> = {
            let worlds = self.shared.worlds.lock();
            let last = worlds.queues.values().filter_map(|in_use| in_use.queue.turns.last());
            last.chain(worlds.retiring.values().cloned()).filter(|turn| !turn.is_done()).collect()
        };
        if turns.is_empty() {
            // Resolved now, not by a task of the runtime: an exit whose deadline has passed asks without waiting.
            return Completion::done();
        }
        Completion::spawn(&self.shared.runtime, async move {
            for turn in turns {
                let _ = turn.finished().await;
            }
            Ok(())
        })
    }

    /// A visit of `world` is opening (called by the host before the game's `open`; no I/O): the world is kept, its
    /// lock held, until the visit has closed and its close resolved ([`visit_closed`](Self::visit_closed)). From
    /// the first such call, the store lets go of a world no visit uses once nothing of it is queued or running.
    pub(crate) fn visit_opening(&self, world: &WorldId) {
        let mut worlds = self.shared.worlds.lock();
        worlds.managed = true;
        *worlds.visits.entry(world.clone()).or_default() += 1;
    }

    /// A visit counted by [`visit_opening`](Self::visit_opening) is over: `closed` is its close's completion (or
    /// one already resolved, for an `open` that failed). The returned completion resolves as `closed` does, once
    /// the world is let go if nothing else uses it: its lock file unlocked (another game process may use the world
    /// now), without waiting for a frame (rule H6), and never on the main thread (closing a file on a network file
    /// system is a round trip).
    pub(crate) fn visit_closed(&self, world: &WorldId, closed: Completion) -> Completion {
        let (shared, world) = (self.shared.clone(), world.clone());
        Completion::spawn(&self.shared.runtime, async move {
            let result = closed.finished().await;
            let _ = shared.runtime.clone().spawn_blocking(move || shared.visit_ended(&world)).await;
            result
        })
    }

    /// The queue of `world`, after checking both names, held for one operation.
    fn queue(&self, world: &WorldId, document: &str) -> Result<Held, StoreError> {
        let dir = self.world_dir(world)?;
        name::check(NameKind::Document, document)?;
        let mut worlds = self.shared.worlds.lock();
        let worlds = &mut *worlds;
        let in_use = worlds.queues.entry(world.clone()).or_insert_with(|| {
            let before = worlds.retiring.remove(world);
            let unread = worlds.unread.remove(world).unwrap_or_default();
            InUse {
                queue: Arc::new(WorldQueue {
                    world: world.clone(),
                    turns: Turns::after(before),
                    files: Mutex::new(WorldFiles::new(world.clone(), dir, unread)),
                }),
                operations: 0,
            }
        });
        in_use.operations += 1;
        Ok(Held { shared: self.shared.clone(), queue: Some(in_use.queue.clone()) })
    }

    /// Takes the world's next place in line now, then on the runtime: waits for the previous operation, runs
    /// `work` with the files on a blocking thread, and hands the result to `finish`.
    fn enqueue<R, O>(
        &self,
        queue: Held,
        work: impl FnOnce(&mut WorldFiles) -> Result<R, StoreError> + Send + 'static,
        finish: impl FnOnce(Result<R, StoreError>) -> O + Send + 'static,
    ) -> Queued<O>
    where
        R: Send + 'static,
        O: Send + 'static,
    {
        let mut turn = queue.turns.take();
        let shared = self.shared.clone();
        let world = queue.world.clone();
        let task = self.shared.runtime.spawn(async move {
            let id = queue.world.clone();
            turn.wait().await;
            let outcome = blocking(&shared.runtime, &id, move || {
                let mut files = queue.files.lock();
                let result = work(&mut files);
                let superseded = files.take_superseded();
                drop(files);
                // Before this operation is reported: once it is, the world is let go if nothing uses it.
                drop(queue);
                Ok((result, superseded))
            })
            .await;
            let (result, superseded) = outcome.unwrap_or_else(|interrupted| (Err(interrupted), Vec::new()));
            if superseded.is_empty() {
                turn.done.succeed();
            } else {
                // Freed after the report, before the world's next operation: the caller does not wait for it.
                let (runtime, faults) = (shared.runtime.clone(), shared.faults.read().clone());
                drop(shared.runtime.spawn(async move {
                    let _ = runtime.spawn_blocking(move || remove_superseded(&id, superseded, faults)).await;
                    turn.done.succeed();
                }));
            }
            finish(result)
        });
        (world, task)
    }
}

async fn blocking<R: Send + 'static>(
    runtime: &Handle,
    world: &WorldId,
    work: impl FnOnce() -> Result<R, StoreError> + Send + 'static,
) -> Result<R, StoreError> {
    runtime.spawn_blocking(work).await.unwrap_or_else(|error| {
        Err(StoreError::Interrupted { world: world.clone(), message: format!("the I/O work failed: {error}") })
    })
}

/// Frees `world`'s saves two saves old (see `WorldFiles::supersede`); one that cannot be removed is left for the
/// world's next lock holder.
fn remove_superseded(world: &WorldId, superseded: Vec<Superseded>, faults: Option<Arc<dyn WriteFaults>>) {
    for Superseded { document, link } in superseded {
        let freed = match &faults {
            Some(faults) => faults.before_freeing(world, &document),
            None => Ok(()),
        };
        if let Err(error) = freed.and_then(|()| std::fs::remove_file(&link)) {
            if error.kind() != std::io::ErrorKind::NotFound {
                tracing::debug!(%world, document, file = %link.display(), %error, "could not free a superseded save");
            }
        }
    }
}

/// The outcome of a queued operation, or `Interrupted` if its task never finished.
async fn joined<R>((world, task): Queued<Result<R, StoreError>>) -> Result<R, StoreError> {
    task.await.unwrap_or_else(|error| {
        Err(StoreError::Interrupted { world, message: format!("the store's task did not finish: {error}") })
    })
}

type Queued<O> = (WorldId, JoinHandle<O>);

impl From<StoreError> for crate::completion::CompletionError {
    fn from(error: StoreError) -> Self {
        Self::new(error)
    }
}
