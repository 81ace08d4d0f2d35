//! How a turn's end and the connection's end reach the session core: in the order the agent sent them, and each
//! reported once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::v1::schema::PromptResponse;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Agent;

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

/// How the game signs in again when the agent refuses a turn for a sign-in (a login that expired): the connection,
/// the method the game chose ([`SessionConfig::auth_method`](crate::session::SessionConfig::auth_method)) and how
/// long a sign-in may take.
#[derive(Clone)]
pub(super) struct SignInAgain {
    pub cx: ConnectionTo<Agent>,
    pub method: String,
    pub timeout: Duration,
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
            // A sign-in the agent asks for during the session (its login expired), with a method the game chose:
            // signed in again, then the turn is refused (it did not run), and the player may send again.
            Err(error) if self.sign_in.asked(&error).is_some() && self.again.is_some() => {
                let (asked, again) = (self.sign_in.asked(&error), self.again.take());
                if let (Some(asked), Some(again)) = (asked, again) {
                    self.sign_in_again(asked, again);
                }
                return;
            }
            // The agent's own trouble (a sign-in it needs, its provider's rate limit, a context too long): this
            // turn fails, the agent stays, and the player may send again.
            Err(error) => {
                let error =
                    self.sign_in.required(&error).unwrap_or_else(|| unavailable("the agent failed the turn", &error));
                BackendEvent::TurnRefused { turn, error }
            }
        };
        (self.sink)(event);
        self.ending.turn_ended(&self.sink, &self.exit);
    }

    /// Signs in again with the game's method (`asked`: what the agent said), on a task of its own (the answer's
    /// callback waits for nothing), then refuses the turn saying so, or why the sign-in failed.
    fn sign_in_again(&self, asked: String, again: SignInAgain) {
        let (sink, exit, ending, sign_in, turn) =
            (self.sink.clone(), self.exit.clone(), self.ending.clone(), self.sign_in.clone(), self.turn);
        let report = move |error: ToolError| {
            sink(BackendEvent::TurnRefused { turn, error: error.with_detail("auth_required", true) });
            ending.turn_ended(&sink, &exit);
        };
        let SignInAgain { cx, method, timeout } = again;
        let unsigned = ToolError::with_code(ErrorCode::AgentUnavailable, asked.clone());
        let signing_in = async move {
            match tokio::time::timeout(timeout, sign_in.authenticate(&cx, &method)).await {
                Ok(Ok(())) => {
                    tracing::info!(%method, %asked, "the agent asked for a sign-in during the session: signed in again");
                    let message = format!("{asked}; the game signed in again with `{method}`: send the text again");
                    ToolError::with_code(ErrorCode::AgentUnavailable, message).with_detail("signed_in_again", true)
                }
                Ok(Err(error)) => error,
                Err(_) => ToolError::with_code(
                    ErrorCode::AgentUnavailable,
                    format!("{asked}; signing in again with `{method}` took longer than {timeout:?}"),
                ),
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(async move { report(signing_in.await) })),
            // Not on a runtime (the connection's tasks run on the plugin's): refused as it is.
            Err(_) => report(unsigned),
        }
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

impl Drop for TurnAnswer {
    fn drop(&mut self) {
        if !self.reported {
            self.agent_gone(None);
        }
    }
}
