//! The JSON-RPC ids of a session's requests still running. MCP has a client use each id once in a session; one
//! that sends a request with the id of another still running would lose the first one's stream: rmcp routes a
//! response by id, so the first answer went to the second request's stream and the first stream was never
//! ended, held (with its task and its log) for as long as the session lived, and kept the session from expiring.
//! Such a request is refused before rmcp has it; an id is free again once its request is answered.

use std::collections::HashSet;

use axum::http::StatusCode;
use axum::response::Response;
use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage, ServerJsonRpcMessage};

/// An id as its JSON text: `7` and `"7"` are different ids.
pub(crate) type IdKey = String;

/// The ids of a session's requests whose response has not been sent.
#[derive(Default)]
pub(crate) struct RunningIds(HashSet<IdKey>);

impl RunningIds {
    /// Takes `key` for a request; false if a running request has it.
    pub(crate) fn take(&mut self, key: &IdKey) -> bool {
        self.0.insert(key.clone())
    }

    pub(crate) fn holds(&self, key: &IdKey) -> bool {
        self.0.contains(key)
    }

    pub(crate) fn release(&mut self, key: &IdKey) {
        self.0.remove(key);
    }
}

/// The key of `message`'s id, if it is a request.
pub(crate) fn request_key(message: &ClientJsonRpcMessage) -> Option<IdKey> {
    match message {
        JsonRpcMessage::Request(request) => serde_json::to_string(&request.id).ok(),
        _ => None,
    }
}

/// The key of an id as the body carried it ([`JsonRpcRequestId`](super::parse::JsonRpcRequestId)).
pub(crate) fn body_key(id: &serde_json::Value) -> IdKey {
    id.to_string()
}

/// Whether `message`, on a request's stream, is that request's answer (a stream carries the request's progress,
/// the server's own requests to the client, then its response or error).
pub(crate) fn answers(message: &ServerJsonRpcMessage) -> bool {
    matches!(message, JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_))
}

/// The refusal of a request whose id a running request of its session has: `Invalid Request`, HTTP 400.
pub(crate) fn in_use(id: &serde_json::Value) -> Response {
    let message = format!(
        "Invalid Request: id {id} is in use by a request of this session still running; use a new id for each request"
    );
    super::parse::answered_with_error(StatusCode::BAD_REQUEST, id.clone(), super::parse::INVALID_REQUEST, message)
}

/// What rmcp is told when a request with an id in use gets past the check above (two sent at once): rmcp answers
/// it 500.
pub(crate) fn in_use_error(key: &IdKey) -> std::io::Error {
    std::io::Error::other(format!("request id {key} is in use by a running request of this session"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_taken_once_until_released_and_numbers_and_strings_differ() {
        let request = |id: serde_json::Value| {
            let message = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
            serde_json::from_value::<ClientJsonRpcMessage>(message).ok().and_then(|message| request_key(&message))
        };
        let (number, text) = (request(serde_json::json!(7)), request(serde_json::json!("7")));
        assert_eq!(number.as_deref(), Some("7"));
        assert_eq!(number, Some(body_key(&serde_json::json!(7))), "the body's id and rmcp's read alike");
        assert_eq!(text, Some(body_key(&serde_json::json!("7"))));
        let mut ids = RunningIds::default();
        let (number, text) = (number.unwrap_or_default(), text.unwrap_or_default());
        assert!(ids.take(&number) && ids.take(&text), "7 and \"7\" are two ids");
        assert!(!ids.take(&number) && ids.holds(&number));
        ids.release(&number);
        assert!(ids.take(&number), "free again once released");
    }
}
