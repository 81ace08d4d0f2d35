//! `mcp_body`: an input is the body of a POST to the game's MCP endpoint, as a real client sends it: authorized,
//! with the headers of its protocol generation, over a kept-alive HTTP/1.1 connection to a running headless game
//! (the fuzz game of [`crate::game`], its world open, frames every millisecond on their own thread).
//!
//! Each input is sent twice: inside a 2025-11-25 session this harness initialized (`Mcp-Session-Id`), and as a
//! sessionless 2026-07-28 request, with the `Mcp-Method` and `Mcp-Name` headers a client derives from the body.
//! Each must get a complete HTTP response within [`RESPONSE_LIMIT`] (else it is a hang), never a 5xx, and a
//! body in the content type it announces (JSON, or server-sent events whose data are JSON). Nothing may panic
//! anywhere in the process, and every [`LIVENESS_EVERY`] inputs a trivial tool call must still succeed and the
//! game must still run its frames with the world open.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use bevy_agent_tools::mcp::{McpPlugin, McpServer};
use bevy_agent_tools::testing::{headless_app_with, RunningGame};
use bevy_agent_tools::{AgentHandle, EnterWorld, ErrorCode};
use serde_json::Value;

use crate::game::{self, is_allowed_code};
use crate::panics;

/// How long a response may take to arrive in full before the input counts as a hang. The fuzz game's tools take
/// a few frames at most.
pub const RESPONSE_LIMIT: Duration = Duration::from_secs(10);

/// How often (in inputs) a trivial call checks that the server still answers and the game still runs.
pub const LIVENESS_EVERY: u64 = 64;

const TOKEN: &str = "fuzz-token-0123456789abcdef";
const SESSION_VERSION: &str = "2025-11-25";
const STATELESS_VERSION: &str = "2026-07-28";

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"fuzz","version":"1"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
const LIVENESS: &str = r#"{"jsonrpc":"2.0","id":"liveness","method":"tools/call","params":{"name":"peek","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"fuzz-liveness","version":"1"}}}}"#;

/// Which protocol generation a request speaks.
#[derive(Clone, Copy, Debug)]
enum Mode {
    /// 2025-11-25, inside the harness's session.
    Session,
    /// 2026-07-28, no session.
    Stateless,
}

/// One complete HTTP response.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }
}

/// The running game, and a kept-alive connection to its MCP endpoint.
pub struct McpBody {
    game: RunningGame,
    address: SocketAddr,
    connection: Option<BufReader<TcpStream>>,
    session: String,
    inputs: u64,
}

impl McpBody {
    /// Starts the game with MCP on a free port, enters the fuzz world and initializes a session.
    pub fn new() -> Self {
        panics::watch();
        let token_file = std::env::temp_dir().join(format!("bevy_agent_tools-fuzz-{}.token", std::process::id()));
        let plugin = McpPlugin::new().port(0).token(TOKEN).token_file(&token_file);
        let game = RunningGame::spawn(Duration::from_millis(1), move || headless_app_with(game::plugin(), plugin));
        // The token is set above: its file is of no use here, and fuzzing must not leave one per process.
        let _ = std::fs::remove_file(&token_file);
        let address = game.with_app(|app| {
            app.world_mut().write_message(EnterWorld::new(game::WORLD));
            app.update();
            app.world().resource::<McpServer>().address()
        });
        let mut harness = Self { game, address, connection: None, session: String::new(), inputs: 0 };
        harness.initialize();
        harness.check_alive();
        harness
    }

    /// Sends `data` in both modes and checks both responses; every [`LIVENESS_EVERY`] inputs, checks liveness.
    pub fn run(&mut self, data: &[u8]) {
        for mode in [Mode::Session, Mode::Stateless] {
            let response = self.post(data, mode);
            check_response(&response, mode);
            if matches!(mode, Mode::Session) && response.status == 404 && response.body.ends_with(b"Session not found")
            {
                // Nothing a POST body says should end the session (only DELETE or idleness do): say so in the fuzz
                // log, and carry on in a new one.
                let excerpt = String::from_utf8_lossy(&data[..data.len().min(200)]);
                eprintln!("mcp_body: the session {} is gone after the body {excerpt:?}", self.session);
                self.initialize();
            }
        }
        panics::assert_none("this MCP body");
        self.inputs += 1;
        if self.inputs.is_multiple_of(LIVENESS_EVERY) {
            self.check_alive();
        }
    }

    /// A trivial tool call succeeds over MCP, and the game still runs its frames with the fuzz world open.
    pub fn check_alive(&mut self) {
        let response = self.post(LIVENESS.as_bytes(), Mode::Stateless);
        assert_eq!(response.status, 200, "the liveness call was refused: {}", describe(&response));
        let answered = messages(&response)
            .into_iter()
            .any(|message| message["id"] == "liveness" && message["result"]["isError"] == false);
        assert!(answered, "the liveness call did not succeed: {}", describe(&response));
        let open = self.game.with_app(|app| app.world().resource::<AgentHandle>().visit().is_some());
        assert!(open, "the fuzz world is no longer open");
        panics::assert_none("the liveness check");
    }

    fn initialize(&mut self) {
        self.session.clear();
        let response = self.post(INITIALIZE.as_bytes(), Mode::Session);
        assert_eq!(response.status, 200, "initialize was refused: {}", describe(&response));
        self.session = response.header("mcp-session-id").expect("initialize returns a session id").to_string();
        let response = self.post(INITIALIZED.as_bytes(), Mode::Session);
        assert_eq!(response.status, 202, "notifications/initialized was refused: {}", describe(&response));
    }

    /// POSTs `body` on the kept-alive connection (opening a new one if the server closed it) and reads the whole
    /// response. Panics, as a hang, if it is not complete within [`RESPONSE_LIMIT`].
    fn post(&mut self, body: &[u8], mode: Mode) -> Response {
        let mut request = format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n",
            self.address,
            body.len()
        );
        match mode {
            Mode::Session => {
                request.push_str(&format!("MCP-Protocol-Version: {SESSION_VERSION}\r\n"));
                if !self.session.is_empty() {
                    request.push_str(&format!("Mcp-Session-Id: {}\r\n", self.session));
                }
            }
            Mode::Stateless => {
                request.push_str(&format!("MCP-Protocol-Version: {STATELESS_VERSION}\r\n"));
                for (name, value) in standard_headers(body) {
                    request.push_str(&format!("{name}: {value}\r\n"));
                }
            }
        }
        request.push_str("\r\n");
        let mut bytes = request.into_bytes();
        bytes.extend_from_slice(body);

        let deadline = Instant::now() + RESPONSE_LIMIT;
        let mut connection = match self.connection.take() {
            Some(connection) => connection,
            None => BufReader::new(TcpStream::connect(self.address).expect("connect to the MCP server")),
        };
        // A connection the server closed after the previous response fails here or at the first read: retry once
        // on a fresh one. Anything else is the server's doing.
        let response = match exchange(&mut connection, &bytes, deadline) {
            Ok(response) => response,
            Err(Exchange::Closed) => {
                connection = BufReader::new(TcpStream::connect(self.address).expect("reconnect to the MCP server"));
                match exchange(&mut connection, &bytes, deadline) {
                    Ok(response) => response,
                    Err(error) => panic!("{mode:?} request: {error}"),
                }
            }
            Err(error) => panic!("{mode:?} request: {error}"),
        };
        let close = response.header("connection").is_some_and(|value| value.eq_ignore_ascii_case("close"));
        if !close {
            self.connection = Some(connection);
        }
        response
    }
}

impl Default for McpBody {
    fn default() -> Self {
        Self::new()
    }
}

/// Why an exchange failed.
enum Exchange {
    /// The connection was closed before any byte of a response: a kept-alive connection the server let go.
    Closed,
    /// No complete response before the deadline.
    Hang,
    /// A response HTTP/1.1 cannot frame.
    Malformed(String),
}

impl std::fmt::Display for Exchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Closed => f.write_str("the server closed the connection without a response"),
            Self::Hang => write!(f, "hang: no complete response within {RESPONSE_LIMIT:?}"),
            Self::Malformed(why) => write!(f, "malformed response: {why}"),
        }
    }
}

/// Writes `request` and reads one response, every read bounded by what is left until `deadline` (a server that
/// keeps a stream open with keep-alive pings is a hang too).
fn exchange(connection: &mut BufReader<TcpStream>, request: &[u8], deadline: Instant) -> Result<Response, Exchange> {
    if connection.get_mut().write_all(request).is_err() {
        return Err(Exchange::Closed);
    }
    let status_line = read_line(connection, deadline)?;
    let Some(status_line) = status_line else { return Err(Exchange::Closed) };
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| Exchange::Malformed(format!("status line {status_line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let line = read_line(connection, deadline)?.ok_or_else(|| Exchange::Malformed("headers cut".into()))?;
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').ok_or_else(|| Exchange::Malformed(format!("header line {line:?}")))?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    let mut response = Response { status, headers, body: Vec::new() };
    let chunked = response.header("transfer-encoding").is_some_and(|value| value.eq_ignore_ascii_case("chunked"));
    if chunked {
        loop {
            let line = read_line(connection, deadline)?.ok_or_else(|| Exchange::Malformed("chunk cut".into()))?;
            let size = line.split(';').next().unwrap_or_default().trim();
            let size =
                usize::from_str_radix(size, 16).map_err(|_| Exchange::Malformed(format!("chunk size {line:?}")))?;
            if size == 0 {
                // Trailers, if any, end with an empty line.
                while !read_line(connection, deadline)?.unwrap_or_default().is_empty() {}
                break;
            }
            let start = response.body.len();
            response.body.resize(start + size, 0);
            read_exact(connection, &mut response.body[start..], deadline)?;
            let end = read_line(connection, deadline)?;
            if end.as_deref() != Some("") {
                return Err(Exchange::Malformed("a chunk does not end with CRLF".into()));
            }
        }
    } else if let Some(length) = response.header("content-length") {
        let length = length.parse().map_err(|_| Exchange::Malformed(format!("content-length {length:?}")))?;
        response.body.resize(length, 0);
        read_exact(connection, &mut response.body, deadline)?;
    }
    Ok(response)
}

/// Bounds the next read by the time left until `deadline`.
fn arm(connection: &mut BufReader<TcpStream>, deadline: Instant) -> Result<(), Exchange> {
    let left = deadline.checked_duration_since(Instant::now()).filter(|left| !left.is_zero()).ok_or(Exchange::Hang)?;
    connection.get_mut().set_read_timeout(Some(left)).map_err(|_| Exchange::Closed)
}

fn is_timeout(error: &std::io::Error) -> bool {
    matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

/// One CRLF-terminated line, without its CRLF; `None` at the end of the stream.
fn read_line(connection: &mut BufReader<TcpStream>, deadline: Instant) -> Result<Option<String>, Exchange> {
    let mut line = Vec::new();
    loop {
        arm(connection, deadline)?;
        match connection.read_until(b'\n', &mut line) {
            Ok(0) if line.is_empty() => return Ok(None),
            Ok(0) => return Err(Exchange::Malformed("a line cut by the end of the stream".into())),
            Ok(_) if line.ends_with(b"\n") => break,
            Ok(_) => {}
            Err(error) if is_timeout(&error) => return Err(Exchange::Hang),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) if line.is_empty() => return Ok(None),
            Err(error) => return Err(Exchange::Malformed(format!("reading a line: {error}"))),
        }
    }
    let line = line.strip_suffix(b"\r\n").ok_or_else(|| Exchange::Malformed("a bare LF".into()))?;
    String::from_utf8(line.to_vec()).map(Some).map_err(|_| Exchange::Malformed("a line that is not UTF-8".into()))
}

fn read_exact(connection: &mut BufReader<TcpStream>, buffer: &mut [u8], deadline: Instant) -> Result<(), Exchange> {
    let mut filled = 0;
    while filled < buffer.len() {
        arm(connection, deadline)?;
        match connection.read(&mut buffer[filled..]) {
            Ok(0) => return Err(Exchange::Malformed("a body cut by the end of the stream".into())),
            Ok(read) => filled += read,
            Err(error) if is_timeout(&error) => return Err(Exchange::Hang),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(Exchange::Malformed(format!("reading the body: {error}"))),
        }
    }
    Ok(())
}

/// Panics unless `response` is a well-formed answer: not a server error, and a body in the type it announces.
fn check_response(response: &Response, mode: Mode) {
    assert!(response.status < 500, "{mode:?} request: a server error: {}", describe(response));
    let content_type = response.header("content-type").unwrap_or_default();
    if content_type.starts_with("application/json") {
        let parsed = serde_json::from_slice::<Value>(&response.body);
        assert!(parsed.is_ok(), "{mode:?} request: a JSON response that is not JSON: {}", describe(response));
    }
    // A tool's error result carries one of the host's codes (an `INTERNAL` would be a caught panic), as JSON in
    // its text block and under `_meta`, and no `structuredContent` (it would not match the output schema).
    for message in messages(response) {
        let result = &message["result"];
        if result["isError"] == true {
            let error = &result["_meta"]["bevy-agent-tools/error"];
            let code = serde_json::from_value::<ErrorCode>(error["code"].clone());
            let text = result["content"][0]["text"].as_str().and_then(|text| serde_json::from_str::<Value>(text).ok());
            assert!(
                code.as_ref().is_ok_and(is_allowed_code)
                    && text.as_ref() == Some(error)
                    && result.get("structuredContent").is_none(),
                "{mode:?} request: an error result without an allowed code: {}",
                describe(response)
            );
        }
    }
}

/// The JSON-RPC messages of a response: its body if JSON, the data of its events if server-sent events (panics
/// on an event whose data is not JSON), none otherwise.
fn messages(response: &Response) -> Vec<Value> {
    let body = String::from_utf8_lossy(&response.body);
    if !response.header("content-type").unwrap_or_default().starts_with("text/event-stream") {
        return serde_json::from_str(&body).into_iter().collect();
    }
    let mut found = Vec::new();
    for event in body.split("\n\n") {
        let data: Vec<&str> = event.lines().filter_map(|line| line.strip_prefix("data:")).map(str::trim).collect();
        let data = data.join("\n");
        if data.is_empty() {
            continue;
        }
        match serde_json::from_str(&data) {
            Ok(message) => found.push(message),
            Err(error) => panic!("an event whose data is not JSON ({error}): {}", describe(response)),
        }
    }
    found
}

fn describe(response: &Response) -> String {
    let body = String::from_utf8_lossy(&response.body);
    let body: String = body.chars().take(2000).collect();
    format!("HTTP {} {:?}\n{body}", response.status, response.headers)
}

/// The SEP-2243 headers a 2026-07-28 client derives from the body it sends: `Mcp-Method`, and `Mcp-Name` for the
/// methods that name something. A value no HTTP header can carry is left out, as a client's HTTP library would.
fn standard_headers(body: &[u8]) -> Vec<(&'static str, String)> {
    let Ok(message) = serde_json::from_slice::<Value>(body) else { return Vec::new() };
    let Some(method) = message.get("method").and_then(Value::as_str) else { return Vec::new() };
    let mut headers = Vec::new();
    if is_header_safe(method) {
        headers.push(("Mcp-Method", method.to_string()));
    }
    let name_key = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => Some("uri"),
        "tasks/get" | "tasks/update" | "tasks/cancel" => Some("taskId"),
        _ => None,
    };
    let name = name_key.and_then(|key| message.get("params")?.get(key)?.as_str());
    if let Some(name) = name {
        headers.push(("Mcp-Name", encode_header_value(name)));
    }
    headers
}

/// No CR, LF or other control character: nothing that could end the header or the request head early.
fn is_header_safe(value: &str) -> bool {
    !value.chars().any(|c| c.is_control() && c != '\t')
}

/// As rmcp's client encodes it: plain if printable ASCII without surrounding blanks, else `=?base64?...?=`.
fn encode_header_value(value: &str) -> String {
    let printable = value.bytes().all(|b| (0x20..=0x7e).contains(&b));
    let padded = value.starts_with([' ', '\t']) || value.ends_with([' ', '\t']);
    let looks_encoded = value.starts_with("=?base64?") && value.ends_with("?=");
    if printable && !padded && !looks_encoded {
        return value.to_string();
    }
    format!("=?base64?{}?=", base64(value.as_bytes()))
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let word = chunk.iter().enumerate().fold(0u32, |word, (i, &b)| word | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(word >> (18 - 6 * i)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
