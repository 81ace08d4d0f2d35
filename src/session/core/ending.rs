//! Ending a session, resuming it, and writing its record.

use super::*;

impl SessionCore {
    /// Ends the session (`end_session`: the agent is asked to end its session too; else it is only
    /// disconnected, for a later `resume_session`). Pending work rejects with `SESSION_ENDED`; `Ended` is
    /// published once; ending again does nothing. Resolves when the agent process is gone.
    /// (A resume asked for before the end is stopped by whoever asked for the end, when it was asked:
    /// [`stop_resuming`](Self::stop_resuming).)
    /// The agent is given the session's close timeout to answer `session/close`, and less once the game exits
    /// ([`CloseWithin`](super::super::backend::CloseWithin)).
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

    pub(super) async fn end_locked(self: &Arc<Self>, end_session: bool) {
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
                return Err(super::super::record::not_found(self.id.as_str()).with_detail("forgotten", true));
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

    pub(super) fn ended_while_resumed(&self) -> ToolError {
        ToolError::with_code(
            ErrorCode::SessionEnded,
            format!("session `{}` was ended while it was being resumed", self.id),
        )
        .with_detail("session", &self.id)
    }

    /// How long the agent is given to close: the session's close timeout, cut short by the game's exit.
    pub(super) fn close_within(&self) -> super::super::backend::CloseWithin {
        super::super::backend::CloseWithin::new(self.config.timeouts.close, self.host.exiting.clone())
    }

    pub(crate) fn ended_error(&self) -> ToolError {
        let next =
            if self.forgotten.load(Ordering::Relaxed) { "it was forgotten" } else { "resume it to use it again" };
        ToolError::with_code(ErrorCode::SessionEnded, format!("session `{}` has ended: {next}", self.id))
            .with_detail("session", &self.id)
    }

    /// Writes the record as the session is now, after any end or resume under way; not once it ended (its end
    /// wrote the record as it left it).
    pub(super) async fn save_record_as_it_is(&self) {
        let _lifecycle = self.lifecycle.lock().await;
        if !matches!(self.state.lock().phase, Phase::Ended) {
            self.save_record(false).await;
        }
    }

    pub(super) async fn save_record(&self, ended: bool) {
        let (backend_session, runs, instructions_owed) = {
            let state = self.state.lock();
            (state.backend_session.clone(), state.run, state.instructions_owed)
        };
        let owner = Some(super::super::runs::this_run());
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
}
