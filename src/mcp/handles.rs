//! Conversation handles for sessionless clients (MCP 2026-07-28, SEP-2567: cross-call state travels as explicit,
//! server-minted handles passed as ordinary tool arguments).
//!
//! A client calls the built-in tool `begin_conversation` once and passes the handle it returns as the
//! `conversation` argument of its later calls: they are then one conversation, with their own operation-id
//! replays, in-flight limit and status. Only minted handles are accepted (an unknown one is
//! `CONVERSATION_NOT_FOUND`), so two clients never share a conversation by choosing the same handle. A request
//! with no handle (and no MCP session) is its client's conversation, shared by every client of the same name
//! and version (`naming`); one that names no client either is a conversation of its own, ended with the request.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use serde_json::json;

use super::recent::RecentNames;
use super::security::generate_token;
use crate::error::{ErrorCode, ToolError};

/// The built-in tool that mints a handle.
pub(crate) use crate::tool::BEGIN_CONVERSATION;
/// The reserved argument carrying a handle.
pub(crate) use crate::tool::CONVERSATION;
/// How many handles are remembered; beyond, the one used longest ago is forgotten (a client that comes back with
/// it gets `CONVERSATION_NOT_FOUND` and begins another) and its conversation ends, so that a long-running game
/// keeps a bounded number of them. One whose conversation has calls in flight is never the one forgotten.
const KEPT: usize = 10_000;

pub(crate) const CONVERSATION_HELP: &str = "Optional. The handle from `begin_conversation`: pass it in every call \
so that your calls are one conversation of their own (your operation_id retries run once, and no other client's \
calls are mixed with yours, not even another copy of your client's). Not needed when your client keeps an MCP \
session.";

/// The handles minted so far (the [`KEPT`] used most recently, and any whose conversation has calls in flight).
#[derive(Clone)]
pub(crate) struct Handles {
    minted: RecentNames,
}

impl Default for Handles {
    fn default() -> Self {
        Self::keeping(KEPT)
    }
}

impl Handles {
    /// Remembers the `kept` handles used most recently.
    fn keeping(kept: usize) -> Self {
        Self { minted: RecentNames::keeping(kept) }
    }

    /// A new handle (`cv-` and 32 random bytes in hex), and the handle forgotten to make room for it, if one was,
    /// whose conversation the caller ends: the one used longest ago of those `may_forget` allows.
    pub(crate) fn mint(&self, may_forget: impl Fn(&str) -> bool) -> Result<(String, Option<String>), ToolError> {
        let handle = format!("cv-{}", generate_token().map_err(|error| ToolError::internal(error.to_string()))?);
        let forgotten = self.minted.used(&handle, may_forget);
        Ok((handle, forgotten))
    }

    /// Checks a handle a client sent, and notes its use: it must be one this server minted (and still knows).
    pub(crate) fn check(&self, handle: &str) -> Result<(), ToolError> {
        if self.minted.touch(handle) {
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
    let description = format!(
        "Starts a conversation with the game and returns its handle. Call it once, then pass the handle as the \
         `conversation` argument of every call, so that your calls are never mixed with another client's (not \
         even another copy of your client's) and your retries with an operation_id run once among them. Not \
         needed when your client keeps an MCP session. The game keeps the {KEPT} handles used most recently: a \
         handle it no longer knows is refused (CONVERSATION_NOT_FOUND); then begin a new conversation."
    );
    Tool::new(BEGIN_CONVERSATION, description, Arc::new(as_object(input)))
        .with_raw_output_schema(Arc::new(as_object(output)))
        .with_annotations(ToolAnnotations::new().read_only(true).destructive(false).idempotent(false).open_world(false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handle_used_longest_ago_is_forgotten_and_named_for_its_conversation_to_end() {
        let handles = Handles::keeping(2);
        let any = |_: &str| true;
        let (first, none) = handles.mint(any).unwrap();
        assert!(none.is_none());
        let (second, _) = handles.mint(any).unwrap();
        assert!(handles.check(&first).is_ok(), "first is used again: second is now the one used longest ago");
        let (third, forgotten) = handles.mint(any).unwrap();
        assert_eq!(forgotten.as_ref(), Some(&second));
        assert!(handles.check(&second).is_err());
        assert!(handles.check(&first).is_ok() && handles.check(&third).is_ok());
        let (_, forgotten) = handles.mint(|old| old != first).unwrap();
        assert_eq!(forgotten.as_ref(), Some(&third), "one that may not go (calls in flight) is passed over");
    }

    #[test]
    fn only_minted_handles_pass() {
        let handles = Handles::default();
        let (minted, _) = handles.mint(|_| true).unwrap();
        assert!(minted.starts_with("cv-") && minted.len() == 67);
        assert!(handles.check(&minted).is_ok());
        assert_eq!(handles.check("cv-made-up").unwrap_err().code, ErrorCode::ConversationNotFound);
    }
}
