//! What an in-game agent session says, as events of its conversation: streamed text, completed messages,
//! errors, and permission requests and how they ended. They travel with the conversation's status changes and calls, in one
//! sequence, so a chat box sees a reply complete before the status that follows it; the game reads them as Bevy
//! messages, Rust code through a [`Subscription`](super::Subscription).
//!
//! As Bevy messages, each kind is a queue of its own: where the order across kinds matters (a reply, then the error
//! that cut it short), order a frame's events by their `sequence`. And a message not read within two frames is
//! gone: read them in systems that run every frame and keep what they say in a resource, gating only the drawing
//! (a `PermissionRequested` missed while a chat window was closed would never be shown, and be denied at its
//! timeout); or keep a [`Subscription`](super::Subscription) and drain it when the window opens.

use bevy::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::ErrorCode;
use crate::ids::ConversationId;

/// A piece of an agent message as it streams in. Pieces of one message share its `message` id, in order.
#[derive(Message, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatDelta {
    /// The session (its conversation id: the `conversation` of its
    /// [`ConversationStatusChanged`](crate::ConversationStatusChanged)).
    pub session: ConversationId,
    /// The message this piece belongs to: an opaque id, unique within the session across every run of the game.
    pub message: String,
    /// The new text.
    pub text: String,
    /// The conversation's event sequence number.
    pub sequence: u64,
}

/// A completed agent message: it ends when the agent starts another message, calls a tool, or ends its turn, and
/// also, with the text that came so far, when its turn is cancelled, refused or fails, when the session ends, or
/// when the next turn starts (an agent that went on writing after its turn).
#[derive(Message, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// The session.
    pub session: ConversationId,
    /// The message's id (the same as its deltas'): opaque, unique within the session across every run of the game.
    pub message: String,
    /// Its whole text.
    pub text: String,
    /// The conversation's event sequence number.
    pub sequence: u64,
}

/// Something went wrong in a session, for the player to see. Three cases, its [`scope`](Self::scope) says which
/// (and the session's status, whose [`ConversationStatusChanged`](crate::ConversationStatusChanged) comes with it):
///
/// - the session failed (its backend stopped or could not be reached, a turn timed out): its status is then
///   `Error` until `session::AgentSession::resume`;
/// - the agent could not do one turn (an ACP agent's provider overloaded or rate limiting, the context too long; an
///   OpenAI-compatible endpoint that still refuses after its retries, or whose answer broke off or stalled): that
///   turn ends, the status goes back to `Idle`, and the next text is taken (an endpoint that refuses the API key
///   fails the session, as above: `resume` reads the key again);
/// - a notice that fails nothing: the session goes on as it was (`HISTORY_NOT_SAVED`: the turn's history could not
///   be written; from an OpenAI-compatible endpoint, `NO_ANSWER`: the model answered nothing, and
///   `CALL_CUT_SHORT`: it reached its token limit while it wrote a tool call, which was not run).
#[derive(Message, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatError {
    /// The session.
    pub session: ConversationId,
    /// The stable code (`AGENT_UNAVAILABLE`, `TIMEOUT`, ...).
    pub code: ErrorCode,
    /// What happened, in words (for a crash, the exit status and the tail of the agent's stderr).
    pub message: String,
    /// What it ended: the session, its turn, or nothing.
    pub scope: ChatErrorScope,
    /// The conversation's event sequence number.
    pub sequence: u64,
}

/// What a [`ChatError`] ended, for a chat box to say what the player can do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatErrorScope {
    /// The session failed: its status is `Error`, it takes no text until `session::AgentSession::resume`.
    Session,
    /// The agent could not do one turn: that turn ended, the status went back to `Idle`, the next text is taken.
    Turn,
    /// A notice: nothing failed, the session goes on as it was.
    Notice,
}

impl ChatErrorScope {
    /// The stable lower-case name (`session`, `turn`, `notice`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Turn => "turn",
            Self::Notice => "notice",
        }
    }
}

impl std::fmt::Display for ChatErrorScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The agent asks permission for one of its own actions, and the session's policy is `PermissionPolicy::AskPlayer`:
/// show it, and answer with a `PermissionAnswer` message or `AgentSessions::answer_permission` (both in
/// `session`). Unanswered requests are denied after the session's permission timeout. However it ends, a
/// [`PermissionSettled`] with the same `request` follows: take the prompt down then.
#[derive(Message, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionRequested {
    /// The session.
    pub session: ConversationId,
    /// The request's number, to answer it with.
    pub request: u64,
    /// What the agent wants to do, as it titled it (often the tool's name).
    pub tool: String,
    /// The kind of action, if the agent said (ACP's: `read`, `edit`, `delete`, `move`, `search`, `execute`,
    /// `fetch`, `think`, `other`).
    pub kind: Option<String>,
    /// What the action would take, if the agent said: its input as JSON text (a shell command, a file's path), cut
    /// at [`PERMISSION_INPUT_LIMIT`] characters. Show it beside the title: the title alone may not say what
    /// the player allows.
    pub input: Option<String>,
    /// The files the action would touch and what it would change or run, if the agent said, in its order (at
    /// most [`PERMISSION_DETAILS_LIMIT`]): show a diff as a diff, so the player sees what an edit does without
    /// reading it out of `input`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<PermissionDetail>,
    /// The conversation's event sequence number.
    pub sequence: u64,
}

/// The most of a permission request's input a [`PermissionRequested`] carries, in characters; each text of its
/// [`details`](PermissionRequested::details) is cut there too.
pub const PERMISSION_INPUT_LIMIT: usize = 1_000;

/// The most [`details`](PermissionRequested::details) a permission request carries; the agent's further ones are
/// left out.
pub const PERMISSION_DETAILS_LIMIT: usize = 16;

/// A file an action the agent asks permission for would touch, or what it would change or show (ACP's tool call
/// `locations` and `content`). Texts are cut at [`PERMISSION_INPUT_LIMIT`] characters, marked with a final `…`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum PermissionDetail {
    /// A file the action would read or change.
    Location {
        /// The file's path, as the agent gave it (absolute in ACP).
        path: String,
        /// The line it would act at (1-based), if the agent said.
        line: Option<u32>,
    },
    /// A change to a file's text.
    Diff {
        /// The file's path, as the agent gave it.
        path: String,
        /// Its text before the change; `None` for a new file.
        old_text: Option<String>,
        /// Its text after the change.
        new_text: String,
    },
    /// Text the agent shows with the request (what a command does, a tool's arguments).
    Text {
        /// The text.
        text: String,
    },
    /// A kind of detail this version does not know, read from a newer version's JSON (never made by this one).
    #[serde(other)]
    Other,
}

/// A permission request shown with a [`PermissionRequested`] no longer waits for the player: take its prompt down.
/// Exactly one follows each `PermissionRequested`, in the session's event sequence.
#[derive(Message, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionSettled {
    /// The session.
    pub session: ConversationId,
    /// The request's number (as in its `PermissionRequested`).
    pub request: u64,
    /// How it ended.
    pub outcome: PermissionOutcome,
    /// The conversation's event sequence number.
    pub sequence: u64,
}

/// How a permission request put to the player ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionOutcome {
    /// The player allowed it (once).
    Allowed,
    /// The player denied it.
    Denied,
    /// Nobody answered within the session's permission timeout: it was denied.
    TimedOut,
    /// Its turn was cancelled, or its session failed or ended, or the agent took the request back (ACP's
    /// `$/cancel_request`): the agent no longer waits for an answer (an answer now is refused).
    Withdrawn,
}

impl PermissionOutcome {
    /// Whether the agent may go ahead.
    pub fn allowed(self) -> bool {
        self == Self::Allowed
    }

    /// The stable lower-case name (`allowed`, `denied`, `timed_out`, `withdrawn`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::Denied => "denied",
            Self::TimedOut => "timed_out",
            Self::Withdrawn => "withdrawn",
        }
    }
}

impl std::fmt::Display for PermissionOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
