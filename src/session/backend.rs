//! The one small trait every session backend implements, and what a backend reports.
//!
//! A backend connects (starts its agent, opens or re-attaches the backend's session) and returns a [`Link`]: the
//! session core sends prompts and cancels through it, and the backend reports what happens through an
//! [`EventSink`], in the order it happened. The core owns everything else: one turn at a time, status, messages,
//! timeouts, end and resume.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::error::ToolError;

/// A boxed, sendable future.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Where a backend reports what happens. Called from the backend's tasks; never blocks.
pub(crate) type EventSink = Arc<dyn Fn(BackendEvent) + Send + Sync>;

/// Where an agent process reaches the game's tools: the MCP endpoint and the session's bearer credential for it.
#[derive(Clone)]
pub(crate) struct McpEndpoint {
    #[cfg_attr(not(feature = "acp"), allow(dead_code))]
    pub url: String,
    pub credential: String,
    /// The game's own token (every conversation's, never revoked): kept out of an agent process's environment.
    #[cfg_attr(not(feature = "acp"), allow(dead_code))]
    pub game_token: String,
}

/// The longest an agent is given to answer `session/close` (or an OpenAI-compatible turn to wind down) once the
/// game exits: the exit's time for sessions (5 s) also stops the agent (up to 3 s) and removes the session's folder.
pub(crate) const EXIT_CLOSE: Duration = Duration::from_secs(1);

/// How long a closing session's agent is given to answer `session/close` (or its turn to wind down): the
/// session's close timeout, and at most [`EXIT_CLOSE`] once the game's exit has begun, whether the exit ended the
/// session or found its end (the player's `end`, a `forget`, a failure's wind-down) already under way.
#[derive(Clone, Debug)]
pub(crate) struct CloseWithin {
    timeout: Duration,
    at_exit: Duration,
    exiting: CancellationToken,
}

impl CloseWithin {
    pub(crate) fn new(timeout: Duration, exiting: CancellationToken) -> Self {
        Self { timeout, at_exit: EXIT_CLOSE, exiting }
    }

    /// The same bound with `more` time on both clocks (for what comes after the close: the agent's stop).
    #[cfg_attr(not(feature = "acp"), allow(dead_code))]
    pub(crate) fn and(&self, more: Duration) -> Self {
        Self {
            timeout: self.timeout.saturating_add(more),
            at_exit: self.at_exit.saturating_add(more),
            exiting: self.exiting.clone(),
        }
    }

    /// Runs `work` within the bound: `None` if it did not finish in time.
    pub(crate) async fn run<F: Future>(&self, work: F) -> Option<F::Output> {
        let exit_cut = async {
            self.exiting.cancelled().await;
            tokio::time::sleep(self.at_exit).await;
        };
        tokio::select! {
            biased;
            done = tokio::time::timeout(self.timeout, work) => done.ok(),
            () = exit_cut => None,
        }
    }
}

/// What a backend needs to open a session.
pub(crate) struct Setup {
    /// The game's MCP endpoint with the session's credential, or why the game serves none (a backend that runs
    /// the agent loop in the game needs none).
    pub mcp: Result<McpEndpoint, String>,
    /// The session's own working directory (empty, under the game's data directory).
    #[cfg_attr(not(feature = "acp"), allow(dead_code))]
    pub working_directory: PathBuf,
    /// The system prompt, if any.
    pub system_prompt: Option<String>,
    /// Re-attach to this backend session instead of creating one.
    pub resume: Option<String>,
    /// When `resume` cannot be honoured (the agent cannot resume, or says it no longer knows the session): start a
    /// new session instead of failing with `SESSION_NOT_FOUND`. Other failures are `AGENT_UNAVAILABLE` either way.
    pub new_if_unresumable: bool,
    /// The session's timeouts.
    pub timeouts: super::SessionTimeouts,
    /// How long the agent is given to close: the session's close timeout, cut short by the game's exit.
    #[cfg_attr(not(feature = "openai"), allow(dead_code))]
    pub close_within: CloseWithin,
    /// The in-process agent side of the host: a backend that runs the agent loop in the game calls tools with it;
    /// an ACP backend cancels the session's calls with it when the player cancels a turn.
    #[cfg_attr(not(any(feature = "openai", feature = "acp")), allow(dead_code))]
    pub agent: crate::agent::AgentHandle,
    /// The session's conversation, under which those calls run.
    #[cfg_attr(not(any(feature = "openai", feature = "acp")), allow(dead_code))]
    pub conversation: crate::ids::ConversationId,
    /// The session's own directory under the game's data directory (`<data_dir>/<id>`), for what the backend keeps.
    #[cfg_attr(not(feature = "openai"), allow(dead_code))]
    pub session_dir: PathBuf,
}

impl Setup {
    /// The MCP endpoint, for a backend whose agent reaches the game's tools over MCP: `AGENT_UNAVAILABLE`, saying
    /// why, when the game serves none.
    #[cfg_attr(not(feature = "acp"), allow(dead_code))]
    pub fn require_mcp(&self) -> Result<&McpEndpoint, ToolError> {
        self.mcp.as_ref().map_err(|why| {
            ToolError::with_code(
                crate::error::ErrorCode::AgentUnavailable,
                format!("the agent reaches the game's tools over MCP, and the game serves none: {why}"),
            )
        })
    }
}

/// How a connection's session came to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Attached {
    /// A new backend session.
    New,
    /// The backend session was re-attached (history kept by the agent, not replayed).
    Resumed,
    /// The backend session was loaded (the agent replayed its history; the replay is not shown again).
    Loaded,
    /// The backend session could not be re-attached, so a new one was started: the agent does not remember
    /// the earlier conversation.
    Replaced,
}

/// A live connection to a backend's session.
pub(crate) trait Link: Send + Sync {
    /// The backend's own id of the session (to resume it later).
    fn backend_session(&self) -> &str;
    /// Sends the player's turn. Its end arrives as [`BackendEvent::TurnEnded`], [`BackendEvent::TurnRefused`] or
    /// [`BackendEvent::TurnFailed`]
    /// with the same `turn`. Called under the session's state lock, like [`cancel`](Self::cancel): it may send
    /// on a channel or spawn a task, never block, and never report through the event sink before it returns.
    fn prompt(&self, turn: u64, blocks: Vec<PromptBlock>) -> Result<(), ToolError>;
    /// Asks the agent to stop the running turn (it still ends it, normally as cancelled).
    fn cancel(&self);
    /// Stops the running turn because its session ends: the game's doing, not the player's. As
    /// [`cancel`](Self::cancel), unless the backend tells the model who stopped the turn (the OpenAI-compatible
    /// one writes it into the history) or leaves the turn's tool calls to the end of the session's conversation
    /// (the ACP one).
    fn stop_for_end(&self) {
        self.cancel();
    }
    /// Closes the connection: ends the backend session first when `end_session` (where the backend offers it,
    /// bounded by `within`), then stops the agent. Resolves when the agent process is gone.
    fn close(&self, end_session: bool, within: CloseWithin) -> BoxFuture<()>;
    /// Stops the agent now, without a word to it: no more model requests or tool calls.
    fn kill(&self);
    /// Resolves once a [killed](Self::kill) connection has written what the game keeps of the session (an
    /// OpenAI-compatible session's history: what the stopped turn said and did), bounded by the close timeout.
    /// Nothing to wait for by default.
    fn settled(&self) -> BoxFuture<()> {
        Box::pin(async {})
    }
}

/// One part of a prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PromptBlock {
    /// Text, sent as one text block exactly as given.
    Text(String),
}

/// Why a turn ended, as the agent said.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopReason {
    /// The agent finished.
    EndTurn,
    /// The model's token limit.
    MaxTokens,
    /// The agent's limit of model requests in one turn.
    MaxTurnRequests,
    /// The model refused.
    Refusal,
    /// The turn was cancelled.
    Cancelled,
    /// A reason this crate does not know.
    Other,
}

impl StopReason {
    /// As it appears in lines and on the wire (`end_turn`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EndTurn => "end_turn",
            Self::MaxTokens => "max_tokens",
            Self::MaxTurnRequests => "max_turn_requests",
            Self::Refusal => "refusal",
            Self::Cancelled => "cancelled",
            Self::Other => "other",
        }
    }
}

impl std::fmt::Display for StopReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the agent reported about its use of the model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the agent's context now.
    pub used_tokens: u64,
    /// The size of its context window, in tokens.
    pub context_tokens: u64,
    /// What the session has cost so far, if the agent says.
    pub cost: Option<Cost>,
}

/// What a session has cost so far, as its agent reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// How much, in `currency`.
    pub amount: f64,
    /// An ISO 4217 currency code (`USD`), or another unit the agent names (`credits`).
    pub currency: String,
}

/// The player's answer to a permission request, or the policy's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PermissionDecision {
    Allow,
    Deny,
    /// The turn was cancelled while the request waited (ACP: a client that cancels a turn answers its pending
    /// permission requests `cancelled`).
    Cancelled,
}

/// A backend's report, in the order things happened.
pub(crate) enum BackendEvent {
    /// A piece of an agent message. `message` is the agent's id for it, if it gives one.
    MessageChunk { message: Option<String>, text: String },
    /// The agent started a tool call of its own: the message before it is complete.
    ToolCall,
    /// Usage, as the agent reported it.
    Usage(Usage),
    /// The agent asks permission; answer through `reply` (dropping it denies). For one of the game's own tools
    /// (`game_tool`: guarded by the host's rules, not by the permission policy) the answer is `Allow` unless the
    /// turn was cancelled. A request that cannot be allowed once (`allow_once` false: an allow would be a standing
    /// one, which neither the player nor the game's policy gives) is denied without asking, or `Cancelled` after a
    /// cancel. `withdrawn` is cancelled when the agent takes the request back: a prompt put to the player is taken
    /// down and settled, then answered `Cancelled`.
    #[cfg_attr(not(feature = "acp"), allow(dead_code))]
    Permission {
        tool: String,
        /// The action's kind and input, if the agent said ([`PermissionRequested`](crate::PermissionRequested)).
        kind: Option<String>,
        input: Option<String>,
        /// The files and changes it names ([`PermissionRequested::details`](crate::PermissionRequested::details)).
        details: Vec<crate::PermissionDetail>,
        game_tool: bool,
        allow_once: bool,
        reply: oneshot::Sender<PermissionDecision>,
        withdrawn: tokio_util::sync::CancellationToken,
    },
    /// The turn ended.
    TurnEnded { turn: u64, stop: StopReason },
    /// The turn failed and the session with it: the agent is stopped and the status is `Error` until `resume`
    /// (an OpenAI-compatible endpoint that refused its API key; a panic in the turn's loop; an ACP agent that no
    /// longer holds the session).
    #[cfg_attr(not(any(feature = "acp", feature = "openai")), allow(dead_code))]
    TurnFailed { turn: u64, error: ToolError },
    /// The agent answered the turn with an error (its provider's rate limit or overload, a context too long) and
    /// is still running: the turn fails with `error`, and the session takes the next text.
    #[cfg_attr(not(any(feature = "acp", feature = "openai")), allow(dead_code))]
    TurnRefused { turn: u64, error: ToolError },
    /// Something the player should know that fails nothing (an OpenAI-compatible session's history that could
    /// not be written; an ACP agent's sign-in made again that failed): shown as a `ChatError`.
    #[cfg_attr(not(any(feature = "acp", feature = "openai")), allow(dead_code))]
    Notice(ToolError),
    /// The connection ended (the agent exited or closed its output); `None` if the backend was asked to close.
    #[cfg_attr(not(feature = "acp"), allow(dead_code))]
    Exited(Option<ToolError>),
}
