//! The world store under a 10 MB session, measured through the host: a `close` that saves the session.
//!
//! Two shapes of session, each serializing to 10 MiB of JSON: `cells`, a world of ~190,000 small records (what
//! game state usually is), and `blob`, one 10 MiB string (the worst case for streaming: `serde_json` scans a
//! string for escapes before writing any of it, so its encoding cannot overlap the disk).
//!
//! - `close_main_thread`: the time the main thread spends inside `close` (moving the snapshot into
//!   `WorldStore::save`); serialization and I/O run on the runtime. Target: ≤ 1 ms.
//! - `close_to_durable`: from the start of `close` until its completion resolved (data durable), against
//!   `plain_write_fsync`: create, write and fsync the same serialized bytes in the same directory. Target ≤ 1.5×.
//!   `serialize_write_fsync` adds the JSON serialization to the plain path, to separate the codec's cost from
//!   the store's (temporary file, rename, directory fsync, previous save).
//!
//! Criterion times the last two; the main-thread time is recorded inside every `close` of `close_to_durable`
//! (criterion cannot plan iterations from a time that excludes most of the work), and a summary prints the
//! medians and the ratio at the end.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bevy::ecs::message::Messages;
use bevy::prelude::*;
use bevy_agent_tools::persist::{WorldStore, WorldStorePlugin};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::AgentTestAppExt;
use bevy_agent_tools::{VisitClosed, WorldId};
use criterion::Criterion;
use parking_lot::Mutex;
use serde::Serialize;

const SESSION_BYTES: usize = 10 * 1024 * 1024;

#[derive(Serialize, Clone)]
struct Session {
    #[serde(skip)]
    world: WorldId,
    terrain: Terrain,
}

#[derive(Serialize, Clone)]
#[serde(untagged)]
enum Terrain {
    Cells(Vec<Cell>),
    Blob(String),
}

/// One placed block, as a game would keep it.
#[derive(Serialize, Clone)]
struct Cell {
    x: i32,
    y: i32,
    z: i32,
    block: &'static str,
    version: u64,
}

#[derive(Default, Clone)]
struct Timings {
    /// Main-thread time inside each `close`.
    close: Arc<Mutex<Vec<Duration>>>,
    /// When the last `close` started.
    close_started: Arc<Mutex<Option<Instant>>>,
    /// Start of `close` to durable, per save.
    durable: Arc<Mutex<Vec<Duration>>>,
    /// Plain write + fsync, per write.
    plain: Arc<Mutex<Vec<Duration>>>,
    /// Serialize + plain write + fsync, per write.
    serialize_plain: Arc<Mutex<Vec<Duration>>>,
}

struct BenchGame {
    terrain: Arc<Terrain>,
    timings: Timings,
}

impl WorldLifecycle for BenchGame {
    type Session = Session;

    fn open(&self, visit: &VisitInfo, _: &mut World) -> Result<Opened<Session>, OpenError> {
        Ok(Opened::ready(Session { world: visit.world.clone(), terrain: (*self.terrain).clone() }))
    }

    fn close(&self, session: Session, world: &mut World) -> Completion {
        let started = Instant::now();
        let world_id = session.world.clone();
        let completion = world.resource::<WorldStore>().save(&world_id, "terrain", session);
        self.timings.close.lock().push(started.elapsed());
        *self.timings.close_started.lock() = Some(started);
        completion
    }
}

fn blob() -> Terrain {
    // Printable ASCII that JSON does not escape: the serialized document is the session's size.
    Terrain::Blob((0..SESSION_BYTES).map(|i| (b'a' + (i % 26) as u8) as char).collect())
}

fn cells() -> Terrain {
    const BLOCKS: [&str; 5] = ["stone", "grass", "water", "oak_log", "glass"];
    let mut cells = Vec::new();
    let mut size = 0;
    let mut i: i64 = 0;
    while size < SESSION_BYTES {
        let cell = Cell {
            x: (i % 1000) as i32 - 500,
            y: (i / 1000 % 256) as i32,
            z: (i / 256_000) as i32 - 500,
            block: BLOCKS[(i % 5) as usize],
            version: (i * 7919 % 100_000) as u64,
        };
        size += serde_json::to_vec(&cell).unwrap().len() + 1;
        cells.push(cell);
        i += 1;
    }
    Terrain::Cells(cells)
}

fn persistence(c: &mut Criterion, shape: &str, terrain: Terrain, data: &tempfile::TempDir, timings: &Timings) {
    let terrain = Arc::new(terrain);
    let mut app = App::new();
    app.add_plugins(MinimalPlugins)
        .add_plugins(AgentToolsPlugin::new(BenchGame { terrain: terrain.clone(), timings: timings.clone() }))
        .add_plugins(WorldStorePlugin::new(data.path()));
    app.finish();
    app.cleanup();

    // The plain baseline writes what the store writes: the document as serialized.
    let document = serde_json::to_vec(&Session { world: WorldId::new("x"), terrain: (*terrain).clone() }).unwrap();
    let plain_path: PathBuf = data.path().join("plain.json");

    let mut group = c.benchmark_group(format!("persistence_10mb_{shape}"));
    group.sample_size(10);
    group.bench_function("plain_write_fsync", |b| {
        b.iter(|| {
            let started = Instant::now();
            let mut file = std::fs::File::create(&plain_path).unwrap();
            file.write_all(&document).unwrap();
            file.sync_all().unwrap();
            timings.plain.lock().push(started.elapsed());
        })
    });
    let session = Session { world: WorldId::new("x"), terrain: (*terrain).clone() };
    group.bench_function("serialize_write_fsync", |b| {
        b.iter(|| {
            let started = Instant::now();
            let bytes = serde_json::to_vec(&session).unwrap();
            let mut file = std::fs::File::create(&plain_path).unwrap();
            file.write_all(&bytes).unwrap();
            file.sync_all().unwrap();
            timings.serialize_plain.lock().push(started.elapsed());
        })
    });
    group.bench_function("close_to_durable", |b| {
        b.iter_custom(|iterations| {
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                app.enter_world(format!("bench-{shape}").as_str());
                app.exit_world();
                let closed: Vec<VisitClosed> =
                    app.world_mut().resource_mut::<Messages<VisitClosed>>().drain().collect();
                let completion = &closed.last().expect("the visit closed").completion;
                completion.wait().expect("the save succeeds");
                let started = timings.close_started.lock().take().expect("close ran");
                let elapsed = started.elapsed();
                timings.durable.lock().push(elapsed);
                total += elapsed;
            }
            total
        })
    });
    group.finish();
}

fn median(samples: &Mutex<Vec<Duration>>) -> Duration {
    let mut samples = samples.lock().clone();
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn summary(shape: &str, timings: &Timings) {
    let mut close = timings.close.lock().clone();
    close.sort();
    let max = close.last().copied().unwrap_or_default();
    let p95 = close.get(close.len() * 95 / 100).copied().unwrap_or_default();
    let (durable, plain) = (median(&timings.durable), median(&timings.plain));
    println!("\npersistence summary ({shape}: 10 MiB session, {} closes):", close.len());
    println!(
        "  main thread inside close: median {:?}, p95 {p95:?}, max {max:?} (target <= 1 ms)",
        median(&timings.close)
    );
    let serialize_plain = median(&timings.serialize_plain);
    println!("  close to durable: median {durable:?}; plain write+fsync: median {plain:?}");
    println!("  serialize + plain write+fsync: median {serialize_plain:?}");
    println!("  ratio close-to-durable / plain: {:.2}x (target <= 1.5x)", durable.as_secs_f64() / plain.as_secs_f64());
    println!(
        "  ratio close-to-durable / (serialize + plain): {:.2}x",
        durable.as_secs_f64() / serialize_plain.as_secs_f64()
    );
}

fn benches() {
    // The system temporary directory, or BENCH_DATA_DIR to measure another disk.
    let data = match std::env::var_os("BENCH_DATA_DIR") {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .unwrap();
    let mut criterion = Criterion::default().configure_from_args();
    for (shape, terrain) in [("cells", cells as fn() -> Terrain), ("blob", blob)] {
        let timings = Timings::default();
        persistence(&mut criterion, shape, terrain(), &data, &timings);
        summary(shape, &timings);
    }
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
