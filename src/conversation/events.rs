//! What a conversation publishes: status changes and the start, progress and finish of its calls. Each event carries the
//! conversation's next sequence number, so a subscriber can tell it missed nothing and saw nothing twice. The
//! same values are Bevy messages for the game (a HUD) and items of a [`Subscription`] for Rust code.

use std::time::Duration;

use bevy::prelude::Message;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedReceiver;

use super::chat::{ChatDelta, ChatError, ChatMessage, PermissionRequested, PermissionSettled};
use super::status::{ConversationStatus, StatusSource};
use crate::error::ErrorCode;
use crate::ids::{ConversationId, RequestId, TaskId};
use crate::lifecycle::VisitInfo;

/// A conversation's status changed. Published only when the value changes.
#[derive(Message, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationStatusChanged {
    /// The conversation.
    pub conversation: ConversationId,
    /// The status before.
    pub previous: ConversationStatus,
    /// The status now.
    pub status: ConversationStatus,
    /// Who caused it.
    pub source: StatusSource,
    /// The conversation's event sequence number: one more than its previous event's.
    pub sequence: u64,
}

/// A call was admitted and its execution started; or (`joined`) a retry of a keyed operation joined an execution
/// another conversation's call started. Each conversation's `CallStarted` is followed by its one `CallFinished`:
/// key what is in flight by conversation and request.
#[derive(Message, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallStarted {
    /// The conversation that made it.
    pub conversation: ConversationId,
    /// The call (for a joined retry, the execution's: the first call's request id).
    pub request: RequestId,
    /// The tool.
    pub tool: String,
    /// Its task.
    pub task: TaskId,
    /// The visit and location revision it was admitted under.
    pub visit: VisitInfo,
    /// Whether this conversation's retry joined the execution of another conversation's call (same task and
    /// operation id, rule H12): that call has its own `CallStarted`, and the execution runs once.
    #[serde(default)]
    pub joined: bool,
    /// The conversation's event sequence number.
    pub sequence: u64,
}

/// A call reached its one outcome (for its conversation: one that ended, or cancelled the task, while a retry of
/// another conversation still waits for the execution sees it finish `CANCELLED`, and the execution goes on).
#[derive(Message, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallFinished {
    /// The conversation that made it.
    pub conversation: ConversationId,
    /// The call (for a joined retry, the execution's: the first call's request id).
    pub request: RequestId,
    /// Whether this conversation's retry had joined another conversation's call (see [`CallStarted::joined`]).
    #[serde(default)]
    pub joined: bool,
    /// The tool.
    pub tool: String,
    /// `None` for a success, else the error's code.
    pub code: Option<ErrorCode>,
    /// From admission to outcome.
    pub duration: Duration,
    /// The visit and location revision it was admitted under.
    pub visit: VisitInfo,
    /// The conversation's event sequence number.
    pub sequence: u64,
}

/// A running call reported progress (its handler called
/// [`CallContext::report_progress`](crate::CallContext::report_progress)): what a HUD shows for a long tool.
/// Published whether or not the caller asked for progress notifications; never after the call finished.
#[derive(Message, Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CallProgress {
    /// The conversation that made the call.
    pub conversation: ConversationId,
    /// The call.
    pub request: RequestId,
    /// The tool.
    pub tool: String,
    /// How far along (increases with each report).
    pub progress: f64,
    /// The total, when known.
    pub total: Option<f64>,
    /// What is happening, in words.
    pub message: Option<String>,
    /// The conversation's event sequence number.
    pub sequence: u64,
}

/// One event of a conversation, in the order it was published.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ConversationEvent {
    /// The status changed.
    Status(ConversationStatusChanged),
    /// A call started.
    CallStarted(CallStarted),
    /// A running call reported progress.
    CallProgress(CallProgress),
    /// A call finished.
    CallFinished(CallFinished),
    /// A piece of an in-game agent session's message.
    ChatDelta(ChatDelta),
    /// An in-game agent session's completed message.
    ChatMessage(ChatMessage),
    /// An error in an in-game agent session: it failed, one turn did, or a notice ([`ChatError::scope`]).
    ChatError(ChatError),
    /// An in-game agent session's agent asks permission.
    PermissionRequested(PermissionRequested),
    /// A permission request no longer waits for the player.
    PermissionSettled(PermissionSettled),
}

impl ConversationEvent {
    /// The conversation it belongs to.
    pub fn conversation(&self) -> &ConversationId {
        match self {
            Self::Status(event) => &event.conversation,
            Self::CallStarted(event) => &event.conversation,
            Self::CallProgress(event) => &event.conversation,
            Self::CallFinished(event) => &event.conversation,
            Self::ChatDelta(event) => &event.session,
            Self::ChatMessage(event) => &event.session,
            Self::ChatError(event) => &event.session,
            Self::PermissionRequested(event) => &event.session,
            Self::PermissionSettled(event) => &event.session,
        }
    }

    /// Its sequence number in its conversation.
    pub fn sequence(&self) -> u64 {
        match self {
            Self::Status(event) => event.sequence,
            Self::CallStarted(event) => event.sequence,
            Self::CallProgress(event) => event.sequence,
            Self::CallFinished(event) => event.sequence,
            Self::ChatDelta(event) => event.sequence,
            Self::ChatMessage(event) => event.sequence,
            Self::ChatError(event) => event.sequence,
            Self::PermissionRequested(event) => event.sequence,
            Self::PermissionSettled(event) => event.sequence,
        }
    }

    pub(crate) fn set_sequence(&mut self, sequence: u64) {
        match self {
            Self::Status(event) => event.sequence = sequence,
            Self::CallStarted(event) => event.sequence = sequence,
            Self::CallProgress(event) => event.sequence = sequence,
            Self::CallFinished(event) => event.sequence = sequence,
            Self::ChatDelta(event) => event.sequence = sequence,
            Self::ChatMessage(event) => event.sequence = sequence,
            Self::ChatError(event) => event.sequence = sequence,
            Self::PermissionRequested(event) => event.sequence = sequence,
            Self::PermissionSettled(event) => event.sequence = sequence,
        }
    }

    /// The status change, if it is one.
    pub fn as_status(&self) -> Option<&ConversationStatusChanged> {
        match self {
            Self::Status(event) => Some(event),
            _ => None,
        }
    }
}

/// Live events, in publication order, from the moment it was created (for one conversation, or for all).
/// Unbounded: read it, or drop it to unsubscribe. Usable from any thread.
pub struct Subscription {
    pub(crate) events: UnboundedReceiver<ConversationEvent>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").field("waiting", &self.events.len()).finish()
    }
}

impl Subscription {
    /// The next event if one is waiting.
    pub fn try_next(&mut self) -> Option<ConversationEvent> {
        self.events.try_recv().ok()
    }

    /// Every event waiting now.
    pub fn drain(&mut self) -> Vec<ConversationEvent> {
        std::iter::from_fn(|| self.try_next()).collect()
    }

    /// Waits for the next event; `None` once the host is gone. Cancel-safe.
    pub async fn next(&mut self) -> Option<ConversationEvent> {
        self.events.recv().await
    }
}
