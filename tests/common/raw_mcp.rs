//! MCP over plain HTTP/1.1, for tests that need a session a real client would not leave alone (one left idle to
//! expire) or a request no client sends.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The text of a `method` request to `/mcp` with `headers` (a `Host` naming `address` unless they give one) and
/// `body`, on a connection that closes after it.
pub fn request_text(address: SocketAddr, method: &str, headers: &[(&str, &str)], body: &str) -> String {
    request_text_to(address, method, "/mcp", headers, body)
}

/// [`request_text`] to another `path`.
pub fn request_text_to(address: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> String {
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
        request.push_str(&format!("Host: {address}\r\n"));
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    request
}

/// Sends a `method` request to `/mcp` with `headers` and `body`; returns the status and the whole response.
pub fn request(address: SocketAddr, method: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    request_to(address, method, "/mcp", headers, body)
}

/// [`request`] to another `path`.
pub fn request_to(
    address: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(request_text_to(address, method, path, headers, body).as_bytes()).expect("write");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, response)
}

/// Sends one POST to `/mcp` with the bearer `token` and `headers`; returns the status and the whole response.
pub fn send(address: SocketAddr, token: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    let bearer = format!("Bearer {token}");
    let mut with_token = vec![("Authorization", bearer.as_str())];
    with_token.extend_from_slice(headers);
    request(address, "POST", &with_token, body)
}

/// Opens an MCP 2025-11-25 session (initialize, then `notifications/initialized`); returns its id.
pub fn open_session(address: SocketAddr, token: &str) -> String {
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let (status, response) = send(address, token, &[], initialize);
    assert_eq!(status, 200, "{response}");
    let session = response
        .lines()
        .find_map(|line| {
            line.to_ascii_lowercase().starts_with("mcp-session-id:").then(|| line[15..].trim().to_string())
        })
        .expect("a session id");
    let in_session = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];
    send(address, token, &in_session, r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    session
}

/// Whether the server still knows session `id`: a request in it is not refused with 404 (a request crossing the
/// close too).
pub fn session_is_open(address: SocketAddr, token: &str, id: &str) -> bool {
    let list = r#"{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}}"#;
    let headers = [("Mcp-Session-Id", id), ("MCP-Protocol-Version", "2025-11-25")];
    let (status, response) = send(address, token, &headers, list);
    assert!(status == 200 || status == 404, "{status}: {response}");
    status == 200
}

/// Waits (at most `limit`) until session `id`, left idle, has expired: looked at every `2 × idle_timeout` (each
/// look is a request in the session, which starts its idle time again); panics if it has not.
pub fn wait_until_session_expires(address: SocketAddr, token: &str, id: &str, idle_timeout: Duration, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        std::thread::sleep(idle_timeout * 2);
        if !session_is_open(address, token, id) {
            return;
        }
        assert!(Instant::now() < deadline, "session {id} did not expire within {limit:?}");
    }
}
