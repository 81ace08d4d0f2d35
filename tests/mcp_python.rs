//! End to end with a real MCP client: the official Python SDK (PyPI `mcp`, pinned in tests/e2e/requirements.txt)
//! drives a running headless game over loopback, in both protocol generations.
//!
//! The venv is created once by tests/e2e/setup-venv.sh (`.ci/run` runs it first); this needs `python3` and, the
//! first time, network access to PyPI.

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bevy_agent_tools::mcp::{McpPlugin, McpServer};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app_with, RunningGame};
use bevy_agent_tools::NoArgs;
use common::*;

#[test]
fn python_mcp_client_lists_calls_sees_errors_replays_and_cancels_in_both_protocol_generations() {
    let python = python_mcp_client();
    let (ended_tx, ended) = crossbeam_channel::unbounded::<()>();
    let long = AgentTool::new(
        "long",
        "Runs until cancelled, reporting progress.",
        move |ctx: CallContext<Session>, _: NoArgs| {
            let ended_tx = ended_tx.clone();
            async move {
                for step in 1..=10_000 {
                    if ctx.on_client(|_, session| session.counter += 1).await.is_err() {
                        break;
                    }
                    ctx.report_progress(step as f64, None, None);
                }
                let reason = ctx.ended().await;
                let _ = ended_tx.send(());
                Err::<(), _>(reason)
            }
        },
    );
    // Longer than the Python client's read timeout (httpx's default, 5 s), without a word meanwhile.
    let slow = AgentTool::new("slow", "Takes 6 s and reports nothing.", |_: CallContext<Session>, _: NoArgs| async {
        tokio::time::sleep(Duration::from_secs(6)).await;
        Ok(())
    })
    .timeout(Duration::from_secs(30));
    let token = "e2e-token-0123456789abcdef";
    let game = RunningGame::spawn(Duration::from_millis(2), move || {
        let plugin = AgentToolsPlugin::new(TestGame::default())
            .with_tool(bump_tool("bump", ToolScope::World, Arc::default(), None))
            .with_tool(long)
            .with_tool(slow);
        headless_app_with(plugin, McpPlugin::new().port(0).token(token))
    });
    let url = game.with_app(|app| {
        app.world_mut().write_message(EnterWorld::new("alpha"));
        app.update(); // the world is open before anyone calls
        app.world().resource::<McpServer>().url().to_string()
    });

    let output = Command::new(&python)
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/client.py"))
        .arg(&url)
        .arg(token)
        .output()
        .expect("run the Python client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the Python client failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The SDK ends a 2025-11-25 session with DELETE and logs a warning unless the answer is 200 or 204.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("Session termination failed"), "the client's session ended cleanly:\n{stderr}");
    let checks = stdout.lines().filter(|line| line.contains("\"ok\": true")).count();
    assert_eq!(checks, 24, "every check passed in both generations:\n{stdout}");
    for generation in ["auto", "legacy"] {
        ended.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| panic!("{generation}: the handler saw ended()"));
    }
    game.stop();
}
