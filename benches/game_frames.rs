//! Frame time of a game that works its CPU every frame, idle and with an agent calling over MCP at 200 calls per
//! second, in short rotating phases of one run, each figure pooled over the rounds.
//!
//! ```sh
//! cargo bench --bench game_frames
//! ```
//!
//! The game: a headless Bevy app at 60 frames per second (`AgentToolsRunnerPlugin`, the multi-threaded executor on
//! Bevy's task pools) whose frame simulates a flock: every frame it indexes the creatures in a spatial grid (one
//! system), steers each away from its neighbours in the 3×3 cells around it (in parallel over the task pool), and
//! moves them (in parallel). That is the CPU side of a game whose GPU draws: a few milliseconds of work per frame
//! on both cores, then the wait for the next frame. The agent: one rmcp client in this process (its own runtime
//! thread, one MCP 2025-11-25 session; with `BENCH_MCP_PROTOCOL=2026-07-28`, sessionless requests), calling
//! `read` (one creature's position, an `on_client` step) or `steer` (turns one creature by a small angle, an
//! `on_client` step that writes; speeds stay as they were, so the flock costs what it did) 200 times a second. The phases' order rotates every round.
//!
//! Frame time is the frame's work: from a schedule just before `First` to one just after `Last`, on the main
//! thread; steps served in the frame's pump are in it, those served in the wait between frames are not. "Late"
//! counts frames that started more than 1 ms after their slot although the frame before them fit in its own (any
//! cause: a step served between frames, or the OS waking the game thread late).
//! Prints two Markdown tables: pooled over the rounds (and each half of them), then per phase.

#[path = "common/rounds.rs"]
mod rounds;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bevy::app::MainScheduleOrder;
use bevy::ecs::schedule::ScheduleLabel;
use bevy::prelude::*;
use bevy_agent_tools::mcp::{McpPlugin, McpServer};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app_with, CounterGame};
use bevy_agent_tools::AgentToolsRunnerPlugin;
use rmcp::model::{CallToolRequestParams, ProtocolVersion};
use rmcp::service::RunningService;
use rmcp::service::{ClientLifecycleMode, ClientServiceExt};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use rounds::{quantile, Rounds};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

const TOKEN: &str = "game-frames-token-0123456789";
const FRAME: Duration = Duration::from_nanos(16_666_667);
const ROUNDS: usize = 10;
const PHASE: Duration = Duration::from_secs(6);
const WARM_UP: Duration = Duration::from_secs(5);
const CALLS_PER_SECOND: u32 = 200;

/// How many creatures, and the side of the square they live in: ~45 checked per creature (~16 in range), ~5 ms
/// of work per frame here.
const CREATURES: u32 = 8_000;
const SIDE: f32 = 160.0;
const CELL: f32 = 4.0;

#[derive(Component, Clone, Copy)]
struct Creature(u32);

#[derive(Component, Clone, Copy)]
struct Position(Vec2);

#[derive(Component, Clone, Copy)]
struct Velocity(Vec2);

/// Every creature's position by index, and the grid cells' members, rebuilt each frame.
#[derive(Resource, Default)]
struct Flock {
    positions: Vec<Vec2>,
    cells: HashMap<(i32, i32), Vec<u32>>,
    entities: Vec<Entity>,
}

fn cell_of(position: Vec2) -> (i32, i32) {
    ((position.x / CELL).floor() as i32, (position.y / CELL).floor() as i32)
}

fn spawn_flock(world: &mut World) {
    let mut flock = Flock { positions: vec![Vec2::ZERO; CREATURES as usize], ..default() };
    // A fixed pseudo-random layout (an LCG): every run simulates the same flock.
    let mut seed = 0x2545_f491_u64;
    let mut next = move || {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) as f32 / (1u64 << 31) as f32
    };
    for i in 0..CREATURES {
        let position = Vec2::new(next() * SIDE, next() * SIDE);
        let velocity = Vec2::new(next() - 0.5, next() - 0.5) * 4.0;
        flock.entities.push(world.spawn((Creature(i), Position(position), Velocity(velocity))).id());
    }
    world.insert_resource(flock);
}

/// One system: every creature into its cell.
fn index(mut flock: ResMut<Flock>, creatures: Query<(&Creature, &Position)>) {
    let flock = &mut *flock;
    for members in flock.cells.values_mut() {
        members.clear();
    }
    for (creature, position) in &creatures {
        flock.positions[creature.0 as usize] = position.0;
        flock.cells.entry(cell_of(position.0)).or_default().push(creature.0);
    }
}

/// In parallel: each creature turns away from the neighbours closer than a cell.
fn separate(flock: Res<Flock>, mut creatures: Query<(&Creature, &Position, &mut Velocity)>) {
    creatures.par_iter_mut().for_each(|(creature, position, mut velocity)| {
        let (cx, cy) = cell_of(position.0);
        let mut push = Vec2::ZERO;
        for dx in -1..=1 {
            for dy in -1..=1 {
                let Some(members) = flock.cells.get(&(cx + dx, cy + dy)) else { continue };
                for &other in members {
                    let away = position.0 - flock.positions[other as usize];
                    let squared = away.length_squared();
                    if other != creature.0 && squared < CELL * CELL && squared > 1e-6 {
                        push += away / squared;
                    }
                }
            }
        }
        velocity.0 = (velocity.0 + push * 0.05).clamp_length_max(4.0);
    });
}

/// In parallel: each creature moves, turning back at the square's edges.
fn integrate(time: Res<Time>, mut creatures: Query<(&mut Position, &mut Velocity)>) {
    let dt = time.delta_secs().min(0.05);
    creatures.par_iter_mut().for_each(|(mut position, mut velocity)| {
        position.0 += velocity.0 * dt;
        for axis in 0..2 {
            if !(0.0..SIDE).contains(&position.0[axis]) {
                velocity.0[axis] = -velocity.0[axis];
                position.0[axis] = position.0[axis].clamp(0.0, SIDE - 0.001);
            }
        }
    });
}

/// Each frame: when it started and how long its work took (ms).
#[derive(Resource, Clone, Default)]
struct Frames(Arc<Mutex<Vec<(Instant, f64)>>>);

#[derive(Resource)]
struct FrameStart(Instant);

/// Runs just before `First`: the frame starts.
#[derive(ScheduleLabel, Clone, Debug, PartialEq, Eq, Hash)]
struct FrameBegins;

/// Runs just after `Last`: the frame's work is done.
#[derive(ScheduleLabel, Clone, Debug, PartialEq, Eq, Hash)]
struct FrameDone;

fn frame_starts(mut start: ResMut<FrameStart>) {
    start.0 = Instant::now();
}

fn frame_ends(start: Res<FrameStart>, frames: Res<Frames>) {
    let work = start.0.elapsed().as_secs_f64() * 1e3;
    if let Ok(mut frames) = frames.0.lock() {
        frames.push((start.0, work));
    }
}

#[derive(Deserialize, JsonSchema)]
struct ReadArgs {
    /// The creature's index.
    creature: u32,
}

#[derive(Deserialize, JsonSchema)]
struct SteerArgs {
    /// The creature's index.
    creature: u32,
    /// How far to turn it, radians.
    turn: f32,
}

#[derive(Serialize, JsonSchema)]
struct Seen {
    x: f32,
    y: f32,
}

fn tools() -> [AgentTool<u64>; 2] {
    let read = AgentTool::new("read", "Where one creature is.", |ctx: CallContext<u64>, args: ReadArgs| async move {
        ctx.on_client(move |world, _| {
            let entity = world.resource::<Flock>().entities.get(args.creature as usize).copied();
            let position = entity.and_then(|entity| world.get::<Position>(entity)).map_or(Vec2::NAN, |p| p.0);
            Seen { x: position.x, y: position.y }
        })
        .await
    })
    .read_only();
    let steer = AgentTool::new("steer", "Turns one creature.", |ctx: CallContext<u64>, args: SteerArgs| async move {
        ctx.on_client(move |world, _| {
            let entity = world.resource::<Flock>().entities.get(args.creature as usize).copied();
            let mut turned = Vec2::NAN;
            if let Some(mut velocity) = entity.and_then(|entity| world.get_mut::<Velocity>(entity)) {
                velocity.0 = Vec2::from_angle(args.turn).rotate(velocity.0);
                turned = velocity.0;
            }
            Seen { x: turned.x, y: turned.y }
        })
        .await
    });
    [read, steer]
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Idle,
    Read,
    Steer,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Read => "200 read/s",
            Phase::Steer => "200 steer/s",
        }
    }
}

type Client = RunningService<RoleClient, ()>;

/// `CALLS_PER_SECOND` calls for `length`, each in its own task (a slow call does not slow the rate); returns
/// (calls, failed).
async fn load(client: Arc<Client>, phase: Phase, length: Duration) -> (u64, u64) {
    let tool = match phase {
        Phase::Idle => {
            tokio::time::sleep(length).await;
            return (0, 0);
        }
        Phase::Read => "read",
        Phase::Steer => "steer",
    };
    let failed = Arc::new(AtomicU64::new(0));
    let mut tick = tokio::time::interval(Duration::from_secs(1) / CALLS_PER_SECOND);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = tokio::time::Instant::now() + length;
    let mut calls = Vec::new();
    let mut i = 0u32;
    loop {
        tick.tick().await;
        if tokio::time::Instant::now() >= end {
            break;
        }
        i += 1;
        let creature = i.wrapping_mul(7919) % CREATURES;
        let arguments: Value = match phase {
            Phase::Steer => json!({"creature": creature, "turn": 0.1}),
            _ => json!({"creature": creature}),
        };
        let request = CallToolRequestParams::new(tool.to_string())
            .with_arguments(arguments.as_object().cloned().unwrap_or_default());
        let (client, failed) = (client.clone(), failed.clone());
        calls.push(tokio::spawn(async move {
            if !matches!(client.call_tool(request).await, Ok(result) if result.is_error != Some(true)) {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let count = calls.len() as u64;
    for call in calls {
        let _ = call.await;
    }
    (count, failed.load(Ordering::Relaxed))
}

struct Measured {
    phase: Phase,
    /// Each frame's work, ms.
    work: Vec<f64>,
    /// Frames that started more than 1 ms after their slot.
    late: usize,
    calls: u64,
    failed: u64,
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let frames = Frames::default();
    let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
    let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
    let recorded = frames.clone();
    let game = std::thread::Builder::new()
        .name("game".into())
        .spawn(move || {
            let [read, steer] = tools();
            let mut app = headless_app_with(
                AgentToolsPlugin::new(CounterGame).with_tool(read).with_tool(steer),
                (McpPlugin::new().port(0).token(TOKEN), AgentToolsRunnerPlugin::run_loop(FRAME)),
            );
            spawn_flock(app.world_mut());
            let mut order = app.world_mut().resource_mut::<MainScheduleOrder>();
            order.insert_before(First, FrameBegins);
            order.insert_after(Last, FrameDone);
            app.insert_resource(recorded)
                .insert_resource(FrameStart(Instant::now()))
                .add_systems(FrameBegins, frame_starts)
                .add_systems(Update, (index, separate, integrate).chain())
                .add_systems(FrameDone, frame_ends)
                .add_systems(First, move |mut exit: MessageWriter<AppExit>| {
                    if stop_rx.try_recv().is_ok() {
                        exit.write(AppExit::Success);
                    }
                });
            app.world_mut().write_message(EnterWorld::new("flock"));
            app.update();
            let _ = ready_tx.send(app.world().resource::<McpServer>().url().to_string());
            app.run()
        })
        .expect("spawn the game thread");
    let url = ready_rx.recv_timeout(Duration::from_secs(30)).expect("the game started");

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("tokio");
    let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(TOKEN);
    let modern = std::env::var("BENCH_MCP_PROTOCOL").is_ok_and(|version| version == "2026-07-28");
    eprintln!("MCP protocol: {}", if modern { "2026-07-28" } else { "2025-11-25" });
    let connected = runtime.block_on(async {
        let transport = StreamableHttpClientTransport::from_config(config);
        if modern {
            let mode = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
            ().serve_with_lifecycle(transport, mode).await
        } else {
            ().serve(transport).await
        }
    });
    let client = Arc::new(connected.expect("connected"));
    for phase in [Phase::Read, Phase::Steer] {
        runtime.block_on(load(client.clone(), phase, WARM_UP));
    }

    let mut measured = Vec::new();
    for round in 0..ROUNDS {
        let mut phases = [Phase::Idle, Phase::Read, Phase::Steer];
        phases.rotate_left(round % 3);
        for phase in phases {
            let from = Instant::now();
            let (calls, failed) = runtime.block_on(load(client.clone(), phase, PHASE));
            let to = Instant::now();
            let starts: Vec<(Instant, f64)> = match frames.0.lock() {
                Ok(frames) => frames.iter().filter(|(start, _)| *start >= from && *start < to).copied().collect(),
                Err(_) => Vec::new(),
            };
            let late = starts
                .windows(2)
                .filter(|pair| {
                    let fit = Duration::from_secs_f64(pair[0].1 / 1e3) <= FRAME;
                    fit && pair[1].0 - pair[0].0 > FRAME + Duration::from_millis(1)
                })
                .count();
            let mut work: Vec<f64> = starts.iter().map(|(_, work)| *work).collect();
            work.sort_by(f64::total_cmp);
            eprintln!(
                "round {round} {}: frames {} work median {:.2} ms p99 {:.2} ms late {late} calls {calls} ({failed} failed)",
                phase.name(),
                work.len(),
                quantile(&work, 0.5),
                quantile(&work, 0.99)
            );
            measured.push(Measured { phase, work, late, calls, failed });
        }
    }
    let _ = stop_tx.send(());
    drop(client);
    let _ = game.join();

    let phases = [Phase::Idle, Phase::Read, Phase::Steer];
    let by_round = measured.chunks(3).map(|round| {
        phases.iter().map(|&phase| round.iter().filter(|m| m.phase == phase).flat_map(|m| m.work.clone()).collect())
    });
    let rounds = Rounds { phases: phases.map(Phase::name).to_vec(), frames: by_round.map(Iterator::collect).collect() };
    rounds.print_pooled("work");
    println!();
    println!(
        "| round | phase | frames | work median | p99 | p99 / idle p99 (same round) | late frames | calls (failed) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (i, m) in measured.iter().enumerate() {
        let round = &measured[i - i % 3..i - i % 3 + 3];
        let Some(idle) = round.iter().find(|m| m.phase == Phase::Idle) else { continue };
        println!(
            "| {} | {} | {} | {:.2} ms | {:.2} ms | {:.3} | {} | {} ({}) |",
            i / 3 + 1,
            m.phase.name(),
            m.work.len(),
            quantile(&m.work, 0.5),
            quantile(&m.work, 0.99),
            quantile(&m.work, 0.99) / quantile(&idle.work, 0.99),
            m.late,
            m.calls,
            m.failed
        );
    }
}
