//! The authoritative state a conversation gets when it (re)attaches, before any live event.

use serde::{Deserialize, Serialize};

use super::status::ConversationStatus;
use crate::ids::{ConversationId, RequestId, TaskId};
use crate::lifecycle::VisitInfo;

/// A call of the conversation that is executing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveCall {
    /// The call.
    pub request: RequestId,
    /// The tool.
    pub tool: String,
    /// Its task.
    pub task: TaskId,
    /// The visit and location revision it was admitted under.
    pub visit: VisitInfo,
}

/// A call of the conversation that waits for its tool to be registered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingCall {
    /// The tool it waits for.
    pub tool: String,
    /// Its task, if it named one.
    pub task: Option<TaskId>,
}

/// A conversation's state at one point of its event stream: every event with a sequence number up to
/// `sequence` is reflected in it, and a subscription created with it delivers exactly the events after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationSnapshot {
    /// The conversation.
    pub conversation: ConversationId,
    /// Its status.
    pub status: ConversationStatus,
    /// The sequence number of its last published event (0 if none).
    pub sequence: u64,
    /// Its calls executing now, oldest first.
    pub active_calls: Vec<ActiveCall>,
    /// Its calls waiting for their tool, oldest first.
    pub pending_calls: Vec<PendingCall>,
    /// The open visit, with its current location revision; `None` between visits.
    pub visit: Option<VisitInfo>,
}

impl ConversationSnapshot {
    /// The oldest executing call, if any.
    pub fn active_call(&self) -> Option<&ActiveCall> {
        self.active_calls.first()
    }

    /// The oldest call waiting for its tool, if any.
    pub fn pending_call(&self) -> Option<&PendingCall> {
        self.pending_calls.first()
    }
}
