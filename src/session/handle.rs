//! [`AgentSessions`] (a resource: create and resume sessions) and [`AgentSession`] (one session's handle).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bevy::prelude::Resource;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::backend::{Attached, Usage};
use super::core::{Phase, SessionCore};
use super::record::not_found;
use super::record::Record;
use super::under_way::UnderWay;
use super::{SessionConfig, SessionHost, TurnEnd};
use crate::conversation::ConversationStatus;
use crate::error::{ErrorCode, ToolError};
use crate::ids::ConversationId;

/// How long `send_text` waits for the game's observation of the moment (H14) before sending without it.
const CONTEXT_WAIT: Duration = Duration::from_millis(500);

/// The app's in-game agent sessions: create one, or re-attach to one by id. A resource (added by
/// [`AgentSessionsPlugin`](super::AgentSessionsPlugin)); `Clone + Send + Sync`, usable from any thread. Its
/// async methods (and [`AgentSession`]'s) can be awaited on any executor: tokio's ([`AgentRuntime`]'s handle),
/// Bevy's task pools, or `block_on`; off tokio, their work runs on the plugin's runtime.
///
/// [`AgentRuntime`]: crate::AgentRuntime
#[derive(Resource, Clone)]
pub struct AgentSessions {
    host: Arc<SessionHost>,
    live: Arc<Mutex<HashMap<ConversationId, Arc<SessionCore>>>>,
    /// One lock per session id being resumed or forgotten: the second of two concurrent `resume_session`
    /// calls waits for the first and gets its session, instead of connecting a second agent beside it, and a
    /// `forget` waits for a resume under way (and then ends what it re-attached).
    by_id: IdLocks,
    /// The `forget`s under way: the game's exit waits for them (a chat deleted just before it exits stays deleted).
    forgetting: Arc<UnderWay>,
    /// The `create`s, `resume_session`s and `resume`s under way: the game's exit stops them (dropped, they let go of
    /// what they started: the agent is killed, and a new session's folder removed on a blocking thread, which the
    /// runtime's stop waits for) and waits until they have stopped.
    attaching: Arc<UnderWay>,
}

impl std::fmt::Debug for AgentSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSessions").field("live", &self.live.lock().len()).finish_non_exhaustive()
    }
}

impl AgentSessions {
    pub(crate) fn new(host: Arc<SessionHost>) -> Self {
        Self {
            host,
            live: Arc::default(),
            by_id: IdLocks::default(),
            forgetting: Arc::default(),
            attaching: Arc::default(),
        }
    }

    pub(crate) fn host(&self) -> &SessionHost {
        &self.host
    }

    /// Runs `work` of the session API where tokio's timers work (see [`crate::runtime::on_tokio`]): the API can be
    /// awaited from any executor.
    async fn on_tokio<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, ToolError>> + Send + 'static,
    ) -> Result<T, ToolError> {
        match crate::runtime::on_tokio(&self.host.runtime, work).await {
            Ok(outcome) => outcome,
            Err(lost) if lost.is_panic() => {
                let payload = lost.into_panic();
                Err(ToolError::internal(format!(
                    "the session's work panicked: {}",
                    crate::panic::panic_message(&*payload)
                )))
            }
            Err(_) => Err(ToolError::with_code(
                ErrorCode::AgentUnavailable,
                "the game's agent runtime stopped (the app is exiting) before the session's work finished",
            )),
        }
    }

    /// Creates a session: starts the agent and opens a session there with the system prompt; an ACP agent also
    /// gets the game's MCP server with a credential minted for the session. Resolves when the session is `Idle`
    /// and ready for text, or with `AGENT_UNAVAILABLE` (what went wrong: the agent's exit status and the tail of
    /// its stderr, that it did not answer within [`SessionTimeouts::start`](super::SessionTimeouts::start), or,
    /// for an ACP agent, that the game serves no MCP, or that the game exits first); nothing is left running then.
    pub async fn create(&self, config: SessionConfig) -> Result<AgentSession, ToolError> {
        let this = self.clone();
        let created = self
            .on_tokio(async move { this.until_exit(this.create_here(config)).await.map(|s| Unclaimed(Some(s))) })
            .await?;
        created.claim().ok_or_else(|| ToolError::internal("the created session was lost on its way to the caller"))
    }

    async fn create_here(&self, config: SessionConfig) -> Result<AgentSession, ToolError> {
        // Once per run: the data directory does not change.
        static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let kept_in_temporary = !config.auto_end_on_disconnect && self.host.records.in_temporary_dir();
        if kept_in_temporary && !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                data_dir = %self.host.records.data_dir.display(),
                "sessions kept to be resumed after a restart have their records in the system's temporary \
                 directory, which the system may clean: set AgentSessionsPlugin::data_dir (said once)"
            );
        }
        let id = ConversationId::new(format!("chat-{}", random_hex()?));
        let core = SessionCore::new(id.clone(), config, self.host.clone(), Phase::Live);
        self.host.agent.host().conversations.open_held(&id);
        let unkept = Unkept { host: &self.host, core: &core, new: true };
        let holding = self.host.hold(&id, true).await?;
        core.connect(None, false, None).await?;
        holding.keep();
        unkept.keep();
        self.live.lock().insert(id, core.clone());
        Ok(AgentSession { core, sessions: self.clone() })
    }

    /// Re-attaches to session `id` with an authoritative status: a session of this run as it is; else one kept
    /// from an earlier run (created with `auto_end_on_disconnect(false)`): an ended one stays ended (without
    /// contacting the agent, writing nothing, and not kept from other copies of the game: a menu of past chats may
    /// read them all) until [`AgentSession::resume`]; a live one is re-attached at its agent (ACP
    /// `session/resume`, or `session/load`), under a new credential. An empty id is `INVALID_INPUT`; an id neither
    /// the game nor the agent knows is `SESSION_NOT_FOUND` (nothing is created in its place; an ACP agent may say it
    /// in its error's message or its data). An agent that fails for reasons of its own (it does not say the session
    /// is unknown) is `AGENT_UNAVAILABLE`, and the session is kept for a later try.
    pub async fn resume_session(&self, id: impl Into<ConversationId>) -> Result<AgentSession, ToolError> {
        let (this, id) = (self.clone(), id.into());
        self.on_tokio(async move { this.until_exit(this.resume_session_here(id)).await }).await
    }

    /// Runs `attach` (a `create`, `resume_session` or `AgentSession::resume`) unless the game exits first: then it
    /// is dropped, which lets go of what it started ([`Unkept`]), and it is `AGENT_UNAVAILABLE`. Counted while under
    /// way, from before the exit is checked, so the exit that stops it also waits for it.
    async fn until_exit<T>(&self, attach: impl Future<Output = Result<T, ToolError>>) -> Result<T, ToolError> {
        let _under_way = UnderWay::begin(&self.attaching);
        let exiting = || ToolError::with_code(ErrorCode::AgentUnavailable, "the game is exiting");
        if self.host.exiting.is_cancelled() {
            return Err(exiting());
        }
        tokio::select! {
            biased;
            outcome = attach => outcome,
            () = self.host.exiting.cancelled() => Err(exiting()),
        }
    }

    async fn resume_session_here(&self, id: ConversationId) -> Result<AgentSession, ToolError> {
        if id.as_str().is_empty() {
            return Err(ToolError::invalid_input("session", "the session id is empty"));
        }
        // A session of this run is there at once, without waiting for a resume or forget of it under way.
        if let Some(session) = self.get(&id) {
            return Ok(session);
        }
        let _resuming = self.by_id.lock(&id).await;
        if let Some(session) = self.get(&id) {
            return Ok(session);
        }
        // Before its record is read: another copy of the game may have it open, and write it as it exits.
        let holding = self.host.hold(&id, false).await?;
        let record = self.host.records.load(id.as_str()).await?;
        let phase = if record.ended { Phase::Ended } else { Phase::Live };
        let core = SessionCore::new(id.clone(), record.config.clone(), self.host.clone(), phase);
        core.set_backend_session(record.backend_session.clone());
        if !record.ended {
            // An ended one is only read: nothing of it is written by a copy that does not keep it (below).
            core.take_up(&record).await;
        }
        self.host.agent.host().conversations.restore_held(&id, record.ended);
        let unkept = Unkept { host: &self.host, core: &core, new: false };
        if !record.ended {
            let Some(backend_session) = record.backend_session else {
                return Err(not_found(id.as_str()));
            };
            core.connect(Some(backend_session), false, None).await?;
            holding.keep();
        }
        // An ended session is not this copy's once read (dropped, `holding` lets its folder go): another copy of the
        // game may resume or forget it, and a menu of past chats holds no folder open for each one it showed.
        // `AgentSession::resume` takes it again.
        unkept.keep();
        // Under the id's lock: no other resume of `id` is under way, so this one is the session's only core.
        self.live.lock().insert(id, core.clone());
        Ok(AgentSession { core, sessions: self.clone() })
    }

    /// Forgets session `id`: ends it if this run has it (as [`AgentSession::end`]; its handles then answer
    /// `SESSION_ENDED`, and `resume` on them `SESSION_NOT_FOUND`), then deletes what the game keeps of it
    /// (`<data_dir>/<id>`: its record, its history, its working directory), so it can never be resumed: for a
    /// "delete this chat" in the game, and for kept sessions the game no longer wants. What an ACP agent keeps of
    /// the session on its own side is the agent's. An id the game does not know is `SESSION_NOT_FOUND`; an empty
    /// one `INVALID_INPUT`. A resume of a live session under way ([`AgentSession::resume`]) is stopped
    /// (`SESSION_ENDED`); a `resume_session` of the same id under way finishes first.
    pub async fn forget(&self, id: impl Into<ConversationId>) -> Result<(), ToolError> {
        let (this, id) = (self.clone(), id.into());
        self.on_tokio(async move { this.forget_here(id).await }).await
    }

    /// Stops a resume of live session `id` asked for before now ([`AgentSession::resume`]): an end or a forget
    /// of it is coming.
    pub(crate) fn stop_resuming(&self, id: &ConversationId) {
        if let Some(core) = self.live.lock().get(id) {
            core.stop_resuming();
        }
    }

    async fn forget_here(&self, id: ConversationId) -> Result<(), ToolError> {
        if id.as_str().is_empty() {
            return Err(ToolError::invalid_input("session", "the session id is empty"));
        }
        let _under_way = UnderWay::begin(&self.forgetting);
        // A resume of it under way holds the id's lock: it is stopped, not waited for.
        self.stop_resuming(&id);
        // Whatever puts a known id back in the live map (`resume_session`, `AgentSession::resume`) does it under
        // the id's lock: a resume under way finishes first, and none puts the session back after this.
        let _forgetting = self.by_id.lock(&id).await;
        // Locked until its folder is gone: not deleted under another copy of the game that has it open, nor
        // resumed there meanwhile. (An id without a folder is the record's to answer for.)
        let holding = match self.host.hold(&id, false).await {
            Err(error) if error.code == ErrorCode::SessionNotFound => None,
            holding => Some(holding?),
        };
        let live = self.live.lock().remove(&id);
        if let Some(core) = &live {
            core.end_and_forget().await;
        }
        let forgotten = match self.host.records.forget(id.as_str(), live.is_some()).await {
            // A session of this run whose folder could not be made (it failed to start) has nothing on disk.
            Err(error) if error.code == ErrorCode::SessionNotFound && live.is_some() => Ok(()),
            forgotten => forgotten,
        };
        self.host.in_use.let_go(id.as_str());
        drop(holding);
        if forgotten.is_ok() {
            // Its conversation (ended above, or restored ended from the record) goes too: the host keeps a
            // session's conversation, unlike other ended ones, only while the session can be resumed.
            self.host.agent.host().conversations.forget(&id);
        }
        forgotten
    }

    /// The session `id`, if it is live in this run.
    pub fn get(&self, id: &ConversationId) -> Option<AgentSession> {
        self.live.lock().get(id).cloned().map(|core| AgentSession { core, sessions: self.clone() })
    }

    /// Answers permission request `request` (from a [`PermissionRequested`](super::PermissionRequested)): allow
    /// it once, or deny it. Returns false if it is no longer waiting (answered, timed out, its session ended).
    pub fn answer_permission(&self, request: u64, allow: bool) -> bool {
        self.host.permissions.answer(request, allow)
    }

    /// The game disconnects from every session (on `AppExit`): a session created with
    /// `auto_end_on_disconnect` ends, with its agent's session, and what the game kept of it is deleted (nothing
    /// resumes it after the game); the others are only disconnected, kept for `resume_session`. A `forget` under
    /// way finishes (its session's folder is gone). A `create`, `resume_session` or `AgentSession::resume` under
    /// way stops (as if its caller had dropped it) and answers `AGENT_UNAVAILABLE`, as do later ones. Every agent
    /// process is gone when this returns, or `deadline` passed.
    pub(crate) fn disconnect_all(&self, deadline: Duration) {
        let until = crate::deadline::after(std::time::Instant::now(), deadline);
        self.host.exiting.cancel();
        // Those that finished first are live, and end with the others below.
        self.attaching.wait_until_none(until);
        let cores: Vec<Arc<SessionCore>> = self.live.lock().drain().map(|(_, core)| core).collect();
        if !cores.is_empty() {
            self.disconnect(cores, until);
        }
        // The folders of sessions the exit stopped while they started (their removal, a blocking task, would be
        // dropped unrun by the runtime's stop).
        self.host.records.removing.wait_until_none(until);
        let left = self.forgetting.wait_until_none(until);
        if left > 0 {
            tracing::warn!(
                left,
                "forgets of in-game agent sessions had not finished when the exit's time for them ran out: what \
                 the game keeps of such a session may be left on disk (`forget` it again after the next start)"
            );
        }
    }

    fn disconnect(&self, cores: Vec<Arc<SessionCore>>, until: std::time::Instant) {
        let count = cores.len();
        let (done, all_done) = crossbeam_channel::bounded(count);
        for core in cores {
            let (done, host) = (done.clone(), self.host.clone());
            self.host.runtime.spawn(async move {
                let end_session = core.config.auto_end_on_disconnect;
                core.end(end_session).await;
                if end_session {
                    // Under its lock (taken again if the session had ended and let it go): not deleted under
                    // another copy of the game that took the session since.
                    match host.hold(&core.id, false).await {
                        Ok(_holding) => {
                            if let Err(error) = host.records.forget(core.id.as_str(), true).await {
                                tracing::warn!(session = %core.id, %error, "could not delete an ended session's folder");
                            }
                        }
                        Err(error) if error.code == ErrorCode::SessionNotFound => {}
                        Err(error) => tracing::warn!(session = %core.id, %error, "an ended session's folder is kept"),
                    }
                }
                host.in_use.let_go(core.id.as_str());
                let _ = done.send(());
            });
        }
        drop(done);
        let mut ended = 0;
        while all_done.recv_deadline(until).is_ok() {
            ended += 1;
        }
        if ended < count {
            tracing::warn!(
                left = count - ended,
                "in-game agent sessions had not ended when the exit's time for them ran out: their agents stop with \
                 the runtime, and an ended session's folder may be left for the next start to remove"
            );
        }
    }
}

/// The locks of session ids being resumed or forgotten. An id's lock is kept while someone holds or awaits it,
/// and dropped with the last of them, so a long game does not keep one per id it ever resumed.
#[derive(Clone, Default)]
struct IdLocks(Arc<Mutex<HashMap<ConversationId, Arc<tokio::sync::Mutex<()>>>>>);

/// Session `id`'s lock, held (or awaited: dropping it then gives up the wait).
struct IdLock {
    locks: IdLocks,
    id: ConversationId,
    held: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl IdLocks {
    async fn lock(&self, id: &ConversationId) -> IdLock {
        let lock = self.0.lock().entry(id.clone()).or_default().clone();
        // Made before the wait: a caller that gives up waiting still prunes the id's lock.
        let mut taken = IdLock { locks: self.clone(), id: id.clone(), held: None };
        taken.held = Some(lock.lock_owned().await);
        taken
    }
}

impl Drop for IdLock {
    fn drop(&mut self) {
        self.held = None;
        // Clones are made under the map's lock: one count left means nobody else holds or awaits it.
        let mut locks = self.locks.0.lock();
        if locks.get(&self.id).is_some_and(|lock| Arc::strong_count(lock) == 1) {
            locks.remove(&self.id);
        }
    }
}

/// A session being created or re-attached. Unless kept, when it is dropped (the start failed, or the caller
/// dropped `create` or `resume_session` midway: a timeout around it, a game task dropped with its menu) nothing
/// of it is left: its agent is stopped, its credential revoked, its conversation forgotten, and a new session's
/// folder removed (a re-attached one's holds its record: it stays).
struct Unkept<'a> {
    host: &'a SessionHost,
    core: &'a Arc<SessionCore>,
    new: bool,
}

impl Unkept<'_> {
    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Unkept<'_> {
    fn drop(&mut self) {
        let connected = self.core.abandon();
        self.host.agent.host().conversations.forget(&self.core.id);
        // (Its lock is its `Holding`'s to let go: one this call did not take is another's.)
        if self.new {
            self.host.records.remove_new(self.core.id.as_str(), connected);
        }
    }
}

/// A new session on its way to the caller of [`AgentSessions::create`]: awaited off tokio, `create`'s work runs
/// as a task, and a caller that gave up just as the task finished drops its result with the task's handle. Then
/// nothing of the session is left, as with [`Unkept`].
struct Unclaimed(Option<AgentSession>);

impl Unclaimed {
    fn claim(mut self) -> Option<AgentSession> {
        self.0.take()
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let Some(session) = self.0.take() {
            session.sessions.live.lock().remove(&session.core.id);
            drop(Unkept { host: &session.sessions.host, core: &session.core, new: true });
            // Its folder's lock was kept with the session: nobody else will let it go.
            session.sessions.host.in_use.let_go(session.core.id.as_str());
        }
    }
}

/// One in-game agent session. Cheap to clone; every clone is the same session.
#[derive(Clone)]
pub struct AgentSession {
    core: Arc<SessionCore>,
    sessions: AgentSessions,
}

impl AgentSession {
    /// The game's id of the session: its conversation's id, the one to resume it with.
    pub fn id(&self) -> &ConversationId {
        &self.core.id
    }

    /// Sends the player's text and resolves when the turn ends, with its stop reason and final message. The text
    /// reaches the agent as one text block, word for word; what the game adds (the system prompt where the agent
    /// has none, the game's observation of the moment from `WorldLifecycle::input_context`) goes in other blocks.
    ///
    /// `SESSION_BUSY` while a turn runs (nothing is sent), `SESSION_ENDED` once ended, the failure's error while
    /// failed; `TIMEOUT` if the agent does not end the turn in time (it is then stopped).
    pub async fn send_text(&self, text: impl Into<String>) -> Result<TurnEnd, ToolError> {
        self.start_turn(text).await?.await
    }

    /// Like [`send_text`](Self::send_text), but resolves as soon as the text was sent (or refused), with the
    /// turn's outcome still to come: a chat box answers "sent" at once and shows the reply as it streams.
    pub async fn start_turn(&self, text: impl Into<String>) -> Result<PendingTurn, ToolError> {
        let (this, text) = (self.clone(), text.into());
        self.sessions.on_tokio(async move { this.start_turn_here(text).await }).await
    }

    async fn start_turn_here(&self, text: String) -> Result<PendingTurn, ToolError> {
        // Refuse before asking the game for its observation: a busy or ended session sends nothing. A cancel
        // while the observation is awaited stops the turn before it is sent.
        let start = self.core.begin_turn()?;
        let context = if self.core.config.input_context { self.observe().await } else { None };
        let outcome = self.core.start_turn(text, context, start)?;
        Ok(PendingTurn { outcome })
    }

    /// The game's observation for this input (H14), if a world is open and answers in time.
    async fn observe(&self) -> Option<String> {
        let conversation = self.sessions.host.agent.conversation_handle(&self.core.id);
        let observed = tokio::time::timeout(CONTEXT_WAIT, conversation.observe_input()).await;
        match observed {
            Ok(Ok(context)) => context.observation.map(|value| value.to_string()),
            _ => None,
        }
    }

    /// Cancels the running turn: the agent is asked to stop, the session's tool calls running in the game are
    /// cancelled (`CANCELLED`) and, until the turn ends, the ones it still makes are refused (`CANCELLED`) and its
    /// permission requests answered `cancelled` without asking anyone; the turn ends (normally with
    /// [`StopReason::Cancelled`](super::StopReason::Cancelled); an agent that does not end it within
    /// [`SessionTimeouts::cancel_grace`](super::SessionTimeouts::cancel_grace) is stopped, as for a turn timeout). A
    /// turn still being sent (the game's observation for it awaited, at most 500 ms) is not sent, and ends so when
    /// that wait is over. Returns whether a turn was running or being sent.
    pub fn cancel(&self) -> bool {
        self.core.cancel()
    }

    /// The session's status now (its conversation's).
    pub fn status(&self) -> ConversationStatus {
        self.sessions.host.agent.conversation_status(&self.core.id).unwrap_or(ConversationStatus::Ended)
    }

    /// What the agent last reported about its use of the model, if it did.
    pub fn usage(&self) -> Option<Usage> {
        self.core.usage()
    }

    /// Ends the session: the running turn and other pending work reject with `SESSION_ENDED`, the session's tool
    /// calls in flight end (`CANCELLED`), its credential is revoked, `Ended` is published once, the agent is asked
    /// to close its session and its process is stopped. The visit is untouched. Ending again does nothing. The
    /// ended session is no longer this copy of the game's: another copy sharing the data directory may resume it
    /// (a `resume` here is then `SESSION_BUSY`).
    pub async fn end(&self) {
        // A resume asked for before now stops (`SESSION_ENDED`) rather than hold this end up.
        self.core.stop_resuming();
        self.end_as_asked().await
    }

    /// [`end`](Self::end) of a session whose resumes asked for before the end were stopped when it was asked (a
    /// `SessionRequest::End`, when it was written): one asked for since goes on, and this end waits for it.
    pub(crate) async fn end_as_asked(&self) {
        let this = self.clone();
        let ended = async move {
            this.core.end(true).await;
            // The folder's lock goes with it (an open file: held by every ended session until the game exits, they
            // ran a long-running game out of file descriptors); `resume` takes it again. Under the id's lock, as
            // `resume`: not let go of a session a resume just brought back.
            let _ending = this.sessions.by_id.lock(&this.core.id).await;
            if this.core.is_ended() {
                this.sessions.host.in_use.let_go(this.core.id.as_str());
            }
        };
        let _ = crate::runtime::on_tokio(&self.sessions.host.runtime, ended).await;
    }

    /// The explicit `Ended → Idle` (and `Error → Idle`): restarts the agent if it is gone and re-attaches the
    /// session there (`session/resume` or `session/load`), or starts a new one where the agent cannot (it offers
    /// neither, or says it does not know the session, in its error's message or its data), which the result says
    /// ([`Attached::Replaced`]). Any other failure of the agent's is `AGENT_UNAVAILABLE` and replaces nothing: a
    /// later `resume` can still re-attach. A new credential is minted. A live session is left as it is. An ended
    /// session another copy of the game took meanwhile is `SESSION_BUSY`. The game's exit stops a resume under way
    /// (`AGENT_UNAVAILABLE`, "the game is exiting"), and so does an [`end`](Self::end) or a `forget` asked for
    /// after it, while its agent starts (`SESSION_ENDED`).
    pub async fn resume(&self) -> Result<Attached, ToolError> {
        self.resume_watching(self.core.watch_ends()).await
    }

    /// Watches for ends asked for from now on ([`resume_watching`](Self::resume_watching)).
    pub(crate) fn watch_ends(&self) -> tokio::sync::watch::Receiver<u64> {
        self.core.watch_ends()
    }

    /// [`resume`](Self::resume), stopped by an end asked for since `ends` was taken (a request's, when it was
    /// written).
    pub(crate) async fn resume_watching(&self, ends: tokio::sync::watch::Receiver<u64>) -> Result<Attached, ToolError> {
        let this = self.clone();
        let work = async move {
            // Under the id's lock, as `resume_session` and `forget`: a `forget` cannot end between the re-attach
            // and the session's return to the live map (it would be put back there forgotten).
            let _resuming = this.sessions.by_id.lock(&this.core.id).await;
            // An ended session let its folder go: taken again (`SESSION_BUSY` if another copy of the game
            // took the session meanwhile). One still held stays as it is.
            let holding = this.sessions.host.hold(&this.core.id, false).await?;
            if holding.taken() {
                // Another copy may have run it since (its agent session replaced, its runs counted): taken up
                // again from its record, so its message ids stay unique and its agent session is the latest.
                let record = this.sessions.host.records.load(this.core.id.as_str()).await?;
                this.core.set_backend_session(record.backend_session.clone());
                this.core.take_up(&Record { ended: true, ..record }).await;
            }
            let attached = this.core.resume(ends).await?;
            holding.keep();
            this.sessions.live.lock().insert(this.core.id.clone(), this.core.clone());
            Ok(attached)
        };
        // Stopped by the game's exit, as a create is: it holds the session, which the exit ends.
        let sessions = self.sessions.clone();
        self.sessions.on_tokio(async move { sessions.until_exit(work).await }).await
    }

    /// The session's current MCP credential (revoked when it ends). For tests and diagnostics: never show it.
    #[doc(hidden)]
    pub fn credential(&self) -> Option<String> {
        self.core.credential()
    }

    /// The backend's own id of the session.
    pub fn backend_session(&self) -> Option<String> {
        self.core.backend_session()
    }
}

impl std::fmt::Debug for AgentSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSession").field("id", self.id()).field("status", &self.status()).finish()
    }
}

/// A turn that was sent: resolves with its outcome (see [`AgentSession::send_text`]). Dropping it does not cancel
/// the turn.
#[must_use = "the turn's outcome is lost unless awaited"]
pub struct PendingTurn {
    outcome: oneshot::Receiver<Result<TurnEnd, ToolError>>,
}

impl std::fmt::Debug for PendingTurn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingTurn").finish_non_exhaustive()
    }
}

impl Future for PendingTurn {
    type Output = Result<TurnEnd, ToolError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.outcome).poll(cx).map(|outcome| {
            outcome.unwrap_or_else(|_| Err(ToolError::with_code(ErrorCode::SessionEnded, "the session was dropped")))
        })
    }
}

fn random_hex() -> Result<String, ToolError> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes)
        .map_err(|error| ToolError::internal(format!("no randomness for a session id: {error}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use std::task::{Context, Poll, Waker};

    use super::*;

    /// Polls `future` once, without waiting.
    fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
        Pin::new(future).poll(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn an_ids_lock_is_shared_while_held_or_awaited_and_dropped_with_the_last_holder() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        runtime.block_on(async {
            let locks = IdLocks::default();
            let id = ConversationId::new("chat-1");
            let first = locks.lock(&id).await;
            let mut second = Box::pin(locks.lock(&id));
            assert!(poll_once(&mut second).is_pending(), "the second waits for the first");
            assert_eq!(locks.0.lock().len(), 1, "one lock for the id");
            drop(first);
            let second = second.await;
            assert_eq!(locks.0.lock().len(), 1, "kept while the second holds it");
            drop(second);
            assert_eq!(locks.0.lock().len(), 0, "dropped with its last holder");

            // A waiter that gives up leaves nothing behind either.
            let first = locks.lock(&id).await;
            let mut waiting = Box::pin(locks.lock(&id));
            assert!(poll_once(&mut waiting).is_pending());
            drop(waiting);
            drop(first);
            assert_eq!(locks.0.lock().len(), 0);
        });
    }
}
