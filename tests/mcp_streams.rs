//! A call's response stream (MCP 2025-11-25) over raw HTTP, read to its end: a client whose stream was cut comes
//! back with `Last-Event-ID` after its call finished and still gets the result; a client that cancels a call gets
//! none of the call's later progress on it; a client that ends its session with `DELETE` is told it ended; a client
//! that stops reading a stream holds up nothing else of its session.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use bevy_agent_tools::mcp::{McpPlugin, McpServer};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app_with, Gate, RunningGame};
use bevy_agent_tools::{ConversationEvent, ConversationId, ConversationStatus, NoArgs};
use common::*;

const TOKEN: &str = "resume-token-0123456789abcdef";

/// Sends one request and returns the connection, positioned after the response's headers, and those headers.
fn send(server: &McpServer, method: &str, headers: &[(&str, &str)], body: &str) -> (BufReader<TcpStream>, String) {
    let mut stream = TcpStream::connect(server.address()).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let bearer = format!("Bearer {TOKEN}");
    let mut with_token = vec![("Authorization", bearer.as_str())];
    with_token.extend_from_slice(headers);
    let request = common::raw_mcp::request_text(server.address(), method, &with_token, body);
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

/// Initializes an MCP 2025-11-25 session over raw HTTP; returns its id.
fn open_session(server: &McpServer) -> String {
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;
    let (_, head) = send(server, "POST", &[], initialize);
    let session = head
        .lines()
        .find_map(|line| {
            line.to_ascii_lowercase().starts_with("mcp-session-id:").then(|| line[15..].trim().to_string())
        })
        .expect("a session id");
    let in_session = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];
    send(server, "POST", &in_session, r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    session
}

/// A game serving MCP with `tool`, world `alpha` open, and a subscription to its conversation events.
fn serve(tool: AgentTool<Session>) -> (RunningGame, McpServer, bevy_agent_tools::Subscription) {
    serve_with(tool, |host| host, |mcp| mcp)
}

/// [`serve`], with the host and the MCP server configured by `host` and `mcp`.
fn serve_with(
    tool: AgentTool<Session>,
    host: fn(AgentToolsPlugin<TestGame>) -> AgentToolsPlugin<TestGame>,
    mcp: fn(McpPlugin) -> McpPlugin,
) -> (RunningGame, McpServer, bevy_agent_tools::Subscription) {
    let game = RunningGame::spawn(Duration::from_millis(1), move || {
        headless_app_with(
            host(AgentToolsPlugin::new(TestGame::default()).with_tool(tool)),
            mcp(McpPlugin::new().port(0).token(TOKEN)),
        )
    });
    let server = game.with_app(|app| {
        app.world_mut().write_message(EnterWorld::new("alpha"));
        app.update();
        app.world().resource::<McpServer>().clone()
    });
    let events = game.agent().subscribe();
    (game, server, events)
}

/// Waits for the next call to finish; returns its error code (`None`: it succeeded).
fn next_call_finished(events: &mut bevy_agent_tools::Subscription) -> Option<ErrorCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        loop {
            let event = tokio::time::timeout(Duration::from_secs(30), events.next()).await.expect("in time");
            if let Some(ConversationEvent::CallFinished(finished)) = event {
                return finished.code;
            }
        }
    })
}

/// Waits for a conversation to end; returns its id.
fn next_conversation_ended(events: &mut bevy_agent_tools::Subscription) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        loop {
            let event = tokio::time::timeout(Duration::from_secs(30), events.next()).await.expect("in time");
            if let Some(ConversationEvent::Status(change)) = event {
                if change.status == bevy_agent_tools::ConversationStatus::Ended {
                    return change.conversation.to_string();
                }
            }
        }
    })
}

/// Reads server-sent event lines until one satisfies `wanted`; returns it.
fn read_until(reader: &mut BufReader<TcpStream>, mut wanted: impl FnMut(&str) -> bool) -> Option<String> {
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) if wanted(&line) => return Some(line),
            Ok(_) => {}
        }
    }
}

/// The session of `in_session` answers a ping.
fn assert_answers_a_ping(server: &McpServer, in_session: &[(&str, &str); 2]) {
    let (mut pong, _) = send(server, "POST", in_session, r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#);
    read_until(&mut pong, |line| line.contains(r#""id":8"#)).expect("a pong");
}

/// Resumes request stream `last_event_id` of the session of `in_session`; returns the line with the result of the
/// call with id 7, if it comes.
fn resumed_result(server: &McpServer, in_session: &[(&str, &str); 2], last_event_id: &str) -> Option<String> {
    let resume = [in_session[0], in_session[1], ("Last-Event-ID", last_event_id)];
    let (mut resumed, head) = send(server, "GET", &resume, "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    read_until(&mut resumed, |line| line.starts_with("data:") && line.contains(r#""id":7"#))
}

#[test]
fn a_client_that_resumes_after_its_call_finished_gets_the_result_it_missed() {
    let gate = Gate::new();
    let tool = bump_tool("gated", ToolScope::World, Arc::default(), Some(gate.clone()));
    let (game, server, mut events) = serve(tool);

    let session = open_session(&server);
    let in_session = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];

    // The call's stream: read its priming event, then the connection drops while the call waits at the gate.
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"gated","arguments":{"by":3}}}"#;
    let (mut stream, _) = send(&server, "POST", &in_session, call);
    let priming = read_until(&mut stream, |line| line.starts_with("id:")).expect("a priming event");
    let last_event_id = priming.trim_start_matches("id:").trim().to_string();
    drop(stream);

    // The call finishes while nobody listens.
    gate.open();
    assert_eq!(next_call_finished(&mut events), None, "the call succeeded");

    // The session answers a ping after the call's response went through it: the response was produced, so rmcp's
    // own manager has forgotten the stream by now.
    assert_answers_a_ping(&server, &in_session);

    // The client comes back with the last event id it saw and gets the result.
    let result = resumed_result(&server, &in_session, &last_event_id).expect("the result of the call, replayed");
    assert!(result.contains(r#""counter":3"#), "{result}");
    game.stop();
}

#[test]
fn a_request_with_the_id_of_one_still_running_in_its_session_is_refused_and_the_first_keeps_its_answer() {
    let gate = Gate::new();
    let tool = bump_tool("gated", ToolScope::World, Arc::default(), Some(gate.clone()));
    let (game, server, mut events) = serve(tool);
    let session = open_session(&server);
    let in_session = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"gated","arguments":{"by":3}}}"#;
    let (mut first, _) = send(&server, "POST", &in_session, call);
    read_until(&mut first, |line| line.starts_with("id:")).expect("a priming event: rmcp has the first");

    // MCP: an id is used once in a session. rmcp answers by id: the first answer would go to the second stream,
    // and the first stream would be held, never ended, for as long as the session lives.
    let (mut second, head) = send(&server, "POST", &in_session, call);
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    let refusal = read_until(&mut second, |line| line.contains("-32600")).expect("a JSON-RPC error");
    assert!(refusal.contains(r#""id":7"#) && refusal.contains("in use"), "{refusal}");

    gate.open();
    let answer = read_until(&mut first, |line| line.contains(r#""id":7"#)).expect("the first's answer, on its stream");
    assert!(answer.contains(r#""counter":3"#), "{answer}");
    assert_eq!(next_call_finished(&mut events), None, "the call succeeded");
    // Answered, the id is free again (a client that numbers its requests anew each session, or reuses ids).
    let (mut again, head) = send(&server, "POST", &in_session, call);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let answer = read_until(&mut again, |line| line.contains(r#""id":7"#)).expect("answered");
    assert!(answer.contains(r#""counter":6"#), "{answer}");
    game.stop();
}

/// Claude Code never opens a new session after a 404 (its tools are gone until it restarts), and its user may read
/// for longer than the idle timeout between two calls. A client listening on its session's `GET` stream is there,
/// however quiet: neither the session's idle timeout nor the host's conversation idle timeout (for sessionless
/// clients) ends it. One that went away without deleting its session (its stream closed) expires, and its
/// conversation ends.
#[test]
fn an_mcp_session_whose_client_listens_outlives_every_idle_timeout_and_expires_once_it_stopped() {
    let tool = bump_tool("bump", ToolScope::World, Arc::default(), None);
    let (game, server, mut events) = serve_with(
        tool,
        |host| host.conversation_idle_timeout(Duration::from_millis(300)),
        |mcp| mcp.session_idle_timeout(Duration::from_secs(2)),
    );
    let session = open_session(&server);
    let in_session = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];
    let (listening, head) = send(&server, "GET", &in_session, "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // A call, so that the session has a conversation.
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"bump","arguments":{}}}"#;
    let (mut answer, _) = send(&server, "POST", &in_session, call);
    read_until(&mut answer, |line| line.contains(r#""id":7"#)).expect("its result");

    // The client says nothing, listening all along. Another client's session, silent from after this one's call
    // and not listening, expires: an expiry has then looked at this one, idle for longer.
    let other = open_session(&server);
    let in_other = [("Mcp-Session-Id", other.as_str()), ("MCP-Protocol-Version", "2025-11-25")];
    let call = r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"bump","arguments":{}}}"#;
    let (mut answer, _) = send(&server, "POST", &in_other, call);
    read_until(&mut answer, |line| line.contains(r#""id":9"#)).expect("its result");
    assert_eq!(next_conversation_ended(&mut events), format!("mcp-session:{other}"), "the silent one expired");
    assert_answers_a_ping(&server, &in_session);
    let status = game.agent().conversation_status(&ConversationId::new(format!("mcp-session:{session}")));
    assert_eq!(status, Some(ConversationStatus::Idle), "its conversation goes on");

    // It goes away without deleting its session: the server learns it at its next keep-alive, and the session
    // expires an idle timeout later.
    drop(listening);
    assert_eq!(next_conversation_ended(&mut events), format!("mcp-session:{session}"));
    let (_, head) = send(&server, "POST", &in_session, r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#);
    assert!(head.starts_with("HTTP/1.1 404"), "the expired session is gone: {head}");
    game.stop();
}

#[test]
fn a_client_that_resumes_a_stream_it_read_to_its_end_is_told_405_so_it_stops_asking() {
    let (game, server, _events) = serve(bump_tool("bump", ToolScope::World, Arc::default(), None));
    let session = open_session(&server);
    let in_session = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];

    // A JSON-RPC error (an unknown tool) read to its end: the TypeScript SDK 1.x takes such a stream for one that
    // was cut, since it ended without a result, and resumes it.
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"nope","arguments":{}}}"#;
    let (mut stream, _) = send(&server, "POST", &in_session, call);
    // Read to its end (the server has finished the stream), keeping the last event id.
    let (mut last_event_id, mut error) = (None, None);
    read_until(&mut stream, |line| {
        if let Some(id) = line.strip_prefix("id:") {
            last_event_id = Some(id.trim().to_string());
        }
        if line.starts_with("data:") && line.contains(r#""id":7"#) {
            error = Some(line.to_string());
        }
        false
    });
    assert!(error.expect("the error").contains(r#""error""#));
    let last_event_id = last_event_id.expect("the stream's events have ids");

    for (last, what) in [(last_event_id.as_str(), "a stream read to its end"), ("0/987654", "a stream not kept")] {
        let resume = [in_session[0], in_session[1], ("Last-Event-ID", last)];
        let (_, head) = send(&server, "GET", &resume, "");
        assert!(head.starts_with("HTTP/1.1 405"), "{what}: {head}");
    }
    // The session is fine: it still answers.
    let (mut pong, _) = send(&server, "POST", &in_session, r#"{"jsonrpc":"2.0","id":8,"method":"ping"}"#);
    read_until(&mut pong, |line| line.contains(r#""id":8"#)).expect("a pong");
    game.stop();
}

/// `burst`: makes progress reports as fast as it can until its call ends, so reports are always queued faster than
/// the server sends them, however late the client's cancel arrives.
fn burst() -> AgentTool<Session> {
    AgentTool::new(
        "burst",
        "Reports progress until its call ends.",
        |ctx: CallContext<Session>, _: NoArgs| async move {
            let mut step = 0u32;
            while ctx.is_active() {
                for _ in 0..256 {
                    step += 1;
                    ctx.report_progress(f64::from(step), None, None);
                }
                tokio::task::yield_now().await;
            }
            Err::<(), _>(ctx.ended().await)
        },
    )
}

/// `flood`: makes [`FLOOD`] progress reports at once, then succeeds.
fn flood() -> AgentTool<Session> {
    AgentTool::new("flood", "Reports progress many times at once.", |ctx: CallContext<Session>, _: NoArgs| async move {
        for step in 1..=FLOOD {
            ctx.report_progress(f64::from(step), Some(f64::from(FLOOD)), None);
        }
        Ok(())
    })
}

#[test]
fn once_a_call_is_cancelled_none_of_its_later_progress_reaches_the_client() {
    let (game, server, mut events) = serve(burst());
    let session = open_session(&server);
    let in_session = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];
    // The session's standalone stream: where rmcp sends a call's progress once the call's own stream is closed,
    // as it is the moment the client cancels (the client has forgotten the token by then).
    let (mut standalone, head) = send(&server, "GET", &in_session, "");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"burst","arguments":{},"_meta":{"progressToken":"p7"}}}"#;
    let (mut stream, _) = send(&server, "POST", &in_session, call);
    read_until(&mut stream, |line| line.contains("notifications/progress")).expect("a first report");
    let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"test"}}"#;
    send(&server, "POST", &in_session, cancel);
    let mut on_call_stream = 1;
    read_until(&mut stream, |line| {
        on_call_stream += u32::from(line.contains("notifications/progress"));
        false
    });

    // The call ends, then the session is deleted, which ends the standalone stream.
    assert_eq!(next_call_finished(&mut events), Some(ErrorCode::Cancelled), "the call was cancelled");
    send(&server, "DELETE", &in_session, "");
    let mut late = 0;
    read_until(&mut standalone, |line| {
        late += u32::from(line.contains("notifications/progress"));
        false
    });
    // Reports already handed to rmcp when it closed the call's stream go where rmcp sends a request's messages
    // then, the standalone stream, which carries none of a request's (src/mcp/stream_log.rs); every report still
    // queued in the game is dropped: the tool makes 256 between two yields.
    assert_eq!(late, 0, "{late} reports followed the cancel ({on_call_stream} went out before it)");
    game.stop();
}

#[test]
fn a_session_ended_with_delete_is_answered_204_and_is_gone() {
    let (game, server, _events) = serve(bump_tool("bump", ToolScope::World, Arc::default(), None));
    let session = open_session(&server);
    let in_session = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];

    // The official Python SDK logs "Session termination failed" for anything but 200 and 204 (rmcp says 202).
    let (_, head) = send(&server, "DELETE", &in_session, "");
    assert!(head.starts_with("HTTP/1.1 204"), "{head}");
    let (_, head) = send(&server, "POST", &in_session, r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#);
    assert!(head.starts_with("HTTP/1.1 404"), "the session is gone: {head}");
    // Ending it again: it is unknown now, and said so.
    let (_, head) = send(&server, "DELETE", &in_session, "");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    // rmcp's own answers come first: the sessionless generation has no sessions to end (405), whatever id is named.
    let sessionless = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2026-07-28")];
    let (_, head) = send(&server, "DELETE", &sessionless, "");
    assert!(head.starts_with("HTTP/1.1 405"), "{head}");
    game.stop();
}

#[test]
fn a_sessionless_request_naming_a_session_id_of_its_own_choosing_is_not_put_in_that_conversation() {
    let (game, server, mut events) = serve(bump_tool("bump", ToolScope::World, Arc::default(), None));
    let session = open_session(&server);
    let call = |id: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"bump","arguments":{{}},"_meta":{{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{{}}}}}}}}"#
        )
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut started = |named: &str| {
        let sessionless = [
            ("Mcp-Session-Id", named),
            ("MCP-Protocol-Version", "2026-07-28"),
            ("Mcp-Method", "tools/call"),
            ("Mcp-Name", "bump"),
        ];
        let (mut reader, head) = send(&server, "POST", &sessionless, &call("7"));
        let mut body = String::new();
        let _ = std::io::Read::read_to_string(&mut reader, &mut body);
        assert!(head.starts_with("HTTP/1.1 200") && body.contains("counter"), "the call ran: {head}{body}");
        runtime.block_on(async {
            loop {
                let event = tokio::time::timeout(Duration::from_secs(10), events.next()).await.expect("in time");
                if let Some(ConversationEvent::CallStarted(started)) = event {
                    return started.conversation.to_string();
                }
            }
        })
    };
    // rmcp ignores the header in this generation: it names no conversation, neither a made-up one nor a real
    // session's (whose replays and in-flight budget are that client's).
    for named in ["made-up", session.as_str()] {
        let conversation = started(named);
        assert!(conversation.starts_with("mcp-request:"), "a conversation of its own, not {conversation}");
    }
    game.stop();
}

/// How many reports the `flood` tool makes, all at once: far more than may wait to be sent.
const FLOOD: u32 = 60_000;

/// The send queue of the server's end of `client`'s connection, from the kernel's table (bytes the client has
/// not taken in yet).
fn server_send_queue(server: &McpServer, client: &TcpStream) -> Option<u64> {
    let client_port = client.local_addr().ok()?.port();
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let port = |address: &str| u16::from_str_radix(address.rsplit(':').next()?, 16).ok();
        (port(fields.get(1)?)? == server.address().port() && port(fields.get(2)?)? == client_port)
            .then(|| u64::from_str_radix(fields.get(4)?.split(':').next()?, 16).ok())?
    })
}

/// How many reports `heavy` makes, each with a [`HEAVY_MESSAGE`]-byte message: tens of megabytes of events, far
/// more than a connection whose client stopped reading buffers (the test fails as inconclusive if they all fit),
/// and fewer than may wait to be sent (none is merged).
const HEAVY: u32 = 2_000;
const HEAVY_MESSAGE: usize = 32 * 1024;

/// `heavy`: makes [`HEAVY`] large progress reports, then succeeds.
fn heavy() -> AgentTool<Session> {
    AgentTool::new("heavy", "Reports large progress.", |ctx: CallContext<Session>, _: NoArgs| async move {
        let message = "x".repeat(HEAVY_MESSAGE);
        for step in 1..=HEAVY {
            ctx.report_progress(f64::from(step), Some(f64::from(HEAVY)), Some(message.clone()));
        }
        Ok(())
    })
}

#[test]
fn a_client_that_stops_reading_its_call_stream_stalls_neither_its_session_nor_the_call_result() {
    let (game, server, mut events) = serve(heavy());
    let session = open_session(&server);
    let in_session = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];

    // The call's connection takes in its priming event and then nothing: a client that hangs without closing.
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"heavy","arguments":{},"_meta":{"progressToken":"p7"}}}"#;
    let (mut stalled, _) = send(&server, "POST", &in_session, call);
    let priming = read_until(&mut stalled, |line| line.starts_with("id:")).expect("a priming event");
    let last_event_id = priming.trim_start_matches("id:").trim().to_string();
    assert_eq!(next_call_finished(&mut events), None, "the call succeeded");
    // The server cannot send the client more: the kernel holds megabytes of the stream for the client, and no
    // more comes (before the fix, from here on the session answered nothing, and the result never went out).
    let mut last = (0, 0);
    let full = (0..600).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        let queued = server_send_queue(&server, stalled.get_ref()).unwrap_or(0);
        last = if queued == last.0 { (queued, last.1 + 1) } else { (queued, 0) };
        queued > 1 << 20 && last.1 >= 5
    });
    assert!(full, "inconclusive: the server's send queue never filled ({} bytes)", last.0);

    // The session still answers.
    assert_answers_a_ping(&server, &in_session);
    // The client comes back for the rest of the stream and gets the result.
    assert!(resumed_result(&server, &in_session, &last_event_id).is_some(), "the result of the call, replayed");
    // The connection it stopped reading was ended, without the result (a client that reads on comes back too).
    let mut reports = 0;
    let on_stalled = read_until(&mut stalled, |line| {
        reports += u32::from(line.contains("notifications/progress"));
        line.contains(r#""id":7"#)
    });
    assert!(on_stalled.is_none() && reports < HEAVY, "the stalled connection got {reports} reports and the result");
    game.stop();
}

#[test]
fn a_sessionless_call_that_runs_long_is_answered_with_a_stream_kept_alive_until_its_result() {
    let gate = Gate::new();
    let tool = bump_tool("gated", ToolScope::World, Arc::default(), Some(gate.clone()));
    let (game, server, mut events) = serve(tool);
    let sessionless = [("MCP-Protocol-Version", "2026-07-28"), ("Mcp-Method", "tools/call"), ("Mcp-Name", "gated")];
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"gated","arguments":{"by":3},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}"#;

    // The call waits at the gate, and the client already has its answer's headers (rmcp sent none until the
    // result, and clients time out on a silent response: httpx after 5 s by default).
    let (mut answer, head) = send(&server, "POST", &sessionless, call);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: text/event-stream"), "{head}");
    // While it runs, keep-alives (and no answer: it has none yet).
    let mut events_before = 0;
    let kept_alive = read_until(&mut answer, |line| {
        events_before += usize::from(line.starts_with("data:"));
        line.starts_with(": keep-alive")
    });
    assert!(kept_alive.is_some() && events_before == 0, "a keep-alive first, then {events_before} events");
    gate.open();
    assert_eq!(next_call_finished(&mut events), None, "the call succeeded");
    let result = read_until(&mut answer, |line| line.starts_with("data:") && line.contains(r#""id":7"#));
    assert!(result.expect("the result").contains(r#""counter":3"#));
    game.stop();
}

#[test]
fn progress_made_faster_than_the_client_takes_it_is_merged_into_the_latest_report_in_order() {
    let (game, server, _events) = serve(flood());
    let session = open_session(&server);
    let in_session = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];
    let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"flood","arguments":{},"_meta":{"progressToken":"p7"}}}"#;
    let (mut stream, _) = send(&server, "POST", &in_session, call);
    let mut reports = Vec::new();
    let result = read_until(&mut stream, |line| {
        let Some(message) =
            line.strip_prefix("data:").and_then(|data| serde_json::from_str::<serde_json::Value>(data).ok())
        else {
            return false;
        };
        if message["method"] == "notifications/progress" {
            reports.extend(message["params"]["progress"].as_f64());
        }
        message["id"] == 7
    });
    assert!(result.is_some_and(|line| line.contains("result")), "the call's result, after its reports");
    // The tool made its reports at once, far faster than they go out: many were merged, none reordered, the last
    // kept.
    assert!(reports.len() < FLOOD as usize, "{} of {FLOOD} reports sent one by one", reports.len());
    assert!(reports.windows(2).all(|pair| pair[0] < pair[1]), "in order");
    assert_eq!(reports.last(), Some(&f64::from(FLOOD)), "ending with the latest report");
    game.stop();
}
