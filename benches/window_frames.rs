//! Frame time of the windowed sandbox (full `DefaultPlugins`, winit, Bevy's renderer on software Vulkan under
//! Xvfb) idle, with an agent placing 100 blocks per second over MCP, and with an agent reading the world 200
//! times per second (`get_block`, an `on_client` step each), in short interleaved phases of one run (each round
//! has the three; their order rotates every round, so no load always follows another), each figure pooled over
//! the rounds; and what re-meshing a chunk
//! costs the frame (its snapshot in `tick` and its mesh).
//!
//! ```sh
//! cargo bench --features window --bench window_frames
//! ```
//!
//! Needs xvfb and mesa-vulkan-drivers (tests/e2e/setup-window.sh). Prints two Markdown tables: pooled, then per phase.

#[path = "../tests/common/lines.rs"]
mod lines;
#[path = "common/rounds.rs"]
mod rounds;
#[path = "../tests/common/window.rs"]
mod window;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use rounds::Rounds;
use serde_json::{json, Value};
use window::{field, WindowedSandbox};

const TOKEN: &str = "window-bench-token-0123456789";
/// Short phases, many rounds: the machine's own state drifts over minutes (idle p99 moved 40% between runs minutes
/// apart), so each load is compared with idle frames from the same few seconds, and figures are pooled over rounds.
const ROUNDS: usize = 10;
const PHASE: Duration = Duration::from_secs(6);
const WARM_UP_FRAMES: usize = 150;
const WARM_UP_LOAD: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Idle,
    /// `place_block` 100 times a second, each changing a drawn chunk (so each is re-meshed), and each placed block
    /// broken half a second later (another 100 calls a second, each changing the chunk again).
    Place100,
    /// `get_block` 200 times a second.
    Read200,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Place100 => "100 place_block/s (+ 100 break_block/s)",
            Phase::Read200 => "200 get_block/s",
        }
    }
}

/// One phase's figures, from the sandbox's `frames` line.
struct Figures {
    phase: Phase,
    /// Every frame's time, ms.
    each: Vec<f64>,
    frames: usize,
    median: f64,
    p99: f64,
    calls: u64,
    failed: u64,
    host: (usize, f64, f64),
    snapshot: (usize, f64, f64),
    mesh: (usize, f64, f64),
}

type Client = RunningService<RoleClient, ()>;

fn build_sandbox() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the bench's own path");
    let profile_dir = exe.parent().and_then(std::path::Path::parent).expect("<target>/<profile>/deps/<bench>");
    let status = std::process::Command::new(env!("CARGO"))
        .args(["build", "--release", "--example", "sandbox", "--features", "window"])
        .env("CARGO_TARGET_DIR", profile_dir.parent().expect("<target>"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo build --release --example sandbox --features window failed");
    profile_dir.join("examples").join("sandbox")
}

fn params(tool: &str, arguments: Value) -> CallToolRequestParams {
    CallToolRequestParams::new(tool.to_string()).with_arguments(arguments.as_object().cloned().unwrap_or_default())
}

/// How long a placed block stays before the bench breaks it again: the scene every phase draws stays the same size
/// (at most this many seconds' worth of placed blocks), so a loaded phase is not compared with a lighter idle one.
const PLACED_FOR: Duration = Duration::from_millis(500);

/// Calls at `per_second` for `phase`'s length, each in its own task (a slow call does not slow the rate). In
/// `Place100`, every block placed is broken again `PLACED_FOR` later (those `break_block` calls come on top of the
/// 100 `place_block`/s), and the phase ends only when the last one is broken: the world after the phase is the
/// world before it.
async fn load(
    client: Arc<Client>,
    phase: Phase,
    length: Duration,
    at: (i32, i32, i32),
    counts: Arc<(AtomicU64, AtomicU64)>,
) {
    let per_second = match phase {
        Phase::Idle => return,
        Phase::Place100 => 100,
        Phase::Read200 => 200,
    };
    let (px, py, pz) = at;
    let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = tokio::time::Instant::now() + length;
    let mut calls = Vec::new();
    // Numbered across phases and rounds, so every placement is into a cell of its own.
    static NEXT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
    let call = move |request: CallToolRequestParams| {
        let (client, counts) = (client.clone(), counts.clone());
        tokio::spawn(async move {
            let failed = !matches!(client.call_tool(request).await, Ok(result) if result.is_error != Some(true));
            counts.0.fetch_add(1, Ordering::Relaxed);
            if failed {
                counts.1.fetch_add(1, Ordering::Relaxed);
            }
            !failed
        })
    };
    loop {
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        tick.tick().await;
        if tokio::time::Instant::now() >= end {
            break;
        }
        match phase {
            Phase::Place100 => {
                // A new cell each time, in the air over the 3×3 chunks around the player: every call places a block
                // (and so changes a drawn chunk), and half a second later breaks it (changing it again).
                let (x, z, y) = (px - 24 + i % 48, pz - 24 + (i / 48) % 48, (py + 8 + i / 2304).min(127));
                let placed = tokio::spawn({
                    let place = call(params("place_block", json!({"x": x, "y": y, "z": z, "block": "gold"})));
                    let break_it = params("break_block", json!({"x": x, "y": y, "z": z, "confirm": true}));
                    let call = call.clone();
                    async move {
                        // A place that failed (refused by the in-flight limit when slow frames keep more than
                        // 32 calls waiting) left nothing to break.
                        let placed = matches!(place.await, Ok(true));
                        if placed {
                            tokio::time::sleep(PLACED_FOR).await;
                            let _ = call(break_it).await;
                        }
                        placed
                    }
                });
                calls.push(placed);
            }
            _ => calls.push(call(params("get_block", json!({"x": px, "y": py - 1, "z": pz})))),
        }
    }
    for call in calls {
        let _ = call.await;
    }
}

/// `n=N median_ms=M p99_ms=P` after `label` in a `frames` line.
fn stats(line: &str, label: &str) -> (usize, f64, f64) {
    let part = line.split(label).nth(1).unwrap_or("");
    let number = |name: &str| field(part, name).parse::<f64>().unwrap_or(f64::NAN);
    (number("n") as usize, number("median_ms"), number("p99_ms"))
}

fn main() {
    if std::env::args().any(|arg| arg == "--list") {
        return;
    }
    let binary = build_sandbox();
    let dir = tempfile::tempdir().expect("a data directory");
    let mut sandbox = WindowedSandbox::start(&binary, dir.path(), TOKEN, "bench", &[]);
    sandbox.render_frames(WARM_UP_FRAMES);
    let at = sandbox.player();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("tokio");
    let config = StreamableHttpClientTransportConfig::with_uri(sandbox.url.clone()).auth_header(TOKEN);
    let connected = runtime.block_on(async { ().serve(StreamableHttpClientTransport::from_config(config)).await });
    let client = Arc::new(connected.expect("an MCP session"));
    // One unmeasured pass of each load first: the first calls' one-time costs (connections, allocations, the
    // renderer's first gold faces) are not any phase's.
    for phase in [Phase::Place100, Phase::Read200] {
        let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
        runtime.block_on(load(client.clone(), phase, WARM_UP_LOAD, at, counts));
    }

    let mut figures = Vec::new();
    for round in 0..ROUNDS {
        let mut phases = [Phase::Idle, Phase::Place100, Phase::Read200];
        phases.rotate_left(round % 3);
        for phase in phases {
            sandbox.command("frames");
            let counts = Arc::new((AtomicU64::new(0), AtomicU64::new(0)));
            match phase {
                Phase::Idle => std::thread::sleep(PHASE),
                _ => runtime.block_on(load(client.clone(), phase, PHASE, at, counts.clone())),
            }
            let line = sandbox.command("frames each");
            let (frames, median, p99) = stats(&line, "ok frames");
            let each = field(&line, "each_ms").split(',').filter_map(|t| t.parse().ok()).collect();
            let figure = Figures {
                phase,
                each,
                frames,
                median,
                p99,
                calls: counts.0.load(Ordering::Relaxed),
                failed: counts.1.load(Ordering::Relaxed),
                host: stats(&line, " host "),
                snapshot: stats(&line, " snapshot "),
                mesh: stats(&line, " mesh "),
            };
            eprintln!("round {round} {}: {}", phase.name(), line.split(" each_ms=").next().unwrap_or(""));
            figures.push(figure);
        }
    }
    sandbox.command("quit");
    sandbox.wait_exit();

    let phases = [Phase::Idle, Phase::Place100, Phase::Read200];
    let by_round = figures.chunks(3).map(|round| {
        phases.iter().map(|&phase| round.iter().filter(|f| f.phase == phase).flat_map(|f| f.each.clone()).collect())
    });
    let rounds = Rounds { phases: phases.map(Phase::name).to_vec(), frames: by_round.map(Iterator::collect).collect() };
    rounds.print_pooled("frame");
    println!();
    println!("| round | phase | frames | frame median | frame p99 | p99 / idle p99 (same round) | calls (failed) | host sets per frame: median, p99 | chunk snapshots: n, median, p99 | meshes: n, median, p99 |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for (i, f) in figures.iter().enumerate() {
        let idle = &figures[i - i % 3];
        println!(
            "| {} | {} | {} | {:.2} ms | {:.2} ms | {:.3} | {} ({}) | {:.3} ms, {:.3} ms | {}, {:.2} ms, {:.2} ms | {}, {:.2} ms, {:.2} ms |",
            i / 3 + 1,
            f.phase.name(),
            f.frames,
            f.median,
            f.p99,
            f.p99 / idle.p99,
            f.calls,
            f.failed,
            f.host.1,
            f.host.2,
            f.snapshot.0,
            f.snapshot.1,
            f.snapshot.2,
            f.mesh.0,
            f.mesh.1,
            f.mesh.2,
        );
    }
}
