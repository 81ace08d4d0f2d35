//! What an in-game agent session says, as events of its conversation: streamed text, completed messages,
//! errors and permission requests. They travel with the conversation's status changes and calls, in one
//! sequence, so a chat box sees a reply complete before the status that follows it; the game reads them as Bevy
//! messages, Rust code through a [`Subscription`](super::Subscription).

use bevy::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::ErrorCode;
use crate::ids::ConversationId;

/// A piece of an agent message as it streams in. Pieces of one message share its `message` id, in order.
#[derive(Message, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatDelta {
    /// The session (its conversation id).
    pub session: ConversationId,
    /// The message this piece belongs to.
    pub message: String,
    /// The new text.
    pub text: String,
    /// The conversation's event sequence number.
    pub sequence: u64,
}

/// A completed agent message: it ends when the agent starts another message, calls a tool, or ends its turn.
#[derive(Message, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// The session.
    pub session: ConversationId,
    /// The message's id (the same as its deltas').
    pub message: String,
    /// Its whole text.
    pub text: String,
    /// The conversation's event sequence number.
    pub sequence: u64,
}

/// A session failed: its backend stopped or could not be reached, or a turn timed out. The session's status is
/// then `Error` until `session::AgentSession::resume`.
#[derive(Message, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatError {
    /// The session.
    pub session: ConversationId,
    /// The stable code (`AGENT_UNAVAILABLE`, `TIMEOUT`, ...).
    pub code: ErrorCode,
    /// What happened, in words (for a crash, the exit status and the tail of the agent's stderr).
    pub message: String,
    /// The conversation's event sequence number.
    pub sequence: u64,
}

/// The agent asks permission for one of its own actions, and the session's policy is `PermissionPolicy::AskPlayer`:
/// show it, and answer with a `PermissionAnswer` message or `AgentSessions::answer_permission` (both in
/// `session`). Unanswered requests are denied after the session's permission timeout.
#[derive(Message, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionRequested {
    /// The session.
    pub session: ConversationId,
    /// The request's number, to answer it with.
    pub request: u64,
    /// What the agent wants to do, as it titled it (often the tool's name).
    pub tool: String,
    /// The conversation's event sequence number.
    pub sequence: u64,
}
