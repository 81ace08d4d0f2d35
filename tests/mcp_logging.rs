//! The game's console stays readable: rmcp's per-connection INFO lines are quiet by default, and an ordinary
//! client disconnect is not an ERROR. (A test binary of its own: it installs the process's global subscriber.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use bevy_agent_tools::mcp::{McpPlugin, McpServer};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app_with, Gate, RunningGame};
use bevy_agent_tools::{ConversationEvent, ConversationStatus};
use common::*;
use parking_lot::Mutex;
use rmcp::model::{CallToolRequestParams, ProtocolVersion};
use rmcp::service::ClientLifecycleMode;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientServiceExt, ServiceExt};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

const TOKEN: &str = "log-token-0123456789abcdef";
/// What the `speaks` tool logs.
const SPOKEN: &str = "the speaks tool ran";

/// Every event that reached the game's subscriber: (level, target, message), the message marked when it did not
/// come from the plugin's worker threads (where the MCP server runs).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<(Level, String, String)>>>);

impl<S: Subscriber> Layer<S> for Captured {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        // The test's own client logs from the test's threads; the MCP server runs on the plugin's workers.
        let thread = std::thread::current();
        let server = thread.name() == Some("agent-tools-worker");
        let mut message = Message(String::new());
        event.record(&mut message);
        let metadata = event.metadata();
        let message = if server { message.0 } else { format!("[not the server] {}", message.0) };
        self.0.lock().push((*metadata.level(), metadata.target().to_string(), message));
    }
}

/// A request from a page of another origin, without a token; its status.
fn foreign_request(address: std::net::SocketAddr) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nOrigin: http://evil.example\r\nContent-Type: application/json\r\n\
         Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    stream.write_all(request.as_bytes()).expect("write");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.split_whitespace().nth(1).and_then(|status| status.parse().ok()).unwrap_or(0)
}

/// What the `nearest` tool answers.
#[derive(serde::Serialize, schemars::JsonSchema)]
struct Nearest {
    distances: Vec<f64>,
}

/// A request with bearer token `token`; its status.
fn bearer_request(address: std::net::SocketAddr, token: &str) -> u16 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    );
    stream.write_all(request.as_bytes()).expect("write");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.split_whitespace().nth(1).and_then(|status| status.parse().ok()).unwrap_or(0)
}

#[test]
fn rmcp_connection_lines_are_quiet_and_a_stateless_client_disconnect_is_not_an_error() {
    let captured = Captured::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(captured.clone()))
        .expect("the only subscriber of this test binary");
    let gate = Gate::new();
    let tool_gate = gate.clone();
    let game = RunningGame::spawn(Duration::from_millis(1), move || {
        let plugin = AgentToolsPlugin::new(TestGame::default())
            .with_tool(bump_tool("bump", ToolScope::World, Arc::default(), None))
            .with_tool(bump_tool("gated", ToolScope::World, Arc::default(), Some(tool_gate)))
            .with_tool(AgentTool::new(
                "speaks",
                "Logs a line from its handler, which runs where the server does.",
                |_: CallContext<Session>, _: bevy_agent_tools::NoArgs| async move {
                    tracing::info!("{SPOKEN}");
                    Ok(())
                },
            ))
            .with_tool(AgentTool::new(
                "nearest",
                "Says how far the nearest enemy is: infinitely far when there is none.",
                |_: CallContext<Session>, _: bevy_agent_tools::NoArgs| async move {
                    Ok(Nearest { distances: vec![1.0, f64::INFINITY, f64::INFINITY] })
                },
            ))
            .with_tool(AgentTool::new(
                "buggy",
                "Panics: the game's bug.",
                |_: CallContext<Session>, _: bevy_agent_tools::NoArgs| async move {
                    if true {
                        panic!("the buggy tool's bug");
                    }
                    Ok(())
                },
            ));
        headless_app_with(plugin, McpPlugin::new().port(0).token(TOKEN))
    });
    let url = game.with_app(|app| {
        app.world_mut().write_message(EnterWorld::new("alpha"));
        app.update();
        app.world().resource::<McpServer>().url().to_string()
    });
    let mut events = game.agent().subscribe();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("rt");
    runtime.block_on(async {
        let transport = |url: &str| {
            StreamableHttpClientTransport::from_config(
                StreamableHttpClientTransportConfig::with_uri(url).auth_header(TOKEN),
            )
        };
        // A session (2025-11-25): connect, call, leave.
        let client = ().serve(transport(&url)).await.expect("connect");
        client.call_tool(CallToolRequestParams::new("bump")).await.expect("a call");
        client.call_tool(CallToolRequestParams::new("speaks")).await.expect("a call");
        for _ in 0..3 {
            // A tool that does not exist (a left world's, say), called in a loop; a non-finite output; a panic.
            client.call_tool(CallToolRequestParams::new("gone")).await.expect_err("no such tool");
            client.call_tool(CallToolRequestParams::new("nearest")).await.expect("a call");
            let buggy = client.call_tool(CallToolRequestParams::new("buggy")).await.expect("a result");
            assert_eq!(buggy.is_error, Some(true), "{buggy:?}");
        }
        client.cancel().await.expect("close");

        // Stateless (2026-07-28): a call whose client goes away while it runs.
        let mode = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
        let client = ().serve_with_lifecycle(transport(&url), mode).await.expect("connect (2026-07-28)");
        let peer = client.peer().clone();
        let call = tokio::spawn(async move { peer.call_tool(CallToolRequestParams::new("gated")).await });
        tokio::time::timeout(Duration::from_secs(30), gate.arrivals(1))
            .await
            .expect("the calls reached their tool in time");
        call.abort();
        let _ = call.await;
        drop(client);
        loop {
            let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await.expect("an event in time");
            if let Some(ConversationEvent::Status(change)) = event {
                if change.status == ConversationStatus::Idle && change.previous == ConversationStatus::WaitingToolResult
                {
                    break;
                }
            }
        }
        // One more full exchange after the disconnect was handled (rmcp answers the cancelled call's stream as it
        // winds down; this runs behind it on the same runtime).
        let client = ().serve(transport(&url)).await.expect("connect again");
        client.call_tool(CallToolRequestParams::new("bump")).await.expect("a call");
        client.cancel().await.expect("close");
    });
    // A web page of another origin sending request after request: each is refused 403.
    let address = game.with_app(|app| app.world().resource::<McpServer>().address());
    for _ in 0..20 {
        assert_eq!(foreign_request(address), 403);
    }
    // An ended session's agent still winding down, its credential revoked: not a client with the wrong token.
    let credentials = game.with_app(|app| app.world().resource::<McpServer>().credentials().clone());
    let revoked = credentials.mint(&"chat-ended".into()).expect("a credential");
    credentials.revoke(&revoked);
    assert_eq!(bearer_request(address, &revoked), 401);
    // A client set up with another run's token, retrying.
    for _ in 0..20 {
        assert_eq!(bearer_request(address, "an-old-token"), 401);
    }
    gate.open();
    game.stop();

    let captured = captured.0.lock().clone();
    assert!(
        captured
            .iter()
            .any(|(_, target, message)| target.starts_with("bevy_agent_tools") && message.contains("serving MCP")),
        "the game's subscriber got the plugin's own lines: {captured:#?}"
    );
    let server: Vec<_> = captured.iter().filter(|(_, _, message)| !message.starts_with("[not the server]")).collect();
    assert!(
        server.iter().any(|(_, _, message)| message == SPOKEN),
        "the server's threads are heard (else the checks below would pass on nothing): {captured:#?}"
    );
    let count = |level: Level, start: &str| {
        server.iter().filter(|(at, _, message)| *at == level && message.starts_with(start)).count()
    };
    // The tool's panic is the game's error, logged (with its tool) each time.
    assert_eq!(count(Level::ERROR, "a tool's handler panicked"), 3, "{captured:#?}");
    let errors: Vec<_> = server
        .iter()
        .filter(|(level, _, message)| *level == Level::ERROR && !message.starts_with("a tool's handler panicked"))
        .collect();
    assert!(errors.is_empty(), "a client going away is not an error: {errors:#?}");
    assert_eq!(count(Level::DEBUG, "refused an MCP request with a revoked session credential"), 1, "{captured:#?}");
    for (warning, what) in [
        ("rejected request with", "20 requests of another origin"),
        ("response error", "3 calls of a tool that does not exist"),
        ("refused an MCP request with a wrong or revoked bearer token", "20 requests with an old token"),
        ("the tool's output has a float that is NaN or infinite", "3 outputs with 2 infinities each"),
    ] {
        assert_eq!(count(Level::WARN, warning), 1, "one warning for {what}, not one each: {captured:#?}");
    }
    let rmcp_chatter: Vec<_> =
        server.iter().filter(|(level, target, _)| target.starts_with("rmcp") && *level > Level::WARN).collect();
    assert!(rmcp_chatter.is_empty(), "rmcp's INFO lines are quiet by default: {rmcp_chatter:#?}");
}
