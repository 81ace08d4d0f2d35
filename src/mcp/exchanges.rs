//! The POST exchanges in progress, so that the game's exit can let every call that ended answer its client before
//! the server goes away (DESIGN §5: every admitted call reaches its client with its outcome).
//!
//! A layer registers each POST and keeps it until its response body has been sent to the end (or dropped, when the
//! client went away). A `tools/call` tells its exchange how to ask whether its call still runs. On `AppExit`, after
//! the host ended every call of the visit ([`AgentToolsExitSystems::Host`](crate::AgentToolsExitSystems::Host)), the
//! transport waits, bounded, until every exchange left is one whose call is still running (a call waiting for a tool
//! that was never registered, say), or whose client stopped reading (it was handed data and has taken in none of it for
//! the stall timeout: a hung client must not hold the exit up to its deadline); only then does it cancel the server.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use http_body::{Frame, SizeHint};
use parking_lot::{Condvar, Mutex};

/// Says whether an exchange's call is still running (it has no outcome yet).
pub(crate) type RunningProbe = Arc<dyn Fn() -> bool + Send + Sync>;

/// One POST, from its arrival to the end of its response body.
#[derive(Default)]
pub(crate) struct Exchange {
    call: Mutex<Option<RunningProbe>>,
    /// When the body last handed the connection data that the connection has not asked past yet (cleared when
    /// the body is polled again and has nothing more for now).
    handed: Mutex<Option<Instant>>,
}

impl Exchange {
    /// Records the call this exchange answers.
    pub(crate) fn answers(&self, running: RunningProbe) {
        *self.call.lock() = Some(running);
    }

    /// Whether the exchange waits for a call that has not ended: its response may be a long way off.
    fn waits_for_running_call(&self) -> bool {
        self.call.lock().as_ref().is_some_and(|running| running())
    }

    /// Whether its client stopped reading: the connection was handed data at least `stall` ago and has not come
    /// back for more (a connection whose client reads asks again as soon as it has written what it got).
    fn stalled(&self, now: Instant, stall: Duration) -> bool {
        self.handed.lock().is_some_and(|handed| now.saturating_duration_since(handed) >= stall)
    }

    /// Whether the exit still owes it a response it can send.
    fn owed(&self, now: Instant, stall: Duration) -> bool {
        !self.waits_for_running_call() && !self.stalled(now, stall)
    }
}

/// Every POST exchange in progress.
#[derive(Default)]
pub(crate) struct Exchanges {
    open: Mutex<Open>,
    closed: Condvar,
}

#[derive(Default)]
struct Open {
    next: u64,
    exchanges: HashMap<u64, Arc<Exchange>>,
}

impl Exchanges {
    fn open(self: &Arc<Self>) -> (Arc<Exchange>, Closer) {
        let exchange = Arc::new(Exchange::default());
        let mut open = self.open.lock();
        open.next += 1;
        let id = open.next;
        open.exchanges.insert(id, exchange.clone());
        (exchange, Closer { exchanges: self.clone(), id })
    }

    /// Waits until every exchange in progress is one whose call still runs (so every ended call's response has
    /// been sent) or whose client stopped reading for `stall`, or until `deadline`. Returns how many exchanges
    /// were still owed a response then.
    pub(crate) fn wait_for_ended_calls(&self, deadline: Instant, stall: Duration) -> usize {
        let mut open = self.open.lock();
        loop {
            let now = Instant::now();
            let owed = open.exchanges.values().filter(|exchange| exchange.owed(now, stall)).count();
            if owed == 0 || now >= deadline {
                return owed;
            }
            // Woken when an exchange closes; and now and then, to see the ones that stalled meanwhile.
            let _ = self.closed.wait_until(&mut open, deadline.min(now + STALL_CHECK));
        }
    }
}

/// Removes its exchange when the response body is done with (sent to the end, or dropped).
struct Closer {
    exchanges: Arc<Exchanges>,
    id: u64,
}

impl Drop for Closer {
    fn drop(&mut self) {
        self.exchanges.open.lock().exchanges.remove(&self.id);
        self.exchanges.closed.notify_all();
    }
}

/// The layer: every POST is an exchange until its response body ends; handlers find it in the request's
/// extensions.
pub(crate) async fn track_exchanges(
    State(exchanges): State<Arc<Exchanges>>,
    mut request: Request,
    next: Next,
) -> Response {
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let (exchange, closer) = exchanges.open();
    request.extensions_mut().insert(exchange.clone());
    next.run(request).await.map(|body| Body::new(Tracked { body, exchange, closer: Some(closer) }))
}

/// How often the exit's wait looks again for exchanges that stalled.
const STALL_CHECK: Duration = Duration::from_millis(250);

/// A response body that closes its exchange when it ends, and notes when it hands its connection data.
struct Tracked {
    body: Body,
    exchange: Arc<Exchange>,
    closer: Option<Closer>,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => {
                self.closer.take();
            }
            Poll::Ready(Some(_)) => *self.exchange.handed.lock() = Some(Instant::now()),
            Poll::Pending => *self.exchange.handed.lock() = None,
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A response body's stream: one chunk of data, then nothing more for now.
    struct OneThenPending(bool);

    impl futures_core::Stream for OneThenPending {
        type Item = Result<Bytes, std::io::Error>;

        fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            if std::mem::replace(&mut self.0, true) {
                Poll::Pending
            } else {
                Poll::Ready(Some(Ok(Bytes::from_static(b"data: {}\n\n"))))
            }
        }
    }

    fn poll(body: &mut Tracked) -> bool {
        let polled = http_body::Body::poll_frame(Pin::new(body), &mut Context::from_waker(std::task::Waker::noop()));
        matches!(polled, Poll::Ready(Some(_)))
    }

    #[test]
    fn an_exchange_whose_client_stopped_reading_is_not_waited_for_past_the_stall_and_a_reading_one_is() {
        let exchanges = Arc::new(Exchanges::default());
        let (exchange, closer) = exchanges.open();
        let body = Body::from_stream(OneThenPending(false));
        let mut body = Tracked { body, exchange, closer: Some(closer) };
        let stall = Duration::from_millis(50);
        // Handed a chunk, and not asked again: its client is not reading.
        assert!(poll(&mut body));
        let started = Instant::now();
        assert_eq!(exchanges.wait_for_ended_calls(started + Duration::from_secs(30), stall), 0);
        assert!(started.elapsed() < Duration::from_secs(10), "let go after the stall, not at the deadline");

        // Asked again (the client took the chunk in): owed, waited for until the deadline.
        assert!(!poll(&mut body));
        let owed = exchanges.wait_for_ended_calls(Instant::now() + Duration::from_millis(300), stall);
        assert_eq!(owed, 1, "a connection that reads is owed its response");
    }
}
