//! A 2025-11-25 client ends its session with `DELETE`. Once rmcp has closed it, the answer is `204 No Content`
//! for a session that was open and `404 Not Found` for one that is unknown or already ended (the specification's
//! answer to a request naming a session that no longer exists). rmcp answers `202 Accepted` to both: the
//! specification names no success code, but the official Python SDK takes only 200 and 204 as done and logged
//! "Session termination failed: 202" at the end of every session. The TypeScript SDK and rmcp's own client take
//! any 2xx; all three report the 404 as a failed termination, which it is: the session had already ended (the game
//! ended its conversation, or it expired).
//!
//! Any other request naming a session that ends while rmcp handles it (rmcp found the session, then its worker
//! stopped, or the crate refused the request: the session is being closed, or was taken out to make room) gets
//! rmcp's `500`; it is answered 404 too, as for a session that had already gone: the client's cue to start a new
//! one, where a 500 would read as the server failing.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::transport::streamable_http_server::session::{SessionId, SessionManager};

use super::sessions::ConversationSessions;

/// Turns rmcp's 202 for a `DELETE` into 204 (the session was open) or 404 (it was not), and its 500 for a session
/// that ended meanwhile into 404. rmcp's own checks come first and their answers pass unchanged: 403 for a bad
/// `Host` or `Origin`, 405 in the sessionless generation, 400 without a session id or with a bad protocol version
/// header.
pub(crate) async fn answer_session_end(
    State(sessions): State<Arc<ConversationSessions>>,
    request: Request,
    next: Next,
) -> Response {
    let named = request.headers().get(HEADER_SESSION_ID).and_then(|value| value.to_str().ok());
    let named = named.map(|id| SessionId::from(id.to_owned()));
    if request.method() != Method::DELETE {
        let response = next.run(request).await;
        let ended_meanwhile = response.status() == StatusCode::INTERNAL_SERVER_ERROR
            && (!is_open(&sessions, named.as_ref()).await || !takes_requests(&sessions, named.as_ref()));
        return if ended_meanwhile { not_found() } else { response };
    }
    let was_open = is_open(&sessions, named.as_ref()).await;
    let mut response = next.run(request).await;
    if response.status() == StatusCode::ACCEPTED {
        if !was_open {
            return not_found();
        }
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    response
}

/// Whether the named session is open (no name, or a lookup that failed, counts as open: rmcp's answer stands).
async fn is_open(sessions: &ConversationSessions, id: Option<&SessionId>) -> bool {
    match id {
        Some(id) => sessions.has_session(id).await.unwrap_or(true),
        None => true,
    }
}

/// Whether the named session takes requests as the crate sees it: not being closed, nor taken out to make room
/// (rmcp still has those until their close is done, and answers a request the crate refused in one with 500).
fn takes_requests(sessions: &ConversationSessions, id: Option<&SessionId>) -> bool {
    id.is_none_or(|id| sessions.takes_requests(id).is_ok())
}

/// rmcp's own answer for a session it does not know.
fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response()
}
