//! The world store under a 10 MB session, measured through the host: a `close` that saves the session.
//!
//! Two shapes of session, each serializing to 10 MiB of JSON: `cells`, a world of ~190,000 small records (what
//! game state usually is), and `blob`, one 10 MiB string (the worst case for streaming: `serde_json` scans a
//! string for escapes before writing any of it, so its encoding cannot overlap the disk). Each shape is saved
//! with both codecs the store offers, JSON and postcard. A third, `packed`, is `cells`' records written by the
//! game's own `serialize_with` in a fixed-size layout (21 bytes each) as one byte string, saved with postcard: what
//! a game whose state is bulk records can do when the encoder, not the disk, is a save's cost. And `records` is
//! `cells`' records saved as a sequence with `WorldStore::save_records`, which encodes runs of them on several
//! threads and writes them in order (the same bytes as the `Vec` through `save`).
//!
//! - `close_main_thread`: the time the main thread spends inside `close` (moving the snapshot into
//!   `WorldStore::save`); serialization and I/O run on the runtime. Target: ≤ 1 ms.
//! - `close_to_durable`: from the start of `close` until its completion resolved (data durable), against
//!   `plain_replace_fsync`, the like-for-like baseline: the same encoded bytes written to a new file in the same
//!   directory, fsynced, renamed over the previous one, and the directory fsynced, as the store does. Target
//!   ≤ 1.5×. What the store does beyond it: encoding, its envelope's header (one line, written last by seeking
//!   back), and keeping the previous save (a hard link and a rename, made durable by the same directory fsync). What it
//!   does not do inside the timing: free a file (the baseline's rename frees the file it replaces; the store frees
//!   the save from two saves ago after reporting the save, before the world's next operation).
//! - `plain_replace_free_later`: the same, but the file it replaces is freed after the directory fsync, untimed
//!   (hard-linked aside before the rename, unlinked after), as the store frees the save from two saves ago after
//!   reporting the save: freeing a file can cost as much as writing one (on a file system mounted with `discard`).
//! - `plain_write_fsync`: the old baseline, create-or-truncate the file in place, write, fsync (no rename, no
//!   directory fsync), kept for comparison with earlier figures.
//! - `encode_replace_fsync` adds the encoding (into memory first) to the like-for-like path, to separate the
//!   codec's cost from the store's.
//!
//! Criterion times the baselines; the main-thread time is recorded inside every `close` of `close_to_durable`
//! (criterion cannot plan iterations from a time that excludes most of the work), and a summary prints the
//! medians, p95 and p99 of every timed iteration and the ratios at the end.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bevy::ecs::message::Messages;
use bevy::prelude::*;
use bevy_agent_tools::persist::{Codec, WorldStore, WorldStorePlugin};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::AgentTestAppExt;
use bevy_agent_tools::{AgentRuntime, VisitClosed, WorldId};
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
    /// The same records as `Cells`, saved in the game's own fixed-size layout (`pack`) as one byte string.
    Packed(#[serde(serialize_with = "pack")] Vec<Cell>),
}

/// The palette `cells` draws from; a packed record stores a block's index in it.
const BLOCKS: [&str; 5] = ["stone", "grass", "water", "oak_log", "glass"];

/// Bytes per packed record: x, y, z (i32), the block's palette index (u8), version (u64), little-endian.
const PACKED_RECORD: usize = 4 + 4 + 4 + 1 + 8;

/// What a game whose state is mostly bulk records can do with any serde codec: write the records in its own
/// fixed-size layout into one buffer and hand the serializer bytes (postcard copies them behind a length).
fn pack<S: serde::Serializer>(cells: &[Cell], serializer: S) -> Result<S::Ok, S::Error> {
    let mut bytes = Vec::with_capacity(cells.len() * PACKED_RECORD);
    for cell in cells {
        let block = BLOCKS.iter().position(|name| *name == cell.block).unwrap_or(0) as u8;
        bytes.extend_from_slice(&cell.x.to_le_bytes());
        bytes.extend_from_slice(&cell.y.to_le_bytes());
        bytes.extend_from_slice(&cell.z.to_le_bytes());
        bytes.push(block);
        bytes.extend_from_slice(&cell.version.to_le_bytes());
    }
    serializer.serialize_bytes(&bytes)
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
    /// Like-for-like plain write: new file, fsync, rename, directory fsync.
    replace: Arc<Mutex<Vec<Duration>>>,
    /// The like-for-like plain write, freeing the file it replaced after the directory fsync (untimed).
    replace_free_later: Arc<Mutex<Vec<Duration>>>,
    /// Create-or-truncate in place, write, fsync.
    in_place: Arc<Mutex<Vec<Duration>>>,
    /// Encode, then the like-for-like plain write.
    encode_replace: Arc<Mutex<Vec<Duration>>>,
    /// Size of the encoded document.
    bytes: Arc<Mutex<usize>>,
}

struct BenchGame {
    terrain: Arc<Terrain>,
    timings: Timings,
    /// Saves the cells with `WorldStore::save_records` (encoded on several threads) instead of `save`.
    as_records: bool,
}

impl WorldLifecycle for BenchGame {
    type Session = Session;

    fn open(&self, visit: &VisitInfo, world: &mut World) -> Result<Opened<Session>, OpenError> {
        // A game reads its saved state when the world opens (the lifecycle pattern of `persist`), so the store knows
        // the save its next save replaces is intact and does not read it again to check. Read here, untimed, and
        // waited for: the bench's session is its own (postcard cannot decode the bench's untagged enum, which this
        // load need not: the file is read and checked either way).
        let store = world.resource::<WorldStore>().clone();
        let runtime = world.resource::<AgentRuntime>().handle().clone();
        let _ = runtime.block_on(store.load::<serde::de::IgnoredAny>(&visit.world, "terrain"));
        Ok(Opened::ready(Session { world: visit.world.clone(), terrain: (*self.terrain).clone() }))
    }

    fn close(&self, session: Session, world: &mut World) -> Completion {
        let started = Instant::now();
        let world_id = session.world.clone();
        let store = world.resource::<WorldStore>();
        let completion = match session.terrain {
            Terrain::Cells(cells) if self.as_records => store.save_records(&world_id, "terrain", cells),
            _ => store.save(&world_id, "terrain", session),
        };
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
    Terrain::Cells(records())
}

fn packed() -> Terrain {
    Terrain::Packed(records())
}

/// ~190,000 records whose JSON is 10 MiB.
fn records() -> Vec<Cell> {
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
    cells
}

/// What the store writes for the session, encoded on one thread: the session, or (`as_records`) its cells alone.
fn encode(codec: Codec, session: &Session, as_records: bool) -> Vec<u8> {
    match (&session.terrain, as_records) {
        (Terrain::Cells(cells), true) => encode_value(codec, cells),
        _ => encode_value(codec, session),
    }
}

fn encode_value<T: Serialize>(codec: Codec, value: &T) -> Vec<u8> {
    match codec {
        Codec::Json => serde_json::to_vec(value).unwrap(),
        Codec::Postcard => postcard::to_stdvec(value).unwrap(),
        _ => unreachable!("the bench knows json and postcard"),
    }
}

/// What the store does to the file system, without the store: a new file, written, fsynced, renamed over the
/// last one, and the directory fsynced.
fn replace_durably(dir: &Path, bytes: &[u8]) {
    let temporary = dir.join(".plain.tmp");
    let mut file = std::fs::File::create(&temporary).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
    std::fs::rename(&temporary, dir.join("plain.bin")).unwrap();
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
}

/// [`replace_durably`], but what it replaces is hard-linked aside first, so the rename frees nothing: returns the
/// link, to remove after the timing.
fn replace_durably_freeing_later(dir: &Path, bytes: &[u8]) -> PathBuf {
    let aside = dir.join(".plain.aside");
    let _ = std::fs::remove_file(&aside);
    let temporary = dir.join(".plain.tmp");
    let mut file = std::fs::File::create(&temporary).unwrap();
    file.write_all(bytes).unwrap();
    file.sync_all().unwrap();
    let _ = std::fs::hard_link(dir.join("plain.bin"), &aside);
    std::fs::rename(&temporary, dir.join("plain.bin")).unwrap();
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
    aside
}

fn persistence(c: &mut Criterion, case: &str, codec: Codec, terrain: Terrain, data: &Path, timings: &Timings) {
    let terrain = Arc::new(terrain);
    let as_records = case.starts_with("records");
    let game = BenchGame { terrain: terrain.clone(), timings: timings.clone(), as_records };
    let mut app = App::new();
    app.add_plugins(MinimalPlugins)
        .add_plugins(AgentToolsPlugin::new(game))
        .add_plugins(WorldStorePlugin::new(data).codec(codec));
    app.finish();
    app.cleanup();

    // The plain baselines write what the store writes: the document as encoded.
    let session = Session { world: WorldId::new("x"), terrain: (*terrain).clone() };
    let document = encode(codec, &session, as_records);
    *timings.bytes.lock() = document.len();
    let plain_dir = data.join(format!("plain-{case}"));
    std::fs::create_dir_all(&plain_dir).unwrap();
    let in_place_path: PathBuf = plain_dir.join("in-place.bin");

    let mut group = c.benchmark_group(format!("persistence_10mb_{case}"));
    group.sample_size(10);
    group.bench_function("plain_write_fsync", |b| {
        b.iter(|| {
            let started = Instant::now();
            let mut file = std::fs::File::create(&in_place_path).unwrap();
            file.write_all(&document).unwrap();
            file.sync_all().unwrap();
            timings.in_place.lock().push(started.elapsed());
        })
    });
    group.bench_function("plain_replace_fsync", |b| {
        b.iter(|| {
            let started = Instant::now();
            replace_durably(&plain_dir, &document);
            timings.replace.lock().push(started.elapsed());
        })
    });
    group.bench_function("plain_replace_free_later", |b| {
        b.iter_custom(|iterations| {
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                let started = Instant::now();
                let aside = replace_durably_freeing_later(&plain_dir, &document);
                let elapsed = started.elapsed();
                let _ = std::fs::remove_file(aside);
                timings.replace_free_later.lock().push(elapsed);
                total += elapsed;
            }
            total
        })
    });
    group.bench_function("encode_replace_fsync", |b| {
        b.iter(|| {
            let started = Instant::now();
            let bytes = encode(codec, &session, as_records);
            replace_durably(&plain_dir, &bytes);
            timings.encode_replace.lock().push(started.elapsed());
        })
    });
    group.bench_function("close_to_durable", |b| {
        b.iter_custom(|iterations| {
            let mut total = Duration::ZERO;
            for _ in 0..iterations {
                app.enter_world(format!("bench-{case}").as_str());
                app.exit_world();
                let closed: Vec<VisitClosed> =
                    app.world_mut().resource_mut::<Messages<VisitClosed>>().drain().collect();
                let completion = &closed.last().expect("the visit closed").completion;
                completion.wait().expect("the save succeeds");
                let started = timings.close_started.lock().take().expect("close ran");
                let elapsed = started.elapsed();
                timings.durable.lock().push(elapsed);
                total += elapsed;
                // Untimed, as the freeing baseline's unlink: the store frees the save from two saves ago after
                // reporting this one, and the world's next save would wait for that.
                app.world().resource::<WorldStore>().flush().wait().expect("nothing failed");
            }
            total
        })
    });
    group.finish();
}

/// Median, p95 and p99 (nearest rank) of every timed iteration.
fn percentiles(samples: &Mutex<Vec<Duration>>) -> [Duration; 3] {
    let mut samples = samples.lock().clone();
    samples.sort();
    let at = |q: usize| {
        let rank = (samples.len() * q).div_ceil(100).max(1);
        samples.get(rank - 1).copied().unwrap_or_default()
    };
    [at(50), at(95), at(99)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

fn line(name: &str, samples: &Mutex<Vec<Duration>>) -> Duration {
    let [median, p95, p99] = percentiles(samples);
    println!("  {name}: median {}, p95 {}, p99 {} ({} runs)", ms(median), ms(p95), ms(p99), samples.lock().len());
    median
}

fn summary(case: &str, timings: &Timings) {
    // A case a filter left out timed nothing: no summary of nothing.
    if timings.durable.lock().is_empty() || timings.replace.lock().is_empty() {
        return;
    }
    let [close, close_p95, _] = percentiles(&timings.close);
    let max = timings.close.lock().iter().max().copied().unwrap_or_default();
    println!("\npersistence summary ({case}: 10 MiB session as JSON, {} bytes encoded):", *timings.bytes.lock());
    println!("  main thread inside close: median {close:?}, p95 {close_p95:?}, max {max:?} (target <= 1 ms)");
    let durable = line("close to durable", &timings.durable);
    let replace = line("plain replace (new file, fsync, rename, dir fsync)", &timings.replace);
    let free_later = line("plain replace, freeing the old file after (untimed)", &timings.replace_free_later);
    let in_place = line("plain write+fsync in place", &timings.in_place);
    let encode_replace = line("encode + plain replace", &timings.encode_replace);
    let ratio = |base: Duration| durable.as_secs_f64() / base.as_secs_f64();
    println!("  ratio close-to-durable / plain replace: {:.2}x (target <= 1.5x)", ratio(replace));
    println!("  ratio close-to-durable / plain replace freeing later: {:.2}x", ratio(free_later));
    println!("  ratio close-to-durable / plain write in place: {:.2}x", ratio(in_place));
    println!("  ratio close-to-durable / (encode + plain replace): {:.2}x", ratio(encode_replace));
}

fn benches() {
    // The system temporary directory, or BENCH_DATA_DIR to measure another disk.
    let data = match std::env::var_os("BENCH_DATA_DIR") {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .unwrap();
    let mut criterion = Criterion::default().configure_from_args();
    let shapes = [("cells", cells as fn() -> Terrain), ("records", cells), ("blob", blob), ("packed", packed)];
    for (shape, terrain) in shapes {
        // Packed records are bytes: JSON would write them as an array of numbers, which no game would choose.
        let codecs = if shape == "packed" { &[Codec::Postcard][..] } else { &[Codec::Json, Codec::Postcard][..] };
        for &codec in codecs {
            let timings = Timings::default();
            let case = format!("{shape}_{codec}");
            persistence(&mut criterion, &case, codec, terrain(), data.path(), &timings);
            summary(&case, &timings);
        }
    }
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
