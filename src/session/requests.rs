//! The session API as Bevy messages, for a chat box written as systems: the game writes a [`SessionRequest`] and
//! reads one [`SessionAnswered`] for it, with no async code of its own.
//!
//! Requests that name a session run in the order they were written (a `Say` then a `Cancel` written in one frame
//! cancel that turn); a `Create`, and requests for other sessions, run beside them. Each runs on the plugin's
//! runtime through [`AgentSessions`] and [`AgentSession`](super::AgentSession), so its rules are theirs. Answers
//! come as the work ends, so not always in the order asked (a `Say` is answered when its turn ends, after a
//! `Cancel` written after it): match them by [`SessionAnswered::request`] (the id `MessageWriter::write`
//! returns; a game that writes requests with `Commands` gets none and matches on [`SessionAnswered::asked`]).
//!
//! Requests are read, and answers written, in the host's schedule (`PostUpdate` unless
//! [`AgentToolsPlugin::in_schedule`](crate::AgentToolsPlugin::in_schedule) says otherwise, which must run every
//! frame, as for [`EnterWorld`](crate::EnterWorld)); answers after
//! [`AgentToolsSystems::Pump`](crate::AgentToolsSystems::Pump), never before the chat messages their work published: a
//! `Say`'s answer comes with or after the turn's last [`ChatMessage`](crate::ChatMessage) and its status change. An
//! answer wakes a windowed game's loop, as chat messages do.

use std::collections::HashMap;

use bevy::ecs::message::MessageId;
use bevy::prelude::*;
use crossbeam_channel::{Receiver, Sender};
use tokio::sync::oneshot;

use super::backend::Attached;
use super::{AgentSessions, SessionConfig, TurnEnd};
use crate::error::{ErrorCode, ToolError};
use crate::ids::ConversationId;
use crate::panic::{panic_message, CatchUnwind};

/// What a game system asks of its in-game agent sessions. Each request is answered exactly once (while the app
/// runs) by a [`SessionAnswered`] naming it by the [`MessageId`] that writing it returned.
///
/// ```no_run
/// # use bevy::prelude::*;
/// # use bevy_agent_tools::session::*;
/// # use bevy_agent_tools::ConversationId;
/// /// The chat box: Enter sends the player's line to the session it created.
/// fn send_line(mut requests: MessageWriter<SessionRequest>, session: Res<ChatSession>, line: Res<TypedLine>) {
///     requests.write(SessionRequest::Say { session: session.0.clone(), text: line.0.clone() });
/// }
/// /// Shows why a line was not sent (`SESSION_BUSY` while a turn runs, ...: the player may send it again), or
/// /// why its turn failed; the reply itself streams in as `ChatDelta` and `ChatMessage`.
/// fn show_answers(mut answers: MessageReader<SessionAnswered>) {
///     for answer in answers.read() {
///         match (&answer.asked, &answer.outcome) {
///             (SessionRequest::Say { .. }, Err(error)) => info!("not sent: {} {}", error.code, error.message),
///             (_, Ok(SessionReply::TurnFailed(error))) => info!("the turn failed: {}", error.message),
///             _ => {}
///         }
///     }
/// }
/// # #[derive(Resource)] struct ChatSession(ConversationId);
/// # #[derive(Resource)] struct TypedLine(String);
/// ```
#[derive(Message, Clone, Debug)]
#[allow(clippy::large_enum_variant)] // A few per player action: a boxed configuration would only cost the writer.
#[non_exhaustive]
pub enum SessionRequest {
    /// Create a session ([`AgentSessions::create`]): answered with [`SessionReply::Created`] once it is ready for
    /// text, or with the reason it could not start.
    Create(SessionConfig),
    /// Send the player's text ([`AgentSession::send_text`](super::AgentSession::send_text)): answered when the
    /// turn ends ([`SessionReply::TurnEnded`], or [`SessionReply::TurnFailed`]; the reply streams meanwhile as
    /// chat messages), or at once with an error when it is not sent (`SESSION_BUSY` while a turn runs,
    /// `SESSION_ENDED`, the failure of a session that failed, ...). The next request for the session runs
    /// once the text was sent (or refused), not when the turn ends.
    Say {
        /// The session.
        session: ConversationId,
        /// The player's text, sent word for word.
        text: String,
    },
    /// Cancel the running turn ([`AgentSession::cancel`](super::AgentSession::cancel)):
    /// [`SessionReply::Cancelled`].
    Cancel {
        /// The session.
        session: ConversationId,
    },
    /// End the session ([`AgentSession::end`](super::AgentSession::end)): [`SessionReply::Ended`].
    End {
        /// The session.
        session: ConversationId,
    },
    /// Bring a session back to use: re-attach it by id if this run does not have it
    /// ([`AgentSessions::resume_session`], after a restart), then resume it if it ended or failed
    /// ([`AgentSession::resume`](super::AgentSession::resume)): [`SessionReply::Resumed`].
    Resume {
        /// The session.
        session: ConversationId,
    },
    /// Forget the session for good ([`AgentSessions::forget`]): [`SessionReply::Forgotten`].
    Forget {
        /// The session.
        session: ConversationId,
    },
}

impl SessionRequest {
    /// The session the request is for (`None` for [`Create`](Self::Create)).
    pub fn session(&self) -> Option<&ConversationId> {
        match self {
            Self::Create(_) => None,
            Self::Say { session, .. }
            | Self::Cancel { session }
            | Self::End { session }
            | Self::Resume { session }
            | Self::Forget { session } => Some(session),
        }
    }
}

/// What a [`SessionRequest`] did.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum SessionReply {
    /// The session was created and is `Idle`.
    Created {
        /// Its id: name it in the next requests.
        session: ConversationId,
    },
    /// The text was sent and its turn ended.
    TurnEnded(TurnEnd),
    /// The text was sent and its turn failed (the agent crashed or did not end it in time, the session ended
    /// under it, ...): the error says why. A text that was not sent is the answer's `Err` instead.
    TurnFailed(ToolError),
    /// Whether a turn was running (or being sent) to cancel.
    Cancelled {
        /// `false`: there was none.
        running: bool,
    },
    /// The session ended (or had already).
    Ended,
    /// The session is live again, and how it was re-attached at its agent.
    Resumed(Attached),
    /// The session was forgotten.
    Forgotten,
}

/// The answer to one [`SessionRequest`].
#[derive(Message, Clone, Debug)]
pub struct SessionAnswered {
    /// The request, as writing it returned it.
    pub request: MessageId<SessionRequest>,
    /// What was asked.
    pub asked: SessionRequest,
    /// What it did, or why it did not (the session API's errors: `SESSION_NOT_FOUND` for a session the game does
    /// not know, `SESSION_BUSY`, `SESSION_ENDED`, `AGENT_UNAVAILABLE`, `TIMEOUT`, ...).
    pub outcome: Result<SessionReply, ToolError>,
}

/// The requests under way: per session, the end of the last one queued (the next one waits for it), and the
/// answers on their way to the game.
#[derive(Resource)]
pub(crate) struct SessionRequests {
    tails: HashMap<ConversationId, oneshot::Receiver<()>>,
    answer: Sender<SessionAnswered>,
    answers: Receiver<SessionAnswered>,
    /// Answers taken before this frame's pump, written after it.
    taken: Vec<SessionAnswered>,
}

impl Default for SessionRequests {
    fn default() -> Self {
        let (answer, answers) = crossbeam_channel::unbounded();
        Self { tails: HashMap::new(), answer, answers, taken: Vec::new() }
    }
}

/// Starts the work of each request written since the last run.
pub(crate) fn serve_session_requests(
    mut requests: MessageReader<SessionRequest>,
    sessions: Res<AgentSessions>,
    mut queue: ResMut<SessionRequests>,
) {
    if requests.is_empty() {
        return;
    }
    // A session whose last request is over needs no entry: the map holds only sessions with requests under way.
    queue.tails.retain(|_, end| matches!(end.try_recv(), Err(oneshot::error::TryRecvError::Empty)));
    for (asked, request) in requests.read_with_id() {
        // An end or forget stops a resume written before it, which it would otherwise wait for (requests for one
        // session are carried out in order); a resume goes by the ends asked for from when it was written.
        let ends = match asked {
            SessionRequest::End { session } | SessionRequest::Forget { session } => {
                sessions.stop_resuming(session);
                None
            }
            SessionRequest::Resume { session } => sessions.get(session).map(|live| live.watch_ends()),
            _ => None,
        };
        let (done, previous) = match asked.session() {
            Some(session) => {
                let (done, end) = oneshot::channel();
                (Some(done), queue.tails.insert(session.clone(), end))
            }
            None => (None, None),
        };
        let (sessions, answer, asked) = (sessions.clone(), queue.answer.clone(), asked.clone());
        sessions.host().runtime.clone().spawn(async move {
            if let Some(previous) = previous {
                // Ends with the previous request's ordered part (its sender is dropped then, however it ended).
                let _ = previous.await;
            }
            // A panic still gets its answer (and drops `done`: the next request goes on).
            let outcome = match CatchUnwind(Box::pin(carry_out(&sessions, asked.clone(), done, ends))).await {
                Ok(outcome) => outcome,
                Err(panic) => Err(ToolError::internal(format!("the request panicked: {}", panic_message(&*panic)))),
            };
            if answer.send(SessionAnswered { request, asked, outcome }).is_ok() {
                // A game with reactive updates runs the frame that writes it.
                sessions.host().agent.host().jobs.wake();
            }
        });
    }
}

/// Does what `asked` asks. `done` is dropped when the next request for the same session may start.
async fn carry_out(
    sessions: &AgentSessions,
    asked: SessionRequest,
    done: Option<oneshot::Sender<()>>,
    ends: Option<tokio::sync::watch::Receiver<u64>>,
) -> Result<SessionReply, ToolError> {
    let live = |session: &ConversationId| sessions.get(session).ok_or_else(|| not_live(session));
    match asked {
        SessionRequest::Create(config) => {
            sessions.create(config).await.map(|session| SessionReply::Created { session: session.id().clone() })
        }
        SessionRequest::Say { session, text } => {
            let turn = live(&session)?.start_turn(text).await;
            drop(done);
            // Sent: whatever becomes of the turn, the text reached the agent.
            Ok(match turn?.await {
                Ok(end) => SessionReply::TurnEnded(end),
                Err(error) => SessionReply::TurnFailed(error),
            })
        }
        SessionRequest::Cancel { session } => Ok(SessionReply::Cancelled { running: live(&session)?.cancel() }),
        SessionRequest::End { session } => {
            // Resumes written before it were stopped when it was served; one written after it goes on after it.
            live(&session)?.end_as_asked().await;
            Ok(SessionReply::Ended)
        }
        SessionRequest::Resume { session } => {
            let session = sessions.resume_session(session).await?;
            let ends = ends.unwrap_or_else(|| session.watch_ends());
            session.resume_watching(ends).await.map(SessionReply::Resumed)
        }
        SessionRequest::Forget { session } => sessions.forget(session).await.map(|()| SessionReply::Forgotten),
    }
}

/// A request for a session this run does not have live (never created, forgotten, or not resumed yet).
fn not_live(session: &ConversationId) -> ToolError {
    ToolError::with_code(
        ErrorCode::SessionNotFound,
        format!("session `{session}` is not live in this run: create it, or resume it by id first"),
    )
    .with_detail("session", session)
}

/// Takes the answers ready before this frame's pump (whose conversation messages that pump writes).
pub(crate) fn take_session_answers(mut queue: ResMut<SessionRequests>) {
    let queue = &mut *queue;
    queue.taken.extend(queue.answers.try_iter());
}

/// Writes the answers taken, after the conversation messages published before them.
pub(crate) fn write_session_answers(mut queue: ResMut<SessionRequests>, mut answered: MessageWriter<SessionAnswered>) {
    answered.write_batch(queue.taken.drain(..));
}
