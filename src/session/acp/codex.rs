//! Codex's approvals of calls to the game's tools. Codex asks before any MCP tool not marked read-only (unless the
//! person chose full access), as an elicitation of its own, which its ACP adapter turns into a permission request
//! that names no tool the way Claude's and Gemini's do ([`is_game_tool`](super::updates::is_game_tool)). Two
//! generations of the adapter ask in two shapes; both are read here, and only from an agent that says it is
//! Codex's adapter (other agents may put a model's own arguments where Codex puts its own fields).
//!
//! - codex-acp 1.x (TypeScript, `@agentclientprotocol/codex-acp`): a `tool_call` update announces the call first
//!   (`_meta.is_mcp_tool_call`, raw input `{server, tool, arguments}`, `server` set by Codex from the connection
//!   the call goes to: a model cannot write it), then the request names that call's id, of kind `execute`, marked
//!   `_meta.is_mcp_tool_approval` on the request. Without the announcement, the request's id is
//!   `elicitation-<server>` and its raw input `{serverName, schema}`. [`CodexCalls`] remembers the announcements.
//! - The Rust codex-acp (0.x): a request of no kind titled `Approve <the tool's title>`, whose raw input is Codex's
//!   elicitation event: `server_name`, an `id` of `mcp_tool_call_approval_` and the request's tool call id, and a
//!   form whose `_meta.codex_approval_kind` is `mcp_tool_call`.
//!
//! An MCP server can send an elicitation of those shapes too, under its own name only, and the game's server sends
//! none. Where the tool's name is not in the request, any tool of the game's server is recognised: all of them the
//! game's, guarded by the host's rules.

use std::collections::VecDeque;
use std::sync::Arc;

use agent_client_protocol::v1::schema::{RequestPermissionRequest, ToolCall, ToolCallUpdate, ToolKind};
use parking_lot::Mutex;
use serde_json::Value;

use super::updates::GAME_SERVER;

/// How many announced calls are remembered: a request follows its call's announcement at once, and a turn runs
/// its calls one approval at a time.
const REMEMBERED: usize = 64;

/// Codex's calls to MCP tools as its `tool_call` updates announced them: (tool call id, the tool if it is one of
/// the game's server). The latest announcement of an id stands (a provider may reuse ids from turn to turn).
#[derive(Clone, Default)]
pub(crate) struct CodexCalls(Arc<Mutex<VecDeque<Announced>>>);

/// One announcement: the call's id, and the game's tool it is for, if it is one of the game's server.
type Announced = (String, Option<String>);

impl CodexCalls {
    /// Remembers `call` if it is Codex's announcement of a call to an MCP tool: with the tool if it is one of the
    /// game's server, else as another server's (replacing what an earlier announcement of its id said).
    pub(crate) fn heard(&self, call: &ToolCall) {
        let marked = call.meta.as_ref().and_then(|meta| meta.get("is_mcp_tool_call")) == Some(&Value::Bool(true));
        if !marked {
            return;
        }
        let raw = |field: &str| call.raw_input.as_ref().and_then(|raw| raw.get(field)).and_then(Value::as_str);
        let game_tool = match (raw("server"), raw("tool")) {
            (Some(GAME_SERVER), Some(tool)) if call.kind == ToolKind::Execute => Some(tool.to_string()),
            _ => None,
        };
        let id = &*call.tool_call_id.0;
        let mut calls = self.0.lock();
        calls.retain(|(call, _)| call != id);
        if calls.len() == REMEMBERED {
            calls.pop_front();
        }
        calls.push_back((id.to_string(), game_tool));
    }

    /// Takes out what the announcement of call `id` said: the game's tool it is for, if it is one. Each
    /// announcement answers one request.
    pub(crate) fn take(&self, id: &str) -> Option<String> {
        let mut calls = self.0.lock();
        let at = calls.iter().position(|(call, _)| call == id)?;
        calls.remove(at).and_then(|(_, tool)| tool)
    }
}

/// Whether `request`, from the agent named `agent` (in its answer to `initialize`), is Codex's approval of a call
/// to a tool of the game's server (`registered` says whether a name is one of its tools). `announced` is the
/// game's tool that Codex announced the request's call for ([`CodexCalls::take`]).
pub(crate) fn approves_game_tool(
    request: &RequestPermissionRequest,
    agent: Option<&str>,
    announced: Option<&str>,
    registered: impl Fn(&str) -> bool,
) -> bool {
    agent.is_some_and(|agent| agent.to_ascii_lowercase().contains("codex"))
        && (approves_announced_call(request, announced, registered)
            || approves_by_elicitation_event(&request.tool_call))
}

/// codex-acp 1.x's shape.
fn approves_announced_call(
    request: &RequestPermissionRequest,
    announced: Option<&str>,
    registered: impl Fn(&str) -> bool,
) -> bool {
    let marked = request.meta.as_ref().and_then(|meta| meta.get("is_mcp_tool_approval")) == Some(&Value::Bool(true));
    let fields = &request.tool_call.fields;
    if !marked || fields.kind != Some(ToolKind::Execute) || fields.name.is_some() {
        return false;
    }
    let id = &*request.tool_call.tool_call_id.0;
    let announced = announced.is_some_and(registered);
    let server = fields.raw_input.as_ref().and_then(|raw| raw.get("serverName")).and_then(Value::as_str);
    let unannounced = id.strip_prefix("elicitation-") == Some(GAME_SERVER) && server == Some(GAME_SERVER);
    announced || unannounced
}

/// The Rust codex-acp's shape.
fn approves_by_elicitation_event(call: &ToolCallUpdate) -> bool {
    let fields = &call.fields;
    let (Some(title), Some(raw)) = (fields.title.as_deref(), fields.raw_input.as_ref()) else { return false };
    let text = |pointer: &str| raw.pointer(pointer).and_then(Value::as_str);
    let approval_of_this_call = text("/id")
        .and_then(|id| id.strip_prefix("mcp_tool_call_approval_"))
        .is_some_and(|id| *id == *call.tool_call_id.0);
    title.starts_with("Approve ")
        && fields.name.is_none()
        && fields.kind.is_none()
        && text("/server_name") == Some(GAME_SERVER)
        && approval_of_this_call
        && text("/request/mode") == Some("form")
        && text("/request/_meta/codex_approval_kind") == Some("mcp_tool_call")
}

#[cfg(test)]
mod tests {
    use agent_client_protocol::v1::schema::{SessionId, ToolCallUpdateFields};

    use super::*;

    const CODEX: Option<&str> = Some("codex-acp");

    fn request(call: ToolCallUpdate, approval: bool) -> RequestPermissionRequest {
        let request = RequestPermissionRequest::new(SessionId::new("s"), call, vec![]);
        match approval {
            true => request.meta(serde_json::json!({ "is_mcp_tool_approval": true }).as_object().cloned()),
            false => request,
        }
    }

    #[test]
    fn a_rust_codex_acp_approval_is_recognised_by_the_server_codex_names_in_its_own_elicitation() {
        // As codex-acp sends it: `raw_input` is Codex's `ElicitationRequestEvent`.
        let event = |server: &str, id: &str, mode: &str, kind: &str| {
            serde_json::json!({
                "turn_id": "1",
                "server_name": server,
                "id": id,
                "request": {
                    "mode": mode,
                    "_meta": { "codex_approval_kind": kind, "persist": ["session", "always"], "tool_params": {"x": 1} },
                    "message": "Allow the game MCP server to run tool \"place_block\"?",
                    "requested_schema": { "type": "object", "properties": {} }
                }
            })
        };
        let asked = |title: &str, raw: serde_json::Value| {
            ToolCallUpdate::new("call_7", ToolCallUpdateFields::new().title(title).raw_input(raw))
        };
        let codex = event("game", "mcp_tool_call_approval_call_7", "form", "mcp_tool_call");
        assert!(old_shape(&asked("Approve MCP tool call", codex.clone()), CODEX));
        assert!(old_shape(&asked("Approve Place a block", codex.clone()), CODEX));
        assert!(old_shape(&asked("Approve MCP tool call", codex.clone()), Some("Codex CLI")));
        // Another server's tool, an elicitation of another kind or mode, an id not of this call's approval.
        for raw in [
            event("other", "mcp_tool_call_approval_call_7", "form", "mcp_tool_call"),
            event("game ", "mcp_tool_call_approval_call_7", "form", "mcp_tool_call"),
            event("game", "mcp_tool_call_approval_call_7", "form", "form"),
            event("game", "mcp_tool_call_approval_call_7", "url", "mcp_tool_call"),
            event("game", "mcp_tool_call_approval_call_8", "form", "mcp_tool_call"),
            event("game", "call_7", "form", "mcp_tool_call"),
            serde_json::json!({ "server_name": "game", "command": ["rm", "-rf", "/"] }),
            serde_json::json!("game"),
        ] {
            assert!(!old_shape(&asked("Approve MCP tool call", raw.clone()), CODEX), "{raw}");
        }
        // Another agent, whose raw input may be a model's own arguments: never read so.
        for agent in [Some("@agentclientprotocol/claude-agent-acp"), Some("gemini-cli"), None] {
            assert!(!old_shape(&asked("Approve MCP tool call", codex.clone()), agent), "{agent:?}");
        }
        // Not titled as Codex's approvals, or of a kind (a shell command's: `execute`), or named otherwise.
        let with = |fields: ToolCallUpdateFields| ToolCallUpdate::new("call_7", fields);
        let fields = ToolCallUpdateFields::new().raw_input(codex.clone());
        assert!(!old_shape(&with(fields.clone().title("Run place_block")), CODEX));
        let titled = fields.title("Approve MCP tool call");
        assert!(!old_shape(&with(titled.clone().kind(ToolKind::Execute)), CODEX));
        assert!(!old_shape(&with(titled.clone().kind(ToolKind::Other)), CODEX));
        assert!(!old_shape(&with(titled.name("shell")), CODEX));
        let bare = ToolCallUpdateFields::new().title("Approve MCP tool call");
        assert!(!old_shape(&with(bare), CODEX), "no raw input");
    }

    /// The Rust adapter's requests: no announced calls, any tool of the game's server.
    fn old_shape(call: &ToolCallUpdate, agent: Option<&str>) -> bool {
        approves_game_tool(&request(call.clone(), false), agent, None, |_| false)
    }

    /// As codex-acp 1.x announces a call to an MCP tool (`createMcpToolCallUpdate`).
    fn announced(id: &str, server: &str, tool: &str, marked: bool) -> ToolCall {
        let call = ToolCall::new(id.to_string(), format!("mcp.{server}.{tool}"))
            .kind(ToolKind::Execute)
            .raw_input(serde_json::json!({ "server": server, "tool": tool, "arguments": { "x": 1 } }));
        match marked {
            true => call.meta(serde_json::json!({ "is_mcp_tool_call": true }).as_object().cloned()),
            false => call,
        }
    }

    #[test]
    fn a_codex_acp_1_approval_is_recognised_by_the_call_it_announced_to_the_games_server() {
        let registered = |tool: &str| tool == "place_block";
        // As `buildPermissionRequest` asks for a call it announced: its id, `execute`, nothing else.
        let pending = || ToolCallUpdateFields::new().kind(ToolKind::Execute);
        let asked = |id: &str, fields: ToolCallUpdateFields, approval: bool| {
            request(ToolCallUpdate::new(id.to_string(), fields), approval)
        };
        let calls = CodexCalls::default();
        let approves = |request: &RequestPermissionRequest, agent: Option<&str>, announced: Option<&str>| {
            approves_game_tool(request, agent, announced, registered)
        };
        calls.heard(&announced("item_1", "game", "place_block", true));
        let tool = calls.take("item_1");
        assert_eq!(tool.as_deref(), Some("place_block"));
        assert_eq!(calls.take("item_1"), None, "an announcement answers one request");
        let tool = tool.as_deref();
        assert!(approves(&asked("item_1", pending(), true), CODEX, tool));
        assert!(approves(&asked("item_1", pending(), true), Some("Codex"), tool));
        // Not marked as an MCP tool approval, of another kind, for no announced call, from another agent.
        assert!(!approves(&asked("item_1", pending(), false), CODEX, tool));
        assert!(!approves(&asked("item_1", ToolCallUpdateFields::new().kind(ToolKind::Other), true), CODEX, tool));
        assert!(!approves(&asked("item_2", pending(), true), CODEX, None));
        for agent in [Some("claude-agent-acp"), None] {
            assert!(!approves(&asked("item_1", pending(), true), agent, tool));
        }
        // Announcements that are not of a call to a registered tool of the game's server.
        for (id, server, tool, marked) in [
            ("item_3", "other", "place_block", true),
            ("item_4", "game", "place_block", false),
            ("item_5", "game", "unknown", true),
        ] {
            calls.heard(&announced(id, server, tool, marked));
            assert!(!approves(&asked(id, pending(), true), CODEX, calls.take(id).as_deref()), "{id}");
        }
        let dynamic = ToolCall::new("item_6".to_string(), "mcp.game.place_block")
            .kind(ToolKind::Execute)
            .raw_input(serde_json::json!({ "arguments": {} }))
            .meta(serde_json::json!({ "is_mcp_tool_call": true }).as_object().cloned());
        calls.heard(&dynamic);
        assert_eq!(calls.take("item_6"), None, "not a call to the game's server");

        // An id a provider reuses: the latest announcement stands, another server's call is not the game's.
        calls.heard(&announced("call_0", "game", "place_block", true));
        calls.heard(&announced("call_0", "filesystem", "write", true));
        assert_eq!(calls.take("call_0"), None);

        // Not announced: Codex's approval for the game's server by the elicitation's own id and server.
        let unannounced = |server: &str| {
            ToolCallUpdateFields::new()
                .kind(ToolKind::Execute)
                .raw_input(serde_json::json!({ "serverName": server, "schema": { "type": "object" } }))
        };
        assert!(approves(&asked("elicitation-game", unannounced("game"), true), CODEX, None));
        assert!(!approves(&asked("elicitation-game", unannounced("game"), false), CODEX, None));
        assert!(!approves(&asked("elicitation-other", unannounced("other"), true), CODEX, None));
        assert!(!approves(&asked("elicitation-game", unannounced("other"), true), CODEX, None));
        assert!(!approves(&asked("elicitation-other", unannounced("game"), true), CODEX, None));
    }

    #[test]
    fn only_the_latest_codex_calls_are_remembered() {
        let calls = CodexCalls::default();
        for n in 0..=REMEMBERED {
            calls.heard(&announced(&format!("item_{n}"), "game", "place_block", true));
        }
        assert_eq!(calls.take("item_0"), None);
        assert_eq!(calls.take("item_1").as_deref(), Some("place_block"));
    }
}
