//! The POST exchanges in progress, so that the game's exit can let every call that ended answer its client before
//! the server goes away (DESIGN §5: every admitted call reaches its client with its outcome).
//!
//! A layer registers each POST and keeps it until its response body has been sent to the end (or dropped, when the
//! client went away). A `tools/call` tells its exchange how to ask whether its call still runs. On `AppExit`, after
//! the host ended every call of the visit ([`ExitSet::Host`](crate::ExitSet::Host)), the transport waits, bounded,
//! until every exchange left is one whose call is still running (a call waiting for a tool that was never
//! registered, say); only then does it cancel the server.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

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
    /// been sent), or until `deadline`. Returns how many exchanges were still owed a response then.
    pub(crate) fn wait_for_ended_calls(&self, deadline: Instant) -> usize {
        let mut open = self.open.lock();
        loop {
            let owed = open.exchanges.values().filter(|exchange| !exchange.waits_for_running_call()).count();
            if owed == 0 || self.closed.wait_until(&mut open, deadline).timed_out() {
                return open.exchanges.values().filter(|exchange| !exchange.waits_for_running_call()).count();
            }
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
    request.extensions_mut().insert(exchange);
    next.run(request).await.map(|body| Body::new(Tracked { body, closer: Some(closer) }))
}

/// A response body that closes its exchange when it ends.
struct Tracked {
    body: Body,
    closer: Option<Closer>,
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.closer.take();
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
