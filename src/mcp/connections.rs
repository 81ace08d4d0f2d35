//! The server's connections: accepted up to a cap, each served by hyper with a bound on how long a request's head
//! may take to arrive, so a client that connects and sends nothing (or half a request line) holds nothing for long,
//! and no number of such clients uses up the descriptors the game needs for its own files.
//!
//! At the cap, the longest-open connection that has not presented a token (none of its requests got past the
//! token check) gives way to the new one: connections without the token (another user of the machine, a web page)
//! cannot hold every place against the game's agents, who present it with their first request, while a newcomer
//! waits behind every older connection without it. With none to
//! give way, a connection over the cap is answered `503 Service Unavailable` with `Retry-After: 1` and closed,
//! without serving its request. The head's bound also closes a kept-alive connection that sends no next request for that
//! long (clients open another); a request whose response takes long (a call, a `GET` stream) is not bounded by it.
//! The body's bound is [`read_body`]'s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::Response;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::security::refusal;

/// How the server's connections are bounded.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnectionLimits {
    /// Connections open at once; more are answered 503.
    pub max_connections: usize,
    /// How long a request's head (and its body, [`read_body`]) may take to arrive, and a kept-alive connection
    /// may wait for its next request.
    pub request_read_timeout: Duration,
}

/// How long a new connection at the cap waits for the place of one that gives way.
const GIVE_WAY_WAIT: Duration = Duration::from_secs(1);

/// One open connection, as the cap sees it: in every request's extensions, for the token check to mark.
pub(crate) struct Connection {
    /// When it was accepted.
    opened: Instant,
    /// One of its requests got past the token check.
    presented_token: AtomicBool,
    /// Closes it, to make room for a new one; cancelled too once it has closed.
    give_way: CancellationToken,
}

impl Connection {
    /// Notes that one of its requests presented a valid token.
    pub(crate) fn presented_token(&self) {
        self.presented_token.store(true, Ordering::Relaxed);
    }
}

/// The open connections, for the cap to pick one that gives way.
#[derive(Default)]
struct Open(parking_lot::Mutex<OpenList>);

#[derive(Default)]
struct OpenList {
    connections: Vec<Weak<Connection>>,
    /// The length at which closed ones are next let go (twice what was left last time: a scan per accepted
    /// connection would cost as much as the connections open).
    prune_at: usize,
}

impl OpenList {
    fn prune(&mut self) {
        self.connections.retain(|open| open.upgrade().is_some_and(|open| !open.give_way.is_cancelled()));
        self.prune_at = (self.connections.len() * 2).max(64);
    }
}

impl Open {
    /// A connection accepted at `opened`, listed.
    fn add(&self, opened: Instant) -> Arc<Connection> {
        let connection = Arc::new(Connection {
            opened,
            presented_token: AtomicBool::new(false),
            give_way: CancellationToken::new(),
        });
        let mut open = self.0.lock();
        if open.connections.len() >= open.prune_at {
            open.prune();
        }
        open.connections.push(Arc::downgrade(&connection));
        connection
    }

    /// Closes the longest-open connection that presented no token; whether there was one.
    fn make_room(&self) -> bool {
        let mut open = self.0.lock();
        open.prune();
        let anonymous = open
            .connections
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|connection| !connection.presented_token.load(Ordering::Relaxed))
            .min_by_key(|connection| connection.opened);
        anonymous.map(|connection| connection.give_way.cancel()).is_some()
    }
}

/// How long answering a connection over the cap may take (a client that does not read is not waited for).
const REFUSAL_WRITE_LIMIT: Duration = Duration::from_secs(1);
/// How much of the refused connection's request is read (and thrown away) after the answer, so that closing it
/// does not reset the connection before its client has read the answer.
const REFUSAL_DRAIN: u64 = 64 * 1024;
/// The most connections a limit may ask for: "no limit" in practice, and what the permits can count
/// ([`Semaphore::MAX_PERMITS`], and `u32` for waiting on all of them).
const MAX_CONNECTIONS: usize =
    if Semaphore::MAX_PERMITS < u32::MAX as usize { Semaphore::MAX_PERMITS } else { u32::MAX as usize };

/// How often a full server says so at most.
const FULL_WARNED_EVERY: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `stop`, then lets each connection finish the requests it has in flight and
/// returns once every connection has closed.
pub(crate) async fn serve(listener: TcpListener, router: Router, limits: ConnectionLimits, stop: CancellationToken) {
    let max = limits.max_connections.clamp(1, MAX_CONNECTIONS);
    let permits = Arc::new(Semaphore::new(max));
    let open = Arc::new(Open::default());
    // When the cap was last warned of, and how many connections were refused since (a client retrying after its
    // 503 fills each freed place again: one warning per place would be one per retry).
    let (mut warned, mut refused) = (None::<Instant>, 0_u64);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(error) => {
                    accept_failed(error).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        // Without TCP_NODELAY a response written in two pieces waits for the client's delayed ACK (~40 ms).
        let _ = tcp.set_nodelay(true);
        let (router, stop, open) = (router.clone(), stop.clone(), open.clone());
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                // Listed now, in the order accepted, before the next accept can look for one to give way.
                let connection = open.add(Instant::now());
                tokio::spawn(serve_connection(tcp, connection, permit, router, limits, stop));
            }
            Err(_) if open.make_room() => {
                // The place is free once the connection giving way has closed, on its own task.
                let (permits, opened) = (permits.clone(), Instant::now());
                tokio::spawn(async move {
                    match tokio::time::timeout(GIVE_WAY_WAIT, permits.acquire_owned()).await {
                        Ok(Ok(permit)) => serve_connection(tcp, open.add(opened), permit, router, limits, stop).await,
                        _ => refuse(tcp, max).await,
                    }
                });
            }
            Err(_) => {
                refused += 1;
                let now = Instant::now();
                if warned.is_none_or(|at| now.saturating_duration_since(at) >= FULL_WARNED_EVERY) {
                    tracing::warn!(
                        max,
                        refused,
                        "the MCP server has its limit of connections open: new ones are answered 503 (at most one of \
                         these lines every 10 s, with the number refused since the last)"
                    );
                    (warned, refused) = (Some(now), 0);
                }
                tokio::spawn(refuse(tcp, max));
            }
        }
    }
    drop(listener);
    // Every connection holds a permit until it has closed.
    let _all = permits.acquire_many(max as u32).await;
}

/// Serves one connection, holding its place (`permit`) until it closes: when it ends, when the server stops (its
/// requests in flight finish first), or when it gives way to a new one.
async fn serve_connection(
    tcp: TcpStream,
    connection: Arc<Connection>,
    permit: tokio::sync::OwnedSemaphorePermit,
    router: Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
) {
    let _permit = permit;
    // Closed, it is no longer one that could give way (a request's copy of it may outlive the connection).
    let _closed = connection.give_way.clone().drop_guard();
    let service = TowerToHyperService::new(router.layer(axum::Extension(connection.clone())));
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.request_read_timeout);
    let served = builder.serve_connection(TokioIo::new(tcp), service);
    tokio::pin!(served);
    tokio::select! {
        _ = served.as_mut() => return,
        _ = connection.give_way.cancelled() => {
            tracing::debug!("an MCP connection that presented no token gave way to a new one at the limit");
            return;
        }
        _ = stop.cancelled() => {}
    }
    // Requests in flight finish; an idle connection closes now.
    served.as_mut().graceful_shutdown();
    let _ = served.await;
}

/// Answers a connection over the cap with 503, without reading its request, and closes it.
async fn refuse(mut tcp: TcpStream, max: usize) {
    let body = serde_json::json!({
        "error": "too_many_connections",
        "message": format!(
            "the MCP server has its limit of {max} connections open; try again in a moment \
             (McpPlugin::max_connections raises the limit)"
        ),
    })
    .to_string();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: \
         close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_WRITE_LIMIT, async {
        tcp.write_all(response.as_bytes()).await?;
        tcp.shutdown().await?;
        tokio::io::copy(&mut (&mut tcp).take(REFUSAL_DRAIN), &mut tokio::io::sink()).await
    })
    .await;
}

/// An accept that failed: one connection's trouble is skipped at once; the listener's own (out of descriptors) is
/// waited out for a moment, as hyper's servers do, instead of spinning.
async fn accept_failed(error: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(error.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset) {
        return;
    }
    tracing::warn!(%error, "the MCP server could not accept a connection; trying again in a second");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Reads a request's whole body: at most `max_bytes` (413 beyond), within `limit` (408 past it: a client that
/// announced a body and stopped sending it holds its connection no longer).
pub(crate) async fn read_body(body: Body, max_bytes: usize, limit: Duration) -> Result<Bytes, Response> {
    match tokio::time::timeout(limit, axum::body::to_bytes(body, max_bytes)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => {
            Err(refusal(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "the request body is over the limit"))
        }
        Err(_) => Err(refusal(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            &format!("the request body did not arrive within {limit:?}"),
        )),
    }
}
