//! Our MCP transport next to Bevy's remote protocol (BRP), served by ONE headless app and driven by the SAME
//! client: a minimal HTTP/1.1 client over `std::net::TcpStream` (keep-alive, `TCP_NODELAY`, one connection per
//! client), one request of each client per round, in an order that rotates every round, so that drift hits all
//! alike.
//!
//! - MCP 2025-11-25: `tools/call`s in a session (`initialize` once; then every request carries `Authorization`,
//!   `Mcp-Session-Id`, `MCP-Protocol-Version` and `Accept: application/json, text/event-stream`; the answer is an
//!   SSE stream, chunked) of two tools: `read`, which reads the same component of the same entity as BRP below in
//!   one `on_client` step (like for like: it needs the main thread), and `trivial`, which returns without
//!   touching the main thread.
//! - MCP 2026-07-28: the same calls, stateless (no session; protocol version, client info and capabilities in the
//!   request's `_meta`); the answer is plain JSON.
//! - BRP: a `world.get_components` of one reflected component of one entity (no authentication; a JSON answer).
//!   BRP answers in the frame after a request arrives (`RemoteLast`), so its latency follows the frame rate.
//!
//! Each phase has its own app, run by `AgentToolsRunnerPlugin::run_loop` (a frame every 16.7 ms or every 1 ms;
//! between frames it serves queued steps): with the default `StepPoints::AlsoBetweenFrames`, and at 60 fps also
//! with `StepPoints::OncePerFrame` (steps only in the frame's pump, where BRP's requests run too).
//! Needs the `brp-bench` feature: `cargo bench --features brp-bench --bench brp_comparison`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use bevy::prelude::*;
use bevy::reflect::TypePath;
use bevy_agent_tools::mcp::{McpPlugin, McpServer};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::headless_app_with;
use bevy_agent_tools::testing::CounterGame;
use bevy_agent_tools::{AgentToolsRunnerPlugin, NoArgs, StepPoints};
use bevy_remote::http::RemoteHttpPlugin;
use bevy_remote::RemotePlugin;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{json, Value};

const TOKEN: &str = "bench-token-0123456789abcdef";

/// The component BRP reads.
#[derive(Component, Reflect)]
#[reflect(Component)]
struct Position {
    x: f32,
    y: f32,
    z: f32,
}

// ---------------------------------------------------------------------------------------------------------------
// The one HTTP client both protocols go through.

/// The client's socket. With `quick_ack`, every read first sets `TCP_QUICKACK` (Linux), so the client ACKs at once
/// instead of delaying its ACKs (up to 40 ms on Linux): this is what takes Nagle's algorithm on a server socket
/// without `TCP_NODELAY` out of the figure.
struct Socket {
    stream: TcpStream,
    quick_ack: bool,
}

impl Read for Socket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.quick_ack {
            set_quick_ack(&self.stream);
        }
        self.stream.read(buf)
    }
}

#[cfg(target_os = "linux")]
fn set_quick_ack(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: a valid socket descriptor and a c_int option value of the given size.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_QUICKACK,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn set_quick_ack(_: &TcpStream) {}

struct Connection {
    reader: BufReader<Socket>,
    host: String,
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// When the body first held the answer (`answered` returned true); the response may go on after it (the end
    /// of an SSE stream).
    answered_at: Option<Instant>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }
}

impl Connection {
    fn open(address: SocketAddr, quick_ack: bool) -> Self {
        let stream = TcpStream::connect(address).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
        Self { reader: BufReader::new(Socket { stream, quick_ack }), host: address.to_string() }
    }

    /// One POST with keep-alive; reads the whole response (`Content-Length` or chunked), noting when the body
    /// read so far first satisfies `answered`.
    fn post(&mut self, path: &str, headers: &[(&str, &str)], body: &str, answered: &dyn Fn(&[u8]) -> bool) -> Response {
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
            self.host,
            body.len()
        );
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        request.push_str(body);
        self.reader.get_mut().stream.write_all(request.as_bytes()).expect("send");

        let mut line = String::new();
        self.reader.read_line(&mut line).expect("status line");
        let status = line.split_whitespace().nth(1).and_then(|code| code.parse().ok()).expect("status");
        let mut headers = Vec::new();
        loop {
            line.clear();
            self.reader.read_line(&mut line).expect("header");
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').expect("header line");
            headers.push((name.trim().to_string(), value.trim().to_string()));
        }
        let mut response = Response { status, headers, body: Vec::new(), answered_at: None };
        if let Some(length) = response.header("content-length") {
            let mut body = vec![0; length.parse().expect("length")];
            self.reader.read_exact(&mut body).expect("body");
            response.body = body;
            if answered(&response.body) {
                response.answered_at = Some(Instant::now());
            }
        } else if response.header("transfer-encoding").is_some_and(|coding| coding.contains("chunked")) {
            loop {
                line.clear();
                self.reader.read_line(&mut line).expect("chunk size");
                let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or("0"), 16).expect("size");
                if size == 0 {
                    line.clear();
                    self.reader.read_line(&mut line).expect("last CRLF");
                    break;
                }
                let start = response.body.len();
                response.body.resize(start + size, 0);
                self.reader.read_exact(&mut response.body[start..]).expect("chunk");
                if response.answered_at.is_none() && answered(&response.body) {
                    response.answered_at = Some(Instant::now());
                }
                let mut crlf = [0; 2];
                self.reader.read_exact(&mut crlf).expect("chunk CRLF");
            }
        }
        response
    }
}

/// Whether a body read so far holds the JSON-RPC message with `id` (complete: an SSE event ends with a blank line).
fn has_answer(body: &[u8], id: u64) -> bool {
    let Ok(text) = std::str::from_utf8(body) else { return false };
    let complete = text.trim_start().starts_with('{') || text.ends_with("\n\n");
    complete
        && (serde_json::from_str::<Value>(text).is_ok_and(|message| message["id"] == json!(id))
            || text
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .any(|data| serde_json::from_str::<Value>(data.trim()).is_ok_and(|message| message["id"] == json!(id))))
}

/// The JSON-RPC message with `id` in a response body: plain JSON, or an SSE stream's `data:` lines.
fn json_rpc_answer(body: &[u8], id: u64) -> Value {
    let text = std::str::from_utf8(body).expect("utf-8");
    let candidates = std::iter::once(text).chain(text.lines().filter_map(|line| line.strip_prefix("data:")));
    candidates
        .filter_map(|candidate| serde_json::from_str::<Value>(candidate.trim()).ok())
        .find(|message| message["id"] == json!(id))
        .unwrap_or_else(|| panic!("no answer with id {id} in {text}"))
}

// ---------------------------------------------------------------------------------------------------------------

struct Mcp {
    connection: Connection,
    path: String,
    /// `None`: MCP 2026-07-28, stateless (no session, protocol version and client in each request's `_meta`).
    session: Option<String>,
    next_id: u64,
}

impl Mcp {
    const PROTOCOL: &'static str = "2025-11-25";
    const STATELESS: &'static str = "2026-07-28";

    fn stateless(url: &str, address: SocketAddr, quick_ack: bool) -> Self {
        let path = url.trim_start_matches("http://").split_once('/').map(|(_, path)| format!("/{path}")).expect("path");
        Self { connection: Connection::open(address, quick_ack), path, session: None, next_id: 1 }
    }

    fn connect(url: &str, address: SocketAddr, quick_ack: bool) -> Self {
        let path = url.trim_start_matches("http://").split_once('/').map(|(_, path)| format!("/{path}")).expect("path");
        let mut connection = Connection::open(address, quick_ack);
        let bearer = format!("Bearer {TOKEN}");
        let accept = "application/json, text/event-stream";
        let initialize = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {
                "protocolVersion": Self::PROTOCOL,
                "capabilities": {},
                "clientInfo": { "name": "brp-comparison", "version": "0" }
            }
        });
        let response =
            connection
                .post(&path, &[("Authorization", &bearer), ("Accept", accept)], &initialize.to_string(), &|_| true);
        assert_eq!(response.status, 200, "initialize: {}", String::from_utf8_lossy(&response.body));
        let session = response.header("mcp-session-id").expect("a session id").to_string();
        json_rpc_answer(&response.body, 0)["result"].as_object().expect("initialize result");
        let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
        let response = connection.post(
            &path,
            &[
                ("Authorization", &bearer),
                ("Accept", accept),
                ("Mcp-Session-Id", &session),
                ("MCP-Protocol-Version", Self::PROTOCOL),
            ],
            &initialized.to_string(),
            &|_| true,
        );
        assert_eq!(response.status, 202, "initialized");
        Self { connection, path, session: Some(session), next_id: 1 }
    }

    /// Calls `tool` (no arguments). Returns (time to the answer, time to the end of the response).
    fn call(&mut self, tool: &str) -> (Duration, Duration) {
        let id = self.next_id;
        self.next_id += 1;
        let mut body = json!({
            "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": { "name": tool, "arguments": {} }
        });
        let bearer = format!("Bearer {TOKEN}");
        let mut headers = vec![("Authorization", bearer.as_str()), ("Accept", "application/json, text/event-stream")];
        match &self.session {
            Some(session) => {
                headers.extend([("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", Self::PROTOCOL)]);
            }
            None => {
                // 2026-07-28 names the method and the tool in headers too (plain ASCII needs no Base64).
                headers.extend([
                    ("MCP-Protocol-Version", Self::STATELESS),
                    ("Mcp-Method", "tools/call"),
                    ("Mcp-Name", tool),
                ]);
                body["params"]["_meta"] = json!({
                    "io.modelcontextprotocol/protocolVersion": Self::STATELESS,
                    "io.modelcontextprotocol/clientInfo": { "name": "brp-comparison", "version": "0" },
                    "io.modelcontextprotocol/clientCapabilities": {}
                });
            }
        }
        let body = body.to_string();
        let started = Instant::now();
        let response = self.connection.post(&self.path, &headers, &body, &|body| has_answer(body, id));
        let ended = started.elapsed();
        assert_eq!(response.status, 200, "{}", String::from_utf8_lossy(&response.body));
        let answer = json_rpc_answer(&response.body, id);
        assert_eq!(answer["result"]["isError"], json!(false), "{answer}");
        if tool == "read" {
            assert_eq!(answer["result"]["structuredContent"]["y"], json!(64.0), "{answer}");
        }
        (response.answered_at.expect("answered") - started, ended)
    }
}

struct Brp {
    connection: Connection,
    entity: u64,
    next_id: u64,
}

impl Brp {
    /// Returns (time to the answer, time to the end of the response).
    fn get_components(&mut self) -> (Duration, Duration) {
        let id = self.next_id;
        self.next_id += 1;
        let body = json!({
            "jsonrpc": "2.0", "id": id, "method": "world.get_components",
            "params": { "entity": self.entity, "components": [Position::type_path()] }
        })
        .to_string();
        let started = Instant::now();
        let response = self.connection.post("/", &[], &body, &|body| has_answer(body, id));
        let ended = started.elapsed();
        assert_eq!(response.status, 200);
        let answer = json_rpc_answer(&response.body, id);
        assert!(answer["result"]["components"][Position::type_path()].is_object(), "{answer}");
        (response.answered_at.expect("answered") - started, ended)
    }
}

// ---------------------------------------------------------------------------------------------------------------

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Ends the app from the bench's thread: a message on this channel writes `AppExit` in the next frame.
#[derive(Resource)]
struct Stop(crossbeam_channel::Receiver<()>);

fn stop_when_asked(stop: Res<Stop>, mut exits: MessageWriter<AppExit>) {
    if stop.0.try_recv().is_ok() {
        exits.write(AppExit::Success);
    }
}

/// How long each frame takes from the start of `First` to the start of the host's `Pump` (after `Update`): the
/// most a step point early in the frame could save a step that waited for the frame.
#[derive(Resource, Default)]
struct FrameTimeline {
    first: Option<Instant>,
    gaps: std::sync::Arc<std::sync::Mutex<Vec<Duration>>>,
}

fn frame_starts(mut timeline: ResMut<FrameTimeline>) {
    timeline.first = Some(Instant::now());
}

fn pump_starts(mut timeline: ResMut<FrameTimeline>) {
    if let Some(first) = timeline.first.take() {
        timeline.gaps.lock().expect("gaps").push(first.elapsed());
    }
}

/// The component, as the `read` tool returns it.
#[derive(Serialize, JsonSchema)]
struct ReadPosition {
    x: f32,
    y: f32,
    z: f32,
}

/// The request kinds, in the order they are reported.
const CLIENTS: [&str; 5] = [
    "mcp 2025-11-25 session   tools/call read",
    "mcp 2026-07-28 stateless tools/call read",
    "mcp 2025-11-25 session   tools/call trivial",
    "mcp 2026-07-28 stateless tools/call trivial",
    "brp world.get_components",
];

fn phase(label: &str, frame: Duration, points: StepPoints, quick_ack: bool, rounds: usize) {
    let brp_port = free_port();
    let (ready_tx, ready_rx) = crossbeam_channel::bounded(1);
    let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
    let gaps = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let timeline = FrameTimeline { first: None, gaps: gaps.clone() };
    let game = std::thread::Builder::new()
        .name("game".into())
        .spawn(move || {
            let trivial =
                AgentTool::new("trivial", "Returns at once.", |_: CallContext<u64>, _: NoArgs| async move { Ok(()) });
            let read = AgentTool::new(
                "read",
                "Reads the entity's Position on the main thread.",
                |ctx: CallContext<u64>, _: NoArgs| async move {
                    ctx.on_client(|world, _| {
                        let mut query = world.query::<&Position>();
                        let position = query.iter(world).next().expect("one entity");
                        ReadPosition { x: position.x, y: position.y, z: position.z }
                    })
                    .await
                },
            )
            .read_only();
            let mut app = headless_app_with(
                AgentToolsPlugin::new(CounterGame).step_points(points).with_tool(trivial).with_tool(read),
                (
                    McpPlugin::new().port(0).token(TOKEN),
                    RemotePlugin::default(),
                    RemoteHttpPlugin::default().with_port(brp_port),
                    AgentToolsRunnerPlugin::run_loop(frame),
                ),
            );
            app.register_type::<Position>();
            app.insert_resource(Stop(stop_rx))
                .insert_resource(timeline)
                .add_systems(First, (stop_when_asked, frame_starts))
                .add_systems(PostUpdate, pump_starts.before(AgentToolsSystems::Pump));
            app.world_mut().spawn(Position { x: 1.0, y: 64.0, z: -3.0 });
            app.world_mut().write_message(EnterWorld::new("bench"));
            app.update(); // Startup (BRP's server starts) and the world is open before anyone calls
            let entity = app.world_mut().query_filtered::<Entity, With<Position>>().single(app.world()).expect("one");
            let server = app.world().resource::<McpServer>();
            let _ = ready_tx.send((server.url().to_string(), server.address(), entity.to_bits()));
            app.run()
        })
        .expect("spawn the game thread");
    let (url, mcp_address, entity) = ready_rx.recv_timeout(Duration::from_secs(30)).expect("the game started");
    let brp_address: SocketAddr = ([127, 0, 0, 1], brp_port).into();
    let started = Instant::now();
    while TcpStream::connect(brp_address).is_err() {
        assert!(started.elapsed() < Duration::from_secs(10), "BRP did not start listening");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut sessions = Mcp::connect(&url, mcp_address, quick_ack);
    let mut stateless = Mcp::stateless(&url, mcp_address, quick_ack);
    let mut brp = Brp { connection: Connection::open(brp_address, quick_ack), entity, next_id: 1 };
    let mut request = |client: usize| match client {
        0 => sessions.call("read"),
        1 => stateless.call("read"),
        2 => sessions.call("trivial"),
        3 => stateless.call("trivial"),
        _ => brp.get_components(),
    };
    for _ in 0..50 {
        for client in 0..CLIENTS.len() {
            request(client);
        }
    }
    // Per client: (time to the answer, time to the end of the response) of every request.
    let mut timings: Vec<(Vec<Duration>, Vec<Duration>)> = vec![Default::default(); CLIENTS.len()];
    for round in 0..rounds {
        // One request of each, in an order that rotates every round, so that drift hits all alike.
        for turn in 0..CLIENTS.len() {
            let client = (round + turn) % CLIENTS.len();
            let (answer, end) = request(client);
            timings[client].0.push(answer);
            timings[client].1.push(end);
        }
    }
    let client = if quick_ack { "client ACKs at once (TCP_QUICKACK)" } else { "plain client (delayed ACKs)" };
    println!(
        "brp_comparison/{label} ({points:?}): {rounds} rotating rounds over keep-alive HTTP/1.1 on loopback, {client}"
    );
    for (what, series) in
        [("request sent -> JSON-RPC answer received", 0), ("request sent -> end of the HTTP response", 1)]
    {
        println!("  {what}:");
        let mut sorted: Vec<Vec<Duration>> = timings
            .iter()
            .map(|times| {
                let mut times = if series == 0 { times.0.clone() } else { times.1.clone() };
                times.sort();
                times
            })
            .collect();
        let brp = sorted.pop().expect("brp");
        let (brp_median, brp_p99) = (percentile(&brp, 0.5), percentile(&brp, 0.99));
        for (name, mcp) in CLIENTS.iter().zip(&sorted) {
            let (mcp_median, mcp_p99) = (percentile(mcp, 0.5), percentile(mcp, 0.99));
            println!(
                "    {name:<44} median {mcp_median:>10.2?}, p99 {mcp_p99:>10.2?}; ratio to brp: median {:.3}, p99 {:.3}",
                mcp_median.as_secs_f64() / brp_median.as_secs_f64(),
                mcp_p99.as_secs_f64() / brp_p99.as_secs_f64()
            );
        }
        println!("    {:<44} median {brp_median:>10.2?}, p99 {brp_p99:>10.2?}", CLIENTS[4]);
    }
    let _ = stop_tx.send(());
    let _ = game.join();
    let mut gaps = gaps.lock().expect("gaps").clone();
    gaps.sort();
    println!(
        "  frames: {}, start of First -> start of the Pump: median {:.1?}, p99 {:.1?}",
        gaps.len(),
        percentile(&gaps, 0.5),
        percentile(&gaps, 0.99)
    );
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let frame_60 = Duration::from_micros(16_667);
    let between = StepPoints::AlsoBetweenFrames;
    phase("60fps", frame_60, between, false, 300);
    phase("60fps", frame_60, between, true, 300);
    phase("60fps", frame_60, StepPoints::OncePerFrame, false, 300);
    phase("1000fps", Duration::from_millis(1), between, false, 600);
    phase("1000fps", Duration::from_millis(1), between, true, 2_000);
}
