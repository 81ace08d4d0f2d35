//! Round trip of a trivial tool call over loopback MCP (rmcp's client, 2025-11-25 session), measured while the
//! game loop runs at 60 frames per second. Prints the median and p99 of N sequential calls; two tools: one that
//! never touches the main thread, and one that takes one `on_client` step (so it waits for the next frame).

use std::time::{Duration, Instant};

use bevy_agent_tools::mcp::{McpPlugin, McpServer};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::CounterGame;
use bevy_agent_tools::testing::{headless_app_with, RunningGame};
use bevy_agent_tools::NoArgs;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;

const TOKEN: &str = "bench-token-0123456789abcdef";
const CALLS: usize = 2_000;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let game = RunningGame::spawn(Duration::from_micros(16_667), || {
        let trivial =
            AgentTool::new("trivial", "Returns at once.", |_: CallContext<u64>, _: NoArgs| async move { Ok(()) });
        let step = AgentTool::new("step", "One main-thread step.", |ctx: CallContext<u64>, _: NoArgs| async move {
            ctx.on_client(|_, n| *n += 1).await
        });
        headless_app_with(
            AgentToolsPlugin::new(CounterGame).with_tool(trivial).with_tool(step),
            McpPlugin::new().port(0).token(TOKEN),
        )
    });
    let url = game.with_app(|app| {
        app.world_mut().write_message(EnterWorld::new("bench"));
        app.update(); // the world is open before anyone calls
        app.world().resource::<McpServer>().url().to_string()
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    runtime.block_on(async move {
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(url).auth_header(TOKEN),
        );
        let client = ().serve(transport).await.expect("connect");
        for (tool, calls) in [("trivial", CALLS), ("step", CALLS / 10)] {
            for _ in 0..50 {
                client.call_tool(CallToolRequestParams::new(tool)).await.expect("warm-up");
            }
            let mut times = Vec::with_capacity(calls);
            for _ in 0..calls {
                let started = Instant::now();
                let result = client.call_tool(CallToolRequestParams::new(tool)).await.expect("call");
                times.push(started.elapsed());
                assert_eq!(result.is_error, Some(false));
            }
            times.sort();
            println!(
                "mcp_round_trip/{tool}: {calls} calls, median {:?}, p99 {:?}, max {:?}",
                percentile(&times, 0.5),
                percentile(&times, 0.99),
                times[times.len() - 1]
            );
        }
        client.cancel().await.expect("close");
    });
    game.stop();
}
