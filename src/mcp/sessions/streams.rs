//! Sessions' response streams: every request's stream drained into a log, resumed from it by `Last-Event-ID`,
//! and the `GET` stream a listening client keeps open.

use super::*;

impl ConversationSessions {
    /// Session `id`'s `GET` stream from rmcp, handed on to its client ([`handed_on`]), counted as its client
    /// listening until it is let go: the client went away, or stopped reading it. `standalone`: the session's
    /// standalone stream, not a request's that rmcp resumes.
    pub(super) fn listening(&self, id: &SessionId, stream: BoxedSseStream, standalone: bool) -> BoxedSseStream {
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
    pub(super) fn logged(&self, id: &SessionId, mut inner: BoxedSseStream, mut key: Option<IdKey>) -> BoxedSseStream {
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
    pub(super) fn drain_limit(&self) -> Duration {
        let default = self.agent.host().config.default_timeout;
        let longest =
            self.agent.tools().iter().map(|tool| tool.timeout.unwrap_or(default)).fold(default, Duration::max);
        DRAIN_LIMIT.max(longest.saturating_add(DRAIN_MARGIN))
    }

    /// Waits until session `id` has no request whose response stream still runs, or [`drain_limit`](Self::drain_limit) passed. Each
    /// ends with its call, which ends by its deadline (H13), whether or not its client still reads it (its log
    /// drains it: [`StreamLog`]); the limit is for a stream rmcp would never end (two requests with one id, which
    /// [`request_ids`] refuses).
    pub(super) async fn drained(&self, id: &SessionId) {
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
    pub(super) fn log_of(&self, id: &SessionId, request: u64) -> Option<Arc<StreamLog>> {
        self.logs.lock().get(id)?.streams.get(&request).cloned()
    }

    /// Whether resuming request stream `last_event_id` of open session `id` would send nothing, ever: the
    /// stream finished and the client saw its last event, or it is no longer kept.
    pub(super) fn nothing_to_resume(&self, id: &SessionId, last_event_id: &str) -> bool {
        let Some((index, request)) = parse_event_id(last_event_id) else { return false };
        if !self.open.lock().contains_key(id) {
            return false;
        }
        match self.log_of(id, request) {
            Some(log) => log.spent_after(index),
            None => true,
        }
    }
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

/// Frees `key` in session `id`'s running ids (once: `key` was taken out of its holder).
fn release(open: &Mutex<HashMap<SessionId, Tracked>>, id: &SessionId, key: Option<IdKey>) {
    if let (Some(key), Some(tracked)) = (key, open.lock().get_mut(id)) {
        tracked.ids.release(&key);
    }
}
