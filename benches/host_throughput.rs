//! The host's own capacity, in process (no transport):
//!
//! - `agent_handle_trivial_calls`: `AgentHandle` calls per second of a trivial tool (no `on_client`), with many calls
//!   in flight from a few client threads while the game runs frames at 60 per second on the main thread.
//! - `pump_frame_100k_queued`: the time of one whole frame (`app.update()`, `MinimalPlugins` + the host) while
//!   100,000 `on_client` steps are queued, with the default 1 ms pump budget. Also printed, over a fixed number of
//!   frames: the whole frame's and the pump's own time (`PumpStats::last_frame_time`, the figure BENCHMARKS.md
//!   reports) as median, p99 and max, and steps pumped per frame.
//! - Memory per in-flight call with 10,000 calls in flight, and growth after they finish (a counting global
//!   allocator, sharded per thread so that counting does not serialize the throughput figure).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::CounterGame;
use bevy_agent_tools::testing::{headless_app, AgentTestAppExt, Gate};
use bevy_agent_tools::{Call, Conversation, NoArgs, PumpStats};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

// ---------------------------------------------------------------------------------------------------------------
// A counting allocator: live bytes, summed over per-thread shards (each on its own cache line).

const SHARDS: usize = 32;

#[repr(align(128))]
struct Shard(AtomicIsize);

#[allow(clippy::declare_interior_mutable_const)]
const SHARD: Shard = Shard(AtomicIsize::new(0));
static LIVE: [Shard; SHARDS] = [SHARD; SHARDS];
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MY_SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn shard() -> &'static AtomicIsize {
    let index = MY_SHARD
        .try_with(|slot| {
            if slot.get() == usize::MAX {
                slot.set(NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS);
            }
            slot.get()
        })
        .unwrap_or(0);
    &LIVE[index].0
}

fn live_bytes() -> isize {
    LIVE.iter().map(|shard| shard.0.load(Ordering::SeqCst)).sum()
}

struct Counting;

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        shard().fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        shard().fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        shard().fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Deserialize, JsonSchema)]
struct Steps {
    steps: usize,
}

/// The gate the `held` tool waits at; replaced for each round of the memory figure.
type SharedGate = Arc<Mutex<Gate>>;

/// A headless app with the default pump budget (1 ms) and tools `trivial`, `many` (N `on_client` steps) and
/// `held` (waits at the current gate). No per-conversation in-flight limit in the way.
fn app(gate: SharedGate) -> App {
    let trivial = AgentTool::new("trivial", "Returns at once.", |_: CallContext<u64>, _: NoArgs| async move { Ok(()) });
    let many = AgentTool::new("many", "Many steps.", |ctx: CallContext<u64>, args: Steps| async move {
        let steps: Vec<_> = (0..args.steps).map(|_| ctx.on_client(|_, n| *n += 1)).collect();
        for step in steps {
            step.await?;
        }
        Ok(())
    });
    let held = AgentTool::new("held", "Waits at the gate.", move |_: CallContext<u64>, _: NoArgs| {
        let gate = gate.lock().expect("gate").clone();
        async move {
            gate.pass().await;
            Ok(())
        }
    });
    let plugin = AgentToolsPlugin::new(CounterGame)
        .max_in_flight_per_conversation(1 << 20)
        .default_timeout(Duration::from_secs(600))
        .with_tool(trivial)
        .with_tool(many)
        .with_tool(held);
    let mut app = headless_app(plugin);
    app.enter_world("bench");
    app
}

// ---------------------------------------------------------------------------------------------------------------
// (a) calls per second

const CLIENTS: usize = 2;
const WINDOW: usize = 256;

/// `calls` trivial calls from `CLIENTS` threads, each keeping up to `window` calls in flight, while the main thread
/// runs a frame every 16.7 ms. Returns the wall time.
fn run_calls(app: &mut App, calls: usize, window: usize) -> Duration {
    let agent = app.agent();
    let started = Instant::now();
    std::thread::scope(|scope| {
        let clients: Vec<_> = (0..CLIENTS)
            .map(|client| {
                let conversation = agent.conversation(format!("client-{client}"));
                scope.spawn(move || {
                    let mut left = calls / CLIENTS;
                    let mut in_flight: Vec<Call> = Vec::with_capacity(window);
                    while left > 0 {
                        let batch = left.min(window);
                        in_flight.extend((0..batch).map(|_| conversation.call("trivial", json!({}))));
                        for call in in_flight.drain(..) {
                            call.wait_timeout(Duration::from_secs(30)).expect("resolved").expect("ok");
                        }
                        left -= batch;
                    }
                })
            })
            .collect();
        let mut next_frame = Instant::now();
        while clients.iter().any(|client| !client.is_finished()) {
            if Instant::now() >= next_frame {
                app.update();
                next_frame += Duration::from_micros(16_667);
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        for client in clients {
            client.join().expect("client");
        }
    });
    let elapsed = started.elapsed();
    app.update();
    elapsed
}

fn calls_per_second(c: &mut Criterion) {
    const CALLS: usize = 20_000;
    let mut app = app(SharedGate::default());
    // Warm-up: runtime threads, conversations, maps.
    run_calls(&mut app, CALLS, WINDOW);
    // Admission checks the conversation's in-flight limit against a count the visit's `LiveCalls` keeps per
    // conversation (no scan of the calls in flight). The rate still depends on the window (how many calls each
    // client thread keeps in flight, so how much work each thread wake-up finds): also measured with a small one.
    for window in [WINDOW, 16] {
        let mut rates = Vec::new();
        for _ in 0..5 {
            let calls = 200_000;
            let elapsed = run_calls(&mut app, calls, window);
            rates.push(calls as f64 / elapsed.as_secs_f64());
        }
        rates.sort_by(f64::total_cmp);
        println!(
            "host_throughput/agent_handle_trivial_calls: {CLIENTS} client threads x {window} in flight, 5 runs of \
             200,000 calls: median {:.0} calls/s (min {:.0}, max {:.0})",
            rates[2], rates[0], rates[4]
        );
    }
    let mut group = c.benchmark_group("host_throughput");
    group.throughput(Throughput::Elements(CALLS as u64));
    group.sample_size(20);
    group.bench_function("agent_handle_trivial_calls", |b| {
        b.iter_custom(|iterations| (0..iterations).map(|_| run_calls(&mut app, CALLS, WINDOW)).sum())
    });
    group.finish();
}

// ---------------------------------------------------------------------------------------------------------------
// (b) pump time per frame with 100,000 steps queued

const QUEUED: usize = 100_000;

/// Tops the queue up to `QUEUED` steps (a call of tool `many` for the missing ones) and waits until they are queued.
fn top_up(app: &App, conversation: &Conversation) {
    let queued = app.agent().queued_steps();
    if queued < QUEUED {
        conversation.call("many", json!({ "steps": QUEUED - queued })).detach();
        app.wait_for_queued_steps(QUEUED);
    }
}

/// The wall time of the host's `Pump` set (the pump itself and the messages it publishes), measured by two
/// systems right before and right after it.
#[derive(Resource, Default)]
struct PumpClock {
    started: Option<Instant>,
    last: Duration,
}

fn pump_started(mut clock: ResMut<PumpClock>) {
    clock.started = Some(Instant::now());
}

fn pump_ended(mut clock: ResMut<PumpClock>) {
    if let Some(started) = clock.started.take() {
        clock.last = started.elapsed();
    }
}

fn summary(mut times: Vec<Duration>) -> String {
    times.sort();
    let n = times.len();
    format!("median {:?}, p99 {:?}, max {:?}", times[n / 2], times[n * 99 / 100], times[n - 1])
}

fn pump_frame(c: &mut Criterion) {
    const FRAMES: usize = 300;
    let mut app = app(SharedGate::default());
    app.init_resource::<PumpClock>().add_systems(
        PostUpdate,
        (
            pump_started.after(AgentToolsSystems::Transitions).before(AgentToolsSystems::Pump),
            pump_ended.after(AgentToolsSystems::Pump),
        ),
    );
    let conversation = app.agent().conversation("pump");
    let mut empty = Vec::with_capacity(FRAMES);
    for _ in 0..FRAMES {
        let started = Instant::now();
        app.update();
        empty.push(started.elapsed());
    }
    let mut frames = Vec::with_capacity(FRAMES);
    let mut pumps = Vec::with_capacity(FRAMES);
    let mut pumped = Vec::with_capacity(FRAMES);
    let mut pump_only = Vec::with_capacity(FRAMES);
    for _ in 0..FRAMES {
        top_up(&app, &conversation);
        let started = Instant::now();
        app.update();
        frames.push(started.elapsed());
        pumps.push(app.world().resource::<PumpClock>().last);
        let stats = app.world().resource::<PumpStats>();
        pumped.push(stats.last_frame);
        pump_only.push(stats.last_frame_time);
    }
    pumped.sort();
    println!("host_throughput/pump_frame_100k_queued: {FRAMES} frames each, budget 1 ms (default)");
    println!("  whole frame, queue empty:          {}", summary(empty));
    println!("  whole frame, {QUEUED} steps queued: {}", summary(frames));
    println!("  Pump set only, {QUEUED} queued:     {}", summary(pumps));
    println!("  the pump itself (PumpStats):       {}", summary(pump_only));
    println!("  steps pumped per frame: median {} (min {}, max {})", pumped[FRAMES / 2], pumped[0], pumped[FRAMES - 1]);
    let mut group = c.benchmark_group("host_throughput");
    group.bench_function("pump_frame_100k_queued", |b| {
        b.iter_custom(|iterations| {
            let mut measured = Duration::ZERO;
            for _ in 0..iterations {
                top_up(&app, &conversation);
                let started = Instant::now();
                app.update();
                measured += started.elapsed();
            }
            measured
        })
    });
    group.finish();
}

// ---------------------------------------------------------------------------------------------------------------
// (c) memory per in-flight call

const IN_FLIGHT: usize = 10_000;

/// One round: `IN_FLIGHT` calls held at a fresh gate, then released. Returns (bytes while in flight, bytes after
/// they finished), both relative to `baseline`.
fn memory_round(app: &mut App, gate: &SharedGate, conversation: &Conversation, baseline: isize) -> (isize, isize) {
    let current = Gate::new();
    *gate.lock().expect("gate") = current.clone();
    let calls: Vec<Call> = (0..IN_FLIGHT).map(|_| conversation.call("held", json!({}))).collect();
    let started = Instant::now();
    while current.arrived() < IN_FLIGHT {
        assert!(started.elapsed() < Duration::from_secs(60), "handlers did not start");
        std::thread::sleep(Duration::from_millis(1));
    }
    app.update(); // the frame publishes the CallStarted messages, as a running game does
    let in_flight = live_bytes() - baseline;
    current.open();
    for call in &calls {
        call.wait_timeout(Duration::from_secs(30)).expect("resolved").expect("ok");
    }
    drop(calls);
    // Let the runtime retire finished tasks and the messages age out of Bevy's double buffer.
    std::thread::sleep(Duration::from_millis(50));
    app.step(4);
    (in_flight, live_bytes() - baseline)
}

fn memory(_: &mut Criterion) {
    let gate = SharedGate::default();
    let mut app = app(gate.clone());
    let conversation = app.agent().conversation("memory");
    // A warm-up round sizes the host's maps and the runtime's queues once.
    memory_round(&mut app, &gate, &conversation, 0);
    let baseline = live_bytes();
    let mut afters = Vec::new();
    for round in 1..=3 {
        let (in_flight, after) = memory_round(&mut app, &gate, &conversation, baseline);
        println!(
            "host_throughput/memory round {round}: {IN_FLIGHT} calls in flight hold {in_flight} bytes = {} bytes per \
             call (incl. the caller's `Call`, {} bytes); after they finished: {after:+} bytes vs the baseline",
            in_flight / IN_FLIGHT as isize,
            std::mem::size_of::<Call>()
        );
        afters.push(after);
    }
    println!("host_throughput/memory growth after rounds 1..3: {afters:?} bytes");
}

criterion_group!(benches, calls_per_second, pump_frame, memory);
criterion_main!(benches);
