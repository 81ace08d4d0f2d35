//! Bodies that are not one JSON-RPC message: HTTP 400 with a JSON-RPC error, as JSON, so a client sees the same
//! shape as for every other error (rmcp answers these with 415 and plain text): a parse error (-32700) for a body
//! that is not JSON, an invalid request (-32600) for JSON that is not a JSON-RPC message MCP knows. A batch (a JSON
//! array) is an invalid request too: MCP removed batching in 2025-06-18, and neither protocol generation this
//! server speaks has it.
//!
//! A request for one of MCP's own methods whose params do not fit it (`arguments` sent as a string, a numeric
//! tool `name`) is answered with invalid params (-32602, saying what does not fit) in a JSON-RPC response: rmcp
//! would read it as a custom request and answer "method not found" (HTTP 404 without a session, which clients
//! take for a session that ended).

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::model::{CallToolRequest, ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, ListToolsRequest};
use serde_json::{json, Value};

/// The JSON-RPC code of a parse error: the body is not JSON.
pub(crate) const PARSE_ERROR: i32 = -32700;
/// The JSON-RPC code of an invalid request: JSON, but not a request object.
pub(crate) const INVALID_REQUEST: i32 = -32600;
/// The JSON-RPC code of invalid params: a method this server knows, with params that do not fit it.
pub(crate) const INVALID_PARAMS: i32 = -32602;

/// MCP's own request methods, as a client sends them (both generations): none of them is a custom request.
const MCP_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "server/discover",
    "tools/list",
    "tools/call",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "prompts/list",
    "prompts/get",
    "completion/complete",
    "logging/setLevel",
    "subscriptions/listen",
    "tasks/get",
    "tasks/cancel",
];

/// The `id` and method of the JSON-RPC request a `POST` carries (in its extensions, for the layers inside this one).
#[derive(Clone, Debug)]
pub(crate) struct JsonRpcRequestId {
    /// The request's `id`.
    pub(crate) id: serde_json::Value,
    /// Its `method` (empty when it is not a string: such a body is refused below).
    pub(crate) method: String,
}

/// Refuses a `POST` whose JSON body is not one JSON-RPC message; everything else goes on to rmcp (which also
/// checks `Content-Type` and `Accept`: a body that is not JSON at all is only ours to refuse when it says it is).
pub(crate) async fn refuse_unparsable(State(max_body_bytes): State<usize>, request: Request, next: Next) -> Response {
    let says_json =
        request.headers().get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).is_some_and(|value| {
            value.split(';').next().is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
        });
    if request.method() != Method::POST || !says_json {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let Ok(bytes) = to_bytes(body, max_body_bytes).await else {
        return (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("Payload Too Large: request body exceeds {max_body_bytes} bytes"),
        )
            .into_response();
    };
    // The request's id where it can be read (a string or a number), for the error's `id`: null otherwise.
    let mut id = serde_json::Value::Null;
    let why = match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Err(error) => Some((PARSE_ERROR, format!("Parse error: the body is not valid JSON ({error})"))),
        Ok(serde_json::Value::Array(_)) => Some((
            INVALID_REQUEST,
            "Invalid Request: JSON-RPC batches are not supported; send one message per request".to_string(),
        )),
        Ok(value) => {
            if let Some(readable) = value.get("id").filter(|id| id.is_string() || id.is_number()) {
                id = readable.clone();
            }
            if let (Some(id), Some(method)) = (value.get("id"), value.get("method")) {
                let method = method.as_str().unwrap_or_default().to_string();
                parts.extensions.insert(JsonRpcRequestId { id: id.clone(), method });
            }
            let params = value.get("params").cloned();
            match serde_json::from_value::<ClientJsonRpcMessage>(value) {
                Err(error) => Some((
                    INVALID_REQUEST,
                    format!("Invalid Request: the body is not a JSON-RPC message MCP knows ({error})"),
                )),
                Ok(JsonRpcMessage::Request(request)) => match &request.request {
                    ClientRequest::CustomRequest(custom) if MCP_METHODS.contains(&custom.method.as_str()) => {
                        // A request the server read: its answer, not a refusal of the body.
                        return answered_with_error(StatusCode::OK, id, INVALID_PARAMS, misfit(&custom.method, params));
                    }
                    _ => None,
                },
                Ok(_) => None,
            }
        }
    };
    match why {
        Some((code, message)) => answered_with_error(StatusCode::BAD_REQUEST, id, code, message),
        None => next.run(Request::from_parts(parts, Body::from(bytes))).await,
    }
}

/// What is wrong with the params of a request for MCP's `method`: serde's words for the methods whose params this
/// server can name (`tools/call`, `tools/list`), a general one for the rest.
fn misfit(method: &str, params: Option<Value>) -> String {
    let request = json!({ "method": method, "params": params });
    let why = match method {
        "tools/call" => serde_json::from_value::<CallToolRequest>(request).err(),
        "tools/list" => serde_json::from_value::<ListToolsRequest>(request).err(),
        _ => None,
    };
    match why {
        Some(error) => format!("Invalid params: the params of `{method}` do not fit it ({error})"),
        None => format!("Invalid params: the params of `{method}` do not fit it"),
    }
}

/// A JSON-RPC error response for `id`, as JSON, with HTTP `status`.
pub(crate) fn answered_with_error(status: StatusCode, id: serde_json::Value, code: i32, message: String) -> Response {
    let body = json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } });
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}
