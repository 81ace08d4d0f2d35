use serde_json::json;

use super::refusals::{opens_a_session_past_the_ceiling, starts_in_closing_session};
use super::*;
use crate::prelude::*;
use crate::testing::{headless_app, AgentTestAppExt, CounterGame, Gate};
use crate::NoArgs;

/// A game in world `alpha` whose tool `held` waits at the gate.
fn held_at_a_gate() -> (bevy::app::App, Gate) {
    let gate = Gate::new();
    let held = AgentTool::new("held", "Waits at the gate.", {
        let gate = gate.clone();
        move |_: CallContext<u64>, _: NoArgs| {
            let gate = gate.clone();
            async move {
                gate.pass().await;
                Ok(())
            }
        }
    });
    let mut app = headless_app(AgentToolsPlugin::new(CounterGame).with_tool(held));
    app.enter_world("alpha");
    (app, gate)
}

#[test]
fn a_new_session_is_refused_while_the_ceiling_of_sessions_in_use_is_open() {
    let (app, _gate) = held_at_a_gate();
    let sessions = ConversationSessions::new(app.agent(), Credentials::new(), None);
    let runtime = app.agent().runtime().clone();
    let initialize = |session: Option<&SessionId>| {
        let mut request = Request::builder().method("POST");
        if let Some(id) = session {
            request = request.header(HEADER_SESSION_ID, id.as_ref());
        }
        let mut request = request.body(axum::body::Body::empty()).expect("a request");
        let noted = super::super::parse::JsonRpcRequestId { id: json!(1), method: "initialize".into() };
        request.extensions_mut().insert(noted);
        request
    };
    // Sessions all heard from just now: none makes room for another.
    let mut kept = Vec::new();
    for _ in 0..SESSION_CEILING - 1 {
        kept.push(runtime.block_on(sessions.create_session()).expect("a session"));
    }
    assert!(!opens_a_session_past_the_ceiling(&sessions, &initialize(None)), "one more may open");
    kept.push(runtime.block_on(sessions.create_session()).expect("a session"));
    assert!(opens_a_session_past_the_ceiling(&sessions, &initialize(None)), "none past the ceiling");
    // A session header that is not text names no session: rmcp would open a new one.
    let mut not_text = initialize(None);
    let value = axum::http::HeaderValue::from_bytes(b"\xff").expect("a header value");
    not_text.headers_mut().insert(HEADER_SESSION_ID, value);
    assert!(opens_a_session_past_the_ceiling(&sessions, &not_text), "none past the ceiling, whatever its header");
    assert!(
        !opens_a_session_past_the_ceiling(&sessions, &initialize(Some(&kept[0].0))),
        "an open one's requests go on"
    );
    // An in-game agent's client (its credential) is not kept out by the game token's sessions.
    let credential = sessions.credentials.mint_for_session(&ConversationId::new("agent")).expect("minted");
    let bound = sessions.credentials.conversation_of(&credential).expect("live");
    let mut of_the_agent = initialize(None);
    of_the_agent.extensions_mut().insert(bound.clone());
    assert!(!opens_a_session_past_the_ceiling(&sessions, &of_the_agent), "the agent's client opens its session");
    runtime.block_on(sessions.close_session(&kept[0].0)).expect("closed");
    assert!(!opens_a_session_past_the_ceiling(&sessions, &initialize(None)), "room again");
    // Nor do an agent's sessions take the game token's room.
    let (agents, _transport) = runtime.block_on(sessions.create_session()).expect("a session");
    sessions.open.lock().get_mut(&agents).expect("tracked").bound = Some((bound.conversation, credential));
    assert!(!opens_a_session_past_the_ceiling(&sessions, &initialize(None)), "an agent's session takes no room");
}

#[test]
fn a_session_being_closed_takes_no_request_one_with_a_request_on_its_way_stays_and_a_request_gone_away_is_uncounted() {
    let (app, _gate) = held_at_a_gate();
    let timeout = Duration::from_secs(60);
    let sessions = ConversationSessions::new(app.agent(), Credentials::new(), Some(timeout));
    let runtime = app.agent().runtime().clone();
    // Sessions rmcp holds (their transports kept, unserved: no request reaches a tool here), silent for long.
    let (running, _kept) = runtime.block_on(sessions.create_session()).expect("a session");
    let (silent, _kept_too) = runtime.block_on(sessions.create_session()).expect("a session");
    let long_ago = Instant::now().checked_sub(timeout * 2).expect("this machine has been up for two minutes");
    for id in [&running, &silent] {
        sessions.open.lock().get_mut(id).expect("tracked").last_seen = long_ago;
    }
    let call = |id: u64| -> ClientJsonRpcMessage {
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": { "name": "held" } });
        serde_json::from_value(request).expect("a request")
    };
    // A request of `running` on its way to rmcp: counted, its stream not started yet (rmcp waits for the
    // session's unserved worker).
    let mut on_its_way = Box::pin(sessions.create_stream(&running, call(1)));
    let pending =
        runtime.block_on(std::future::poll_fn(|cx| std::task::Poll::Ready(on_its_way.as_mut().poll(cx).is_pending())));
    assert!(pending, "rmcp has not started its stream");

    assert_eq!(sessions.expired(Instant::now()), vec![silent.clone()], "a request on its way keeps its session");
    // Decided: until rmcp has closed it, a request that comes is refused as of a closed session (404), not
    // handed to a session about to be closed under it; a resume is still served.
    assert!(runtime.block_on(sessions.has_session(&silent)).expect("asked"), "rmcp still holds it");
    let request = |method: &str, id: &SessionId, last_event_id: Option<&str>| {
        let mut request = Request::builder().method(method).header(HEADER_SESSION_ID, id.as_ref());
        if let Some(last) = last_event_id {
            request = request.header(HEADER_LAST_EVENT_ID, last);
        }
        request.body(axum::body::Body::empty()).expect("a request")
    };
    // A POST of a JSON-RPC request: its body was read, and its id noted.
    let mut new_request = request("POST", &silent, None);
    let noted = super::super::parse::JsonRpcRequestId { id: json!(3), method: "tools/call".into() };
    new_request.extensions_mut().insert(noted);
    assert!(starts_in_closing_session(&sessions, &new_request), "404 for a new request");
    assert!(!starts_in_closing_session(&sessions, &request("POST", &silent, None)), "a notification starts nothing");
    assert!(starts_in_closing_session(&sessions, &request("GET", &silent, None)), "and for a new GET stream");
    assert!(!starts_in_closing_session(&sessions, &request("GET", &silent, Some("0/1"))), "a resume is served");
    assert!(!starts_in_closing_session(&sessions, &request("POST", &running, None)), "the other takes requests");
    let started = runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(5), sessions.create_stream(&silent, call(2))).await
    });
    assert!(matches!(started, Ok(Err(LocalSessionManagerError::SessionNotFound(_)))), "refused at once");
    let accepted = runtime.block_on(sessions.accept_message(&silent, call(3)));
    assert!(matches!(accepted, Err(LocalSessionManagerError::SessionNotFound(_))));
    let cancel = json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 1 } });
    let cancel = serde_json::from_value(cancel).expect("a notification");
    let accepted = runtime.block_on(sessions.accept_message(&silent, cancel));
    assert!(accepted.is_ok(), "a notification starts nothing: {accepted:?}");

    // The request on its way goes away (its HTTP exchange dropped) before its stream started.
    assert_eq!(sessions.open.lock().get(&running).expect("tracked").requests, 1);
    drop(on_its_way);
    let requests = sessions.open.lock().get(&running).expect("tracked").requests;
    assert_eq!(requests, 0, "a request that went away before its stream started is no longer counted");
}

#[test]
fn the_wait_for_a_sessions_calls_outlasts_the_longest_tool_timeout() {
    let (app, _gate) = held_at_a_gate();
    let sessions = ConversationSessions::new(app.agent(), Credentials::new(), None);
    assert_eq!(sessions.drain_limit(), DRAIN_LIMIT, "no tool longer than the default timeout");
    let long = AgentTool::new("long", "Takes half an hour.", |_: CallContext<u64>, _: NoArgs| async { Ok(()) })
        .timeout(Duration::from_secs(30 * 60));
    app.agent().register_tool(long).expect("registered");
    assert_eq!(sessions.drain_limit(), Duration::from_secs(30 * 60) + DRAIN_MARGIN, "a call of it can end late");
}

#[test]
fn a_session_with_a_call_in_flight_never_expires_and_a_silent_one_does() {
    let (mut app, gate) = held_at_a_gate();
    let timeout = Duration::from_secs(60);
    let sessions = ConversationSessions::new(app.agent(), Credentials::new(), Some(timeout));
    let (busy, silent): (SessionId, SessionId) = ("busy".into(), "silent".into());
    let start = Instant::now();
    for id in [&busy, &silent] {
        let conversation = session_conversation(id.as_ref());
        sessions.open.lock().insert(id.clone(), Tracked::new(conversation, start));
    }
    let call = app.agent().conversation(session_conversation("busy")).call("held", json!({}));
    app.run_until("the call is in its handler", |_| gate.arrived() == 1);

    assert!(sessions.expired(start + timeout / 2).is_empty(), "nobody expires before the timeout");
    let later = start + timeout * 2;
    assert_eq!(sessions.expired(later), vec![silent.clone()], "the call in flight keeps its session");

    gate.open();
    assert!(app.run_until_resolved(&call).is_ok());
    let mut expired = sessions.expired(later + timeout);
    expired.sort();
    assert_eq!(expired, vec![busy, silent], "silent for a whole timeout after its call finished");
}

#[test]
fn a_new_session_over_the_cap_ends_the_longest_silent_idle_one_never_one_in_use() {
    let (mut app, gate) = held_at_a_gate();
    let _runtime = app.agent().host().runtime.enter();
    let credentials = Credentials::new();
    let sessions = ConversationSessions::new(app.agent(), credentials, Some(Duration::from_secs(60)));
    let start = Instant::now();
    let now = start + ROOM_GRACE + Duration::from_secs(10);
    // Oldest first: in use each way a session can be, then two idle ones, then one heard from just now.
    let ids: Vec<SessionId> =
        ["busy", "listening", "bound", "idle-old", "idle-new"].into_iter().map(SessionId::from).collect();
    for (n, id) in ids.iter().enumerate() {
        let tracked = Tracked::new(session_conversation(id.as_ref()), start + Duration::from_secs(n as u64));
        sessions.open.lock().insert(id.clone(), tracked);
    }
    let recent = SessionId::from("recent");
    sessions.open.lock().insert(recent.clone(), Tracked::new(session_conversation("recent"), now));
    let call = app.agent().conversation(session_conversation("busy")).call("held", json!({}));
    app.run_until("the call is in its handler", |_| gate.arrived() == 1);
    let _stream = sessions.listening(&ids[1], Box::pin(Quiet), true);
    sessions.open.lock().get_mut(&ids[2]).expect("open").bound = Some(("game-agent".into(), "secret".into()));

    assert_eq!(sessions.to_make_room(7, now), None, "below the cap nothing ends");
    assert_eq!(sessions.to_make_room(6, now), Some(ids[3].clone()), "the longest silent of the idle ones");
    assert_eq!(sessions.to_make_room(5, now), Some(ids[4].clone()), "taken out at once: the next goes next");
    assert!(!sessions.open.lock().contains_key(&ids[3]), "the first is no longer open");
    assert_eq!(sessions.to_make_room(4, now), None, "in use, or heard from within the grace: never ended");
    gate.open();
    assert!(app.run_until_resolved(&call).is_ok());
}

/// A stream with nothing to send, standing for a client's `GET` stream.
struct Quiet;

impl Stream for Quiet {
    type Item = ServerSseMessage;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<ServerSseMessage>> {
        std::task::Poll::Pending
    }
}

/// Claude Code never opens a new session after a 404: a client that stays quiet while its user reads for a
/// while must find its session still there. Its open `GET` stream says it is.
#[test]
fn a_session_whose_client_listens_never_expires_and_its_idle_time_starts_when_it_stops() {
    let (app, _gate) = held_at_a_gate();
    let _runtime = app.agent().host().runtime.enter();
    let timeout = Duration::from_secs(60);
    let sessions = ConversationSessions::new(app.agent(), Credentials::new(), Some(timeout));
    let (listening, silent): (SessionId, SessionId) = ("listening".into(), "silent".into());
    let start = Instant::now();
    for id in [&listening, &silent] {
        sessions.open.lock().insert(id.clone(), Tracked::new(session_conversation(id.as_ref()), start));
    }
    let first = sessions.listening(&listening, Box::pin(Quiet), true);
    let second = sessions.listening(&listening, Box::pin(Quiet), true);
    assert_eq!(sessions.expired(start + timeout * 10), vec![silent.clone()], "a listening client is there");
    drop(first);
    assert_eq!(sessions.expired(start + timeout * 10), vec![silent.clone()], "while any of its streams is open");
    drop(second);
    let stopped = Instant::now();
    assert!(!sessions.expired(stopped + timeout / 2).contains(&listening), "its idle time starts now");
    let mut expired = sessions.expired(stopped + timeout * 2);
    expired.sort();
    assert_eq!(expired, vec![listening, silent], "and it expires a whole timeout after");
}

/// rmcp's side of a `GET` stream: what it sends into a bounded channel (waiting while it is full).
struct Rmcp(tokio::sync::mpsc::Receiver<ServerSseMessage>);

impl Stream for Rmcp {
    type Item = ServerSseMessage;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<ServerSseMessage>> {
        self.0.poll_recv(cx)
    }
}

/// A client that keeps its `GET` stream's connection open but reads nothing from it is not listening: once its
/// stream is let go (after [`STALL_TIMEOUT`]), the session's idle time starts, as if it had closed it.
#[test]
fn a_client_that_stops_reading_its_get_stream_no_longer_keeps_its_session() {
    let (app, _gate) = held_at_a_gate();
    let runtime = app.agent().host().runtime.clone();
    let _runtime = runtime.enter();
    let timeout = Duration::from_secs(60);
    let sessions = ConversationSessions::new(app.agent(), Credentials::new(), Some(timeout));
    let id: SessionId = "stalled".into();
    let start = Instant::now();
    sessions.open.lock().insert(id.clone(), Tracked::new(session_conversation(id.as_ref()), start));
    let (rmcp, inner) = tokio::sync::mpsc::channel(16);
    let _connection = sessions.listening(&id, Box::pin(Rmcp(inner)), true);
    assert!(sessions.expired(start + timeout * 10).is_empty(), "listening");

    // Events come; the client's connection stays open and takes none of them.
    let event = || {
        ServerSseMessage::from_message(rmcp::model::ServerJsonRpcMessage::notification(
            rmcp::model::ServerNotification::ToolListChangedNotification(Default::default()),
        ))
    };
    runtime.block_on(async {
        let sends = async { while rmcp.send(event()).await.is_ok() {} };
        tokio::time::timeout(STALL_TIMEOUT * 4, sends).await.expect("rmcp's stream was let go");
    });
    let stopped = Instant::now();
    assert!(!sessions.expired(stopped + timeout / 2).contains(&id), "its idle time starts when it was let go");
    assert_eq!(sessions.expired(stopped + timeout * 2), vec![id], "then it expires as a silent session does");
}

/// A client reconnected under a new session, retried its keyed call (same task and operation id: it joined
/// the running execution) and deleted the old session: the new one waits for that execution, which is a call
/// in flight, not silence. Expiring it would cancel the work it waits for (rule H12).
#[test]
fn a_session_whose_retry_waits_for_another_sessions_execution_does_not_expire() {
    let (mut app, gate) = held_at_a_gate();
    let timeout = Duration::from_secs(60);
    let sessions = ConversationSessions::new(app.agent(), Credentials::new(), Some(timeout));
    let (old, new): (SessionId, SessionId) = ("old".into(), "new".into());
    let start = Instant::now();
    sessions.open.lock().insert(new.clone(), Tracked::new(session_conversation(new.as_ref()), start));
    let keyed = || crate::CallRequest::new("held", json!({})).operation("op").task("shared");
    let first = app.agent().conversation(session_conversation(old.as_ref())).request(keyed());
    app.run_until("the call is in its handler", |_| gate.arrived() == 1);
    let retry = app.agent().conversation(session_conversation(new.as_ref())).request(keyed());
    assert_eq!(retry.request_id(), first.request_id(), "the retry joined the running execution");
    app.agent().end_conversation(&session_conversation(old.as_ref())).expect("the old session is deleted");

    assert!(sessions.expired(start + timeout * 2).is_empty(), "the retry's wait keeps its session");
    gate.open();
    assert!(app.run_until_resolved(&retry).is_ok(), "and the execution finished for it");
}

#[test]
fn a_call_in_flight_in_a_handles_conversation_keeps_its_session_and_an_agent_sessions_never_expires() {
    let (mut app, gate) = held_at_a_gate();
    let timeout = Duration::from_secs(60);
    let credentials = Credentials::new();
    let sessions = ConversationSessions::new(app.agent(), credentials.clone(), Some(timeout));
    let (handled, agents, silent): (SessionId, SessionId, SessionId) =
        ("handled".into(), "agents".into(), "silent".into());
    let start = Instant::now();
    for id in [&handled, &agents, &silent] {
        sessions.open.lock().insert(id.clone(), Tracked::new(session_conversation(id.as_ref()), start));
    }
    let (handle, in_game) = (ConversationId::new("mcp-handle:h"), ConversationId::new("chat-1"));
    sessions.used("handled", &handle);
    let credential = credentials.mint_for_session(&in_game).expect("a credential");
    sessions.bind(&agents, &in_game, &credential);
    let call = app.agent().conversation(handle.clone()).call("held", json!({}));
    app.run_until("the call is in its handler", |_| gate.arrived() == 1);

    let later = start + timeout * 10;
    assert_eq!(sessions.expired(later), vec![silent.clone()], "the handle's call keeps its session; the agent's stays");
    assert_eq!(
        sessions.ending_with(&in_game),
        vec![agents.clone()],
        "the agent's session ends with its in-game session"
    );
    assert!(sessions.ending_with(&handle).is_empty(), "a handle's conversation ending leaves the session open");
    gate.open();
    assert!(app.run_until_resolved(&call).is_ok());
    let mut expired = sessions.expired(later + timeout);
    expired.sort();
    assert_eq!(expired, vec![handled, "silent".into()], "silent for a whole timeout after its call finished");
    // The in-game session failed or ended: its credential is revoked, and its MCP session goes with it.
    credentials.revoke(&credential);
    assert!(sessions.expired(start).contains(&agents), "closed with its credential, silent or not");
}

#[test]
fn an_agent_sessions_mcp_sessions_past_eight_end_the_longest_silent_idle_one_and_a_revoked_ones_end_without_an_idle_timeout(
) {
    let (app, _) = held_at_a_gate();
    let credentials = Credentials::new();
    let sessions = ConversationSessions::new(app.agent(), credentials.clone(), None);
    let in_game = ConversationId::new("chat-1");
    let credential = credentials.mint_for_session(&in_game).expect("a credential");
    let now = Instant::now();
    let long_ago = now.checked_sub(ROOM_GRACE * 4).expect("this machine has been up for two minutes");
    let ids: Vec<SessionId> = (0..=BOUND_KEPT + 1).map(|n| SessionId::from(format!("s{n}"))).collect();
    for (n, id) in ids.iter().enumerate() {
        // Silent longest first; the last was heard from just now.
        let seen = if n == BOUND_KEPT { now } else { long_ago + Duration::from_secs(n as u64) };
        sessions.open.lock().insert(id.clone(), Tracked::new(session_conversation(id.as_ref()), seen));
    }
    // The longest silent listens; the next has a request running (its calls run in the in-game session's
    // conversation, like every other bound session's): the third is the longest silent idle one.
    sessions.open.lock().get_mut(&ids[0]).expect("open").listening = 1;
    let (feeder, running) = StreamLog::connected(Duration::from_millis(20));
    // Counted as `create_stream` counts a request, its stream then drained as rmcp's would be.
    sessions.open.lock().get_mut(&ids[1]).expect("open").requests += 1;
    let answer = {
        let _runtime = app.agent().runtime().enter();
        sessions.logged(&ids[1], running, None)
    };
    for id in &ids[..BOUND_KEPT] {
        assert_eq!(sessions.bind(id, &in_game, &credential), None, "up to {BOUND_KEPT} are kept");
    }
    assert_eq!(sessions.bind(&ids[BOUND_KEPT], &in_game, &credential), Some(ids[2].clone()));
    assert!(!sessions.is_open(ids[2].as_ref()) && sessions.is_open(ids[BOUND_KEPT].as_ref()));
    assert_eq!(sessions.bind(&ids[BOUND_KEPT], &in_game, &credential), None, "a session's next request");

    // Its request's response ends: the session is no longer busy.
    feeder.finish();
    let mut answer = answer;
    app.agent()
        .runtime()
        .block_on(async { while std::future::poll_fn(|cx| answer.as_mut().poll_next(cx)).await.is_some() {} });
    assert_eq!(sessions.open.lock().get(&ids[1]).map(|tracked| tracked.requests), Some(0));
    // Only a session silent for the grace ends for a new one: with the others listening, the one heard from
    // just now stays, and the cap waits for the next bind.
    for (id, tracked) in sessions.open.lock().iter_mut() {
        tracked.listening = usize::from(*id != ids[BOUND_KEPT]);
    }
    assert_eq!(sessions.bind(&ids[BOUND_KEPT + 1], &in_game, &credential), None);
    assert!(sessions.is_open(ids[BOUND_KEPT].as_ref()));

    // A client reconnecting in a loop: sessions heard from just now, all listening. Past the most a credential
    // keeps, its longest-silent one without a request running ends for each new one, whatever else.
    let looping: Vec<SessionId> = (0..BOUND_MOST).map(|n| SessionId::from(format!("loop{n}"))).collect();
    sessions.open.lock().get_mut(&ids[3]).expect("open").requests += 1;
    for id in &looping {
        let mut tracked = Tracked::new(session_conversation(id.as_ref()), Instant::now());
        tracked.listening = 1;
        sessions.open.lock().insert(id.clone(), tracked);
    }
    let mut ended = Vec::new();
    for id in &looping {
        ended.extend(sessions.bind(id, &in_game, &credential));
    }
    let of_credential = sessions.open.lock().values().filter(|tracked| tracked.bound.is_some()).count();
    assert_eq!(of_credential, BOUND_MOST, "never more than the most a credential keeps: ended {ended:?}");
    assert!(ended.contains(&ids[0]) && ended.contains(&ids[BOUND_KEPT]), "listening, or heard from lately: {ended:?}");
    assert!(sessions.is_open(ids[3].as_ref()), "a session with a request running is not ended");

    assert!(sessions.expired(now + Duration::from_secs(1 << 30)).is_empty(), "no idle timeout");
    credentials.revoke(&credential);
    let bound = sessions.open.lock().values().filter(|tracked| tracked.bound.is_some()).count();
    assert_eq!(sessions.expired(now).len(), bound, "the revoked credential's sessions end all the same");
}
