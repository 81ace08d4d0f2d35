//! The session core: one in-game agent session's state, whatever its backend. It keeps the rules of DESIGN §6b:
//! one turn at a time (S1), exactly one outcome per `send_text` (S2), the status machine of the session's
//! conversation, messages grouped and completed, the credential minted and revoked, end and resume.
//!
//! Its state lock is held for a decision and for publishing what it decided (chat events and status changes go
//! to the conversation hub under it), so they are published in the order they were decided: a turn's `Idle`
//! never lands after the next turn's `Running`. Nothing else is locked, awaited or called back while it is held,
//! except, in this order, the permission requests' lock, the hub's lock, and the credentials' (and the MCP
//! server's `watch`) locks, which lock nothing else and call nothing back, and sending on channels. The waiters
//! (a turn's outcome) are told after it is released.
//!
//! Here: the state and the refusals of a turn; in `connection`, starting the agent; in `turns`, the turns and the
//! backend's events; in `ending`, ending, resuming and the record.

mod connection;
mod ending;
mod turns;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::backend::{Attached, BackendEvent, EventSink, Link, PermissionDecision, PromptBlock, Usage};
use super::permission::{Asking, PermissionBook};
use super::record::Record;
use super::{SessionConfig, SessionHost, TurnEnd};
use crate::conversation::{ChatDelta, ChatError, ChatErrorScope, ChatMessage, ConversationEvent};
use crate::conversation::{ConversationStatus, StatusSource, Suspension};
use crate::error::{ErrorCode, ToolError};
use crate::ids::ConversationId;

/// Where a session is in its life.
#[derive(Clone, Debug)]
pub(crate) enum Phase {
    /// Connected (or connecting): turns may run.
    Live,
    /// The backend failed; the error is what `send_text` answers until a resume.
    Failed(ToolError),
    /// Ended by the game; only a resume leaves it.
    Ended,
}

struct Turn {
    number: u64,
    reply: oneshot::Sender<Result<TurnEnd, ToolError>>,
    /// The player cancelled it: the agent's calls and permission requests from now on are refused, until it ends.
    cancelled: bool,
    /// The last completed message of the turn.
    last_message: Option<String>,
    /// It carries the game's instructions (an agent that takes no system prompt): they reached the agent once it
    /// ended.
    carries_instructions: bool,
    /// Cancelled once the turn is over (taken out of the state and dropped): its timeouts stop watching it, so
    /// that no task waits out the timeout of every turn ever sent.
    over: CancellationToken,
    _over_when_dropped: tokio_util::sync::DropGuard,
}

/// The message being streamed.
struct OpenMessage {
    id: String,
    agent_id: Option<String>,
    text: String,
    /// Cut at [`MESSAGE_LIMIT`]: nothing more is added.
    cut: bool,
}

/// The most of one chat message kept and shown: an agent that streams without end (a loop, between turns or in
/// one) is cut there, with a line saying so, instead of filling the game's memory.
const MESSAGE_LIMIT: usize = 1024 * 1024;
/// What ends a message cut at [`MESSAGE_LIMIT`].
const MESSAGE_CUT: &str = "\n[the rest of this message was not kept: it passed 1 MiB]";

impl OpenMessage {
    /// Adds `text` to the message: all of it, or what fits under [`MESSAGE_LIMIT`] and then [`MESSAGE_CUT`], once.
    /// Returns what was added (to publish), if anything.
    fn add(&mut self, mut text: String) -> Option<String> {
        if self.cut {
            return None;
        }
        // Room is kept for the cut's line: a message never passes the limit.
        let room = (MESSAGE_LIMIT - MESSAGE_CUT.len()).saturating_sub(self.text.len());
        if text.len() > room {
            let at = (0..=room).rev().find(|at| text.is_char_boundary(*at)).unwrap_or(0);
            text.truncate(at);
            text.push_str(MESSAGE_CUT);
            self.cut = true;
        }
        self.text.push_str(&text);
        Some(text)
    }
}

struct State {
    phase: Phase,
    link: Option<Arc<dyn Link>>,
    /// Which connection's events count: bumped whenever a link is taken away, so a late report of an old
    /// connection changes nothing.
    generation: u64,
    backend_session: Option<String>,
    credential: Option<String>,
    turn: Option<Turn>,
    turns: u64,
    message: Option<OpenMessage>,
    messages: u64,
    /// Which run of the game this is for the session: 0 in the run that created it, then one more each time a run
    /// takes it up from its record. Its message ids carry it, so they never repeat across runs.
    run: u64,
    usage: Option<Usage>,
    /// Whether the game's instructions (its system prompt) have yet to reach the agent, and so go with the next
    /// turn (an agent that takes no system prompt): until a turn that carried them ended, through re-attaches and
    /// (in the record) restarts; a turn refused or failed, or a session ended before its first turn, did not
    /// deliver them.
    instructions_owed: bool,
    /// The connection a failure stopped, which may still be writing what the game keeps of the session (an
    /// OpenAI-compatible session's history): the next connect, and an end, wait until it [settled](Link::settled).
    stopped: Option<Arc<dyn Link>>,
    /// The agent's exit reported while this generation's connection was still being made: nothing is published
    /// then (the game has no session to hear of yet, and a connect that fails reports it itself); a connect that
    /// succeeds fails the session with it at once.
    exited_while_connecting: Option<ToolError>,
    /// A turn being started: its text is not sent yet (the game's observation for it is awaited).
    starting: Option<StartingTurn>,
    /// Turns started so far, counting those being started: each gets its own number.
    startings: u64,
}

#[derive(Clone, Copy)]
struct StartingTurn {
    id: u64,
    /// The player cancelled it before it was sent: it is not.
    cancelled: bool,
}

/// A turn being started (the game's observation for it awaited, H14): a cancel meanwhile stops it before its
/// text is sent, and another text is `SESSION_BUSY` until it started or was given up (this dropped).
pub(crate) struct TurnStart {
    core: Arc<SessionCore>,
    id: u64,
}

impl Drop for TurnStart {
    fn drop(&mut self) {
        let mut state = self.core.state.lock();
        if state.starting.is_some_and(|starting| starting.id == self.id) {
            state.starting = None;
        }
    }
}

pub(crate) struct SessionCore {
    pub id: ConversationId,
    pub config: SessionConfig,
    host: Arc<SessionHost>,
    state: Mutex<State>,
    /// End and resume, one at a time.
    lifecycle: tokio::sync::Mutex<()>,
    /// Counts the ends asked for: a resume asked for before one stops when it comes, also while it connects (an
    /// agent that does not answer, a sign-in in a browser), instead of holding the end up until it is done.
    ends: tokio::sync::watch::Sender<u64>,
    /// Forgotten by the game (`AgentSessions::forget`): ended for good, never resumed. Not in `state`: errors
    /// built while `state` is held read it.
    forgotten: AtomicBool,
}

impl SessionCore {
    pub(crate) fn new(id: ConversationId, config: SessionConfig, host: Arc<SessionHost>, phase: Phase) -> Arc<Self> {
        Arc::new(Self {
            id,
            config,
            host,
            state: Mutex::new(State {
                phase,
                link: None,
                generation: 0,
                backend_session: None,
                credential: None,
                turn: None,
                turns: 0,
                message: None,
                messages: 0,
                run: 0,
                usage: None,
                instructions_owed: false,
                stopped: None,
                exited_while_connecting: None,
                starting: None,
                startings: 0,
            }),
            lifecycle: tokio::sync::Mutex::new(()),
            ends: tokio::sync::watch::Sender::new(0),
            forgotten: AtomicBool::new(false),
        })
    }

    /// Begins a turn, to be sent by [`start_turn`](Self::start_turn) once prepared; refused as `start_turn`
    /// would refuse it (ended, failed, a turn running), or while another is being started.
    pub(crate) fn begin_turn(self: &Arc<Self>) -> Result<TurnStart, ToolError> {
        let mut state = self.state.lock();
        self.refusal(&state)?;
        if state.starting.is_some() {
            return Err(ToolError::with_code(
                ErrorCode::SessionBusy,
                format!("a turn of session `{}` is being sent: wait for it to end, or cancel it", self.id),
            )
            .with_detail("session", &self.id));
        }
        state.startings += 1;
        let id = state.startings;
        state.starting = Some(StartingTurn { id, cancelled: false });
        Ok(TurnStart { core: self.clone(), id })
    }

    fn refusal(&self, state: &State) -> Result<(), ToolError> {
        match &state.phase {
            Phase::Ended => return Err(self.ended_error()),
            Phase::Failed(error) => return Err(error.clone()),
            Phase::Live => {}
        }
        match &state.turn {
            Some(turn) => Err(ToolError::with_code(
                ErrorCode::SessionBusy,
                format!(
                    "turn {} of session `{}` is still running: wait for it to end, or cancel it",
                    turn.number, self.id
                ),
            )
            .with_detail("session", &self.id)),
            None => Ok(()),
        }
    }

    pub(crate) fn usage(&self) -> Option<Usage> {
        self.state.lock().usage.clone()
    }

    pub(crate) fn backend_session(&self) -> Option<String> {
        self.state.lock().backend_session.clone()
    }

    pub(crate) fn set_backend_session(&self, backend_session: Option<String>) {
        self.state.lock().backend_session = backend_session;
    }

    /// The credential, for tests of revocation.
    pub(crate) fn credential(&self) -> Option<String> {
        self.state.lock().credential.clone()
    }
}

/// Numbers for permission requests, unique in the process.
pub(crate) static PERMISSION_REQUESTS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn next_permission_request() -> u64 {
    PERMISSION_REQUESTS.fetch_add(1, Ordering::Relaxed) + 1
}

impl PermissionBook {
    /// Decides a request by the session's policy, or asks the player.
    pub(crate) fn ask(&self, core: &Arc<SessionCore>, asking: Asking) {
        let (policy, timeout) = (core.config.permissions, core.config.timeouts.permission);
        self.decide(core.id.clone(), policy, timeout, asking);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message() -> OpenMessage {
        OpenMessage { id: "m".into(), agent_id: None, text: String::new(), cut: false }
    }

    #[test]
    fn a_message_streamed_without_end_is_cut_at_its_limit_once_and_says_so() {
        let mut open = message();
        let piece = "é".repeat(300 * 1024); // 600 KiB, two bytes a character: a cut must fall between them
        assert_eq!(open.add(piece.clone()).as_deref(), Some(piece.as_str()), "under the limit: all of it");
        let added = open.add(piece.clone()).expect("what fits, then the line saying the rest was cut");
        assert!(added.ends_with(MESSAGE_CUT) && added.len() < piece.len());
        assert!(open.text.len() <= MESSAGE_LIMIT, "{}", open.text.len());
        assert_eq!(open.add("more".into()), None, "nothing is added after the cut");
        assert_eq!(open.text.matches(MESSAGE_CUT).count(), 1);

        // Filled to just under the cut's line: the next piece is the line alone, and the message is at the limit.
        let mut full = message();
        full.add("a".repeat(MESSAGE_LIMIT - MESSAGE_CUT.len())).expect("fits");
        assert_eq!(full.add("b".into()).as_deref(), Some(MESSAGE_CUT));
        assert_eq!(full.text.len(), MESSAGE_LIMIT);
    }
}
