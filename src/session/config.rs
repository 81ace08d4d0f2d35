//! What a game says when it creates an in-game agent session: which backend, how long to wait for it, what the
//! agent may do.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How to create an in-game agent session: its backend, its lifecycle, its timeouts and its permission policy.
///
/// ```
/// # use bevy_agent_tools::session::{SessionConfig, PermissionPolicy};
/// let config = SessionConfig::acp("npx", ["-y", "@agentclientprotocol/claude-agent-acp"])
///     .system_prompt("You help the player build in a voxel world. Use the game's tools.")
///     .permissions(PermissionPolicy::AskPlayer)
///     .auto_end_on_disconnect(false);
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionConfig {
    /// Which agent answers.
    pub backend: SessionBackend,
    /// End the session (and the agent's session with it) when the game disconnects from it, which is when the
    /// game exits. Default `true`. With `false` the agent keeps the session, and the game can store its id and
    /// [`resume_session`](crate::session::AgentSessions::resume_session) it after a restart.
    pub auto_end_on_disconnect: bool,
    /// Instructions for the agent, sent as its system prompt where the backend supports one, else as a separate
    /// block before the player's first text. Never mixed into the player's text.
    pub system_prompt: Option<String>,
    /// How long each step may take before the session gives up on the agent.
    pub timeouts: SessionTimeouts,
    /// What to answer when the agent asks permission for one of its own actions.
    pub permissions: PermissionPolicy,
    /// Whether each text the player sends asks the open world's `WorldLifecycle::input_context` for an
    /// observation of the moment (rule H14), sent to the agent in a block of its own. Default `true`. It waits for
    /// the next frame (at most 500 ms); games without an `input_context` can turn it off.
    #[serde(default = "yes")]
    pub input_context: bool,
}

fn yes() -> bool {
    true
}

impl SessionConfig {
    /// A session with an ACP agent started as `program args...` (it inherits the game's environment, so `PATH`,
    /// `HOME` and its API keys reach it).
    pub fn acp(program: impl Into<String>, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self::new(SessionBackend::Acp(AcpAgentCommand {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            auth_method: None,
        }))
    }

    /// A session with `backend` and the defaults.
    pub fn new(backend: SessionBackend) -> Self {
        Self {
            backend,
            auto_end_on_disconnect: true,
            system_prompt: None,
            timeouts: SessionTimeouts::default(),
            permissions: PermissionPolicy::Deny,
            input_context: true,
        }
    }

    /// Whether to send the world's observation with each text (default `true`): see
    /// [`input_context`](Self::input_context).
    pub fn input_context(mut self, ask: bool) -> Self {
        self.input_context = ask;
        self
    }

    /// Whether the session ends when the game disconnects (default `true`).
    pub fn auto_end_on_disconnect(mut self, auto_end: bool) -> Self {
        self.auto_end_on_disconnect = auto_end;
        self
    }

    /// The agent's system prompt: the game's instructions. An agent that takes a system prompt (ACP's
    /// `sessionCapabilities.systemPrompt`; Claude's adapter, in `_meta.systemPrompt.append`, added to Claude Code's
    /// own; every OpenAI-compatible endpoint) gets it as one; another gets it as a
    /// block `[Instructions from the game]` at the start of the session's first turn, sent again with the next
    /// turn until a turn that carried it ended (one refused, or cut short by the agent's crash, did not deliver it;
    /// the session's record keeps this across restarts).
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }

    /// The timeouts.
    pub fn timeouts(mut self, timeouts: SessionTimeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// The permission policy (default [`PermissionPolicy::Deny`]).
    pub fn permissions(mut self, policy: PermissionPolicy) -> Self {
        self.permissions = policy;
        self
    }

    /// Signs in to the agent with `method`, one of the methods it offers, when the agent says it needs a sign-in to
    /// create or resume the session (ACP `authenticate`, then the session is asked for again): for example Codex's
    /// adapter's `api-key`, which reads `CODEX_API_KEY` or `OPENAI_API_KEY` from the agent's environment (and stores it
    /// as Codex's login; the adapter's 0.x releases call it `openai-api-key`). An agent that needs none is not signed
    /// in. Without a method the game never signs in on its own (a method may open a browser or bill an API key): an
    /// agent that needs a sign-in fails the start, or the turn, with `AGENT_UNAVAILABLE` listing the methods it offers
    /// (details `auth_required`, `auth_methods`). Only for ACP agents; other backends ignore it.
    pub fn auth_method(mut self, method: impl Into<String>) -> Self {
        #[allow(irrefutable_let_patterns)]
        if let SessionBackend::Acp(command) = &mut self.backend {
            command.auth_method = Some(method.into());
        }
        self
    }

    /// Sets an environment variable for the agent process (on top of the game's own environment). Its value is
    /// kept in the session's record on disk (readable only by the user) so that a resume can start the same
    /// agent: pass secrets through the game's environment instead. Only for ACP agents; other backends ignore it.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        #[allow(irrefutable_let_patterns)]
        if let SessionBackend::Acp(command) = &mut self.backend {
            command.env.push((name.into(), value.into()));
        }
        self
    }
}

/// Which agent a session talks to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SessionBackend {
    /// An agent speaking the Agent Client Protocol over its standard input and output, started as a child
    /// process: Claude Code through `@agentclientprotocol/claude-agent-acp`, Codex through
    /// `@agentclientprotocol/codex-acp`, `gemini --acp`, Goose, ...
    Acp(AcpAgentCommand),
    /// An OpenAI-compatible chat completions endpoint (Ollama, llama.cpp, LM Studio, vLLM, Player2, OpenAI): the
    /// game runs the agent loop itself (feature `openai`).
    #[cfg(feature = "openai")]
    OpenAi(crate::session::OpenAiEndpoint),
}

impl SessionBackend {
    /// Whether the agent reaches the game's tools over MCP (an agent process), or the game calls them for it in
    /// process (and the session needs no MCP credential).
    pub(crate) fn reaches_tools_over_mcp(&self) -> bool {
        match self {
            SessionBackend::Acp(_) => true,
            #[cfg(feature = "openai")]
            SessionBackend::OpenAi(_) => false,
        }
    }
}

/// The command line of an ACP agent (made with [`SessionConfig::acp`]; fields may be added).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AcpAgentCommand {
    /// The program (looked up on `PATH`).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment variables, on top of the game's environment.
    pub env: Vec<(String, String)>,
    /// The sign-in method to use, one the agent offers (see [`SessionConfig::auth_method`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_method: Option<String>,
}

impl std::fmt::Display for AcpAgentCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.program)?;
        for arg in &self.args {
            write!(f, " {arg}")?;
        }
        Ok(())
    }
}

/// How long a session waits for its agent. Every wait is bounded: no turn waits forever, whatever the agent
/// process does.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionTimeouts {
    /// Starting the agent, up to its answer to `initialize` and to the session's creation or resumption (not
    /// counting a sign-in: see `sign_in`).
    /// For an OpenAI-compatible endpoint, how long it is asked again while it answers `503` (llama.cpp's server
    /// loading its model) or refuses connections (vLLM listens only once its model has loaded).
    /// Default 30 s (agents started through `npx` can be slow the first time).
    pub start: Duration,
    /// One turn, from `send_text` to the agent's end of the turn. Default 10 minutes. A turn past it fails with
    /// `TIMEOUT`, and the agent, which no longer answers, is stopped (status `Error`; `resume` restarts it).
    pub turn: Duration,
    /// After a cancel, how long the agent has to end the turn. Default 10 s; past it, as for `turn` (an agent that
    /// ignores the cancel is stopped: it could go on calling tools).
    pub cancel_grace: Duration,
    /// How long the player has to answer a permission request ([`PermissionPolicy::AskPlayer`]) before it is
    /// denied. Default 60 s.
    pub permission: Duration,
    /// How long `end` waits for the agent to close the session before the process is stopped anyway (and an
    /// OpenAI-compatible turn stopped by an end or a failure has to wind down). Default 2 s; at most 1 s from the
    /// game's exit on, for ends the exit starts and ends already under way (`end`, `forget`) alike: the exit's time
    /// for sessions (5 s) also stops their agents and removes the folders of those that ended.
    pub close: Duration,
    /// How long signing in to an ACP agent ([`SessionConfig::auth_method`]) may take: a method may open a
    /// browser and wait for the person. Not counted in `start`. Default 5 minutes.
    #[serde(default = "default_sign_in")]
    pub sign_in: Duration,
}

/// [`SessionTimeouts::sign_in`]'s default, also for a session kept before it existed.
fn default_sign_in() -> Duration {
    Duration::from_secs(300)
}

impl Default for SessionTimeouts {
    fn default() -> Self {
        Self {
            start: Duration::from_secs(30),
            turn: Duration::from_secs(600),
            cancel_grace: Duration::from_secs(10),
            permission: Duration::from_secs(60),
            close: Duration::from_secs(2),
            sign_in: default_sign_in(),
        }
    }
}

/// What to answer when the agent asks permission for one of its own actions (ACP `session/request_permission`:
/// a coding agent about to run a command, edit a file, or call a tool it considers sensitive). The game's own
/// tools are guarded by the host's rules, not by this: a request for one of them (as Claude Code's adapter asks
/// before each MCP tool, naming it `mcp__game__TOOL`; as Gemini CLI asks, titled `TOOL (game MCP Server)`; as
/// Codex asks before each one not marked read-only) is allowed without asking, whatever the policy. A model
/// behind the OpenAI-compatible backend has no actions of its own (it can only call the game's tools), so with
/// that backend the policy is never consulted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionPolicy {
    /// Deny every request (the agent's reject option, else the request is cancelled). The default.
    #[default]
    Deny,
    /// Allow every request, each once (the agent's one-time allow: never its "allow always", so every later
    /// request is asked again; an agent that offers no one-time allow is refused). Only for agents you trust with
    /// the machine.
    Allow,
    /// Ask the player: a [`PermissionRequested`](crate::session::PermissionRequested) message is written, and the
    /// game answers with [`AgentSessions::answer_permission`](crate::session::AgentSessions::answer_permission)
    /// or a [`PermissionAnswer`](crate::session::PermissionAnswer) message. Unanswered within
    /// [`SessionTimeouts::permission`], it is denied. However it ends (answered, timed out, or withdrawn when its
    /// turn is cancelled or its session fails or ends), a [`PermissionSettled`](crate::session::PermissionSettled)
    /// message follows: take the prompt down then.
    AskPlayer,
}

/// Where sessions keep their records and working directories: `<data_dir>/<session id>/`.
pub(crate) fn session_dir(data_dir: &std::path::Path, id: &str) -> PathBuf {
    data_dir.join(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_config_kept_before_a_timeout_existed_still_reads_with_its_default() {
        let config = SessionConfig::acp("agent", Vec::<String>::new());
        let mut kept = serde_json::to_value(&config).expect("JSON");
        let timeouts = kept["timeouts"].as_object_mut().expect("the timeouts");
        assert!(timeouts.remove("sign_in").is_some(), "written now");
        let read: SessionConfig = serde_json::from_value(kept).expect("a record of an earlier version reads");
        assert_eq!(read.timeouts.sign_in, SessionTimeouts::default().sign_in);
        assert_eq!(read.timeouts, config.timeouts);
    }
}
