//! When sessions end on their own: silent for the idle time, made room for at the cap, or with the conversation
//! the game ended.

use super::*;

impl ConversationSessions {
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
    pub(super) fn has_calls_in_flight(&self, tracked: &Tracked) -> bool {
        let waiting = |conversation: &ConversationId| self.agent.host().conversations.waits_for_tools(conversation);
        waiting(&tracked.conversation) || tracked.used.iter().any(waiting)
    }

    /// With `max` sessions open at `now`, the one to end for a new one, taken out of the open ones at once (so
    /// that sessions created at the same moment each end another): the longest silent of those whose client is
    /// not listening, with no call in flight, of no in-game agent session, silent for [`ROOM_GRACE`] at least.
    /// `None` below `max`, or if all are in use.
    pub(super) fn to_make_room(&self, max: usize, now: Instant) -> Option<SessionId> {
        let mut open = self.open.lock();
        if open.len() < max {
            return None;
        }
        let may_end = |_: &SessionId, tracked: &Tracked| tracked.bound.is_none() && !self.has_calls_in_flight(tracked);
        take_longest_silent_idle(&mut open, now, may_end)
    }

    /// The sessions that end with `conversation`: its own session, and those of the in-game agent session it is
    /// (not those that only used it through a handle: their client may go on in another).
    pub(super) fn ending_with(&self, conversation: &ConversationId) -> Vec<SessionId> {
        let open = self.open.lock();
        let ends = |tracked: &Tracked| tracked.conversation == *conversation || tracked.bound_to(conversation);
        open.iter().filter(|(_, tracked)| ends(tracked)).map(|(id, _)| id.clone()).collect()
    }
}

/// Of the `open` sessions that `may_end`, whose client is not listening and was silent for [`ROOM_GRACE`] at `now`,
/// the longest silent, taken out of them.
pub(super) fn take_longest_silent_idle(
    open: &mut HashMap<SessionId, Tracked>,
    now: Instant,
    may_end: impl Fn(&SessionId, &Tracked) -> bool,
) -> Option<SessionId> {
    take_longest_silent(open, |id, tracked| {
        tracked.listening == 0 && now.saturating_duration_since(tracked.last_seen) >= ROOM_GRACE && may_end(id, tracked)
    })
}

/// Of the `open` sessions that `may_end`, the longest silent, taken out of them.
pub(super) fn take_longest_silent(
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
