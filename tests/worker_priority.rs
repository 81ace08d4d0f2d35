//! The plugin's worker threads (tool handlers, the MCP server, agent sessions, close work) run below the game's
//! own threads by default, so agent work waits for the game when the cores are busy (`WorkerPriority`).

#![cfg(target_os = "linux")]

mod common;

use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app, AgentTestAppExt};
use bevy_agent_tools::{NoArgs, WorkerPriority};
use common::*;
use serde_json::json;

/// The calling thread's nice value, as the kernel reports it (`/proc/thread-self/stat`, field 19).
fn this_threads_nice() -> i64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("/proc/thread-self/stat");
    let after_name = stat.rsplit_once(") ").expect("a stat line").1;
    after_name.split(' ').nth(16).and_then(|nice| nice.parse().ok()).expect("field 19: nice")
}

/// The nice value of the thread a tool's handler ran on, through a real call.
fn handler_nice(plugin: AgentToolsPlugin<TestGame>) -> i64 {
    let tool = AgentTool::new("nice", "Says its thread's nice value.", |_: CallContext<Session>, _: NoArgs| async {
        Ok(json!({ "nice": this_threads_nice() }))
    });
    let mut app = headless_app(plugin.with_tool(tool));
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("nice", json!({}));
    let output = app.run_until_resolved(&call).expect("the call succeeds");
    output.value["nice"].as_i64().expect("a number")
}

#[test]
fn background_workers_run_ten_nice_levels_below_the_games_threads() {
    let game = this_threads_nice();
    let worker = handler_nice(AgentToolsPlugin::new(TestGame::default()));
    assert_eq!(worker, (game + 10).min(19), "the game's threads run at nice {game}");
}

#[test]
fn normal_workers_run_at_the_games_priority() {
    let game = this_threads_nice();
    let worker = handler_nice(AgentToolsPlugin::new(TestGame::default()).worker_priority(WorkerPriority::Normal));
    assert_eq!(worker, game);
}
