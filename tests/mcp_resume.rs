//! Resumption (MCP 2025-11-25) over raw HTTP: a client whose response stream was cut comes back with
//! `Last-Event-ID` after its call finished, and still gets the result.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use bevy_agent_tools::mcp::{McpPlugin, McpServer};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app_with, Gate, RunningGame};
use bevy_agent_tools::ConversationEvent;
use common::*;

const TOKEN: &str = "resume-token-0123456789abcdef";

/// Sends one request and returns the connection, positioned after the response's headers, and those headers.
fn send(server: &McpServer, method: &str, headers: &[(&str, &str)], body: &str) -> (BufReader<TcpStream>, String) {
    let mut stream = TcpStream::connect(server.address()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut request = format!(
        "{method} /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
        server.address(),
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).expect("write");
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("a header line");
        if line == "\r\n" || line.is_empty() {
            return (reader, head);
        }
        head.push_str(&line);
    }
}

/// Reads server-sent event lines until one satisfies `wanted`; returns it.
fn read_until(reader: &mut BufReader<TcpStream>, wanted: impl Fn(&str) -> bool) -> Option<String> {
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) if wanted(&line) => return Some(line),
            Ok(_) => {}
        }
    }
}

#[test]
fn a_client_that_resumes_after_its_call_finished_gets_the_result_it_missed() {
    let gate = Gate::new();
    let tool_gate = gate.clone();
    let game = RunningGame::spawn(Duration::from_millis(1), move || {
        let plugin = AgentToolsPlugin::new(TestGame::default()).with_tool(bump_tool(
            "gated",
            ToolScope::World,
            Arc::default(),
            Some(tool_gate),
        ));
        headless_app_with(plugin, McpPlugin::new().port(0).token(TOKEN))
    });
    let server = game.with_app(|app| {
        app.world_mut().write_message(EnterWorld::new("alpha"));
        app.update();
        app.world().resource::<McpServer>().clone()
    });
    let mut events = game.agent().subscribe();

    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let (_, head) = send(&server, "POST", &[], initialize);
    let session = head
        .lines()
        .find_map(|line| {
            line.to_ascii_lowercase().starts_with("mcp-session-id:").then(|| line[15..].trim().to_string())
        })
        .expect("a session id");
    let in_session = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];
    send(&server, "POST", &in_session, r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);

    // The call's stream: read its priming event, then the connection drops while the call waits at the gate.
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"gated","arguments":{"by":3}}}"#;
    let (mut stream, _) = send(&server, "POST", &in_session, call);
    let priming = read_until(&mut stream, |line| line.starts_with("id:")).expect("a priming event");
    let last_event_id = priming.trim_start_matches("id:").trim().to_string();
    drop(stream);

    // The call finishes while nobody listens.
    gate.open();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        loop {
            let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await.expect("in time");
            if let Some(ConversationEvent::CallFinished(finished)) = event {
                assert_eq!(finished.code, None, "the call succeeded");
                break;
            }
        }
    });

    // The session answers a ping after the call's response went through it: the response was produced, so rmcp's
    // own manager has forgotten the stream by now.
    let (mut pong, _) = send(&server, "POST", &in_session, r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#);
    read_until(&mut pong, |line| line.contains(r#""id":8"#)).expect("a pong");

    // The client comes back with the last event id it saw and gets the result.
    let resume = [in_session[0], in_session[1], ("Last-Event-ID", last_event_id.as_str())];
    let (mut resumed, head) = send(&server, "GET", &resume, "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let result = read_until(&mut resumed, |line| line.starts_with("data:") && line.contains(r#""id":7"#));
    let result = result.expect("the result of the call, replayed");
    assert!(result.contains(r#""counter":3"#), "{result}");
    game.stop();
}
