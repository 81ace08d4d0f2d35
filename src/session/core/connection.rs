//! Connecting a session to its agent: taking it up from its record, starting the agent under a new credential,
//! and the sink its backend's events come through.

use super::*;

impl SessionCore {
    /// Takes the session up in this run, from its record (`ended`, `runs`, `instructions_owed` as it says): this
    /// run's number is written to the record before the session can say anything, so that a message id of this run
    /// is never one of an earlier run, even one that stopped without a word (a crash).
    pub(crate) async fn take_up(&self, record: &Record) {
        {
            let mut state = self.state.lock();
            state.run = record.runs.saturating_add(1);
            state.instructions_owed = record.instructions_owed;
        }
        self.save_record(record.ended).await;
    }

    /// Starts the agent and opens (or re-attaches, with `resume`) the backend session, under a new credential
    /// (for an agent that reaches the tools over MCP). On success the session is live; on failure nothing is left
    /// running and the credential is revoked.
    ///
    /// With `ends` (a resume's), an end asked for meanwhile stops it while the agent starts (`SESSION_ENDED`): the
    /// agent is stopped and the credential revoked; once the session went live, it goes on, and the end ends it.
    pub(crate) async fn connect(
        self: &Arc<Self>,
        resume: Option<String>,
        new_if_unresumable: bool,
        mut ends: Option<tokio::sync::watch::Receiver<u64>>,
    ) -> Result<Attached, ToolError> {
        // Whatever happens next, the previous connection's stop is waited for (its history written, its process
        // gone) before this one starts, or the end that stops this one ends.
        self.settle_stopped().await;
        let starting = async {
            let (session_dir, working_directory) = self.host.session_dirs(&self.id).await?;
            // Only an agent process gets a credential: a backend the game runs calls the tools in process.
            let mcp = if self.config.backend.reaches_tools_over_mcp() {
                self.host.endpoint(&self.id, self.config.timeouts.start).await?
            } else {
                Err("the game calls this backend's tools in process".to_string())
            };
            // Revoked unless the session takes it: on a failure, and if this future is dropped midway.
            let minted = Minted { host: &self.host, credential: mcp.as_ref().ok().map(|e| e.credential.clone()) };
            let generation = {
                let mut state = self.state.lock();
                state.generation += 1;
                state.exited_while_connecting = None;
                state.generation
            };
            let setup = super::super::backend::Setup {
                mcp,
                working_directory,
                system_prompt: self.config.system_prompt.clone(),
                resume,
                new_if_unresumable,
                timeouts: self.config.timeouts.clone(),
                close_within: self.close_within(),
                agent: self.host.agent.clone(),
                conversation: self.id.clone(),
                session_dir,
            };
            let sink = self.sink(generation);
            let connected = self.host.backend(&self.config).connect(setup, sink).await?;
            Ok::<_, ToolError>((minted, generation, connected))
        };
        let ended = async {
            match ends.as_mut() {
                // (The sender lives as long as this session: an error never comes.)
                Some(ends) => drop(ends.changed().await),
                None => std::future::pending().await,
            }
        };
        let (mut minted, generation, (link, attached, system_prompt_sent)) = tokio::select! {
            biased;
            () = ended => return Err(self.ended_while_resumed()),
            started = starting => started?,
        };
        let (refused, exited) = {
            let mut state = self.state.lock();
            let exited = state.exited_while_connecting.take();
            let refused = if state.generation != generation {
                // Ended (or replaced) while it connected: this connection is nobody's.
                Some(self.ended_error())
            } else if let Err(error) = self.reopen(&state.phase) {
                // Not left running without a conversation to speak in.
                state.phase = Phase::Failed(error.clone());
                Some(error)
            } else {
                state.link = Some(link.clone());
                state.backend_session = Some(link.backend_session().to_string());
                if let Some(old) = std::mem::replace(&mut state.credential, minted.credential.take()) {
                    self.host.revoke(&old);
                }
                // An agent that took them as its system prompt has them; a new agent session gets them with its
                // first turn; a re-attached one, if they never reached it.
                if system_prompt_sent {
                    state.instructions_owed = false;
                } else if matches!(attached, Attached::New | Attached::Replaced) {
                    state.instructions_owed = self.config.system_prompt.is_some();
                }
                state.phase = Phase::Live;
                None
            };
            (refused, exited)
        };
        if let Some(error) = refused {
            link.kill();
            return Err(error);
        }
        self.save_record(false).await;
        if let Some(error) = exited {
            self.fail(error);
        }
        Ok(attached)
    }

    /// The status change of a session going live from `phase`, published under the state lock: a failed one
    /// goes `Idle`, an ended one's conversation is reopened (`Ended → Idle`), a new one is `Idle` already.
    pub(super) fn reopen(&self, phase: &Phase) -> Result<(), ToolError> {
        self.host.agent.host().conversations.suspend(&self.id, None);
        match phase {
            Phase::Live => Ok(()),
            Phase::Failed(_) => {
                self.host.set_status(&self.id, ConversationStatus::Idle);
                Ok(())
            }
            Phase::Ended => self.host.agent.host().conversations.reactivate(&self.id),
        }
    }

    /// Stops what [`connect`](Self::connect) started for a session nobody will hold (its `create` or
    /// `resume_session` failed, or its caller dropped it midway): the agent is killed and the credential
    /// revoked, its permission requests withdrawn. Publishes nothing else: the conversation is forgotten by the
    /// caller. Returns whether the agent had been connected.
    pub(crate) fn abandon(&self) -> bool {
        let link = {
            let mut state = self.state.lock();
            state.phase = Phase::Ended;
            self.host.permissions.withdraw_all(&self.id, PermissionDecision::Deny);
            self.take_connection(&mut state)
        };
        let connected = link.is_some();
        if let Some(link) = link {
            link.kill();
        }
        connected
    }

    /// Waits until the connection a failure stopped has written what it keeps (bounded by the backend).
    pub(super) async fn settle_stopped(&self) {
        let stopped = self.state.lock().stopped.take();
        if let Some(link) = stopped {
            link.settled().await;
        }
    }

    /// Takes the connection away, under the state lock: a new generation (a late report of the old connection
    /// changes nothing), its credential revoked; the link is returned for the caller to stop or close.
    pub(super) fn take_connection(&self, state: &mut State) -> Option<Arc<dyn Link>> {
        state.generation += 1;
        if let Some(credential) = state.credential.take() {
            self.host.revoke(&credential);
        }
        state.link.take()
    }

    pub(super) fn sink(self: &Arc<Self>, generation: u64) -> EventSink {
        let core: Weak<Self> = Arc::downgrade(self);
        Arc::new(move |event| {
            if let Some(core) = core.upgrade() {
                core.on_event(generation, event);
            }
        })
    }
}

/// A credential minted for a connection being made: revoked when dropped unless the session took it.
struct Minted<'a> {
    host: &'a SessionHost,
    credential: Option<String>,
}

impl Drop for Minted<'_> {
    fn drop(&mut self) {
        if let Some(credential) = &self.credential {
            self.host.revoke(credential);
        }
    }
}
