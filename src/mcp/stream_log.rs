//! What a 2025-11-25 session's response streams keep and hand on: a request stream's [`StreamLog`] (its latest
//! events, for a client that resumes) and the connection it feeds; the standalone stream's hand-off to its
//! connection.
//!
//! No connection holds up its session for long. rmcp's session worker routes every message of a session in turn
//! and waits while the stream a message is for is full, so a client that stops reading one response without
//! closing it (a hung process, a half-open connection) would, once its socket's buffers filled, stop every other
//! request of its session from being answered for good, the call's own result included. A client that reads
//! slowly is waited for, as before; one that takes in nothing for [`STALL_TIMEOUT`] while events wait for it
//! has its connection ended (after what it was given), and the stream goes on without it: a request stream into
//! its log, where the client resumes with `Last-Event-ID` and gets the result; the standalone stream back to rmcp,
//! which keeps its latest events for the client's next `GET`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use parking_lot::Mutex;
use rmcp::transport::streamable_http_server::session::ServerSseMessage;
use tokio::sync::mpsc;

/// A request stream keeps at most its last this many events.
pub(crate) const EVENTS_KEPT: usize = 64;
/// Events queued towards a connection beyond what its socket holds; while they are this many, the next waits.
pub(crate) const LIVE_CAPACITY: usize = 64;
/// A connection whose client takes in nothing for this long, while events wait for it, is ended.
pub(crate) const STALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A response stream as rmcp's server serves it.
pub(crate) type BoxedSseStream = Pin<Box<dyn Stream<Item = ServerSseMessage> + Send + Sync + 'static>>;

/// The events of one request stream, and the client connection currently fed from it.
pub(crate) struct StreamLog {
    state: Mutex<LogState>,
    /// [`STALL_TIMEOUT`], shorter in tests.
    stall_timeout: Duration,
}

#[derive(Default)]
struct LogState {
    /// The last [`EVENTS_KEPT`] events, oldest first.
    events: VecDeque<ServerSseMessage>,
    /// The connection that gets new events as they come (the original response, or the latest resume).
    live: Option<mpsc::Sender<ServerSseMessage>>,
    finished: bool,
}

impl StreamLog {
    /// A log feeding a new connection, and that connection's stream.
    pub(crate) fn connected(stall_timeout: Duration) -> (Self, BoxedSseStream) {
        let (tx, rx) = mpsc::channel(LIVE_CAPACITY);
        let state = LogState { live: Some(tx), ..LogState::default() };
        (Self { state: Mutex::new(state), stall_timeout }, Box::pin(Replay { missed: VecDeque::new(), live: Some(rx) }))
    }

    /// Keeps `event` and hands it to the connection, waiting for a client that reads slowly; a connection that is
    /// gone, or whose client takes in nothing for the stall timeout, is let go (its client can resume).
    pub(crate) async fn feed(&self, event: ServerSseMessage) {
        let live = {
            let mut state = self.state.lock();
            if state.events.len() >= EVENTS_KEPT {
                state.events.pop_front();
            }
            state.events.push_back(event.clone());
            state.live.clone()
        };
        let Some(live) = live else { return };
        match tokio::time::timeout(self.stall_timeout, live.send(event)).await {
            Ok(Ok(())) => {}
            failed => {
                if failed.is_err() {
                    tracing::debug!(
                        "an MCP client stopped reading a response stream: its connection gets no more events"
                    );
                }
                // Unless a resume has replaced it meanwhile.
                let mut state = self.state.lock();
                if state.live.as_ref().is_some_and(|current| current.same_channel(&live)) {
                    state.live = None;
                }
            }
        }
    }

    /// The stream has no more events: its connection ends once it has sent them.
    pub(crate) fn finish(&self) {
        let mut state = self.state.lock();
        state.finished = true;
        state.live = None;
    }

    /// The events after `index`, then (if the stream still runs) the live ones: this connection replaces the
    /// previous one. Taken under one lock, so no event is missed or sent twice.
    pub(crate) fn resume(&self, index: usize) -> BoxedSseStream {
        let mut state = self.state.lock();
        let missed: VecDeque<ServerSseMessage> =
            state.events.iter().filter(|event| event_index(event).is_none_or(|i| i > index)).cloned().collect();
        let live = if state.finished {
            None
        } else {
            let (tx, rx) = mpsc::channel(LIVE_CAPACITY);
            state.live = Some(tx);
            Some(rx)
        };
        Box::pin(Replay { missed, live })
    }

    /// Whether resuming after event `index` would send nothing, ever: the stream finished and that was its last
    /// event kept.
    pub(crate) fn spent_after(&self, index: usize) -> bool {
        let state = self.state.lock();
        state.finished && state.events.iter().all(|event| event_index(event).is_some_and(|i| i <= index))
    }
}

/// Hands rmcp's standalone stream on to its connection: once the connection is gone, or its client takes in
/// nothing for `stall_timeout` while events wait for it, rmcp's stream is let go, so rmcp drops what that client
/// would have been sent next instead of waiting for it, and makes the client's next `GET` the session's standalone
/// stream again, replaying what it kept. `held` is kept until then: dropped when rmcp's stream ends or is let go,
/// just before rmcp's stream is dropped.
///
/// `standalone`: the stream is the session's standalone one, which carries none of a request's messages
/// ([`belongs_on_standalone`]); otherwise it is a request's stream rmcp resumes, handed on whole.
pub(crate) fn handed_on(
    inner: BoxedSseStream,
    stall_timeout: Duration,
    held: impl Send + 'static,
    standalone: bool,
) -> BoxedSseStream {
    let (tx, rx) = mpsc::channel(LIVE_CAPACITY);
    tokio::spawn(async move {
        let mut inner = inner;
        hand_on(&mut inner, &tx, stall_timeout, standalone).await;
        drop(held);
        drop(inner);
    });
    Box::pin(Replay { missed: VecDeque::new(), live: Some(rx) })
}

/// Sends `inner`'s events on `tx` until it ends, `tx`'s receiver is gone, or takes nothing for `stall_timeout`.
async fn hand_on(
    inner: &mut BoxedSseStream,
    tx: &mpsc::Sender<ServerSseMessage>,
    stall_timeout: Duration,
    standalone: bool,
) {
    loop {
        let event = tokio::select! {
            event = std::future::poll_fn(|cx| inner.as_mut().poll_next(cx)) => event,
            // Let go the moment the client disconnects, not at the next event: until rmcp's stream is
            // dropped, rmcp takes the session's standalone stream for alive and makes a new `GET` an idle one.
            () = tx.closed() => return,
        };
        let Some(event) = event else { return };
        if standalone && !belongs_on_standalone(&event) {
            continue;
        }
        match tokio::time::timeout(stall_timeout, tx.send(event)).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return,
            Err(_) => {
                tracing::debug!(
                    "an MCP client stopped reading its standalone stream: its connection gets no more events"
                );
                return;
            }
        }
    }
}

/// Whether `event` may go on a session's standalone stream. rmcp sends a request's messages there once the
/// request's own stream is gone, which it is the moment the client cancels the request: its later progress reports
/// and its response, which MCP allows only on the request's stream (a client has forgotten the token and the id:
/// the TypeScript SDK reports each as an error). Every request's stream is kept open until its response (its log
/// drains it), so nothing else of a request's reaches the standalone stream: those are dropped.
fn belongs_on_standalone(event: &ServerSseMessage) -> bool {
    use rmcp::model::{JsonRpcMessage, ServerNotification};
    match event.message.as_deref() {
        Some(JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_)) => false,
        Some(JsonRpcMessage::Notification(notification)) => {
            !matches!(notification.notification, ServerNotification::ProgressNotification(_))
        }
        _ => true,
    }
}

/// The index of an rmcp request-stream event id (`<index>/<http request id>`).
fn event_index(event: &ServerSseMessage) -> Option<usize> {
    event.event_id.as_deref()?.split_once('/')?.0.parse().ok()
}

/// Parses a `Last-Event-ID` of a request stream into (index, HTTP request id).
pub(crate) fn parse_event_id(id: &str) -> Option<(usize, u64)> {
    let (index, request) = id.split_once('/')?;
    Some((index.parse().ok()?, request.parse().ok()?))
}

/// What a connection sends: the events its client missed, then the live ones.
struct Replay {
    missed: VecDeque<ServerSseMessage>,
    live: Option<mpsc::Receiver<ServerSseMessage>>,
}

impl Stream for Replay {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<ServerSseMessage>> {
        if let Some(event) = self.missed.pop_front() {
            return Poll::Ready(Some(event));
        }
        match self.live.as_mut() {
            Some(live) => live.poll_recv(cx),
            None => Poll::Ready(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rmcp::model::ServerJsonRpcMessage;

    use super::*;

    fn event(index: usize) -> ServerSseMessage {
        let mut event = ServerSseMessage::from_message(ServerJsonRpcMessage::notification(
            rmcp::model::ServerNotification::ToolListChangedNotification(Default::default()),
        ));
        event.event_id = Some(format!("{index}/0"));
        event
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
    }

    /// Everything `stream` yields until it ends.
    async fn drained(mut stream: BoxedSseStream) -> Vec<ServerSseMessage> {
        let mut events = Vec::new();
        while let Some(event) = std::future::poll_fn(|cx| stream.as_mut().poll_next(cx)).await {
            events.push(event);
        }
        events
    }

    /// A stall timeout for tests: the rule's own wait, short.
    const STALL: Duration = Duration::from_millis(20);

    #[test]
    fn a_log_whose_client_stopped_reading_keeps_logging_and_ends_that_connection() {
        runtime().block_on(async {
            let (log, connection) = StreamLog::connected(STALL);
            // The client reads nothing while the stream runs on: the log waits for it once, then goes on.
            for index in 0..1_000 {
                log.feed(event(index)).await;
            }
            log.finish();
            // The connection ends after what it was given, not with the stream.
            let sent = drained(connection).await;
            assert_eq!(sent.len(), LIVE_CAPACITY, "a connection's backlog is bounded");
            assert_eq!(event_index(&sent[LIVE_CAPACITY - 1]), Some(LIVE_CAPACITY - 1));
            // A client that resumes gets the latest events, the stream's last one included.
            let resumed = drained(log.resume(LIVE_CAPACITY - 1)).await;
            assert_eq!(resumed.len(), EVENTS_KEPT);
            assert_eq!(resumed.last().and_then(event_index), Some(999));
            assert!(log.spent_after(999) && !log.spent_after(998));
        });
    }

    #[test]
    fn a_log_waits_for_a_client_that_reads_slowly_and_feeds_it_every_event_in_order() {
        runtime().block_on(async {
            // The client takes in a batch of events now and then, well within the stall timeout.
            let (log, connection) = StreamLog::connected(Duration::from_secs(2));
            let reader = tokio::spawn(async move {
                let mut connection = connection;
                let mut indices = Vec::new();
                while let Some(event) = std::future::poll_fn(|cx| connection.as_mut().poll_next(cx)).await {
                    indices.extend(event_index(&event));
                    if indices.len() % LIVE_CAPACITY == 0 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                indices
            });
            for index in 0..1_000 {
                log.feed(event(index)).await;
            }
            log.finish();
            assert_eq!(reader.await.expect("the reader"), (0..1_000).collect::<Vec<_>>());
        });
    }

    #[test]
    fn a_standalone_stream_whose_client_stopped_reading_lets_rmcp_go_on() {
        runtime().block_on(async {
            // rmcp's side: a bounded channel, as its session worker sends into (waiting while it is full).
            let (rmcp, inner) = mpsc::channel::<ServerSseMessage>(16);
            let inner: BoxedSseStream = Box::pin(Replay { missed: VecDeque::new(), live: Some(inner) });
            let connection = handed_on(inner, STALL, (), true);
            // Its client reads nothing. rmcp's sends end (delivered or refused) rather than wait for ever.
            let sends = async {
                for index in 0..1_000 {
                    let _ = rmcp.send(event(index)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(10), sends).await.expect("rmcp was never held up for good");
            assert!(rmcp.is_closed(), "rmcp's stream was let go");
            assert!(drained(connection).await.len() <= LIVE_CAPACITY);
        });
    }

    #[test]
    fn a_standalone_stream_carries_no_request_s_progress_or_response_and_a_resumed_request_stream_does() {
        use rmcp::model::{NumberOrString, ProgressNotificationParam, ProgressToken, ServerNotification, ServerResult};
        for standalone in [true, false] {
            runtime().block_on(async {
                let (rmcp, inner) = mpsc::channel::<ServerSseMessage>(16);
                let inner = Box::pin(Replay { missed: VecDeque::new(), live: Some(inner) });
                let connection = handed_on(inner, STALL, (), standalone);
                // What rmcp routes to the standalone stream for a request whose stream the client's cancel closed,
                // and what a request's stream it resumes carries.
                let token = ProgressToken(NumberOrString::String("p7".into()));
                let progress = ServerNotification::ProgressNotification(rmcp::model::Notification::new(
                    ProgressNotificationParam::new(token, 3.0),
                ));
                let response = ServerJsonRpcMessage::response(ServerResult::empty(()), NumberOrString::Number(7));
                let error = ServerJsonRpcMessage::error(
                    rmcp::model::ErrorData::internal_error("x", None),
                    Some(NumberOrString::Number(7)),
                );
                for message in [ServerJsonRpcMessage::notification(progress), response, error] {
                    rmcp.send(ServerSseMessage::from_message(message)).await.expect("sent");
                }
                // And what belongs on either: a change of the tool list.
                rmcp.send(event(0)).await.expect("sent");
                drop(rmcp);
                let sent = drained(connection).await;
                match standalone {
                    true => {
                        assert_eq!(sent.len(), 1, "only the tool list's change: {sent:?}");
                        assert_eq!(event_index(&sent[0]), Some(0));
                    }
                    false => assert_eq!(sent.len(), 4, "a request's stream, whole: {sent:?}"),
                }
            });
        }
    }

    #[test]
    fn a_standalone_stream_lets_rmcp_go_the_moment_its_client_disconnects() {
        runtime().block_on(async {
            let (rmcp, inner) = mpsc::channel::<ServerSseMessage>(16);
            let connection =
                handed_on(Box::pin(Replay { missed: VecDeque::new(), live: Some(inner) }), STALL_TIMEOUT, (), true);
            drop(connection);
            // With no event sent: rmcp sees the stream closed, and makes the client's next GET the live one.
            tokio::time::timeout(Duration::from_secs(10), rmcp.closed()).await.expect("let go at once");
        });
    }
}
