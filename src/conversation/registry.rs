//! The host's conversations: each one's status facts, event sequence, calls in flight and subscribers.
//!
//! Its lock is a leaf: the host takes it after its own state lock (admission) or after a call's step lock (a
//! call's outcome), an in-game agent session after its state lock and its permission requests' lock; it never
//! calls back into a call or a session while holding it. Events are published under the lock, so
//! every subscriber sees one conversation's events in sequence order, and a snapshot taken under it is exactly
//! the state before the next event.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use super::events::{
    CallFinished, CallProgress, CallStarted, ConversationEvent, ConversationStatusChanged, Subscription,
};
use super::forgotten::{Forgotten, Last};
use super::pending::WaitCancel;
use super::snapshot::{ActiveCall, ConversationSnapshot, PendingCall};
use super::status::{ConversationStatus, Reported, StatusFacts, StatusSource};
use crate::call::{CallLife, CallOutcome, JobSender, Progress};
use crate::error::{ErrorCode, ToolError};
use crate::ids::{ConversationId, TaskId};
use crate::lifecycle::VisitInfo;
use crate::sync::Mutex;

/// How many ended conversations are remembered (so that resuming one says "ended", not "not found").
const ENDED_KEPT: usize = 1024;
/// How many conversations end between two looks for ended ones to forget: each look reads every conversation
/// (up to the 10,000 MCP handles and more), so it is not made at every end (a sessionless MCP request ends one).
const ENDS_BETWEEN_LOOKS: u32 = 64;

struct Entry {
    facts: StatusFacts,
    status: ConversationStatus,
    /// The sequence number of the last published event.
    sequence: u64,
    /// The newest sequence number the agent reported with.
    agent_sequence: u64,
    /// Its calls in flight: its own, and the executions of other conversations' calls that its retries joined
    /// (same task and operation id: a call of this conversation too, under the first call's request id).
    active: BTreeMap<crate::ids::RequestId, Arc<CallLife>>,
    pending: BTreeMap<u64, (PendingCall, WaitCancel)>,
    subscribers: Vec<UnboundedSender<ConversationEvent>>,
    last_activity: Instant,
    ended_at: Option<Instant>,
    /// Owned by the game (an in-game agent session): only the game ends it, never the idle timeout.
    held: bool,
    /// Why it takes no calls for now (an in-game agent session's).
    suspended: Option<Suspension>,
    /// Its transport no longer names it, but a call of it was in flight: it ends when its last call finishes
    /// (unless it is named again first).
    end_when_idle: bool,
}

impl Entry {
    fn new(now: Instant) -> Self {
        Self {
            facts: StatusFacts::default(),
            status: ConversationStatus::Idle,
            sequence: 0,
            agent_sequence: 0,
            active: BTreeMap::new(),
            pending: BTreeMap::new(),
            subscribers: Vec::new(),
            last_activity: now,
            ended_at: None,
            held: false,
            suspended: None,
            end_when_idle: false,
        }
    }

    /// Whether a call of it may be admitted.
    fn takes_calls(&self) -> bool {
        !self.facts.ended && self.suspended.is_none()
    }
}

/// Why an in-game agent session's conversation takes no calls for now.
#[cfg_attr(not(any(feature = "acp", feature = "openai")), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Suspension {
    /// The session failed: until it is resumed (its agent is being stopped, and a request that passed the
    /// credential check just before it was revoked must not run).
    Failed,
    /// The player cancelled the running turn: until that turn ends. A call the agent sent before it read the
    /// cancel must not change the world after the player's stop.
    TurnCancelled,
}

#[derive(Default)]
struct HubInner {
    conversations: HashMap<ConversationId, Entry>,
    /// Subscribers to every conversation.
    watchers: Vec<UnboundedSender<ConversationEvent>>,
    next_pending: u64,
    /// The other conversations whose retries joined each execution still in flight, by its request id: its
    /// finish is theirs too.
    joined: HashMap<crate::ids::RequestId, Vec<ConversationId>>,
    /// Conversations whose life a transport keeps (an MCP 2025-11-25 session's: it ends with its session), which
    /// the idle timeout leaves alone.
    transport_owned: Option<TransportOwned>,
    /// Where a forgotten conversation's events go on if it comes back.
    forgotten: Forgotten,
    /// Conversations that ended since [`ConversationHub::forget_old_ended`] last looked for ones to forget.
    ends_unlooked: u32,
}

impl HubInner {
    /// Conversation `id`, created `Idle` if unknown, or ended if the host forgot it ended ([`entry_in`]).
    fn entry(&mut self, id: &ConversationId, now: Instant) -> &mut Entry {
        entry_in(&mut self.conversations, &mut self.forgotten, id, now)
    }

    /// Forgets conversation `id`, keeping where its events go on.
    fn forget(&mut self, id: &ConversationId) {
        if let Some(entry) = self.conversations.remove(id) {
            let last =
                Last { sequence: entry.sequence, agent_sequence: entry.agent_sequence, ended: entry.facts.ended };
            self.forgotten.remember(id.clone(), last);
        }
    }
}

/// Conversation `id` of `conversations`, created `Idle` if unknown, or, if the host forgot it, as it was
/// forgotten (ended, with its sequences: its events and its agent's reports go on after them).
fn entry_in<'a>(
    conversations: &'a mut HashMap<ConversationId, Entry>,
    forgotten: &mut Forgotten,
    id: &ConversationId,
    now: Instant,
) -> &'a mut Entry {
    conversations.entry(id.clone()).or_insert_with(|| {
        let mut entry = Entry::new(now);
        let last = forgotten.start_of(id);
        (entry.sequence, entry.agent_sequence) = (last.sequence, last.agent_sequence);
        if last.ended {
            entry.facts.ended = true;
            entry.status = ConversationStatus::Ended;
            entry.ended_at = Some(now);
        }
        entry
    })
}

/// Whether a conversation's life is its transport's.
pub(crate) type TransportOwned = Arc<dyn Fn(&ConversationId) -> bool + Send + Sync>;

/// What an end took from the conversation, to be ended outside the lock.
#[derive(Default)]
pub(crate) struct Orphans {
    calls: Vec<Arc<CallLife>>,
    pending: Vec<WaitCancel>,
}

impl Orphans {
    /// Ends the conversation's calls with `CANCELLED` (their `ended()` fires) and stops its pending calls. A
    /// keyed execution that a caller of another conversation still waits for goes on for it (rule H12): only
    /// this conversation's callers stop waiting, and this conversation sees its call finish `CANCELLED` now.
    fn end(self, conversation: &ConversationId) {
        let why = format!("conversation `{conversation}` ended before the call finished");
        for life in self.calls {
            life.withdraw(conversation, &why);
        }
        for call in self.pending {
            call.end();
        }
    }
}

pub(crate) struct ConversationHub {
    inner: Mutex<HubInner>,
    /// To the main thread, which writes them as Bevy messages.
    game: GameFeed,
    idle_timeout: Option<Duration>,
}

/// The conversation events on their way to the main thread. Each wakes a windowed game's loop (feature `winit`),
/// as a queued step does: a game with reactive updates shows a reply, or a permission prompt, as it comes.
pub(crate) struct GameFeed {
    events: Sender<ConversationEvent>,
    wake: JobSender,
}

impl GameFeed {
    fn send(&self, event: ConversationEvent) {
        if self.events.send(event).is_ok() {
            self.wake.wake();
        }
    }
}

impl ConversationHub {
    /// The hub, and the main thread's end of its events; `wake` is the queue whose wake the events use too.
    pub(crate) fn new(idle_timeout: Option<Duration>, wake: JobSender) -> (Self, Receiver<ConversationEvent>) {
        let (events, feed) = crossbeam_channel::unbounded();
        (Self { inner: Mutex::new(HubInner::default()), game: GameFeed { events, wake }, idle_timeout }, feed)
    }

    /// Opens `id`: creates it `Idle` if unknown, and reactivates it (`Ended → Idle`, by the host) if it ended,
    /// unless an in-game agent session holds it: only resuming the session reactivates that (DESIGN §6b: an ended
    /// session is never resumed implicitly).
    pub(crate) fn open(&self, id: &ConversationId) {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        let game = &self.game;
        let HubInner { conversations, watchers, forgotten, .. } = &mut *inner;
        let entry = entry_in(conversations, forgotten, id, now);
        entry.last_activity = now;
        entry.end_when_idle = false;
        if entry.facts.ended && !entry.held {
            entry.facts.reactivate();
            entry.ended_at = None;
            update(game, watchers, id, entry, StatusSource::Host);
        }
    }

    /// Creates `id` `Idle` if unknown, and notes its activity; an ended one stays ended (one the host forgot after
    /// it ended too).
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn open_unless_ended(&self, id: &ConversationId) {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        inner.entry(id, now).last_activity = now;
    }

    /// Why a call of `id` is refused, once [`accepts`](Self::accepts) (or a call's start) said it is.
    pub(crate) fn refusal(&self, id: &ConversationId) -> ToolError {
        let suspended = self.inner.lock().conversations.get(id).filter(|e| !e.facts.ended).and_then(|e| e.suspended);
        match suspended {
            None => super::ended(id),
            Some(Suspension::Failed) => ToolError::with_code(
                ErrorCode::Cancelled,
                format!("the in-game agent session `{id}` failed: it calls no tools until it is resumed"),
            )
            .with_detail("conversation", id)
            .with_detail("session_failed", true),
            Some(Suspension::TurnCancelled) => ToolError::with_code(
                ErrorCode::Cancelled,
                "the player cancelled the turn: its agent calls no tools until the next turn",
            )
            .with_detail("conversation", id),
        }
    }

    /// Whether an in-game agent session holds `id`.
    pub(crate) fn is_held(&self, id: &ConversationId) -> bool {
        self.inner.lock().conversations.get(id).is_some_and(|entry| entry.held)
    }

    pub(crate) fn status(&self, id: &ConversationId) -> Option<ConversationStatus> {
        self.inner.lock().conversations.get(id).map(|entry| entry.status)
    }

    /// Whether `id` has calls in flight (executing or waiting for their tool), or its agent reported it waits for a
    /// tool result: what its status says only while it is not `Error` (which a game's `report_error` sets, and
    /// which wins over a call in flight).
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn waits_for_tools(&self, id: &ConversationId) -> bool {
        let inner = self.inner.lock();
        inner.conversations.get(id).is_some_and(|entry| entry.facts.calls > 0 || entry.facts.agent_waiting)
    }

    /// The explicit `Ended → Idle` of [`Conversation::resume`](crate::Conversation::resume).
    pub(crate) fn reactivate(&self, id: &ConversationId) -> Result<(), ToolError> {
        let mut inner = self.inner.lock();
        let HubInner { conversations, watchers, .. } = &mut *inner;
        let entry = conversations.get_mut(id).ok_or_else(|| not_found(id))?;
        entry.last_activity = Instant::now();
        entry.end_when_idle = false;
        if entry.facts.ended {
            entry.facts.reactivate();
            entry.ended_at = None;
            update(&self.game, watchers, id, entry, StatusSource::Host);
        }
        Ok(())
    }

    /// Applies a status the agent reported, with its sequence number (the next one when `None`).
    pub(crate) fn report(&self, id: &ConversationId, status: ConversationStatus, sequence: Option<u64>) -> Reported {
        let (reported, orphans) = {
            let mut inner = self.inner.lock();
            let HubInner { conversations, watchers, .. } = &mut *inner;
            let Some(entry) = conversations.get_mut(id) else { return Reported::Refused };
            // After `u64::MAX` there is no next number: every later report is stale.
            let Some(sequence) = sequence.or(entry.agent_sequence.checked_add(1)) else { return Reported::Stale };
            if sequence <= entry.agent_sequence {
                return Reported::Stale;
            }
            if status == ConversationStatus::Ended && entry.held {
                // The session ends its conversation (`end_unheld`), with its agent and credential.
                return Reported::Refused;
            }
            entry.agent_sequence = sequence;
            entry.last_activity = Instant::now();
            if status == ConversationStatus::Ended {
                let was_ended = entry.facts.ended;
                let orphans = end_entry(&self.game, watchers, id, entry, StatusSource::Agent);
                (if was_ended { Reported::Unchanged } else { Reported::Changed }, Some(orphans))
            } else if !entry.facts.agent_reports(status) {
                (Reported::Refused, None)
            } else if update(&self.game, watchers, id, entry, StatusSource::Agent) {
                (Reported::Changed, None)
            } else {
                (Reported::Unchanged, None)
            }
        };
        if let Some(orphans) = orphans {
            orphans.end(id);
            self.forget_old_ended();
        }
        reported
    }
}

/// What in-game agent sessions (`acp`, `openai` features) do with their conversations.
#[cfg_attr(not(any(feature = "acp", feature = "openai")), allow(dead_code))]
impl ConversationHub {
    /// Opens `id` as a conversation the game owns (an in-game agent session): the idle timeout never ends it.
    pub(crate) fn open_held(&self, id: &ConversationId) {
        self.open(id);
        if let Some(entry) = self.inner.lock().conversations.get_mut(id) {
            entry.held = true;
        }
    }

    /// Creates `id` as a game-owned conversation restored from a record: ended or idle, without an event (its
    /// status is the record's, not a transition).
    pub(crate) fn restore_held(&self, id: &ConversationId, ended: bool) {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        let entry = inner.entry(id, now);
        entry.held = true;
        if ended && !entry.facts.ended {
            entry.facts.ended = true;
            entry.status = ConversationStatus::Ended;
            entry.ended_at = Some(now);
        } else if !ended && entry.facts.ended {
            // Forgotten ended, as another conversation by that id: the record says what it is now.
            entry.facts.reactivate();
            entry.status = ConversationStatus::Idle;
            entry.ended_at = None;
        }
    }

    /// Publishes an event of an in-game agent session (chat, errors, permission requests) in its conversation's
    /// sequence. Ignored for an unknown conversation.
    pub(crate) fn publish_chat(&self, event: ConversationEvent) {
        let id = event.conversation().clone();
        self.publish_chat_then_set(&id, vec![event], None, StatusSource::Host);
    }

    /// Stops admitting calls of the in-game agent session `id`, for `why` (or, `None`, admits them again: it went
    /// live again). Its calls already admitted are the session's to cancel.
    pub(crate) fn suspend(&self, id: &ConversationId, why: Option<Suspension>) {
        if let Some(entry) = self.inner.lock().conversations.get_mut(id) {
            entry.suspended = why;
        }
    }

    /// Admits calls of `id` again if they were stopped for `why` only (a failure that came since stays).
    pub(crate) fn end_suspension(&self, id: &ConversationId, why: Suspension) {
        if let Some(entry) = self.inner.lock().conversations.get_mut(id).filter(|entry| entry.suspended == Some(why)) {
            entry.suspended = None;
        }
    }

    /// Forgets `id`, which never became a session (its agent failed to start) or whose session the game forgot
    /// (it ended first): nothing is published.
    pub(crate) fn forget(&self, id: &ConversationId) {
        self.inner.lock().forget(id);
    }

    /// A status the host sets on behalf of a conversation the game drives (an in-game agent session's turn
    /// started, its backend failed): applied like an agent's report, published with source `Host`.
    /// `Ended` is not set this way: see [`end`](Self::end).
    pub(crate) fn host_sets(&self, id: &ConversationId, status: ConversationStatus) -> Reported {
        self.publish_chat_then_set(id, Vec::new(), Some(status), StatusSource::Host)
    }

    /// Publishes `events` of an in-game agent session, then sets `status` as [`host_sets`](Self::host_sets)
    /// does but with `source` (`Agent` for what its agent reported: the end of a turn), as one step: whoever
    /// sees the last of them (a reply completed, an error) and then asks for the status gets the status that
    /// follows them.
    pub(crate) fn publish_chat_then_set(
        &self,
        id: &ConversationId,
        events: Vec<ConversationEvent>,
        status: Option<ConversationStatus>,
        source: StatusSource,
    ) -> Reported {
        let mut inner = self.inner.lock();
        let HubInner { conversations, watchers, .. } = &mut *inner;
        let Some(entry) = conversations.get_mut(id) else { return Reported::Refused };
        entry.last_activity = Instant::now();
        for event in events {
            publish(&self.game, watchers, entry, event);
        }
        let Some(status) = status else { return Reported::Unchanged };
        if status == ConversationStatus::Ended || !entry.facts.agent_reports(status) {
            return Reported::Refused;
        }
        if update(&self.game, watchers, id, entry, source) {
            Reported::Changed
        } else {
            Reported::Unchanged
        }
    }
}

impl ConversationHub {
    /// Ends `id` (by the host): publishes `Ended` once, ends its calls. Ending an ended conversation succeeds
    /// without a second event.
    #[cfg_attr(not(any(feature = "acp", feature = "openai")), allow(dead_code))]
    pub(crate) fn end(&self, id: &ConversationId) -> Result<(), ToolError> {
        self.end_if(id, |_| Ok(true)).map(|_| ())
    }

    /// Ends `id` if `still` says so, decided under the same lock as the end (a call admitted meanwhile is seen).
    /// Returns whether it ended it.
    fn end_if(
        &self,
        id: &ConversationId,
        still: impl FnOnce(&mut Entry) -> Result<bool, ToolError>,
    ) -> Result<bool, ToolError> {
        let orphans = {
            let mut inner = self.inner.lock();
            let HubInner { conversations, watchers, .. } = &mut *inner;
            let entry = conversations.get_mut(id).ok_or_else(|| not_found(id))?;
            if !still(entry)? {
                return Ok(false);
            }
            end_entry(&self.game, watchers, id, entry, StatusSource::Host)
        };
        orphans.end(id);
        self.forget_old_ended();
        Ok(true)
    }

    /// Ends `id` once no call of it is in flight or waits for its tool: now if none is (decided under the lock a
    /// call's admission takes), else when its last one finishes, unless it is [opened](Self::open) again first (an
    /// MCP client's conversation its transport no longer names: a call admitted just before is not cancelled, and
    /// the conversation does not outlive it). Returns whether it ended now.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn end_once_idle(&self, id: &ConversationId) -> bool {
        self.end_if(id, |entry| {
            let idle = entry.active.is_empty() && entry.pending.is_empty();
            entry.end_when_idle = !idle;
            Ok(idle)
        })
        .unwrap_or(false)
    }

    /// [`end`](Self::end) as the public API asks it: an in-game agent session's conversation is ended by ending the
    /// session (its agent stopped, its credential revoked), never alone.
    pub(crate) fn end_unheld(&self, id: &ConversationId) -> Result<(), ToolError> {
        let refuse = |entry: &mut Entry| match entry.held {
            false => Ok(true),
            true => Err(ToolError::with_code(
                ErrorCode::InvalidInput,
                format!(
                    "conversation `{id}` is an in-game agent session's: end the session (`AgentSession::end`, \
                     `SessionRequest::End`), which ends its conversation with its agent"
                ),
            )
            .with_detail("conversation", id)),
        };
        self.end_if(id, refuse).map(|_| ())
    }

    /// Leaves the conversations `owned` says a transport keeps to that transport: the idle timeout never ends them.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) fn leave_to_transport(&self, owned: TransportOwned) {
        self.inner.lock().transport_owned = Some(owned);
    }

    /// Ends every conversation that had no call in flight and no activity for the idle timeout (neither one the
    /// game holds nor one a transport keeps).
    pub(crate) fn end_idle(&self, now: Instant) {
        let Some(timeout) = self.idle_timeout else { return };
        let idle: Vec<ConversationId> = {
            let inner = self.inner.lock();
            let transport_owned = |id: &ConversationId| inner.transport_owned.as_ref().is_some_and(|owned| owned(id));
            inner
                .conversations
                .iter()
                .filter(|(id, entry)| !entry.held && !transport_owned(id) && is_idle(entry, now, timeout))
                .map(|(id, _)| id.clone())
                .collect()
        };
        for id in idle {
            // Checked again as it ends: a call admitted since (from another thread) keeps it.
            if self.end_if(&id, |entry| Ok(!entry.held && is_idle(entry, now, timeout))).unwrap_or(false) {
                tracing::info!(conversation = %id, ?timeout, "the conversation was idle too long; it ended");
            }
        }
    }

    /// A snapshot of `id` and a subscription that delivers exactly the events after it.
    pub(crate) fn attach(
        &self,
        id: &ConversationId,
        visit: Option<VisitInfo>,
    ) -> Result<(ConversationSnapshot, Subscription), ToolError> {
        if id.as_str().is_empty() {
            return Err(ToolError::with_code(ErrorCode::InvalidInput, "the conversation id is empty")
                .with_detail("field", "conversation"));
        }
        let mut inner = self.inner.lock();
        let entry = inner.conversations.get_mut(id).ok_or_else(|| not_found(id))?;
        let (sender, events) = unbounded_channel();
        // Subscriptions dropped since the conversation's last event go now: a game that takes a snapshot every
        // frame of a conversation that says nothing would otherwise keep a channel per frame.
        entry.subscribers.retain(|subscriber| !subscriber.is_closed());
        entry.subscribers.push(sender);
        let snapshot = ConversationSnapshot {
            conversation: id.clone(),
            status: entry.status,
            sequence: entry.sequence,
            active_calls: entry
                .active
                .values()
                .map(|life| ActiveCall {
                    request: life.coords.request,
                    tool: life.coords.tool.clone(),
                    task: life.coords.task.clone(),
                    visit: life.coords.visit.clone(),
                })
                .collect(),
            pending_calls: entry.pending.values().map(|(call, _)| call.clone()).collect(),
            visit,
        };
        Ok((snapshot, Subscription { events }))
    }

    /// The execution of one of `id`'s calls, if it is still in flight.
    pub(crate) fn live_call(&self, id: &ConversationId, request: crate::ids::RequestId) -> Option<Arc<CallLife>> {
        self.inner.lock().conversations.get(id).and_then(|entry| entry.active.get(&request).cloned())
    }

    /// A subscription to every conversation's events from now on.
    pub(crate) fn subscribe_all(&self) -> Subscription {
        let (sender, events) = unbounded_channel();
        let mut inner = self.inner.lock();
        inner.watchers.retain(|watcher| !watcher.is_closed());
        inner.watchers.push(sender);
        Subscription { events }
    }

    /// Whether `id` may make calls now (it is known, not ended, and not a failed in-game session's).
    pub(crate) fn accepts(&self, id: &ConversationId) -> bool {
        self.inner.lock().conversations.get(id).is_some_and(Entry::takes_calls)
    }

    /// Records an admitted call (under the host's state lock). Returns false if the conversation ended
    /// meanwhile: the caller must then end the call.
    pub(crate) fn call_started(&self, life: &Arc<CallLife>) -> bool {
        let mut inner = self.inner.lock();
        let HubInner { conversations, watchers, .. } = &mut *inner;
        let id = &life.coords.conversation;
        let Some(entry) = conversations.get_mut(id).filter(|entry| entry.takes_calls()) else { return false };
        entry.last_activity = entry.last_activity.max(life.started);
        start(&self.game, watchers, id, entry, life);
        true
    }

    /// Records that a retry from `id` joined another call's running execution (under the host's state lock): it
    /// is a call of `id` too, until the execution finishes or `id` stops waiting for it. Returns false if the
    /// conversation ended meanwhile: the caller must then leave it.
    pub(crate) fn call_joined(&self, id: &ConversationId, life: &Arc<CallLife>) -> bool {
        let mut inner = self.inner.lock();
        let HubInner { conversations, watchers, joined, .. } = &mut *inner;
        let Some(entry) = conversations.get_mut(id).filter(|entry| entry.takes_calls()) else { return false };
        entry.last_activity = Instant::now();
        // Already its call (a retry in the call's own conversation), or already finished: its caller reads the
        // outcome, nothing to record.
        let finished = life.finished_in_hub.load(std::sync::atomic::Ordering::Acquire);
        if !finished && !entry.active.contains_key(&life.coords.request) {
            start(&self.game, watchers, id, entry, life);
            let others = joined.entry(life.coords.request).or_default();
            if !others.contains(id) {
                others.push(id.clone());
            }
        }
        true
    }
}

/// Takes `life` off the calls in flight of conversation `id` and publishes its outcome there (ending it if it was
/// to end once idle, counted in `ends_unlooked`). Returns whether it was one of them.
fn finished(
    game: &GameFeed,
    (conversations, watchers, ends_unlooked): Hub<'_>,
    id: &ConversationId,
    life: &CallLife,
    outcome: &CallOutcome,
) -> bool {
    let Some(entry) = conversations.get_mut(id) else { return false };
    if entry.active.remove(&life.coords.request).is_none() {
        return false;
    }
    entry.facts.calls = entry.facts.calls.saturating_sub(1);
    entry.last_activity = Instant::now();
    let finished = CallFinished {
        conversation: id.clone(),
        request: life.coords.request,
        joined: *id != life.coords.conversation,
        tool: life.coords.tool.clone(),
        code: outcome.as_ref().err().map(|error| error.code.clone()),
        duration: life.started.elapsed(),
        visit: life.coords.visit.clone(),
        sequence: 0,
    };
    publish(game, watchers, entry, ConversationEvent::CallFinished(finished));
    update(game, watchers, id, entry, StatusSource::Host);
    end_if_due(game, watchers, id, entry, ends_unlooked);
    true
}

/// What [`finished`] changes of the hub.
type Hub<'a> = (&'a mut HashMap<ConversationId, Entry>, &'a mut Vec<UnboundedSender<ConversationEvent>>, &'a mut u32);

/// Ends `entry` if its last call just finished and it was to [end once idle](ConversationHub::end_once_idle),
/// counting the end in `ends_unlooked` ([`HubInner::forget_old_ended_if_due`]).
fn end_if_due(
    game: &GameFeed,
    watchers: &mut Vec<UnboundedSender<ConversationEvent>>,
    id: &ConversationId,
    entry: &mut Entry,
    ends_unlooked: &mut u32,
) {
    if entry.end_when_idle && entry.active.is_empty() && entry.pending.is_empty() {
        // No call of it is left to end.
        let _no_calls = end_entry(game, watchers, id, entry, StatusSource::Host);
        *ends_unlooked += 1;
    }
}

/// Records `life` as a call in flight of conversation `id`, and publishes it.
fn start(
    game: &GameFeed,
    watchers: &mut Vec<UnboundedSender<ConversationEvent>>,
    id: &ConversationId,
    entry: &mut Entry,
    life: &Arc<CallLife>,
) {
    entry.active.insert(life.coords.request, life.clone());
    entry.facts.calls += 1;
    let started = CallStarted {
        conversation: id.clone(),
        request: life.coords.request,
        tool: life.coords.tool.clone(),
        task: life.coords.task.clone(),
        visit: life.coords.visit.clone(),
        joined: *id != life.coords.conversation,
        sequence: 0,
    };
    publish(game, watchers, entry, ConversationEvent::CallStarted(started));
    update(game, watchers, id, entry, StatusSource::Host);
}

impl ConversationHub {
    /// Publishes a running call's progress report (nothing once the call finished).
    /// Published to every conversation the call is in flight for: its own, and those whose retries joined it.
    pub(crate) fn call_progress(&self, life: &CallLife, progress: &Progress) {
        let mut inner = self.inner.lock();
        let HubInner { conversations, watchers, joined, .. } = &mut *inner;
        let others = joined.get(&life.coords.request).into_iter().flatten();
        for id in std::iter::once(&life.coords.conversation).chain(others) {
            let Some(entry) = conversations.get_mut(id) else { continue };
            if !entry.active.contains_key(&life.coords.request) {
                continue;
            }
            let event = CallProgress {
                conversation: id.clone(),
                request: life.coords.request,
                tool: life.coords.tool.clone(),
                progress: progress.progress,
                total: progress.total,
                message: progress.message.clone(),
                sequence: 0,
            };
            publish(&self.game, watchers, entry, ConversationEvent::CallProgress(event));
        }
    }

    /// Records a call's outcome, before anyone waiting for it can see it (so the status has already returned
    /// when the agent learns the result).
    /// It finishes for its own conversation and for every other one whose retry joined it; a retry that joins it
    /// after this reads its outcome and is not recorded.
    pub(crate) fn call_finished(&self, life: &CallLife, outcome: &CallOutcome) {
        let mut inner = self.inner.lock();
        life.finished_in_hub.store(true, std::sync::atomic::Ordering::Release);
        let HubInner { conversations, watchers, joined, ends_unlooked, .. } = &mut *inner;
        let others = joined.remove(&life.coords.request).unwrap_or_default();
        for id in std::iter::once(&life.coords.conversation).chain(&others) {
            finished(&self.game, (&mut *conversations, &mut *watchers, &mut *ends_unlooked), id, life, outcome);
        }
        inner.forget_old_ended_if_due();
    }

    /// The conversation `id` stopped waiting for its call `life`, which goes on for a caller of another
    /// conversation (under the call's step lock, as a finish): it finishes here as `CANCELLED` (its own finish
    /// later publishes nothing here). Returns whether the call was still this conversation's.
    pub(crate) fn call_withdrawn(&self, id: &ConversationId, life: &CallLife) -> bool {
        let cancelled = Err(ToolError::with_code(ErrorCode::Cancelled, "withdrawn"));
        let mut inner = self.inner.lock();
        let HubInner { conversations, watchers, ends_unlooked, .. } = &mut *inner;
        let was_its = finished(&self.game, (conversations, watchers, ends_unlooked), id, life, &cancelled);
        inner.forget_old_ended_if_due();
        was_its
    }

    /// Records a call that waits for its tool. `None` if the conversation ended (or is unknown); `Some(Err)` with
    /// `BUSY` if it already has `limit` calls waiting for their tools (they count as calls in flight do, apart).
    pub(crate) fn pending_started(
        &self,
        id: &ConversationId,
        tool: &str,
        task: Option<TaskId>,
        cancel: WaitCancel,
        limit: usize,
    ) -> Option<Result<u64, ToolError>> {
        let mut inner = self.inner.lock();
        inner.next_pending += 1;
        let key = inner.next_pending;
        let HubInner { conversations, watchers, .. } = &mut *inner;
        let entry = conversations.get_mut(id).filter(|entry| entry.takes_calls())?;
        if entry.pending.len() >= limit {
            let waiting = entry.pending.len();
            let error = ToolError::with_code(
                ErrorCode::Busy,
                format!("this conversation already has {waiting} calls waiting for their tools; wait for one to end"),
            );
            return Some(Err(error.with_detail("limit", limit).with_detail("conversation", id)));
        }
        entry.pending.insert(key, (PendingCall { tool: tool.to_string(), task }, cancel));
        entry.facts.calls += 1;
        entry.last_activity = Instant::now();
        update(&self.game, watchers, id, entry, StatusSource::Host);
        Some(Ok(key))
    }

    /// Cancels `id`'s calls still waiting for their tool, saying `why`: all, or those of `task` (a call that named
    /// none is of the conversation's own task). Returns how many.
    pub(crate) fn cancel_pending(&self, id: &ConversationId, task: Option<&TaskId>, why: &str) -> usize {
        let calls: Vec<WaitCancel> = {
            let inner = self.inner.lock();
            let Some(entry) = inner.conversations.get(id) else { return 0 };
            let own = TaskId::of_conversation(id);
            entry
                .pending
                .values()
                .filter(|(call, _)| task.is_none_or(|task| call.task.as_ref().unwrap_or(&own) == task))
                .map(|(_, token)| token.clone())
                .collect()
        };
        calls.iter().filter(|call| call.cancel(why)).count()
    }

    /// The call stopped waiting for its tool (it was admitted, or gave up).
    pub(crate) fn pending_finished(&self, id: &ConversationId, key: u64) {
        let mut inner = self.inner.lock();
        let HubInner { conversations, watchers, ends_unlooked, .. } = &mut *inner;
        let Some(entry) = conversations.get_mut(id) else { return };
        if entry.pending.remove(&key).is_some() {
            entry.facts.calls = entry.facts.calls.saturating_sub(1);
            entry.last_activity = Instant::now();
            update(&self.game, watchers, id, entry, StatusSource::Host);
            end_if_due(&self.game, watchers, id, entry, ends_unlooked);
        }
        inner.forget_old_ended_if_due();
    }

    /// Counts an end, then [`HubInner::forget_old_ended_if_due`].
    fn forget_old_ended(&self) {
        let mut inner = self.inner.lock();
        inner.ends_unlooked += 1;
        inner.forget_old_ended_if_due();
    }
}

impl HubInner {
    /// Keeps at most [`ENDED_KEPT`] ended conversations (looked for every [`ENDS_BETWEEN_LOOKS`] ends: as many
    /// more may be kept for a moment), forgetting the longest ended first. The game's own (an
    /// in-game agent session's, which can be resumed) are kept until the game forgets the session, and so is one
    /// someone still subscribes to (a HUD waiting for it to come back): forgetting it would end the subscription
    /// as if the host were gone. Subscriptions are the game's own objects, so these are as few as it keeps.
    fn forget_old_ended_if_due(&mut self) {
        if self.ends_unlooked < ENDS_BETWEEN_LOOKS {
            return;
        }
        self.ends_unlooked = 0;
        let mut ended: Vec<(Instant, ConversationId)> = self
            .conversations
            .iter()
            .filter(|(_, entry)| !entry.held)
            .filter(|(_, entry)| entry.subscribers.iter().all(|subscriber| subscriber.is_closed()))
            .filter_map(|(id, entry)| entry.ended_at.map(|at| (at, id.clone())))
            .collect();
        if ended.len() <= ENDED_KEPT {
            return;
        }
        ended.sort();
        let excess = ended.len() - ENDED_KEPT;
        for (_, id) in ended.into_iter().take(excess) {
            self.forget(&id);
        }
    }
}

/// Whether `entry` has been idle for `timeout` at `now`: not ended, no call in flight or waiting, no activity.
fn is_idle(entry: &Entry, now: Instant, timeout: Duration) -> bool {
    !entry.facts.ended
        && entry.active.is_empty()
        && entry.pending.is_empty()
        && now.saturating_duration_since(entry.last_activity) >= timeout
}

fn not_found(id: &ConversationId) -> ToolError {
    ToolError::with_code(
        ErrorCode::ConversationNotFound,
        format!("no conversation `{id}` is known to the host: open a new one instead"),
    )
    .with_detail("conversation", id)
}

/// Marks the entry ended (publishing once) and takes its calls, to be ended outside the lock.
fn end_entry(
    game: &GameFeed,
    watchers: &mut Vec<UnboundedSender<ConversationEvent>>,
    id: &ConversationId,
    entry: &mut Entry,
    source: StatusSource,
) -> Orphans {
    entry.end_when_idle = false;
    if entry.facts.ended {
        return Orphans::default();
    }
    entry.facts.ended = true;
    entry.ended_at = Some(Instant::now());
    update(game, watchers, id, entry, source);
    Orphans {
        calls: entry.active.values().cloned().collect(),
        pending: entry.pending.values().map(|(_, token)| token.clone()).collect(),
    }
}

/// Recomputes the status from the facts and publishes a change. Returns whether it changed.
fn update(
    game: &GameFeed,
    watchers: &mut Vec<UnboundedSender<ConversationEvent>>,
    id: &ConversationId,
    entry: &mut Entry,
    source: StatusSource,
) -> bool {
    let status = entry.facts.status();
    if status == entry.status {
        return false;
    }
    let previous = std::mem::replace(&mut entry.status, status);
    let changed = ConversationStatusChanged { conversation: id.clone(), previous, status, source, sequence: 0 };
    publish(game, watchers, entry, ConversationEvent::Status(changed));
    true
}

/// Gives the event the conversation's next sequence number and sends it to every subscriber and the game.
fn publish(
    game: &GameFeed,
    watchers: &mut Vec<UnboundedSender<ConversationEvent>>,
    entry: &mut Entry,
    mut event: ConversationEvent,
) {
    entry.sequence += 1;
    event.set_sequence(entry.sequence);
    entry.subscribers.retain(|subscriber| subscriber.send(event.clone()).is_ok());
    watchers.retain(|watcher| watcher.send(event.clone()).is_ok());
    game.send(event);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_dropped_are_let_go_at_the_next_subscription_even_without_an_event() {
        let (jobs, _queue) = crossbeam_channel::unbounded();
        let (hub, _feed) = ConversationHub::new(None, JobSender::new(jobs));
        let id = ConversationId::new("hud");
        hub.open(&id);
        // A HUD that takes a snapshot every frame of a conversation that says nothing.
        for _ in 0..1000 {
            drop(hub.attach(&id, None).expect("attached"));
            drop(hub.subscribe_all());
        }
        let (_snapshot, kept) = hub.attach(&id, None).expect("attached");
        let inner = hub.inner.lock();
        assert_eq!(inner.conversations[&id].subscribers.len(), 1, "only the subscription still held");
        assert_eq!(inner.watchers.len(), 1, "the last, dropped only after it was counted");
        drop(kept);
    }

    #[test]
    fn conversations_that_end_once_their_last_call_is_done_count_toward_the_bound_on_ended_ones() {
        let (jobs, _queue) = crossbeam_channel::unbounded();
        let (hub, _feed) = ConversationHub::new(None, JobSender::new(jobs));
        // MCP handles forgotten while a call of theirs waited for its tool: each ends when that call stops waiting.
        let ends = ENDED_KEPT + ENDS_BETWEEN_LOOKS as usize;
        for n in 0..ends {
            let id = ConversationId::new(format!("handle-{n}"));
            hub.open(&id);
            let waiting = hub.pending_started(&id, "tool", None, WaitCancel::default(), 32);
            let key = waiting.expect("open").expect("below the limit");
            assert!(!hub.end_once_idle(&id), "a call of it still waits");
            hub.pending_finished(&id, key);
        }
        let inner = hub.inner.lock();
        let ended = inner.conversations.values().filter(|entry| entry.facts.ended).count();
        assert_eq!(ended, ENDED_KEPT, "{ends} ended: the oldest were forgotten");
        assert!(!inner.conversations.contains_key(&ConversationId::new("handle-0")));
    }
}
