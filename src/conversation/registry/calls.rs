//! Calls in a conversation: a snapshot and subscription, calls started, joined, progressing and finished, and
//! the calls that wait for a world (pending).

use super::*;

impl ConversationHub {
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
}
