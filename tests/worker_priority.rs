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

/// The threads a `save_records` encodes on, with their nice values.
static ENCODED_ON: parking_lot::Mutex<Vec<(String, i64)>> = parking_lot::Mutex::new(Vec::new());

/// A record that notes which thread encodes it.
struct Noted;

impl serde::Serialize for Noted {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let name = std::thread::current().name().unwrap_or_default().to_string();
        ENCODED_ON.lock().push((name, this_threads_nice()));
        serializer.serialize_u8(0)
    }
}

#[test]
fn a_saves_encoding_threads_run_at_the_workers_priority_not_below_it() {
    use bevy::prelude::*;
    use bevy_agent_tools::persist::{WorldStore, WorldStorePlugin};
    let game = this_threads_nice();
    let data = tempfile::tempdir().unwrap();
    let mut app = App::new();
    app.add_plugins(MinimalPlugins)
        .add_plugins(AgentToolsPlugin::new(TestGame::default()))
        .add_plugins(WorldStorePlugin::new(data.path()));
    app.finish();
    let store = app.world().resource::<WorldStore>().clone();
    let records: Vec<Noted> = (0..20_000).map(|_| Noted).collect();
    store.save_records(&bevy_agent_tools::WorldId::new("alpha"), "noted", records).wait().expect("saved");

    let seen = ENCODED_ON.lock().clone();
    assert_eq!(seen.len(), 20_000);
    assert!(seen.iter().all(|(_, nice)| *nice == (game + 10).min(19)), "the workers' nice value, once: {seen:?}");
    if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
        assert!(seen.iter().any(|(name, _)| name == "agent-tools-save"), "encoded on the save's own threads");
    }
}

#[test]
fn blocking_threads_a_worker_starts_run_at_the_workers_priority_not_below_it() {
    use bevy::prelude::*;
    let game = this_threads_nice();
    let mut app = App::new();
    app.add_plugins(MinimalPlugins).add_plugins(AgentToolsPlugin::new(TestGame::default()));
    app.finish();
    let runtime = app.world().resource::<bevy_agent_tools::AgentRuntime>().handle().clone();
    // Blocking work (the store's I/O) is started from a worker, whose thread the new blocking thread starts from.
    let nice = runtime
        .block_on(runtime.spawn(async { tokio::task::spawn_blocking(this_threads_nice).await }))
        .expect("the task ran")
        .expect("the blocking work ran");
    assert_eq!(nice, (game + 10).min(19), "the game's threads run at nice {game}");
}
