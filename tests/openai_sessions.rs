//! In-game agent sessions (DESIGN §6b) with the OpenAI-compatible backend (feature `openai`): a real game loop,
//! a real HTTP server speaking chat completions with SSE (axum), replaying scripted streamed answers. Only the
//! model's choices are scripted; the loop, the HTTP, the tool calls and the history are the real ones.

mod common;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use bevy::prelude::*;
use bevy_agent_tools::mcp::McpPlugin;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::session::*;
use bevy_agent_tools::testing::{headless_app_with, Gate, RunningGame};
use bevy_agent_tools::{CallStarted, ConversationId, ConversationStatus, ConversationStatusChanged, ImageContent};
use common::game_log::GameLog;
use common::*;
use parking_lot::Mutex;
use serde_json::{json, Value};

/// A bound for waits on things that happen in milliseconds: a failure, not a slow machine, if it passes.
const LIMIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------------------------
// The scripted OpenAI-compatible server.

/// One scripted answer to `POST /v1/chat/completions`.
enum Reply {
    /// `200`, an SSE stream of these pieces, then `data: [DONE]` (unless a piece stalls).
    Stream(Vec<Piece>),
    /// An HTTP error with a JSON error body and an optional `Retry-After`.
    Status(u16, Option<String>),
    /// An HTTP error with this body, as it is.
    Refusal(u16, &'static str),
    /// `200` with this whole chat completion as JSON: a server that ignores `stream: true`.
    Whole(Value),
    /// `200` with this HTML page: a proxy's or a captive portal's, not the endpoint's answer.
    Page(&'static str),
}

enum Piece {
    /// `data: JSON`.
    Data(Value),
    /// Bytes sent as they are.
    Raw(&'static str),
    /// Bytes sent as they are, which need not be UTF-8.
    Bytes(&'static [u8]),
    /// Sends nothing more, ever (until the client goes away).
    Stall,
    /// Breaks the connection, as a server that crashed mid-answer.
    Break,
    /// Ends the body here, cleanly but without `data: [DONE]` (a proxy that closed it mid-answer).
    Close,
    /// Waits this long before the next piece.
    Wait(Duration),
}

fn text(piece: &str) -> Piece {
    Piece::Data(json!({"id": "x", "choices": [{"index": 0, "delta": {"content": piece}}]}))
}
fn call(index: u32, id: &str, name: &str, arguments: &str) -> Piece {
    Piece::Data(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": arguments}}
    ]}}]}))
}
fn more_arguments(index: u32, arguments: &str) -> Piece {
    Piece::Data(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": index, "function": {"arguments": arguments}}
    ]}}]}))
}
fn named_arguments(index: u32, name: &str, arguments: &str) -> Piece {
    Piece::Data(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": index, "function": {"name": name, "arguments": arguments}}
    ]}}]}))
}
/// One tool-call fragment, each part optional, as servers vary.
fn fragment(index: Option<u32>, id: Option<&str>, name: Option<&str>, arguments: &str) -> Piece {
    let mut call = json!({"function": {"arguments": arguments}});
    if let Some(index) = index {
        call["index"] = json!(index);
    }
    if let Some(id) = id {
        call["id"] = json!(id);
        call["type"] = json!("function");
    }
    if let Some(name) = name {
        call["function"]["name"] = json!(name);
    }
    Piece::Data(json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}))
}
fn finish(reason: &str) -> Piece {
    Piece::Data(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}))
}
fn usage(prompt: u64, completion: u64) -> Piece {
    Piece::Data(json!({"choices": [], "usage": {
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion
    }}))
}
fn says(answer: &str) -> Reply {
    Reply::Stream(vec![text(answer), finish("stop")])
}
fn calls(pieces: Vec<Piece>) -> Reply {
    let mut pieces = pieces;
    pieces.push(finish("tool_calls"));
    Reply::Stream(pieces)
}

#[derive(Clone, Default)]
struct Script {
    replies: Arc<Mutex<VecDeque<Reply>>>,
    requests: Arc<Mutex<Vec<Value>>>,
    /// Streams the client went away from before their end.
    abandoned: Arc<AtomicUsize>,
    /// The bearer key every route wants, if any.
    key: Option<String>,
    /// The `Authorization` header of every request, as sent.
    authorizations: Arc<Mutex<Vec<Option<String>>>>,
    /// How many more requests get llama.cpp's `503 Loading model` (every route answers so until its model loads).
    loading: Arc<AtomicUsize>,
}

/// llama.cpp's server's answer to every request while its model loads (`middleware_server_state`).
const LOADING_MODEL: &str = r#"{"error":{"message":"Loading model","type":"unavailable_error","code":503}}"#;

/// llama.cpp's `503 Loading model`, if the script still has some to give.
fn still_loading(script: &Script) -> Option<Response> {
    let left = script.loading.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    left.is_ok().then(|| {
        let response = Response::builder().status(503).header("content-type", "application/json");
        response.body(Body::from(LOADING_MODEL)).unwrap()
    })
}

struct Server {
    url: String,
    script: Script,
    _runtime: tokio::runtime::Runtime,
}

impl Server {
    fn start() -> Self {
        Self::with_key(None)
    }

    fn with_key(key: Option<&str>) -> Self {
        let (server, listen) = Self::not_listening_yet(key);
        listen();
        server
    }

    /// A server whose port is bound but refuses connections until `listen` is called (as vLLM's does until its
    /// model has loaded).
    fn not_listening_yet(key: Option<&str>) -> (Self, impl FnOnce()) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let script = Script { key: key.map(str::to_string), ..Default::default() };
        let app = axum::Router::new()
            .route("/v1/models", get(models))
            .route("/v1/chat/completions", post(completions))
            .with_state(script.clone());
        let socket = runtime.block_on(async { tokio::net::TcpSocket::new_v4() }).unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let url = format!("http://{}/v1", socket.local_addr().unwrap());
        let handle = runtime.handle().clone();
        let listen = move || {
            let listener = handle.block_on(async { socket.listen(1024) }).unwrap();
            handle.spawn(async move { axum::serve(listener, app).await });
        };
        (Self { url, script, _runtime: runtime }, listen)
    }

    fn reply(&self, reply: Reply) -> &Self {
        self.script.replies.lock().push_back(reply);
        self
    }

    fn requests(&self) -> Vec<Value> {
        self.script.requests.lock().clone()
    }

    /// Request `request`'s messages as `role: text` lines.
    fn history(&self, request: usize) -> Vec<String> {
        self.messages(request).into_iter().map(|(role, text)| format!("{role}: {text}")).collect()
    }

    /// Waits until a stream was closed by the client before its end (`what` says which).
    fn wait_closed(&self, what: &str) {
        let until = Instant::now() + LIMIT;
        while self.script.abandoned.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < until, "{what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The names of the tools request `request` offered the model.
    fn tool_names(&self, request: usize) -> Vec<String> {
        let requests = self.requests();
        let tools = requests[request]["tools"].as_array().cloned().unwrap_or_default();
        tools.iter().filter_map(|tool| tool["function"]["name"].as_str().map(str::to_string)).collect()
    }

    /// Request `request`'s messages as (role, content) text.
    fn messages(&self, request: usize) -> Vec<(String, String)> {
        let requests = self.requests();
        requests[request]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                let content = match &m["content"] {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                };
                (m["role"].as_str().unwrap().to_string(), content)
            })
            .collect()
    }
}

fn unauthorized(script: &Script, headers: &HeaderMap) -> Option<Response> {
    let sent = headers.get("authorization").map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    script.authorizations.lock().push(sent);
    let key = script.key.as_ref()?;
    let sent = headers.get("authorization").and_then(|v| v.to_str().ok()).unwrap_or("");
    (sent != format!("Bearer {key}")).then(|| {
        // As some proxies do: the refusal quotes the key it was sent.
        let message = format!("Incorrect API key provided: {}", sent.trim_start_matches("Bearer "));
        let body = json!({"error": {"message": message, "type": "invalid_request_error"}});
        Response::builder().status(401).body(Body::from(body.to_string())).unwrap()
    })
}

async fn models(axum::extract::State(script): axum::extract::State<Script>, headers: HeaderMap) -> Response {
    if let Some(loading) = still_loading(&script) {
        return loading;
    }
    unauthorized(&script, &headers)
        .unwrap_or_else(|| Response::new(Body::from(json!({"object": "list", "data": []}).to_string())))
}

async fn completions(
    axum::extract::State(script): axum::extract::State<Script>,
    headers: HeaderMap,
    body: String,
) -> Response {
    if let Some(loading) = still_loading(&script) {
        return loading;
    }
    if let Some(refused) = unauthorized(&script, &headers) {
        return refused;
    }
    script.requests.lock().push(serde_json::from_str(&body).unwrap_or(Value::Null));
    let reply = script.replies.lock().pop_front();
    match reply {
        None => Response::builder().status(500).body(Body::from("no scripted reply left")).unwrap(),
        Some(Reply::Status(code, retry_after)) => {
            let body = json!({"error": {"message": format!("scripted {code}"), "type": "scripted"}});
            let mut response = Response::builder().status(StatusCode::from_u16(code).unwrap());
            if let Some(seconds) = retry_after {
                response = response.header("retry-after", seconds);
            }
            response.body(Body::from(body.to_string())).unwrap()
        }
        Some(Reply::Refusal(code, body)) => Response::builder()
            .status(StatusCode::from_u16(code).unwrap())
            .header("content-type", "application/json")
            .body(Body::from(body))
            .unwrap(),
        Some(Reply::Page(page)) => {
            Response::builder().header("content-type", "text/html; charset=utf-8").body(Body::from(page)).unwrap()
        }
        Some(Reply::Whole(answer)) => Response::builder()
            .header("content-type", "application/json; charset=utf-8")
            .body(Body::from(answer.to_string()))
            .unwrap(),
        Some(Reply::Stream(pieces)) => {
            struct Watch(Arc<AtomicUsize>, bool);
            impl Drop for Watch {
                fn drop(&mut self) {
                    if !self.1 {
                        self.0.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            let watch = Watch(script.abandoned.clone(), false);
            let pieces: VecDeque<Piece> = pieces.into();
            let stream = futures_util::stream::unfold((pieces, watch), |(mut pieces, mut watch)| async move {
                let bytes = match pieces.pop_front() {
                    Some(Piece::Data(value)) => format!("data: {value}\n\n").into_bytes(),
                    Some(Piece::Raw(raw)) => raw.as_bytes().to_vec(),
                    Some(Piece::Bytes(bytes)) => bytes.to_vec(),
                    Some(Piece::Stall) => std::future::pending().await,
                    Some(Piece::Wait(pause)) => {
                        tokio::time::sleep(pause).await;
                        Vec::new()
                    }
                    Some(Piece::Break) => {
                        watch.1 = true;
                        return Some((Err(std::io::Error::other("the server crashed")), (pieces, watch)));
                    }
                    Some(Piece::Close) => {
                        // Nothing more, and no `[DONE]` (the arm for the end sends it only when this is unset).
                        watch.1 = true;
                        pieces.clear();
                        Vec::new()
                    }
                    None if !watch.1 => {
                        watch.1 = true;
                        b"data: [DONE]\n\n".to_vec()
                    }
                    None => return None,
                };
                Some((Ok::<_, std::io::Error>(bytes), (pieces, watch)))
            });
            Response::builder().header("content-type", "text/event-stream").body(Body::from_stream(stream)).unwrap()
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The game.

#[derive(Resource, Clone, Default)]
struct Log(GameLog);

impl Log {
    fn lines(&self) -> Vec<String> {
        self.0.lines()
    }
    fn wait_for(&self, what: &str) -> String {
        self.0.wait_for(what, LIMIT)
    }
}

fn record(
    log: Res<Log>,
    mut deltas: MessageReader<ChatDelta>,
    mut messages: MessageReader<ChatMessage>,
    mut errors: MessageReader<ChatError>,
    mut statuses: MessageReader<ConversationStatusChanged>,
    mut started: MessageReader<CallStarted>,
) {
    let mut lines = Vec::new();
    lines.extend(deltas.read().map(|d| format!("delta {} {}: {}", d.session, d.message, d.text)));
    lines.extend(messages.read().map(|m| format!("message {} {}: {}", m.session, m.message, m.text)));
    lines.extend(errors.read().map(|e| format!("error {} {} [{}]: {}", e.session, e.code, e.scope, e.message)));
    lines.extend(statuses.read().map(|s| format!("status {} {}->{}", s.conversation, s.previous, s.status)));
    lines.extend(started.read().map(|c| format!("call-started {} {}", c.conversation, c.tool)));
    log.0.write(lines);
}

/// A running game in world `alpha` with `bump` and a `held` bump that parks at `gate`, with agent sessions whose
/// records and histories live in `data`.
struct Game {
    game: RunningGame,
    sessions: AgentSessions,
    log: Log,
    gate: Gate,
    executions: Arc<AtomicUsize>,
    /// `held`'s handlers whose step was answered (run or refused).
    answered: Gate,
}

impl Game {
    fn start(data: &Path) -> Self {
        Self::start_serving(data, true)
    }

    /// With `serve_mcp: false`, the game has no MCP server at all (no `McpPlugin`).
    fn start_serving(data: &Path, serve_mcp: bool) -> Self {
        Self::start_with(data, serve_mcp, None)
    }

    /// With `tool_wait`, a call for a tool not registered yet waits that long for it (`AgentToolsPlugin::tool_wait`).
    fn start_with(data: &Path, serve_mcp: bool, tool_wait: Option<Duration>) -> Self {
        let gate = Gate::new();
        let (executions, answered) = (Arc::new(AtomicUsize::new(0)), answers());
        let log = Log::default();
        let (data, built_gate, built_executions, built_answered, built_log) =
            (data.to_path_buf(), gate.clone(), executions.clone(), answered.clone(), log.clone());
        let game = RunningGame::spawn(Duration::from_millis(2), move || {
            let held = bump_tool_answered("held", ToolScope::World, built_executions, built_answered, Some(built_gate));
            let tools = AgentToolsPlugin::new(TestGame::default())
                .with_tool(bump_tool("bump", ToolScope::World, Arc::default(), None))
                .with_tool(held)
                .with_tool(
                    AgentTool::new(
                        "look",
                        "A picture of the world.",
                        |_: CallContext<Session>, _: NoArgs| async move {
                            Ok(serde_json::json!({ "picture": ImageContent::png("iVBORw0KGgo="), "seen": 3 }))
                        },
                    )
                    .read_only(),
                );
            let tools = match tool_wait {
                Some(wait) => tools.tool_wait(wait),
                None => tools,
            };
            let sessions = AgentSessionsPlugin::new().data_dir(data);
            let mut app = if serve_mcp {
                let mcp = McpPlugin::new().port(0).token("openai-sessions-token-0123456789");
                headless_app_with(tools, (mcp, sessions))
            } else {
                headless_app_with(tools, sessions)
            };
            app.insert_resource(built_log).add_systems(Update, record);
            bevy_agent_tools::testing::AgentTestAppExt::enter_world(&mut app, "alpha");
            app
        });
        let sessions = game.with_app(|app| app.world().resource::<AgentSessions>().clone());
        Self { game, sessions, log, gate, executions, answered }
    }

    fn block_on<T>(&self, future: impl std::future::Future<Output = T>) -> T {
        self.game.agent().runtime().block_on(async {
            tokio::time::timeout(LIMIT, future).await.expect("the session answered within the test's limit")
        })
    }

    fn create(&self, endpoint: OpenAiEndpoint) -> Result<AgentSession, ToolError> {
        self.block_on(self.sessions.create(SessionConfig::openai_endpoint(endpoint)))
    }

    fn counter(&self) -> u64 {
        self.game.with_app(|app| app.world().resource::<WorldLog>().0.len() as u64)
    }

    /// The session's status changes so far, as `previous->status`.
    fn wait_statuses(&self, id: &str, count: usize) -> Vec<String> {
        let prefix = format!("status {id} ");
        self.log.0.wait_until(&format!("{count} status changes"), LIMIT, |lines| {
            let statuses: Vec<String> =
                lines.iter().filter_map(|line| line.strip_prefix(&prefix).map(str::to_string)).collect();
            (statuses.len() >= count).then_some(statuses)
        })
    }
}

fn endpoint(server: &Server) -> OpenAiEndpoint {
    OpenAiEndpoint::new(&server.url, "scripted-model")
        .stall_timeout(Duration::from_secs(10))
        .retries(2, Duration::from_secs(2))
}

fn code_of<T: std::fmt::Debug>(result: Result<T, ToolError>) -> (ErrorCode, String) {
    let error = result.expect_err("an error");
    (error.code, error.message)
}

/// A game with a session on the scripted server, after one turn: "one", answered "first".
/// A game with a session on a scripted endpoint (and the data folder it keeps its records in).
fn started() -> (tempfile::TempDir, Server, Game, AgentSession) {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    let session = game.create(endpoint(&server)).expect("starts");
    (data, server, game, session)
}

fn after_one_turn() -> (tempfile::TempDir, Server, Game, AgentSession) {
    let (data, server, game, session) = started();
    server.reply(says("first"));
    game.block_on(session.send_text("one")).expect("a turn");
    (data, server, game, session)
}

/// After "one" was answered "first" and the next turn failed: `resume`, and the next turn's request carries the
/// history as it was before the failure.
/// The turn failed alone: the session takes the next text as it is (no `resume`), and the failed turn left no
/// trace in the history.
fn goes_on_with_the_failed_turn_left_out(game: &Game, server: &Server, session: &AgentSession) {
    assert_eq!(session.status(), ConversationStatus::Idle, "only the turn failed");
    server.reply(says("back"));
    game.block_on(session.send_text("three")).expect("a turn, without resume");
    let last = server.requests().len() - 1;
    assert_eq!(server.history(last), ["user: one", "assistant: first", "user: three"], "the failed turn left no trace");
}

fn tool_results(server: &Server, request: usize) -> Vec<String> {
    server.messages(request).into_iter().filter(|(role, _)| role == "tool").map(|(_, content)| content).collect()
}

// ---------------------------------------------------------------------------------------------------------------
// The loop.

#[test]
fn a_turn_streams_text_and_a_tool_call_split_across_chunks_changes_the_world_under_the_sessions_conversation() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server
        .reply(calls(vec![
            text("Calling "),
            text("bump."),
            call(0, "call-1", "bump", "{\"by\""),
            more_arguments(0, ": 2"),
            more_arguments(0, "}"),
            usage(40, 8),
        ]))
        .reply(Reply::Stream(vec![text("Done: "), text("counter is 2"), finish("stop"), usage(70, 5)]));
    let config = endpoint(&server).max_tool_rounds(3);
    let session =
        game.block_on(game.sessions.create(SessionConfig::openai_endpoint(config).system_prompt("Be brief.")));
    let session = session.expect("the session starts");
    let id = session.id().to_string();
    assert_eq!(session.status(), ConversationStatus::Idle);

    let player = "bump  it \"twice\"\nplease";
    let turn = game.block_on(session.send_text(player)).expect("the turn ends");
    assert_eq!(turn.stop_reason, StopReason::EndTurn);
    assert_eq!(turn.final_message.as_deref(), Some("Done: counter is 2"));
    assert_eq!(game.counter(), 1, "the model's one call changed the world once");

    let statuses = game.wait_statuses(&id, 4);
    assert_eq!(
        statuses,
        ["idle->running", "running->waiting_tool_result", "waiting_tool_result->running", "running->idle"]
    );
    game.log.wait_for(&format!("message {id} {id}-m2: Done: counter is 2"));
    let lines = game.log.lines();
    assert!(
        lines.contains(&format!("message {id} {id}-m1: Calling bump.")),
        "the message before the call ended at it: {lines:#?}"
    );
    assert_eq!(lines.iter().filter(|l| l.starts_with(&format!("delta {id} {id}-m1:"))).count(), 2, "{lines:#?}");
    assert!(lines.contains(&format!("call-started {id} bump")), "the call is the session's conversation's: {lines:#?}");

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0]["model"], "scripted-model");
    assert_eq!(requests[0]["stream"], true);
    let bump = requests[0]["tools"].as_array().unwrap().iter().find(|t| t["function"]["name"] == "bump").unwrap();
    assert!(bump["function"]["parameters"]["properties"]["by"].is_object(), "the tool's own arguments: {bump}");
    assert_eq!(server.messages(0)[0], ("system".to_string(), "Be brief.".to_string()));
    assert_eq!(server.messages(0)[1], ("user".to_string(), player.to_string()), "the player's text, word for word");
    let results = tool_results(&server, 1);
    assert_eq!(results.len(), 1);
    assert!(results[0].contains("\"counter\":2"), "{results:?}");
    assert_eq!(session.usage().map(|u| u.used_tokens), Some(75), "the endpoint's last usage report");
    assert_eq!(session.credential(), None, "a backend the game runs gets no MCP credential, though MCP is served");
}

#[test]
fn an_openai_session_calls_the_games_tools_in_process_and_needs_no_mcp_server() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start_serving(data.path(), false);
    assert!(game.game.with_app(|app| !app.world().contains_resource::<bevy_agent_tools::mcp::McpServer>()));
    server.reply(calls(vec![call(0, "call-1", "bump", "{\"by\": 3}")])).reply(says("Bumped."));
    let session = game.create(endpoint(&server)).expect("the session starts without an MCP server");
    let turn = game.block_on(session.send_text("bump it")).expect("the turn ends");
    assert_eq!(turn.final_message.as_deref(), Some("Bumped."));
    assert_eq!(game.counter(), 1, "the model's call changed the world");
    let results = tool_results(&server, 1);
    assert!(results.len() == 1 && results[0].contains("\"counter\":3"), "{results:?}");
    assert_eq!(session.credential(), None, "no MCP credential was minted");
}

#[test]
fn a_tools_image_goes_to_a_model_that_reads_images_as_an_image_part_and_is_summarized_for_one_that_does_not() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    let look = || calls(vec![call(0, "l1", "look", "{}")]);
    server.reply(look()).reply(says("a grassy field")).reply(look()).reply(says("I cannot see it"));
    let seeing = game.create(endpoint(&server).images(true)).expect("starts");
    assert_eq!(game.block_on(seeing.send_text("look")).expect("ends").final_message.as_deref(), Some("a grassy field"));
    let blind = game.create(endpoint(&server)).expect("starts");
    game.block_on(blind.send_text("look")).expect("ends");

    let requests = server.requests();
    let messages = |request: usize| requests[request]["messages"].as_array().cloned().unwrap_or_default();
    let after_tool = messages(1).last().cloned().expect("a message after the tool result");
    assert_eq!(after_tool["role"], "user");
    assert_eq!(after_tool["content"][1]["image_url"]["url"], "data:image/png;base64,iVBORw0KGgo=");
    // Never a user message right after a tool result: Mistral's API refuses that order ("Unexpected role 'user'
    // after role 'tool'"), as do strict chat templates.
    for request in 0..requests.len() {
        let roles: Vec<String> = messages(request).iter().map(|m| m["role"].as_str().unwrap_or("").into()).collect();
        assert!(!roles.windows(2).any(|pair| pair[0] == "tool" && pair[1] == "user"), "request {request}: {roles:?}");
    }
    let result = &tool_results(&server, 1)[0];
    assert!(result.contains("image 1 of the images that follow") && result.contains("\"seen\":3"), "{result}");
    assert!(!result.contains("iVBORw0KGgo="), "the image travels once, as an image part");

    let blind_result = &tool_results(&server, 3)[0];
    assert!(
        blind_result.contains("not shown to this model") && !blind_result.contains("iVBORw0KGgo="),
        "{blind_result}"
    );
    assert!(messages(3).iter().all(|m| !m["content"].to_string().contains("image_url")));
}

#[test]
fn a_request_carries_the_four_newest_images_however_many_the_turns_rounds_added() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    for n in 0..6 {
        server.reply(calls(vec![call(0, &format!("l{n}"), "look", "{}")]));
    }
    server.reply(says("seen"));
    let session = game.create(endpoint(&server).images(true)).expect("starts");
    assert_eq!(
        game.block_on(session.send_text("look six times")).expect("ends").final_message.as_deref(),
        Some("seen")
    );
    let last = server.requests().last().cloned().expect("requests");
    let text = last["messages"].to_string();
    assert_eq!(text.matches("\"type\":\"image_url\"").count(), 4, "the four newest images");
    assert_eq!(text.matches("no longer sent").count(), 2, "the two older ones, each a line saying so");
}

#[test]
fn two_tool_calls_in_one_answer_run_in_order_and_both_results_go_back() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server
        .reply(calls(vec![
            call(0, "a", "bump", "{\"by\":"),
            call(1, "b", "bump", "{\"by\":"),
            more_arguments(1, "10}"),
            more_arguments(0, "1}"),
        ]))
        .reply(says("both done"));
    let session = game.create(endpoint(&server)).expect("starts");
    let turn = game.block_on(session.send_text("two")).expect("ends");
    assert_eq!(turn.final_message.as_deref(), Some("both done"));
    assert_eq!(game.counter(), 2);
    let second = &server.requests()[1]["messages"];
    let tools: Vec<&Value> = second.as_array().unwrap().iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(tools.iter().map(|m| m["tool_call_id"].as_str().unwrap()).collect::<Vec<_>>(), ["a", "b"]);
    let results: Vec<Value> =
        tools.iter().map(|m| serde_json::from_str(m["content"].as_str().unwrap()).unwrap()).collect();
    assert_eq!((&results[0]["result"]["counter"], &results[1]["result"]["counter"]), (&json!(1), &json!(11)));
    let visit = game.game.agent().visit().expect("the world is open").info.visit;
    for result in &results {
        // H11: each result says the visit and location it observed, as MCP's `_meta` does.
        let observed = &result["observed"];
        assert_eq!((&observed["world"], &observed["location"]["revision"]), (&json!("alpha"), &json!(0)), "{result}");
        assert_eq!(observed["visit"], serde_json::to_value(visit).expect("a visit id"), "{result}");
    }
}

#[test]
fn parallel_tool_calls_that_all_say_index_0_as_ollama_sends_them_run_as_separate_calls() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    // Ollama: each call whole, in its own fragment, every one at index 0.
    server.reply(calls(vec![call(0, "a", "bump", "{\"by\":1}"), call(0, "b", "bump", "{\"by\":10}")]));
    // A server that repeats the call's name in every fragment of it.
    server.reply(calls(vec![call(0, "c", "bump", "{\"by\":"), named_arguments(0, "bump", "100}")]));
    server.reply(says("all done"));
    let session = game.create(endpoint(&server)).expect("starts");
    let turn = game.block_on(session.send_text("parallel")).expect("ends");
    assert_eq!(turn.final_message.as_deref(), Some("all done"));
    assert_eq!(game.counter(), 3, "three calls ran, each once");
    let second = &server.requests()[1]["messages"];
    let tools: Vec<&Value> = second.as_array().unwrap().iter().filter(|m| m["role"] == "tool").collect();
    assert_eq!(tools.iter().map(|m| m["tool_call_id"].as_str().unwrap()).collect::<Vec<_>>(), ["a", "b"]);
    assert!(tools[1]["content"].as_str().unwrap().contains("\"counter\":11"), "{:?}", tools[1]);
    let results = tool_results(&server, 2);
    assert_eq!(results.len(), 3, "the third call's result went back too");
    assert!(results[2].contains("\"counter\":111"), "each with its own arguments: {results:?}");
}

/// Waits until the model's call reached the `held` tool's gate.
fn wait_held(game: &Game) {
    game.block_on(game.gate.arrivals(1));
}

#[test]
fn cancelling_a_turn_during_its_tool_call_cancels_the_call_in_the_game_and_the_model_reads_that_next_turn() {
    cancel_during_held_call("{}");
}

/// A keyed call (one the model gave an `operation_id`) would go on running if its handle were only dropped.
#[test]
fn cancelling_a_turn_during_a_keyed_tool_call_cancels_that_call_too() {
    cancel_during_held_call(r#"{"operation_id":"u1"}"#);
}

fn cancel_during_held_call(arguments: &str) {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.reply(calls(vec![call(0, "h", "held", arguments)]));
    let session = game.create(endpoint(&server)).expect("starts");
    let turn = game.block_on(session.start_turn("hold")).expect("sent");
    wait_held(&game);
    assert!(session.cancel());
    assert_eq!(game.block_on(turn).expect("it ends").stop_reason, StopReason::Cancelled);
    game.gate.open();
    game.block_on(game.answered.arrivals(1));
    assert_eq!(game.executions.load(Ordering::SeqCst), 0, "the cancelled call applied nothing, then or later");
    assert_eq!(session.status(), ConversationStatus::Idle);

    server.reply(says("noted"));
    game.block_on(session.send_text("again")).expect("the next turn");
    let results = tool_results(&server, 1);
    assert!(results.len() == 1 && results[0].contains("CANCELLED"), "the model is told what became of it: {results:?}");
}

#[test]
fn ending_a_session_while_its_turn_streams_closes_the_request_and_keeps_the_turn_as_a_cancel_would() {
    let (_data, server, game, session) = after_one_turn();
    server.reply(Reply::Stream(vec![text("half an ans"), Piece::Stall]));
    let id = session.id().to_string();
    let pending = game.block_on(session.start_turn("two")).expect("sent");
    game.log.wait_for(&format!("delta {id} {id}-m2: half an ans"));
    game.block_on(session.end());
    let (code, _) = code_of(game.block_on(pending));
    assert_eq!(code, ErrorCode::SessionEnded);
    server.wait_closed("the endpoint saw the request closed (it stops generating)");
    game.block_on(session.resume()).expect("resumed");
    server.reply(says("back"));
    game.block_on(session.send_text("three")).expect("a turn");
    let history = server.history(2);
    assert_eq!(
        history,
        ["user: one", "assistant: first", "user: two", "assistant: half an ans", "user: three"],
        "the model remembers what was said before the end, as after a cancel"
    );
}

#[test]
fn a_cancel_while_the_turn_waits_for_the_games_observation_stops_it_before_it_is_sent() {
    let (_data, server, game, session) = started();
    let (ended_tx, ended) = std::sync::mpsc::channel();
    let (sending, cancelling, runtime) = (session.clone(), session.clone(), game.game.agent().runtime().clone());
    // On the game's thread: no frame runs meanwhile, and the observation the turn waits for needs one.
    let cancelled = game.game.with_app(move |_| {
        runtime.spawn(async move { ended_tx.send(sending.send_text("hello").await) });
        let until = Instant::now() + LIMIT;
        while !cancelling.cancel() {
            assert!(Instant::now() < until, "the turn began");
            std::thread::sleep(Duration::from_millis(1));
        }
        cancelling.status()
    });
    assert_eq!(cancelled, ConversationStatus::Idle, "nothing ran");
    let end = ended.recv_timeout(LIMIT).expect("one outcome").expect("the turn's end");
    assert_eq!((end.stop_reason, end.final_message), (StopReason::Cancelled, None));
    assert!(server.requests().is_empty(), "its text was never sent");
    server.reply(says("hi"));
    assert_eq!(game.block_on(session.send_text("again")).expect("the next turn").final_message.as_deref(), Some("hi"));
}

#[test]
fn a_second_text_while_the_first_waits_for_the_games_observation_is_session_busy_at_once() {
    let (_data, server, game, session) = started();
    server.reply(says("first"));
    let (first_tx, first) = std::sync::mpsc::channel();
    let (sending, second, agent) = (session.clone(), session.clone(), game.game.agent());
    // On the game's thread: no frame runs meanwhile, so the first text waits for the observation it asked for.
    let (refused, asked) = game.game.with_app(move |_| {
        let runtime = agent.runtime().clone();
        runtime.spawn(async move { first_tx.send(sending.send_text("one").await) });
        let until = Instant::now() + LIMIT;
        while agent.queued_steps() == 0 {
            assert!(Instant::now() < until, "the first text never asked for its observation");
            std::thread::yield_now();
        }
        let refused = runtime.block_on(second.start_turn("two")).err().map(|error| error.code);
        (refused, agent.queued_steps())
    });
    assert_eq!(refused, Some(ErrorCode::SessionBusy), "refused at once, not after the first text's wait");
    assert_eq!(asked, 1, "the refused text asked the game for nothing");
    let end = first.recv_timeout(LIMIT).expect("one outcome").expect("the first turn ends");
    assert_eq!(end.final_message.as_deref(), Some("first"));
    assert_eq!(server.history(0), ["user: one"], "only the first text reached the model");
}

#[test]
fn a_session_ended_during_its_tool_call_tells_the_model_the_game_stopped_the_turn_not_the_player() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.reply(calls(vec![call(0, "h", "held", "{}")]));
    let session = game.create(endpoint(&server)).expect("starts");
    let pending = game.block_on(session.start_turn("hold")).expect("sent");
    wait_held(&game);
    game.block_on(session.end());
    assert_eq!(code_of(game.block_on(pending)).0, ErrorCode::SessionEnded);
    game.gate.open();
    game.block_on(session.resume()).expect("resumed");
    server.reply(says("understood"));
    game.block_on(session.send_text("again")).expect("the next turn");
    let results = tool_results(&server, 1);
    // The game stopped it, or the call ended with its conversation first: never "the player cancelled".
    assert!(
        results.len() == 1 && results[0].contains("CANCELLED") && !results[0].contains("player"),
        "the model is told who stopped it: {results:?}"
    );
}

#[test]
fn a_whole_json_answer_from_a_server_that_ignores_stream_is_read_as_the_stream_it_stands_for() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    let call = json!({"id": "w", "type": "function", "function": {"name": "bump", "arguments": "{\"by\":5}"}});
    server
        .reply(Reply::Whole(json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null, "tool_calls": [call]}}]})))
        .reply(Reply::Whole(json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "added five"}}]})));
    let session = game.create(endpoint(&server)).expect("starts");
    let turn = game.block_on(session.send_text("add five")).expect("a turn");
    assert_eq!((turn.final_message.as_deref(), turn.stop_reason), (Some("added five"), StopReason::EndTurn));
    let results = tool_results(&server, 1);
    assert!(
        results.len() == 1 && results[0].contains("\"counter\":5"),
        "the call ran, with its arguments: {results:?}"
    );
}

#[test]
fn a_history_that_cannot_be_saved_is_shown_to_the_player_and_the_turn_still_ends() {
    let (data, server, game, session) = after_one_turn();
    let id = session.id().to_string();
    // Its folder gone (as a full disk or a removed drive would fail the write): the write fails.
    std::fs::remove_dir_all(data.path().join(&id)).unwrap();
    server.reply(says("second"));
    let turn = game.block_on(session.send_text("two")).expect("the turn ends");
    assert_eq!(turn.final_message.as_deref(), Some("second"));
    let shown = game.log.wait_for(&format!("error {id} HISTORY_NOT_SAVED [notice]"));
    assert!(shown.contains("could not be saved"), "{shown}");
    assert_eq!(session.status(), ConversationStatus::Idle, "nothing failed");
}

#[test]
fn a_damaged_history_is_kept_aside_when_its_session_starts_anew() {
    let (data, server, game, session) = after_one_turn();
    game.block_on(session.end());
    let history = data.path().join(session.id().as_str()).join("history.json");
    std::fs::write(&history, b"{not json").unwrap();
    assert_eq!(game.block_on(session.resume()).expect("resumed"), Attached::Replaced);
    let aside = data.path().join(session.id().as_str()).join("history.json.unreadable");
    assert_eq!(std::fs::read(&aside).unwrap(), b"{not json", "what could not be read is still there");
    server.reply(says("hello again"));
    game.block_on(session.send_text("two")).expect("a turn");
    assert_eq!(server.history(1), ["user: two"], "the session started anew");
}

#[test]
fn one_call_in_fragments_stays_one_call_whether_the_server_repeats_its_id_omits_its_index_or_changes_its_id() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    let by = "{\"by\":";
    // The id on every fragment.
    server.reply(calls(vec![call(0, "a", "bump", by), fragment(Some(0), Some("a"), None, "1}")]));
    // No index at all, the id repeated.
    server.reply(calls(vec![fragment(None, Some("b"), Some("bump"), by), fragment(None, Some("b"), None, "10}")]));
    // An id that changes between fragments of one call (no name with the new one).
    server.reply(calls(vec![call(0, "c1", "bump", by), fragment(Some(0), Some("c2"), None, "100}")]));
    // A placeholder `"null"` on a later fragment (the GLM model Mistral hosts): the real id stays.
    server.reply(calls(vec![call(0, "abc123XYZ", "bump", by), fragment(Some(0), Some("null"), None, "1000}")]));
    server.reply(says("done"));
    let session = game.create(endpoint(&server)).expect("starts");
    let turn = game.block_on(session.send_text("four bumps")).expect("ends");
    assert_eq!(turn.final_message.as_deref(), Some("done"));
    assert_eq!(game.counter(), 4, "four calls, each run once");
    let results = tool_results(&server, 4);
    assert_eq!(results.len(), 4, "{results:?}");
    let last = &server.requests()[4];
    let messages = last["messages"].as_array().cloned().unwrap_or_default();
    let ids: Vec<&str> = messages.iter().filter_map(|m| m["tool_call_id"].as_str()).collect();
    assert_eq!(ids.last(), Some(&"abc123XYZ"), "the tool result answers the real id: {ids:?}");
    for (result, counter) in results.iter().zip([1, 11, 111, 1111]) {
        assert!(result.contains(&format!("\"counter\":{counter}")), "each whole, with its arguments: {results:?}");
    }
}

#[test]
fn what_the_server_sends_with_a_tool_call_to_have_back_goes_back_with_it() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    // Gemini's OpenAI-compatible endpoint: a thought signature on the call, refused if the next request lacks it.
    let signature = json!({"google": {"thought_signature": "c2lnbmF0dXJl"}});
    let signed = Piece::Data(json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1",
        "type": "function", "function": {"name": "bump", "arguments": "{}"}, "extra_content": signature}]}}]}));
    server.reply(calls(vec![signed])).reply(says("done"));
    let session = game.create(endpoint(&server)).expect("starts");
    game.block_on(session.send_text("bump")).expect("ends");
    let requests = server.requests();
    let messages = requests[1]["messages"].as_array().cloned().unwrap_or_default();
    let call = messages.iter().find_map(|m| m["tool_calls"].as_array().and_then(|calls| calls.first().cloned()));
    assert_eq!(call.expect("the call, in the next request")["extra_content"], signature);
}

#[test]
fn s3_a_world_exit_during_the_models_tool_call_gives_it_visit_ended_and_applies_nothing() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.reply(calls(vec![call(0, "h", "held", "{}")])).reply(says("the world closed"));
    let session = game.create(endpoint(&server)).expect("starts");
    let turn = game.block_on(session.start_turn("hold")).expect("sent");
    wait_held(&game);
    assert_eq!(session.status(), ConversationStatus::WaitingToolResult);
    game.game.with_app(|app| {
        app.world_mut().write_message(ExitWorld::new());
    });
    game.gate.open();
    let ended = game.block_on(turn).expect("the turn still ends");
    assert_eq!(ended.final_message.as_deref(), Some("the world closed"));
    let results = tool_results(&server, 1);
    assert!(results[0].contains("VISIT_ENDED"), "the model was told: {results:?}");
    game.block_on(game.answered.arrivals(1));
    assert_eq!(game.executions.load(Ordering::SeqCst), 0, "nothing was applied, then or later");
    assert_eq!(session.status(), ConversationStatus::Idle, "the session goes on");
}

#[test]
fn s1_send_text_during_a_turn_is_session_busy_and_cancel_mid_stream_aborts_the_request_and_ends_it_cancelled() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.reply(Reply::Stream(vec![text("thinking"), Piece::Stall]));
    let session = game.create(endpoint(&server)).expect("starts");
    let id = session.id().to_string();
    let waiting = game.block_on(session.start_turn("wait")).expect("sent");
    game.log.wait_for(&format!("delta {id} {id}-m1: thinking"));
    let (code, message) = code_of(game.block_on(session.send_text("hello")));
    assert_eq!(code, ErrorCode::SessionBusy, "{message}");
    assert_eq!(server.requests().len(), 1, "nothing was sent");
    assert!(session.cancel());
    let cancelled = game.block_on(waiting).expect("the turn ends");
    assert_eq!(cancelled.stop_reason, StopReason::Cancelled);
    server.wait_closed("the request in flight was closed");
    assert_eq!(session.status(), ConversationStatus::Idle);

    server.reply(says("yes"));
    game.block_on(session.send_text("still there?")).expect("the next turn works");
    let history = server.history(1);
    assert_eq!(history, ["user: wait", "assistant: thinking", "user: still there?"], "the refused text never went");
}

#[test]
fn a_turn_cancelled_before_the_model_said_anything_never_makes_two_user_messages_in_a_row() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.reply(Reply::Stream(vec![Piece::Stall]));
    let session = game.create(endpoint(&server)).expect("starts");
    let waiting = game.block_on(session.start_turn("stop")).expect("sent");
    let until = Instant::now() + LIMIT;
    while server.requests().is_empty() {
        assert!(Instant::now() < until, "the request was made");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(session.cancel());
    assert_eq!(game.block_on(waiting).expect("ends").stop_reason, StopReason::Cancelled);
    server.reply(says("ok"));
    game.block_on(session.send_text("build a tower")).expect("a turn");
    let sent = &server.requests()[1]["messages"];
    let roles: Vec<&str> = sent.as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert!(
        roles.windows(2).all(|pair| pair[0] != pair[1]),
        "the roles alternate, as strict templates want: {roles:?}"
    );
    let user = sent.as_array().unwrap().iter().find(|m| m["role"] == "user").unwrap();
    assert_eq!(user["content"], "stop\n\nbuild a tower", "both texts, word for word, apart");
}

#[test]
fn an_answer_cut_at_its_token_limit_during_a_tool_call_ends_the_turn_max_tokens_and_runs_nothing() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.reply(Reply::Stream(vec![text("Let me"), call(0, "a", "bump", "{\"by\":"), finish("length")]));
    let session = game.create(endpoint(&server)).expect("starts");
    let turn = game.block_on(session.send_text("bump")).expect("ends");
    assert_eq!(turn.stop_reason, StopReason::MaxTokens);
    assert_eq!(game.counter(), 0, "the cut-short call never ran");
    assert_eq!(server.requests().len(), 1, "nothing more was asked of the model");
    // The player is told why the call it announced never came.
    let shown = game.log.wait_for(&format!("error {} CALL_CUT_SHORT [notice]", session.id()));
    assert!(shown.contains("while it wrote its call to `bump`: nothing was run"), "{shown}");
}

#[test]
fn with_a_known_context_window_the_history_sent_fits_two_bytes_a_token_of_it() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    // 300 tokens: at most 600 bytes of history go with a request.
    let session = game.create(endpoint(&server).context_window(300)).expect("starts");
    let long = |n: u32| format!("turn {n} {}", "x".repeat(200));
    for n in 0..4 {
        server.reply(says(&format!("answer {n}")));
        game.block_on(session.send_text(long(n))).expect("a turn");
    }
    let history = server.history(3);
    let kept: Vec<&String> = history.iter().filter(|line| line.contains("answer")).collect();
    assert!(!kept.is_empty() && kept.len() < 3, "only the newest turns fit: {history:#?}");
    assert!(!history.iter().any(|line| line.contains("turn 0")), "the oldest turn went: {history:#?}");
    assert!(
        history.iter().any(|line| line.contains("earlier turns of this conversation were dropped")),
        "{history:#?}"
    );
    assert!(history.last().is_some_and(|line| line.contains("turn 3")), "this turn's text is always sent");
}

#[test]
fn max_tool_rounds_ends_the_turn_with_max_turn_requests_and_the_extra_calls_never_run() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.reply(calls(vec![call(0, "1", "bump", "{\"by\":1}")])).reply(calls(vec![call(
        0,
        "2",
        "bump",
        "{\"by\":1}",
    )]));
    let session = game.create(endpoint(&server).max_tool_rounds(1)).expect("starts");
    let turn = game.block_on(session.send_text("loop")).expect("ends");
    assert_eq!(turn.stop_reason, StopReason::MaxTurnRequests);
    assert_eq!(game.counter(), 1, "the call past the limit did not run");
    assert_eq!(server.requests().len(), 2);
    assert_eq!(session.status(), ConversationStatus::Idle);
}

#[test]
fn an_unknown_tool_and_arguments_that_are_not_json_go_back_to_the_model_which_retries() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server
        .reply(calls(vec![call(0, "1", "fly", "{}")]))
        .reply(calls(vec![call(0, "2", "bump", "{by: 1")]))
        .reply(calls(vec![call(0, "3", "bump", "{\"by\": 1}")]))
        .reply(says("got there"));
    let session = game.create(endpoint(&server)).expect("starts");
    let turn = game.block_on(session.send_text("go")).expect("ends");
    assert_eq!(turn.final_message.as_deref(), Some("got there"));
    let unknown: Value = serde_json::from_str(&tool_results(&server, 1)[0]).unwrap();
    assert_eq!(unknown["error"]["code"], "TOOL_NOT_FOUND", "{unknown}");
    assert!(unknown["error"]["message"].as_str().unwrap().contains("bump"), "it lists the tools: {unknown}");
    let invalid: Value = serde_json::from_str(&tool_results(&server, 2)[1]).unwrap();
    assert_eq!(invalid["error"]["code"], "INVALID_INPUT", "{invalid}");
    assert_eq!(game.counter(), 1, "only the valid call ran");
}

#[test]
fn a_call_for_a_tool_not_registered_yet_waits_for_it_as_the_host_rules_and_the_next_round_offers_it() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start_with(data.path(), true, Some(LIMIT));
    server.reply(calls(vec![call(0, "1", "late", "{}")])).reply(says("it came"));
    let session = game.create(endpoint(&server)).expect("starts");
    let id = session.id().to_string();
    let pending = game.block_on(session.start_turn("use late")).expect("sent");
    // The call waits in the host for its tool (the conversation waits for a tool result), until the world
    // registers it.
    game.log.wait_for(&format!("status {id} running->waiting_tool_result"));
    let late = AgentTool::new("late", "Registered late.", |_: CallContext<Session>, _: NoArgs| async move {
        Ok(serde_json::json!({ "arrived": true }))
    });
    game.game.agent().register_tool(late).expect("registered");
    let turn = game.block_on(pending).expect("the turn ends");
    assert_eq!(turn.final_message.as_deref(), Some("it came"));
    let results = tool_results(&server, 1);
    assert!(results.len() == 1 && results[0].contains("\"arrived\":true"), "the late tool ran: {results:?}");
    assert!(server.tool_names(1).contains(&"late".to_string()), "the next round offers it");
}

/// A kept session (`auto_end_on_disconnect(false)`) told "remember 42" (the model answered "noted"), then its game
/// stopped.
fn kept_session_told_42(data: &Path, server: &Server) -> ConversationId {
    let game = Game::start(data);
    server.reply(says("noted"));
    let config = SessionConfig::openai_endpoint(endpoint(server)).auto_end_on_disconnect(false);
    let session = game.block_on(game.sessions.create(config)).expect("starts");
    game.block_on(session.send_text("remember 42")).expect("a turn");
    let id = session.id().clone();
    game.game.stop();
    id
}

#[test]
fn resume_session_of_a_damaged_history_says_so_and_leaves_the_session_for_a_retry() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let id = kept_session_told_42(data.path(), &server);
    let history = data.path().join(id.as_str()).join("history.json");
    let good = std::fs::read(&history).unwrap();
    let game = Game::start(data.path());
    std::fs::write(&history, b"{not json").unwrap();
    let (code, message) = code_of(game.block_on(game.sessions.resume_session(id.clone())));
    assert_eq!(code, ErrorCode::SessionNotFound, "{message}");
    assert!(message.contains("history") && message.contains("damaged"), "says what is wrong: {message}");
    assert!(!message.contains("remove the stale id"), "{message}");
    // Nothing was deleted or replaced: the file mended, the session comes back.
    std::fs::write(&history, good).unwrap();
    game.block_on(game.sessions.resume_session(id)).expect("the retry re-attaches it");
}

#[test]
fn resume_session_after_a_restart_reloads_the_games_history() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let id = kept_session_told_42(data.path(), &server);
    let game = Game::start(data.path());
    let resumed = game.block_on(game.sessions.resume_session(id.clone())).expect("re-attached");
    assert_eq!(resumed.status(), ConversationStatus::Idle);
    server.reply(says("42"));
    game.block_on(resumed.send_text("what was it?")).expect("a turn");
    let history = server.history(1);
    assert_eq!(history, ["user: remember 42", "assistant: noted", "user: what was it?"]);
    let stored = std::fs::read_to_string(data.path().join(id.as_str()).join("history.json")).unwrap();
    assert!(stored.contains("what was it?"), "written after the turn");

    let (code, _) = code_of(game.block_on(game.sessions.resume_session("chat-00000000deadbeef")));
    assert_eq!(code, ErrorCode::SessionNotFound);
}

#[test]
fn ids_given_to_calls_that_came_without_one_do_not_repeat_after_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    // A call with no id (servers that leave it out): the session gives it one.
    let bump_without_id = || calls(vec![fragment(Some(0), None, Some("bump"), "{\"by\":1}")]);
    let game = Game::start(data.path());
    server.reply(bump_without_id()).reply(says("bumped"));
    let config = SessionConfig::openai_endpoint(endpoint(&server)).auto_end_on_disconnect(false);
    let session = game.block_on(game.sessions.create(config)).expect("starts");
    game.block_on(session.send_text("bump")).expect("a turn");
    let id = session.id().clone();
    game.game.stop();

    // The next run's first turn is numbered as the first run's was.
    let game = Game::start(data.path());
    let resumed = game.block_on(game.sessions.resume_session(id)).expect("re-attached");
    server.reply(bump_without_id()).reply(says("bumped again"));
    game.block_on(resumed.send_text("bump again")).expect("a turn");
    let requests = server.requests();
    let messages = requests.last().and_then(|request| request["messages"].as_array()).cloned().unwrap_or_default();
    let ids: Vec<&str> = messages.iter().filter_map(|message| message["tool_call_id"].as_str()).collect();
    assert_eq!(ids.len(), 2, "{messages:#?}");
    assert_ne!(ids[0], ids[1], "two calls, two ids, in the history the model reads");
}

/// The history is what the model is told happened: one others could have written is not resumed (the control: the
/// same file, private again, is).
#[cfg(unix)]
#[test]
fn a_history_others_could_have_written_is_not_resumed() {
    use std::os::unix::fs::PermissionsExt;
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let id = kept_session_told_42(data.path(), &server);
    let history = data.path().join(id.as_str()).join("history.json");
    std::fs::set_permissions(&history, std::fs::Permissions::from_mode(0o622)).unwrap();
    let game = Game::start(data.path());
    let error = game.block_on(game.sessions.resume_session(id.clone())).unwrap_err();
    assert_eq!(error.code, ErrorCode::SessionNotFound, "{error:?}");
    let why = error.details.extra.get("agent_error").map(|why| why.to_string()).unwrap_or_default();
    assert!(why.contains("may be written by other users (mode 622)"), "{why}");

    std::fs::set_permissions(&history, std::fs::Permissions::from_mode(0o600)).unwrap();
    let resumed = game.block_on(game.sessions.resume_session(id)).expect("the control: re-attached");
    assert_eq!(resumed.status(), ConversationStatus::Idle);
}

// ---------------------------------------------------------------------------------------------------------------
// Faults: each ends in one outcome, none waits forever.

#[test]
fn a_refused_connection_is_agent_unavailable_and_names_the_url() {
    let data = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let game = Game::start(data.path());
    let url = format!("http://127.0.0.1:{port}/v1");
    let timeouts = SessionTimeouts { start: Duration::from_secs(1), ..Default::default() };
    let config = SessionConfig::openai_endpoint(OpenAiEndpoint::new(&url, "m")).timeouts(timeouts);
    let (code, message) = code_of(game.block_on(game.sessions.create(config)));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains(&url) && message.contains("connect"), "{message}");
    // The URL named is the one requested (the model list, at start-up), once.
    assert!(message.contains(&format!("could not connect to {url}/models:")), "{message}");
    assert!(message.contains("Connection refused"), "the cause: {message}");
    assert_eq!(message.matches("http://").count(), 2, "the URL, and reqwest's own mention of it: {message}");
    assert!(message.contains("Nothing accepted a connection there for 1s"), "how long it was asked: {message}");
}

#[test]
fn a_server_not_listening_yet_is_waited_for_within_the_start_timeout() {
    let data = tempfile::tempdir().unwrap();
    let (server, listen) = Server::not_listening_yet(None);
    let game = Game::start(data.path());
    server.reply(says("ready"));
    let sessions = game.sessions.clone();
    let config = SessionConfig::openai_endpoint(endpoint(&server));
    let create = game.game.agent().runtime().spawn(async move { sessions.create(config).await });
    // Its connections are refused meanwhile: `create` waits for it (it failed at once before).
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!create.is_finished(), "create waits while nothing listens");
    listen();
    let session = game.block_on(create).expect("joined").expect("starts once the server listens");
    let turn = game.block_on(session.send_text("hello")).expect("the first turn");
    assert_eq!(turn.final_message.as_deref(), Some("ready"));
}

#[test]
fn a_server_still_loading_its_model_is_waited_for_within_the_start_timeout() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    // Six answers of `503 Loading model` (3 s at the probe's pace), then the model is there.
    server.script.loading.store(6, Ordering::SeqCst);
    server.reply(says("ready"));
    let session = game.create(endpoint(&server)).expect("starts once the model has loaded");
    let turn = game.block_on(session.send_text("hello")).expect("the first turn");
    assert_eq!(turn.final_message.as_deref(), Some("ready"));
    assert_eq!(server.script.loading.load(Ordering::SeqCst), 0, "asked until it was ready");
}

#[test]
fn a_start_timeout_of_duration_max_means_no_limit() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.script.loading.store(1, Ordering::SeqCst);
    let timeouts = SessionTimeouts { start: Duration::MAX, ..Default::default() };
    let config = SessionConfig::openai_endpoint(endpoint(&server)).timeouts(timeouts);
    game.block_on(game.sessions.create(config)).expect("starts once the model has loaded");
}

#[test]
fn a_server_still_loading_when_the_start_timeout_passes_fails_create_saying_so() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.script.loading.store(usize::MAX, Ordering::SeqCst);
    let timeouts = SessionTimeouts { start: Duration::from_secs(2), ..Default::default() };
    let config = SessionConfig::openai_endpoint(endpoint(&server)).timeouts(timeouts);
    let (code, message) = code_of(game.block_on(game.sessions.create(config)));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains("Loading model") && message.contains("503"), "the server's words: {message}");
    assert!(message.contains("SessionTimeouts::start"), "what to do: {message}");
}

#[test]
fn without_an_api_key_no_authorization_header_is_sent() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.reply(says("hi"));
    let session = game.create(endpoint(&server)).expect("starts");
    game.block_on(session.send_text("hello")).expect("a turn");
    let sent = server.script.authorizations.lock().clone();
    assert!(sent.len() >= 2, "the model list and the completion: {sent:?}");
    assert!(sent.iter().all(Option::is_none), "no Authorization header at all: {sent:?}");
}

#[test]
fn a_refused_api_key_names_its_environment_variable_and_the_key_is_sent_as_a_bearer() {
    // The keys are in the environment from the process's start: this test runs itself again, alone, in a child
    // process that has them (setting a variable while other tests' threads read the environment is a data race).
    const TEST: &str = "a_refused_api_key_names_its_environment_variable_and_the_key_is_sent_as_a_bearer";
    if std::env::var_os("BAT_TEST_RIGHT_KEY").is_none() {
        let child = std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args(["--exact", TEST, "--test-threads=1"])
            .env("BAT_TEST_WRONG_KEY", "wrong-key")
            .env("BAT_TEST_RIGHT_KEY", "right-key")
            .env_remove("BAT_TEST_UNSET_KEY")
            .output()
            .expect("the test binary runs");
        let out = String::from_utf8_lossy(&child.stdout);
        assert!(child.status.success(), "the test in a process with the keys in its environment: {out}");
        assert!(out.contains("1 passed"), "the child ran this test (its name is `TEST`): {out}");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let server = Server::with_key(Some("right-key"));
    let game = Game::start(data.path());
    let (code, message) = code_of(game.create(endpoint(&server).api_key_env("BAT_TEST_WRONG_KEY")));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains("BAT_TEST_WRONG_KEY") && message.contains("401"), "{message}");
    assert!(message.contains("Incorrect API key provided"), "the endpoint's own words are shown: {message}");
    assert!(!message.contains("wrong-key"), "the key itself is never shown, even where the endpoint quotes it");
    let (_, message) = code_of(game.create(endpoint(&server).api_key_env("BAT_TEST_UNSET_KEY")));
    assert!(message.contains("BAT_TEST_UNSET_KEY") && message.contains("not set"), "{message}");

    server.reply(says("hi"));
    let session = game.create(endpoint(&server).api_key_env("BAT_TEST_RIGHT_KEY")).expect("the right key works");
    game.block_on(session.send_text("hello")).expect("a turn");
    let sent = server.script.authorizations.lock().last().cloned().flatten();
    assert_eq!(sent.as_deref(), Some("Bearer right-key"));
    let record = std::fs::read_to_string(data.path().join(session.id().as_str()).join("session.json")).unwrap();
    assert!(
        record.contains("BAT_TEST_RIGHT_KEY") && !record.contains("right-key"),
        "the record names the variable only"
    );
}

#[test]
fn a_rate_limit_is_retried_after_its_retry_after_and_gives_up_after_the_bounded_retries() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.reply(Reply::Status(429, Some("1".into()))).reply(says("after the wait"));
    let session = game.create(endpoint(&server)).expect("starts");
    let started = Instant::now();
    let turn = game.block_on(session.send_text("hi")).expect("retried");
    assert_eq!(turn.final_message.as_deref(), Some("after the wait"));
    assert!(started.elapsed() >= Duration::from_millis(950), "Retry-After honoured: {:?}", started.elapsed());

    // As an HTTP date (whole seconds): two seconds from now, within the session's 2 s (the backoff would be 250 ms).
    let date = httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(2));
    server.reply(Reply::Status(503, Some(date))).reply(says("after the date"));
    let started = Instant::now();
    let turn = game.block_on(session.send_text("hello")).expect("retried");
    assert_eq!(turn.final_message.as_deref(), Some("after the date"));
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(1), "Retry-After's date honoured: {waited:?}");

    // Longer than one retry's wait (2 s here), within what the two retries may wait in all: waited out whole, as
    // asked (sooner, the endpoint would only refuse again).
    server.reply(Reply::Status(429, Some("3".into()))).reply(says("after the whole wait"));
    let started = Instant::now();
    let turn = game.block_on(session.send_text("in a bit")).expect("retried");
    assert_eq!(turn.final_message.as_deref(), Some("after the whole wait"));
    assert!(started.elapsed() >= Duration::from_millis(2950), "the 3 s asked for: {:?}", started.elapsed());

    // Longer than the retries may wait in all (a daily limit says minutes): asked again sooner, the endpoint would
    // say the same. The turn fails at once, saying how long the endpoint asked for.
    let before = server.requests().len();
    server.reply(Reply::Status(429, Some("864".into()))).reply(says("never asked"));
    let (code, message) = code_of(game.block_on(session.send_text("soon")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("asks to retry in 864 s"), "{message}");
    assert_eq!(server.requests().len(), before + 1, "not retried");
    let turn = game.block_on(session.send_text("later")).expect("the next text is taken");
    assert_eq!(turn.final_message.as_deref(), Some("never asked"));

    for _ in 0..3 {
        server.reply(Reply::Status(429, Some("0".into())));
    }
    server.reply(says("never asked"));
    let (code, message) = code_of(game.block_on(session.send_text("again")));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains("429") && message.contains("rate limiting"), "{message}");
    assert_eq!(server.requests().len(), 8 + 3, "one request and two retries, no more");
    assert_eq!(session.status(), ConversationStatus::Idle, "the turn failed, not the session");
    let turn = game.block_on(session.send_text("later")).expect("the next text is taken as it is");
    assert_eq!(turn.final_message.as_deref(), Some("never asked"), "the answer the failed turn never asked for");
}

#[test]
fn a_key_refused_mid_session_fails_the_session_so_that_resume_reads_the_key_again() {
    let (_data, server, game, session) = started();
    // OpenAI's 401, and Gemini's OpenAI-compatible endpoint's 400 for a key that is not valid.
    let gemini = r#"[{"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.", "status": "INVALID_ARGUMENT"}}]"#;
    for (refusal, status) in [(Reply::Status(401, None), "401"), (Reply::Refusal(400, gemini), "400")] {
        server.reply(refusal);
        let (code, message) = code_of(game.block_on(session.send_text("hi")));
        assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
        assert!(message.contains(status) && message.contains("API key"), "{message}");
        assert_eq!(session.status(), ConversationStatus::Error, "its client holds the refused key: {message}");
        game.block_on(session.resume()).expect("resumed");
        server.reply(says("again"));
        assert_eq!(game.block_on(session.send_text("hi")).expect("a turn").final_message.as_deref(), Some("again"));
    }
}

#[test]
fn numbers_too_big_from_the_endpoint_or_its_config_never_stall_a_turn() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    // A `Retry-After` longer than any clock can wait (the backoff applies), then a usage report whose parts
    // overflow when added (no total given).
    let overflowing = json!({"choices": [], "usage": {
        "prompt_tokens": u64::MAX, "completion_tokens": 1, "total_tokens": 0
    }});
    server.reply(Reply::Status(429, Some("1e20".into()))).reply(Reply::Stream(vec![
        text("fine"),
        finish("stop"),
        Piece::Data(overflowing),
    ]));
    // No cap on a retry's wait, as a game may configure it.
    let session = game.create(endpoint(&server).retries(1, Duration::MAX)).expect("starts");
    let turn = game.block_on(session.send_text("hi")).expect("retried after the backoff, and ended");
    assert_eq!(turn.final_message.as_deref(), Some("fine"));
    assert_eq!(server.requests().len(), 2, "the request and one retry");
    assert_eq!(session.usage().map(|u| u.used_tokens), Some(u64::MAX), "saturated, not wrapped");
}

#[test]
fn a_server_error_is_retried_then_fails_the_turn_alone_and_the_next_text_goes_on_with_the_history() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.reply(says("first"));
    let session = game.create(endpoint(&server)).expect("starts");
    game.block_on(session.send_text("one")).expect("a turn");
    for _ in 0..3 {
        server.reply(Reply::Status(503, None));
    }
    let (code, message) = code_of(game.block_on(session.send_text("two")));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains("503") && message.contains(&server.url), "{message}");
    assert_eq!(server.requests().len(), 4);
    game.log.wait_for(&format!("error {} AGENT_UNAVAILABLE [turn]", session.id()));

    goes_on_with_the_failed_turn_left_out(&game, &server, &session);
}

#[test]
fn a_proxys_html_error_page_is_reported_by_its_title() {
    let (_data, server, game, session) = started();
    let page = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>";
    for _ in 0..4 {
        server.reply(Reply::Refusal(502, page));
    }
    let (code, message) = code_of(game.block_on(session.send_text("one")));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains(r#"an HTML page titled "502 Bad Gateway""#), "{message}");
    assert!(!message.contains("<html") && !message.contains("<center>"), "{message}");
}

#[test]
fn a_server_that_does_not_support_the_request_is_not_asked_again() {
    let (_data, server, game, session) = started();
    // llama.cpp's answer to what its build cannot do (`not_supported_error`): the same however often it is asked.
    server.reply(Reply::Status(501, None)).reply(says("never asked"));
    let (code, message) = code_of(game.block_on(session.send_text("one")));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains("501") && message.contains("not asked again"), "{message}");
    assert!(!message.contains("retries"), "{message}");
    assert_eq!(server.requests().len(), 1, "asked once");
}

#[test]
fn a_turn_that_fails_after_its_tool_call_ran_keeps_the_call_and_its_result_and_says_it_failed() {
    let (_data, server, game, session) = after_one_turn();
    server.reply(calls(vec![text("Bumping."), call(0, "call-1", "bump", "{\"by\": 1}")]));
    for _ in 0..3 {
        server.reply(Reply::Status(503, None));
    }
    let (code, _) = code_of(game.block_on(session.send_text("two")));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert_eq!(game.counter(), 1, "the call ran before the endpoint failed");

    // The next turn sends the history: the model learns what it did in the world.
    server.reply(says("back"));
    game.block_on(session.send_text("three")).expect("a turn");
    let last = server.requests().len() - 1;
    let history = server.history(last);
    assert_eq!(history[..4], ["user: one", "assistant: first", "user: two", "assistant: Bumping."], "{history:#?}");
    assert_eq!(server.requests()[last]["messages"][3]["tool_calls"][0]["id"], "call-1");
    assert!(history[4].starts_with("tool: ") && !history[4].contains("error"), "the call's result: {history:#?}");
    assert!(
        history[5].starts_with("assistant: [This turn failed") && history[5].contains("AGENT_UNAVAILABLE: "),
        "then a line saying the turn failed and why: {history:#?}"
    );
    assert_eq!(history[6..], ["user: three"]);
}

#[test]
fn a_stream_that_stalls_times_out() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.reply(Reply::Stream(vec![text("hm"), Piece::Stall]));
    let session = game.create(endpoint(&server).stall_timeout(Duration::from_millis(300))).expect("starts");
    let (code, message) = code_of(game.block_on(session.send_text("hi")));
    assert_eq!(code, ErrorCode::Timeout, "{message}");
    assert!(!message.contains("reading the prompt"), "part of the answer had come: {message}");
    assert!(message.contains("holds a tool call back") && message.contains("stall_timeout"), "{message}");
    assert_eq!(session.status(), ConversationStatus::Idle, "the turn failed, not the session");

    // Silent from the start, as a local server loading its model or reading a long prompt is: waited for longer
    // than a silence mid-answer, then the message says so, and what to set.
    let config =
        endpoint(&server).stall_timeout(Duration::from_millis(300)).first_answer_timeout(Duration::from_secs(2));
    let session = game.create(config).expect("starts");
    server.reply(Reply::Stream(vec![Piece::Wait(Duration::from_millis(900)), text("loaded"), finish("stop")]));
    let turn = game.block_on(session.send_text("hi")).expect("the first chunk came within the first answer's time");
    assert_eq!(turn.final_message.as_deref(), Some("loaded"));
    // A first chunk that only says whose answer it is (sent before the prompt is read) is not the answer's start.
    let role = Piece::Data(json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}));
    server.reply(Reply::Stream(vec![role, Piece::Wait(Duration::from_millis(900)), text("read"), finish("stop")]));
    let turn = game.block_on(session.send_text("a long one")).expect("the answer came within the first answer's time");
    assert_eq!(turn.final_message.as_deref(), Some("read"));
    server.reply(Reply::Stream(vec![Piece::Stall]));
    let started = Instant::now();
    let (code, message) = code_of(game.block_on(session.send_text("hi again")));
    assert_eq!(code, ErrorCode::Timeout, "{message}");
    assert!(started.elapsed() >= Duration::from_secs(2), "the first answer's time: {:?}", started.elapsed());
    assert!(message.contains("reading the prompt") && message.contains("first_answer_timeout"), "{message}");
}

#[test]
fn s2_comments_that_keep_a_waiting_stream_alive_are_not_a_stall() {
    // DeepSeek and OpenRouter send `: keep-alive` comments while a request waits its turn: no event, but the
    // endpoint is there. Silence longer than the stall timeout passes between the answer's events, none between
    // its bytes.
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    let mut pieces = vec![text("Placing")];
    for _ in 0..12 {
        pieces.extend([Piece::Wait(Duration::from_millis(200)), Piece::Raw(": keep-alive\n\n")]);
    }
    pieces.extend([text(" done."), finish("stop")]);
    server.reply(Reply::Stream(pieces));
    let session = game.create(endpoint(&server).stall_timeout(Duration::from_secs(1))).expect("starts");
    let turn = game.block_on(session.send_text("hi")).expect("not a stall");
    assert_eq!(turn.final_message.as_deref(), Some("Placing done."));
}

#[test]
fn an_answer_streamed_past_its_size_or_call_limit_fails_the_turn_instead_of_filling_memory() {
    let (_data, server, game, session) = started();
    // 17 MiB of text, in 1 MiB pieces: over the 16 MiB an answer may hold; the rest is never waited for.
    let megabyte = "a".repeat(1 << 20);
    let mut pieces: Vec<Piece> = (0..17).map(|_| text(&megabyte)).collect();
    pieces.push(Piece::Stall);
    server.reply(Reply::Stream(pieces));
    let (code, message) = code_of(game.block_on(session.send_text("talk")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("over 16 MiB"), "{message}");

    // 257 calls in one answer.
    game.block_on(session.resume()).expect("resumed");
    server.reply(calls((0..257).map(|n| call(n, &format!("c{n}"), "held", "{}")).collect()));
    let (code, message) = code_of(game.block_on(session.send_text("call")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("over 256 tool calls"), "{message}");
    assert_eq!(game.executions.load(Ordering::SeqCst), 0, "none of them ran");

    // 257 calls written as markup in the answer's text: the same limit.
    game.block_on(session.resume()).expect("resumed");
    let markup = "<tool_call>{\"name\": \"held\", \"arguments\": {}}</tool_call>".repeat(257);
    server.reply(Reply::Stream(vec![text(&markup), finish("stop")]));
    let (code, message) = code_of(game.block_on(session.send_text("call")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("over 256 tool calls"), "{message}");
    assert_eq!(game.executions.load(Ordering::SeqCst), 0, "none of them ran");

    // 17 calls with an id of 1 MiB each: their ids count too.
    game.block_on(session.resume()).expect("resumed");
    let mut pieces: Vec<Piece> = (0..17).map(|n| call(n, &format!("{n}{megabyte}"), "held", "{}")).collect();
    pieces.push(Piece::Stall);
    server.reply(Reply::Stream(pieces));
    let (code, message) = code_of(game.block_on(session.send_text("call")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("over 16 MiB"), "{message}");
    assert_eq!(game.executions.load(Ordering::SeqCst), 0, "none of them ran");

    // OpenRouter's reasoning blocks: past 1,024 in one answer (here 100 chunks of 11 empty pieces each, each a block
    // of its own), the answer is abandoned, not held until the turn's timeout.
    game.block_on(session.resume()).expect("resumed");
    let empty = json!({"choices": [{"index": 0, "delta": {"reasoning_details": vec![json!({}); 11]}}]});
    let mut pieces: Vec<Piece> = (0..100).map(|_| Piece::Data(empty.clone())).collect();
    pieces.push(Piece::Stall);
    server.reply(Reply::Stream(pieces));
    let (code, message) = code_of(game.block_on(session.send_text("think")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("over 1024 reasoning blocks"), "{message}");
}

#[test]
fn an_answer_with_nothing_in_it_and_no_finish_reason_fails_the_turn_and_leaves_the_history() {
    let (_data, server, game, session) = after_one_turn();
    // A comment line (a keep-alive), then `[DONE]`: no text, no call, no finish_reason, and no word of why.
    server.reply(Reply::Stream(vec![Piece::Raw(": keep-alive\n\n")]));
    let (code, message) = code_of(game.block_on(session.send_text("two")));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains("no finish_reason"), "{message}");
    goes_on_with_the_failed_turn_left_out(&game, &server, &session);
}

#[test]
fn an_error_line_llama_cpp_sends_outside_the_data_lines_fails_the_turn_quoting_the_servers_words() {
    // llama.cpp's server reports a failure mid-stream on an `error:` line, which is not an SSE data line, then
    // closes without `[DONE]`; and the same followed by `[DONE]`, as a proxy may end it.
    let error = "error: {\"code\":500,\"message\":\"the KV cache is full\",\"type\":\"server_error\"}\n\n";
    for end in [Some(Piece::Close), None] {
        let (_data, server, game, session) = after_one_turn();
        let mut pieces = vec![text("Let me "), Piece::Raw(error)];
        pieces.extend(end);
        server.reply(Reply::Stream(pieces));
        let (code, message) = code_of(game.block_on(session.send_text("two")));
        assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
        assert_eq!(
            message,
            format!("{}/chat/completions reported an error in its stream (500: the KV cache is full)", server.url),
            "the endpoint and the server's own words"
        );
        goes_on_with_the_failed_turn_left_out(&game, &server, &session);
    }
}

/// The assistant messages of a session's stored history with no text and no tool calls.
fn empty_answers_stored(data: &Path, id: &ConversationId) -> Vec<Value> {
    let stored = std::fs::read(data.join(id.as_str()).join("history.json")).expect("the history");
    let history: Value = serde_json::from_slice(&stored).expect("JSON");
    let turns = history["turns"].as_array().cloned().unwrap_or_default();
    let messages = turns.iter().flat_map(|turn| turn.as_array().cloned().unwrap_or_default());
    messages
        .filter(|m| m["role"] == "assistant" && m.get("tool_calls").is_none())
        .filter(|m| m["content"].is_null() || m["content"] == "")
        .collect()
}

#[test]
fn an_answer_with_a_finish_reason_and_no_text_commits_no_empty_assistant_message() {
    let (data, server, game, session) = started();
    server.reply(Reply::Stream(vec![finish("stop")])).reply(says("two answered"));
    let turn = game.block_on(session.send_text("one")).expect("an empty answer still ends the turn");
    assert_eq!((turn.stop_reason, turn.final_message), (StopReason::EndTurn, None));
    assert_eq!(empty_answers_stored(data.path(), session.id()), Vec::<Value>::new(), "what a resume would reload");

    game.block_on(session.send_text("two")).expect("the next turn is taken");
    assert_eq!(server.history(1), ["user: one\n\ntwo"], "no empty assistant message for strict endpoints to refuse");
}

#[test]
fn a_history_saved_with_an_empty_answer_resumes_without_it() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let id = kept_session_told_42(data.path(), &server);
    // As a turn with an empty answer left it before such answers were kept out of the history.
    let file = data.path().join(id.as_str()).join("history.json");
    let mut history: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    history["turns"].as_array_mut().unwrap().push(json!([
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": ""},
    ]));
    std::fs::write(&file, serde_json::to_vec(&history).unwrap()).unwrap();

    let game = Game::start(data.path());
    let resumed = game.block_on(game.sessions.resume_session(id.clone())).expect("re-attached");
    server.reply(says("42"));
    game.block_on(resumed.send_text("what was it?")).expect("a turn");
    assert_eq!(server.history(1), ["user: remember 42", "assistant: noted", "user: and?\n\nwhat was it?"]);
}

#[test]
fn an_answer_whose_stream_goes_quiet_after_its_finish_reason_is_complete_after_a_short_grace() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    // Neither `[DONE]` nor the connection's end follows the usage chunk.
    server.reply(Reply::Stream(vec![text("all "), text("done"), finish("stop"), usage(10, 5), Piece::Stall]));
    let stall = Duration::from_secs(10);
    let session = game.create(endpoint(&server).stall_timeout(stall)).expect("starts");
    // Whole after the short grace: were the grace not kept, the turn would end TIMEOUT at the stall timeout.
    let turn = game.block_on(session.send_text("one")).expect("the answer is whole: not TIMEOUT");
    assert_eq!((turn.stop_reason, turn.final_message.as_deref()), (StopReason::EndTurn, Some("all done")));
    assert_eq!(session.usage().map(|usage| usage.used_tokens), Some(15), "the usage chunk was read");
    server.wait_closed("the quiet request was closed");

    server.reply(says("again"));
    game.block_on(session.send_text("two")).expect("a turn");
    assert_eq!(server.history(1), ["user: one", "assistant: all done", "user: two"], "the answer was kept");
}

#[test]
fn tool_calls_past_the_per_round_cap_are_not_run_and_the_model_reads_the_cap() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    assert_eq!(endpoint(&server).max_tool_calls_per_round, 32, "the default");
    server
        .reply(calls(vec![
            call(0, "a", "bump", "{\"by\":1}"),
            call(1, "b", "bump", "{\"by\":1}"),
            call(2, "c", "bump", "{\"by\":1}"),
        ]))
        .reply(says("two of three"));
    let session = game.create(endpoint(&server).max_tool_calls_per_round(2)).expect("starts");
    let turn = game.block_on(session.send_text("bump thrice")).expect("ends");
    assert_eq!(turn.final_message.as_deref(), Some("two of three"));
    assert_eq!(game.counter(), 2, "the call past the cap never ran");
    let results: Vec<Value> =
        tool_results(&server, 1).iter().map(|result| serde_json::from_str(result).unwrap()).collect();
    assert_eq!(results.len(), 3, "every call has its result, as chat completions require");
    assert_eq!((&results[0]["result"]["counter"], &results[1]["result"]["counter"]), (&json!(1), &json!(2)));
    assert_eq!(results[2]["error"]["code"], "BUSY", "{}", results[2]);
    let message = results[2]["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("at most 2") && message.contains("not run"), "the model is told the cap: {message}");
}

#[test]
fn the_token_limit_goes_as_max_completion_tokens_to_an_endpoint_that_names_it_so() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    let sampling = Sampling { max_tokens: Some(100), ..Sampling::default() };
    let local = game.create(endpoint(&server).sampling(sampling.clone())).expect("starts");
    let reasoning = endpoint(&server).sampling(sampling).token_limit_field(TokenLimitField::MaxCompletionTokens);
    let reasoning = game.create(reasoning).expect("starts");
    server.reply(says("a")).reply(says("b"));
    game.block_on(local.send_text("one")).expect("a turn");
    game.block_on(reasoning.send_text("one")).expect("a turn");
    let requests = server.requests();
    assert_eq!((&requests[0]["max_tokens"], requests[0].get("max_completion_tokens")), (&json!(100), None));
    assert_eq!((requests[1].get("max_tokens"), &requests[1]["max_completion_tokens"]), (None, &json!(100)));
}

#[test]
fn an_endpoint_that_refuses_stream_options_is_asked_again_without_them_and_not_asked_for_them_again() {
    let (_data, server, game, session) = started();
    // Mistral's API: it sends the usage without being asked, and refuses the field with a validation error whose
    // `message` is an object.
    server
        .reply(Reply::Refusal(
            422,
            r#"{"object":"error","message":{"detail":[{"type":"extra_forbidden","loc":["body","stream_options","include_usage"],"msg":"Extra inputs are not permitted","input":true}]},"type":"invalid_request_error","param":null,"code":null}"#,
        ))
        .reply(says("hello"))
        .reply(says("again"));
    let turn = game.block_on(session.send_text("hi")).expect("asked again without them");
    assert_eq!(turn.final_message.as_deref(), Some("hello"));
    game.block_on(session.send_text("and?")).expect("the next turn");
    let chats = server.requests().into_iter().filter(|request| request.get("messages").is_some());
    let asked: Vec<bool> = chats.map(|request| request.get("stream_options").is_some()).collect();
    assert_eq!(asked, [true, false, false], "asked for the usage once, then never");
}

#[test]
fn a_refusal_in_llama_cpps_or_vllms_own_shape_says_its_status_and_message() {
    let (_data, server, game, session) = started();
    // llama.cpp's server: `code` is a number (OpenAI's is a string).
    server.reply(Reply::Refusal(
        400,
        r#"{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}}"#,
    ));
    // (What follows the endpoint's words, advice for these, is another test's.)
    let said = |error: &ToolError| {
        let message = error.message.split_once("): ").map_or(error.message.clone(), |(said, _)| format!("{said})"));
        (error.details.extra.get("status").cloned(), message)
    };
    let error = game.block_on(session.send_text("one")).expect_err("refused");
    assert_eq!(error.code, ErrorCode::AgentUnavailable);
    assert_eq!(
        said(&error),
        (
            Some(json!(400)),
            format!(
                "{}/chat/completions refused the request (400: the request exceeds the available context size)",
                server.url
            )
        )
    );
    game.block_on(session.resume()).expect("resumed");
    // vLLM (some versions): the error's fields at the top.
    server.reply(Reply::Refusal(
        400,
        r#"{"object":"error","message":"maximum context length is 8192 tokens","type":"BadRequestError","code":400}"#,
    ));
    let error = game.block_on(session.send_text("two")).expect_err("refused");
    assert_eq!(
        said(&error),
        (
            Some(json!(400)),
            format!("{}/chat/completions refused the request (400: maximum context length is 8192 tokens)", server.url)
        )
    );
    game.block_on(session.resume()).expect("resumed");
    // Ollama's answer to a base URL without its `/v1`: plain text.
    server.reply(Reply::Refusal(404, "404 page not found"));
    let error = game.block_on(session.send_text("three")).expect_err("refused");
    assert_eq!(said(&error).0, Some(json!(404)));
    assert!(error.message.contains("answered 404 (404 page not found): check the base URL"), "{}", error.message);
}

#[test]
fn a_page_in_place_of_the_answer_fails_the_turn_quoting_the_page() {
    let (_data, server, game, session) = started();
    server.reply(Reply::Page("<html><body>Proxy authentication required: sign in at the portal</body></html>"));
    let (code, message) = code_of(game.block_on(session.send_text("hi")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("Proxy authentication required"), "the page's words, not a broken stream: {message}");
}

#[test]
fn a_byte_that_is_not_utf8_in_the_answer_reads_as_a_replacement_character_and_the_turn_ends() {
    let (_data, server, game, session) = started();
    // A character cut between two tokens (the first byte of a 3-byte one), then the rest of the answer.
    server.reply(Reply::Stream(vec![
        Piece::Bytes(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"caf\xE2 au lait\"}}]}\n\n"),
        text(", please"),
        finish("stop"),
    ]));
    let turn = game.block_on(session.send_text("hi")).expect("the turn ends, not broken at the byte");
    assert_eq!(turn.final_message.as_deref(), Some("caf\u{FFFD} au lait, please"));
}

#[test]
fn a_whole_answer_without_choices_fails_the_turn_quoting_its_words() {
    let (_data, server, game, session) = started();
    server.reply(Reply::Whole(json!({"detail": "Not authenticated: the gateway wants a session"})));
    let (code, message) = code_of(game.block_on(session.send_text("hi")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("the gateway wants a session"), "the body's words, not an empty answer: {message}");
}

#[test]
fn a_connection_broken_mid_answer_fails_the_turn_and_leaves_the_history() {
    let (_data, server, game, session) = after_one_turn();
    server.reply(Reply::Stream(vec![text("half"), Piece::Break]));
    let (code, message) = code_of(game.block_on(session.send_text("two")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    goes_on_with_the_failed_turn_left_out(&game, &server, &session);
}

/// Each `POST` a server read, with the connection (numbered from 1) it came on.
type Posts = Arc<Mutex<Vec<(usize, Value)>>>;

/// A chat completions server over raw HTTP/1.1 that keeps connections alive, but closes the one the `closing`-th
/// `POST` (counting from 1) arrives on after reading it, without an answer: as a server (llama.cpp's, uvicorn's)
/// ends a connection idle in the client's pool at the moment the client sends on it. Every other `POST` is answered
/// with the next of `answers`, streamed; a `GET` (the start-up probe) with an empty model list. Returns its URL, and
/// each `POST` it read with the connection (numbered from 1) it came on.
fn closing_keep_alive(closing: usize, answers: &'static [&'static str]) -> (String, Posts) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let posts = Arc::new(Mutex::new(Vec::new()));
    let read = posts.clone();
    std::thread::spawn(move || {
        let mut answers = answers.iter();
        for (connection, stream) in listener.incoming().enumerate() {
            let Ok(stream) = stream else { return };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut writer = stream;
            loop {
                let mut head = Vec::new();
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    head.push(std::mem::take(&mut line));
                }
                let Some(request_line) = head.first() else { break };
                let length = head
                    .iter()
                    .find_map(|h| h.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0usize);
                let mut body = vec![0; length];
                reader.read_exact(&mut body).unwrap();
                let body = if request_line.starts_with("POST") {
                    let mut posts = read.lock();
                    posts.push((connection + 1, serde_json::from_slice(&body).unwrap()));
                    if posts.len() == closing {
                        break;
                    }
                    let chunk = json!({"choices": [{"index": 0, "delta": {"content": answers.next().unwrap()},
                        "finish_reason": "stop"}]});
                    format!("data: {chunk}\n\ndata: [DONE]\n\n")
                } else {
                    r#"{"object":"list","data":[]}"#.to_string()
                };
                let kind = if request_line.starts_with("POST") { "text/event-stream" } else { "application/json" };
                let head = format!("HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\r\n", body.len());
                writer.write_all(head.as_bytes()).and_then(|()| writer.write_all(body.as_bytes())).unwrap();
            }
        }
    });
    (url, posts)
}

#[test]
fn a_request_whose_kept_alive_connection_the_server_closed_is_sent_again_once_on_a_new_one() {
    let data = tempfile::tempdir().unwrap();
    let (url, posts) = closing_keep_alive(2, &["first", "second"]);
    let game = Game::start(data.path());
    let session = game.block_on(game.sessions.create(SessionConfig::openai_endpoint(OpenAiEndpoint::new(&url, "m"))));
    let session = session.expect("starts");
    game.block_on(session.send_text("one")).expect("a turn");
    let turn = game.block_on(session.send_text("two")).expect("the turn, though its connection was closed under it");
    assert_eq!(turn.final_message.as_deref(), Some("second"));
    let posts = posts.lock();
    let on: Vec<usize> = posts.iter().map(|(connection, _)| *connection).collect();
    let kept_alive = on[0];
    assert_eq!(on, [kept_alive, kept_alive, kept_alive + 1], "the second sent again, on a new connection");
    assert_eq!(posts[1].1, posts[2].1, "the same request");
}

#[test]
fn an_answer_cut_short_before_its_end_fails_the_turn_and_runs_none_of_its_calls() {
    let (_data, server, game, session) = after_one_turn();
    server.reply(Reply::Stream(vec![text("half a sen"), call(0, "a", "bump", "{\"by\":1}"), Piece::Close]));
    let (code, message) = code_of(game.block_on(session.send_text("two")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert_eq!(game.counter(), 0, "the call of an answer cut short never ran");
    goes_on_with_the_failed_turn_left_out(&game, &server, &session);
    // A server that sends no `[DONE]` after its finish_reason: the answer stands.
    server.reply(Reply::Stream(vec![text("whole"), finish("stop"), Piece::Close]));
    let turn = game.block_on(session.send_text("four")).expect("a turn");
    assert_eq!((turn.final_message.as_deref(), turn.stop_reason), (Some("whole"), StopReason::EndTurn));
}

#[test]
fn finish_reasons_become_stop_reasons_and_a_missing_one_after_text_is_an_end_turn() {
    let (_data, server, game, session) = started();
    for (finish_reason, stop) in [
        (Some("stop"), StopReason::EndTurn),
        (Some("length"), StopReason::MaxTokens),
        (Some("content_filter"), StopReason::Refusal),
        (Some("something_new"), StopReason::Other),
        (None, StopReason::EndTurn),
    ] {
        let mut pieces = vec![text("an answer")];
        pieces.extend(finish_reason.map(finish));
        server.reply(Reply::Stream(pieces));
        let turn = game.block_on(session.send_text("hi")).expect("a turn");
        assert_eq!(turn.stop_reason, stop, "{finish_reason:?}");
        assert_eq!(turn.final_message.as_deref(), Some("an answer"));
    }
}

#[test]
fn an_empty_finish_reason_on_every_chunk_is_no_finish_reason() {
    let (_data, server, game, session) = started();
    // As older Ollama and SGLang send it: `""` on every chunk until the last.
    let unfinished =
        |piece: &str| Piece::Data(json!({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": ""}]}));
    // A pause past the wait after a finish (2 s) is not the end of the answer.
    server.reply(Reply::Stream(vec![
        unfinished("Hello"),
        Piece::Wait(Duration::from_millis(2500)),
        unfinished(", world"),
        finish("stop"),
    ]));
    let turn = game.block_on(session.send_text("hi")).expect("a turn");
    assert_eq!((turn.final_message.as_deref(), turn.stop_reason), (Some("Hello, world"), StopReason::EndTurn));
    // And a connection broken mid-answer is a failure, not an answer that said how it finished.
    server.reply(Reply::Stream(vec![unfinished("Half a sen"), Piece::Break]));
    let (code, message) = code_of(game.block_on(session.send_text("again")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
}

#[test]
fn tool_call_arguments_streamed_as_a_json_object_are_read_as_its_text() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    // As LiteLLM's proxy streams them from Ollama.
    let object = Piece::Data(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call-1", "type": "function", "function": {"name": "bump", "arguments": {"by": 1}}}
    ]}}]}));
    server.reply(calls(vec![object])).reply(says("bumped"));
    let session = game.create(endpoint(&server)).expect("starts");
    let turn = game.block_on(session.send_text("bump")).expect("a turn, not a malformed chunk");
    assert_eq!(turn.final_message.as_deref(), Some("bumped"));
    assert_eq!(game.counter(), 1, "the call ran with its arguments");
}

#[test]
fn a_model_that_talks_on_past_the_turn_timeout_is_stopped_with_timeout_and_its_request_closed() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    // Never silent for long (the stall timeout never fires), never done.
    let mut pieces = Vec::new();
    for _ in 0..200 {
        pieces.extend([text("and "), Piece::Wait(Duration::from_millis(50))]);
    }
    server.reply(Reply::Stream(pieces));
    let timeouts = SessionTimeouts { turn: Duration::from_millis(500), ..Default::default() };
    let config = SessionConfig::openai_endpoint(endpoint(&server)).timeouts(timeouts);
    let session = game.block_on(game.sessions.create(config)).expect("starts");
    let (code, message) = code_of(game.block_on(session.send_text("go on")));
    assert_eq!(code, ErrorCode::Timeout, "{message}");
    assert_eq!(session.status(), ConversationStatus::Error);
    server.wait_closed("the endpoint saw the request closed");
}

#[test]
fn a_turn_stopped_at_its_time_limit_after_a_tool_call_ran_keeps_the_call_for_the_model_to_read_after_resume() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    // The call runs, then the model thinks past the turn's time limit (never silent long enough to stall).
    let mut thinking = Vec::new();
    for _ in 0..200 {
        thinking.extend([text("hm "), Piece::Wait(Duration::from_millis(50))]);
    }
    server.reply(calls(vec![call(0, "call-1", "bump", "{\"by\": 1}")])).reply(Reply::Stream(thinking));
    // Room for two round trips, the call and some thinking on a loaded machine; the thinking (10 s) outlasts it.
    let timeouts = SessionTimeouts { turn: Duration::from_secs(6), ..Default::default() };
    let config = SessionConfig::openai_endpoint(endpoint(&server)).timeouts(timeouts);
    let session = game.block_on(game.sessions.create(config)).expect("starts");
    let (code, message) = code_of(game.block_on(session.send_text("two")));
    assert_eq!(code, ErrorCode::Timeout, "{message}");
    assert_eq!(game.counter(), 1, "the call ran before the time limit");

    // At once: the resume waits for the stopped turn's history to be written.
    assert_eq!(game.block_on(session.resume()).expect("resumed"), Attached::Resumed);
    server.reply(says("back"));
    game.block_on(session.send_text("three")).expect("a turn");
    let last = server.requests().len() - 1;
    let history = server.history(last);
    assert_eq!(history[0], "user: two", "{history:#?}");
    assert_eq!(server.requests()[last]["messages"][1]["tool_calls"][0]["id"], "call-1", "{history:#?}");
    assert!(history[2].starts_with("tool: ") && !history[2].contains("error"), "the call's result: {history:#?}");
    assert!(history[3].starts_with("assistant: hm hm"), "what the model said until it was stopped: {history:#?}");
    assert_eq!(history[4..], ["user: three"]);

    // Stopped during a tool call: the call is cancelled in the game, and the model reads that the game stopped it.
    server.reply(calls(vec![call(0, "h", "held", "{}")]));
    let (code, message) = code_of(game.block_on(session.send_text("four")));
    assert_eq!((code, game.gate.arrived()), (ErrorCode::Timeout, 1), "{message}");
    game.block_on(session.resume()).expect("resumed");
    server.reply(says("noted"));
    game.block_on(session.send_text("five")).expect("a turn");
    let results = tool_results(&server, server.requests().len() - 1);
    assert!(results.last().is_some_and(|r| r.contains("CANCELLED") && r.contains("the game stopped")), "{results:?}");
    game.gate.open();
}

#[test]
fn a_malformed_chunk_is_agent_unavailable_quoting_it() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server.reply(Reply::Stream(vec![text("ok "), Piece::Raw("data: {\"choices\": [{\"delta\": \n\n")]));
    let session = game.create(endpoint(&server)).expect("starts");
    let (code, message) = code_of(game.block_on(session.send_text("hi")));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains("malformed chunk") && message.contains("choices"), "{message}");
}

// ---------------------------------------------------------------------------------------------------------------
// What strict and local endpoints refuse, and what the player is told then.

/// The `function.arguments` of every tool call in the assistant messages of request `request`.
fn sent_arguments(server: &Server, request: usize) -> Vec<String> {
    let requests = server.requests();
    let messages = requests[request]["messages"].as_array().cloned().unwrap_or_default();
    let calls = messages.iter().flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default());
    calls.map(|call| call["function"]["arguments"].as_str().unwrap().to_string()).collect()
}

#[test]
fn a_tool_call_whose_arguments_are_not_a_json_object_is_sent_back_with_a_json_object_so_later_requests_parse() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    server
        .reply(calls(vec![call(0, "1", "bump", "{by: 1"), call(1, "2", "bump", "")]))
        .reply(calls(vec![call(0, "3", "bump", "{\"by\": 1}")]))
        .reply(says("got there"))
        .reply(says("again"));
    let session = game.create(endpoint(&server)).expect("starts");
    game.block_on(session.send_text("go")).expect("a turn");
    game.block_on(session.send_text("and again")).expect("the next turn, from the saved history");
    assert_eq!(game.counter(), 2, "the valid calls ran (empty arguments are none)");
    let invalid: Value = serde_json::from_str(&tool_results(&server, 1)[0]).unwrap();
    assert_eq!(invalid["error"]["code"], "INVALID_INPUT", "the model still reads why: {invalid}");
    // As Ollama reads a request's history: each call's arguments parsed as a JSON object, else 400.
    for request in 1..4 {
        let sent = sent_arguments(&server, request);
        let parsed: Vec<Value> = sent.iter().filter_map(|arguments| serde_json::from_str(arguments).ok()).collect();
        assert!(parsed.len() == sent.len() && parsed.iter().all(Value::is_object), "request {request}: {sent:?}");
    }
    let kept: Vec<Value> = sent_arguments(&server, 3).iter().map(|a| serde_json::from_str(a).unwrap()).collect();
    assert_eq!(kept, [json!({}), json!({}), json!({"by": 1})], "a valid call's arguments are kept as they were");
}

/// The roles of request `request` as a strict chat template checks them (Mistral's under llama.cpp's `--jinja`):
/// tool results and assistant messages with tool calls left out, the rest alternating from a user message.
fn strict_roles_alternate(server: &Server, request: usize) -> bool {
    let requests = server.requests();
    let messages = requests[request]["messages"].as_array().cloned().unwrap_or_default();
    let checked = messages.iter().filter(|m| !matches!(m["role"].as_str(), Some("system" | "tool")));
    let roles: Vec<String> = checked
        .filter(|m| m.get("tool_calls").is_none())
        .map(|m| m["role"].as_str().unwrap_or_default().to_string())
        .collect();
    roles.iter().enumerate().all(|(n, role)| role == if n % 2 == 0 { "user" } else { "assistant" })
}

#[test]
fn a_turn_that_ended_right_after_its_tool_results_is_followed_by_a_no_reply_answer_so_strict_templates_alternate() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    // The model's answer after the results is empty: the turn ends there, with no assistant text.
    server.reply(calls(vec![call(0, "1", "bump", "{\"by\": 1}")])).reply(Reply::Stream(vec![finish("stop")]));
    server.reply(says("done"));
    let session = game.create(endpoint(&server)).expect("starts");
    let turn = game.block_on(session.send_text("bump")).expect("a turn");
    assert_eq!(turn.final_message, None);
    game.block_on(session.send_text("and now?")).expect("the next turn");
    assert!(strict_roles_alternate(&server, 2), "{:#?}", server.history(2));
    assert_eq!(
        server.history(2)[3..],
        ["assistant: (no reply)".to_string(), "user: and now?".to_string()],
        "{:#?}",
        server.history(2)
    );
}

#[test]
fn a_history_over_the_bound_when_a_request_is_built_is_bounded_in_that_request() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let id = kept_session_told_42(data.path(), &server);
    // Long turns kept under the default bound, then the model's window set afterwards: 400 tokens, 800 bytes, and
    // a history over it is cut to its newest turns within 60% of it, 480 bytes.
    let dir = data.path().join(id.as_str());
    let file = dir.join("history.json");
    let mut history: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    for n in 0..3 {
        history["turns"].as_array_mut().unwrap().push(json!([
            {"role": "user", "content": format!("long {n} {}", "x".repeat(300))},
            {"role": "assistant", "content": format!("answer {n}")},
        ]));
    }
    std::fs::write(&file, serde_json::to_vec(&history).unwrap()).unwrap();
    let record = std::fs::read_to_string(dir.join("session.json")).unwrap();
    assert_eq!(record.matches("\"context_window\": null").count(), 1, "{record}");
    std::fs::write(dir.join("session.json"), record.replace("\"context_window\": null", "\"context_window\": 400"))
        .unwrap();

    let game = Game::start(data.path());
    let resumed = game.block_on(game.sessions.resume_session(id.clone())).expect("re-attached");
    server.reply(says("ok"));
    game.block_on(resumed.send_text("what was it?")).expect("a turn");
    let sent = server.history(1);
    assert_eq!(
        sent,
        [
            "system: [3 earlier turns of this conversation were dropped to keep the history bounded]".to_string(),
            format!("user: long 2 {}", "x".repeat(300)),
            "assistant: answer 2".to_string(),
            "user: what was it?".to_string(),
        ],
        "only the newest turn fits in 480 bytes"
    );
}

/// A request's messages after the system message and before the turn's own text: the history it carries, in bytes
/// of JSON as the bound counts them.
fn history_bytes_sent(server: &Server, request: usize) -> usize {
    let requests = server.requests();
    let messages = requests[request]["messages"].as_array().cloned().unwrap_or_default();
    messages[1..messages.len() - 1].iter().map(|message| message.to_string().len()).sum()
}

#[test]
fn past_its_bound_the_history_sent_starts_alike_from_turn_to_turn_and_a_drop_leaves_room_for_several_turns() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    let bound = 2000;
    let config = SessionConfig::openai_endpoint(endpoint(&server).max_history_bytes(bound)).system_prompt("Be brief.");
    let session = game.block_on(game.sessions.create(config)).expect("starts");
    // About 180 bytes a turn: the bound is reached after 11 turns.
    let turns = 30;
    for n in 0..turns {
        server.reply(says(&format!("answer {n:02}")));
        game.block_on(session.send_text(format!("turn {n:02} {}", "x".repeat(100)))).expect("a turn");
    }
    // What a server's cached prompt is reused up to: the system message (the prompt, and the count of dropped turns
    // once there is one, which the request joins to it) and the first turn's text.
    let start = |request: usize| server.history(request)[..2].to_vec();
    let first_drop = (1..turns).find(|&n| start(n)[0] != start(0)[0]).expect("the history went over its bound");
    let mut changes = 0;
    for n in first_drop..turns {
        let (before, now) = (start(n - 1), start(n));
        assert_eq!(before[0] == now[0], before[1] == now[1], "the count changes only with the turns sent: {now:#?}");
        if before != now {
            changes += 1;
            let sent = history_bytes_sent(&server, n);
            assert!(sent <= bound * 60 / 100, "a drop leaves 40% of the bound free: {sent} bytes sent");
        }
    }
    let past = turns - first_drop;
    assert!(changes * 3 <= past, "{changes} changes of the prompt's start in {past} turns past the bound");
}

#[test]
fn null_fields_and_content_given_as_parts_are_read_as_missing_and_as_their_text() {
    let (_data, server, game, session) = started();
    let parts = json!([
        {"type": "thinking", "thinking": [{"type": "text", "text": "hmm"}]},
        {"type": "text", "text": "Hello"},
        {"type": "text", "text": ", world"},
    ]);
    server.reply(Reply::Stream(vec![
        Piece::Data(json!({"id": "x", "choices": null, "usage": null})),
        Piece::Data(json!({"choices": [{"index": 0, "delta": null, "finish_reason": null}]})),
        Piece::Data(
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null, "tool_calls": null}}]}),
        ),
        Piece::Data(json!({"choices": [{"index": 0, "delta": {"content": parts}}]})),
        Piece::Data(json!({"choices": [{"index": 0, "delta": {"content": "!"}, "finish_reason": "stop"}]})),
        Piece::Data(
            json!({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": null, "total_tokens": null}}),
        ),
    ]));
    let turn = game.block_on(session.send_text("hi")).expect("a turn, not a malformed chunk");
    assert_eq!((turn.final_message.as_deref(), turn.stop_reason), (Some("Hello, world!"), StopReason::EndTurn));
    assert_eq!(session.usage().map(|usage| usage.used_tokens), Some(12), "a null count is none");
}

#[test]
fn the_tools_sent_to_the_model_leave_out_the_reserved_arguments_and_a_call_that_sends_them_is_still_keyed() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    let keyed = r#"{"by": 1, "operation_id": "op-1", "task_id": "task-1"}"#;
    server
        .reply(calls(vec![call(0, "a", "bump", keyed)]))
        .reply(calls(vec![call(0, "b", "bump", keyed)]))
        .reply(says("done"));
    let session = game.create(endpoint(&server)).expect("starts");
    let turn = game.block_on(session.send_text("bump once, retrying")).expect("a turn");
    assert_eq!(turn.final_message.as_deref(), Some("done"));

    let requests = server.requests();
    let tools = requests[0]["tools"].as_array().cloned().unwrap_or_default();
    assert!(server.tool_names(0).contains(&"bump".to_string()), "{tools:#?}");
    for tool in &tools {
        let parameters = &tool["function"]["parameters"];
        for reserved in ["operation_id", "task_id", "conversation"] {
            assert!(parameters["properties"].get(reserved).is_none(), "{reserved} in {parameters}");
            let required = parameters["required"].as_array().cloned().unwrap_or_default();
            assert!(!required.contains(&json!(reserved)), "{reserved} required in {parameters}");
        }
    }
    let bump = tools.iter().find(|tool| tool["function"]["name"] == "bump").expect("bump");
    assert!(bump["function"]["parameters"]["properties"]["by"].is_object(), "the tool's own arguments: {bump}");
    // The host still takes them out of the arguments and keys the call: the retry with the same id ran once.
    assert_eq!(game.counter(), 1, "the same operation_id ran once");
    let results = tool_results(&server, 2);
    assert_eq!(results.len(), 2, "both calls' results: {results:?}");
    assert!(results.iter().all(|result| result.contains("\"counter\":1") && !result.contains("error")), "{results:?}");
}

const LLAMA_CPP_TOO_LONG: &str = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#;

#[test]
fn a_refusal_for_the_contexts_length_is_asked_again_once_with_less_history_then_says_what_to_change() {
    let (_data, server, game, session) = after_one_turn();
    server.reply(Reply::Refusal(400, LLAMA_CPP_TOO_LONG)).reply(says("it fits now"));
    let turn = game.block_on(session.send_text("two")).expect("a turn, once the history fits");
    assert_eq!(turn.final_message.as_deref(), Some("it fits now"));
    assert_eq!(server.history(1), ["user: one", "assistant: first", "user: two"]);
    assert_eq!(
        server.history(2),
        ["system: [1 earlier turns of this conversation were dropped to keep the history bounded]", "user: two"],
        "asked again with at most half of what was sent"
    );

    // The next turn starts from the share the endpoint took: not refused first, every turn.
    let before = server.requests().len();
    server.reply(says("still fits"));
    game.block_on(session.send_text("three")).expect("a turn");
    assert_eq!(server.requests().len(), before + 1, "one request: its history already within what was taken");
    assert!(!server.history(before).contains(&"user: one".to_string()), "{:?}", server.history(before));

    // Refused with what it takes: the turn fails, asked again once at most, and the player reads what to set.
    let before = server.requests().len();
    server.reply(Reply::Refusal(400, LLAMA_CPP_TOO_LONG)).reply(Reply::Refusal(400, LLAMA_CPP_TOO_LONG));
    let (code, message) = code_of(game.block_on(session.send_text("four")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("exceeds the available context size"), "the endpoint's words: {message}");
    assert!(server.requests().len() <= before + 2, "asked again once, not more");
    // Asked again without the earlier turns: what is left is not the history's to fix.
    assert_eq!(server.history(server.requests().len() - 1).last().map(String::as_str), Some("user: four"));
    assert!(message.contains("larger context (llama.cpp's -c"), "what to change: {message}");
}

/// Groq's refusal of a request over its tokens-per-minute limit (413), and OpenAI's (429).
const GROQ_TOO_LARGE: &str = r#"{"error":{"message":"Request too large for model `llama-3.3-70b-versatile` in organization `org_1` service tier `on_demand` on tokens per minute (TPM): Limit 12000, Requested 14137, please reduce your message size and try again.","type":"tokens","code":"rate_limit_exceeded"}}"#;
const OPENAI_TOO_LARGE: &str = r#"{"error":{"message":"Request too large for gpt-4o in organization org-1 on tokens per min (TPM): Limit 30000, Requested 31562. The input or output tokens must be reduced in order to run successfully.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}"#;

#[test]
fn a_request_too_large_for_a_tokens_per_minute_limit_is_asked_again_with_less_history_not_retried_as_it_is() {
    for (status, refusal) in [(413, GROQ_TOO_LARGE), (429, OPENAI_TOO_LARGE)] {
        let (_data, server, game, session) = after_one_turn();
        server.reply(Reply::Refusal(status, refusal)).reply(says("it fits now"));
        let turn = game.block_on(session.send_text("two")).expect("a turn, once the history fits");
        assert_eq!(turn.final_message.as_deref(), Some("it fits now"), "{status}");
        assert_eq!(server.requests().len(), 3, "{status}: asked again once, shorter, not retried as it was");
        assert!(!server.history(2).contains(&"user: one".to_string()), "{status}: {:?}", server.history(2));

        // Too large even with less: the advice is the provider's limit's, not the model's context's.
        server.reply(Reply::Refusal(status, refusal)).reply(Reply::Refusal(status, refusal));
        let (code, message) = code_of(game.block_on(session.send_text("three")));
        assert_eq!(code, ErrorCode::AgentUnavailable, "{status}: {message}");
        assert!(message.contains("tokens-per-minute limit"), "{status}: {message}");
        assert!(!message.contains("context window"), "{status}: {message}");
    }
}

#[test]
fn a_context_overflow_reported_in_the_stream_is_asked_again_with_less_history() {
    let (_data, server, game, session) = after_one_turn();
    // As llama.cpp's server answered an over-long streamed request before it refused them up front (and SGLang
    // still does): 200, then the error as the stream's first event.
    let error = json!({"code": 400, "message": "the request exceeds the available context size, try increasing it",
        "type": "exceed_context_size_error"});
    server.reply(Reply::Stream(vec![Piece::Data(json!({ "error": error }))])).reply(says("fits"));
    let turn = game.block_on(session.send_text("two")).expect("a turn, once the history fits");
    assert_eq!(turn.final_message.as_deref(), Some("fits"));
    assert_eq!(server.history(1), ["user: one", "assistant: first", "user: two"]);
    assert!(!server.history(2).contains(&"user: one".to_string()), "asked again shorter: {:?}", server.history(2));
}

#[test]
fn a_request_too_long_without_any_history_says_the_server_context_or_the_tools_not_the_history_bound() {
    let (_data, server, game, session) = started();
    server.reply(Reply::Refusal(400, LLAMA_CPP_TOO_LONG));
    let (code, message) = code_of(game.block_on(session.send_text("hi")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert_eq!(server.requests().len(), 1, "nothing to shorten: not asked again");
    assert!(message.contains("exceeds the available context size"), "the endpoint's words: {message}");
    assert!(message.contains("fewer tools") && message.contains("-c"), "what to change: {message}");
    assert!(!message.contains("context_window"), "the history's bound is not the cause: {message}");
    assert!(!message.contains("max_tokens"), "no answer's room was asked: {message}");

    // With room asked for the answer (vLLM counts it in the request's length): lowering it may be the remedy.
    let limited = endpoint(&server).sampling(Sampling { max_tokens: Some(8192), ..Sampling::default() });
    let session = game.create(limited).expect("starts");
    server.reply(Reply::Refusal(400, LLAMA_CPP_TOO_LONG));
    let (_, message) = code_of(game.block_on(session.send_text("hi")));
    assert!(message.contains("Sampling::max_tokens (8192)"), "{message}");

    // With a window set and still refused at half the history: the window is more than the server gives.
    let (_data, server, game, _) = started();
    let session = game.create(endpoint(&server).context_window(100_000)).expect("starts");
    // Enough turns that half the history still holds some of them.
    for n in 0..10 {
        server.reply(says("an answer"));
        game.block_on(session.send_text(format!("turn {n}"))).expect("a turn");
    }
    server.reply(Reply::Refusal(400, LLAMA_CPP_TOO_LONG)).reply(Reply::Refusal(400, LLAMA_CPP_TOO_LONG));
    let (_, message) = code_of(game.block_on(session.send_text("two")));
    assert!(message.contains("context_window (100000 tokens) is likely more than the server gives"), "{message}");
}

#[test]
fn a_model_without_tool_support_or_a_server_not_started_for_tools_is_refused_with_what_to_change() {
    let (_data, server, game, session) = started();
    // Ollama's refusal of a request with tools for a model that has none.
    server.reply(Reply::Refusal(
        400,
        r#"{"error":{"message":"registry.ollama.ai/library/gemma3:4b does not support tools","type":"api_error","param":null,"code":null}}"#,
    ));
    let (code, message) = code_of(game.block_on(session.send_text("hi")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("does not support tools"), "the endpoint's words: {message}");
    assert!(message.contains("pick a model with tool support"), "what to change: {message}");
    game.block_on(session.resume()).expect("resumed");
    // vLLM started without tool calls.
    server.reply(Reply::Refusal(
        400,
        r#"{"object":"error","message":"\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set","type":"BadRequestError","code":400}"#,
    ));
    let (_, message) = code_of(game.block_on(session.send_text("hi")));
    assert!(message.contains("start vLLM with --enable-auto-tool-choice --tool-call-parser"), "{message}");
}

#[test]
fn an_answer_that_was_only_reasoning_cut_at_the_token_limit_tells_the_player_nothing_was_answered() {
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    let game = Game::start(data.path());
    let reasoning = |field: &str| Piece::Data(json!({"choices": [{"index": 0, "delta": {field: "hmm, "}}]}));
    // Reasoning that lasts longer than the stall timeout, never silent for more than a twentieth of it (a loaded
    // machine may delay a piece several times over).
    let mut pieces = Vec::new();
    for n in 0..25 {
        pieces.extend([
            reasoning(if n % 2 == 0 { "reasoning_content" } else { "reasoning" }),
            Piece::Wait(Duration::from_millis(100)),
        ]);
    }
    pieces.push(finish("length"));
    server.reply(Reply::Stream(pieces)).reply(says("short"));
    let config = endpoint(&server).stall_timeout(Duration::from_secs(2));
    let session = game.create(config.sampling(Sampling { max_tokens: Some(64), ..Sampling::default() })).expect("ok");
    let turn = game.block_on(session.send_text("think")).expect("a turn");
    assert_eq!((turn.stop_reason, turn.final_message), (StopReason::MaxTokens, None));
    let shown = game.log.wait_for(&format!("error {} NO_ANSWER", session.id()));
    assert!(shown.contains("(64, `Sampling::max_tokens`) reasoning and answered nothing"), "{shown}");
    game.block_on(session.send_text("answer briefly")).expect("the next turn");
    assert_eq!(server.history(1), ["user: think\n\nanswer briefly"], "no reasoning kept in the history");
}

#[test]
fn thinking_in_the_answers_text_is_never_shown_nor_kept() {
    let (_data, server, game, session) = started();
    // As LM Studio streams a Qwen3 answer: the thinking inside the text, the tags cut across pieces.
    let pieces = ["<thi", "nk>\nThe player ", "greets me.\n</th", "ink>\n\nHel", "lo!"];
    let mut stream: Vec<Piece> = pieces.iter().map(|piece| text(piece)).collect();
    stream.push(finish("stop"));
    server.reply(Reply::Stream(stream)).reply(says("<think>\n\n</think>\n\nAgain!"));
    let turn = game.block_on(session.send_text("hi")).expect("a turn");
    assert_eq!(turn.final_message.as_deref(), Some("Hello!"));
    let turn = game.block_on(session.send_text("hi again")).expect("a turn");
    assert_eq!(turn.final_message.as_deref(), Some("Again!"), "a no-think answer's empty block");
    let shown: Vec<String> = game.log.0.lines().into_iter().filter(|line| line.starts_with("delta ")).collect();
    assert!(shown.iter().all(|line| !line.contains("greets") && !line.contains("think>")), "{shown:#?}");
    assert_eq!(server.history(1), ["user: hi", "assistant: Hello!", "user: hi again"], "no thinking kept");
}

#[test]
fn tool_calls_a_model_wrote_in_its_text_run_as_calls_and_are_not_shown() {
    let (_data, server, game, session) = started();
    // vLLM with a tool-call parser that does not match the model: Hermes' markup comes as text, `stop`.
    let markup = "<tool_call>\n{\"name\": \"bump\", \"arguments\": {\"by\": 2}}\n</tool_call>";
    server.reply(Reply::Stream(vec![text("On it. <tool_"), text(&markup[6..]), finish("stop")])).reply(says("done"));
    let turn = game.block_on(session.send_text("bump it by two")).expect("the turn ends");
    assert_eq!(turn.final_message.as_deref(), Some("done"));
    assert_eq!(game.counter(), 1, "the call ran");
    let messages = server.requests()[1]["messages"].as_array().expect("messages").clone();
    let with_calls: Vec<&Value> = messages.iter().filter(|m| m.get("tool_calls").is_some()).collect();
    assert_eq!(with_calls[0]["content"], "On it. ", "the markup is not what the model said: {messages:#?}");
    assert_eq!(with_calls[0]["tool_calls"][0]["function"]["name"], "bump", "{messages:#?}");
    let result = messages.iter().find(|m| m["role"] == "tool").expect("the call's result");
    assert!(result["content"].as_str().is_some_and(|content| content.contains("\"counter\":2")), "{result:#?}");
    assert!(!game.log.lines().iter().any(|line| line.contains("<tool_call>")), "{:#?}", game.log.lines());

    // Cancelled while text after a `<tool_call>` is held back: what the model wrote is shown and kept all the same.
    let id = session.id().to_string();
    server.reply(Reply::Stream(vec![text("Placing <tool_call>{\"na"), Piece::Stall]));
    let waiting = game.block_on(session.start_turn("place")).expect("sent");
    game.log.wait_for(&format!("delta {id} {id}-m3: Placing "));
    assert!(session.cancel());
    assert_eq!(game.block_on(waiting).expect("ends").stop_reason, StopReason::Cancelled);
    server.reply(says("ok"));
    game.block_on(session.send_text("again")).expect("a turn");
    let history = server.history(server.requests().len() - 1);
    assert!(history.contains(&"assistant: Placing <tool_call>{\"na".to_string()), "{history:#?}");

    // A tool the model was not offered: its words, shown as they came, and nothing runs.
    let unknown = "<tool_call>{\"name\": \"delete_world\", \"arguments\": {}}</tool_call>";
    server.reply(Reply::Stream(vec![text(unknown), finish("stop")]));
    let turn = game.block_on(session.send_text("delete it")).expect("the turn ends");
    assert_eq!(turn.final_message.as_deref(), Some(unknown));
    assert_eq!(game.counter(), 1);
}

#[test]
fn an_empty_first_answer_tells_the_player_the_model_answered_nothing() {
    let (_data, server, game, session) = started();
    // LM Studio's answer to a prompt longer than the context it loaded the model with: no delta, `stop`.
    server.reply(Reply::Stream(vec![finish("stop"), usage(5000, 0)]));
    let turn = game.block_on(session.send_text("hello")).expect("the turn ends");
    assert_eq!((turn.stop_reason, turn.final_message), (StopReason::EndTurn, None));
    let shown = game.log.wait_for(&format!("error {} NO_ANSWER", session.id()));
    assert!(shown.contains("answered nothing (finish_reason `stop`)"), "{shown}");
    // After a tool call, saying nothing more is the model's choice: no notice.
    server.reply(calls(vec![call(0, "c1", "bump", "{}")])).reply(Reply::Stream(vec![finish("stop")]));
    game.block_on(session.send_text("bump it")).expect("the turn ends");
    server.reply(says("marker"));
    game.block_on(session.send_text("again")).expect("the turn ends");
    // Chat reaches the game in order: once the last answer is there, so is any notice before it.
    game.log.wait_for(": marker");
    let notices = game.log.lines().iter().filter(|line| line.contains("NO_ANSWER")).count();
    assert_eq!(notices, 1, "{:#?}", game.log.lines());
}

#[test]
fn a_models_reasoning_content_goes_back_with_the_tool_calls_it_led_to_and_reasoning_never_does() {
    for field in ["reasoning_content", "reasoning"] {
        let (_data, server, game, session) = after_one_turn();
        let thought = |piece: &str| Piece::Data(json!({"choices": [{"index": 0, "delta": {field: piece}}]}));
        // As vLLM in transition sends it: the same thinking under the other field too, read once.
        let other = if field == "reasoning" { "reasoning_content" } else { "reasoning" };
        let echoed = Piece::Data(json!({"choices": [{"index": 0, "delta": {other: "ignored"}}]}));
        server
            .reply(calls(vec![thought("I should "), echoed, thought("bump it."), call(0, "c1", "bump", "{}")]))
            .reply(says("done"));
        game.block_on(session.send_text("two")).expect("a turn");
        let requests = server.requests();
        let messages = requests[2]["messages"].as_array().expect("messages").clone();
        let with_calls: Vec<&Value> = messages.iter().filter(|m| m.get("tool_calls").is_some()).collect();
        assert_eq!(with_calls.len(), 1, "{messages:#?}");
        if field == "reasoning_content" {
            // DeepSeek's and Kimi's thinking modes refuse a tool call's message without it.
            assert_eq!(with_calls[0][field], "I should bump it.", "{field}: {messages:#?}");
        } else {
            // Groq refuses `reasoning` in a request.
            assert!(with_calls[0].get(field).is_none(), "{messages:#?}");
        }
        assert!(with_calls[0].get(other).is_none(), "{field}: {messages:#?}");
    }

    // DeepSeek's thinking mode, having thought nothing: `reasoning_content: ""`, which it wants back all the same.
    let (_data, server, game, session) = after_one_turn();
    let empty = Piece::Data(json!({"choices": [{"index": 0, "delta": {"reasoning_content": ""}}]}));
    server.reply(calls(vec![empty, call(0, "c1", "bump", "{}")])).reply(says("done"));
    game.block_on(session.send_text("two")).expect("a turn");
    let messages = server.requests()[2]["messages"].as_array().expect("messages").clone();
    let with_calls: Vec<&Value> = messages.iter().filter(|m| m.get("tool_calls").is_some()).collect();
    assert_eq!(with_calls[0]["reasoning_content"], "", "{messages:#?}");
    // OpenRouter's reasoning blocks (Gemini's refuse the next request without them), streamed a piece at a time.
    let (_data, server, game, session) = after_one_turn();
    let block = |text: &str, signature: Option<&str>| {
        let mut piece = json!({"type": "reasoning.text", "text": text, "index": 0, "format": "google-gemini-v1"});
        if let Some(signature) = signature {
            piece["signature"] = json!(signature);
        }
        Piece::Data(json!({"choices": [{"index": 0, "delta": {"reasoning": text, "reasoning_details": [piece]}}]}))
    };
    server
        .reply(calls(vec![block("Bump ", None), block("it.", Some("c2ln")), call(0, "c1", "bump", "{}")]))
        .reply(says("done"));
    game.block_on(session.send_text("two")).expect("a turn");
    let messages = server.requests()[2]["messages"].as_array().expect("messages").clone();
    let with_calls: Vec<&Value> = messages.iter().filter(|m| m.get("tool_calls").is_some()).collect();
    let expected = json!([{"type": "reasoning.text", "text": "Bump it.", "index": 0, "format": "google-gemini-v1",
        "signature": "c2ln"}]);
    assert_eq!(with_calls[0]["reasoning_details"], expected, "{messages:#?}");
    // An endpoint that never said the field: none sent.
    let (_data, server, game, session) = after_one_turn();
    server.reply(calls(vec![call(0, "c1", "bump", "{}")])).reply(says("done"));
    game.block_on(session.send_text("two")).expect("a turn");
    let messages = server.requests()[2]["messages"].as_array().expect("messages").clone();
    assert!(messages.iter().all(|m| m.get("reasoning_content").is_none()), "{messages:#?}");
}

// ---------------------------------------------------------------------------------------------------------------
// The sandbox, end to end.

fn sandbox_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test's own path");
        let profile_dir = exe.parent().and_then(Path::parent).expect("<target>/<profile>/deps/<test>");
        let mut build = std::process::Command::new(env!("CARGO"));
        build
            .args(["build", "--example", "sandbox", "--features", "openai"])
            .env("CARGO_TARGET_DIR", profile_dir.parent().expect("target"));
        if profile_dir.file_name().is_some_and(|name| name == "release") {
            build.arg("--release");
        }
        let status = build.current_dir(env!("CARGO_MANIFEST_DIR")).status().expect("cargo runs");
        assert!(status.success(), "cargo build --example sandbox --features openai failed");
        profile_dir.join("examples").join(format!("sandbox{}", std::env::consts::EXE_SUFFIX))
    })
}

#[test]
fn the_sandbox_chats_with_an_openai_compatible_endpoint_with_the_same_commands_and_lines() {
    use std::io::{BufRead, BufReader, Write};
    let data = tempfile::tempdir().unwrap();
    let server = Server::start();
    server.reply(calls(vec![text("Looking."), call(0, "w", "world_info", "{}")])).reply(Reply::Stream(vec![
        text("All "),
        text("fine."),
        finish("stop"),
    ]));
    let mut child = std::process::Command::new(sandbox_binary())
        .args(["--data-dir".as_ref(), data.path().as_os_str()])
        .args(["--tps", "120", "--port", "0", "--world", "alpha"])
        .args(["--agent-openai", &server.url, "--model", "scripted-model", "--context-window", "8192"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the sandbox starts");
    let (send, lines) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = send.send(line);
        }
    });
    let mut seen = Vec::new();
    let until = |seen: &mut Vec<String>, wanted: &dyn Fn(&str) -> bool| -> String {
        loop {
            let line = lines.recv_timeout(LIMIT).unwrap_or_else(|_| panic!("no such line; so far {seen:#?}"));
            seen.push(line.clone());
            if wanted(&line) {
                return line;
            }
        }
    };
    let ready = until(&mut seen, &|line| line.starts_with("chat-status ") || line.starts_with("chat-error"));
    assert!(ready.ends_with("status=idle previous=none"), "{ready}");
    let id = ready.split(' ').nth(1).and_then(|s| s.strip_prefix("session=")).unwrap().to_string();
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "say how is the world?").unwrap();
    assert_eq!(until(&mut seen, &|line| line.starts_with("ok") || line.starts_with("error")), "ok sent");
    let expected = [
        format!("chat-status session={id} status=running previous=idle"),
        format!("chat session={id}: Looking."),
        format!("chat-status session={id} status=waiting_tool_result previous=running"),
        format!("chat-status session={id} status=running previous=waiting_tool_result"),
        format!("chat session={id}: All fine."),
        format!("chat-status session={id} status=idle previous=running"),
    ];
    // The turn's status lines may come before the command's `ok sent`: compare every chat line since `ready`.
    let last = expected.last().cloned().unwrap_or_default();
    until(&mut seen, &|line| line == last);
    let after_ready = seen.iter().skip_while(|line| **line != ready).skip(1);
    let chat: Vec<&String> = after_ready.filter(|line| line.starts_with("chat")).collect();
    assert_eq!(chat, expected.iter().collect::<Vec<_>>());
    let results = tool_results(&server, 1);
    assert!(results[0].contains("alpha"), "the tool ran in the game: {results:?}");
    let record = data.path().join("agent-sessions").join(&id).join("session.json");
    let record: Value = serde_json::from_str(&std::fs::read_to_string(record).unwrap()).unwrap();
    assert_eq!(record.to_string().matches("\"context_window\":8192").count(), 1, "--context-window: {record}");
    writeln!(stdin, "chat-end").unwrap();
    assert_eq!(
        until(&mut seen, &|line| line.starts_with("ok") || line.starts_with("error")),
        format!("ok ended session={id}")
    );
    writeln!(stdin, "quit").unwrap();
    drop(stdin);
    let status = child.wait().unwrap();
    assert!(status.success());
}

#[test]
fn a_finished_turn_leaves_no_task_waiting_out_its_timeout() {
    let (_data, server, game, session) = after_one_turn();
    let metrics = game.game.agent().runtime().metrics();
    let before = metrics.num_alive_tasks();
    for n in 0..30 {
        server.reply(says("ok"));
        game.block_on(session.send_text(&format!("turn {n}"))).expect("a turn");
    }
    // A turn's timeout (10 minutes by default) stops watching it once it ends: the tasks left are the runtime's
    // steady ones.
    common::wait_tasks_back_to(&metrics, before, "30 turns", LIMIT);
}
