//! A sessionless request whose answer is a while coming is answered as a stream at once, kept alive until the
//! answer.
//!
//! rmcp answers an MCP 2026-07-28 request only once its handler has produced a first message (it needs that
//! message to pick the HTTP status, and with JSON answers on, the content type): a `tools/call` that runs for
//! minutes without reporting progress sends its client no byte, not even the headers, until its result. Clients
//! give up on a silent response long before that: `httpx`, which the Python SDK is given in the usual way to pass a
//! token, has a 5 s read timeout by default, and Node's `fetch` waits 5 min for headers. So a sessionless request
//! (no `Mcp-Session-Id`) that rmcp has not answered after [`STREAM_AFTER`], and whose client accepts an event
//! stream (as MCP clients must), is answered here: `200`, `text/event-stream`, a keep-alive comment every
//! [`KEEP_ALIVE`], then rmcp's answer as an event (a JSON answer) or its events (a stream). An answer that is not
//! JSON-RPC (rmcp's own failure, such as the server stopping under the call) becomes a JSON-RPC error for the
//! request, so the client is told rather than left with a stream that ends without an answer. A client that goes
//! away still cancels the call, as before: the wait for rmcp's answer is dropped with the response.
//!
//! A call that ends sooner is answered exactly as rmcp answers it. A 2025-11-25 session request is left to rmcp:
//! its answer is a stream from the start, and its errors (a session that ended meanwhile: 404) keep their status.
//! So is the `initialize` that opens such a session (it has no session header yet): its answer carries the new
//! session's id in a header, which an answer made here would not have.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use http_body::Frame;
use rmcp::transport::common::http_header::HEADER_SESSION_ID;

use super::parse::JsonRpcRequestId;

/// How long rmcp may take to answer before the answer is streamed.
pub(crate) const STREAM_AFTER: Duration = Duration::from_secs(1);
/// How often a stream without events sends a comment, so that clients' read timeouts do not fire.
pub(crate) const KEEP_ALIVE: Duration = Duration::from_secs(2);

const EVENT_STREAM: &str = "text/event-stream";

/// Streams a POST's answer when rmcp is slow to give it (see the module's documentation).
pub(crate) async fn stream_late_answers(request: Request, next: Next) -> Response {
    let Some(id) = streams_late(&request) else {
        return next.run(request).await;
    };
    let mut answer: PendingAnswer = Box::pin(next.run(request));
    tokio::select! {
        biased;
        response = &mut answer => response,
        () = tokio::time::sleep(STREAM_AFTER) => {
            let mut response = Response::new(Body::new(LateAnswer::new(answer, id)));
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static(EVENT_STREAM));
            headers.insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-cache"));
            headers.insert("x-accel-buffering", header::HeaderValue::from_static("no"));
            response
        }
    }
}

/// The id of `request` if its answer is streamed when late: a sessionless request (not the `initialize` that opens
/// a session) whose client accepts an event stream.
fn streams_late<B>(request: &axum::http::Request<B>) -> Option<serde_json::Value> {
    let request_id = request.extensions().get::<JsonRpcRequestId>()?;
    // Read as rmcp reads it: a header that is not text names no session.
    let sessionless = request.headers().get(HEADER_SESSION_ID).and_then(|v| v.to_str().ok()).is_none();
    let opens_session = request_id.method == "initialize";
    (sessionless && !opens_session && accepts_event_stream(request.headers())).then(|| request_id.id.clone())
}

fn accepts_event_stream(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT).iter().filter_map(|value| value.to_str().ok()).any(|value| {
        value.split(',').any(|kind| kind.split(';').next().is_some_and(|kind| kind.trim() == EVENT_STREAM))
    })
}

type PendingAnswer = Pin<Box<dyn Future<Output = Response> + Send>>;

/// The body of a streamed answer: keep-alives until rmcp answers, then its answer.
struct LateAnswer {
    state: State,
    keep_alive: tokio::time::Interval,
    /// The request's JSON-RPC id, for an error in place of an answer that is not JSON-RPC.
    id: serde_json::Value,
}

enum State {
    Waiting(PendingAnswer),
    /// rmcp answered with a stream: its bytes as they come.
    Streaming(Body),
    /// rmcp answered with JSON (`failed: None`), gathered then sent as one event; or with something else (its
    /// status), whose text is gathered then sent as a JSON-RPC error.
    Gathering {
        body: Body,
        gathered: Vec<u8>,
        failed: Option<StatusCode>,
    },
    Done,
}

impl LateAnswer {
    fn new(answer: PendingAnswer, id: serde_json::Value) -> Self {
        let keep_alive = tokio::time::interval_at(tokio::time::Instant::now() + KEEP_ALIVE, KEEP_ALIVE);
        Self { state: State::Waiting(answer), keep_alive, id }
    }
}

/// rmcp's answer as the rest of the stream.
fn continuation(response: Response) -> State {
    let kind = response.headers().get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).unwrap_or("");
    if kind.starts_with(EVENT_STREAM) {
        State::Streaming(response.into_body())
    } else if kind.starts_with("application/json") {
        State::Gathering { body: response.into_body(), gathered: Vec::new(), failed: None }
    } else {
        let failed = Some(response.status());
        State::Gathering { body: response.into_body(), gathered: Vec::new(), failed }
    }
}

/// The JSON-RPC error sent for request `id` in place of an answer with `status` and `text` that is not JSON-RPC.
fn error_for(id: &serde_json::Value, status: StatusCode, text: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(text);
    let text: String = text.trim().chars().take(500).collect();
    tracing::debug!(%status, %text, "an MCP answer streamed late was not JSON-RPC: sent as a JSON-RPC error");
    serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": INTERNAL_ERROR, "message": format!("the server could not answer ({status}): {text}") },
    })
}

/// JSON-RPC's internal error.
const INTERNAL_ERROR: i32 = -32603;

/// One JSON-RPC message as a server-sent event (a `data:` line per line of it).
fn as_event(message: &[u8]) -> Bytes {
    let mut event = Vec::with_capacity(message.len() + 16);
    for line in message.split(|byte| *byte == b'\n') {
        event.extend_from_slice(b"data: ");
        event.extend_from_slice(line.strip_suffix(b"\r").unwrap_or(line));
        event.push(b'\n');
    }
    event.push(b'\n');
    Bytes::from(event)
}

impl http_body::Body for LateAnswer {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        loop {
            match &mut this.state {
                State::Waiting(answer) => match answer.as_mut().poll(cx) {
                    Poll::Ready(response) => this.state = continuation(response),
                    Poll::Pending => {
                        return match this.keep_alive.poll_tick(cx) {
                            Poll::Ready(_) => {
                                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b": keep-alive\n\n")))))
                            }
                            Poll::Pending => Poll::Pending,
                        };
                    }
                },
                State::Streaming(body) => return Pin::new(body).poll_frame(cx),
                State::Gathering { body, gathered, failed } => match Pin::new(body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        if let Ok(data) = frame.into_data() {
                            gathered.extend_from_slice(&data);
                        }
                    }
                    Poll::Ready(Some(Err(error))) if failed.is_none() => {
                        this.state = State::Done;
                        return Poll::Ready(Some(Err(error)));
                    }
                    Poll::Ready(Some(Err(_)) | None) => {
                        let event = match failed {
                            None => as_event(gathered),
                            Some(status) => as_event(error_for(&this.id, *status, gathered).to_string().as_bytes()),
                        };
                        this.state = State::Done;
                        return Poll::Ready(Some(Ok(Frame::data(event))));
                    }
                    Poll::Pending => return Poll::Pending,
                },
                State::Done => return Poll::Ready(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_answer_is_one_event_with_a_data_line_per_line() {
        assert_eq!(&as_event(br#"{"a":1}"#)[..], b"data: {\"a\":1}\n\n");
        assert_eq!(&as_event(b"{\r\n}")[..], b"data: {\ndata: }\n\n");
    }

    #[test]
    fn an_answer_that_is_not_json_rpc_becomes_a_json_rpc_error_for_the_request() {
        let error = error_for(&serde_json::json!(7), StatusCode::INTERNAL_SERVER_ERROR, b"empty response\n");
        assert_eq!(error["id"], 7);
        assert_eq!(error["error"]["code"], INTERNAL_ERROR);
        assert_eq!(
            error["error"]["message"],
            "the server could not answer (500 Internal Server Error): empty response"
        );
    }

    #[test]
    fn a_sessionless_request_is_streamed_when_late_but_not_the_initialize_that_opens_a_session() {
        let request = |method: &str, session: Option<&str>| {
            let mut request = axum::http::Request::new(());
            request.headers_mut().insert(header::ACCEPT, "application/json, text/event-stream".parse().expect("valid"));
            if let Some(session) = session {
                request.headers_mut().insert(HEADER_SESSION_ID, session.parse().expect("valid"));
            }
            request.extensions_mut().insert(JsonRpcRequestId { id: serde_json::json!(1), method: method.into() });
            request
        };
        assert_eq!(streams_late(&request("tools/call", None)), Some(serde_json::json!(1)));
        assert_eq!(streams_late(&request("tools/call", Some("s1"))), None, "a session's answer is rmcp's");
        assert_eq!(streams_late(&request("initialize", None)), None, "its answer names the new session");
    }

    #[test]
    fn only_clients_that_accept_an_event_stream_get_one() {
        let accepts = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::ACCEPT, value.parse().expect("a header value"));
            accepts_event_stream(&headers)
        };
        assert!(accepts("application/json, text/event-stream"));
        assert!(accepts("text/event-stream;q=0.9"));
        assert!(!accepts("application/json"));
        assert!(!accepts("text/event-streams"));
        assert!(!accepts_event_stream(&HeaderMap::new()));
    }
}
