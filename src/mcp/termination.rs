//! A 2025-11-25 client ends its session with `DELETE`. Once rmcp has closed it, the answer is `204 No Content`
//! for a session that was open and `404 Not Found` for one that is unknown or already ended (the specification's
//! answer to a request naming a session that no longer exists). rmcp answers `202 Accepted` to both: the
//! specification names no success code, but the official Python SDK takes only 200 and 204 as done and logged
//! "Session termination failed: 202" at the end of every session. The TypeScript SDK and rmcp's own client take
//! any 2xx; all three report the 404 as a failed termination, which it is: the session had already ended (the game
//! ended its conversation, or it expired).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::transport::streamable_http_server::session::{SessionId, SessionManager};

use super::sessions::ConversationSessions;

/// Turns rmcp's 202 for a `DELETE` into 204 (the session was open) or 404 (it was not). rmcp's own checks come
/// first and their answers pass unchanged: 403 for a bad `Host` or `Origin`, 405 in the sessionless generation,
/// 400 without a session id or with a bad protocol version header.
pub(crate) async fn answer_session_end(
    State(sessions): State<Arc<ConversationSessions>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != Method::DELETE {
        return next.run(request).await;
    }
    let named = request.headers().get(HEADER_SESSION_ID).and_then(|value| value.to_str().ok());
    let was_open = match named.map(|id| SessionId::from(id.to_owned())) {
        Some(id) => sessions.has_session(&id).await.unwrap_or(true),
        None => true,
    };
    let mut response = next.run(request).await;
    if response.status() == StatusCode::ACCEPTED {
        if !was_open {
            return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
        }
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    response
}
