//! What the game sees: conversation events written as Bevy messages on the main thread, and the per-frame check
//! of the idle timeout.

use std::time::Instant;

use bevy::prelude::*;
use crossbeam_channel::Receiver;

use super::chat::{ChatDelta, ChatError, ChatMessage, PermissionRequested, PermissionSettled};
use super::events::{CallFinished, CallProgress, CallStarted, ConversationEvent, ConversationStatusChanged};
use crate::agent::AgentHandle;

/// Events published on any thread, waiting to be written as messages.
#[derive(Resource)]
pub(crate) struct ConversationFeed(pub Receiver<ConversationEvent>);

/// The writers of an in-game agent session's chat events.
#[derive(bevy::ecs::system::SystemParam)]
pub(crate) struct ChatWriters<'w> {
    deltas: MessageWriter<'w, ChatDelta>,
    messages: MessageWriter<'w, ChatMessage>,
    errors: MessageWriter<'w, ChatError>,
    permissions: MessageWriter<'w, PermissionRequested>,
    settled: MessageWriter<'w, PermissionSettled>,
}

/// Writes every event published since the last run as messages ([`ConversationStatusChanged`], [`CallStarted`],
/// [`CallProgress`], [`CallFinished`], and the chat events of in-game agent sessions), in publication order.
pub(crate) fn publish_conversation_messages(
    feed: Res<ConversationFeed>,
    mut status: MessageWriter<ConversationStatusChanged>,
    mut started: MessageWriter<CallStarted>,
    mut finished: MessageWriter<CallFinished>,
    mut progress: MessageWriter<CallProgress>,
    mut chat: ChatWriters,
) {
    for event in feed.0.try_iter() {
        match event {
            ConversationEvent::Status(event) => {
                tracing::debug!(conversation = %event.conversation, from = %event.previous, to = %event.status, source = ?event.source, "conversation status");
                status.write(event);
            }
            ConversationEvent::CallStarted(event) => {
                started.write(event);
            }
            ConversationEvent::CallProgress(event) => {
                progress.write(event);
            }
            ConversationEvent::CallFinished(event) => {
                finished.write(event);
            }
            ConversationEvent::ChatDelta(event) => {
                chat.deltas.write(event);
            }
            ConversationEvent::ChatMessage(event) => {
                chat.messages.write(event);
            }
            ConversationEvent::ChatError(event) => {
                chat.errors.write(event);
            }
            ConversationEvent::PermissionRequested(event) => {
                chat.permissions.write(event);
            }
            ConversationEvent::PermissionSettled(event) => {
                chat.settled.write(event);
            }
        }
    }
}

/// Ends conversations idle for longer than the plugin's idle timeout.
pub(crate) fn end_idle_conversations(agent: Res<AgentHandle>) {
    agent.host().conversations.end_idle(Instant::now());
}
