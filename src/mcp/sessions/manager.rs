//! rmcp's `SessionManager`, as conversations: the local manager with our tracking, logs and closes around it.

use super::*;

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
