//! The requests refused before rmcp sees them (axum middleware): spent resumes, requests of sessions being
//! closed, new sessions past the ceiling; and requests bound to in-game agent sessions.

use super::*;

/// A `GET` that resumes a request stream with nothing left to send (the client read it to its end, or it is no
/// longer kept) is answered `405 Method Not Allowed`: the specification's "no stream here". An empty `200` stream
/// instead makes the TypeScript SDK 1.x, which takes a stream that ended with a JSON-RPC error (not a result) for
/// one that was cut, try again every `retry` interval for as long as it runs, keeping its session from ever going
/// idle. A session rmcp does not know is left to rmcp (404).
pub(crate) async fn refuse_spent_resumes(
    State(sessions): State<Arc<ConversationSessions>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() == axum::http::Method::GET && spent_resume(&sessions, request.headers()) {
        let allow = [(axum::http::header::ALLOW, "POST, DELETE")];
        return (axum::http::StatusCode::METHOD_NOT_ALLOWED, allow, "nothing to resume: the stream ended")
            .into_response();
    }
    next.run(request).await
}

/// A request that starts something in a session being closed (a `POST` of a JSON-RPC request, or a `GET` that is
/// no resume) is answered as for a closed session (404, as rmcp answers), so its client opens a new one. A resume
/// (`Last-Event-ID`) is served: the close may be waiting to deliver that stream's answer; so are a notification
/// and a response, which start nothing: a client's `notifications/cancelled` for a call the close waits for
/// still cancels it. (A request that gets past this just as the
/// close is decided is refused by [`create_stream`](SessionManager::create_stream), which rmcp answers as a
/// session error: 500.)
pub(crate) async fn refuse_closing_sessions(
    State(sessions): State<Arc<ConversationSessions>>,
    request: Request,
    next: Next,
) -> Response {
    if starts_in_closing_session(&sessions, &request) {
        return (axum::http::StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    }
    if let Some(id) = reused_id(&sessions, &request) {
        return request_ids::in_use(&id);
    }
    if opens_a_session_past_the_ceiling(&sessions, &request) {
        let why = format!("Service Unavailable: {SESSION_CEILING} MCP sessions are open and in use; try again later");
        let retry = [(axum::http::header::RETRY_AFTER, CEILING_RETRY_SECS)];
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, retry, why).into_response();
    }
    next.run(request).await
}

/// Whether `request` is an `initialize` (a new session) of the game's token while [`SESSION_CEILING`] sessions of
/// the game's token are open.
pub(super) fn opens_a_session_past_the_ceiling(sessions: &ConversationSessions, request: &Request) -> bool {
    let initialize =
        request.extensions().get::<crate::mcp::parse::JsonRpcRequestId>().is_some_and(|r| r.method == "initialize");
    // A session id read as rmcp reads it: a header that is not text names none, and rmcp opens a new session.
    let names_a_session = request.headers().get(HEADER_SESSION_ID).and_then(|v| v.to_str().ok()).is_some();
    let of_a_credential = request.extensions().get::<BoundConversation>().is_some();
    initialize
        && !names_a_session
        && !of_a_credential
        && sessions.open.lock().values().filter(|tracked| tracked.bound.is_none()).count() >= SESSION_CEILING
}

/// The id of `request` if a request of its session still running has it.
fn reused_id(sessions: &ConversationSessions, request: &Request) -> Option<serde_json::Value> {
    let id = &request.extensions().get::<crate::mcp::parse::JsonRpcRequestId>()?.id;
    let session = request.headers().get(HEADER_SESSION_ID).and_then(|value| value.to_str().ok())?;
    let open = sessions.open.lock();
    let tracked = open.get(&SessionId::from(session.to_owned()))?;
    tracked.ids.holds(&request_ids::body_key(id)).then(|| id.clone())
}

pub(super) fn starts_in_closing_session(sessions: &ConversationSessions, request: &Request) -> bool {
    let header = |name: &str| request.headers().get(name).and_then(|value| value.to_str().ok());
    let starts = match *request.method() {
        // The body was read (`parse::refuse_unparsable`): a request has an id and a method.
        axum::http::Method::POST => request.extensions().get::<crate::mcp::parse::JsonRpcRequestId>().is_some(),
        axum::http::Method::GET => header(HEADER_LAST_EVENT_ID).is_none(),
        _ => false,
    };
    starts && header(HEADER_SESSION_ID).is_some_and(|id| sessions.is_closing(&SessionId::from(id.to_owned())))
}

fn spent_resume(sessions: &ConversationSessions, headers: &axum::http::HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    match (header(HEADER_SESSION_ID), header(HEADER_LAST_EVENT_ID)) {
        (Some(id), Some(last)) => sessions.nothing_to_resume(&SessionId::from(id.to_owned()), last),
        _ => false,
    }
}

/// Ties a session to the in-game agent session whose credential its request presented: the session the request
/// names, or the one its answer opened (`initialize`).
pub(crate) async fn bind_to_agent_sessions(
    State(sessions): State<Arc<ConversationSessions>>,
    request: Request,
    next: Next,
) -> Response {
    let named = |headers: &axum::http::HeaderMap| {
        headers.get(HEADER_SESSION_ID).and_then(|v| v.to_str().ok()).map(|id| SessionId::from(id.to_owned()))
    };
    let bound = request.extensions().get::<BoundConversation>().map(|bound| bound.conversation.clone());
    let credential = crate::mcp::security::presented_bearer(request.headers()).map(str::to_string);
    let asked = named(request.headers());
    let response = next.run(request).await;
    if let (Some(conversation), Some(credential)) = (bound, credential) {
        if let Some(id) = asked.or_else(|| named(response.headers())) {
            if let Some(room) = sessions.bind(&id, &conversation, &credential) {
                tracing::info!(session = %room, "over {BOUND_KEPT} MCP sessions of an in-game agent open: its longest-silent one not in use ends");
                let _ = sessions.close_session(&room).await;
            }
        }
    }
    response
}
