//! The host's conversations: each one's status facts, event sequence, calls in flight and subscribers.
//!
//! Its lock is a leaf: the host takes it after its own state lock (admission) or after a call's step lock (a
//! call's outcome), an in-game agent session after its state lock and its permission requests' lock; it never
//! calls back into a call or a session while holding it. Events are published under the lock, so
//! every subscriber sees one conversation's events in sequence order, and a snapshot taken under it is exactly
//! the state before the next event.
//!
//! Here: the conversations and their status; in `calls`, the calls in them and subscriptions; in `ending`, how
//! they end; in `held`, what in-game agent sessions do with theirs.

mod calls;
mod ending;
mod held;

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

impl ConversationHub {
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
