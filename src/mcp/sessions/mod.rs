//! MCP 2025-11-25 sessions are conversations. The two end together:
//!
//! - a client that deletes its session, or a session that expires (no request from its client for the
//!   configured idle time, no call in flight, and no `GET` stream of its client open), ends its conversation:
//!   its calls in flight end with `CANCELLED` (a keyed execution another session's retry still waits for goes on
//!   for it); the visit is untouched;
//! - a conversation that the game ends (`AgentHandle::end_conversation`) closes its session, so the client learns
//!   it at its next request (HTTP 404) and, if it follows the specification, starts a new one; the host's
//!   conversation idle timeout (for sessionless clients) leaves a session's conversation alone;
//! - a session whose client presented an in-game agent session's credential is that session's: it never expires
//!   by silence (the agent may wait for the player's next turn for any time, and some clients never open a new
//!   session after a 404), and it closes when the in-game session ends.
//!
//! A call in flight in any conversation a session's calls used (its own, or one named by a handle) is not silence.
//! Nor is a client listening on its session's `GET` stream (Claude Code, the TypeScript and Python SDKs and rmcp's
//! client keep one open while they run): a client can stay quiet for as long as its user does, and Claude Code
//! never opens a new session after a 404, so expiring its session would take its tools away until it restarts.
//! The idle time of a session whose client went away without deleting it starts when its stream closes, or when
//! its client is found to have stopped reading it (its stream is then let go: [`handed_on`]).
//!
//! A session being closed takes no new request (404, as a closed one; a resume of a response stream is still
//! served: [`refuse_closing_sessions`]): a request is counted from before rmcp is
//! handed it, under the lock a close decides under, so a close either waits for it (the game ended the
//! conversation: until its calls end), leaves the session be (expiry, making room), or came first and refuses
//! it; never is a request handed to a session closed under it, its stream ending without its response.
//!
//! Expiry is ours, not rmcp's: rmcp's own keep-alive closes a session's worker but leaves the session in its
//! manager, where nothing observes it.
//!
//! Resumption is ours too. A response stream starts with a priming event and `retry: 3000`, inviting a client
//! whose connection dropped to come back with `Last-Event-ID`; rmcp's manager forgets a stream's events the
//! moment its response is produced, so a client that came back after that got an empty stream and lost the
//! result of a call the game had applied. Here every request stream is drained into a [`StreamLog`] whether or
//! not its client is still connected (or still reading: see [`stream_log`](super::stream_log)), and a `GET` with
//! `Last-Event-ID` gets the events after that id, the result included, then the live ones if the call still runs.
//! Bounded: per session, the logs of the [`FINISHED_STREAMS_KEPT`] most recent finished requests (plus those still
//! running, at most the in-flight limit), each keeping its last [`EVENTS_KEPT`](super::stream_log::EVENTS_KEPT)
//! events (progress older than that is not replayed; the result, being last, always is); all dropped when the
//! session closes. Everything else is rmcp's [`LocalSessionManager`].

mod expiry;
mod manager;
mod refusals;
mod streams;

use expiry::{take_longest_silent, take_longest_silent_idle};
pub(crate) use refusals::{bind_to_agent_sessions, refuse_closing_sessions, refuse_spent_resumes};

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures_core::Stream;
use parking_lot::Mutex;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::common::http_header::{HEADER_LAST_EVENT_ID, HEADER_SESSION_ID};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, SessionError,
};
use rmcp::transport::streamable_http_server::session::{ServerSseMessage, SessionId, SessionManager};
use tokio_util::sync::CancellationToken;

use super::credentials::{BoundConversation, Credentials};
use super::naming::session_conversation;
use super::request_ids::{self, IdKey, RunningIds};
use super::stream_log::{handed_on, parse_event_id, BoxedSseStream, StreamLog, STALL_TIMEOUT};
use crate::agent::AgentHandle;
use crate::conversation::{ConversationEvent, ConversationStatus};
use crate::ids::ConversationId;

/// rmcp's [`LocalSessionManager`] (with its keep-alive off), tying each session's life to its conversation's.
pub(crate) struct ConversationSessions {
    inner: LocalSessionManager,
    agent: AgentHandle,
    /// The in-game agent sessions' live credentials.
    credentials: Credentials,
    idle_timeout: Option<Duration>,
    /// Each open session's conversation and when its client was last heard from.
    open: Arc<Mutex<HashMap<SessionId, Tracked>>>,
    /// The events of each session's request streams, for clients that resume.
    logs: Arc<Mutex<HashMap<SessionId, SessionLogs>>>,
    /// Signalled when a request stream of any session ends.
    request_ended: Arc<tokio::sync::Notify>,
}

/// A finished request stream's events are kept for this many of the session's most recent requests.
pub(crate) const FINISHED_STREAMS_KEPT: usize = 16;
/// One session's request streams by rmcp's HTTP request id (the part of an event id after the `/`).
#[derive(Default)]
struct SessionLogs {
    streams: HashMap<u64, Arc<StreamLog>>,
    /// Finished streams, oldest first: the oldest goes when there are more than [`FINISHED_STREAMS_KEPT`].
    finished: VecDeque<u64>,
}

struct Tracked {
    conversation: ConversationId,
    last_seen: Instant,
    /// The in-game agent session whose credential this MCP session's client presented, and that credential: the
    /// MCP session lives as long as the credential does (its agent may stay silent between the player's turns for
    /// any time; a failure or an end revokes it).
    bound: Option<(ConversationId, String)>,
    /// The other conversations its calls ran in (`conversation` handles): a call of theirs in flight is not
    /// silence either. At most [`USED_KEPT`], the latest.
    used: VecDeque<ConversationId>,
    /// Its client's `GET` streams open and read (`streams::Listening`): while there is one, its client is there.
    listening: usize,
    /// Its requests whose response streams still run (a tool call in flight among them, whatever conversation it
    /// runs in), counted from before rmcp is handed them.
    requests: usize,
    /// It is being closed: a request that comes now is refused as of a closed session (404), not handed to a
    /// session about to be closed under it (its stream would end without its response).
    closing: bool,
    /// The JSON-RPC ids of those requests, until each is answered: a request with one of them is refused.
    ids: RunningIds,
}

/// A request counted on its way to rmcp: uncounted when dropped before its response stream started (from then on
/// the stream's drain counts it: [`ConversationSessions::logged`]).
struct Counted<'a> {
    sessions: &'a ConversationSessions,
    id: &'a SessionId,
    /// Its JSON-RPC id, taken with it.
    key: Option<IdKey>,
    started: bool,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        if self.started {
            return;
        }
        if let Some(tracked) = self.sessions.open.lock().get_mut(self.id) {
            tracked.requests = tracked.requests.saturating_sub(1);
            if let Some(key) = &self.key {
                tracked.ids.release(key);
            }
        }
        self.sessions.request_ended.notify_waiters();
    }
}

/// The least the game's end of a session's conversation waits for the session's calls in other conversations
/// before it closes the session under them; longer where a tool's timeout (or the default one) is longer
/// ([`ConversationSessions::drain_limit`]).
const DRAIN_LIMIT: Duration = Duration::from_secs(15 * 60);
/// Beyond the longest call timeout: time for the ended call's answer to reach its client.
const DRAIN_MARGIN: Duration = Duration::from_secs(60);

/// How many of the conversations a session's calls named are remembered for its expiry.
const USED_KEPT: usize = 8;

/// Sessions open at once before a new one makes room: the longest-silent session whose client is not listening,
/// has no call in flight and is no in-game agent's ends (its client, if it comes back, gets 404 and opens a new one,
/// as after an expiry). A client that opens a session per call and never deletes it is the usual cause.
pub(crate) const MAX_SESSIONS: usize = 1_000;

/// Sessions open at once at which a new one is refused (503 with `Retry-After`): past [`MAX_SESSIONS`] a new one
/// ends an idle one, but sessions in use (heard from within [`ROOM_GRACE`], listening, running calls) are never
/// ended for it, so a client opening sessions in a loop would otherwise grow them without bound. Sessions of a
/// credential (an in-game agent's, or one the game minted) neither count toward it nor are refused: each
/// credential keeps [`BOUND_MOST`] (and those with a request running), and a client of the game's token that
/// fills the ceiling does not keep the game's own agents out. ([`MAX_SESSIONS`] counts them: past it, a new
/// session ends an idle one of the game token's.)
pub(crate) const SESSION_CEILING: usize = 2 * MAX_SESSIONS;

/// How long a client refused a new session at [`SESSION_CEILING`] is asked to wait: about as long as it takes
/// sessions to become idle enough to make room.
const CEILING_RETRY_SECS: &str = "5";

/// Sessions bound to one in-game agent session's credential kept open at once (see
/// [`ConversationSessions::bind`]).
pub(crate) const BOUND_KEPT: usize = 8;
/// The most MCP sessions one in-game agent session's credential keeps, whether or not its others were heard from
/// lately or listen: past it, its longest-silent one without a request running ends for a new one (a client
/// reconnecting in a loop would otherwise fill the server's ceiling with sessions nothing ends).
pub(crate) const BOUND_MOST: usize = 4 * BOUND_KEPT;

/// How often the sessions of revoked credentials are looked for when sessions have no idle timeout.
const REVOKED_CHECK: Duration = Duration::from_secs(1);

/// A session heard from (or whose request stream finished) this recently is never ended to make room: its client
/// may be about to resume a dropped stream, or be still opening it.
const ROOM_GRACE: Duration = Duration::from_secs(30);

impl Tracked {
    fn new(conversation: ConversationId, now: Instant) -> Self {
        let used = VecDeque::new();
        let ids = RunningIds::default();
        Self { conversation, last_seen: now, bound: None, used, listening: 0, requests: 0, closing: false, ids }
    }

    /// Whether its calls ran in `conversation`.
    fn speaks_in(&self, conversation: &ConversationId) -> bool {
        self.conversation == *conversation || self.bound_to(conversation) || self.used.contains(conversation)
    }

    fn bound_to(&self, conversation: &ConversationId) -> bool {
        self.bound.as_ref().is_some_and(|(bound, _)| bound == conversation)
    }
}

impl ConversationSessions {
    /// Sessions that expire after `idle_timeout` without a request (never when `None`).
    pub(crate) fn new(agent: AgentHandle, credentials: Credentials, idle_timeout: Option<Duration>) -> Self {
        let mut inner = LocalSessionManager::default();
        inner.session_config.keep_alive = None;
        let (open, logs, request_ended) = (Arc::default(), Arc::default(), Arc::default());
        Self { inner, agent, credentials, idle_timeout, open, logs, request_ended }
    }

    /// Whether `id` names an open session (a header naming anything else names no conversation).
    pub(crate) fn is_open(&self, id: &str) -> bool {
        self.open.lock().contains_key(&SessionId::from(id.to_owned()))
    }

    /// Whether session `id` is being closed.
    fn is_closing(&self, id: &SessionId) -> bool {
        self.open.lock().get(id).is_some_and(|tracked| tracked.closing)
    }

    /// Session `id` takes requests: it is open and not being closed. Otherwise the error rmcp gives a session it
    /// does not know.
    pub(crate) fn takes_requests(&self, id: &SessionId) -> Result<(), LocalSessionManagerError> {
        match self.open.lock().get(id) {
            Some(tracked) if !tracked.closing => Ok(()),
            _ => Err(LocalSessionManagerError::SessionNotFound(id.clone())),
        }
    }

    /// A request of session `id` presented in-game agent session `conversation`'s `credential`. Returns a session
    /// to close, taken out of the open ones, when the credential's sessions are now more than [`BOUND_KEPT`]: the
    /// longest silent of the others whose client is not listening, that have no request running (a bound session's
    /// calls run in the in-game session's conversation, which the others share) and were silent for
    /// [`ROOM_GRACE`] (an agent whose MCP client reconnects without deleting its sessions would otherwise keep every
    /// one while its session lives). Its client, if it comes back, gets 404 and opens a new one. When none
    /// qualifies, none ends (the next bind looks again) unless the credential has more than [`BOUND_MOST`]: then
    /// the longest silent of the others with no request running ends, listening or lately heard from.
    pub(crate) fn bind(&self, id: &SessionId, conversation: &ConversationId, credential: &str) -> Option<SessionId> {
        let mut open = self.open.lock();
        let tracked = open.get_mut(id)?;
        if tracked.bound.as_ref().is_some_and(|(_, bound)| bound == credential) {
            return None;
        }
        tracked.bound = Some((conversation.clone(), credential.to_string()));
        let of_credential =
            |tracked: &Tracked| tracked.bound.as_ref().is_some_and(|(_, bound)| bound.as_str() == credential);
        let kept = open.values().filter(|tracked| of_credential(tracked)).count();
        if kept <= BOUND_KEPT {
            return None;
        }
        let may_end =
            |other: &SessionId, tracked: &Tracked| other != id && of_credential(tracked) && tracked.requests == 0;
        match take_longest_silent_idle(&mut open, Instant::now(), may_end) {
            Some(room) => Some(room),
            None if kept > BOUND_MOST => take_longest_silent(&mut open, may_end),
            None => None,
        }
    }

    /// A call of session `id` runs in `conversation` (named by a handle).
    pub(crate) fn used(&self, id: &str, conversation: &ConversationId) {
        if let Some(tracked) = self.open.lock().get_mut(&SessionId::from(id.to_owned())) {
            if !tracked.speaks_in(conversation) {
                if tracked.used.len() >= USED_KEPT {
                    tracked.used.pop_front();
                }
                tracked.used.push_back(conversation.clone());
            }
        }
    }

    /// The client was heard from in session `id` (unknown ids are rmcp's to refuse, not ours to track).
    fn seen(&self, id: &SessionId) {
        if let Some(tracked) = self.open.lock().get_mut(id) {
            tracked.last_seen = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests;
