//! The MCP server's connections over raw TCP: a client that connects and sends nothing (or half a request) is let
//! go after the read timeout, and connections over the cap are answered 503 without holding anything.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bevy_agent_tools::mcp::{McpPlugin, McpServer};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app_with, RunningGame};
use common::*;

const TOKEN: &str = "test-token-0123456789abcdef";
/// Far longer than any wait these tests expect: a read that takes this long means the server held on.
const CLIENT_PATIENCE: Duration = Duration::from_secs(20);

fn game(configure: fn(McpPlugin) -> McpPlugin) -> (RunningGame, McpServer) {
    let game = RunningGame::spawn(Duration::from_millis(1), move || {
        headless_app_with(AgentToolsPlugin::new(TestGame::default()), configure(McpPlugin::new().port(0).token(TOKEN)))
    });
    let server = game.with_app(|app| app.world().resource::<McpServer>().clone());
    (game, server)
}

fn connect(server: &McpServer) -> TcpStream {
    let stream = TcpStream::connect(server.address()).expect("connect");
    stream.set_read_timeout(Some(CLIENT_PATIENCE)).expect("timeout");
    stream
}

/// Everything the server sends until it closes the connection; `Err` if it neither sent nor closed in time.
fn read_until_closed(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut bytes = Vec::new();
    match stream.read_to_end(&mut bytes) {
        Ok(_) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        // Closed with our unread bytes in its buffer: a reset, after what it sent.
        Err(error) if error.kind() == ErrorKind::ConnectionReset => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Err(error) => Err(error),
    }
}

fn status(response: &str) -> u16 {
    response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// A whole request without a token: the server answers 401 and closes.
fn unauthorized_request(server: &McpServer) -> String {
    let mut stream = connect(server);
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}",
        server.address()
    );
    stream.write_all(request.as_bytes()).expect("write");
    read_until_closed(&mut stream).expect("an answer")
}

#[test]
fn a_connection_that_sends_no_request_or_half_a_body_is_let_go_after_the_read_timeout() {
    // Long enough that the test's own writes are never late on a loaded machine.
    let (_game, server) = game(|mcp| mcp.request_read_timeout(Duration::from_secs(2)));

    let mut silent = connect(&server);
    let started = Instant::now();
    let said = read_until_closed(&mut silent).expect("closed by the server, not held until the client gave up");
    assert!(said.is_empty() || status(&said) == 408, "closed, or told why: {said:?}");
    assert!(started.elapsed() < CLIENT_PATIENCE);

    // Headers, with the token, announcing a body that never comes in full.
    let mut stalled = connect(&server);
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n{{\"jsonrpc\"",
        server.address()
    );
    stalled.write_all(head.as_bytes()).expect("write");
    let said = read_until_closed(&mut stalled).expect("answered, not held");
    assert_eq!(status(&said), 408, "{said}");
    assert!(said.contains("did not arrive within"), "says why: {said}");

    // The server still serves whole requests.
    assert_eq!(status(&unauthorized_request(&server)), 401);
}

/// A connection that presented the token (its request answered, the connection kept open for the next).
fn presenting_the_token(server: &McpServer) -> TcpStream {
    let mut stream = connect(server);
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: 2\r\n\r\n{{}}",
        server.address()
    );
    stream.write_all(request.as_bytes()).expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).expect("an answer"), 1, "answered, not closed: {head:?}");
        head.push(byte[0]);
    }
    stream
}

#[test]
fn connections_over_the_cap_are_answered_503_and_served_again_once_one_closes() {
    let (_game, server) = game(|mcp| mcp.max_connections(2));
    // Two idle connections that presented the token (accepted in order: each takes one of the two places).
    let first = presenting_the_token(&server);
    let _second = presenting_the_token(&server);

    let said = unauthorized_request(&server);
    assert_eq!(status(&said), 503, "{said}");
    assert!(said.to_ascii_lowercase().contains("retry-after: 1"), "{said}");
    assert!(said.contains("max_connections"), "says what raises the limit: {said}");

    // The server notices the close on its own task: until then, the place is still taken.
    drop(first);
    let deadline = Instant::now() + CLIENT_PATIENCE;
    let mut said = unauthorized_request(&server);
    while status(&said) == 503 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        said = unauthorized_request(&server);
    }
    assert_eq!(status(&said), 401, "a closed connection's place is free again: {said}");
}

#[test]
fn at_the_cap_a_connection_that_presented_no_token_gives_way_to_a_new_one() {
    let (_game, server) = game(|mcp| mcp.max_connections(2));
    // Someone without the token holds every place with connections that send nothing.
    let mut silent = [connect(&server), connect(&server)];
    // A new connection takes the place of the longest open of them.
    assert_eq!(status(&unauthorized_request(&server)), 401, "served, not refused for the silent ones");
    let mut closed = 0;
    for stream in &mut silent {
        stream.set_read_timeout(Some(Duration::from_secs(2))).expect("timeout");
        closed += usize::from(read_until_closed(stream).is_ok_and(|said| said.is_empty()));
    }
    assert_eq!(closed, 1, "one gave way, closed without a word");
    // With every place held by connections that presented the token, none gives way.
    let _held = [presenting_the_token(&server), presenting_the_token(&server)];
    let deadline = Instant::now() + CLIENT_PATIENCE;
    let mut said = unauthorized_request(&server);
    while status(&said) != 503 && Instant::now() < deadline {
        said = unauthorized_request(&server);
    }
    assert_eq!(status(&said), 503, "{said}");
}
