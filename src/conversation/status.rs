//! The status machine of one conversation (seed 002): `Idle`, `Running`, `WaitingToolResult`, `Ended`, `Error`.
//!
//! The status is derived from a few facts rather than set directly, so that the host and the agent can report
//! the same thing without the value flickering or repeating: whether the agent reported a turn, whether it
//! reported an error or that it waits for a tool, how many of its calls are in flight (or waiting for their tool),
//! and whether the conversation ended.

use serde::{Deserialize, Serialize};

/// Where a conversation is in its life, as a HUD shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConversationStatus {
    /// No turn is active; ready for another prompt.
    Idle,
    /// The agent reported a turn in progress.
    Running,
    /// A call of the conversation is executing (or waiting for its tool to be registered).
    WaitingToolResult,
    /// The conversation ended (explicitly, or by the idle timeout). Only a resume leaves this status.
    Ended,
    /// The agent reported an error. Reporting `Running` or `Idle` recovers.
    Error,
}

impl ConversationStatus {
    /// The status as it appears on the wire (`"waiting_tool_result"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Running => "running",
            Self::WaitingToolResult => "waiting_tool_result",
            Self::Ended => "ended",
            Self::Error => "error",
        }
    }
}

impl std::fmt::Display for ConversationStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who caused a status change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusSource {
    /// The host: a call started or finished, the conversation was ended, resumed or timed out.
    Host,
    /// The agent side reported it (a turn started or ended, an error).
    Agent,
}

/// What became of a status the agent reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    /// The status changed; one event was published.
    Changed,
    /// Accepted, but the status did not change (for example the host had already set it): no event.
    Unchanged,
    /// Its sequence number was not newer than the last one seen for the conversation: ignored.
    Stale,
    /// Not a transition the agent may make now (the conversation ended, or it is unknown): ignored.
    Refused,
}

/// The facts a status is derived from.
#[derive(Clone, Debug, Default)]
pub(crate) struct StatusFacts {
    pub ended: bool,
    pub error: bool,
    /// The agent reported a turn (`Running`) that it has not ended.
    pub turn: bool,
    /// The agent reported it waits for a tool result.
    pub agent_waiting: bool,
    /// Calls executing or waiting for their tool.
    pub calls: usize,
}

impl StatusFacts {
    /// The status these facts mean. Ended wins, then error, then a call in flight, then a turn.
    pub(crate) fn status(&self) -> ConversationStatus {
        if self.ended {
            ConversationStatus::Ended
        } else if self.error {
            ConversationStatus::Error
        } else if self.calls > 0 || self.agent_waiting {
            ConversationStatus::WaitingToolResult
        } else if self.turn {
            ConversationStatus::Running
        } else {
            ConversationStatus::Idle
        }
    }

    /// Applies what the agent reported. Returns false if the agent may not report it now (only a resume leaves
    /// `Ended`; `Ended` itself is handled by the registry, which also ends the calls).
    pub(crate) fn agent_reports(&mut self, status: ConversationStatus) -> bool {
        if self.ended {
            return false;
        }
        match status {
            ConversationStatus::Idle => (self.turn, self.error, self.agent_waiting) = (false, false, false),
            ConversationStatus::Running => (self.turn, self.error, self.agent_waiting) = (true, false, false),
            ConversationStatus::WaitingToolResult => (self.turn, self.error, self.agent_waiting) = (true, false, true),
            ConversationStatus::Error => self.error = true,
            ConversationStatus::Ended => self.ended = true,
        }
        true
    }

    /// The explicit `Ended → Idle` of a resume: everything reported before is forgotten.
    pub(crate) fn reactivate(&mut self) {
        *self = Self { calls: self.calls, ..Self::default() };
    }
}

#[cfg(test)]
mod tests {
    use super::{ConversationStatus as S, StatusFacts};

    #[test]
    fn a_turn_with_a_tool_goes_idle_running_waiting_running_idle() {
        let mut facts = StatusFacts::default();
        let mut seen = vec![facts.status()];
        facts.agent_reports(S::Running);
        seen.push(facts.status());
        facts.calls += 1;
        seen.push(facts.status());
        facts.calls -= 1;
        seen.push(facts.status());
        facts.agent_reports(S::Idle);
        seen.push(facts.status());
        assert_eq!(seen, [S::Idle, S::Running, S::WaitingToolResult, S::Running, S::Idle]);
    }

    #[test]
    fn only_a_resume_leaves_ended() {
        let mut facts = StatusFacts { ended: true, ..Default::default() };
        assert!(!facts.agent_reports(S::Running));
        assert_eq!(facts.status(), S::Ended);
        facts.reactivate();
        assert_eq!(facts.status(), S::Idle);
    }
}
