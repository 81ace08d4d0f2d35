//! Which conversation an MCP request belongs to: the conversation of the per-conversation credential it
//! presented (an in-game agent session's), else the conversation handle it passed (`conversation`, minted by
//! `begin_conversation`), else its MCP session (2025-11-25). A sessionless request with neither is a conversation
//! of its own (`None` here), never one shared by name with another client.

use crate::ids::ConversationId;

/// The one rule, used by the server and by the in-flight limit in front of it. `handle` must have been checked.
pub(crate) fn conversation_id(
    bound: Option<&ConversationId>,
    handle: Option<&str>,
    session: Option<&str>,
) -> Option<ConversationId> {
    if let Some(bound) = bound {
        return Some(bound.clone());
    }
    if let Some(handle) = handle.filter(|h| !h.is_empty()) {
        return Some(ConversationId::new(format!("mcp-handle:{handle}")));
    }
    session.filter(|s| !s.is_empty()).map(session_conversation)
}

/// The conversation of MCP session `session`.
pub(crate) fn session_conversation(session: &str) -> ConversationId {
    ConversationId::new(format!("mcp-session:{session}"))
}
