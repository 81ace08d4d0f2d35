//! In-game agent sessions (DESIGN §6b): the player talks to an AI agent from inside the game.
//!
//! The game creates a session with a backend ([`SessionConfig`]: an ACP agent such as Claude Code's or Codex's
//! adapter, started as a child process, or an OpenAI-compatible endpoint with feature `openai`), the player sends
//! it text, chat streams back as Bevy messages, and the agent's tool calls run in the game under the session's
//! own conversation, so every host rule (H1–H14) applies to them unchanged: an ACP agent's through the plugin's
//! MCP server with a credential of the session's own, an OpenAI-compatible model's in process.
//!
//! ```no_run
//! # use bevy::prelude::*;
//! # use bevy_agent_tools::session::*;
//! # async fn demo(sessions: AgentSessions) -> Result<(), bevy_agent_tools::ToolError> {
//! let session = sessions.create(SessionConfig::acp("gemini", ["--acp"])).await?;
//! let turn = session.send_text("build a tower next to me").await?;
//! println!("{}: {:?}", turn.stop_reason.as_str(), turn.final_message);
//! session.end().await;
//! # Ok(()) }
//! ```
//!
//! The rules:
//!
//! - **The session is a conversation** (§6): its id is the conversation's, and its status is the conversation's
//!   status machine, published as [`ConversationStatusChanged`](crate::ConversationStatusChanged) with sequence
//!   numbers. `send_text` sets `Running` (source `Host`); while one of its agent's tool calls runs in the game it
//!   is `WaitingToolResult` (`Host`); the turn's end, as the agent reports it, sets `Idle` (source `Agent`; also
//!   a turn the agent or endpoint answered with an error of its own: the session stays); a backend failure the
//!   game detects (the agent exited, a turn timed out, an endpoint refused the API key) sets `Error` (`Host`); `end`
//!   sets `Ended`
//!   (`Host`), once.
//!   Status changes and chat events are published in the order the session decided them, whatever thread they
//!   came from: a turn's `Idle` never lands after the next turn's `Running`, nor a failure's `Error` after the
//!   resume that followed it.
//! - **S1, one turn**: `send_text` during a turn is refused with `SESSION_BUSY`, and nothing is sent.
//! - **S2, one outcome**: every `send_text` ends exactly once: the turn's end (with its [`StopReason`]), an error
//!   (`AGENT_UNAVAILABLE` if the agent crashed, with its exit status and the tail of its stderr), `TIMEOUT`,
//!   `SESSION_BUSY` or `SESSION_ENDED`. Every wait is bounded ([`SessionTimeouts`]).
//! - **S3**: ending a session never touches the visit; a visit ending never ends a session (the agent's tool call
//!   in flight gets `VISIT_ENDED`, the turn goes on and the agent reads that result).
//! - **S4**: the agent process never outlives the game (on `AppExit` it gets its stdin closed, then `SIGTERM`, then
//!   `SIGKILL`, within 5 s), and gets no capability the game did not grant: no file system or terminal from the
//!   client side, its own empty working directory, and (an ACP agent; an OpenAI-compatible model's tool calls run
//!   in process and need none) a credential that reaches only this game's tools and dies with the session. Its
//!   own permission requests go to a [`PermissionPolicy`] (default: deny).
//! - **End and resume**: [`AgentSession::end`] ends it (pending work rejects with `SESSION_ENDED`; ending again
//!   does nothing); [`AgentSession::resume`] is the explicit `Ended → Idle` (and `Error → Idle`, restarting a
//!   crashed agent). [`AgentSessions::resume_session`] re-attaches to a session by id, after a restart too when it
//!   was created with `auto_end_on_disconnect(false)`: an ended session stays ended, an unknown id is
//!   `SESSION_NOT_FOUND`.
//!
//! Messages for a chat box: [`ChatDelta`] (streamed text, grouped by message id), [`ChatMessage`] (a completed
//! message), [`ChatError`], [`PermissionRequested`] (answer with [`PermissionAnswer`]; a [`PermissionSettled`]
//! says when it no longer waits, however it ended).
//!
//! A message id ([`ChatDelta::message`], [`ChatMessage::message`]) is unique within its session across every run
//! of the game: a session taken up again after a restart ([`AgentSessions::resume_session`]) never repeats an id
//! of an earlier run, so a chat box that keeps its messages may key them by it. Treat it as opaque.

mod backend;
mod config;
mod core;
mod handle;
mod in_use;
mod messages;
mod permission;
mod plugin;
mod record;
mod requests;
mod runs;
mod under_way;

#[cfg(feature = "acp")]
mod acp;
#[cfg(feature = "openai")]
mod openai;

use std::path::PathBuf;
use std::sync::Arc;

pub use crate::conversation::{
    ChatDelta, ChatError, ChatErrorScope, ChatMessage, PermissionDetail, PermissionOutcome, PermissionRequested,
    PermissionSettled,
};
pub use backend::{Attached, Cost, StopReason, Usage};
pub use config::{AcpAgentCommand, PermissionPolicy, SessionBackend, SessionConfig, SessionTimeouts};
pub use handle::{AgentSession, AgentSessions, PendingTurn};
pub use messages::PermissionAnswer;
#[cfg(feature = "openai")]
pub use openai::{OpenAiEndpoint, Sampling, TokenLimitField};
pub use plugin::AgentSessionsPlugin;
pub use requests::{SessionAnswered, SessionReply, SessionRequest};

use serde::{Deserialize, Serialize};

use crate::agent::AgentHandle;
use crate::conversation::ConversationStatus;
use crate::error::{ErrorCode, ToolError};
use crate::ids::ConversationId;
/// The game's MCP server, in a build that has one.
#[cfg(feature = "mcp")]
type McpServer = crate::mcp::McpServer;
/// A build without the `mcp` feature has no MCP server to hold.
#[cfg(not(feature = "mcp"))]
type McpServer = std::convert::Infallible;
use backend::{Link, McpEndpoint};
use permission::PermissionBook;
use record::Records;

/// How a turn ended: what `send_text` resolves with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnEnd {
    /// Why the agent ended it.
    pub stop_reason: StopReason,
    /// The turn's last complete agent message, if it wrote one.
    pub final_message: Option<String>,
}

/// What every session of the app shares: the host, the MCP server its agents call (or why the game serves
/// none), where records go.
pub(crate) struct SessionHost {
    pub agent: AgentHandle,
    /// The MCP server, or why there is none: known when the app is built (at the latest in `finish`, so the
    /// plugins' order does not matter); `None` until then.
    pub server: tokio::sync::watch::Sender<Option<Result<McpServer, String>>>,
    pub runtime: tokio::runtime::Handle,
    pub records: Records,
    pub permissions: PermissionBook,
    /// The sessions this copy of the game has open (each locked in its folder).
    pub in_use: in_use::InUse,
    /// Cancelled when the game exits: what is under way stops, nothing new starts, and closing agents are given
    /// less time ([`backend::CloseWithin`]).
    pub exiting: tokio_util::sync::CancellationToken,
}

/// A session's folder `dir` (or one in it) could not be made.
fn folder_unavailable(dir: &std::path::Path, error: std::io::Error) -> ToolError {
    ToolError::with_code(
        ErrorCode::AgentUnavailable,
        format!(
            "could not create the session's folder {}: {error} (`AgentSessionsPlugin::data_dir` chooses another \
             place)",
            dir.display()
        ),
    )
}

/// A session this copy of the game locked ([`SessionHost::hold`]): let go when dropped, unless kept.
pub(crate) struct Holding<'a> {
    host: &'a SessionHost,
    id: ConversationId,
    armed: bool,
}

impl Holding<'_> {
    /// Whether this took the lock (the copy did not hold it): another copy may have had the session meanwhile.
    pub(crate) fn taken(&self) -> bool {
        self.armed
    }

    /// The session is this copy's now: its lock stays until it is let go ([`in_use::InUse::let_go`]).
    pub(crate) fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.host.in_use.let_go(self.id.as_str());
        }
    }
}

impl SessionHost {
    /// Locks session `id` for this copy of the game ([`in_use`]): a `new` one's folder is made first, else it
    /// must be there (`SESSION_NOT_FOUND`); `SESSION_BUSY` if another copy has it open. The lock is let go when
    /// the guard drops, unless it is [kept](Holding::keep); one this copy held already is left as it is.
    pub(crate) async fn hold(&self, id: &ConversationId, new: bool) -> Result<Holding<'_>, ToolError> {
        if self.in_use.holds(id.as_str()) {
            return Ok(Holding { host: self, id: id.clone(), armed: false });
        }
        let (records, name) = (self.records.clone(), id.to_string());
        let unavailable = self.folder_error(id);
        // The lock comes back as the task's result: a caller that gave up meanwhile drops it, unlocked.
        let locked = self.runtime.spawn_blocking(move || {
            let dir = match new {
                true => records.session_dir(&name).map_err(unavailable)?,
                false => records.existing_dir(&name).ok_or_else(|| record::not_found(&name))?,
            };
            in_use::lock(&name, &dir)
        });
        let lock =
            locked.await.map_err(|error| ToolError::internal(format!("could not lock the session: {error}")))??;
        self.in_use.keep(id.as_str(), lock);
        Ok(Holding { host: self, id: id.clone(), armed: true })
    }

    /// What a folder of session `id` that could not be made reads as.
    fn folder_error(&self, id: &ConversationId) -> impl FnOnce(std::io::Error) -> ToolError + Send + 'static {
        let dir = config::session_dir(&self.records.data_dir, id.as_str());
        move |error| folder_unavailable(&dir, error)
    }

    /// The MCP endpoint with a new credential for the session (revoke it with [`revoke`](Self::revoke)), or why
    /// the game serves no MCP. A session created while the app is being built waits, up to `wait`, for the app's
    /// `finish`, where the server is looked up.
    pub(crate) async fn endpoint(
        &self,
        id: &ConversationId,
        wait: std::time::Duration,
    ) -> Result<Result<McpEndpoint, String>, ToolError> {
        let mut known = self.server.subscribe();
        let until = crate::deadline::after_tokio(tokio::time::Instant::now(), wait);
        let server = match tokio::time::timeout_at(until, known.wait_for(Option::is_some)).await {
            Ok(Ok(known)) => known.clone(),
            _ => None,
        };
        let server = match server {
            Some(Ok(server)) => server,
            Some(Err(why)) => return Ok(Err(why)),
            None => return Ok(Err("the app was not finished (`App::finish`, which `App::run` does)".into())),
        };
        #[cfg(not(feature = "mcp"))]
        match (server, id) {}
        #[cfg(feature = "mcp")]
        {
            let credential =
                server.credentials().mint_for_session(id).map_err(|error| ToolError::internal(error.to_string()))?;
            let game_token = server.token().to_string();
            Ok(Ok(McpEndpoint { url: server.url().to_string(), credential, game_token }))
        }
    }

    pub(crate) fn revoke(&self, credential: &str) {
        #[cfg(feature = "mcp")]
        if let Some(Ok(server)) = &*self.server.borrow() {
            server.credentials().revoke(credential);
        }
        #[cfg(not(feature = "mcp"))]
        let _ = credential;
    }

    pub(crate) fn set_status(&self, id: &ConversationId, status: ConversationStatus) {
        self.agent.host().conversations.host_sets(id, status);
    }

    /// Publishes a session's chat events, then its status (with `source`), as one step (see
    /// `ConversationHub::publish_chat_then_set`).
    pub(crate) fn publish(
        &self,
        id: &ConversationId,
        events: Vec<crate::conversation::ConversationEvent>,
        status: Option<ConversationStatus>,
        source: crate::StatusSource,
    ) {
        self.agent.host().conversations.publish_chat_then_set(id, events, status, source);
    }

    /// The session's folder (`<data_dir>/<id>`, the user's alone) and its own working directory in it, created
    /// empty: `<data_dir>/<id>/workspace`. Made on a blocking thread: a slow disk (a network home folder) holds
    /// none of the runtime's few workers, which serve the MCP server too.
    pub(crate) async fn session_dirs(&self, id: &ConversationId) -> Result<(PathBuf, PathBuf), ToolError> {
        let (records, name, unavailable) = (self.records.clone(), id.to_string(), self.folder_error(id));
        let made = self.runtime.spawn_blocking(move || {
            let session_dir = records.session_dir(&name).map_err(unavailable)?;
            let workspace = session_dir.join("workspace");
            std::fs::create_dir_all(&workspace).map_err(|error| folder_unavailable(&workspace, error))?;
            Ok((session_dir, workspace))
        });
        made.await.map_err(|error| ToolError::internal(format!("could not make the session's folder: {error}")))?
    }

    pub(crate) fn backend(&self, config: &SessionConfig) -> Box<dyn Backend> {
        match &config.backend {
            #[cfg(feature = "acp")]
            SessionBackend::Acp(command) => Box::new(acp::AcpBackend::new(command.clone(), self.runtime.clone())),
            #[cfg(not(feature = "acp"))]
            SessionBackend::Acp(_) => Box::new(Unavailable("ACP agents need the crate's `acp` feature")),
            #[cfg(feature = "openai")]
            SessionBackend::OpenAi(endpoint) => {
                Box::new(openai::OpenAiBackend::new(endpoint.clone(), self.runtime.clone()))
            }
        }
    }
}

/// What a backend's `connect` gives back: the link, how the session was attached, whether the system prompt
/// went as the backend's own (else the core sends it before the first text).
pub(crate) type Connected = (Arc<dyn Link>, Attached, bool);

/// A session backend: starts its agent and opens (or re-attaches) a session there.
pub(crate) trait Backend: Send {
    fn connect(
        &self,
        setup: backend::Setup,
        sink: backend::EventSink,
    ) -> backend::BoxFuture<Result<Connected, ToolError>>;
}

/// A backend this build of the crate does not have (its cargo feature is off).
#[cfg(not(feature = "acp"))]
struct Unavailable(&'static str);

#[cfg(not(feature = "acp"))]
impl Backend for Unavailable {
    fn connect(&self, _: backend::Setup, _: backend::EventSink) -> backend::BoxFuture<Result<Connected, ToolError>> {
        let why = self.0;
        Box::pin(async move { Err(ToolError::with_code(ErrorCode::AgentUnavailable, why)) })
    }
}
