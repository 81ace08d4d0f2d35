//! Which conversation an MCP request belongs to: the conversation of the per-conversation credential it
//! presented (an in-game agent session's), else the conversation handle it passed (`conversation`, minted by
//! `begin_conversation`), else its MCP session (2025-11-25). A sessionless request with neither is a conversation
//! of its own (`None` here), never one shared by name with another client.
//!
//! The session is the one an `Mcp-Session-Id` header names only for a request rmcp serves in that session: a
//! sessionless (2026-07-28) request carries its protocol version in its `_meta`, and rmcp ignores the header then,
//! so the header names nothing for it (else a client could join any conversation by naming it there).

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
        return Some(handle_conversation(handle));
    }
    session.filter(|s| !s.is_empty()).map(session_conversation)
}

/// The session a request's `Mcp-Session-Id` header names, given the protocol version its `_meta` carries (if any)
/// and whether that session is open.
pub(crate) fn session_named<'a>(
    header: Option<&'a str>,
    meta_version: Option<&str>,
    is_open: impl FnOnce(&str) -> bool,
) -> Option<&'a str> {
    let sessionless = meta_version.is_some_and(|version| version >= "2026-07-28");
    header.filter(|id| !sessionless && is_open(id))
}

/// The conversation of handle `handle`.
pub(crate) fn handle_conversation(handle: &str) -> ConversationId {
    ConversationId::new(format!("mcp-handle:{handle}"))
}

/// Whether `conversation` is an MCP session's (its life is the session's: it ends when the session does).
pub(crate) fn is_session_conversation(conversation: &ConversationId) -> bool {
    conversation.as_str().starts_with("mcp-session:")
}

/// The conversation of MCP session `session`.
pub(crate) fn session_conversation(session: &str) -> ConversationId {
    ConversationId::new(format!("mcp-session:{session}"))
}
