//! Conversations (DESIGN §6): one agent connection each, with a status a HUD can trust, de-duplicated events in
//! sequence, and a reconnect that loses nothing.
//!
//! - **Status** ([`ConversationStatus`]): `Idle`, `Running`, `WaitingToolResult`, `Ended`, `Error`. The host sets
//!   `WaitingToolResult` while a call of the conversation executes (or waits for its tool) and returns to
//!   `Running` (if the agent reported a turn) or `Idle` when the last one finishes. The agent reports turns
//!   (`Running`, `Idle`), `Error`, and may end the conversation; it reports with sequence numbers, and a report not
//!   newer than the last one seen is ignored ([`Reported::Stale`]).
//! - **Events** ([`ConversationEvent`]): status changes (only when the value changes, with the previous status
//!   and the [`StatusSource`]), calls started and finished. Each carries the conversation's next sequence number.
//!   The game reads them as Bevy messages; Rust code subscribes through [`AgentHandle`](crate::AgentHandle).
//!   The host keeps the 1,024 most recently ended conversations (it looks for older ones to forget every 64
//!   ends); one it forgot that comes back (by the same id)
//!   numbers its events after its last ones, never from the start again.
//! - **End**: ends the conversation's calls (`CANCELLED`, their `ended()` fires) and never touches the visit.
//!   `Ended` is published once per transition into it; ending again succeeds without an event. Only a resume
//!   (`Ended → Idle`) leaves it; opening the conversation again by id ([`AgentHandle::conversation`]) is such a
//!   resume, so an MCP client that comes back after the idle timeout simply continues.
//! - **Reconnect**: [`AgentHandle::resume`] returns a [`ConversationSnapshot`] (status, active and pending calls,
//!   visit and revision) and a [`Subscription`] that delivers exactly the events after it.
//! - **Idle timeout** ([`AgentToolsPlugin::conversation_idle_timeout`]): a conversation with no call in flight and
//!   no activity (call, report, open) for that long ends. Checked every frame.
//!
//! [`AgentHandle::conversation`]: crate::AgentHandle::conversation
//! [`AgentHandle::resume`]: crate::AgentHandle::resume
//! [`AgentToolsPlugin::conversation_idle_timeout`]: crate::AgentToolsPlugin::conversation_idle_timeout

mod chat;
mod events;
mod forgotten;
mod game;
mod pending;
mod registry;
mod snapshot;
mod status;

pub use chat::{
    ChatDelta, ChatError, ChatErrorScope, ChatMessage, PermissionDetail, PermissionOutcome, PermissionRequested,
    PermissionSettled, PERMISSION_DETAILS_LIMIT, PERMISSION_INPUT_LIMIT,
};
pub use events::{CallFinished, CallProgress, CallStarted, ConversationEvent, ConversationStatusChanged, Subscription};
pub(crate) use game::{end_idle_conversations, publish_conversation_messages, ConversationFeed};
#[cfg(all(test, feature = "shuttle"))]
pub(crate) use pending::admit_waiting;
pub(crate) use pending::{ended, tool_wait, wait_for_tool, WaitingCall, WaitingCalls};
pub(crate) use registry::ConversationHub;
#[cfg(any(feature = "acp", feature = "openai"))]
pub(crate) use registry::Suspension;
pub use snapshot::{ActiveCall, ConversationSnapshot, PendingCall};
pub use status::{ConversationStatus, Reported, StatusSource};
