//! In-game agent sessions with the ACP backend and the scripted agent (tests/fixtures) answering at once, the game
//! loop at 60 frames per second, a world open:
//!
//! - `turn`: `send_text` to the first streamed delta, and to the turn's end (a reply of three chunks, no tool),
//!   without the world's observation (`input_context(false)`), and with it (it waits for the next frame);
//! - `tool turn`: the same with one tool call by the agent (`trivial`, which never waits for a frame) through the
//!   game's MCP server with the session's credential;
//! - `direct`: the same call made directly over MCP by a client of the same SDK (rmcp), session kept;
//! - the agent's tool call round trip as the agent measures it around its MCP request, against median(direct)
//!   (target ≤ 1.1×); and median(tool turn) - median(turn), the whole cost of a tool call in a turn.
//!
//! Each round takes every measure in turn (in the same order), so that drift over the run falls on all of them
//! alike.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bevy_agent_tools::mcp::{McpPlugin, McpServer};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::session::{AgentSessions, AgentSessionsPlugin, SessionConfig};
use bevy_agent_tools::testing::{headless_app_with, CounterGame, RunningGame};
use bevy_agent_tools::{ConversationEvent, NoArgs};
use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;

const TOKEN: &str = "bench-token-0123456789abcdef";
const ROUNDS: usize = 40;
const PER_ROUND: usize = 10;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The scripted agent, built in this bench's profile.
fn scripted_agent() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench's own path");
    let profile_dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>/deps/<bench>");
    let mut build = std::process::Command::new(env!("CARGO"));
    build.args(["build", "--example", "scripted_acp_agent"]);
    if profile_dir.file_name().is_some_and(|name| name == "release") {
        build.arg("--release");
    }
    let status = build
        .env("CARGO_TARGET_DIR", profile_dir.parent().expect("<target>"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the scripted agent failed");
    profile_dir.join("examples").join(format!("scripted_acp_agent{}", std::env::consts::EXE_SUFFIX))
}

fn report(name: &str, times: &mut [Duration]) -> Duration {
    times.sort();
    let median = percentile(times, 0.5);
    println!(
        "agent_session/{name}: {} samples, median {median:?}, p95 {:?}, p99 {:?}",
        times.len(),
        percentile(times, 0.95),
        percentile(times, 0.99)
    );
    median
}

fn main() {
    let agent = scripted_agent();
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("sessions");
    let game = RunningGame::spawn(Duration::from_micros(16_667), move || {
        let trivial =
            AgentTool::new("trivial", "Returns at once.", |_: CallContext<u64>, _: NoArgs| async move { Ok(()) });
        headless_app_with(
            AgentToolsPlugin::new(CounterGame).with_tool(trivial),
            (McpPlugin::new().port(0).token(TOKEN), AgentSessionsPlugin::new().data_dir(data)),
        )
    });
    let (url, sessions) = game.with_app(|app| {
        app.world_mut().write_message(EnterWorld::new("bench"));
        app.update();
        let url = app.world().resource::<McpServer>().url().to_string();
        (url, app.world().resource::<AgentSessions>().clone())
    });
    let state = dir.path().join("agent-state");
    // The world's observation (H14) waits for the next frame: measured apart, so that the other figures are the
    // host's own overhead rather than where in a frame a turn starts.
    let observing =
        SessionConfig::acp(agent.to_string_lossy(), ["--state".to_string(), state.to_string_lossy().to_string()]);
    let config = observing.clone().input_context(false).env("SCRIPTED_AGENT_PLAIN_TOKEN", TOKEN);
    let handle = game.agent();
    let runtime = handle.runtime().clone();
    runtime.block_on(async move {
        let session = sessions.create(config).await.expect("the scripted agent starts");
        let observed_session = sessions.create(observing).await.expect("the scripted agent starts");
        let mut events = handle.subscribe();
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(url).auth_header(TOKEN),
        );
        let client = ().serve(transport).await.expect("connect");
        let (mut first_delta, mut turn, mut tool_turn, mut direct) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut agent_call = Vec::new();
        let mut observed = Vec::new();
        for round in 0..ROUNDS + 2 {
            let warm_up = round < 2;
            for _ in 0..PER_ROUND {
                events.drain();
                let started = Instant::now();
                let pending = session.start_turn("hello").await.expect("sent");
                let delta = loop {
                    match events.next().await {
                        Some(ConversationEvent::ChatDelta(_)) => break started.elapsed(),
                        Some(_) => {}
                        None => panic!("the host went away"),
                    }
                };
                pending.await.expect("the turn ends");
                if !warm_up {
                    turn.push(started.elapsed());
                    first_delta.push(delta);
                }
            }
            for _ in 0..PER_ROUND {
                let started = Instant::now();
                let ended = session.send_text("call trivial {}").await.expect("the turn ends");
                if !warm_up {
                    tool_turn.push(started.elapsed());
                }
                let reply = ended.final_message.expect("a reply");
                assert!(reply.starts_with("trivial answered: "), "{reply}");
                // The agent's own measure of its MCP call: "... (round trip N us)".
                let micros = reply.rsplit("(round trip ").next().and_then(|rest| rest.split(' ').next());
                let micros: u64 = micros.and_then(|n| n.parse().ok()).expect("the agent's round trip");
                if !warm_up {
                    agent_call.push(Duration::from_micros(micros));
                }
            }
            for _ in 0..PER_ROUND {
                let started = Instant::now();
                observed_session.send_text("hello").await.expect("the turn ends");
                if !warm_up {
                    observed.push(started.elapsed());
                }
            }
            for _ in 0..PER_ROUND {
                let started = Instant::now();
                let result = client.call_tool(CallToolRequestParams::new("trivial")).await.expect("call");
                if !warm_up {
                    direct.push(started.elapsed());
                }
                assert_eq!(result.is_error, Some(false));
            }
        }
        // The same agent process and MCP client: calls with the session's credential (attributed to the session's
        // conversation, status WaitingToolResult) against calls with the game's token.
        let compared = session.send_text("compare trivial 400").await.expect("the turn ends");
        let compared = compared.final_message.expect("medians");
        let medians: Vec<f64> = compared.split(' ').filter_map(|word| word.parse().ok()).collect();
        println!(
            "agent_session/the agent's calls, 400 each alternating, median: with the session's credential {} us, with \
             the game's token {} us: {:.2}x",
            medians[0],
            medians[1],
            medians[0] / medians[1]
        );
        report("send_text to first delta", &mut first_delta);
        let plain = report("send_text to turn end (no tool)", &mut turn);
        let with_tool = report("send_text to turn end (one tool call)", &mut tool_turn);
        let direct = report("the same call directly over MCP", &mut direct);
        report("send_text to turn end, with the world's observation (waits for a frame at 60 fps)", &mut observed);
        let agent_call = report("the agent's MCP call, as the agent measured it", &mut agent_call);
        println!(
            "agent_session/agent tool call round trip: {agent_call:?} = {:.2}x the direct call",
            agent_call.as_secs_f64() / direct.as_secs_f64()
        );
        let round = with_tool.saturating_sub(plain);
        println!(
            "agent_session/a turn with one tool call minus one without (the call plus the agent's ACP tool-call \
             updates and a second message): {round:?} = {:.2}x the direct call",
            round.as_secs_f64() / direct.as_secs_f64()
        );
        session.end().await;
        observed_session.end().await;
        let _ = client.cancel().await;
    });
    game.stop();
}
