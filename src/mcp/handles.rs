//! Conversation handles for sessionless clients (MCP 2026-07-28, SEP-2567: cross-call state travels as explicit,
//! server-minted handles passed as ordinary tool arguments).
//!
//! A client calls the built-in tool `begin_conversation` once and passes the handle it returns as the
//! `conversation` argument of its later calls: they are then one conversation, with their own operation-id
//! replays, in-flight limit and status. Only minted handles are accepted (an unknown one is
//! `CONVERSATION_NOT_FOUND`), so two clients never share a conversation by choosing the same handle. A request
//! with no handle (and no MCP session) is its client's conversation, shared by every client of the same name
//! and version (`naming`); one that names no client either is a conversation of its own, ended with the request.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::json;

use super::security::generate_token;
use crate::error::{ErrorCode, ToolError};

/// The built-in tool that mints a handle.
pub(crate) use crate::tool::BEGIN_CONVERSATION;
/// The reserved argument carrying a handle.
pub(crate) use crate::tool::CONVERSATION;
/// How many handles are remembered; the oldest are forgotten beyond (a client that comes back with one gets
/// `CONVERSATION_NOT_FOUND` and begins another), and their conversations end, so that a long-running game keeps
/// a bounded number of them.
const KEPT: usize = 10_000;

pub(crate) const CONVERSATION_HELP: &str = "Optional. The handle from `begin_conversation`: pass it in every call \
so that your calls are one conversation of their own (your operation_id retries run once, and no other client's \
calls are mixed with yours, not even another copy of your client's). Not needed when your client keeps an MCP \
session.";

/// The handles minted so far (the newest [`KEPT`]).
#[derive(Clone)]
pub(crate) struct Handles {
    minted: Arc<Mutex<(HashSet<String>, VecDeque<String>)>>,
    kept: usize,
}

impl Default for Handles {
    fn default() -> Self {
        Self::keeping(KEPT)
    }
}

impl Handles {
    /// Remembers the newest `kept` handles.
    fn keeping(kept: usize) -> Self {
        Self { minted: Arc::default(), kept }
    }

    /// A new handle (`cv-` and 32 random bytes in hex), and the handles forgotten to make room for it, whose
    /// conversations the caller ends.
    pub(crate) fn mint(&self) -> Result<(String, Vec<String>), ToolError> {
        let handle = format!("cv-{}", generate_token().map_err(|error| ToolError::internal(error.0))?);
        let mut minted = self.minted.lock();
        let (known, order) = &mut *minted;
        known.insert(handle.clone());
        order.push_back(handle.clone());
        let mut forgotten = Vec::new();
        while order.len() > self.kept {
            if let Some(oldest) = order.pop_front() {
                known.remove(&oldest);
                forgotten.push(oldest);
            }
        }
        Ok((handle, forgotten))
    }

    /// Checks a handle a client sent: it must be one this server minted.
    pub(crate) fn check(&self, handle: &str) -> Result<(), ToolError> {
        if self.minted.lock().0.contains(handle) {
            return Ok(());
        }
        Err(ToolError::with_code(
            ErrorCode::ConversationNotFound,
            format!(
                "`{handle}` is not a conversation handle of this game (or it was forgotten): call \
                 `{BEGIN_CONVERSATION}` for one"
            ),
        )
        .with_detail("field", CONVERSATION))
    }
}

/// `begin_conversation` as `tools/list` shows it.
pub(crate) fn begin_conversation_tool() -> Tool {
    let input = json!({ "type": "object", "properties": {} });
    let output = json!({
        "type": "object",
        "properties": { "conversation": { "type": "string", "description": "Pass it as `conversation` in every call." } },
        "required": ["conversation"]
    });
    let as_object = |value: serde_json::Value| value.as_object().cloned().unwrap_or_else(JsonObject::new);
    Tool::new(
        BEGIN_CONVERSATION,
        "Starts a conversation with the game and returns its handle. Call it once, then pass the handle as the \
         `conversation` argument of every call, so that your calls are never mixed with another client's (not \
         even another copy of your client's) and your retries with an operation_id run once among them. Not \
         needed when your client keeps an MCP session.",
        Arc::new(as_object(input)),
    )
    .with_raw_output_schema(Arc::new(as_object(output)))
    .with_annotations(ToolAnnotations::new().read_only(true).destructive(false).idempotent(false).open_world(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_handles_are_forgotten_and_named_for_their_conversations_to_end() {
        let handles = Handles::keeping(2);
        let (first, none) = handles.mint().unwrap();
        assert!(none.is_empty());
        let (second, _) = handles.mint().unwrap();
        let (third, forgotten) = handles.mint().unwrap();
        assert_eq!(forgotten, std::slice::from_ref(&first));
        assert!(handles.check(&first).is_err());
        assert!(handles.check(&second).is_ok() && handles.check(&third).is_ok());
    }

    #[test]
    fn only_minted_handles_pass() {
        let handles = Handles::default();
        let (minted, _) = handles.mint().unwrap();
        assert!(minted.starts_with("cv-") && minted.len() == 67);
        assert!(handles.check(&minted).is_ok());
        assert_eq!(handles.check("cv-made-up").unwrap_err().code, ErrorCode::ConversationNotFound);
    }
}
