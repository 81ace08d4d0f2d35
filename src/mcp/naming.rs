//! Which conversation an MCP request belongs to: the conversation of the per-conversation credential it
//! presented (an in-game agent session's), else the MCP session (2025-11-25), else the agent's `task_id` handle,
//! else the client's identity sent in `_meta` (2026-07-28 has no sessions).

use crate::ids::ConversationId;

/// The one rule, used by the server and by the in-flight limit in front of it.
pub(crate) fn conversation_id(
    bound: Option<&ConversationId>,
    session: Option<&str>,
    task: Option<&str>,
    client: Option<(&str, &str)>,
) -> ConversationId {
    if let Some(bound) = bound {
        return bound.clone();
    }
    if let Some(session) = session.filter(|s| !s.is_empty()) {
        return ConversationId::new(format!("mcp-session:{session}"));
    }
    if let Some(task) = task.filter(|t| !t.is_empty()) {
        return ConversationId::new(format!("mcp-task:{task}"));
    }
    match client {
        Some((name, version)) => ConversationId::new(format!("mcp-client:{name}/{version}")),
        None => ConversationId::new("mcp-client:unknown"),
    }
}
