//! The per-conversation in-flight limit at the HTTP layer: a `tools/call` from a conversation that already has
//! its limit of calls in flight is answered `BUSY` before it reaches the MCP service, as the host's error result
//! for that request (HTTP 200, one JSON-RPC response, `Retry-After: 1`): a refusal by HTTP status alone reaches
//! an agent as a transport failure (the Python SDK makes it -32603, the TypeScript SDK throws), with the code
//! lost. (The host enforces the same limit at admission, as `BUSY`, for calls that race past this check, and for
//! calls with an `operation_id`, which this check lets through: a retry that joins its running operation adds no
//! call.)

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use serde_json::Value;

use super::connections::read_body;
use super::credentials::BoundConversation;
use super::handles::{BEGIN_CONVERSATION, CONVERSATION};
use super::naming::{
    client_identity, conversation_id, is_sessionless, session_named, CLIENT_CAPABILITIES_META, CLIENT_INFO_META,
    PROTOCOL_VERSION_META,
};
use super::server::{error_result, identify};
use super::sessions::ConversationSessions;
use crate::agent::AgentHandle;
use crate::error::{ErrorCode, ToolError};
use crate::ids::ConversationId;
use crate::tool::OPERATION_ID;

/// What the limit layer needs: the host, and the body limit it must respect while it reads a request.
#[derive(Clone)]
pub(crate) struct InFlightLimit {
    pub agent: AgentHandle,
    /// The open 2025-11-25 sessions: a session id header names a conversation only if it names one of them.
    pub sessions: Arc<ConversationSessions>,
    pub max_body_bytes: usize,
    /// How long a request's body may take to arrive (408 past it).
    pub read_timeout: std::time::Duration,
}

/// The answer to request `id`: the host's `BUSY` as an error tool result (DESIGN §5), exactly as admission would
/// give it and as the server shapes every result (who answers in `_meta`; `resultType` only for a sessionless
/// 2026-07-28 request, as rmcp leaves it out for older ones), in a JSON-RPC response with `Retry-After: 1`.
fn busy(agent: &AgentHandle, conversation: &ConversationId, id: &Value, sessionless: bool) -> Response {
    let error = ToolError::with_code(
        ErrorCode::Busy,
        "this conversation already has its limit of calls in flight; wait for one to finish",
    )
    .with_detail("conversation", conversation)
    .with_detail("limit", agent.host().config.max_in_flight);
    let mut result = error_result(&error);
    identify(&mut result.meta);
    if !sessionless {
        result.result_type = None;
    }
    let result = serde_json::to_value(result).unwrap_or_else(|_| serde_json::json!({"isError": true}));
    let body = serde_json::json!({ "jsonrpc": "2.0", "id": id, "result": result });
    let mut response = (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

pub(crate) async fn limit_in_flight(State(limit): State<InFlightLimit>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match read_body(body, limit.max_body_bytes, limit.read_timeout).await {
        Ok(bytes) => bytes,
        Err(refused) => return refused,
    };
    if let Ok(message) = serde_json::from_slice::<Value>(&bytes) {
        if let (Some("tools/call"), Some(id)) = (message.get("method").and_then(Value::as_str), message.get("id")) {
            let params = message.get("params");
            let header = parts.headers.get(HEADER_SESSION_ID).and_then(|v| v.to_str().ok());
            let meta = params.and_then(|p| p.get("_meta"));
            let version = meta.and_then(|m| m.get(PROTOCOL_VERSION_META)).and_then(Value::as_str);
            let sessionless = is_sessionless(version, meta.and_then(|m| m.get(CLIENT_CAPABILITIES_META)).is_some());
            let session = session_named(header, sessionless, |id| limit.sessions.is_open(id));
            let client = client_identity(sessionless, meta.and_then(|m| m.get(CLIENT_INFO_META)));
            let arguments = params.and_then(|p| p.get("arguments"));
            let handle = arguments.and_then(|a| a.get(CONVERSATION)).and_then(Value::as_str);
            // A keyed call may be a retry that joins its running operation or gets its retained outcome (it adds
            // no call): the host decides, and answers `BUSY` only for a new execution.
            let keyed = arguments.and_then(|a| a.get(OPERATION_ID)).is_some();
            // `begin_conversation` takes no call's place (it is the way out of a shared conversation), and an
            // unknown tool is the server's JSON-RPC error to give, not BUSY.
            let name = params.and_then(|p| p.get("name")).and_then(Value::as_str).unwrap_or_default();
            let takes_a_place = name != BEGIN_CONVERSATION && limit.agent.is_registered(name);
            let bound = parts.extensions.get::<BoundConversation>().map(|bound| &bound.conversation);
            // A request of no conversation (sessionless, no handle, no client name) is one of its own: nothing
            // to limit yet. An unknown handle names nobody's conversation: the server refuses it.
            let conversation = conversation_id(bound, handle, session, client.as_deref());
            let refused = |conversation: &ConversationId| takes_a_place && !keyed && limit.agent.is_busy(conversation);
            if let Some(conversation) = conversation.filter(refused) {
                return busy(&limit.agent, &conversation, id, sessionless);
            }
        }
    }
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}
