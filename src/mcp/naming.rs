//! Which conversation an MCP request belongs to: the conversation of the per-conversation credential it
//! presented (an in-game agent session's), else the conversation handle it passed (`conversation`, minted by
//! `begin_conversation`), else its MCP session (2025-11-25), else its client's identity (DESIGN §7: a sessionless
//! 2026-07-28 request names its client in `_meta`, and every client outside the game presents the game's one
//! token, so clients of the same name and version are one conversation). A request with none of these is a
//! conversation of its own (`None` here).
//!
//! The session is the one an `Mcp-Session-Id` header names only for a request rmcp serves in that session: a
//! sessionless (2026-07-28) request carries its protocol version in its `_meta`, and rmcp ignores the header then,
//! so the header names nothing for it (else a client could join any conversation by naming it there).

use serde_json::Value;

use crate::ids::ConversationId;

/// Where a sessionless request's `_meta` names its client (`{"name", "version"}`, SEP-2575).
pub(crate) const CLIENT_INFO_META: &str = "io.modelcontextprotocol/clientInfo";
/// Where a request's `_meta` carries its protocol version.
pub(crate) const PROTOCOL_VERSION_META: &str = "io.modelcontextprotocol/protocolVersion";
/// Where a sessionless request's `_meta` carries its client's capabilities.
pub(crate) const CLIENT_CAPABILITIES_META: &str = "io.modelcontextprotocol/clientCapabilities";

/// At most this many characters of a client's name, and of its version, name its conversation.
const CLIENT_NAME_CHARS: usize = 100;
const CLIENT_VERSION_CHARS: usize = 40;

/// The one rule, used by the server and by the in-flight limit in front of it. `handle` must have been checked;
/// `client` is [`client_identity`]'s.
pub(crate) fn conversation_id(
    bound: Option<&ConversationId>,
    handle: Option<&str>,
    session: Option<&str>,
    client: Option<&str>,
) -> Option<ConversationId> {
    if let Some(bound) = bound {
        return Some(bound.clone());
    }
    if let Some(handle) = handle.filter(|h| !h.is_empty()) {
        return Some(handle_conversation(handle));
    }
    if let Some(session) = session.filter(|s| !s.is_empty()) {
        return Some(session_conversation(session));
    }
    client.map(client_conversation)
}

/// The identity of the client a sessionless request's `_meta` names (`sessionless` is [`is_sessionless`]'s
/// answer for it, `info` its [`CLIENT_INFO_META`] entry): `name/version`, without control characters and cut to a
/// bounded length. `None` without a name, and for a request rmcp serves in a session (2025-11-25).
pub(crate) fn client_identity(sessionless: bool, info: Option<&Value>) -> Option<String> {
    if !sessionless {
        return None;
    }
    let info = info?;
    let clean = |text: &str, chars: usize| text.chars().filter(|c| !c.is_control()).take(chars).collect::<String>();
    let name = clean(info.get("name")?.as_str()?, CLIENT_NAME_CHARS);
    if name.trim().is_empty() {
        return None;
    }
    let version = clean(info.get("version").and_then(Value::as_str).unwrap_or_default(), CLIENT_VERSION_CHARS);
    Some(format!("{name}/{version}"))
}

/// The session a request's `Mcp-Session-Id` header names, given whether rmcp serves the request without one
/// ([`is_sessionless`]) and whether that session is open.
pub(crate) fn session_named(
    header: Option<&str>,
    sessionless: bool,
    is_open: impl FnOnce(&str) -> bool,
) -> Option<&str> {
    header.filter(|id| !sessionless && is_open(id))
}

/// Whether rmcp serves a request without a session, by what its `_meta` carries: a protocol version of the
/// sessionless generation (2026-07-28 on), or a protocol version and the client's capabilities, whatever the
/// version (how a client that discovered the server with `server/discover` asks in an older version: rmcp's
/// `is_legacy_request`). Only `initialize` has a session then, and it names no tool call.
pub(crate) fn is_sessionless(meta_version: Option<&str>, has_client_capabilities: bool) -> bool {
    meta_version.is_some_and(|version| version >= "2026-07-28" || has_client_capabilities)
}

/// The conversation of handle `handle`.
pub(crate) fn handle_conversation(handle: &str) -> ConversationId {
    ConversationId::new(format!("mcp-handle:{handle}"))
}

/// The conversation of the sessionless client `identity` ([`client_identity`]).
pub(crate) fn client_conversation(identity: &str) -> ConversationId {
    ConversationId::new(format!("mcp-client:{identity}"))
}

/// Whether `conversation` is an MCP session's (its life is the session's: it ends when the session does).
pub(crate) fn is_session_conversation(conversation: &ConversationId) -> bool {
    conversation.as_str().starts_with("mcp-session:")
}

/// The conversation of MCP session `session`.
pub(crate) fn session_conversation(session: &str) -> ConversationId {
    ConversationId::new(format!("mcp-session:{session}"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_client_is_named_by_its_name_and_version_and_a_nameless_one_by_nothing() {
        let identity = |info: Value| client_identity(true, Some(&info));
        assert_eq!(identity(json!({"name": "mcp", "version": "0.1.0"})).as_deref(), Some("mcp/0.1.0"));
        assert_eq!(identity(json!({"name": "mcp"})).as_deref(), Some("mcp/"));
        assert_eq!(identity(json!({"name": "a\nb\u{7}", "version": "1"})).as_deref(), Some("ab/1"));
        let long = identity(json!({"name": "n".repeat(10_000), "version": "v".repeat(10_000)})).unwrap_or_default();
        assert_eq!(long.chars().count(), CLIENT_NAME_CHARS + 1 + CLIENT_VERSION_CHARS, "bounded");
        for nameless in [json!({}), json!({"name": " "}), json!({"name": 7}), json!("mcp")] {
            assert_eq!(identity(nameless.clone()), None, "{nameless}");
        }
        assert_eq!(client_identity(true, None), None);
        let info = json!({"name": "mcp", "version": "1"});
        assert_eq!(client_identity(false, Some(&info)), None, "a request served in a session");
    }

    #[test]
    fn a_request_is_sessionless_as_rmcp_serves_it() {
        assert!(is_sessionless(Some("2026-07-28"), false));
        assert!(is_sessionless(Some("2025-11-25"), true), "an older version asked after server/discover");
        assert!(!is_sessionless(Some("2025-11-25"), false), "a generation with sessions");
        assert!(!is_sessionless(None, true), "no version: not sessionless");
        assert_eq!(session_named(Some("s"), true, |_| true), None, "the header names nothing then");
        assert_eq!(session_named(Some("s"), false, |_| true), Some("s"));
    }

    #[test]
    fn a_credential_a_handle_and_a_session_each_come_before_the_client_identity() {
        let bound = ConversationId::new("session-1");
        let named = |bound, handle, session| conversation_id(bound, handle, session, Some("mcp/1"));
        assert_eq!(named(Some(&bound), Some("cv-1"), Some("s")), Some(bound.clone()));
        assert_eq!(named(None, Some("cv-1"), Some("s")), Some(handle_conversation("cv-1")));
        assert_eq!(named(None, None, Some("s")), Some(session_conversation("s")));
        assert_eq!(named(None, None, None), Some(client_conversation("mcp/1")));
        assert_eq!(conversation_id(None, None, None, None), None, "a conversation of its own");
    }
}
