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

    /// Takes the session up in this run, from its record (`ended`, `runs`, `instructions_owed` as it says): this
    /// run's number is written to the record before the session can say anything, so that a message id of this run
    /// is never one of an earlier run, even one that stopped without a word (a crash).
    pub(crate) async fn take_up(&self, record: &Record) {
        {
            let mut state = self.state.lock();
            state.run = record.runs.saturating_add(1);
            state.instructions_owed = record.instructions_owed;
        }
        self.save_record(record.ended).await;
    }

    /// Starts the agent and opens (or re-attaches, with `resume`) the backend session, under a new credential
    /// (for an agent that reaches the tools over MCP). On success the session is live; on failure nothing is left
    /// running and the credential is revoked.
    ///
    /// With `ends` (a resume's), an end asked for meanwhile stops it while the agent starts (`SESSION_ENDED`): the
    /// agent is stopped and the credential revoked; once the session went live, it goes on, and the end ends it.
    pub(crate) async fn connect(
        self: &Arc<Self>,
        resume: Option<String>,
        new_if_unresumable: bool,
        mut ends: Option<tokio::sync::watch::Receiver<u64>>,
    ) -> Result<Attached, ToolError> {
        // Whatever happens next, the previous connection's stop is waited for (its history written, its process
        // gone) before this one starts, or the end that stops this one ends.
        self.settle_stopped().await;
        let starting = async {
            let (session_dir, working_directory) = self.host.session_dirs(&self.id).await?;
            // Only an agent process gets a credential: a backend the game runs calls the tools in process.
            let mcp = if self.config.backend.reaches_tools_over_mcp() {
                self.host.endpoint(&self.id, self.config.timeouts.start).await?
            } else {
                Err("the game calls this backend's tools in process".to_string())
            };
            // Revoked unless the session takes it: on a failure, and if this future is dropped midway.
            let minted = Minted { host: &self.host, credential: mcp.as_ref().ok().map(|e| e.credential.clone()) };
            let generation = {
                let mut state = self.state.lock();
                state.generation += 1;
                state.exited_while_connecting = None;
                state.generation
            };
            let setup = super::backend::Setup {
                mcp,
                working_directory,
                system_prompt: self.config.system_prompt.clone(),
                resume,
                new_if_unresumable,
                timeouts: self.config.timeouts.clone(),
                close_within: self.close_within(),
                agent: self.host.agent.clone(),
                conversation: self.id.clone(),
                session_dir,
            };
            let sink = self.sink(generation);
            let connected = self.host.backend(&self.config).connect(setup, sink).await?;
            Ok::<_, ToolError>((minted, generation, connected))
        };
        let ended = async {
            match ends.as_mut() {
                // (The sender lives as long as this session: an error never comes.)
                Some(ends) => drop(ends.changed().await),
                None => std::future::pending().await,
            }
        };
        let (mut minted, generation, (link, attached, system_prompt_sent)) = tokio::select! {
            biased;
            () = ended => return Err(self.ended_while_resumed()),
            started = starting => started?,
        };
        let (refused, exited) = {
            let mut state = self.state.lock();
            let exited = state.exited_while_connecting.take();
            let refused = if state.generation != generation {
                // Ended (or replaced) while it connected: this connection is nobody's.
                Some(self.ended_error())
            } else if let Err(error) = self.reopen(&state.phase) {
                // Not left running without a conversation to speak in.
                state.phase = Phase::Failed(error.clone());
                Some(error)
            } else {
                state.link = Some(link.clone());
                state.backend_session = Some(link.backend_session().to_string());
                if let Some(old) = std::mem::replace(&mut state.credential, minted.credential.take()) {
                    self.host.revoke(&old);
                }
                // An agent that took them as its system prompt has them; a new agent session gets them with its
                // first turn; a re-attached one, if they never reached it.
                if system_prompt_sent {
                    state.instructions_owed = false;
                } else if matches!(attached, Attached::New | Attached::Replaced) {
                    state.instructions_owed = self.config.system_prompt.is_some();
                }
                state.phase = Phase::Live;
                None
            };
            (refused, exited)
        };
        if let Some(error) = refused {
            link.kill();
            return Err(error);
        }
        self.save_record(false).await;
        if let Some(error) = exited {
            self.fail(error);
        }
        Ok(attached)
    }

    /// The status change of a session going live from `phase`, published under the state lock: a failed one
    /// goes `Idle`, an ended one's conversation is reopened (`Ended → Idle`), a new one is `Idle` already.
    fn reopen(&self, phase: &Phase) -> Result<(), ToolError> {
        self.host.agent.host().conversations.suspend(&self.id, None);
        match phase {
            Phase::Live => Ok(()),
            Phase::Failed(_) => {
                self.host.set_status(&self.id, ConversationStatus::Idle);
                Ok(())
            }
            Phase::Ended => self.host.agent.host().conversations.reactivate(&self.id),
        }
    }

    /// Stops what [`connect`](Self::connect) started for a session nobody will hold (its `create` or
    /// `resume_session` failed, or its caller dropped it midway): the agent is killed and the credential
    /// revoked, its permission requests withdrawn. Publishes nothing else: the conversation is forgotten by the
    /// caller. Returns whether the agent had been connected.
    pub(crate) fn abandon(&self) -> bool {
        let link = {
            let mut state = self.state.lock();
            state.phase = Phase::Ended;
            self.host.permissions.withdraw_all(&self.id, PermissionDecision::Deny);
            self.take_connection(&mut state)
        };
        let connected = link.is_some();
        if let Some(link) = link {
            link.kill();
        }
        connected
    }

    /// Waits until the connection a failure stopped has written what it keeps (bounded by the backend).
    async fn settle_stopped(&self) {
        let stopped = self.state.lock().stopped.take();
        if let Some(link) = stopped {
            link.settled().await;
        }
    }

    /// Takes the connection away, under the state lock: a new generation (a late report of the old connection
    /// changes nothing), its credential revoked; the link is returned for the caller to stop or close.
    fn take_connection(&self, state: &mut State) -> Option<Arc<dyn Link>> {
        state.generation += 1;
        if let Some(credential) = state.credential.take() {
            self.host.revoke(&credential);
        }
        state.link.take()
    }

    fn sink(self: &Arc<Self>, generation: u64) -> EventSink {
        let core: Weak<Self> = Arc::downgrade(self);
        Arc::new(move |event| {
            if let Some(core) = core.upgrade() {
                core.on_event(generation, event);
            }
        })
    }

    /// Starts a turn: refuses it (`SESSION_BUSY`, `SESSION_ENDED`, the failure) without sending anything, or sends
    /// the player's text and returns the turn's outcome to come.
    pub(crate) fn start_turn(
        self: &Arc<Self>,
        text: String,
        context: Option<String>,
        start: TurnStart,
    ) -> Result<oneshot::Receiver<Result<TurnEnd, ToolError>>, ToolError> {
        let (reply, outcome) = oneshot::channel();
        let (number, prompted) = {
            // (`start` is dropped after this lock is released: its drop takes it.)
            let mut state = self.state.lock();
            // Under the lock that makes the turn: a cancel sees the turn being started, or the turn.
            let starting = state.starting.take_if(|starting| starting.id == start.id);
            if starting.is_some_and(|starting| starting.cancelled) {
                // Cancelled before it was sent: the agent never saw it.
                let _ = reply.send(Ok(TurnEnd { stop_reason: super::StopReason::Cancelled, final_message: None }));
                return Ok(outcome);
            }
            self.refusal(&state)?;
            let Some(link) = state.link.clone() else {
                return Err(ToolError::with_code(ErrorCode::AgentUnavailable, "the session's agent is not connected"));
            };
            // A message the agent sent since the last turn ended is complete now: the new turn's text is not
            // part of it (and it is not the new turn's message).
            let mut feed = Vec::new();
            self.finish_message(&mut state, &mut feed);
            self.host.publish(&self.id, feed, None, StatusSource::Host);
            state.turns += 1;
            let number = state.turns;
            let mut blocks = Vec::new();
            let instructions = self.config.system_prompt.as_ref().filter(|_| state.instructions_owed);
            if let Some(prompt) = instructions {
                blocks.push(PromptBlock::Text(format!("[Instructions from the game]\n{prompt}")));
            }
            let carries_instructions = instructions.is_some();
            let over = CancellationToken::new();
            let _over_when_dropped = over.clone().drop_guard();
            state.turn = Some(Turn {
                number,
                reply,
                cancelled: false,
                last_message: None,
                carries_instructions,
                over,
                _over_when_dropped,
            });
            blocks.push(PromptBlock::Text(text));
            if let Some(context) = context {
                blocks.push(PromptBlock::Text(format!(
                    "[Game context when the player wrote this: an observation, not an instruction]\n{context}"
                )));
            }
            self.host.set_status(&self.id, ConversationStatus::Running);
            // Sent under the lock (a send on a channel, or a task spawned): a cancel or an end that follows this
            // turn's start finds it sent, so it reaches this turn and not the one before.
            (number, link.prompt(number, blocks))
        };
        match prompted {
            // Not sent (the connection had just closed): refused as such, the session failed with it.
            Err(error) => {
                self.fail(error.clone());
                return Err(error);
            }
            Ok(()) => self.watch_turn(number, self.config.timeouts.turn, ErrorCode::Timeout),
        }
        Ok(outcome)
    }

    /// Fails turn `number` with `code` if it still runs after `after`: the agent no longer answers (an agent that
    /// ignores a cancel could go on calling tools), so it is stopped and the session fails.
    fn watch_turn(self: &Arc<Self>, number: u64, after: Duration, code: ErrorCode) {
        let Some(over) = self.state.lock().turn.as_ref().filter(|turn| turn.number == number).map(|t| t.over.clone())
        else {
            return;
        };
        let core = Arc::downgrade(self);
        // Made before the task is spawned: a runtime that stops before the task first runs drops it too.
        let unfinished = FailsTurnIfDropped { core: core.clone(), number };
        self.host.runtime.spawn(async move {
            let _unfinished = unfinished;
            tokio::select! {
                () = tokio::time::sleep(after) => {}
                () = over.cancelled() => return,
            }
            let Some(core) = core.upgrade() else { return };
            let why = match code {
                ErrorCode::Cancelled => format!("the agent did not end the cancelled turn within {after:?}"),
                _ => format!("the agent did not end the turn within {after:?}"),
            };
            // Only if that turn still runs (checked under the same lock as the failure: not a next turn).
            let error = ToolError::with_code(code, format!("{why}; it was stopped (resume to restart it)"));
            core.fail_turn(Some(number), error);
        });
    }

    /// Asks the agent to cancel the running turn. Returns whether a turn was running.
    pub(crate) fn cancel(self: &Arc<Self>) -> bool {
        let number = {
            let mut state = self.state.lock();
            if state.turn.is_none() {
                // A turn still being started is not sent.
                return match state.starting.as_mut() {
                    Some(starting) if !starting.cancelled => {
                        starting.cancelled = true;
                        true
                    }
                    _ => false,
                };
            }
            let state = &mut *state;
            let (Some(turn), Some(link)) = (state.turn.as_mut(), &state.link) else { return false };
            // Before the agent hears of it: a call it makes from now on, sent before it read the cancel, is refused.
            turn.cancelled = true;
            self.host.agent.host().conversations.suspend(&self.id, Some(Suspension::TurnCancelled));
            link.cancel();
            // After `session/cancel` the agent waits for its pending permission requests' answers: `cancelled`.
            // Under the lock: they are this turn's, not a next one's.
            self.host.permissions.withdraw_all(&self.id, PermissionDecision::Cancelled);
            turn.number
        };
        self.watch_turn(number, self.config.timeouts.cancel_grace, ErrorCode::Cancelled);
        true
    }

    fn on_event(self: &Arc<Self>, generation: u64, event: BackendEvent) {
        let mut feed = Vec::new();
        let mut failure = None;
        let mut ended_turn = None;
        let mut instructions_delivered = false;
        {
            let mut state = self.state.lock();
            if state.generation != generation {
                // A report from a connection that was taken away; a permission request is denied by dropping it.
                return;
            }
            if state.link.is_none() {
                // The connection is still being made: nothing is published. An exit is kept for `connect`, usage
                // is kept (a resumed session's agent may report it before it answers); the rest (a straggler of
                // a load's replay) goes, and a permission request is denied by dropping it.
                match event {
                    BackendEvent::Exited(error) => state.exited_while_connecting = Some(exit_error(error)),
                    BackendEvent::Usage(usage) => state.usage = Some(usage),
                    _ => {}
                }
                return;
            }
            if !matches!(state.phase, Phase::Live) {
                return;
            }
            // A turn the player cancelled that the agent answers with an error (Gemini CLI's "This operation was
            // aborted", `-32603`) ended as cancelled, as ACP asks of a cancelled turn: not the agent's failure.
            let event = match event {
                BackendEvent::TurnRefused { turn, error }
                    if state.turn.as_ref().is_some_and(|running| running.number == turn && running.cancelled) =>
                {
                    tracing::debug!(session = %self.id, %error, "the agent answered the cancelled turn with an error");
                    BackendEvent::TurnEnded { turn, stop: super::StopReason::Cancelled }
                }
                event => event,
            };
            match event {
                BackendEvent::MessageChunk { message, text } => {
                    let continues =
                        state.message.as_ref().is_some_and(|open| message.is_none() || open.agent_id == message);
                    if !continues {
                        self.finish_message(&mut state, &mut feed);
                        state.messages += 1;
                        let id = match state.run {
                            0 => format!("{}-m{}", self.id, state.messages),
                            run => format!("{}-r{run}-m{}", self.id, state.messages),
                        };
                        state.message = Some(OpenMessage { id, agent_id: message, text: String::new(), cut: false });
                    }
                    if let Some((open, text)) =
                        state.message.as_mut().and_then(|open| open.add(text).map(|t| (open, t)))
                    {
                        feed.push(ConversationEvent::ChatDelta(ChatDelta {
                            session: self.id.clone(),
                            message: open.id.clone(),
                            text,
                            sequence: 0,
                        }));
                    }
                }
                BackendEvent::ToolCall => self.finish_message(&mut state, &mut feed),
                BackendEvent::Usage(usage) => state.usage = Some(usage),
                BackendEvent::Permission { tool, kind, input, game_tool, allow_once, reply, withdrawn } => {
                    if state.turn.as_ref().is_some_and(|turn| turn.cancelled) {
                        // Sent before the agent read the player's cancel: answered as ACP asks of every request
                        // pending at a cancel, without asking anyone.
                        let _ = reply.send(PermissionDecision::Cancelled);
                    } else if game_tool {
                        let _ = reply.send(PermissionDecision::Allow);
                    } else if !allow_once {
                        // Only a standing allow is offered: nobody is asked to give one. Refused, as the game's
                        // answer would have to be.
                        tracing::info!(session = %self.id, %tool, "the agent asks permission offering no one-time allow: refused");
                        let _ = reply.send(PermissionDecision::Deny);
                    } else {
                        // Under the lock: an end or a failure after this withdraws the request it puts to the player.
                        self.host.permissions.ask(self, Asking { tool, kind, input, reply, withdrawn });
                    }
                }
                BackendEvent::TurnEnded { turn, stop } => {
                    if state.turn.as_ref().is_some_and(|running| running.number == turn) {
                        // Prompts the agent left open are its ended turn's: the player is not left answering them.
                        self.host.permissions.withdraw_all(&self.id, PermissionDecision::Cancelled);
                        self.finish_message(&mut state, &mut feed);
                        ended_turn = state.turn.take().map(|turn| (turn, Ok(stop)));
                        // A refusal leaves the prompt out of what the agent keeps (ACP): still owed then.
                        let kept = stop != super::StopReason::Refusal;
                        if kept && ended_turn.as_ref().is_some_and(|(turn, _)| turn.carries_instructions) {
                            state.instructions_owed = false;
                            instructions_delivered = true;
                        }
                        self.end_cancel_suspension();
                    }
                }
                BackendEvent::TurnRefused { turn, error } => {
                    if state.turn.as_ref().is_some_and(|running| running.number == turn) {
                        // Prompts the refused turn left open are its own, not the next turn's.
                        self.host.permissions.withdraw_all(&self.id, PermissionDecision::Cancelled);
                        self.finish_message(&mut state, &mut feed);
                        feed.push(self.chat_error(&error, ChatErrorScope::Turn));
                        ended_turn = state.turn.take().map(|turn| (turn, Err(error)));
                        self.end_cancel_suspension();
                    }
                }
                BackendEvent::TurnFailed { turn, error } => {
                    if state.turn.as_ref().is_some_and(|running| running.number == turn) {
                        failure = Some(error);
                    }
                }
                BackendEvent::Notice(error) => feed.push(self.chat_error(&error, ChatErrorScope::Notice)),
                BackendEvent::Exited(error) => failure = Some(exit_error(error)),
            }
            let idle = ended_turn.as_ref().map(|_| ConversationStatus::Idle);
            // The turn's end is the agent's word.
            self.host.publish(&self.id, feed, idle, StatusSource::Agent);
        }
        if instructions_delivered {
            // In the record too: a session kept to be resumed after a restart is not sent them again (its
            // disconnect at the game's exit writes no record).
            let core = self.clone();
            self.host.runtime.spawn(async move { core.save_record_as_it_is().await });
        }
        // Commit, then notify: the status is `Idle` before the turn's waiter hears of its end.
        if let Some((turn, end)) = ended_turn {
            let end = end.map(|stop_reason| TurnEnd { stop_reason, final_message: turn.last_message });
            let _ = turn.reply.send(end);
        }
        if let Some(error) = failure {
            self.fail(error);
        }
    }

    /// A cancelled turn ended: its agent's calls are admitted again (unless the session failed meanwhile).
    fn end_cancel_suspension(&self) {
        self.host.agent.host().conversations.end_suspension(&self.id, Suspension::TurnCancelled);
    }

    /// What the player is shown of an error, and what it ended.
    fn chat_error(&self, error: &ToolError, scope: ChatErrorScope) -> ConversationEvent {
        ConversationEvent::ChatError(ChatError {
            session: self.id.clone(),
            code: error.code.clone(),
            message: error.message.clone(),
            scope,
            sequence: 0,
        })
    }

    /// Completes the open message: a `ChatMessage`, and the turn's last message.
    fn finish_message(&self, state: &mut State, feed: &mut Vec<ConversationEvent>) {
        if let Some(open) = state.message.take() {
            if let Some(turn) = state.turn.as_mut() {
                turn.last_message = Some(open.text.clone());
            }
            feed.push(ConversationEvent::ChatMessage(ChatMessage {
                session: self.id.clone(),
                message: open.id,
                text: open.text,
                sequence: 0,
            }));
        }
    }

    /// The backend failed: the running turn fails with `error`, the agent is stopped, the status is `Error`.
    pub(crate) fn fail(self: &Arc<Self>, error: ToolError) {
        self.fail_turn(None, error);
    }

    /// [`fail`](Self::fail), only while turn `number` runs when it is given.
    fn fail_turn(self: &Arc<Self>, number: Option<u64>, error: ToolError) {
        let mut feed = Vec::new();
        let (link, turn) = {
            let mut state = self.state.lock();
            if !matches!(state.phase, Phase::Live) {
                return;
            }
            if number.is_some() && state.turn.as_ref().map(|turn| turn.number) != number {
                return;
            }
            state.phase = Phase::Failed(error.clone());
            // Before the credential is revoked: a request that passed its check just before is refused too.
            self.host.agent.host().conversations.suspend(&self.id, Some(Suspension::Failed));
            let link = self.take_connection(&mut state);
            state.stopped.clone_from(&link);
            self.finish_message(&mut state, &mut feed);
            self.host.publish(&self.id, std::mem::take(&mut feed), None, StatusSource::Host);
            // Before `Error`, as before `Ended`: a prompt the player sees goes before its session's failure.
            self.host.permissions.withdraw_all(&self.id, PermissionDecision::Cancelled);
            feed.push(self.chat_error(&error, ChatErrorScope::Session));
            self.host.publish(&self.id, feed, Some(ConversationStatus::Error), StatusSource::Host);
            (link, state.turn.take())
        };
        tracing::warn!(session = %self.id, code = %error.code, message = %error.message, "the in-game agent session failed");
        if let Some(link) = link {
            link.kill();
        }
        // The agent is gone, so are its tool calls still running in the game: nobody would read their results,
        // and the world must not go on changing for a turn that failed (as a cancelled turn's calls stop).
        let why = format!("the game stopped the call: its in-game agent session failed ({})", error.code);
        let stopped = self.host.agent.host().cancel_calls(&self.id, None, &why);
        tracing::debug!(session = %self.id, stopped, "the failed session's tool calls were cancelled");
        if let Some(turn) = turn {
            let _ = turn.reply.send(Err(error));
        }
    }

    /// Ends the session (`end_session`: the agent is asked to end its session too; else it is only
    /// disconnected, for a later `resume_session`). Pending work rejects with `SESSION_ENDED`; `Ended` is
    /// published once; ending again does nothing. Resolves when the agent process is gone.
    /// (A resume asked for before the end is stopped by whoever asked for the end, when it was asked:
    /// [`stop_resuming`](Self::stop_resuming).)
    /// The agent is given the session's close timeout to answer `session/close`, and less once the game exits
    /// ([`CloseWithin`](super::backend::CloseWithin)).
    pub(crate) async fn end(self: &Arc<Self>, end_session: bool) {
        let _lifecycle = self.lifecycle.lock().await;
        self.end_locked(end_session).await;
    }

    /// Stops a resume asked for before now (it is `SESSION_ENDED`): an end is coming.
    pub(crate) fn stop_resuming(&self) {
        self.ends.send_modify(|ends| *ends += 1);
    }

    /// Whether the session ended (and is not live again).
    pub(crate) fn is_ended(&self) -> bool {
        matches!(self.state.lock().phase, Phase::Ended)
    }

    /// Ends the session (as [`end`](Self::end)) for good: a later `resume` is `SESSION_NOT_FOUND`.
    pub(crate) async fn end_and_forget(self: &Arc<Self>) {
        // (A resume asked for before the forget was stopped when it was asked: `AgentSessions::forget`.)
        let _lifecycle = self.lifecycle.lock().await;
        // First: the turn this end rejects already says so.
        self.forgotten.store(true, Ordering::Relaxed);
        self.end_locked(true).await;
    }

    async fn end_locked(self: &Arc<Self>, end_session: bool) {
        // Before the record is saved, and before `forget` removes the session's folder.
        self.settle_stopped().await;
        let (link, turn) = {
            let mut state = self.state.lock();
            if matches!(state.phase, Phase::Ended) {
                return;
            }
            state.phase = Phase::Ended;
            let mut feed = Vec::new();
            self.finish_message(&mut state, &mut feed);
            self.host.publish(&self.id, feed, None, StatusSource::Host);
            // Before `Ended`: a prompt the player sees goes before its session does. The end cancels the turn the
            // requests belong to (`stop_for_end`), and ACP has every request pending at a cancel answered
            // `cancelled`: not a rejection the player never made, which the agent would remember.
            self.host.permissions.withdraw_all(&self.id, PermissionDecision::Cancelled);
            // A turn under way stops now, not after the record is saved: no more model requests or tool calls.
            if let (Some(_), Some(link)) = (&state.turn, &state.link) {
                link.stop_for_end();
            }
            (self.take_connection(&mut state), state.turn.take())
        };
        // Publishes `Ended` once and ends the session's tool calls still in flight (`CANCELLED`); the visit is
        // untouched (S3).
        let _ = self.host.agent.host().conversations.end(&self.id);
        if let Some(turn) = turn {
            let _ = turn.reply.send(Err(self.ended_error()));
        }
        // Disconnected only (a kept session at the game's exit), it stays resumable: written as it is, not ended.
        // The agent is stopped meanwhile: a slow disk does not keep it running.
        let close = async {
            if let Some(link) = link {
                link.close(end_session, self.close_within()).await;
            }
        };
        tokio::join!(self.save_record(end_session), close);
    }

    /// `Ended` or `Error` → `Idle`: reconnects the agent and re-attaches the backend session (or starts a new
    /// one where it cannot, and says so). A live session is left as it is.
    ///
    /// `ends` ([`watch_ends`](Self::watch_ends), taken when the resume was asked for): an end asked for since
    /// stops it (`SESSION_ENDED`), whether it still waits its turn or its agent starts.
    pub(crate) async fn resume(
        self: &Arc<Self>,
        ends: tokio::sync::watch::Receiver<u64>,
    ) -> Result<Attached, ToolError> {
        let _lifecycle = self.lifecycle.lock().await;
        if ends.has_changed().unwrap_or(false) {
            return Err(self.ended_while_resumed());
        }
        let backend_session = {
            let state = self.state.lock();
            if self.forgotten.load(Ordering::Relaxed) {
                return Err(super::record::not_found(self.id.as_str()).with_detail("forgotten", true));
            }
            if matches!(state.phase, Phase::Live) {
                return Ok(Attached::Resumed);
            }
            state.backend_session.clone()
        };
        // Going live publishes `Idle` (and reopens an ended session's conversation) with the change of phase.
        self.connect(backend_session, true, Some(ends)).await
    }

    /// Watches for ends asked for from now on: what a resume asked for now goes by.
    pub(crate) fn watch_ends(&self) -> tokio::sync::watch::Receiver<u64> {
        self.ends.subscribe()
    }

    fn ended_while_resumed(&self) -> ToolError {
        ToolError::with_code(
            ErrorCode::SessionEnded,
            format!("session `{}` was ended while it was being resumed", self.id),
        )
        .with_detail("session", &self.id)
    }

    /// How long the agent is given to close: the session's close timeout, cut short by the game's exit.
    fn close_within(&self) -> super::backend::CloseWithin {
        super::backend::CloseWithin::new(self.config.timeouts.close, self.host.exiting.clone())
    }

    pub(crate) fn ended_error(&self) -> ToolError {
        let next =
            if self.forgotten.load(Ordering::Relaxed) { "it was forgotten" } else { "resume it to use it again" };
        ToolError::with_code(ErrorCode::SessionEnded, format!("session `{}` has ended: {next}", self.id))
            .with_detail("session", &self.id)
    }

    /// Writes the record as the session is now, after any end or resume under way; not once it ended (its end
    /// wrote the record as it left it).
    async fn save_record_as_it_is(&self) {
        let _lifecycle = self.lifecycle.lock().await;
        if !matches!(self.state.lock().phase, Phase::Ended) {
            self.save_record(false).await;
        }
    }

    async fn save_record(&self, ended: bool) {
        let (backend_session, runs, instructions_owed) = {
            let state = self.state.lock();
            (state.backend_session.clone(), state.run, state.instructions_owed)
        };
        let owner = Some(super::runs::this_run());
        let record = Record {
            id: self.id.to_string(),
            config: self.config.clone(),
            backend_session,
            ended,
            runs,
            owner,
            instructions_owed,
        };
        self.host.records.save(record).await;
    }

    /// The credential, for tests of revocation.
    pub(crate) fn credential(&self) -> Option<String> {
        self.state.lock().credential.clone()
    }
}

/// A credential minted for a connection being made: revoked when dropped unless the session took it.
struct Minted<'a> {
    host: &'a SessionHost,
    credential: Option<String>,
}

impl Drop for Minted<'_> {
    fn drop(&mut self) {
        if let Some(credential) = &self.credential {
            self.host.revoke(credential);
        }
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

/// What an agent's exit fails its session with: the backend's account of it, or that it exited.
fn exit_error(reported: Option<ToolError>) -> ToolError {
    reported.unwrap_or_else(|| ToolError::with_code(ErrorCode::AgentUnavailable, "the agent exited"))
}

/// Held by a turn's timeout task, and dropped when it ends: fails turn `number` if that still runs, which it does
/// only if the task was dropped unfinished, when the runtime stops (the app dropped, or unwound from a panic,
/// without `AppExit`): no task of the runtime is left to answer the turn, and whoever awaits it off the runtime (a
/// game thread, a Bevy task) would wait forever. Otherwise a no-op: the turn is over, and the failure checks the
/// turn's number (numbers are never reused).
struct FailsTurnIfDropped {
    core: std::sync::Weak<SessionCore>,
    number: u64,
}

impl Drop for FailsTurnIfDropped {
    fn drop(&mut self) {
        let Some(core) = self.core.upgrade() else { return };
        let error = ToolError::with_code(ErrorCode::SessionEnded, "the game stopped before the turn ended");
        core.fail_turn(Some(self.number), error);
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
