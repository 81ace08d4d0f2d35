//! Starting the MCP server never stops the game: a taken port is replaced by a free one (or, with `strict_port`,
//! the game runs without MCP), and a server that cannot start leaves [`McpUnavailable`] in its place.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use bevy::prelude::*;
use bevy_agent_tools::mcp::{McpPlugin, McpServer, McpUnavailable};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app_with, AgentTestAppExt};
use common::*;

const TOKEN: &str = "start-test-token-0123456789";

fn game(mcp: McpPlugin) -> App {
    let tools =
        AgentToolsPlugin::new(TestGame::default()).with_tool(bump_tool("bump", ToolScope::World, Arc::default(), None));
    headless_app_with(tools, mcp)
}

/// An `initialize` over raw HTTP; returns the response's status line.
fn initialize(address: SocketAddr) -> String {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).expect("write");
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).lines().next().unwrap_or_default().to_string()
}

/// A port another program holds for the test's length.
fn taken_port() -> (TcpListener, u16) {
    let occupied = TcpListener::bind("127.0.0.1:0").expect("a port to take");
    let port = occupied.local_addr().expect("its address").port();
    (occupied, port)
}

/// Runs a call in process: the host works with or without MCP.
fn bump_runs(app: &mut App) {
    app.enter_world("alpha");
    let call = app.agent().conversation("agent").call("bump", serde_json::json!({"by": 1}));
    let outcome = app.run_until_resolved(&call);
    assert!(outcome.is_ok(), "the game runs its tools: {outcome:?}");
}

#[test]
fn a_taken_port_is_replaced_by_a_free_one_and_mcp_serves_there() {
    let (_occupied, taken) = taken_port();
    let mut app = game(McpPlugin::new().port(taken).token(TOKEN));
    assert!(!app.world().contains_resource::<McpUnavailable>());
    let server = app.world().resource::<McpServer>().clone();
    let port = server.address().port();
    assert!(port != taken && port != 0, "another port: {port}");
    assert!(server.url().contains(&format!(":{port}/")), "the URL names the port served: {}", server.url());
    assert!(
        server.token_file().to_string_lossy().contains(&port.to_string()),
        "the token file is the served port's, not the taken one's: {}",
        server.token_file().display()
    );
    assert!(initialize(server.address()).contains(" 200 "), "it answers MCP there");
    bump_runs(&mut app);
}

#[test]
fn with_strict_port_a_taken_port_leaves_the_game_running_without_mcp() {
    let (_occupied, taken) = taken_port();
    let mut app = game(McpPlugin::new().port(taken).strict_port(true).token(TOKEN));
    assert!(!app.world().contains_resource::<McpServer>());
    let error = app.world().resource::<McpUnavailable>().error.to_string();
    assert!(error.contains(&format!("127.0.0.1:{taken}")), "says which port: {error}");
    bump_runs(&mut app);
    app.world_mut().write_message(AppExit::Success);
    app.update();
}

#[test]
fn a_refused_configuration_leaves_the_game_running_without_mcp() {
    let mut app = game(McpPlugin::new().port(0).token("too-short"));
    assert!(!app.world().contains_resource::<McpServer>());
    let error = app.world().resource::<McpUnavailable>().error.to_string();
    assert!(error.contains("at least 16 characters"), "{error}");
    bump_runs(&mut app);
}
