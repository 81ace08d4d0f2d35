//! What particular agents need beyond the protocol, in one place. The protocol's `_meta` is ignored by agents
//! that do not know a key, so these never hurt another agent.
//!
//! - Claude Code's adapter (`claude-agent-acp`): its built-in tools (shell, file edits, web) are switched off
//!   with `_meta.claudeCode.options.tools = []` (and the older adapters' `disableBuiltInTools`): in a game, the
//!   agent acts through the game's tools only. The game's tools are allowed by a standing rule
//!   (`_meta.claudeCode.options.allowedTools = ["mcp__game"]`): in its default permission mode Claude Code asks
//!   before each MCP tool it has no rule for, and the game's tools are guarded by the host's rules instead.

use serde_json::{json, Map, Value};

/// The `_meta` for `session/new`, `session/resume` and `session/load` for the agent named `agent`.
pub(crate) fn session_meta(agent: Option<&str>) -> Option<Map<String, Value>> {
    let name = agent?.to_ascii_lowercase();
    if name.contains("claude") {
        let game_tools = format!("mcp__{}", super::updates::GAME_SERVER);
        let options = json!({ "tools": [], "allowedTools": [game_tools] });
        let meta = json!({ "disableBuiltInTools": true, "claudeCode": { "options": options } });
        return meta.as_object().cloned();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_gets_its_built_in_tools_switched_off_and_others_get_nothing() {
        let meta = session_meta(Some("@agentclientprotocol/claude-agent-acp")).unwrap();
        assert_eq!(meta["claudeCode"]["options"]["tools"], json!([]));
        assert_eq!(meta["claudeCode"]["options"]["allowedTools"], json!(["mcp__game"]));
        assert_eq!(session_meta(Some("gemini-cli")), None);
        assert_eq!(session_meta(None), None);
    }
}
