//! The HTTP side: `async-openai`'s client (its SSE parsing, its error types) reading this crate's own chunks
//! ([`chunk`](super::chunk), through `byot`), with a bounded retry under it (its middleware hook) that honours
//! `Retry-After`, and every answer made readable: a refusal in any server's shape, a whole answer to a streamed
//! request. What a failure means is [`failures`](super::failures)'s.

use std::time::{Duration, SystemTime};

use async_openai::config::OpenAIConfig;
use async_openai::error::{ApiError, ApiErrorResponse, OpenAIError};
use async_openai::middleware::HttpRequestFactory;
use async_openai::Client;
use serde_json::{json, Value};

use super::answer_end::{DoneWatch, Heard};
use super::chunk::LIST_LIMIT;
use super::failures::too_long;
use super::OpenAiEndpoint;
use crate::error::{ErrorCode, ToolError};

/// The API key, read from the variable the game named. `Ok(None)` when it named none.
pub(crate) fn api_key(endpoint: &OpenAiEndpoint) -> Result<Option<String>, ToolError> {
    let Some(var) = &endpoint.api_key_env else { return Ok(None) };
    match std::env::var(var) {
        // (The client would panic building its header from a key with a line break or other control character.)
        Ok(key) if reqwest::header::HeaderValue::from_str(key.trim()).is_err() => Err(ToolError::with_code(
            ErrorCode::AgentUnavailable,
            format!("the API key in the environment variable {var} has characters an HTTP header cannot carry"),
        )
        .with_detail("api_key_env", var)),
        Ok(key) if !key.trim().is_empty() => Ok(Some(key.trim().to_string())),
        _ => Err(ToolError::with_code(
            ErrorCode::AgentUnavailable,
            format!(
                "the API key for {} is read from the environment variable {var}, which is not set",
                endpoint.base_url
            ),
        )
        .with_detail("api_key_env", var)),
    }
}

/// The client for `endpoint`: its key and headers, a connect timeout, and the bounded retry; `heard` is told of
/// every chunk of its answers.
pub(crate) fn build(
    endpoint: &OpenAiEndpoint,
    connect_timeout: Duration,
    heard: Heard,
) -> Result<Client<OpenAIConfig>, ToolError> {
    if endpoint.base_url.starts_with("https://") && !cfg!(feature = "openai-tls") {
        return Err(ToolError::with_code(
            ErrorCode::AgentUnavailable,
            format!("{} is HTTPS: build bevy_agent_tools with the `openai-tls` feature", endpoint.base_url),
        ));
    }
    let invalid = |what: String| ToolError::invalid_input("headers", what);
    // No key: an empty one; no organization or project (`OpenAIConfig` would otherwise read OPENAI_API_KEY,
    // OPENAI_ORG_ID and OPENAI_PROJECT_ID behind the game's back, and send them to whatever endpoint this is).
    let mut config = OpenAIConfig::new()
        .with_api_base(endpoint.base_url.clone())
        .with_api_key(api_key(endpoint)?.unwrap_or_default())
        .with_org_id("")
        .with_project_id("");
    for (name, value) in &endpoint.headers {
        let header = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|error| invalid(format!("header name {name:?}: {error}")))?;
        config =
            config.with_header(header, value.as_str()).map_err(|error| invalid(format!("header {name}: {error}")))?;
    }
    // No read timeout here: the turn bounds every wait itself (`stall_timeout`), and says `TIMEOUT` when it passes.
    let http = reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .build()
        .map_err(|error| ToolError::internal(format!("could not build the HTTP client: {error}")))?;
    let retry = Retry { http, max_retries: endpoint.max_retries, max_wait: endpoint.max_retry_wait, heard };
    Ok(Client::with_config(config).with_http_service(tower::service_fn(move |factory: HttpRequestFactory| {
        let retry = retry.clone();
        async move { retry.send(factory).await }
    })))
}

/// Sends a request again after `429` and `5xx` (not `501`, `505`), a bounded number of times, waiting what
/// `Retry-After` asks (up to a bound) or a doubling backoff; and once, at once, on a new connection, when the server
/// closed the connection it went out on ([`closed_under_request`]).
#[derive(Clone)]
struct Retry {
    http: reqwest::Client,
    max_retries: u32,
    max_wait: Duration,
    heard: Heard,
}

impl Retry {
    async fn send(&self, factory: HttpRequestFactory) -> Result<reqwest::Response, OpenAIError> {
        let mut attempt = 0u32;
        let mut resent = false;
        loop {
            let mut request = factory.build().await?;
            // The client always sends `Authorization: Bearer <key>`: without a key, none at all rather than an
            // empty one (which strict proxies refuse).
            let authorization = request.headers().get(reqwest::header::AUTHORIZATION);
            if authorization.is_some_and(|value| value.as_bytes().trim_ascii() == b"Bearer") {
                request.headers_mut().remove(reqwest::header::AUTHORIZATION);
            }
            let response = match self.http.execute(request).await {
                Ok(response) => response,
                Err(error) if !resent && closed_under_request(&error) => {
                    resent = true;
                    tracing::debug!(%error, "the endpoint closed the connection the request went out on: sending it again");
                    continue;
                }
                Err(error) => return Err(OpenAIError::Reqwest(error)),
            };
            let status = response.status();
            // A server that does not do what was asked (501: llama.cpp's `not_supported_error`; 505) says the same
            // however often it is asked.
            let unsupported = matches!(status.as_u16(), 501 | 505);
            let retryable = status.as_u16() == 429 || (status.is_server_error() && !unsupported);
            if !retryable || attempt >= self.max_retries {
                return readable(response, &self.heard).await;
            }
            let asked = asked_wait(response.headers(), SystemTime::now());
            // What the retries left may wait in all (a minute's limit asking for 30 s takes two of them).
            let budget = self.max_wait.saturating_mul(self.max_retries - attempt);
            if let Some(asked) = asked.filter(|asked| *asked > budget) {
                // A wait longer than the session's retries cover (a daily limit's "try again in 14m"): asked again
                // sooner, the endpoint would say the same. The turn fails now, saying how long it asked for.
                let mut error = refused(response).await;
                if let OpenAIError::ApiError(api) = &mut error {
                    let seconds = asked.as_secs_f64().ceil();
                    api.api_error.message.push_str(&format!(
                        " (the endpoint asks to retry in {seconds} s, longer than the session's retries wait: \
                         `OpenAiEndpoint::retries`)"
                    ));
                }
                return Err(error);
            }
            if status.as_u16() == 429 {
                // OpenAI's "Request too large ... on tokens per min": too big for the limit, however long it waits.
                let error = refused(response).await;
                if too_long(&error) {
                    return Err(error);
                }
            } else {
                drop(response);
            }
            let backoff = Duration::from_millis(250).saturating_mul(2u32.saturating_pow(attempt)).min(self.max_wait);
            // A wait asked for that is longer than one retry's (within what the retries left may wait, checked
            // above) is waited out whole, as the endpoint asked, and spends the retries it spans: asked again
            // sooner, the endpoint would only refuse again.
            let wait = asked.unwrap_or(backoff);
            let spans = wait.as_nanos().div_ceil(self.max_wait.as_nanos().max(1)).max(1);
            tracing::debug!(%status, ?wait, attempt, "the endpoint asked to retry");
            attempt = attempt.saturating_add(u32::try_from(spans).unwrap_or(u32::MAX));
            tokio::time::sleep(wait).await;
        }
    }
}

/// Whether the server closed the connection as `error`'s request went out on it, before any answer: a kept-alive
/// connection the server let go while it sat in the pool (llama.cpp's server and uvicorn's, vLLM's, end an idle one
/// after 5 s; a player's turn can come later), whose end the client had not seen yet. Nothing was answered, so the
/// request is sent again once, on a new connection (the failed one is not pooled again). A refused connection or a
/// timeout is not this.
fn closed_under_request(error: &reqwest::Error) -> bool {
    if error.is_connect() || error.is_timeout() {
        return false;
    }
    let mut cause = std::error::Error::source(error);
    while let Some(error) = cause {
        if error.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_incomplete_message) {
            return true;
        }
        use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
        let reset = [ConnectionReset, ConnectionAborted, BrokenPipe];
        if error.downcast_ref::<std::io::Error>().is_some_and(|io| reset.contains(&io.kind())) {
            return true;
        }
        cause = error.source();
    }
    false
}

/// How long the endpoint asks to wait before a retry: `retry-after-ms` (OpenAI's and Azure's, finer), else
/// `Retry-After` (seconds or an HTTP date).
fn asked_wait(headers: &reqwest::header::HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let millis = header("retry-after-ms")
        .and_then(|value| value.trim().parse::<f64>().ok())
        .and_then(|millis| Duration::try_from_secs_f64(millis / 1000.0).ok());
    millis.or_else(|| header(reqwest::header::RETRY_AFTER.as_str()).and_then(|value| retry_after(value, now)))
}

/// The detail of an error that says the endpoint refused the API key (which the client holds until `resume`).
/// The most of a refusal's body read (the message quoted from it is shorter still).
const REFUSAL_LIMIT: usize = 64 * 1024;
/// The most of a whole (not streamed) answer read.
pub(crate) const WHOLE_ANSWER_LIMIT: usize = 16 * 1024 * 1024;

/// The response as the client can read it. A stream is handed on watched for its end ([`DoneWatch`]). A refusal
/// becomes an `ApiError` with its status and message whatever shape its body has (llama.cpp's numeric `code`,
/// vLLM's fields at the top level, a plain-text 404), where the client reads only OpenAI's shape and reports any
/// other as a malformed chunk without the status. A whole JSON answer to the streamed request (a server or proxy
/// that ignores `stream: true`) becomes the stream it stands for, so that its text and tool calls are not lost.
async fn readable(response: reqwest::Response, heard: &Heard) -> Result<reqwest::Response, OpenAIError> {
    let status = response.status();
    if !status.is_success() {
        return Err(refused(response).await);
    }
    let content_type = response.headers().get(reqwest::header::CONTENT_TYPE).and_then(|value| value.to_str().ok());
    if content_type.is_some_and(|value| value.trim_start().to_ascii_lowercase().starts_with("text/html")) {
        // A page, not an answer (a proxy's sign-in, a captive portal): its words say why, where the stream's parser
        // would read nothing and the turn would end as a broken stream.
        return Err(refused(response).await);
    }
    if !content_type.is_some_and(|value| value.trim_start().to_ascii_lowercase().starts_with("application/json")) {
        // The stream, watched for its end (`answer_end`).
        let headers = response.headers().clone();
        let watched = DoneWatch::new(response.bytes_stream()).hearing(heard.clone());
        return Ok(hand_on(status, headers, reqwest::Body::wrap_stream(watched)));
    }
    let body = read_bounded(response, WHOLE_ANSWER_LIMIT).await?;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::CONTENT_TYPE, reqwest::header::HeaderValue::from_static("text/event-stream"));
    Ok(hand_on(status, headers, as_event_stream(&body).into()))
}

/// A refusal (a response whose status is not a success) as the client's `ApiError`: its status, and the message,
/// type and code its body gives, whatever its shape ([`refusal`]).
pub(super) async fn refused(response: reqwest::Response) -> OpenAIError {
    let status = response.status();
    // A body that cannot be read still leaves the status (and so what the player is told to check).
    let body = read_bounded(response, REFUSAL_LIMIT).await.unwrap_or_default();
    OpenAIError::ApiError(ApiErrorResponse { status_code: status, api_error: refusal(&body) })
}

/// A response for the client made of these parts.
fn hand_on(status: reqwest::StatusCode, headers: reqwest::header::HeaderMap, body: reqwest::Body) -> reqwest::Response {
    let mut response = http::Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    reqwest::Response::from(response)
}

/// The first `limit` bytes of the response's body.
async fn read_bounded(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, OpenAIError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(OpenAIError::Reqwest)? {
        let room = limit.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= limit {
            break;
        }
    }
    Ok(body)
}

/// A refusal's message, type and code, from OpenAI's `{"error": {...}}`, the same fields at the top level, an
/// `error` or `detail` string, or the body's text.
pub(super) fn refusal(body: &[u8]) -> ApiError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let fields = parsed.as_ref().map(|value| value.get("error").filter(|error| error.is_object()).unwrap_or(value));
    let text_of = |value: &Value, key: &str| value.get(key).and_then(Value::as_str).map(str::to_string);
    let message = fields
        .and_then(|fields| text_of(fields, "message"))
        // Mistral's API puts its validation errors there as an object: `{"detail": [...]}`.
        .or_else(|| fields.and_then(|fields| fields.get("message")).filter(|m| !m.is_null()).map(Value::to_string))
        .or_else(|| parsed.as_ref().and_then(|value| text_of(value, "error").or_else(|| text_of(value, "detail"))))
        .unwrap_or_else(|| page_title(body).unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string()));
    let code = fields.and_then(|fields| fields.get("code")).filter(|code| !code.is_null());
    ApiError {
        message: if message.is_empty() { "no message".into() } else { message },
        r#type: fields.and_then(|fields| text_of(fields, "type")),
        code: code.map(|code| code.as_str().map(str::to_string).unwrap_or_else(|| code.to_string())),
        ..Default::default()
    }
}

/// The title of an HTML page (a reverse proxy's `502 Bad Gateway`), which says what its markup would only bury.
fn page_title(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    if !text.trim_start().starts_with('<') {
        return None;
    }
    let lower = text.to_ascii_lowercase();
    let start = lower.find("<title")?;
    let start = start + lower[start..].find('>')? + 1;
    let end = start + lower[start..].find("</title")?;
    let title = text[start..end].split_whitespace().collect::<Vec<_>>().join(" ");
    (!title.is_empty()).then(|| format!("an HTML page titled \"{title}\""))
}

/// A whole chat completion as the one streamed chunk it amounts to, then `[DONE]`: each choice's `message`
/// becomes its `delta` (its tool calls numbered, their arguments as text). An `{"error"}` sent with a `200`, and a
/// body that is not JSON, are passed on as the chunk, for the turn to report; other JSON (a proxy's
/// `{"detail": "Not authenticated"}`, a bare string) is reported as the error its words say, where the client
/// would read it as a chunk with no choices and the turn would end without them.
fn as_event_stream(body: &[u8]) -> Vec<u8> {
    let chunk = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(mut answer)) if answer.contains_key("choices") => {
            let choices = match answer.remove("choices") {
                Some(Value::Array(choices)) => choices,
                _ => Vec::new(),
            };
            let choices: Vec<Value> = choices.into_iter().take(LIST_LIMIT).map(as_delta).collect();
            let mut chunk = serde_json::Map::new();
            chunk.insert("choices".into(), Value::Array(choices));
            if let Some(usage) = answer.remove("usage") {
                chunk.insert("usage".into(), usage);
            }
            Value::Object(chunk).to_string()
        }
        Ok(Value::Object(answer)) if answer.get("error").is_some_and(|error| !error.is_null()) => {
            Value::Object(answer).to_string()
        }
        Ok(_) => json!({ "error": { "message": refusal(body).message } }).to_string(),
        // One line, as an event's data must be: the turn reports it as a malformed chunk, quoting it.
        Err(_) => String::from_utf8_lossy(body).replace(['\r', '\n'], " "),
    };
    format!("data: {chunk}\n\ndata: [DONE]\n\n").into_bytes()
}

/// One choice of a whole answer as a streamed one.
fn as_delta(mut choice: Value) -> Value {
    let mut message = choice.get_mut("message").map(Value::take).unwrap_or(Value::Null);
    if let Some(Value::Array(calls)) = message.get_mut("tool_calls") {
        calls.truncate(LIST_LIMIT);
        for (index, call) in calls.iter_mut().enumerate() {
            if let Value::Object(call) = call {
                call.insert("index".into(), index.into());
                if let Some(arguments) = call.get_mut("function").and_then(|function| function.get_mut("arguments")) {
                    if !arguments.is_string() {
                        *arguments = Value::String(arguments.to_string());
                    }
                }
            }
        }
    }
    json!({"delta": message, "finish_reason": choice.get("finish_reason").cloned().unwrap_or(Value::Null)})
}

/// The wait a `Retry-After` value asks for at `now`: seconds, or an HTTP date (RFC 9110 §10.2.3; one already
/// passed asks for none). Negative, NaN, too long to represent (`1e20`) and unreadable values ask for nothing: the
/// backoff applies.
fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    match value.parse::<f64>() {
        Ok(seconds) => Duration::try_from_secs_f64(seconds).ok(),
        Err(_) => {
            let when = httpdate::parse_http_date(value).ok()?;
            Some(when.duration_since(now).unwrap_or(Duration::ZERO))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::chunk::Chunk;
    use super::*;

    #[test]
    fn a_refusal_in_any_servers_shape_gives_its_message_and_code() {
        let openai =
            br#"{"error":{"message":"Incorrect API key","type":"invalid_request_error","code":"invalid_api_key"}}"#;
        let refused = refusal(openai);
        assert_eq!((refused.message.as_str(), refused.code.as_deref()), ("Incorrect API key", Some("invalid_api_key")));
        assert_eq!(refused.r#type.as_deref(), Some("invalid_request_error"));
        let llama_cpp =
            br#"{"error":{"code":400,"message":"exceeds the context size","type":"exceed_context_size_error"}}"#;
        let refused = refusal(llama_cpp);
        assert_eq!((refused.message.as_str(), refused.code.as_deref()), ("exceeds the context size", Some("400")));
        let vllm =
            br#"{"object":"error","message":"maximum context length is 8192","type":"BadRequestError","code":400}"#;
        assert_eq!(refusal(vllm).message, "maximum context length is 8192");
        assert_eq!(refusal(br#"{"error":"model 'x' not found"}"#).message, "model 'x' not found");
        assert_eq!(refusal(br#"{"detail":"Not Found"}"#).message, "Not Found");
        assert_eq!(refusal(b"404 page not found\n").message, "404 page not found");
        assert_eq!(refusal(b"").message, "no message");
    }

    #[test]
    fn a_whole_answer_becomes_the_one_chunk_it_stands_for() {
        let whole = json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "placing",
            "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "bump", "arguments": "{\"by\":1}"}},
                {"id": "b", "type": "function", "function": {"name": "bump", "arguments": {"by": 2}}},
            ]}}], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}});
        let stream = String::from_utf8(as_event_stream(whole.to_string().as_bytes())).unwrap();
        let (first, rest) = stream.split_once("\n\n").unwrap();
        assert_eq!(rest, "data: [DONE]\n\n");
        let chunk: Chunk = serde_json::from_str(first.strip_prefix("data: ").unwrap()).unwrap();
        let choice = &chunk.choices[0];
        assert_eq!(
            (choice.delta.content.as_deref(), choice.finish_reason.as_deref()),
            (Some("placing"), Some("tool_calls"))
        );
        let calls = choice.delta.tool_calls.as_ref().unwrap();
        let read: Vec<_> = calls
            .iter()
            .map(|call| {
                let function = call.function.as_ref().unwrap();
                (call.index, call.id.as_deref(), function.arguments.as_deref())
            })
            .collect();
        assert_eq!(read, [(Some(0), Some("a"), Some(r#"{"by":1}"#)), (Some(1), Some("b"), Some(r#"{"by":2}"#))]);
        assert_eq!(chunk.usage.map(|usage| usage.total_tokens), Some(7));
        let not_json = String::from_utf8(as_event_stream(b"oops\nwhat")).unwrap();
        assert_eq!(not_json, "data: oops what\n\ndata: [DONE]\n\n");
    }

    #[test]
    fn retry_after_is_seconds_or_an_http_date_and_anything_else_is_no_wait() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480); // Wed, 21 Oct 2015 07:28:00 GMT
        assert_eq!(retry_after(" 2 ", now), Some(Duration::from_secs(2)));
        assert_eq!(retry_after("0.5", now), Some(Duration::from_millis(500)));
        assert_eq!(retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now), Some(Duration::from_secs(30)));
        assert_eq!(retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now), Some(Duration::ZERO), "a date passed");
        for nothing in ["-1", "NaN", "1e20", "soon", ""] {
            assert_eq!(retry_after(nothing, now), None, "{nothing:?}");
        }
    }

    #[test]
    fn the_wait_asked_for_is_retry_after_ms_when_given_else_retry_after() {
        let now = SystemTime::UNIX_EPOCH;
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut headers = reqwest::header::HeaderMap::new();
            for (name, value) in pairs {
                headers.insert(*name, reqwest::header::HeaderValue::from_static(value));
            }
            headers
        };
        let both = headers(&[("retry-after-ms", "1500"), ("retry-after", "2")]);
        assert_eq!(asked_wait(&both, now), Some(Duration::from_millis(1500)));
        assert_eq!(asked_wait(&headers(&[("retry-after", "2")]), now), Some(Duration::from_secs(2)));
        let unreadable = headers(&[("retry-after-ms", "soon"), ("retry-after", "3")]);
        assert_eq!(asked_wait(&unreadable, now), Some(Duration::from_secs(3)));
        assert_eq!(asked_wait(&headers(&[]), now), None);
    }

    #[test]
    fn a_chunks_lists_are_read_only_as_far_as_the_answers_limit_whatever_their_length() {
        let many = |n: usize| vec!["{}"; n].join(",");
        let chunk = format!(r#"{{"choices":[{}]}}"#, many(100_000));
        let chunk: Chunk = serde_json::from_str(&chunk).expect("a chunk");
        assert_eq!(chunk.choices.len(), LIST_LIMIT, "the rest skipped unread");
        let calls = format!(r#"{{"choices":[{{"delta":{{"tool_calls":[{}]}}}}]}}"#, many(100_000));
        let calls: Chunk = serde_json::from_str(&calls).expect("a chunk");
        assert_eq!(calls.choices[0].delta.tool_calls.as_ref().map(Vec::len), Some(LIST_LIMIT));
        // Null and missing lists are none, as before.
        let empty: Chunk = serde_json::from_str(r#"{"choices":null}"#).expect("a chunk");
        assert!(empty.choices.is_empty());
        let none: Chunk = serde_json::from_str(r#"{"choices":[{"delta":{"tool_calls":null}}]}"#).expect("a chunk");
        assert!(none.choices[0].delta.tool_calls.as_ref().is_none_or(Vec::is_empty));
        // A whole answer of many calls becomes a chunk of no more than the limit's.
        let whole = format!(r#"{{"choices":[{{"message":{{"tool_calls":[{}]}}}}]}}"#, many(100_000));
        let stream = String::from_utf8(as_event_stream(whole.as_bytes())).expect("text");
        let data = stream.strip_prefix("data: ").and_then(|rest| rest.split("\n\n").next()).expect("a chunk");
        let chunk: Value = serde_json::from_str(data).expect("JSON");
        assert_eq!(chunk["choices"][0]["delta"]["tool_calls"].as_array().map(Vec::len), Some(LIST_LIMIT));
    }
}
