//! The OpenAI-compatible session backend's host overhead, against a scripted chat completions server on loopback
//! that answers at once (axum, SSE): what the game adds around the model.
//!
//! - `openai_turn_text_only`: `send_text` to its end, one request whose answer is three text deltas and a finish.
//! - `openai_turn_one_tool_round`: the same turn with one tool round before it: a streamed tool call (arguments
//!   in two fragments) run in the game through `AgentHandle` (a trivial tool), its result sent back, then the text.
//!   The difference between the two is the cost of one tool round.
//!
//! ```sh
//! cargo bench --features openai --bench openai_turn -- --warm-up-time 1 --measurement-time 5
//! ```

use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use axum::routing::{get, post};
use bevy_agent_tools::mcp::McpPlugin;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::session::{AgentSession, AgentSessions, AgentSessionsPlugin, OpenAiEndpoint, SessionConfig};
use bevy_agent_tools::testing::{headless_app_with, AgentTestAppExt, CounterGame, RunningGame};
use bevy_agent_tools::NoArgs;
use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::{json, Value};

fn sse(chunks: &[Value]) -> Response {
    let mut body = String::new();
    for chunk in chunks {
        body.push_str(&format!("data: {chunk}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    Response::builder().header("content-type", "text/event-stream").body(Body::from(body)).unwrap_or_default()
}

fn text(piece: &str) -> Value {
    json!({"choices": [{"index": 0, "delta": {"content": piece}}]})
}

/// Answers with a tool call when the player said `tool` and no tool result is in yet; else with text.
async fn completions(body: String) -> Response {
    let request: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    if last["role"] == "user" && last["content"] == "tool" {
        return sse(&[
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "c", "type": "function", "function": {"name": "trivial", "arguments": "{"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
        ]);
    }
    sse(&[
        text("All "),
        text("done "),
        text("here."),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}),
    ])
}

fn bench(c: &mut Criterion) {
    let server = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let app = axum::Router::new()
        .route("/v1/models", get(|| async { "{\"data\": []}" }))
        .route("/v1/chat/completions", post(completions));
    let listener = server.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    server.spawn(async move { axum::serve(listener, app).await });

    let data = tempfile::tempdir().unwrap();
    let dir = data.path().to_path_buf();
    let game = RunningGame::spawn(Duration::from_millis(1), move || {
        let trivial =
            AgentTool::new("trivial", "Returns at once.", |_: CallContext<u64>, _: NoArgs| async move { Ok(()) });
        let mut app = headless_app_with(
            AgentToolsPlugin::new(CounterGame).with_tool(trivial),
            (McpPlugin::new().port(0).token("openai-bench-token-0123456789"), AgentSessionsPlugin::new().data_dir(dir)),
        );
        app.enter_world("bench");
        app
    });
    let sessions = game.with_app(|app| app.world().resource::<AgentSessions>().clone());
    let runtime = game.agent().runtime().clone();
    let session: AgentSession =
        runtime
            .block_on(sessions.create(SessionConfig::openai_endpoint(
                OpenAiEndpoint::new(&url, "bench").max_history_bytes(64 * 1024),
            )))
            .unwrap();

    let mut group = c.benchmark_group("openai");
    group.bench_function("openai_turn_text_only", |b| {
        b.iter(|| runtime.block_on(session.send_text("hello")).unwrap());
    });
    group.bench_function("openai_turn_one_tool_round", |b| {
        b.iter(|| runtime.block_on(session.send_text("tool")).unwrap());
    });
    group.finish();
    runtime.block_on(session.end());
    game.stop();
}

criterion_group!(benches, bench);
criterion_main!(benches);
