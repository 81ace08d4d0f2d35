//! The MCP transport with a real client (rmcp's), both protocol generations, and its security checks over raw
//! HTTP.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bevy::prelude::{AppExit, IntoScheduleConfigs, Last, MessageWriter, Res, Resource};
use bevy_agent_tools::mcp::{McpPlugin, McpServer, McpUnavailable, ERROR_META_KEY, OBSERVED_META_KEY};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app_with, Gate, RunningGame};
use bevy_agent_tools::{AgentToolsExitSystems, ConversationId, NoArgs};
use common::*;
use rmcp::model::{CallToolRequest, CallToolRequestParams, ClientRequest, ProgressNotificationParam, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;

const TOKEN: &str = "test-token-0123456789abcdef";

/// Receives one message each time the `long` tool's handler sees `ended()`.
struct Seen {
    ended_tx: mpsc::UnboundedSender<()>,
    ended: tokio::sync::Mutex<mpsc::UnboundedReceiver<()>>,
}

impl Default for Seen {
    fn default() -> Self {
        let (ended_tx, ended) = mpsc::unbounded_channel();
        Self { ended_tx, ended: tokio::sync::Mutex::new(ended) }
    }
}

fn long_tool(seen: Arc<Seen>) -> AgentTool<Session> {
    AgentTool::new(
        "long",
        "Counts frames, reporting progress, until told to stop.",
        move |ctx: CallContext<Session>, _: NoArgs| {
            let seen = seen.clone();
            async move {
                // Stops at its first refused step (the call ended), or waits for the end after 100 frames.
                for step in 1..=100 {
                    if ctx.on_client(|_, session| session.counter += 1).await.is_err() {
                        break;
                    }
                    ctx.report_progress(step as f64, Some(100.0), Some(format!("step {step}")));
                }
                let reason = ctx.ended().await;
                let _ = seen.ended_tx.send(());
                Err::<(), _>(reason)
            }
        },
    )
}

/// Arguments that are one of several shapes: schemars makes a `oneOf` with no root `type`.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case")]
enum Steer {
    Left { by: u32 },
    Right { by: u32 },
}

/// An argument of any JSON: schemars writes its schema as `true`.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Stash {
    data: Value,
}

fn steer_tool() -> AgentTool<Session> {
    AgentTool::new("steer", "Steers left or right.", |_: CallContext<Session>, steer: Steer| async move {
        Ok(json!({ "turned": match steer { Steer::Left { by } => -(by as i64), Steer::Right { by } => by as i64 } }))
    })
}

fn game(seen: Arc<Seen>, gate: Gate) -> (RunningGame, McpServer) {
    game_with(seen, gate, |mcp| mcp)
}

fn game_with(seen: Arc<Seen>, gate: Gate, configure: fn(McpPlugin) -> McpPlugin) -> (RunningGame, McpServer) {
    let game = RunningGame::spawn(Duration::from_millis(1), move || {
        let plugin = AgentToolsPlugin::new(TestGame::default())
            .with_tool(bump_tool("bump", ToolScope::World, Arc::default(), None))
            .with_tool(
                AgentTool::new("peek", "Reads the counter.", |ctx: CallContext<Session>, _: NoArgs| async move {
                    Ok(json!({ "counter": ctx.on_client(|_, s| s.counter).await? }))
                })
                .read_only(),
            )
            .with_tool(long_tool(seen))
            .with_tool(steer_tool())
            .with_tool(
                AgentTool::new("stash", "Keeps any JSON.", |_: CallContext<Session>, args: Stash| async move {
                    Ok(json!({ "kept": args.data }))
                })
                .read_only(),
            )
            .with_tool(bump_tool("gated", ToolScope::World, Arc::default(), Some(gate)))
            .max_in_flight_per_conversation(2);
        headless_app_with(plugin, configure(McpPlugin::new().port(0).token(TOKEN).max_body_bytes(64 * 1024)))
    });
    let server = game.with_app(|app| app.world().resource::<McpServer>().clone());
    game.with_app(|app| {
        app.world_mut().write_message(EnterWorld::new("alpha"));
        app.update(); // the world is open before anyone calls
    });
    (game, server)
}

#[derive(Clone)]
struct Progress(mpsc::UnboundedSender<ProgressNotificationParam>);

impl ClientHandler for Progress {
    async fn on_progress(&self, params: ProgressNotificationParam, _: NotificationContext<RoleClient>) {
        let _ = self.0.send(params);
    }
}

type Client = RunningService<RoleClient, Progress>;

async fn connect(url: &str, modern: bool) -> (Client, mpsc::UnboundedReceiver<ProgressNotificationParam>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(TOKEN),
    );
    let client = if modern {
        let mode = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
        Progress(tx).serve_with_lifecycle(transport, mode).await.expect("connect (2026-07-28)")
    } else {
        Progress(tx).serve(transport).await.expect("connect (2025-11-25)")
    };
    (client, rx)
}

fn params(tool: &str, arguments: Value) -> CallToolRequestParams {
    CallToolRequestParams::new(tool.to_string()).with_arguments(arguments.as_object().cloned().unwrap_or_default())
}

/// The error of an error result as every client shows it: the JSON in its text block. It is also under
/// `_meta["bevy-agent-tools/error"]`, and never in `structuredContent` (which would not match the output schema).
fn domain_error(result: &rmcp::model::CallToolResult) -> Value {
    assert_eq!(result.is_error, Some(true), "an error result: {result:?}");
    assert!(result.structured_content.is_none(), "no structuredContent on an error: {result:?}");
    let text = result.content.iter().find_map(|block| block.as_text()).expect("a text block").text.clone();
    let error: Value = serde_json::from_str(&text).expect("the text block is the error as JSON");
    let meta = &result.meta.as_ref().expect("meta").0[ERROR_META_KEY];
    assert_eq!(meta, &error, "the same error in _meta");
    error
}

/// The JSON-RPC error code a request was answered with, if it was answered with an error.
fn json_rpc_code<T>(answer: &Result<T, rmcp::ServiceError>) -> Option<rmcp::model::ErrorCode> {
    match answer {
        Err(rmcp::ServiceError::McpError(error)) => Some(error.code),
        _ => None,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
}

async fn story(url: String, modern: bool, seen: Arc<Seen>) {
    let (client, mut progress) = connect(&url, modern).await;

    let tools = client.list_all_tools().await.expect("tools/list");
    let bump = tools.iter().find(|t| t.name == "bump").expect("bump listed");
    let properties = &bump.input_schema["properties"];
    assert!(properties["by"].is_object(), "argument schema from schemars");
    assert!(properties["operation_id"].is_object() && properties["task_id"].is_object(), "reserved arguments");
    assert!(bump.output_schema.is_some(), "typed output schema");
    let annotations = bump.annotations.clone().expect("annotations");
    assert_eq!(annotations.read_only_hint, Some(false));
    let peek = tools.iter().find(|t| t.name == "peek").expect("peek listed");
    assert_eq!(peek.annotations.as_ref().and_then(|a| a.read_only_hint), Some(true));
    let peek_properties = peek.input_schema.get("properties").cloned().unwrap_or_default();
    assert!(peek_properties.get("operation_id").is_none(), "read-only tools have no replay keys");

    let result = client.call_tool(params("bump", json!({"by": 2}))).await.expect("tools/call");
    assert_eq!(result.is_error, Some(false));
    let structured = result.structured_content.clone().expect("structured");
    assert!(structured["counter"].as_u64().is_some());
    let observed = &result.meta.as_ref().expect("meta").0[OBSERVED_META_KEY];
    assert_eq!(observed["world"], "alpha", "results say which visit they observed");
    // Every result says who answered (2026-07-28: no session or handshake tells a client otherwise).
    let listed = client.list_tools(None).await.expect("tools/list").meta.expect("meta");
    for meta in [&result.meta.as_ref().expect("meta").0, &listed.0] {
        let answered_by = &meta["io.modelcontextprotocol/serverInfo"];
        assert_eq!(answered_by["name"], "bevy_agent_tools", "{meta:?}");
        assert_eq!(answered_by["version"], env!("CARGO_PKG_VERSION"));
    }

    let error = client.call_tool(params("bump", json!({"by": "many"}))).await.expect("a result, not a protocol error");
    let error = domain_error(&error);
    assert_eq!(error["code"], "INVALID_INPUT");
    assert_eq!(error["details"]["field"], "by");
    assert!(error["message"].as_str().is_some_and(|m| m.contains("by")), "{error}");

    let unknown = client.call_tool(params("bumb", json!({}))).await.expect_err("JSON-RPC error");
    let text = unknown.to_string();
    assert!(text.contains("-32602") || text.contains("no tool named"), "{text}");

    // Progress, then cancel: the handler's ended() fires.
    let handle = client
        .peer()
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(params("long", json!({})))),
            PeerRequestOptions::no_options(),
        )
        .await
        .expect("sent");
    let first = tokio::time::timeout(Duration::from_secs(10), progress.recv()).await.expect("progress in time");
    assert!(first.expect("a progress notification").progress >= 1.0);
    handle.cancel(Some("test".into())).await.expect("cancel sent");
    let ended = tokio::time::timeout(Duration::from_secs(10), seen.ended.lock().await.recv()).await;
    assert!(matches!(ended, Ok(Some(()))), "the handler saw ended()");
    client.cancel().await.expect("close");
}

#[test]
fn mcp_2025_11_25_lists_calls_reports_errors_progress_and_cancels() {
    let seen = Arc::new(Seen::default());
    let (game, server) = game(seen.clone(), Gate::new());
    runtime().block_on(story(server.url().to_string(), false, seen));
    game.stop();
}

#[test]
fn mcp_2026_07_28_lists_calls_reports_errors_progress_and_cancels() {
    let seen = Arc::new(Seen::default());
    let (game, server) = game(seen.clone(), Gate::new());
    runtime().block_on(story(server.url().to_string(), true, seen));
    game.stop();
}

#[test]
fn h1_reconnecting_mcp_clients_keep_talking_to_the_same_visit() {
    let (game, server) = game(Arc::default(), Gate::new());
    let url = server.url().to_string();
    let visits: Vec<Value> = runtime().block_on(async move {
        let mut visits = Vec::new();
        for modern in [false, true, false, true] {
            let (client, _) = connect(&url, modern).await;
            let result = client.call_tool(params("bump", json!({}))).await.expect("call");
            visits.push(result.meta.expect("meta").0[OBSERVED_META_KEY]["visit"].clone());
            client.cancel().await.expect("close");
        }
        visits
    });
    assert!(visits.windows(2).all(|w| w[0] == w[1]), "{visits:?}");
    let opens =
        game.with_app(|app| app.world().resource::<bevy_agent_tools::AgentHandle>().visit().map(|v| v.info.visit));
    assert_eq!(json!(opens.expect("open")), visits[0]);
    game.stop();
}

/// A 2026-07-28 client that names itself `name` (version 1.0) in every request's `_meta`.
#[derive(Clone)]
struct Named(&'static str);

impl ClientHandler for Named {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        rmcp::model::ClientConfig::new(Default::default(), rmcp::model::Implementation::new(self.0, "1.0"))
    }
}

#[test]
fn h12_a_sessionless_clients_retries_run_once_by_its_name_and_a_minted_handle_keeps_a_conversation_apart() {
    let (game, server) = game(Arc::default(), Gate::new());
    let url = server.url().to_string();
    runtime().block_on(async move {
        // Two separate 2026-07-28 clients: rmcp's client sends the same clientInfo for both. And one of another
        // name.
        let (a, _) = connect(&url, true).await;
        let (b, _) = connect(&url, true).await;
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(url.as_str()).auth_header(TOKEN),
        );
        let mode = ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] };
        let other = Named("other").serve_with_lifecycle(transport, mode).await.expect("connect (2026-07-28)");
        let counter =
            |result: rmcp::model::CallToolResult| result.structured_content.expect("structured")["counter"].clone();
        let keyed = json!({ "by": 1, "operation_id": "op-1" });
        let first = counter(a.call_tool(params("bump", keyed.clone())).await.expect("call"));
        let retried = counter(a.call_tool(params("bump", keyed.clone())).await.expect("call"));
        assert_eq!(first, retried, "a retry of a sessionless client without a handle runs once (DESIGN §7)");
        let second = counter(b.call_tool(params("bump", keyed.clone())).await.expect("call"));
        assert_eq!(first, second, "a client of the same name and version is the same conversation");
        let theirs = counter(other.call_tool(params("bump", keyed.clone())).await.expect("call"));
        assert_ne!(first, theirs, "a client of another name ran its own operation");

        let begun = a.call_tool(params("begin_conversation", json!({}))).await.expect("call");
        let handle =
            begun.structured_content.expect("structured")["conversation"].as_str().expect("a handle").to_string();
        let mine = json!({ "by": 1, "operation_id": "op-2", "conversation": handle });
        let once = counter(a.call_tool(params("bump", mine.clone())).await.expect("call"));
        let retried = counter(a.call_tool(params("bump", mine.clone())).await.expect("call"));
        assert_eq!(once, retried, "a retry in the same conversation runs once");
        let theirs =
            counter(b.call_tool(params("bump", json!({ "by": 1, "operation_id": "op-2" }))).await.expect("call"));
        assert_ne!(theirs, once, "without the handle it is another conversation's operation");

        let forged = b.call_tool(params("bump", json!({ "conversation": "cv-guessed" }))).await.expect("call");
        assert_eq!(domain_error(&forged)["code"], "CONVERSATION_NOT_FOUND");
        let tools = a.list_all_tools().await.expect("tools");
        for tool in &tools {
            // The TypeScript SDK refuses the whole list when one tool's schema is not `"type": "object"`.
            assert_eq!(tool.input_schema.get("type"), Some(&json!("object")), "{}: {:?}", tool.name, tool.input_schema);
            // Anthropic's API (Claude Code) refuses alternatives at the root: an enum of shapes is one object.
            for keyword in ["oneOf", "anyOf", "allOf"] {
                assert!(!tool.input_schema.contains_key(keyword), "{}: {:?}", tool.name, tool.input_schema);
            }
            // ... and every property's schema to be an object (`true` is not).
            let properties = tool.input_schema.get("properties").and_then(Value::as_object);
            assert!(properties.is_some_and(|p| p.values().all(Value::is_object)), "{}: {:?}", tool.name, properties);
        }
        let steered = a.call_tool(params("steer", json!({ "action": "left", "by": 2 }))).await.expect("call");
        assert_eq!(steered.structured_content.expect("structured")["turned"], -2, "an enum of argument shapes works");
        for tool in tools.iter().filter(|tool| tool.name != "begin_conversation") {
            let properties = tool.input_schema.get("properties").and_then(Value::as_object);
            assert!(
                properties.is_some_and(|properties| properties.contains_key("conversation")),
                "every tool takes the handle, also one without arguments: {} does not list it",
                tool.name
            );
        }
        assert!(tools.iter().any(|tool| tool.name == "begin_conversation"));
        a.cancel().await.expect("close");
        b.cancel().await.expect("close");
        other.cancel().await.expect("close");
    });
    game.stop();
}

/// A 2025-11-25 client that counts the server's `notifications/tools/list_changed`.
#[derive(Clone)]
struct ListWatcher(mpsc::UnboundedSender<()>);

impl ClientHandler for ListWatcher {
    async fn on_tool_list_changed(&self, _: NotificationContext<RoleClient>) {
        let _ = self.0.send(());
    }
}

/// A 2025-11-25 client of the game at `url`, and the announcements it hears.
async fn list_watcher(url: String) -> (RunningService<RoleClient, ListWatcher>, mpsc::UnboundedReceiver<()>) {
    let (tx, changed) = mpsc::unbounded_channel();
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(TOKEN),
    );
    (ListWatcher(tx).serve(transport).await.expect("connect (2025-11-25)"), changed)
}

/// A tool a world registers once it has loaded.
fn late_tool() -> AgentTool<Session> {
    AgentTool::new("late", "Registered late.", |_: CallContext<Session>, _: NoArgs| async move {
        Ok(json!({ "late": true }))
    })
}

/// The server told `client`, as it initialized, that it announces tool list changes.
fn assert_says_it_announces<H: ClientHandler>(client: &RunningService<RoleClient, H>) {
    let capabilities = client.peer_info().and_then(|info| info.capabilities.tools.clone());
    assert_eq!(capabilities.and_then(|tools| tools.list_changed), Some(true), "the server says it announces");
}

#[test]
fn a_tool_registered_while_the_game_runs_is_announced_to_connected_clients_which_then_list_it() {
    let (game, server) = game(Arc::default(), Gate::new());
    let url = server.url().to_string();
    let agent = game.agent();
    runtime().block_on(async move {
        let (client, mut changed) = list_watcher(url).await;
        assert_says_it_announces(&client);
        assert!(!client.list_all_tools().await.expect("tools").iter().any(|tool| tool.name == "late"));

        // A world finished loading and registers its tools.
        agent.register_tool(late_tool()).expect("registered");
        tokio::time::timeout(Duration::from_secs(10), changed.recv()).await.expect("announced in time");
        assert!(client.list_all_tools().await.expect("tools").iter().any(|tool| tool.name == "late"));

        // The player left that world: its tools go, and that is announced too.
        assert!(agent.unregister_tool("late"));
        assert!(!agent.unregister_tool("late"), "gone already");
        tokio::time::timeout(Duration::from_secs(10), changed.recv()).await.expect("announced in time");
        assert!(!client.list_all_tools().await.expect("tools").iter().any(|tool| tool.name == "late"));
        client.cancel().await.expect("close");
    });
    game.stop();
}

#[test]
fn a_client_that_says_initialized_again_and_again_is_told_of_a_change_once() {
    let (game, server) = game(Arc::default(), Gate::new());
    let url = server.url().to_string();
    let agent = game.agent();
    runtime().block_on(async move {
        let (client, mut changed) = list_watcher(url).await;
        for _ in 0..5 {
            client.peer().notify_initialized().await.expect("sent");
        }
        // Read after every one of them (the session's messages are handled in order).
        client.list_all_tools().await.expect("tools");
        agent.register_tool(late_tool()).expect("registered");
        tokio::time::timeout(Duration::from_secs(10), changed.recv()).await.expect("announced in time");
        client.list_all_tools().await.expect("tools");
        // The copies an announcement to each `initialized` would send go out with the first: none follows.
        let again = tokio::time::timeout(Duration::from_millis(500), changed.recv()).await;
        assert!(again.is_err(), "one announcement per change and session");
        client.cancel().await.expect("close");
    });
    game.stop();
}

#[test]
fn a_tool_registered_while_the_game_runs_is_announced_to_sessionless_clients_that_listen() {
    let (game, server) = game(Arc::default(), Gate::new());
    let url = server.url().to_string();
    let agent = game.agent();
    runtime().block_on(async move {
        let (client, _) = connect(&url, true).await;
        assert_says_it_announces(&client);
        // 2026-07-28 has no session to announce on: the client opens a stream for it.
        let filter = rmcp::model::SubscriptionFilter::builder().tools_list_changed().build();
        let mut subscription = client.peer().listen(filter).await.expect("listening");
        assert_eq!(subscription.acknowledged().tools_list_changed, Some(true), "granted");
        assert!(!client.list_all_tools().await.expect("tools").iter().any(|tool| tool.name == "late"));

        agent.register_tool(late_tool()).expect("registered");
        let announced = tokio::time::timeout(Duration::from_secs(10), subscription.next()).await.expect("in time");
        assert!(
            matches!(announced, Ok(Some(rmcp::model::ServerNotification::ToolListChangedNotification(_)))),
            "{announced:?}"
        );
        assert!(client.list_all_tools().await.expect("tools").iter().any(|tool| tool.name == "late"));
        client.cancel().await.expect("close");
    });
    game.stop();
}

#[test]
fn busy_over_the_in_flight_limit_is_the_hosts_busy_error_result_before_the_call_reaches_the_service() {
    for modern in [false, true] {
        busy_over_the_in_flight_limit_in(modern);
    }
}

/// In an MCP session (2025-11-25), or sessionless (2026-07-28), where the client's name makes the conversation.
fn busy_over_the_in_flight_limit_in(modern: bool) {
    let gate = Gate::new();
    let (game, server) = game(Arc::default(), gate.clone());
    let url = server.url().to_string();
    let opener = gate.clone();
    runtime().block_on(async move {
        let (client, _) = connect(&url, modern).await;
        let peer = client.peer().clone();
        let call = |arguments: Value| {
            let peer = peer.clone();
            tokio::spawn(async move { peer.call_tool(params("gated", arguments)).await })
        };
        let first = call(json!({"operation_id": "op-1"}));
        let second = call(json!({}));
        tokio::time::timeout(Duration::from_secs(30), opener.arrivals(2))
            .await
            .expect("the calls reached their tool in time");
        let third = peer.call_tool(params("gated", json!({}))).await.expect("an error result, not a transport error");
        assert_eq!(third.is_error, Some(true));
        let text = third.content.first().and_then(|content| content.as_text()).map(|text| text.text.clone());
        let error: Value = serde_json::from_str(&text.unwrap_or_default()).expect("the error as JSON text");
        assert_eq!((&error["code"], &error["details"]["limit"]), (&json!("BUSY"), &json!(2)), "DESIGN §5: {error}");
        let meta = third.meta.as_ref().map(|meta| meta.0.clone()).unwrap_or_default();
        assert!(
            meta.get("io.modelcontextprotocol/serverInfo").is_some(),
            "says who answers, as every result: {meta:?}"
        );
        // At the limit, the way out of a shared conversation still works, and an unknown tool is still an unknown
        // tool (a JSON-RPC error), not BUSY.
        let begun = peer.call_tool(params("begin_conversation", json!({}))).await.expect("a result");
        assert_eq!(begun.is_error, Some(false), "{begun:?}");
        let unknown = peer.call_tool(params("gatde", json!({}))).await;
        assert_eq!(json_rpc_code(&unknown), Some(rmcp::model::ErrorCode::INVALID_PARAMS), "{unknown:?}");
        if modern {
            // The same conversation (rmcp's client name) over raw HTTP: one JSON-RPC response, for this request.
            let info = serde_json::to_value(rmcp::model::ClientConfig::default().client_info).expect("json");
            let meta = json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "io.modelcontextprotocol/clientInfo": info,
            });
            let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                "params": {"name": "gated", "arguments": {}, "_meta": meta}});
            let (status, response) = raw(&server, &[("Authorization", &format!("Bearer {TOKEN}"))], &call.to_string());
            assert_eq!(status, 200, "{response}");
            let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
            let answer: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("a JSON body ({e}): {response}"));
            assert_eq!((&answer["id"], &answer["result"]["isError"]), (&json!(9), &json!(true)), "{answer}");
            assert_eq!(answer["result"]["resultType"], "complete", "2026-07-28: every result says its type: {answer}");
            let error = &answer["result"]["_meta"][ERROR_META_KEY];
            assert_eq!((&error["code"], &error["details"]["limit"]), (&json!("BUSY"), &json!(2)), "DESIGN §5: {error}");
            assert!(error["message"].as_str().is_some_and(|m| m.contains("wait for one")), "{error}");
            assert!(response.to_ascii_lowercase().contains("retry-after: 1"), "{response}");
        }
        // A retry of a running operation joins it rather than being refused (the host decides: it adds no call).
        let mut retry = call(json!({"operation_id": "op-1"}));
        let answered = tokio::time::timeout(Duration::from_millis(500), &mut retry).await;
        assert!(answered.is_err(), "the retry waits with its operation (a refusal comes at once): {answered:?}");
        opener.open();
        let first = first.await.expect("joined").expect("ok");
        assert_eq!(first.is_error, Some(false));
        let retry = retry.await.expect("joined").expect("answered");
        assert_eq!(retry.structured_content, first.structured_content, "the retry got the operation's outcome");
        assert_eq!(second.await.expect("joined").expect("ok").is_error, Some(false));
        client.cancel().await.expect("close");
    });
    game.stop();
}

/// One raw HTTP/1.1 exchange; returns the status code and body.
fn raw(server: &McpServer, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    raw_method(server, "POST", headers, body)
}

/// The value of the response header `name` (lower case) in a raw HTTP response.
fn header_line<'a>(response: &'a str, name: &str) -> Option<&'a str> {
    let head = response.split("\r\n\r\n").next()?;
    head.lines().find_map(|line| {
        let (header, value) = line.split_once(':')?;
        header.eq_ignore_ascii_case(name).then_some(value.trim())
    })
}

/// What an OAuth client does after a 401 (Claude Code, the SDKs' auth helpers): it looks for the server's OAuth
/// metadata. There is none, and the answer says so at once, with or without a token, instead of another 401 that
/// would read as "this resource is protected, go and authorize".
#[test]
fn an_oauth_clients_discovery_is_answered_404_saying_what_to_send_instead() {
    let (game, server) = game(Arc::default(), Gate::new());
    let bearer = format!("Bearer {TOKEN}");
    for path in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-authorization-server",
    ] {
        for headers in [vec![], vec![("Authorization", bearer.as_str())]] {
            let (status, body) = common::raw_mcp::request_to(server.address(), "GET", path, &headers, "");
            assert_eq!(status, 404, "{path}: {body}");
            assert!(body.contains("does not use OAuth") && body.contains("Authorization: Bearer"), "{path}: {body}");
        }
    }
    // A foreign Origin is still refused before anything else.
    let (status, _) = common::raw_mcp::request_to(
        server.address(),
        "GET",
        "/.well-known/oauth-protected-resource",
        &[("Origin", "http://evil.example")],
        "",
    );
    assert_eq!(status, 403);
    // Other paths still need the token.
    let (status, _) = common::raw_mcp::request_to(server.address(), "GET", "/elsewhere", &[], "");
    assert_eq!(status, 401);
    game.stop();
}

fn raw_method(server: &McpServer, method: &str, headers: &[(&str, &str)], body: &str) -> (u16, String) {
    common::raw_mcp::request(server.address(), method, headers, body)
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

#[test]
fn the_token_is_never_shown_in_full_by_debug() {
    let (game, server) = game(Arc::default(), Gate::new());
    let plugin = McpPlugin::new().token(TOKEN);
    for shown in [format!("{server:?}"), format!("{plugin:?}")] {
        assert!(!shown.contains(TOKEN) && shown.contains(&TOKEN[..4]), "{shown}");
    }
    game.stop();
}

#[test]
fn security_refusals_have_the_right_status_and_say_why() {
    let (game, server) = game(Arc::default(), Gate::new());
    let bearer = format!("Bearer {TOKEN}");

    let (status, body) = raw(&server, &[], INITIALIZE);
    assert_eq!(status, 401, "no token: {body}");
    assert!(body.contains("missing bearer token"));
    assert!(
        body.contains("file the game printed") && body.contains("not use OAuth"),
        "says where the token is: {body}"
    );
    assert!(header_line(&body, "www-authenticate").is_some_and(|value| value == r#"Bearer realm="mcp""#), "{body}");
    let (status, body) = raw(&server, &[("Authorization", "Bearer wrong-token-wrong-token")], INITIALIZE);
    assert_eq!(status, 401, "wrong token: {body}");
    assert!(body.contains("wrong or revoked bearer token"));
    let challenge = header_line(&body, "www-authenticate").unwrap_or_default();
    assert!(challenge.starts_with("Bearer realm=\"mcp\", error=\"invalid_token\""), "RFC 6750: {body}");
    // HTTP authentication schemes are case-insensitive.
    let lower = format!("bearer {TOKEN}");
    let (status, body) = raw(&server, &[("Authorization", &lower)], INITIALIZE);
    assert_eq!(status, 200, "a lower-case scheme is the same scheme: {body}");

    let (status, _) = raw(&server, &[("Authorization", &bearer), ("Origin", "http://evil.example")], INITIALIZE);
    assert_eq!(status, 403, "a foreign Origin is refused");
    let (status, _) = raw(&server, &[("Authorization", &bearer), ("Host", "evil.example")], INITIALIZE);
    assert_eq!(status, 403, "a foreign Host is refused");
    // MCP's transport: an Origin that is not allowed gets 403, token or not (DNS rebinding: Host, the same).
    let (status, body) = raw(&server, &[("Origin", "http://evil.example")], INITIALIZE);
    assert_eq!(status, 403, "a foreign Origin without a token is refused as foreign: {body}");
    let (status, body) = raw(&server, &[("Authorization", "Bearer wrong"), ("Host", "evil.example")], INITIALIZE);
    assert_eq!(status, 403, "a foreign Host with a wrong token is refused as foreign: {body}");
    let (status, body) = raw(&server, &[("Origin", "http://localhost:3000")], INITIALIZE);
    assert_eq!(status, 401, "an allowed Origin without a token still needs the token: {body}");
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"bump","arguments":{{"x":"{}"}}}}}}"#,
        "a".repeat(100_000)
    );
    let (status, _) = raw(&server, &[("Authorization", &bearer)], &huge);
    assert_eq!(status, 413, "an oversized body is refused");
    let (status, _) = raw(&server, &[("Authorization", &bearer), ("Origin", "http://evil.example")], &huge);
    assert_eq!(status, 403, "a foreign Origin is refused before anything else is looked at");

    let (status, response) =
        raw(&server, &[("Authorization", &bearer), ("Origin", "http://localhost:3000")], INITIALIZE);
    assert_eq!(status, 200, "a local browser origin with the token is served");
    // ... and the page may read the answer and its session id (CORS), after a preflight that needs no token.
    let lower = response.to_ascii_lowercase();
    assert!(lower.contains("access-control-allow-origin: http://localhost:3000"), "{response}");
    assert!(lower.contains("access-control-expose-headers: mcp-session-id"), "{response}");
    let asks = [
        ("Origin", "http://localhost:3000"),
        ("Access-Control-Request-Method", "POST"),
        ("Access-Control-Request-Headers", "authorization, content-type, mcp-protocol-version, mcp-method"),
    ];
    let (status, response) = raw_method(&server, "OPTIONS", &asks, "");
    assert_eq!(status, 204, "a preflight from an allowed origin is answered: {response}");
    let lower = response.to_ascii_lowercase();
    assert!(lower.contains("access-control-allow-origin: http://localhost:3000"), "{response}");
    assert!(lower.contains("access-control-allow-headers: authorization, content-type"), "{response}");
    assert!(lower.contains("mcp-method") && lower.contains("access-control-allow-methods"), "{response}");
    let (status, response) = raw_method(&server, "OPTIONS", &[asks[1], ("Origin", "http://evil.example")], "");
    assert_eq!(status, 403, "not from another origin: {response}");
    assert!(!response.to_ascii_lowercase().contains("access-control-allow-origin"), "{response}");
    let (_, response) = raw(&server, &[("Authorization", &bearer)], INITIALIZE);
    assert!(!response.to_ascii_lowercase().contains("access-control"), "no CORS without Origin: {response}");
    // Bodies that are not one JSON-RPC message: 400 with a JSON-RPC error, as JSON.
    let batch = format!("[{INITIALIZE}, {INITIALIZE}]");
    for (body, what, code, id) in [
        ("{not json", "malformed JSON", -32700, Value::Null),
        (batch.as_str(), "a batch", -32600, Value::Null),
        (r#"{"jsonrpc":"2.0","id":[1,2],"method":7}"#, "a wrong JSON-RPC shape", -32600, Value::Null),
        // The id could be read: the error answers it (JSON-RPC's null is for an id that cannot be).
        (r#"{"jsonrpc":"1.0","id":5,"method":"ping"}"#, "another JSON-RPC version", -32600, json!(5)),
    ] {
        let (status, response) = raw(&server, &[("Authorization", &bearer)], body);
        assert_eq!(status, 400, "{what} is a bad request: {response}");
        let json = response.split("\r\n\r\n").nth(1).unwrap_or_default();
        let error: Value =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{what}: a JSON body ({e}): {response}"));
        assert_eq!(error["error"]["code"], code, "{what}: {error}");
        assert_eq!(error["id"], id, "{what}: {error}");
    }
    // MCP's own method with params that do not fit it: invalid params for that request, not "method not found"
    // (rmcp alone reads it as a custom request: -32601, and HTTP 404 without a session).
    let meta = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": { "name": "raw", "version": "1" } });
    for (params, what) in [
        (json!({ "name": "bump", "arguments": "{\"by\": 1}", "_meta": meta }), "arguments as a string"),
        (json!({ "name": 7, "arguments": {}, "_meta": meta }), "a numeric tool name"),
    ] {
        let body = json!({ "jsonrpc": "2.0", "id": 12, "method": "tools/call", "params": params }).to_string();
        let headers = [
            ("Authorization", bearer.as_str()),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "bump"),
        ];
        let (status, response) = raw(&server, &headers, &body);
        assert_eq!(status, 200, "{what}: {response}");
        let json = response.split("\r\n\r\n").nth(1).unwrap_or_default();
        let error: Value =
            serde_json::from_str(json).unwrap_or_else(|e| panic!("{what}: a JSON body ({e}): {response}"));
        assert_eq!((&error["id"], &error["error"]["code"]), (&json!(12), &json!(-32602)), "{what}: {error}");
        assert!(error["error"]["message"].as_str().is_some_and(|m| m.contains("tools/call")), "{what}: {error}");
    }

    // The game kept running through all of it.
    let alive = game.with_app(|app| app.world().resource::<bevy_agent_tools::AgentHandle>().visit().is_some());
    assert!(alive);
    game.stop();
}

#[test]
fn deeply_nested_and_huge_arguments_get_a_clear_error_and_the_game_keeps_running() {
    let (game, server) = game(Arc::default(), Gate::new());
    let url = server.url().to_string();
    runtime().block_on(async move {
        let (client, _) = connect(&url, false).await;
        let mut nested = json!(1);
        for _ in 0..100 {
            nested = json!({ "n": nested });
        }
        let result = client.call_tool(params("bump", json!({ "by": nested }))).await.expect("a result");
        assert_eq!(domain_error(&result)["code"], "INVALID_INPUT");
        // An argument the tool does not have is refused by name (a misspelt one would otherwise be dropped).
        let wide = json!({ "by": 1, "junk": vec![0; 5_000] });
        let result = client.call_tool(params("bump", wide)).await.expect("a result");
        let refused = domain_error(&result);
        assert_eq!((&refused["code"], &refused["details"]["field"]), (&json!("INVALID_INPUT"), &json!("junk")));
        let ok = client.call_tool(params("peek", json!({}))).await.expect("still serving");
        assert_eq!(ok.is_error, Some(false));
        client.cancel().await.expect("close");
    });
    game.stop();
}

#[test]
fn an_empty_origin_allow_list_refuses_every_browser_origin_and_serves_clients_without_one() {
    let (game, server) = game_with(Arc::default(), Gate::new(), |mcp| mcp.allowed_origins(Vec::<String>::new()));
    let bearer = format!("Bearer {TOKEN}");
    let (status, _) = raw(&server, &[("Authorization", &bearer), ("Origin", "http://localhost:3000")], INITIALIZE);
    assert_eq!(status, 403, "no origin is allowed, not even a local one");
    let (status, body) = raw(&server, &[("Authorization", &bearer)], INITIALIZE);
    assert_eq!(status, 200, "a client that is not a web page sends no Origin: {body}");
    game.stop();
}

#[test]
fn non_loopback_bind_without_opt_in_is_refused_at_start_up() {
    let plugin = McpPlugin::new().bind("0.0.0.0".parse().expect("ip"));
    let error = plugin.validate().expect_err("refused");
    assert!(error.to_string().contains("allow_non_loopback"), "{error}");
    let app = headless_app_with(
        AgentToolsPlugin::new(TestGame::default()),
        McpPlugin::new().port(0).bind("0.0.0.0".parse().expect("ip")),
    );
    assert!(!app.world().contains_resource::<McpServer>(), "the plugin refuses to serve");
    let unavailable = app.world().resource::<McpUnavailable>();
    assert!(unavailable.error.to_string().contains("allow_non_loopback"), "and says why: {}", unavailable.error);
    assert_eq!(unavailable.error.kind(), bevy_agent_tools::mcp::McpConfigErrorKind::Refused);
}

#[test]
fn a_game_bound_for_other_machines_accepts_the_host_names_it_lists_and_refuses_others() {
    let (game, server) = game_with(Arc::default(), Gate::new(), |mcp| {
        mcp.bind("0.0.0.0".parse().expect("ip")).allow_non_loopback().allowed_hosts(["game-pc.lan"])
    });
    let bearer = format!("Bearer {TOKEN}");
    let listed = format!("game-pc.lan:{}", server.address().port());
    let (status, body) = raw(&server, &[("Authorization", &bearer), ("Host", &listed)], INITIALIZE);
    assert_eq!(status, 200, "a listed host: {body}");
    let (status, _) = raw(&server, &[("Authorization", &bearer), ("Host", "other-pc.lan")], INITIALIZE);
    assert_eq!(status, 403, "an unlisted host is refused");
    let (status, body) = raw(&server, &[("Authorization", &bearer)], INITIALIZE);
    assert_eq!(status, 200, "the bound address itself: {body}");
    game.stop();
}

/// A game whose `close` holds the main thread until the test lets it go, so a call can arrive mid-exit.
struct SlowClose {
    closing: crossbeam_channel::Sender<()>,
    release: crossbeam_channel::Receiver<()>,
}

impl WorldLifecycle for SlowClose {
    type Session = ();
    fn open(&self, _: &VisitInfo, _: &mut bevy::prelude::World) -> Result<Opened<()>, OpenError> {
        Ok(Opened::ready(()))
    }
    fn close(&self, _: (), _: &mut bevy::prelude::World) -> Completion {
        let _ = self.closing.send(());
        let _ = self.release.recv_timeout(Duration::from_secs(20));
        Completion::done()
    }
}

#[test]
fn h5_a_call_during_exit_gets_world_closed_as_an_error_result() {
    let (closing_tx, closing) = crossbeam_channel::bounded(1);
    let (release, release_rx) = crossbeam_channel::bounded(1);
    let game = RunningGame::spawn(Duration::from_millis(1), move || {
        let noop = AgentTool::new("noop", "Does nothing.", |_: CallContext<()>, _: NoArgs| async move { Ok(()) });
        let plugin = AgentToolsPlugin::new(SlowClose { closing: closing_tx, release: release_rx }).with_tool(noop);
        headless_app_with(plugin, McpPlugin::new().port(0).token(TOKEN))
    });
    let url = game.with_app(|app| {
        app.world_mut().write_message(EnterWorld::new("alpha"));
        app.update(); // the world is open before anyone calls
        app.world().resource::<McpServer>().url().to_string()
    });
    runtime().block_on(async move {
        let (client, _) = connect(&url, false).await;
        assert_eq!(client.call_tool(params("noop", json!({}))).await.expect("ok").is_error, Some(false));
        game.send(|app| {
            app.world_mut().write_message(ExitWorld::new());
        });
        closing.recv_timeout(Duration::from_secs(10)).expect("close began");
        let refused = client.call_tool(params("noop", json!({}))).await.expect("a result");
        release.send(()).expect("release close");
        let error = domain_error(&refused);
        assert_eq!(error["code"], "WORLD_CLOSED");
        assert_eq!(error["details"]["world"], "alpha");
        client.cancel().await.expect("close");
        game.stop();
    });
}

#[test]
fn deleting_an_mcp_session_ends_its_conversation_and_cancels_its_calls_but_not_the_visit() {
    let gate = Gate::new();
    let (game, server) = game(Arc::default(), gate.clone());
    let mut events = game.agent().subscribe();
    let visit_before = game.agent().visit().map(|v| v.info.visit);
    let url = server.url().to_string();
    let parked = gate.clone();
    let outcome = runtime().block_on(async move {
        let (client, _) = connect(&url, false).await;
        let peer = client.peer().clone();
        let call = tokio::spawn(async move { peer.call_tool(params("gated", json!({}))).await });
        tokio::time::timeout(Duration::from_secs(30), parked.arrivals(1))
            .await
            .expect("the calls reached their tool in time");
        client.cancel().await.expect("the client closes its session (DELETE)");
        let (mut ended, mut cancelled) = (None, false);
        while ended.is_none() || !cancelled {
            let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await.expect("an event in time");
            match event.expect("the feed is open") {
                bevy_agent_tools::ConversationEvent::Status(change)
                    if change.status == bevy_agent_tools::ConversationStatus::Ended =>
                {
                    ended = Some(change.conversation)
                }
                bevy_agent_tools::ConversationEvent::CallFinished(finished) => {
                    cancelled |= finished.code == Some(ErrorCode::Cancelled);
                }
                _ => {}
            }
        }
        let _ = call.await;
        ended
    });
    let ended = outcome.expect("the session's conversation ended, and its parked call was cancelled");
    assert!(ended.as_str().starts_with("mcp-session:"), "{ended}");
    gate.open();
    // A frame after the delete, where an exit it had asked for would have closed the visit.
    game.with_app(|app| app.update());
    assert_eq!(game.agent().visit().map(|v| v.info.visit), visit_before, "the visit is untouched");
    game.stop();
}

/// H13 when the game ends a session's conversation: a call in flight gets its outcome (`CANCELLED`) as its
/// response before the session closes, not a stream that ends without one.
#[test]
fn a_call_in_flight_when_the_game_ends_its_sessions_conversation_is_answered_before_the_session_closes() {
    let gate = Gate::new();
    let (game, server) = game(Arc::default(), gate.clone());
    let agent = game.agent();
    let mut events = agent.subscribe();
    let url = server.url().to_string();
    let parked = gate.clone();
    let answer = runtime().block_on(async move {
        let (client, _) = connect(&url, false).await;
        let peer = client.peer().clone();
        let call = tokio::spawn(async move { peer.call_tool(params("gated", json!({}))).await });
        tokio::time::timeout(Duration::from_secs(30), parked.arrivals(1)).await.expect("the call reached its tool");
        let conversation = next_call_started(&mut events).await;
        agent.end_conversation(&conversation).expect("ended by the game");
        let answer = tokio::time::timeout(Duration::from_secs(10), call).await.expect("answered in time");
        drop(client);
        answer.expect("joined")
    });
    let result = answer.expect("a response, not a stream that ended without one");
    assert_eq!(domain_error(&result)["code"], json!("CANCELLED"), "{result:?}");
    gate.open();
    game.stop();
}

/// A 2025-11-25 client whose session made a call in its own conversation, then began a handle's: the client, the
/// session's own conversation and the handle.
async fn session_with_a_handle(
    url: &str,
    events: &mut bevy_agent_tools::Subscription,
) -> (Client, bevy_agent_tools::ConversationId, Value) {
    let (client, _) = connect(url, false).await;
    client.call_tool(params("bump", json!({}))).await.expect("a call in the session's own conversation");
    let own = next_call_started(events).await;
    let begun = client.call_tool(params("begin_conversation", json!({}))).await.expect("begun");
    let handle = begun.structured_content.expect("structured")["conversation"].clone();
    (client, own, handle)
}

/// The game ends the session's own conversation `own`; returns once the session refuses new requests (it is being
/// closed).
async fn end_and_wait_until_refused(agent: &AgentHandle, server: &McpServer, own: &bevy_agent_tools::ConversationId) {
    agent.end_conversation(own).expect("ended by the game");
    let session = own.as_str().strip_prefix("mcp-session:").expect("the session's own").to_string();
    let probe = server.clone();
    tokio::task::spawn_blocking(move || wait_until_session_refuses(&probe, &session))
        .await
        .expect("the session refuses new requests");
}

/// A session's calls in another conversation (a handle's) live on when the game ends the session's own: the
/// session closes (new requests get 404) only once they have answered, however long they take, not after a few
/// seconds with their streams cut and the calls cancelled.
#[test]
fn a_call_a_session_runs_in_a_handles_conversation_is_answered_when_the_game_ends_the_sessions_own() {
    let gate = Gate::new();
    let (game, server) = game(Arc::default(), gate.clone());
    let agent = game.agent();
    let mut events = agent.subscribe();
    let url = server.url().to_string();
    let (parked, opened) = (gate.clone(), gate.clone());
    let closing = server.clone();
    let answer = runtime().block_on(async move {
        let (client, own, handle) = session_with_a_handle(&url, &mut events).await;
        let peer = client.peer().clone();
        let call =
            tokio::spawn(async move { peer.call_tool(params("gated", json!({ "conversation": handle }))).await });
        tokio::time::timeout(Duration::from_secs(30), parked.arrivals(1)).await.expect("the call reached its tool");
        end_and_wait_until_refused(&agent, &closing, &own).await;
        // Longer than a stream's stall timeout (5 s), which bounded the wait for a session's calls before.
        tokio::time::sleep(Duration::from_secs(6)).await;
        opened.open();
        let answer = tokio::time::timeout(Duration::from_secs(10), call).await.expect("answered in time");
        drop(client);
        answer.expect("joined")
    });
    let result = answer.expect("a response, not a stream that ended without one");
    assert!(result.is_error != Some(true), "the handle's conversation lives on: {result:?}");
    game.stop();
}

/// While a session is being closed (the game ended its own conversation) it waits for its calls in a handle's
/// conversation; the client can still cancel one: a notification starts nothing, so it is not refused as a new
/// request in a closing session is.
#[test]
fn a_call_a_closing_session_waits_for_can_still_be_cancelled_by_its_client() {
    let gate = Gate::new();
    let (game, server) = game(Arc::default(), gate.clone());
    let agent = game.agent();
    let mut events = agent.subscribe();
    let url = server.url().to_string();
    let parked = gate.clone();
    let closing = server.clone();
    let answer = runtime().block_on(async move {
        let (client, own, handle) = session_with_a_handle(&url, &mut events).await;
        let request =
            ClientRequest::CallToolRequest(CallToolRequest::new(params("gated", json!({ "conversation": handle }))));
        let call =
            client.peer().send_cancellable_request(request, PeerRequestOptions::no_options()).await.expect("sent");
        tokio::time::timeout(Duration::from_secs(30), parked.arrivals(1)).await.expect("the call reached its tool");
        end_and_wait_until_refused(&agent, &closing, &own).await;
        call.cancel(Some("the player pressed stop".into())).await.expect("the cancel is sent");
        // The gate stays shut: only the cancel can end the call.
        let finished = next_event(&mut events, |event| match event {
            bevy_agent_tools::ConversationEvent::CallFinished(finished) if finished.tool == "gated" => Some(finished),
            _ => None,
        })
        .await;
        drop(client);
        finished
    });
    assert_eq!(answer.code, Some(ErrorCode::Cancelled), "{answer:?}");
    gate.open();
    game.stop();
}

/// The JSON-RPC answer in a raw HTTP response: the body, or the `data:` of its server-sent event.
fn answer_of(response: &str) -> Value {
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    body.lines()
        .map(|line| line.strip_prefix("data:").unwrap_or(line).trim())
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|message| message.get("id").is_some())
        .unwrap_or_else(|| panic!("no JSON-RPC answer in {response}"))
}

#[test]
fn h12_an_older_version_asked_without_a_session_after_discovery_is_its_clients_conversation() {
    // A client that discovered the server (`server/discover`) may go on in an older version without a session:
    // its requests carry the version and its capabilities in `_meta`, and rmcp serves them sessionless. Its
    // retries are its client's conversation's, as a 2026-07-28 client's are: they run once.
    let (game, server) = game(Arc::default(), Gate::new());
    let bearer = format!("Bearer {TOKEN}");
    let meta = json!({ "io.modelcontextprotocol/protocolVersion": "2025-11-25",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": { "name": "discovering", "version": "1" } });
    let call = |id: u32| {
        let params = json!({ "name": "bump", "arguments": { "by": 1, "operation_id": "op-older" }, "_meta": meta });
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params }).to_string();
        let (status, response) =
            raw(&server, &[("Authorization", bearer.as_str()), ("MCP-Protocol-Version", "2025-11-25")], &body);
        assert_eq!(status, 200, "served without a session: {response}");
        let answer = answer_of(&response);
        assert_eq!(answer["id"], id, "{answer}");
        answer["result"]["structuredContent"]["counter"].clone()
    };
    let first = call(1);
    assert!(first.is_u64(), "{first}");
    assert_eq!(call(2), first, "the retry joined its operation's outcome: the same conversation");
    game.stop();
}

/// A 2026-07-28 `tools/call` of `tool` (no session), presenting `bearer`: its result.
fn sessionless_call(server: &McpServer, bearer: &str, id: u32, tool: &str, arguments: Value) -> Value {
    sessionless_request(server, bearer, id, "tools/call", json!({ "name": tool, "arguments": arguments }))
}

/// A 2026-07-28 request of `method` with `params` (no session), presenting `bearer`: its result.
fn sessionless_request(server: &McpServer, bearer: &str, id: u32, method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": { "name": "outside", "version": "1" } });
    let name = params["name"].as_str().map(str::to_string);
    let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string();
    let mut headers = vec![("Authorization", bearer), ("MCP-Protocol-Version", "2026-07-28"), ("Mcp-Method", method)];
    headers.extend(name.as_deref().map(|name| ("Mcp-Name", name)));
    let (status, response) = raw(server, &headers, &body);
    assert_eq!(status, 200, "{response}");
    answer_of(&response)["result"].clone()
}

#[test]
fn h12_a_request_that_names_no_conversation_is_refused_an_operation_id_it_could_not_keep() {
    // A 2026-07-28 request without a client name (a SHOULD), a handle or a session is a conversation of its own:
    // its retry would be another's and run again, where `operation_id` promises once. It is refused, and one that
    // also names its task (which any conversation's retry shares) runs once.
    let (game, server) = game(Arc::default(), Gate::new());
    let bearer = format!("Bearer {TOKEN}");
    let answer = |id: u32, tool: &str, arguments: Value| {
        let meta = json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {} });
        let params = json!({ "name": tool, "arguments": arguments, "_meta": meta });
        let body = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params }).to_string();
        let headers = [
            ("Authorization", bearer.as_str()),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", tool),
        ];
        let (status, response) = raw(&server, &headers, &body);
        assert_eq!(status, 200, "{response}");
        answer_of(&response)
    };
    let call = |id: u32, arguments: Value| answer(id, "bump", arguments)["result"].clone();
    let refused = call(1, json!({ "by": 1, "operation_id": "op-anonymous" }));
    assert_eq!(refused["isError"], true, "{refused}");
    assert!(refused["content"][0]["text"].as_str().unwrap_or_default().contains("INVALID_INPUT"), "{refused}");
    let plain = call(2, json!({ "by": 1 }));
    assert_eq!(plain["structuredContent"]["counter"], 1, "nothing ran before; a call without a key runs: {plain}");
    let in_task = json!({ "by": 1, "operation_id": "op-anonymous", "task_id": "task-anonymous" });
    let first = call(3, in_task.clone());
    assert_eq!(first["structuredContent"]["counter"], 2, "{first}");
    assert_eq!(call(4, in_task)["structuredContent"]["counter"], 2, "the retry in its task ran once");
    // A read-only tool keys nothing, and an unknown tool is refused as such.
    let peek = answer(5, "peek", json!({ "operation_id": "op-anonymous" }));
    assert_eq!(peek["result"]["structuredContent"]["counter"], 2, "{peek}");
    let unknown = answer(6, "nope", json!({ "operation_id": "op-anonymous" }));
    assert_eq!(unknown["error"]["code"], -32602, "a JSON-RPC error, as for any unknown tool: {unknown}");
    game.stop();
}

#[test]
fn a_bound_credential_is_shown_no_way_to_name_another_conversation_and_a_named_one_is_ignored() {
    // An in-game agent's credential (or one the game mints) is bound to one conversation: `begin_conversation`
    // and the `conversation` argument are of no use to it (it is refused the one; and a model shown the other may
    // make a handle up), so neither is shown, nor do the instructions speak of them.
    let (game, server) = game(Arc::default(), Gate::new());
    let bound = ConversationId::new("bound-tool");
    let bearer = format!("Bearer {}", server.credentials().mint(&bound).expect("minted"));
    let shown = |bearer: &str| {
        let listed = sessionless_request(&server, bearer, 1, "tools/list", json!({}));
        let names: Vec<String> =
            listed["tools"].as_array().expect("tools").iter().map(|t| t["name"].to_string()).collect();
        let bump = listed["tools"].as_array().expect("tools").iter().find(|t| t["name"] == "bump").cloned();
        let argument = bump.expect("bump is listed")["inputSchema"]["properties"].get("conversation").is_some();
        let discovered = sessionless_request(&server, bearer, 2, "server/discover", json!({}));
        let instructions = discovered["instructions"].as_str().expect("instructions").to_string();
        (names.contains(&"\"begin_conversation\"".to_string()), argument, instructions.contains("begin_conversation"))
    };
    assert_eq!(shown(&format!("Bearer {TOKEN}")), (true, true, true), "the game's token names conversations");
    assert_eq!(shown(&bearer), (false, false, false), "a bound credential is shown none of it");
    let (status, response) = raw(&server, &[("Authorization", bearer.as_str())], INITIALIZE);
    assert_eq!(status, 200, "{response}");
    let instructions = answer_of(&response)["result"]["instructions"].to_string();
    assert!(instructions.contains("your credential") && !instructions.contains("begin_conversation"), "{instructions}");
    let called = sessionless_call(&server, &bearer, 3, "bump", json!({ "by": 1, "conversation": "cv-made-up" }));
    assert_eq!(called["isError"], false, "a handle it sends is ignored, not refused: {called}");
    assert!(game.agent().conversation_status(&bound).is_some(), "the call was the credential's conversation's");
    game.stop();
}

#[test]
fn begin_conversation_mints_a_handle_whatever_handle_the_request_carries() {
    // The server's instructions say to send the handle in every call: a client whose handle was forgotten (or
    // never minted) that sends it to `begin_conversation` too must still get a new one.
    let (game, server) = game(Arc::default(), Gate::new());
    let bearer = format!("Bearer {TOKEN}");
    let minted = sessionless_call(&server, &bearer, 1, "begin_conversation", json!({ "conversation": "cv-made-up" }));
    let handle = minted["structuredContent"]["conversation"].as_str().unwrap_or_default();
    assert!(handle.starts_with("cv-") && handle != "cv-made-up", "{minted}");
    game.stop();
}

#[test]
fn a_credential_the_game_mints_opens_its_conversation_and_reopens_it_after_it_ended() {
    // A credential the game gives an outside tool of its own (`Credentials::mint`), for a conversation it never
    // opened: every request presenting it is that conversation's, opened as any conversation a client names.
    let (game, server) = game(Arc::default(), Gate::new());
    let external = ConversationId::new("external-tool");
    let bearer = format!("Bearer {}", server.credentials().mint(&external).expect("minted"));
    let call = |id: u32| sessionless_call(&server, &bearer, id, "bump", json!({ "by": 1 }));
    let first = call(1);
    assert_eq!(first["isError"], false, "{first}");
    assert!(game.agent().conversation_status(&external).is_some(), "the credential's conversation");
    game.agent().end_conversation(&external).expect("ended");
    let again = call(2);
    assert_eq!(again["isError"], false, "reopened, as a conversation a client names is: {again}");
    game.stop();
}

#[test]
fn tools_list_with_a_cursor_it_never_gave_out_is_invalid_params() {
    let (game, server) = game(Arc::default(), Gate::new());
    let url = server.url().to_string();
    runtime().block_on(async move {
        let (client, _) = connect(&url, false).await;
        let all = client.peer().list_tools(None).await.expect("listed");
        assert!(all.next_cursor.is_none(), "one page");
        let cursor = rmcp::model::PaginatedRequestParams::default().with_cursor(Some("page-2".to_string()));
        let paged = client.peer().list_tools(Some(cursor)).await;
        assert_eq!(json_rpc_code(&paged), Some(rmcp::model::ErrorCode::INVALID_PARAMS), "MCP's pagination: {paged:?}");
        client.cancel().await.expect("close");
    });
    game.stop();
}

/// Waits for the conversation of an MCP session to end; returns the session id.
async fn session_ended(events: &mut bevy_agent_tools::Subscription) -> String {
    let ended = next_status(events, bevy_agent_tools::ConversationStatus::Ended).await;
    ended.as_str().strip_prefix("mcp-session:").expect("a session's").to_string()
}

/// The first of the next events that `pick` takes something from, each awaited at most 10 s.
async fn next_event<T>(
    events: &mut bevy_agent_tools::Subscription,
    mut pick: impl FnMut(bevy_agent_tools::ConversationEvent) -> Option<T>,
) -> T {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await.expect("an event in time");
        if let Some(picked) = event.and_then(&mut pick) {
            return picked;
        }
    }
}

/// The conversation of the next call that starts.
async fn next_call_started(events: &mut bevy_agent_tools::Subscription) -> bevy_agent_tools::ConversationId {
    next_event(events, |event| match event {
        bevy_agent_tools::ConversationEvent::CallStarted(started) => Some(started.conversation),
        _ => None,
    })
    .await
}

/// The next conversation whose status becomes `status`.
async fn next_status(
    events: &mut bevy_agent_tools::Subscription,
    status: bevy_agent_tools::ConversationStatus,
) -> bevy_agent_tools::ConversationId {
    next_event(events, |event| match event {
        bevy_agent_tools::ConversationEvent::Status(change) if change.status == status => Some(change.conversation),
        _ => None,
    })
    .await
}

/// Waits (at most 10 s) until a request in session `id` is refused with 404: the session closed, or is closing.
fn wait_until_session_refuses(server: &McpServer, id: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while session_is_open(server, id) {
        assert!(std::time::Instant::now() < deadline, "the session was not closed");
        std::thread::yield_now();
    }
}

/// Whether the server still knows session `id` (a request in it is not refused with 404).
fn session_is_open(server: &McpServer, id: &str) -> bool {
    let bearer = format!("Bearer {TOKEN}");
    let list = r#"{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}}"#;
    let headers = [("Authorization", bearer.as_str()), ("Mcp-Session-Id", id), ("MCP-Protocol-Version", "2025-11-25")];
    let (status, body) = raw(server, &headers, list);
    // A request that gets past the check for closing sessions just as the close is decided is refused by the
    // session manager: 404 too, not rmcp's 500.
    assert!(status == 200 || status == 404, "{status}: {body}");
    status == 200
}

#[test]
fn a_conversation_the_game_ends_closes_its_mcp_session() {
    let (game, server) = game(Arc::default(), Gate::new());
    let agent = game.agent();
    let mut events = agent.subscribe();
    let url = server.url().to_string();
    let (session, client) = runtime().block_on(async move {
        let (client, _) = connect(&url, false).await;
        client.call_tool(params("bump", json!({}))).await.expect("call");
        let conversation = next_call_started(&mut events).await;
        agent.end_conversation(&conversation).expect("ended by the game");
        (session_ended(&mut events).await, client)
    });
    // The session closes right after the conversation's Ended event, on the server's runtime.
    wait_until_session_refuses(&server, &session);
    drop(client);
    game.stop();
}

/// H13 over `AppExit` with no world open: a call waiting for a tool not registered yet (`tool_wait`, at the main
/// menu) is answered (`WORLD_CLOSED`) before the server stops, in both protocol generations: its client does not
/// wait for good on a connection that closed without its answer.
#[test]
fn app_exit_answers_a_call_waiting_for_its_tool_with_no_world_open_before_the_server_stops() {
    for modern in [false, true] {
        let game = RunningGame::spawn(Duration::from_millis(1), || {
            let plugin = AgentToolsPlugin::new(TestGame::default()).tool_wait(Duration::from_secs(600));
            headless_app_with(plugin, McpPlugin::new().port(0).token(TOKEN))
        });
        let server = game.with_app(|app| app.world().resource::<McpServer>().clone());
        let mut events = game.agent().subscribe();
        let runtime = runtime();
        let (client, _) = runtime.block_on(connect(server.url(), modern));
        let peer = client.peer().clone();
        let call = runtime.spawn(async move { peer.call_tool(params("later", json!({}))).await });
        runtime.block_on(next_status(&mut events, bevy_agent_tools::ConversationStatus::WaitingToolResult));

        game.stop();
        let result = runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), call).await })
            .expect("the call answered in time")
            .expect("joined")
            .unwrap_or_else(|error| panic!("modern={modern}: a result, not a dropped connection: {error}"));
        let error = domain_error(&result);
        assert_eq!(error["code"], "WORLD_CLOSED", "modern={modern}: {result:?}");
        assert!(error["message"].as_str().is_some_and(|m| m.contains("the game is exiting")), "{error}");
        drop(client);
    }
}

/// MCP 2026-07-28, subscriptions: a server that ends a subscription itself (at shutdown) SHOULD answer its
/// `subscriptions/listen` request before closing the stream. At the game's exit the stream ends with that final
/// result, which the client tells from a dropped connection (one it would reconnect after).
#[test]
fn app_exit_ends_a_subscriptions_listen_stream_with_its_final_result_not_a_dropped_connection() {
    let (game, server) = game(Arc::default(), Gate::new());
    let runtime = runtime();
    let (client, _) = runtime.block_on(connect(server.url(), true));
    let filter = rmcp::model::SubscriptionFilter::builder().tools_list_changed().build();
    let mut subscription = runtime.block_on(client.peer().listen(filter)).expect("listening");
    game.stop();
    let next = runtime.block_on(async { tokio::time::timeout(Duration::from_secs(10), subscription.next()).await });
    assert!(matches!(next, Ok(Ok(None))), "the stream ended in time: {next:?}");
    let end = subscription.end();
    assert!(matches!(end, Some(rmcp::service::SubscriptionEnd::Graceful(_))), "a final result: {end:?}");
    drop(client);
}

/// Writes `AppExit` once `Quit` is present.
#[derive(Resource)]
struct Quit;

fn quit(quit: Option<Res<Quit>>, mut exit: MessageWriter<AppExit>) {
    if quit.is_some() {
        exit.write(AppExit::Success);
    }
}

/// DESIGN §5 and H13 over `AppExit` (window closed, Ctrl+C): a call in flight when the game quits reaches its MCP
/// client with its outcome (`VISIT_ENDED`), not a dropped connection, in both protocol generations, and the game
/// still exits promptly (well within the exit deadline). Also when the `AppExit` is written in `Last` between the
/// host's exit and the transport's (as Bevy's window-close systems may be): the transport never stops first.
#[test]
fn app_exit_sends_every_call_in_flight_its_outcome_before_the_server_stops() {
    for (modern, written_in_last) in [(false, false), (true, false), (false, true)] {
        let gate = Gate::new();
        let (game, server) = game(Arc::default(), gate.clone());
        let url = server.url().to_string();
        let runtime = runtime();
        let (client, _) = runtime.block_on(connect(&url, modern));
        let peer = client.peer().clone();
        let call = runtime.spawn(async move { peer.call_tool(params("gated", json!({}))).await });
        runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), gate.arrivals(1)).await })
            .expect("the call reached its tool in time");

        let exiting = std::time::Instant::now();
        if written_in_last {
            game.send(|app| {
                app.add_systems(Last, quit.after(AgentToolsExitSystems::Host).before(AgentToolsExitSystems::Transport))
                    .insert_resource(Quit);
            });
        }
        game.stop(); // AppExit (unless the game wrote it already), then the game's thread ends
        let exit_took = exiting.elapsed();

        let result = runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), call).await })
            .expect("the call answered in time")
            .expect("joined")
            .unwrap_or_else(|error| panic!("modern={modern}: a result, not a dropped connection: {error}"));
        assert_eq!(domain_error(&result)["code"], "VISIT_ENDED", "modern={modern}: {result:?}");
        // Not the exit deadline (30 s), which an exit that waited for the parked handler would take: half of it
        // leaves a loaded machine its room.
        assert!(exit_took < Duration::from_secs(15), "modern={modern}: the exit took {exit_took:?}");
        drop(client);
    }
}
