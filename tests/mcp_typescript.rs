//! End to end with a second real MCP client: the official TypeScript SDK (npm `@modelcontextprotocol/sdk`, pinned
//! in tests/e2e/ts/package-lock.json) drives the sandbox's tools in a running headless game over loopback:
//! tools/list, calls, each domain error read through `callTool()`, progress, cancel through an `AbortSignal`, and
//! a stream cut by a proxy and resumed after the call finished.
//!
//! The packages are installed once by tests/e2e/setup-node.sh (`.ci/run` runs it first); this needs `node` (20 or
//! later) and `npm`, and the npm registry the first time.

#[allow(dead_code)]
#[path = "../examples/sandbox/batch.rs"]
mod batch;
#[allow(dead_code)]
#[path = "../examples/sandbox/output.rs"]
mod output;
#[allow(dead_code)]
#[path = "../examples/sandbox/picture.rs"]
mod picture;
#[allow(dead_code)]
#[path = "../examples/sandbox/session.rs"]
mod session;
#[allow(dead_code)]
#[path = "../examples/sandbox/terrain.rs"]
mod terrain;
#[allow(dead_code)]
#[path = "../examples/sandbox/tools.rs"]
mod tools;
#[allow(dead_code)]
#[path = "../examples/sandbox/tower.rs"]
mod tower;
#[allow(dead_code)]
#[path = "../examples/sandbox/view.rs"]
mod view;
#[allow(dead_code)]
#[path = "../examples/sandbox/world.rs"]
mod world;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bevy::prelude::*;
use bevy_agent_tools::mcp::{McpPlugin, McpServer};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::RunningGame;
use bevy_agent_tools::{ConversationEvent, WorldStorePlugin};

const TOKEN: &str = "e2e-ts-token-0123456789abcdef";

/// The folder holding the pinned TypeScript client (`node_modules`), created on first use.
fn typescript_mcp_client() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-ts");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/setup-node.sh");
    let output = Command::new("bash").arg(script).arg(&dir).output().expect("run setup-node.sh");
    assert!(
        output.status.success(),
        "could not set up the TypeScript MCP client (needs node, npm and the npm registry):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Node resolves packages from the script's own folder: run it from beside node_modules.
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/ts/client.mjs"), dir.join("client.mjs"))
        .expect("copy client.mjs");
    dir
}

/// What a physics step can leave behind: a float JSON has no spelling for.
#[derive(serde::Serialize, schemars::JsonSchema)]
struct Drift {
    speed: f32,
    heading: f64,
}

/// A tool whose output has a NaN: the client, which checks results against the published output schema, must
/// still get the result (with `null` there).
fn drift() -> AgentTool<session::Visit> {
    AgentTool::new("drift", "How the player drifts.", |_: CallContext<session::Visit>, _: NoArgs| async {
        Ok(Drift { speed: f32::NAN, heading: 1.5 })
    })
    .read_only()
}

/// The node client, stopped if the test fails before it ends (a panic midway would leave it running).
struct Client(std::process::Child);

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn typescript_mcp_client_reads_every_domain_error_gets_all_progress_cancels_and_resumes_after_a_cut() {
    let client = typescript_mcp_client();
    let data = tempfile::tempdir().expect("a data folder");
    let data_dir = data.path().to_path_buf();
    // 100 ms frames: a 64-block tower takes six seconds, time enough for the travel or the cancel the client sends
    // after its first block to reach the game before it is done on a loaded machine; and one progress report (one
    // block a frame) in flight when the client forgets the call's token, not several (client.mjs checks it).
    let game = RunningGame::spawn(Duration::from_millis(100), move || {
        let palette = Arc::new(world::Palette::parse(include_str!("../assets/palette.json")).expect("the palette"));
        let host = tools::all(palette.clone())
            .into_iter()
            .fold(AgentToolsPlugin::new(session::Sandbox::new(palette)), |host, tool| host.with_tool(tool))
            .with_tool(drift());
        let mut app = App::new();
        app.add_plugins(MinimalPlugins)
            .add_plugins(host)
            .add_plugins(WorldStorePlugin::new(data_dir))
            .add_plugins(McpPlugin::new().port(0).token(TOKEN));
        app.finish();
        app.cleanup();
        app
    });
    let url = game.with_app(|app| app.world().resource::<McpServer>().url().to_string());
    let mut events = game.agent().subscribe();

    let mut node = Client(
        Command::new("node")
            .arg(client.join("client.mjs"))
            .arg(&url)
            .arg(TOKEN)
            .current_dir(&client)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run node"),
    );
    let mut stdin = node.0.stdin.take().expect("stdin");
    let stdout = BufReader::new(node.0.stdout.take().expect("stdout"));
    let mut transcript = Vec::new();
    for line in stdout.lines() {
        let line = line.expect("a line from the client");
        if line.contains(r#""need":"enter""#) {
            game.with_app(|app| {
                app.world_mut().write_message(EnterWorld::new("alpha"));
                app.update();
            });
            writeln!(stdin, "entered").expect("tell the client");
        }
        transcript.push(line);
    }
    let status = node.0.wait().expect("the client ends");
    let mut stderr = String::new();
    let _ = std::io::Read::read_to_string(&mut node.0.stderr.take().expect("stderr"), &mut stderr);
    let transcript = transcript.join("\n");
    assert!(status.success(), "the TypeScript client failed:\n{transcript}\n{stderr}");
    let checks = transcript.lines().filter(|line| line.contains(r#""ok":true"#)).count();
    assert_eq!(checks, 33, "every check passed:\n{transcript}");

    // The aborted tower was cancelled in the game, not left running.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let cancelled = runtime.block_on(async {
        loop {
            match tokio::time::timeout(Duration::from_secs(10), events.next()).await {
                Ok(Some(ConversationEvent::CallFinished(finished)))
                    if finished.tool == "build_tower" && finished.code == Some(ErrorCode::Cancelled) =>
                {
                    return true
                }
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return false,
            }
        }
    });
    assert!(cancelled, "the game saw the AbortSignal as a cancel");
    game.stop();
}
