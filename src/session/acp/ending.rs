//! How a turn's end and the connection's end reach the session core: in the order the agent sent them, and each
//! reported once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use agent_client_protocol::v1::schema::PromptResponse;
use tokio::sync::mpsc::WeakUnboundedSender;

use super::auth::SignIn;
use super::connection::{agent_gone, describe, unavailable, wait_exit, ExitWatch};
use super::updates;
use crate::error::{ErrorCode, ToolError};
use crate::session::backend::{BackendEvent, EventSink, StopReason};

/// The agent going away when the game did not close the connection fails the session at once, saying why,
/// instead of leaving it looking idle until the player's next message. Exactly one reports it: the connection's
/// end when no turn is under way; else the end of the turn under way (during a turn, the turn's failure says
/// it; a turn the agent answered just before it went reports it after that answer).
#[derive(Clone, Default)]
pub(super) struct Ending {
    /// Set when the session core closes the connection (or set-up fails): any other end is the agent's.
    pub closing: Arc<AtomicBool>,
    /// Set once the connection ended (after the exit watch has its reason).
    pub ended: Arc<AtomicBool>,
    /// Turns under way.
    turns: Arc<AtomicUsize>,
    /// Whether the end was reported.
    reported: Arc<AtomicBool>,
}

impl Ending {
    /// Reports the connection's end, `why`, unless the game closed it, a turn is still under way (its end
    /// reports it), or it was reported already.
    pub fn report_exit(&self, sink: &EventSink, why: &str) {
        if self.closing.load(Ordering::SeqCst)
            || self.turns.load(Ordering::SeqCst) != 0
            || self.reported.swap(true, Ordering::SeqCst)
        {
            return;
        }
        let why = if why.is_empty() { "it closed the connection" } else { why };
        let message = format!("the agent stopped: {why}");
        sink(BackendEvent::Exited(Some(ToolError::with_code(ErrorCode::AgentUnavailable, message))));
    }

    /// A turn's end: if the connection ended meanwhile, its end is reported now (after the turn's answer).
    fn turn_ended(&self, sink: &EventSink, exit: &ExitWatch) {
        self.turns.fetch_sub(1, Ordering::SeqCst);
        if self.ended.load(Ordering::SeqCst) {
            let why = exit.borrow().clone().unwrap_or_default();
            self.report_exit(sink, &why);
        }
    }
}

/// A prompt's answer on its way to the session core. Reported from the connection's ordered callback for the
/// answer ([`report`](Self::report)), so the core hears the turn's end after every update the agent sent before
/// its answer and before any it sends after: a message the agent starts right after answering belongs to no turn
/// (it is not added to the turn's final message). An answer that never comes (the agent went away, the request could
/// not be sent, or its response was lost) is reported when this is dropped: as the agent's end if the connection
/// ended, else as the turn refused.
pub(super) struct TurnAnswer {
    turn: u64,
    sink: EventSink,
    exit: ExitWatch,
    ending: Ending,
    sign_in: SignIn,
    again: Option<SignInAgain>,
    reported: bool,
}

/// How the game signs in again when the agent refuses a turn for a sign-in (a login that expired): the method it
/// chose ([`SessionConfig::auth_method`](crate::session::SessionConfig::auth_method)), and the connection's
/// commands, where the sign-in is queued ahead of the next prompt.
#[derive(Clone)]
pub(super) struct SignInAgain {
    pub commands: WeakUnboundedSender<super::Command>,
    pub method: String,
}

impl SignInAgain {
    /// Queues the sign-in; false if the connection is gone.
    fn ask(&self) -> bool {
        self.commands.upgrade().is_some_and(|commands| commands.send(super::Command::SignInAgain).is_ok())
    }
}

impl TurnAnswer {
    /// A turn sent now: it counts as under way until its answer is reported.
    pub fn new(
        turn: u64,
        sink: EventSink,
        exit: ExitWatch,
        ending: Ending,
        sign_in: SignIn,
        again: Option<SignInAgain>,
    ) -> Self {
        ending.turns.fetch_add(1, Ordering::SeqCst);
        Self { turn, sink, exit, ending, sign_in, again, reported: false }
    }

    /// Reports the agent's answer (or the connection's end, which fails the turn). Runs in the connection's
    /// dispatch order, so it waits for nothing.
    pub fn report(mut self, answer: Result<PromptResponse, agent_client_protocol::Error>) {
        self.reported = true;
        let turn = self.turn;
        let event = match answer {
            Ok(response) => BackendEvent::TurnEnded { turn, stop: updates::stop_reason(response.stop_reason) },
            Err(error) if agent_gone(&error) => return self.agent_gone(Some(&error)),
            // Some agents answer a cancelled prompt with ACP's "request cancelled" error rather than the
            // `cancelled` stop reason.
            Err(error) if error.code == agent_client_protocol::ErrorCode::REQUEST_CANCELLED => {
                BackendEvent::TurnEnded { turn, stop: StopReason::Cancelled }
            }
            // The agent still runs but no longer holds the session (Claude's adapter, once its Claude Code process
            // died, forgets it; Codex's, once its app server exited, refuses every prompt): each later text would
            // fail alike. The session fails, and `resume` starts the agent again and re-attaches it.
            Err(error) if lost_the_session(&error) => {
                let why = describe(&error);
                let message = format!("the agent lost the session ({why}): resume it to start the agent again");
                BackendEvent::TurnFailed { turn, error: ToolError::with_code(ErrorCode::AgentUnavailable, message) }
            }
            // The agent's own trouble (a sign-in it needs, its provider's rate limit, a context too long): this
            // turn fails, the agent stays, and the player may send again. A sign-in it asks for during the session
            // (its login expired) with a method the game chose is made again before the next prompt.
            Err(error) => {
                let error = match (self.sign_in.asked(&error), &self.again) {
                    (Some(asked), Some(again)) if again.ask() => {
                        let method = &again.method;
                        let message = format!("{asked}; the game signs in again with `{method}`: send the text again");
                        ToolError::with_code(ErrorCode::AgentUnavailable, message)
                            .with_detail("auth_required", true)
                            .with_detail("signing_in_again", method)
                    }
                    _ => self
                        .sign_in
                        .required(&error)
                        .unwrap_or_else(|| unavailable("the agent failed the turn", &error)),
                };
                BackendEvent::TurnRefused { turn, error }
            }
        };
        (self.sink)(event);
        self.ending.turn_ended(&self.sink, &self.exit);
    }

    /// The agent went away during the turn (`error`; or no answer came, `None`): its exit says why (status,
    /// stderr), and fails the session. The exit's reason comes after the connection's end, so it is waited for (up
    /// to 3 s) on a task of its own. An answer lost while the connection stays (no exit within that time) refuses
    /// the turn instead.
    fn agent_gone(&self, error: Option<&agent_client_protocol::Error>) {
        let (sink, exit, ending, turn) = (self.sink.clone(), self.exit.clone(), self.ending.clone(), self.turn);
        let described = error.map(describe);
        let report = move |exited: Option<Option<String>>| {
            let event = match exited {
                Some(why) => {
                    // This turn's end says it: the connection's end is not reported again.
                    ending.reported.store(true, Ordering::SeqCst);
                    let why = why.or(described).unwrap_or_else(|| "its answer never came".to_string());
                    let message = format!("the agent stopped during the turn: {why}");
                    BackendEvent::Exited(Some(ToolError::with_code(ErrorCode::AgentUnavailable, message)))
                }
                None => {
                    let message = "the agent failed the turn: its answer never came";
                    BackendEvent::TurnRefused {
                        turn,
                        error: ToolError::with_code(ErrorCode::AgentUnavailable, message),
                    }
                }
            };
            sink(event);
            ending.turn_ended(&sink, &exit);
        };
        let gone = error.is_some();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let exit = self.exit.clone();
                drop(runtime.spawn(async move {
                    let exited = tokio::time::timeout(std::time::Duration::from_secs(3), wait_exit(exit)).await;
                    // An error that says the connection ended is the agent's end, even without its reason.
                    report(exited.ok().or(gone.then_some(None)));
                }));
            }
            // Not on a runtime (the connection's tasks run on the plugin's): said without waiting.
            Err(_) => report(gone.then_some(None)),
        }
    }
}

/// Whether a turn's error says the agent no longer holds the session, in the words the agents use (not any error
/// that names a session, nor a process of the agent's own, an MCP server say, that exited): ACP's `-32002`, "session
/// not found" (Claude's and Gemini's adapters), Claude's adapter's "The Claude Agent process exited unexpectedly.
/// Please start a new session.", Codex's "Codex process has exited with code N".
fn lost_the_session(error: &agent_client_protocol::Error) -> bool {
    const THEIR_WORDS: [&str; 3] =
        ["session not found", "agent process exited unexpectedly", "codex process has exited"];
    let words = format!("{} {}", error.message, error.data.as_ref().map(|data| data.to_string()).unwrap_or_default());
    let words = words.to_ascii_lowercase();
    error.code == agent_client_protocol::ErrorCode::RESOURCE_NOT_FOUND || THEIR_WORDS.iter().any(|w| words.contains(w))
}

impl Drop for TurnAnswer {
    fn drop(&mut self) {
        if !self.reported {
            self.agent_gone(None);
        }
    }
}
