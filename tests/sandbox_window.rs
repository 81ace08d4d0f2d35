//! The windowed sandbox (`--features window`, `--window`) as a player and an agent see it: a real Bevy window
//! with full `DefaultPlugins` on an X server of its own (Xvfb) with software Vulkan (Mesa's lavapipe). An agent
//! places blocks over MCP and the test reads Bevy's screenshots of the window; it presses keys through XTEST, and
//! closes the window the way a window manager does (`WM_DELETE_WINDOW`).
//!
//! Needs `xvfb` and `mesa-vulkan-drivers` (`.ci/run` installs them). Screenshots are kept under
//! `<target>/tmp/sandbox_window/` for a person to look at.

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use x11rb::connection::Connection;
use x11rb::protocol::xproto::{AtomEnum, ClientMessageEvent, ConnectionExt as _, EventMask, InputFocus, Window};
use x11rb::protocol::xtest::ConnectionExt as _;
use x11rb::rust_connection::RustConnection;
use x11rb::wrapper::ConnectionExt as _;

use common::window::{WindowedSandbox, WAIT};

const TOKEN: &str = "window-test-token-0123456789";
const TITLE: &str = "bevy_agent_tools sandbox";
/// `gold` in assets/palette.json: no terrain block looks like it.
const GOLD: [u8; 3] = [249, 212, 62];
/// Frames the window renders before screenshots are trusted (the first ~100 can come out black).
const WARM_UP_FRAMES: usize = 120;

/// One software-rendered window at a time: two would share two cores and each take twice as long.
static ONE_WINDOW: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The windowed sandbox, and where its screenshots go.
struct Sandbox {
    run: WindowedSandbox,
    shots: PathBuf,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl Sandbox {
    fn start(data_dir: &Path, shots: &str, extra: &[String]) -> Self {
        let turn = ONE_WINDOW.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let binary = common::example_with("sandbox", &["window"]);
        let run = WindowedSandbox::start(&binary, data_dir, TOKEN, "alpha", extra);
        let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sandbox_window").join(shots);
        std::fs::create_dir_all(&shots).expect("a folder for the screenshots");
        Self { run, shots, _turn: turn }
    }

    /// A screenshot of the window, through Bevy, decoded.
    fn screenshot(&mut self, name: &str) -> Picture {
        let path = self.shots.join(format!("{name}.png"));
        let answer = self.run.command(&format!("screenshot {}", path.display()));
        assert!(answer.starts_with("ok screenshot"), "{answer}");
        Picture::read(&path)
    }

    /// `hud` until its text satisfies `wanted`.
    fn hud_until(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + WAIT;
        loop {
            let hud = self.run.command("hud");
            if wanted(&hud) {
                return hud;
            }
            assert!(Instant::now() < until, "the HUD never showed {what}: {hud}");
        }
    }
}

/// A screenshot's pixels.
struct Picture {
    width: usize,
    height: usize,
    rgb: Vec<u8>,
}

impl Picture {
    fn read(path: &Path) -> Self {
        let file = std::fs::File::open(path).expect("the screenshot was written");
        let mut decoder = png::Decoder::new(std::io::BufReader::new(file));
        decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
        let mut reader = decoder.read_info().expect("a PNG");
        let mut buffer = vec![0; reader.output_buffer_size().expect("a sane size")];
        let info = reader.next_frame(&mut buffer).expect("one frame");
        let channels = info.color_type.samples();
        let rgb = buffer[..info.buffer_size()].chunks(channels).flat_map(|p| [p[0], p[1], p[2]]).collect();
        Self { width: info.width as usize, height: info.height as usize, rgb }
    }

    /// Pixels within `tolerance` of `colour`, as (x, y).
    fn matching(&self, colour: [u8; 3], tolerance: u8) -> Vec<(usize, usize)> {
        self.rgb
            .chunks(3)
            .enumerate()
            .filter(|(_, p)| p.iter().zip(colour).all(|(a, b)| a.abs_diff(b) <= tolerance))
            .map(|(i, _)| (i % self.width, i / self.width))
            .collect()
    }

    /// How many distinct colours the picture has (a black or empty frame has one or two).
    fn colours(&self) -> usize {
        let mut seen: Vec<[u8; 3]> = self.rgb.chunks(3).map(|p| [p[0], p[1], p[2]]).collect();
        seen.sort_unstable();
        seen.dedup();
        seen.len()
    }
}

type Client = RunningService<RoleClient, ()>;

async fn connect(url: &str) -> Client {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(TOKEN),
    );
    ().serve(transport).await.expect("an MCP session")
}

async fn call(client: &Client, tool: &str, arguments: Value) -> Value {
    let params =
        CallToolRequestParams::new(tool.to_string()).with_arguments(arguments.as_object().cloned().unwrap_or_default());
    let result = client.call_tool(params).await.expect("tools/call answers");
    assert_ne!(result.is_error, Some(true), "{tool} failed: {result:?}");
    result.structured_content.unwrap_or(Value::Null)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime")
}

/// The X side: the sandbox's window, keys pressed through XTEST, and the window manager's close request.
struct X {
    conn: RustConnection,
    root: Window,
    window: Window,
}

impl X {
    fn connect(display: &str) -> Self {
        let (conn, screen) = x11rb::connect(Some(display)).expect("the test connects to its X server");
        let root = conn.setup().roots[screen].root;
        let window = find_window(&conn, root, TITLE).expect("the sandbox's window exists");
        Self { conn, root, window }
    }

    /// Gives the window the keyboard (there is no window manager to do it).
    fn focus(&self) {
        self.conn.set_input_focus(InputFocus::PARENT, self.window, x11rb::CURRENT_TIME).expect("focus");
        self.conn.sync().expect("X answers");
    }

    /// Presses and releases the key that types `keysym` (a Latin-1 character or an X keysym).
    fn key(&self, keysym: u32) {
        let setup = self.conn.setup();
        let (first, count) = (setup.min_keycode, setup.max_keycode - setup.min_keycode + 1);
        let mapping = self.conn.get_keyboard_mapping(first, count).expect("request").reply().expect("a keymap");
        let per = usize::from(mapping.keysyms_per_keycode);
        let index = mapping.keysyms.iter().position(|sym| *sym == keysym).expect("the key is on the keyboard");
        let keycode = first + (index / per) as u8;
        for kind in [x11rb::protocol::xproto::KEY_PRESS_EVENT, x11rb::protocol::xproto::KEY_RELEASE_EVENT] {
            self.conn.xtest_fake_input(kind, keycode, x11rb::CURRENT_TIME, self.root, 0, 0, 0).expect("XTEST");
        }
        self.conn.sync().expect("X answers");
    }

    fn type_text(&self, text: &str) {
        for c in text.chars() {
            self.key(u32::from(c));
        }
    }

    /// What a window manager sends when the player clicks the close button.
    fn close(&self) {
        let atom =
            |name: &str| self.conn.intern_atom(false, name.as_bytes()).expect("request").reply().expect("atom").atom;
        let (protocols, delete) = (atom("WM_PROTOCOLS"), atom("WM_DELETE_WINDOW"));
        let event = ClientMessageEvent::new(32, self.window, protocols, [delete, x11rb::CURRENT_TIME, 0, 0, 0]);
        self.conn.send_event(false, self.window, EventMask::NO_EVENT, event).expect("send the close request");
        self.conn.sync().expect("X answers");
    }
}

const XK_RETURN: u32 = 0xff0d;

fn find_window(conn: &RustConnection, root: Window, title: &str) -> Option<Window> {
    let tree = conn.query_tree(root).ok()?.reply().ok()?;
    for window in tree.children {
        let name = conn.get_property(false, window, AtomEnum::WM_NAME, AtomEnum::ANY, 0, 256).ok()?.reply().ok()?;
        if name.value == title.as_bytes() {
            return Some(window);
        }
        if let Some(found) = find_window(conn, window, title) {
            return Some(found);
        }
    }
    None
}

#[test]
fn window_shows_an_agents_blocks_the_frame_after_its_step_and_the_hud_shows_its_calls() {
    let dir = tempfile::tempdir().expect("a data directory");
    let mut sandbox = Sandbox::start(dir.path(), "blocks", &[]);
    sandbox.run.render_frames(WARM_UP_FRAMES);
    let before = sandbox.screenshot("1-before");
    assert!(before.colours() > 20, "the window renders the world (not a black or empty frame)");
    assert_eq!(before.matching(GOLD, 3).len(), 0, "no gold before the agent places it");

    // The agent places a 3×3 gold slab floating beside the player, over MCP.
    let (px, py, pz) = sandbox.run.player();
    let runtime = runtime();
    let client = runtime.block_on(connect(&sandbox.run.url));
    for (dx, dz) in (2..=4).flat_map(|dx| (-1..=1).map(move |dz| (dx, dz))) {
        let at = json!({"x": px + dx, "y": py + 3, "z": pz + dz, "block": "gold"});
        runtime.block_on(call(&client, "place_block", at));
    }
    // The first screenshot after the last call returned already shows all of it: the step ran in a frame, the
    // next frame's tick re-meshed the chunk, and the screenshot is of that frame or a later one.
    let after = sandbox.screenshot("2-gold-placed");
    let gold = after.matching(GOLD, 3);
    assert!(gold.len() > 150, "the gold slab's top faces show in the palette's colour ({} pixels)", gold.len());
    let (cx, cy) = gold.iter().fold((0, 0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (cx, cy) = (cx / gold.len(), cy / gold.len());
    let (w, h) = (after.width, after.height);
    assert!(
        (w / 4..w * 3 / 4).contains(&cx) && (h / 6..h * 5 / 6).contains(&cy),
        "the slab is beside the player, whom the camera centres: its middle is at ({cx}, {cy}) of {w}×{h}"
    );
    let hud = sandbox.hud_until("the finished calls", |hud| hud.contains("place_block ok"));
    assert!(hud.contains("world alpha") && hud.contains("overworld") && hud.contains("rev#0"), "{hud}");
    assert!(hud.contains("mcp-session:"), "the HUD names the agent's conversation: {hud}");
    assert!(hud.contains(&format!("mcp {}", sandbox.run.url)), "the HUD says where agents connect: {hud}");

    // A long tool in flight shows its progress; travelling stops it, on screen too.
    let tower = json!({"x": px - 3, "z": pz - 3, "height": 64, "block": "brick"});
    let url = sandbox.run.url.clone();
    let building = runtime.spawn({
        async move {
            let client = connect(&url).await;
            let params = CallToolRequestParams::new("build_tower".to_string())
                .with_arguments(tower.as_object().cloned().unwrap_or_default());
            client.call_tool(params).await.expect("tools/call answers")
        }
    });
    let hud = sandbox.hud_until("the tower's progress", |hud| hud.contains("build_tower") && hud.contains("/64"));
    assert!(hud.contains("calls in flight: 1"), "{hud}");
    let answer = sandbox.run.command("travel nether");
    assert_eq!(answer, "ok traveling to the nether");
    let stopped = runtime.block_on(building).expect("the call task");
    assert_eq!(stopped.is_error, Some(true), "travel ends the tower: {stopped:?}");
    let hud = sandbox.hud_until("the tower stopped", |hud| hud.contains("build_tower LOCATION_CHANGED"));
    assert!(hud.contains("nether") && hud.contains("rev#1") && hud.contains("calls in flight: 0"), "{hud}");
    sandbox.run.render_frames(10);
    let nether = sandbox.screenshot("3-nether");
    assert_eq!(nether.matching(GOLD, 3).len(), 0, "the overworld's gold is not drawn in the nether");

    assert_eq!(sandbox.run.command("quit"), "ok quitting");
    assert!(sandbox.run.wait_exit().success());
    eprintln!("screenshots: {}", sandbox.shots.display());
}

#[test]
fn window_keys_chat_with_the_agent_walk_travel_and_closing_the_window_quits_after_the_save() {
    let dir = tempfile::tempdir().expect("a data directory");
    // Built with the same features as the sandbox, so the crate is built once for both.
    let agent = common::example_with("scripted_acp_agent", &["window"]);
    let agent = format!("{} --state '{}'", agent.display(), dir.path().join("agent-state").display());
    let flags = ["--agent".to_string(), agent, "--ask-permissions".to_string()];
    let mut sandbox = Sandbox::start(dir.path(), "keys", &flags);
    sandbox.run.seen_or_until("the session", |line| line.starts_with("chat-status") && line.contains("status=idle"));
    sandbox.run.render_frames(WARM_UP_FRAMES);
    let x = X::connect(&sandbox.run.xvfb.display.clone());
    x.focus();

    // T opens the chat panel; the typed line goes to the agent with Enter; its reply streams into the panel.
    x.type_text("t");
    x.type_text("hello there");
    x.key(XK_RETURN);
    sandbox.run.until("the agent's reply", |line| line.starts_with("chat session="));
    let hud = sandbox.hud_until("the reply in the panel", |hud| hud.contains("agent: "));
    assert!(hud.contains("you: hello there"), "the panel shows what the player typed: {hud}");
    let panel = sandbox.screenshot("1-chat-panel");
    assert!(panel.colours() > 20);

    // The agent asks permission: the panel shows the prompt, and N denies it.
    x.type_text("ask");
    x.key(XK_RETURN);
    sandbox.run.until("the request", |line| line.starts_with("chat-permission "));
    let hud = sandbox.hud_until("the prompt", |hud| hud.contains("Y allow, N deny"));
    // Its title, and what it takes as the agent sent it (the title alone may not say it).
    let asked = r#"run rm -rf / {"command":"rm -rf /"}"#;
    assert!(hud.contains(asked), "the prompt names what the agent wants to do: {hud}");
    sandbox.screenshot("2-permission-prompt");
    x.type_text("n");
    let verdict = sandbox.run.until("the agent's verdict", |line| line.contains("permission: "));
    assert!(verdict.ends_with("permission: denied"), "{verdict}");
    let settled = sandbox.run.seen_or_until("its settlement", |line| line.starts_with("chat-permission-settled "));
    assert!(settled.ends_with("outcome=denied"), "{settled}");

    // A prompt whose turn is cancelled (the console's `chat-cancel`) leaves the panel without a key pressed.
    x.type_text("ask");
    x.key(XK_RETURN);
    sandbox.hud_until("the second prompt", |hud| hud.contains("Y allow, N deny"));
    // (Enter's `ok sent` answer may still be unread: wait for this command's own answer.)
    sandbox.run.send("chat-cancel");
    sandbox.run.until("the cancel's answer", |line| line == "ok cancelling the turn");
    let hud = sandbox.hud_until("the prompt taken down", |hud| !hud.contains("Y allow, N deny"));
    assert!(hud.contains(&format!("[{asked}: withdrawn]")), "the panel says why: {hud}");

    // Esc closes the panel; a tap of W walks the player one cell (through the world state, like everything).
    x.key(0xff1b);
    let before = sandbox.run.player();
    x.type_text("w");
    let until = Instant::now() + WAIT;
    while sandbox.run.player() == before {
        assert!(Instant::now() < until, "W did not move the player from {before:?}");
    }
    let after = sandbox.run.player();
    let step = ((after.0 - before.0).abs(), (after.2 - before.2).abs());
    assert!(step.0 <= 1 && step.1 <= 1, "one step, to a neighbouring column: {before:?} -> {after:?}");

    // P travels (the same `travel` a console player types).
    x.type_text("p");
    sandbox.run.until("the relocation", |line| line.starts_with("relocated") && line.contains("dimension=nether"));

    // Closing the window is `quit`: the visit closes, its save completes, the process exits 0.
    x.close();
    sandbox.run.until("the save", |line| line.starts_with("saved world=alpha"));
    let status = sandbox.run.wait_exit();
    assert!(status.success(), "exit status {status}; lines: {:#?}", sandbox.run.out.seen);
    assert!(dir.path().join("alpha").exists(), "the world was saved");
}
