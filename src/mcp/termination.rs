//! A 2025-11-25 client ends its session with `DELETE`. The answer is `204 No Content` once the session is closed,
//! and `404 Not Found` for a session that is unknown or already ended (the specification's answer to a request
//! naming a session that no longer exists). rmcp answers `202 Accepted` to both: the specification names no
//! success code, but the official Python SDK takes only 200 and 204 as done and logs "Session termination failed:
//! 202" at the end of every session. The TypeScript SDK and rmcp's own client take any 2xx.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::{SessionId, SessionManager};

use super::sessions::ConversationSessions;

/// The header naming a 2025-11-25 session.
const SESSION_HEADER: &str = "mcp-session-id";

/// Answers a `DELETE` naming an unknown session with 404 and one that closed its session with 204 (instead of
/// rmcp's 202 for both); every other request, and every other answer (400 without a session id, 405 in the
/// sessionless generation), passes unchanged.
pub(crate) async fn answer_session_end(
    State(sessions): State<Arc<ConversationSessions>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() != Method::DELETE {
        return next.run(request).await;
    }
    let named = request.headers().get(SESSION_HEADER).and_then(|value| value.to_str().ok());
    if let Some(id) = named.map(|id| SessionId::from(id.to_owned())) {
        if !sessions.has_session(&id).await.unwrap_or(true) {
            return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
        }
    }
    let mut response = next.run(request).await;
    if response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    response
}
