//! What in-game agent sessions tell the game travels as events of their conversations ([`ChatDelta`],
//! [`ChatMessage`], [`ChatError`], [`PermissionRequested`], beside the status changes and calls every
//! conversation has), in one sequence per session. The game's answer to a permission request comes back as a
//! [`PermissionAnswer`] message.

use bevy::prelude::*;
use serde::{Deserialize, Serialize};

use super::AgentSessions;

/// The game's answer to a [`PermissionRequested`](crate::PermissionRequested).
#[derive(Message, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionAnswer {
    /// The request's number.
    pub request: u64,
    /// Allow it (once), or deny it.
    pub allow: bool,
}

/// Applies the game's [`PermissionAnswer`] messages.
pub(crate) fn apply_permission_answers(mut answers: MessageReader<PermissionAnswer>, sessions: Res<AgentSessions>) {
    for answer in answers.read() {
        sessions.answer_permission(answer.request, answer.allow);
    }
}
