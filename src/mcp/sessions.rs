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
    /// Its client's `GET` streams open and read ([`Listening`]): while there is one, its client is there.
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

    /// Session `id`'s `GET` stream from rmcp, handed on to its client ([`handed_on`]), counted as its client
    /// listening until it is let go: the client went away, or stopped reading it. `standalone`: the session's
    /// standalone stream, not a request's that rmcp resumes.
    fn listening(&self, id: &SessionId, stream: BoxedSseStream, standalone: bool) -> BoxedSseStream {
        if let Some(tracked) = self.open.lock().get_mut(id) {
            tracked.listening += 1;
        }
        let listening =
            Arc::new(Listening { open: self.open.clone(), id: id.clone(), stopped: AtomicBool::new(false) });
        // Whichever goes first: the connection's stream (the client went away), or the hand-on (it stopped reading).
        let stream = handed_on(stream, STALL_TIMEOUT, StopsListening(listening.clone()), standalone);
        Box::pin(ListeningStream { stream, _stops: StopsListening(listening) })
    }

    /// Drains rmcp's stream for a request into a log, whether or not the client stays connected, and returns the
    /// client's view of it. The request's id (`key`) is released as its answer goes out: a client that sends its
    /// next request with it once answered is not refused.
    fn logged(&self, id: &SessionId, mut inner: BoxedSseStream, mut key: Option<IdKey>) -> BoxedSseStream {
        let (log, connection) = StreamLog::connected(STALL_TIMEOUT);
        let log = Arc::new(log);
        let (logs, open, session) = (self.logs.clone(), self.open.clone(), id.clone());
        let request_ended = self.request_ended.clone();
        // (Counted by `create_stream`, before rmcp was handed the request.)
        tokio::spawn(async move {
            let mut request = None;
            while let Some(event) = std::future::poll_fn(|cx| inner.as_mut().poll_next(cx)).await {
                if request.is_none() {
                    // The first event names the stream (its id is `<index>/<request>`): from now on it can be resumed.
                    request = event.event_id.as_deref().and_then(parse_event_id).map(|(_, request)| request);
                    if let Some(request) = request {
                        // Only into an open session's logs: one closed meanwhile keeps nothing.
                        if let Some(session) = logs.lock().get_mut(&session) {
                            session.streams.insert(request, log.clone());
                        }
                    }
                }
                if event.message.as_deref().is_some_and(request_ids::answers) {
                    release(&open, &session, key.take());
                }
                log.feed(event).await;
            }
            // Its client may come back for the result it missed: not silence until now.
            release(&open, &session, key.take());
            if let Some(tracked) = open.lock().get_mut(&session) {
                tracked.requests = tracked.requests.saturating_sub(1);
                tracked.last_seen = Instant::now();
            }
            request_ended.notify_waiters();
            log.finish();
            if let Some(request) = request {
                let mut logs = logs.lock();
                if let Some(session) = logs.get_mut(&session) {
                    session.finished.push_back(request);
                    while session.finished.len() > FINISHED_STREAMS_KEPT {
                        if let Some(oldest) = session.finished.pop_front() {
                            session.streams.remove(&oldest);
                        }
                    }
                }
            }
        });
        connection
    }

    /// How long [`drained`](Self::drained) waits at most: [`DRAIN_LIMIT`], or the longest a call of a tool
    /// registered now may run (its timeout, or the default one) and [`DRAIN_MARGIN`], if that is longer.
    fn drain_limit(&self) -> Duration {
        let default = self.agent.host().config.default_timeout;
        let longest =
            self.agent.tools().iter().map(|tool| tool.timeout.unwrap_or(default)).fold(default, Duration::max);
        DRAIN_LIMIT.max(longest.saturating_add(DRAIN_MARGIN))
    }

    /// Waits until session `id` has no request whose response stream still runs, or [`drain_limit`] passed. Each
    /// ends with its call, which ends by its deadline (H13), whether or not its client still reads it (its log
    /// drains it: [`StreamLog`]); the limit is for a stream rmcp would never end (two requests with one id, which
    /// [`request_ids`] refuses).
    async fn drained(&self, id: &SessionId) {
        let until = crate::deadline::after_tokio(tokio::time::Instant::now(), self.drain_limit());
        loop {
            let ended = self.request_ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.open.lock().get(id).is_none_or(|tracked| tracked.requests == 0) {
                return;
            }
            if tokio::time::timeout_at(until, ended).await.is_err() {
                return;
            }
        }
    }

    /// The log of request stream `request` of session `id`, if it is still kept.
    fn log_of(&self, id: &SessionId, request: u64) -> Option<Arc<StreamLog>> {
        self.logs.lock().get(id)?.streams.get(&request).cloned()
    }

    /// Whether resuming request stream `last_event_id` of open session `id` would send nothing, ever: the
    /// stream finished and the client saw its last event, or it is no longer kept.
    fn nothing_to_resume(&self, id: &SessionId, last_event_id: &str) -> bool {
        let Some((index, request)) = parse_event_id(last_event_id) else { return false };
        if !self.open.lock().contains_key(id) {
            return false;
        }
        match self.log_of(id, request) {
            Some(log) => log.spent_after(index),
            None => true,
        }
    }

    /// Starts the two tasks that keep sessions and conversations in step, until `stop`: closing sessions that
    /// expired, and closing the session of a conversation that ended on the game's side.
    pub(crate) fn spawn_upkeep(self: &Arc<Self>, runtime: &tokio::runtime::Handle, stop: CancellationToken) {
        {
            let sessions = self.clone();
            let stop = stop.clone();
            // Checked four times per timeout: a session ends at most a quarter of the timeout late. Without an idle
            // timeout, only the sessions of revoked credentials end, checked every second.
            let period = self.idle_timeout.map_or(REVOKED_CHECK, |idle| (idle / 4).max(Duration::from_millis(10)));
            runtime.spawn(async move {
                let mut ticks = tokio::time::interval(period);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = ticks.tick() => {}
                    }
                    for id in sessions.expired(Instant::now()) {
                        tracing::info!(session = %id, idle_timeout = ?sessions.idle_timeout, "the MCP session expired: ending its conversation");
                        let _ = sessions.close_session(&id).await;
                    }
                }
            });
        }
        let sessions = self.clone();
        let mut events = self.agent.subscribe();
        runtime.spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = stop.cancelled() => return,
                    event = events.next() => event,
                };
                match event {
                    Some(ConversationEvent::Status(change)) if change.status == ConversationStatus::Ended => {
                        for id in sessions.ending_with(&change.conversation) {
                            // Each on its own: one waiting for its calls holds up no other session's close.
                            let sessions = sessions.clone();
                            tokio::spawn(async move {
                                // No request starts in it from now on; its calls answer their client first (the
                                // stream of a session closed under it ends without its response): those of the
                                // ended conversation, cancelled by the end, and those it runs in another one (a
                                // handle's), which lives on, when they finish.
                                if let Some(tracked) = sessions.open.lock().get_mut(&id) {
                                    tracked.closing = true;
                                }
                                sessions.drained(&id).await;
                                // Closing an already closed session (the client deleted it) does nothing.
                                let _ = sessions.inner.close_session(&id).await;
                                sessions.open.lock().remove(&id);
                                sessions.logs.lock().remove(&id);
                            });
                        }
                    }
                    Some(_) => {}
                    None => return,
                }
            }
        });
    }

    /// The sessions whose client has been silent for the idle timeout at `now`, leaving out those whose client
    /// has a `GET` stream open and those with a call in flight in any conversation they used (a long tool call is
    /// not silence); and those of an in-game agent
    /// session whose credential was revoked (it failed or ended), silent or not, and only those.
    pub(crate) fn expired(&self, now: Instant) -> Vec<SessionId> {
        let idle_timeout = self.idle_timeout.unwrap_or(Duration::MAX);
        let mut open = self.open.lock();
        let mut expired = Vec::new();
        for (id, tracked) in open.iter_mut() {
            if let Some((_, credential)) = &tracked.bound {
                if self.credentials.conversation_of(credential).is_none() {
                    expired.push(id.clone());
                }
                continue;
            }
            if tracked.listening > 0 || now.saturating_duration_since(tracked.last_seen) < idle_timeout {
                continue;
            }
            // A request still running (a long call, even in a conversation the session used long ago) is not
            // silence.
            if tracked.requests > 0 || self.has_calls_in_flight(tracked) {
                tracked.last_seen = now;
                continue;
            }
            expired.push(id.clone());
        }
        // Under the same lock as the look at its requests: one arriving from now on is refused, not cut.
        for id in &expired {
            if let Some(tracked) = open.get_mut(id) {
                tracked.closing = true;
            }
        }
        expired
    }

    /// Whether a call of the session is in flight in any conversation it used. (A retry waiting for an execution
    /// another session's call started, same task and operation id, is a call in flight of its conversation too:
    /// ending the session would cancel the work it waits for.)
    fn has_calls_in_flight(&self, tracked: &Tracked) -> bool {
        let waiting = |conversation: &ConversationId| self.agent.host().conversations.waits_for_tools(conversation);
        waiting(&tracked.conversation) || tracked.used.iter().any(waiting)
    }

    /// With `max` sessions open at `now`, the one to end for a new one, taken out of the open ones at once (so
    /// that sessions created at the same moment each end another): the longest silent of those whose client is
    /// not listening, with no call in flight, of no in-game agent session, silent for [`ROOM_GRACE`] at least.
    /// `None` below `max`, or if all are in use.
    fn to_make_room(&self, max: usize, now: Instant) -> Option<SessionId> {
        let mut open = self.open.lock();
        if open.len() < max {
            return None;
        }
        let may_end = |_: &SessionId, tracked: &Tracked| tracked.bound.is_none() && !self.has_calls_in_flight(tracked);
        take_longest_silent_idle(&mut open, now, may_end)
    }

    /// The sessions that end with `conversation`: its own session, and those of the in-game agent session it is
    /// (not those that only used it through a handle: their client may go on in another).
    fn ending_with(&self, conversation: &ConversationId) -> Vec<SessionId> {
        let open = self.open.lock();
        let ends = |tracked: &Tracked| tracked.conversation == *conversation || tracked.bound_to(conversation);
        open.iter().filter(|(_, tracked)| ends(tracked)).map(|(id, _)| id.clone()).collect()
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

/// Of the `open` sessions that `may_end`, whose client is not listening and was silent for [`ROOM_GRACE`] at `now`,
/// the longest silent, taken out of them.
fn take_longest_silent_idle(
    open: &mut HashMap<SessionId, Tracked>,
    now: Instant,
    may_end: impl Fn(&SessionId, &Tracked) -> bool,
) -> Option<SessionId> {
    take_longest_silent(open, |id, tracked| {
        tracked.listening == 0 && now.saturating_duration_since(tracked.last_seen) >= ROOM_GRACE && may_end(id, tracked)
    })
}

/// Of the `open` sessions that `may_end`, the longest silent, taken out of them.
fn take_longest_silent(
    open: &mut HashMap<SessionId, Tracked>,
    may_end: impl Fn(&SessionId, &Tracked) -> bool,
) -> Option<SessionId> {
    let room = open
        .iter()
        .filter(|(id, tracked)| may_end(id, tracked))
        .min_by_key(|(_, tracked)| tracked.last_seen)
        .map(|(id, _)| id.clone())?;
    open.remove(&room);
    Some(room)
}

/// A session's client listening on its `GET` stream. When it stops (it closed the stream, went away, or stopped
/// reading it) the session's idle time starts.
struct Listening {
    open: Arc<Mutex<HashMap<SessionId, Tracked>>>,
    id: SessionId,
    stopped: AtomicBool,
}

impl Listening {
    /// The client stopped listening on this stream (counted once).
    fn stop(&self) {
        if self.stopped.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Some(tracked) = self.open.lock().get_mut(&self.id) {
            tracked.listening = tracked.listening.saturating_sub(1);
            tracked.last_seen = Instant::now();
        }
    }
}

/// Stops the [`Listening`] when dropped.
struct StopsListening(Arc<Listening>);

impl Drop for StopsListening {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// The connection's side of a `GET` stream.
struct ListeningStream {
    stream: BoxedSseStream,
    _stops: StopsListening,
}

impl Stream for ListeningStream {
    type Item = ServerSseMessage;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<ServerSseMessage>> {
        self.stream.as_mut().poll_next(cx)
    }
}

/// A `GET` that resumes a request stream with nothing left to send (the client read it to its end, or it is no
/// longer kept) is answered `405 Method Not Allowed`: the specification's "no stream here". An empty `200` stream
/// instead makes the TypeScript SDK 1.x, which takes a stream that ended with a JSON-RPC error (not a result) for
/// one that was cut, try again every `retry` interval for as long as it runs, keeping its session from ever going
/// idle. A session rmcp does not know is left to rmcp (404).
pub(crate) async fn refuse_spent_resumes(
    State(sessions): State<Arc<ConversationSessions>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() == axum::http::Method::GET && spent_resume(&sessions, request.headers()) {
        let allow = [(axum::http::header::ALLOW, "POST, DELETE")];
        return (axum::http::StatusCode::METHOD_NOT_ALLOWED, allow, "nothing to resume: the stream ended")
            .into_response();
    }
    next.run(request).await
}

/// A request that starts something in a session being closed (a `POST` of a JSON-RPC request, or a `GET` that is
/// no resume) is answered as for a closed session (404, as rmcp answers), so its client opens a new one. A resume
/// (`Last-Event-ID`) is served: the close may be waiting to deliver that stream's answer; so are a notification
/// and a response, which start nothing: a client's `notifications/cancelled` for a call the close waits for
/// still cancels it. (A request that gets past this just as the
/// close is decided is refused by [`create_stream`](SessionManager::create_stream), which rmcp answers as a
/// session error: 500.)
pub(crate) async fn refuse_closing_sessions(
    State(sessions): State<Arc<ConversationSessions>>,
    request: Request,
    next: Next,
) -> Response {
    if starts_in_closing_session(&sessions, &request) {
        return (axum::http::StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
    }
    if let Some(id) = reused_id(&sessions, &request) {
        return request_ids::in_use(&id);
    }
    if opens_a_session_past_the_ceiling(&sessions, &request) {
        let why = format!("Service Unavailable: {SESSION_CEILING} MCP sessions are open and in use; try again later");
        let retry = [(axum::http::header::RETRY_AFTER, CEILING_RETRY_SECS)];
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, retry, why).into_response();
    }
    next.run(request).await
}

/// Whether `request` is an `initialize` (a new session) of the game's token while [`SESSION_CEILING`] sessions of
/// the game's token are open.
fn opens_a_session_past_the_ceiling(sessions: &ConversationSessions, request: &Request) -> bool {
    let initialize =
        request.extensions().get::<super::parse::JsonRpcRequestId>().is_some_and(|r| r.method == "initialize");
    // A session id read as rmcp reads it: a header that is not text names none, and rmcp opens a new session.
    let names_a_session = request.headers().get(HEADER_SESSION_ID).and_then(|v| v.to_str().ok()).is_some();
    let of_a_credential = request.extensions().get::<BoundConversation>().is_some();
    initialize
        && !names_a_session
        && !of_a_credential
        && sessions.open.lock().values().filter(|tracked| tracked.bound.is_none()).count() >= SESSION_CEILING
}

/// The id of `request` if a request of its session still running has it.
fn reused_id(sessions: &ConversationSessions, request: &Request) -> Option<serde_json::Value> {
    let id = &request.extensions().get::<super::parse::JsonRpcRequestId>()?.id;
    let session = request.headers().get(HEADER_SESSION_ID).and_then(|value| value.to_str().ok())?;
    let open = sessions.open.lock();
    let tracked = open.get(&SessionId::from(session.to_owned()))?;
    tracked.ids.holds(&request_ids::body_key(id)).then(|| id.clone())
}

/// Frees `key` in session `id`'s running ids (once: `key` was taken out of its holder).
fn release(open: &Mutex<HashMap<SessionId, Tracked>>, id: &SessionId, key: Option<IdKey>) {
    if let (Some(key), Some(tracked)) = (key, open.lock().get_mut(id)) {
        tracked.ids.release(&key);
    }
}

fn starts_in_closing_session(sessions: &ConversationSessions, request: &Request) -> bool {
    let header = |name: &str| request.headers().get(name).and_then(|value| value.to_str().ok());
    let starts = match *request.method() {
        // The body was read (`parse::refuse_unparsable`): a request has an id and a method.
        axum::http::Method::POST => request.extensions().get::<super::parse::JsonRpcRequestId>().is_some(),
        axum::http::Method::GET => header(HEADER_LAST_EVENT_ID).is_none(),
        _ => false,
    };
    starts && header(HEADER_SESSION_ID).is_some_and(|id| sessions.is_closing(&SessionId::from(id.to_owned())))
}

fn spent_resume(sessions: &ConversationSessions, headers: &axum::http::HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    match (header(HEADER_SESSION_ID), header(HEADER_LAST_EVENT_ID)) {
        (Some(id), Some(last)) => sessions.nothing_to_resume(&SessionId::from(id.to_owned()), last),
        _ => false,
    }
}

/// Ties a session to the in-game agent session whose credential its request presented: the session the request
/// names, or the one its answer opened (`initialize`).
pub(crate) async fn bind_to_agent_sessions(
    State(sessions): State<Arc<ConversationSessions>>,
    request: Request,
    next: Next,
) -> Response {
    let named = |headers: &axum::http::HeaderMap| {
        headers.get(HEADER_SESSION_ID).and_then(|v| v.to_str().ok()).map(|id| SessionId::from(id.to_owned()))
    };
    let bound = request.extensions().get::<BoundConversation>().map(|bound| bound.conversation.clone());
    let credential = super::security::presented_bearer(request.headers()).map(str::to_string);
    let asked = named(request.headers());
    let response = next.run(request).await;
    if let (Some(conversation), Some(credential)) = (bound, credential) {
        if let Some(id) = asked.or_else(|| named(response.headers())) {
            if let Some(room) = sessions.bind(&id, &conversation, &credential) {
                tracing::info!(session = %room, "over {BOUND_KEPT} MCP sessions of an in-game agent open: its longest-silent one not in use ends");
                let _ = sessions.close_session(&room).await;
            }
        }
    }
    response
}

impl SessionManager for ConversationSessions {
    type Error = <LocalSessionManager as SessionManager>::Error;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        if let Some(room) = self.to_make_room(MAX_SESSIONS, Instant::now()) {
            tracing::info!(session = %room, "{MAX_SESSIONS} MCP sessions open: the longest-silent idle one ends");
            let _ = self.close_session(&room).await;
        }
        let created = self.inner.create_session().await?;
        let conversation = session_conversation(created.0.as_ref());
        self.open.lock().insert(created.0.clone(), Tracked::new(conversation, Instant::now()));
        self.logs.lock().entry(created.0.clone()).or_default();
        Ok(created)
    }

    fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<ServerJsonRpcMessage, Self::Error>> + Send {
        self.seen(id);
        self.inner.initialize_session(id, message)
    }

    fn has_session(&self, id: &SessionId) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        // (One being closed still is: its client may resume a response stream the close waits to deliver.)
        self.inner.has_session(id)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.open.lock().remove(id);
        self.logs.lock().remove(id);
        let closed = self.inner.close_session(id).await;
        // A session that never called a tool has no conversation: nothing to end.
        let _ = self.agent.end_conversation(&session_conversation(id.as_ref()));
        closed
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let key = request_ids::request_key(&message);
        {
            // Counted before rmcp has it, under the lock a close decides under: a close either waits for it (the
            // game ended the conversation), leaves the session be (expiry, room), or came first and refuses it.
            let mut open = self.open.lock();
            let Some(tracked) = open.get_mut(id).filter(|tracked| !tracked.closing) else {
                return Err(LocalSessionManagerError::SessionNotFound(id.clone()));
            };
            if let Some(key) = key.as_ref().filter(|key| !tracked.ids.take(key)) {
                // Sent at the same time as the running one: past `refuse_closing_sessions`' look.
                return Err(SessionError::Io(request_ids::in_use_error(key)).into());
            }
            tracked.requests += 1;
            tracked.last_seen = Instant::now();
        }
        // Uncounted if its stream does not start: rmcp refused it, or the HTTP request went away meanwhile.
        let mut counted = Counted { sessions: self, id, key: key.clone(), started: false };
        let inner = self.inner.create_stream(id, message).await?;
        counted.started = true;
        Ok(self.logged(id, Box::pin(inner), key))
    }

    fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.seen(id);
        // A notification or a response starts nothing: a session being closed still takes them (a client's
        // cancel of a call the close waits for).
        let refused = match message {
            rmcp::model::JsonRpcMessage::Request(_) => self.takes_requests(id),
            _ if self.open.lock().contains_key(id) => Ok(()),
            _ => Err(LocalSessionManagerError::SessionNotFound(id.clone())),
        };
        async move {
            refused?;
            self.inner.accept_message(id, message).await
        }
    }

    fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> impl Future<Output = Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error>> + Send
    {
        self.seen(id);
        let refused = self.takes_requests(id);
        let inner = self.inner.create_standalone_stream(id);
        async move {
            refused?;
            Ok(self.listening(id, Box::pin(inner.await?), true))
        }
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.seen(id);
        let of_request = parse_event_id(&last_event_id);
        let logged = of_request
            .and_then(|(index, request)| Some((index, self.log_of(id, request)?)))
            .map(|(index, log)| log.resume(index));
        match logged {
            Some(stream) => Ok(stream),
            // The standalone stream (`GET` without a request), or a request stream no longer kept: rmcp's.
            None => {
                let standalone = of_request.is_none();
                Ok(self.listening(id, Box::pin(self.inner.resume(id, last_event_id).await?), standalone))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::prelude::*;
    use crate::testing::{headless_app, AgentTestAppExt, CounterGame, Gate};
    use crate::NoArgs;

    /// A game in world `alpha` whose tool `held` waits at the gate.
    fn held_at_a_gate() -> (bevy::app::App, Gate) {
        let gate = Gate::new();
        let held = AgentTool::new("held", "Waits at the gate.", {
            let gate = gate.clone();
            move |_: CallContext<u64>, _: NoArgs| {
                let gate = gate.clone();
                async move {
                    gate.pass().await;
                    Ok(())
                }
            }
        });
        let mut app = headless_app(AgentToolsPlugin::new(CounterGame).with_tool(held));
        app.enter_world("alpha");
        (app, gate)
    }

    #[test]
    fn a_new_session_is_refused_while_the_ceiling_of_sessions_in_use_is_open() {
        let (app, _gate) = held_at_a_gate();
        let sessions = ConversationSessions::new(app.agent(), Credentials::default(), None);
        let runtime = app.agent().runtime().clone();
        let initialize = |session: Option<&SessionId>| {
            let mut request = Request::builder().method("POST");
            if let Some(id) = session {
                request = request.header(HEADER_SESSION_ID, id.as_ref());
            }
            let mut request = request.body(axum::body::Body::empty()).expect("a request");
            let noted = super::super::parse::JsonRpcRequestId { id: json!(1), method: "initialize".into() };
            request.extensions_mut().insert(noted);
            request
        };
        // Sessions all heard from just now: none makes room for another.
        let mut kept = Vec::new();
        for _ in 0..SESSION_CEILING - 1 {
            kept.push(runtime.block_on(sessions.create_session()).expect("a session"));
        }
        assert!(!opens_a_session_past_the_ceiling(&sessions, &initialize(None)), "one more may open");
        kept.push(runtime.block_on(sessions.create_session()).expect("a session"));
        assert!(opens_a_session_past_the_ceiling(&sessions, &initialize(None)), "none past the ceiling");
        // A session header that is not text names no session: rmcp would open a new one.
        let mut not_text = initialize(None);
        let value = axum::http::HeaderValue::from_bytes(b"\xff").expect("a header value");
        not_text.headers_mut().insert(HEADER_SESSION_ID, value);
        assert!(opens_a_session_past_the_ceiling(&sessions, &not_text), "none past the ceiling, whatever its header");
        assert!(
            !opens_a_session_past_the_ceiling(&sessions, &initialize(Some(&kept[0].0))),
            "an open one's requests go on"
        );
        // An in-game agent's client (its credential) is not kept out by the game token's sessions.
        let credential = sessions.credentials.mint_for_session(&ConversationId::new("agent")).expect("minted");
        let bound = sessions.credentials.conversation_of(&credential).expect("live");
        let mut of_the_agent = initialize(None);
        of_the_agent.extensions_mut().insert(bound.clone());
        assert!(!opens_a_session_past_the_ceiling(&sessions, &of_the_agent), "the agent's client opens its session");
        runtime.block_on(sessions.close_session(&kept[0].0)).expect("closed");
        assert!(!opens_a_session_past_the_ceiling(&sessions, &initialize(None)), "room again");
        // Nor do an agent's sessions take the game token's room.
        let (agents, _transport) = runtime.block_on(sessions.create_session()).expect("a session");
        sessions.open.lock().get_mut(&agents).expect("tracked").bound = Some((bound.conversation, credential));
        assert!(!opens_a_session_past_the_ceiling(&sessions, &initialize(None)), "an agent's session takes no room");
    }

    #[test]
    fn a_session_being_closed_takes_no_request_one_with_a_request_on_its_way_stays_and_a_request_gone_away_is_uncounted(
    ) {
        let (app, _gate) = held_at_a_gate();
        let timeout = Duration::from_secs(60);
        let sessions = ConversationSessions::new(app.agent(), Credentials::default(), Some(timeout));
        let runtime = app.agent().runtime().clone();
        // Sessions rmcp holds (their transports kept, unserved: no request reaches a tool here), silent for long.
        let (running, _kept) = runtime.block_on(sessions.create_session()).expect("a session");
        let (silent, _kept_too) = runtime.block_on(sessions.create_session()).expect("a session");
        let long_ago = Instant::now().checked_sub(timeout * 2).expect("this machine has been up for two minutes");
        for id in [&running, &silent] {
            sessions.open.lock().get_mut(id).expect("tracked").last_seen = long_ago;
        }
        let call = |id: u64| -> ClientJsonRpcMessage {
            let request = json!({ "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": { "name": "held" } });
            serde_json::from_value(request).expect("a request")
        };
        // A request of `running` on its way to rmcp: counted, its stream not started yet (rmcp waits for the
        // session's unserved worker).
        let mut on_its_way = Box::pin(sessions.create_stream(&running, call(1)));
        let pending = runtime
            .block_on(std::future::poll_fn(|cx| std::task::Poll::Ready(on_its_way.as_mut().poll(cx).is_pending())));
        assert!(pending, "rmcp has not started its stream");

        assert_eq!(sessions.expired(Instant::now()), vec![silent.clone()], "a request on its way keeps its session");
        // Decided: until rmcp has closed it, a request that comes is refused as of a closed session (404), not
        // handed to a session about to be closed under it; a resume is still served.
        assert!(runtime.block_on(sessions.has_session(&silent)).expect("asked"), "rmcp still holds it");
        let request = |method: &str, id: &SessionId, last_event_id: Option<&str>| {
            let mut request = Request::builder().method(method).header(HEADER_SESSION_ID, id.as_ref());
            if let Some(last) = last_event_id {
                request = request.header(HEADER_LAST_EVENT_ID, last);
            }
            request.body(axum::body::Body::empty()).expect("a request")
        };
        // A POST of a JSON-RPC request: its body was read, and its id noted.
        let mut new_request = request("POST", &silent, None);
        let noted = super::super::parse::JsonRpcRequestId { id: json!(3), method: "tools/call".into() };
        new_request.extensions_mut().insert(noted);
        assert!(starts_in_closing_session(&sessions, &new_request), "404 for a new request");
        assert!(
            !starts_in_closing_session(&sessions, &request("POST", &silent, None)),
            "a notification starts nothing"
        );
        assert!(starts_in_closing_session(&sessions, &request("GET", &silent, None)), "and for a new GET stream");
        assert!(!starts_in_closing_session(&sessions, &request("GET", &silent, Some("0/1"))), "a resume is served");
        assert!(!starts_in_closing_session(&sessions, &request("POST", &running, None)), "the other takes requests");
        let started = runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(5), sessions.create_stream(&silent, call(2))).await
        });
        assert!(matches!(started, Ok(Err(LocalSessionManagerError::SessionNotFound(_)))), "refused at once");
        let accepted = runtime.block_on(sessions.accept_message(&silent, call(3)));
        assert!(matches!(accepted, Err(LocalSessionManagerError::SessionNotFound(_))));
        let cancel = json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 1 } });
        let cancel = serde_json::from_value(cancel).expect("a notification");
        let accepted = runtime.block_on(sessions.accept_message(&silent, cancel));
        assert!(accepted.is_ok(), "a notification starts nothing: {accepted:?}");

        // The request on its way goes away (its HTTP exchange dropped) before its stream started.
        assert_eq!(sessions.open.lock().get(&running).expect("tracked").requests, 1);
        drop(on_its_way);
        let requests = sessions.open.lock().get(&running).expect("tracked").requests;
        assert_eq!(requests, 0, "a request that went away before its stream started is no longer counted");
    }

    #[test]
    fn the_wait_for_a_sessions_calls_outlasts_the_longest_tool_timeout() {
        let (app, _gate) = held_at_a_gate();
        let sessions = ConversationSessions::new(app.agent(), Credentials::default(), None);
        assert_eq!(sessions.drain_limit(), DRAIN_LIMIT, "no tool longer than the default timeout");
        let long = AgentTool::new("long", "Takes half an hour.", |_: CallContext<u64>, _: NoArgs| async { Ok(()) })
            .timeout(Duration::from_secs(30 * 60));
        app.agent().register_tool(long).expect("registered");
        assert_eq!(sessions.drain_limit(), Duration::from_secs(30 * 60) + DRAIN_MARGIN, "a call of it can end late");
    }

    #[test]
    fn a_session_with_a_call_in_flight_never_expires_and_a_silent_one_does() {
        let (mut app, gate) = held_at_a_gate();
        let timeout = Duration::from_secs(60);
        let sessions = ConversationSessions::new(app.agent(), Credentials::default(), Some(timeout));
        let (busy, silent): (SessionId, SessionId) = ("busy".into(), "silent".into());
        let start = Instant::now();
        for id in [&busy, &silent] {
            let conversation = session_conversation(id.as_ref());
            sessions.open.lock().insert(id.clone(), Tracked::new(conversation, start));
        }
        let call = app.agent().conversation(session_conversation("busy")).call("held", json!({}));
        app.run_until("the call is in its handler", |_| gate.arrived() == 1);

        assert!(sessions.expired(start + timeout / 2).is_empty(), "nobody expires before the timeout");
        let later = start + timeout * 2;
        assert_eq!(sessions.expired(later), vec![silent.clone()], "the call in flight keeps its session");

        gate.open();
        assert!(app.run_until_resolved(&call).is_ok());
        let mut expired = sessions.expired(later + timeout);
        expired.sort();
        assert_eq!(expired, vec![busy, silent], "silent for a whole timeout after its call finished");
    }

    #[test]
    fn a_new_session_over_the_cap_ends_the_longest_silent_idle_one_never_one_in_use() {
        let (mut app, gate) = held_at_a_gate();
        let _runtime = app.agent().host().runtime.enter();
        let credentials = Credentials::default();
        let sessions = ConversationSessions::new(app.agent(), credentials, Some(Duration::from_secs(60)));
        let start = Instant::now();
        let now = start + ROOM_GRACE + Duration::from_secs(10);
        // Oldest first: in use each way a session can be, then two idle ones, then one heard from just now.
        let ids: Vec<SessionId> =
            ["busy", "listening", "bound", "idle-old", "idle-new"].into_iter().map(SessionId::from).collect();
        for (n, id) in ids.iter().enumerate() {
            let tracked = Tracked::new(session_conversation(id.as_ref()), start + Duration::from_secs(n as u64));
            sessions.open.lock().insert(id.clone(), tracked);
        }
        let recent = SessionId::from("recent");
        sessions.open.lock().insert(recent.clone(), Tracked::new(session_conversation("recent"), now));
        let call = app.agent().conversation(session_conversation("busy")).call("held", json!({}));
        app.run_until("the call is in its handler", |_| gate.arrived() == 1);
        let _stream = sessions.listening(&ids[1], Box::pin(Quiet), true);
        sessions.open.lock().get_mut(&ids[2]).expect("open").bound = Some(("game-agent".into(), "secret".into()));

        assert_eq!(sessions.to_make_room(7, now), None, "below the cap nothing ends");
        assert_eq!(sessions.to_make_room(6, now), Some(ids[3].clone()), "the longest silent of the idle ones");
        assert_eq!(sessions.to_make_room(5, now), Some(ids[4].clone()), "taken out at once: the next goes next");
        assert!(!sessions.open.lock().contains_key(&ids[3]), "the first is no longer open");
        assert_eq!(sessions.to_make_room(4, now), None, "in use, or heard from within the grace: never ended");
        gate.open();
        assert!(app.run_until_resolved(&call).is_ok());
    }

    /// A stream with nothing to send, standing for a client's `GET` stream.
    struct Quiet;

    impl Stream for Quiet {
        type Item = ServerSseMessage;

        fn poll_next(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<ServerSseMessage>> {
            std::task::Poll::Pending
        }
    }

    /// Claude Code never opens a new session after a 404: a client that stays quiet while its user reads for a
    /// while must find its session still there. Its open `GET` stream says it is.
    #[test]
    fn a_session_whose_client_listens_never_expires_and_its_idle_time_starts_when_it_stops() {
        let (app, _gate) = held_at_a_gate();
        let _runtime = app.agent().host().runtime.enter();
        let timeout = Duration::from_secs(60);
        let sessions = ConversationSessions::new(app.agent(), Credentials::default(), Some(timeout));
        let (listening, silent): (SessionId, SessionId) = ("listening".into(), "silent".into());
        let start = Instant::now();
        for id in [&listening, &silent] {
            sessions.open.lock().insert(id.clone(), Tracked::new(session_conversation(id.as_ref()), start));
        }
        let first = sessions.listening(&listening, Box::pin(Quiet), true);
        let second = sessions.listening(&listening, Box::pin(Quiet), true);
        assert_eq!(sessions.expired(start + timeout * 10), vec![silent.clone()], "a listening client is there");
        drop(first);
        assert_eq!(sessions.expired(start + timeout * 10), vec![silent.clone()], "while any of its streams is open");
        drop(second);
        let stopped = Instant::now();
        assert!(!sessions.expired(stopped + timeout / 2).contains(&listening), "its idle time starts now");
        let mut expired = sessions.expired(stopped + timeout * 2);
        expired.sort();
        assert_eq!(expired, vec![listening, silent], "and it expires a whole timeout after");
    }

    /// rmcp's side of a `GET` stream: what it sends into a bounded channel (waiting while it is full).
    struct Rmcp(tokio::sync::mpsc::Receiver<ServerSseMessage>);

    impl Stream for Rmcp {
        type Item = ServerSseMessage;

        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<ServerSseMessage>> {
            self.0.poll_recv(cx)
        }
    }

    /// A client that keeps its `GET` stream's connection open but reads nothing from it is not listening: once its
    /// stream is let go (after [`STALL_TIMEOUT`]), the session's idle time starts, as if it had closed it.
    #[test]
    fn a_client_that_stops_reading_its_get_stream_no_longer_keeps_its_session() {
        let (app, _gate) = held_at_a_gate();
        let runtime = app.agent().host().runtime.clone();
        let _runtime = runtime.enter();
        let timeout = Duration::from_secs(60);
        let sessions = ConversationSessions::new(app.agent(), Credentials::default(), Some(timeout));
        let id: SessionId = "stalled".into();
        let start = Instant::now();
        sessions.open.lock().insert(id.clone(), Tracked::new(session_conversation(id.as_ref()), start));
        let (rmcp, inner) = tokio::sync::mpsc::channel(16);
        let _connection = sessions.listening(&id, Box::pin(Rmcp(inner)), true);
        assert!(sessions.expired(start + timeout * 10).is_empty(), "listening");

        // Events come; the client's connection stays open and takes none of them.
        let event = || {
            ServerSseMessage::from_message(rmcp::model::ServerJsonRpcMessage::notification(
                rmcp::model::ServerNotification::ToolListChangedNotification(Default::default()),
            ))
        };
        runtime.block_on(async {
            let sends = async { while rmcp.send(event()).await.is_ok() {} };
            tokio::time::timeout(STALL_TIMEOUT * 4, sends).await.expect("rmcp's stream was let go");
        });
        let stopped = Instant::now();
        assert!(!sessions.expired(stopped + timeout / 2).contains(&id), "its idle time starts when it was let go");
        assert_eq!(sessions.expired(stopped + timeout * 2), vec![id], "then it expires as a silent session does");
    }

    /// A client reconnected under a new session, retried its keyed call (same task and operation id: it joined
    /// the running execution) and deleted the old session: the new one waits for that execution, which is a call
    /// in flight, not silence. Expiring it would cancel the work it waits for (rule H12).
    #[test]
    fn a_session_whose_retry_waits_for_another_sessions_execution_does_not_expire() {
        let (mut app, gate) = held_at_a_gate();
        let timeout = Duration::from_secs(60);
        let sessions = ConversationSessions::new(app.agent(), Credentials::default(), Some(timeout));
        let (old, new): (SessionId, SessionId) = ("old".into(), "new".into());
        let start = Instant::now();
        sessions.open.lock().insert(new.clone(), Tracked::new(session_conversation(new.as_ref()), start));
        let keyed = || crate::CallRequest::new("held", json!({})).operation("op").task("shared");
        let first = app.agent().conversation(session_conversation(old.as_ref())).request(keyed());
        app.run_until("the call is in its handler", |_| gate.arrived() == 1);
        let retry = app.agent().conversation(session_conversation(new.as_ref())).request(keyed());
        assert_eq!(retry.request_id(), first.request_id(), "the retry joined the running execution");
        app.agent().end_conversation(&session_conversation(old.as_ref())).expect("the old session is deleted");

        assert!(sessions.expired(start + timeout * 2).is_empty(), "the retry's wait keeps its session");
        gate.open();
        assert!(app.run_until_resolved(&retry).is_ok(), "and the execution finished for it");
    }

    #[test]
    fn a_call_in_flight_in_a_handles_conversation_keeps_its_session_and_an_agent_sessions_never_expires() {
        let (mut app, gate) = held_at_a_gate();
        let timeout = Duration::from_secs(60);
        let credentials = Credentials::default();
        let sessions = ConversationSessions::new(app.agent(), credentials.clone(), Some(timeout));
        let (handled, agents, silent): (SessionId, SessionId, SessionId) =
            ("handled".into(), "agents".into(), "silent".into());
        let start = Instant::now();
        for id in [&handled, &agents, &silent] {
            sessions.open.lock().insert(id.clone(), Tracked::new(session_conversation(id.as_ref()), start));
        }
        let (handle, in_game) = (ConversationId::new("mcp-handle:h"), ConversationId::new("chat-1"));
        sessions.used("handled", &handle);
        let credential = credentials.mint_for_session(&in_game).expect("a credential");
        sessions.bind(&agents, &in_game, &credential);
        let call = app.agent().conversation(handle.clone()).call("held", json!({}));
        app.run_until("the call is in its handler", |_| gate.arrived() == 1);

        let later = start + timeout * 10;
        assert_eq!(
            sessions.expired(later),
            vec![silent.clone()],
            "the handle's call keeps its session; the agent's stays"
        );
        assert_eq!(
            sessions.ending_with(&in_game),
            vec![agents.clone()],
            "the agent's session ends with its in-game session"
        );
        assert!(sessions.ending_with(&handle).is_empty(), "a handle's conversation ending leaves the session open");
        gate.open();
        assert!(app.run_until_resolved(&call).is_ok());
        let mut expired = sessions.expired(later + timeout);
        expired.sort();
        assert_eq!(expired, vec![handled, "silent".into()], "silent for a whole timeout after its call finished");
        // The in-game session failed or ended: its credential is revoked, and its MCP session goes with it.
        credentials.revoke(&credential);
        assert!(sessions.expired(start).contains(&agents), "closed with its credential, silent or not");
    }

    #[test]
    fn an_agent_sessions_mcp_sessions_past_eight_end_the_longest_silent_idle_one_and_a_revoked_ones_end_without_an_idle_timeout(
    ) {
        let (app, _) = held_at_a_gate();
        let credentials = Credentials::default();
        let sessions = ConversationSessions::new(app.agent(), credentials.clone(), None);
        let in_game = ConversationId::new("chat-1");
        let credential = credentials.mint_for_session(&in_game).expect("a credential");
        let now = Instant::now();
        let long_ago = now.checked_sub(ROOM_GRACE * 4).expect("this machine has been up for two minutes");
        let ids: Vec<SessionId> = (0..=BOUND_KEPT + 1).map(|n| SessionId::from(format!("s{n}"))).collect();
        for (n, id) in ids.iter().enumerate() {
            // Silent longest first; the last was heard from just now.
            let seen = if n == BOUND_KEPT { now } else { long_ago + Duration::from_secs(n as u64) };
            sessions.open.lock().insert(id.clone(), Tracked::new(session_conversation(id.as_ref()), seen));
        }
        // The longest silent listens; the next has a request running (its calls run in the in-game session's
        // conversation, like every other bound session's): the third is the longest silent idle one.
        sessions.open.lock().get_mut(&ids[0]).expect("open").listening = 1;
        let (feeder, running) = StreamLog::connected(Duration::from_millis(20));
        // Counted as `create_stream` counts a request, its stream then drained as rmcp's would be.
        sessions.open.lock().get_mut(&ids[1]).expect("open").requests += 1;
        let answer = {
            let _runtime = app.agent().runtime().enter();
            sessions.logged(&ids[1], running, None)
        };
        for id in &ids[..BOUND_KEPT] {
            assert_eq!(sessions.bind(id, &in_game, &credential), None, "up to {BOUND_KEPT} are kept");
        }
        assert_eq!(sessions.bind(&ids[BOUND_KEPT], &in_game, &credential), Some(ids[2].clone()));
        assert!(!sessions.is_open(ids[2].as_ref()) && sessions.is_open(ids[BOUND_KEPT].as_ref()));
        assert_eq!(sessions.bind(&ids[BOUND_KEPT], &in_game, &credential), None, "a session's next request");

        // Its request's response ends: the session is no longer busy.
        feeder.finish();
        let mut answer = answer;
        app.agent()
            .runtime()
            .block_on(async { while std::future::poll_fn(|cx| answer.as_mut().poll_next(cx)).await.is_some() {} });
        assert_eq!(sessions.open.lock().get(&ids[1]).map(|tracked| tracked.requests), Some(0));
        // Only a session silent for the grace ends for a new one: with the others listening, the one heard from
        // just now stays, and the cap waits for the next bind.
        for (id, tracked) in sessions.open.lock().iter_mut() {
            tracked.listening = usize::from(*id != ids[BOUND_KEPT]);
        }
        assert_eq!(sessions.bind(&ids[BOUND_KEPT + 1], &in_game, &credential), None);
        assert!(sessions.is_open(ids[BOUND_KEPT].as_ref()));

        // A client reconnecting in a loop: sessions heard from just now, all listening. Past the most a credential
        // keeps, its longest-silent one without a request running ends for each new one, whatever else.
        let looping: Vec<SessionId> = (0..BOUND_MOST).map(|n| SessionId::from(format!("loop{n}"))).collect();
        sessions.open.lock().get_mut(&ids[3]).expect("open").requests += 1;
        for id in &looping {
            let mut tracked = Tracked::new(session_conversation(id.as_ref()), Instant::now());
            tracked.listening = 1;
            sessions.open.lock().insert(id.clone(), tracked);
        }
        let mut ended = Vec::new();
        for id in &looping {
            ended.extend(sessions.bind(id, &in_game, &credential));
        }
        let of_credential = sessions.open.lock().values().filter(|tracked| tracked.bound.is_some()).count();
        assert_eq!(of_credential, BOUND_MOST, "never more than the most a credential keeps: ended {ended:?}");
        assert!(
            ended.contains(&ids[0]) && ended.contains(&ids[BOUND_KEPT]),
            "listening, or heard from lately: {ended:?}"
        );
        assert!(sessions.is_open(ids[3].as_ref()), "a session with a request running is not ended");

        assert!(sessions.expired(now + Duration::from_secs(1 << 30)).is_empty(), "no idle timeout");
        credentials.revoke(&credential);
        let bound = sessions.open.lock().values().filter(|tracked| tracked.bound.is_some()).count();
        assert_eq!(sessions.expired(now).len(), bound, "the revoked credential's sessions end all the same");
    }
}
