//! Load: 10 conversations × 100 calls over MCP while the player exits, re-enters and travels. No response is
//! lost, no step ever runs against a visit or revision other than its call's, and every error is one of the
//! host's codes.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bevy_agent_tools::mcp::{McpPlugin, McpServer, ERROR_META_KEY};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app_with, RunningGame};
use bevy_agent_tools::NoArgs;
use common::*;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;

const TOKEN: &str = "load-token-0123456789abcdef";
const CONVERSATIONS: usize = 10;
const CALLS: usize = 100;

/// Counts steps that ran against the wrong visit or (Location scope) the wrong revision.
fn checked_tool(name: &str, scope: ToolScope, wrong: Arc<AtomicUsize>) -> AgentTool<Session> {
    AgentTool::new(
        name,
        "Touches the world and checks it is the call's own.",
        move |ctx: CallContext<Session>, _: NoArgs| {
            let wrong = wrong.clone();
            async move {
                let admitted = ctx.visit().clone();
                ctx.on_client(move |_, session| {
                    let wrong_visit = session.visit != admitted.visit;
                    let wrong_revision =
                        scope == ToolScope::Location && session.revision != admitted.location.revision.0;
                    if wrong_visit || wrong_revision {
                        wrong.fetch_add(1, Ordering::SeqCst);
                    }
                    session.counter += 1;
                })
                .await?;
                Ok(())
            }
        },
    )
    .scope(scope)
}

#[test]
fn load_ten_conversations_of_a_hundred_calls_through_exits_and_travel_lose_nothing_and_never_cross_worlds() {
    let wrong = Arc::new(AtomicUsize::new(0));
    let tools_wrong = wrong.clone();
    let game = RunningGame::spawn(Duration::from_millis(1), move || {
        let plugin = AgentToolsPlugin::new(TestGame::default())
            .with_tool(checked_tool("touch", ToolScope::World, tools_wrong.clone()))
            .with_tool(checked_tool("touch_here", ToolScope::Location, tools_wrong))
            .default_timeout(Duration::from_secs(20));
        headless_app_with(plugin, McpPlugin::new().port(0).token(TOKEN))
    });
    let url = game.with_app(|app| {
        app.world_mut().write_message(EnterWorld::new("alpha"));
        app.update(); // the world is open before anyone calls
        app.world().resource::<McpServer>().url().to_string()
    });

    // The player wanders: travel, exit, re-enter, another world... until the agents are done.
    let done = Arc::new(AtomicBool::new(false));
    let transitions = Arc::new(AtomicUsize::new(0));
    let player = {
        let (stop, transitions) = (done.clone(), transitions.clone());
        let game = &game;
        std::thread::scope(|scope| {
            let wanderer = scope.spawn(move || {
                let mut step = 0usize;
                while !stop.load(Ordering::SeqCst) {
                    let command = step % 5;
                    game.with_app(move |app| match command {
                        0 => drop(app.world_mut().write_message(TravelTo::new("nether"))),
                        1 => drop(app.world_mut().write_message(TravelTo::new("overworld"))),
                        2 => drop(app.world_mut().write_message(ExitWorld::new())),
                        3 => drop(app.world_mut().write_message(EnterWorld::new("beta"))),
                        _ => drop(app.world_mut().write_message(EnterWorld::new("alpha"))),
                    });
                    transitions.fetch_add(1, Ordering::SeqCst);
                    step += 1;
                    // Pacing, not waiting: a few frames between the player's moves.
                    std::thread::sleep(Duration::from_millis(4));
                }
            });
            let outcomes = run_agents(&url);
            done.store(true, Ordering::SeqCst);
            let _ = wanderer.join();
            outcomes
        })
    };
    game.stop();

    let (ok, errors) = player;
    let mut by_code = std::collections::BTreeMap::<&str, usize>::new();
    for code in &errors {
        *by_code.entry(code.as_str()).or_default() += 1;
    }
    println!("load: {ok} ok, refusals {by_code:?}, {} player moves", transitions.load(Ordering::SeqCst));
    assert_eq!(ok + errors.len(), CONVERSATIONS * CALLS, "no response was lost");
    let allowed = ["NO_WORLD", "WORLD_CLOSED", "VISIT_ENDED", "LOCATION_CHANGED"];
    for code in &errors {
        assert!(allowed.contains(&code.as_str()), "unexpected error {code}");
    }
    assert_eq!(wrong.load(Ordering::SeqCst), 0, "no step ran against another visit or revision");
    assert!(ok > 0 && !errors.is_empty(), "the schedule mixed successes ({ok}) and refusals ({})", errors.len());
    assert!(transitions.load(Ordering::SeqCst) >= 10, "the player moved during the load");
}

/// Runs the conversations; returns the number of successes and the error codes.
fn run_agents(url: &str) -> (usize, Vec<String>) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(async {
        let mut agents = Vec::new();
        for conversation in 0..CONVERSATIONS {
            let url = url.to_string();
            agents.push(tokio::spawn(async move {
                let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(TOKEN);
                let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.expect("connect");
                let (mut ok, mut errors) = (0, Vec::new());
                for call in 0..CALLS {
                    let tool = if (call + conversation) % 2 == 0 { "touch" } else { "touch_here" };
                    let result = client.call_tool(CallToolRequestParams::new(tool)).await.expect("a response");
                    if result.is_error == Some(true) {
                        let error = result.meta.as_ref().map(|meta| meta.0[ERROR_META_KEY].clone());
                        errors.push(error.and_then(|e| e["code"].as_str().map(String::from)).unwrap_or("?".into()));
                    } else {
                        ok += 1;
                    }
                }
                let _ = client.cancel().await;
                (ok, errors)
            }));
        }
        let mut total = (0, Vec::new());
        for agent in agents {
            let (ok, errors) = agent.await.expect("agent finished");
            total.0 += ok;
            total.1.extend(errors);
        }
        total
    })
}
