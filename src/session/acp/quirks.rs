//! What particular agents need beyond the protocol, in one place. The protocol's `_meta` is ignored by agents
//! that do not know a key, and the environment's variables by agents that do not read them, so these never hurt
//! another agent. (Claude's adapter is known by its name; one older than October 2025, which did not read
//! `_meta.systemPrompt`, would not get the game's system prompt at all.)
//!
//! - Gemini CLI (`gemini --acp`): `GEMINI_CLI_TRUST_WORKSPACE=true` ([`environment`]).
//! - Claude Code's adapter (`claude-agent-acp`): its built-in tools (shell, file edits, web) are switched off
//!   with `_meta.claudeCode.options.tools = []` (and the older adapters' `disableBuiltInTools`): in a game, the
//!   agent acts through the game's tools only. The game's tools are allowed by a standing rule
//!   (`_meta.claudeCode.options.allowedTools = ["mcp__game"]`): in its default permission mode Claude Code asks
//!   before each MCP tool it has no rule for, and the game's tools are guarded by the host's rules instead. It
//!   offers no `systemPrompt` session capability but reads `_meta.systemPrompt.append` (since October 2025), added
//!   to Claude Code's own: there the game's system prompt stays for the whole session, where a first turn's
//!   instructions would be summarised away when Claude Code compacts a long conversation.

use serde_json::{json, Map, Value};

/// Variables set in every agent's environment (unless the game's environment sets them, or the session's command
/// does), for agents that would otherwise not reach the game's tools. Gemini CLI starts no MCP server in a folder
/// it does not trust, and in ACP mode nothing asks the player to trust one: it is told to trust the session's
/// workspace, a folder of the game's that holds nothing of the agent's.
pub(crate) fn environment() -> Vec<(String, String)> {
    [("GEMINI_CLI_TRUST_WORKSPACE", "true")]
        .into_iter()
        .filter(|(name, _)| std::env::var_os(name).is_none())
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

/// The `_meta` for `session/new`, `session/resume` and `session/load` for the agent named `agent`, and whether it
/// carries `system_prompt` (the game's, which the agent does not take as ACP's `systemPrompt`).
pub(crate) fn session_meta(agent: Option<&str>, system_prompt: Option<&str>) -> (Option<Map<String, Value>>, bool) {
    let name = agent.unwrap_or_default().to_ascii_lowercase();
    if name.contains("claude") {
        let game_tools = format!("mcp__{}", super::updates::GAME_SERVER);
        let options = json!({ "tools": [], "allowedTools": [game_tools] });
        let mut meta = json!({ "disableBuiltInTools": true, "claudeCode": { "options": options } });
        if let Some(prompt) = system_prompt {
            meta["systemPrompt"] = json!({ "append": prompt });
        }
        return (meta.as_object().cloned(), system_prompt.is_some());
    }
    (None, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_gets_its_built_in_tools_switched_off_and_others_get_nothing() {
        let (meta, carried) = session_meta(Some("@agentclientprotocol/claude-agent-acp"), None);
        let meta = meta.unwrap();
        assert_eq!(meta["claudeCode"]["options"]["tools"], json!([]));
        assert_eq!(meta["claudeCode"]["options"]["allowedTools"], json!(["mcp__game"]));
        assert!(!carried && !meta.contains_key("systemPrompt"));
        assert_eq!(session_meta(Some("gemini-cli"), Some("Be brief.")), (None, false));
        assert_eq!(session_meta(None, Some("Be brief.")), (None, false));
    }
}
