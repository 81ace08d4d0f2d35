//! The HTTP side: `async-openai`'s client (its SSE parsing, its error types) with this crate's own, lenient chunk
//! types (`byot`: local servers omit fields OpenAI always sends) and a bounded retry under it (its middleware
//! hook) that honours `Retry-After`. Failures become errors a person can act on.

use std::time::{Duration, SystemTime};

use async_openai::config::OpenAIConfig;
use async_openai::error::{ApiError, ApiErrorResponse, OpenAIError};
use async_openai::middleware::HttpRequestFactory;
use async_openai::Client;
use serde::Deserialize;
use serde_json::{json, Value};

use super::answer_end::{DoneWatch, Heard};
use super::OpenAiEndpoint;
use crate::error::{ErrorCode, ToolError};

/// One streamed chunk, as lenient as the servers that send it: a field may be missing or `null` (`#[serde(default)]`
/// alone covers only a missing one, and some servers send `"choices": null`, `"delta": null` or null token counts),
/// and text may come as content parts ([`text_or_parts`]).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Chunk {
    #[serde(default, deserialize_with = "first_few")]
    pub choices: Vec<Choice>,
    #[serde(default)]
    pub usage: Option<UsageReport>,
    /// An error reported inside the stream (some servers do, after a `200`; llama.cpp's `error:` line comes as
    /// this too, see [`DoneWatch`]).
    #[serde(default)]
    pub error: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Choice {
    #[serde(default, deserialize_with = "null_as_default")]
    pub delta: Delta,
    /// Why the answer ended; `""` is none (older Ollama and SGLang send it on every chunk).
    #[serde(default, deserialize_with = "empty_as_none")]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Delta {
    #[serde(default, deserialize_with = "text_or_parts")]
    pub content: Option<String>,
    #[serde(default, deserialize_with = "some_first_few")]
    pub tool_calls: Option<Vec<ToolCallChunk>>,
    /// A reasoning model's thinking, as llama.cpp's server, vLLM and LM Studio send it.
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// The same, as Ollama sends it.
    #[serde(default)]
    pub reasoning: Option<String>,
    /// OpenRouter's reasoning blocks ([`ReasoningDetails`](super::reasoning_details::ReasoningDetails)).
    #[serde(default)]
    pub reasoning_details: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ToolCallChunk {
    #[serde(default)]
    pub index: Option<usize>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub function: Option<FunctionChunk>,
    /// What the server wants back with the call (Gemini's `{"google": {"thought_signature": ...}}`: without it,
    /// its next request is refused).
    #[serde(default)]
    pub extra_content: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct FunctionChunk {
    #[serde(default)]
    pub name: Option<String>,
    /// Text to append; a JSON value given in its place (LiteLLM's proxy streams an object) is its text.
    #[serde(default, deserialize_with = "text_or_json")]
    pub arguments: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct UsageReport {
    #[serde(default, deserialize_with = "null_as_default")]
    pub prompt_tokens: u64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub completion_tokens: u64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub total_tokens: u64,
}

/// A field given as `null` read as its default, as a missing one is.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The most elements of a chunk's list read (its choices, a delta's tool calls): one more than the calls an answer
/// may hold, so that the turn still sees it pass that limit. The rest are skipped unread: a server's million empty
/// `{}` would each cost a hundred times their size once read.
pub(crate) const LIST_LIMIT: usize = super::turn::MAX_CALLS_PER_ANSWER + 1;

/// A list, at most its first [`LIST_LIMIT`] elements; `null` as none.
fn first_few<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct FirstFew<T>(std::marker::PhantomData<T>);

    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for FirstFew<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list or null")
        }

        fn visit_unit<E>(self) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let mut kept = Vec::new();
            while kept.len() < LIST_LIMIT {
                match seq.next_element()? {
                    Some(element) => kept.push(element),
                    None => return Ok(kept),
                }
            }
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
            Ok(kept)
        }
    }

    deserializer.deserialize_any(FirstFew(std::marker::PhantomData))
}

/// [`first_few`], as the optional list it stands for.
fn some_first_few<'de, D, T>(deserializer: D) -> Result<Option<Vec<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    first_few(deserializer).map(Some)
}

/// A string, `""` read as none.
fn empty_as_none<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(Option::<String>::deserialize(deserializer)?.filter(|text| !text.is_empty()))
}

/// A string as it is; any other JSON value (but `null`) as its JSON text.
fn text_or_json<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text),
        Some(other) => Some(other.to_string()),
    })
}

/// A message's text: a string, or content parts (`[{"type": "text", "text": ...}]`, as Mistral's API sends it),
/// whose text parts are read in order and joined; parts of other types (a reasoning model's `thinking`) are left
/// out, as reasoning is. Anything else is malformed.
fn text_or_parts<'de, D>(deserializer: D) -> Result<Option<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    match Option::<Value>::deserialize(deserializer)? {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(Value::Array(parts)) => Ok(Some(
            parts
                .iter()
                .filter_map(|part| match part {
                    Value::String(text) => Some(text.as_str()),
                    Value::Object(part) if part.get("type").is_none_or(|kind| kind == "text") => {
                        part.get("text").and_then(Value::as_str)
                    }
                    _ => None,
                })
                .collect(),
        )),
        Some(other) => {
            Err(serde::de::Error::custom(format!("content is neither text nor an array of content parts: {other}")))
        }
    }
}

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
pub(crate) const KEY_REFUSED: &str = "key_refused";

/// The shortest key looked for in an endpoint's message to hide it (a shorter one would match ordinary words).
const MIN_KEY_HIDDEN: usize = 6;
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
fn refusal(body: &[u8]) -> ApiError {
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

/// What a failed request means, in words naming what to fix.
pub(crate) fn describe(endpoint: &OpenAiEndpoint, error: OpenAIError) -> ToolError {
    // The URL of the request that failed (the model list at start-up, or the completions), else the completions'.
    let url = match &error {
        OpenAIError::Reqwest(error) => error.url().map(|url| url.to_string()),
        _ => None,
    }
    .unwrap_or_else(|| endpoint.completions_url());
    let unavailable =
        |message: String| ToolError::with_code(ErrorCode::AgentUnavailable, message).with_detail("url", &url);
    match error {
        OpenAIError::Reqwest(error) if error.is_connect() => {
            unavailable(format!("could not connect to {url}: {}", source_chain(&error)))
        }
        // The client's only timeout is its connect timeout (the session's start timeout): the endpoint could not be
        // reached. Silence once connected is the stall timeout's, which says so itself.
        OpenAIError::Reqwest(error) if error.is_timeout() => {
            unavailable(format!("could not connect to {url} in time: {}", source_chain(&error)))
        }
        OpenAIError::Reqwest(error) => unavailable(format!("the request to {url} failed: {}", source_chain(&error))),
        OpenAIError::ApiError(api) => {
            let status = api.status_code.as_u16();
            let said = quoted(endpoint, &api.api_error.message);
            let advice = advice(endpoint, &api.api_error);
            // Gemini's OpenAI-compatible endpoint refuses a key with `400` "API key not valid".
            let key_refused =
                matches!(status, 401 | 403) || (status == 400 && refusal_words(&api.api_error).contains("api key"));
            let message = match status {
                _ if key_refused => match &endpoint.api_key_env {
                    Some(var) => format!(
                        "{url} refused the API key ({status}: {said}): check the key in the environment variable {var}"
                    ),
                    None => format!(
                        "{url} wants an API key ({status}: {said}): name the environment variable that holds it \
                         (OpenAiEndpoint::api_key_env, the sandbox's --api-key-env)"
                    ),
                },
                404 => format!(
                    "{url} answered 404 ({said}): check the base URL and that model `{}` exists there",
                    endpoint.model
                ),
                429 => format!("{url} is rate limiting (429: {said}), still after {} retries", endpoint.max_retries),
                501 | 505 => format!("{url} does not support the request ({status}: {said}): not asked again"),
                500..=599 => format!("{url} failed ({status}: {said}), still after {} retries", endpoint.max_retries),
                _ => format!("{url} refused the request ({status}: {said})"),
            };
            let message = match advice {
                Some(advice) => format!("{message}: {advice}"),
                None => message,
            };
            let refused = unavailable(message).with_detail("status", status);
            match key_refused {
                true => refused.with_detail(KEY_REFUSED, true),
                false => refused,
            }
        }
        OpenAIError::JSONDeserialize(error, content) => unavailable(format!(
            "{url} sent a malformed chunk ({error}): {}",
            content.chars().take(200).collect::<String>()
        )),
        OpenAIError::StreamError(error) => unavailable(format!(
            "the stream from {url} broke before the answer's end (a connection closed mid-answer, or a body that \
             ended without `data: [DONE]` or a finish_reason): {error}"
        )),
        other => unavailable(format!("the request to {url} failed: {other}")),
    }
}

/// An endpoint's own words as the player reads them: at most 500 characters, and without the API key.
fn quoted(endpoint: &OpenAiEndpoint, message: &str) -> String {
    let mut said = message.to_string();
    // An endpoint that quotes the key it refused (some proxies do) does not get it shown to the player.
    if let Ok(Some(key)) = api_key(endpoint) {
        if key.chars().count() >= MIN_KEY_HIDDEN {
            said = said.replace(&key, "[the API key]");
        }
    }
    said.chars().take(500).collect()
}

/// An error the endpoint reported inside its stream, after a `200`: an `{"error": ...}` chunk, or llama.cpp's
/// `error:` line ([`DoneWatch`]). Its message and code read as a refusal's are, whatever its shape, and what to
/// change where its words say it (a conversation longer than the model's context).
pub(crate) fn in_stream(endpoint: &OpenAiEndpoint, error: &Value) -> ToolError {
    let url = endpoint.completions_url();
    let api = refusal(json!({ "error": error }).to_string().as_bytes());
    let code = api.code.as_ref().map(|code| format!("{code}: ")).unwrap_or_default();
    let message = format!("{url} reported an error in its stream ({code}{})", quoted(endpoint, &api.message));
    let message = match advice(endpoint, &api) {
        Some(advice) => format!("{message}: {advice}"),
        None => message,
    };
    ToolError::with_code(ErrorCode::AgentUnavailable, message).with_detail("url", &url)
}

/// Whether the endpoint refused the request as longer than the model's context: llama.cpp's server
/// (`exceed_context_size_error`, "exceeds the available context size"), OpenAI (`context_length_exceeded`), vLLM
/// ("maximum context length").
pub(crate) fn too_long(error: &OpenAIError) -> bool {
    matches!(error, OpenAIError::ApiError(api) if says_too_long(&refusal_words(&api.api_error)))
}

/// Whether the endpoint refused the request for its `stream_options` (Mistral's API: 422, `extra_forbidden` at
/// `["body", "stream_options", ...]`; it sends the usage without being asked).
pub(crate) fn refuses_stream_options(error: &OpenAIError) -> bool {
    matches!(error, OpenAIError::ApiError(api)
        if matches!(api.status_code.as_u16(), 400 | 422) && refusal_words(&api.api_error).contains("stream_options"))
}

/// Whether a refusal's words ([`refusal_words`]) say the request is longer than the model's context.
fn says_too_long(words: &str) -> bool {
    // Gemini's OpenAI-compatible endpoint: "The input token count (N) exceeds the maximum number of tokens allowed
    // (M)"; Anthropic's: "prompt is too long: N tokens > M maximum".
    // Groq's 413 and OpenAI's 429 for a request over the tokens-per-minute limit: "Request too large for model
    // ... on tokens per minute (TPM): Limit 12000, Requested 14137, please reduce your message size".
    [
        "exceed_context_size",
        "context_length_exceeded",
        "context size",
        "context length",
        "exceeds the maximum number of tokens allowed",
        "prompt is too long",
        "request too large",
        "reduce your message size",
    ]
    .iter()
    .any(|marker| words.contains(marker))
}

/// A refusal's message, type and code, in lower case, for recognising the refusals [`advice`] knows.
fn refusal_words(api: &ApiError) -> String {
    let fields = [Some(&api.message), api.r#type.as_ref(), api.code.as_ref()];
    fields.into_iter().flatten().map(|field| field.to_lowercase()).collect::<Vec<_>>().join(" ")
}

/// Whether an error the endpoint reported in its stream says the request is longer than the model's context
/// (llama.cpp's server said so in the stream before it refused such requests up front, SGLang still does).
pub(crate) fn in_stream_too_long(error: &Value) -> bool {
    says_too_long(&refusal_words(&refusal(json!({ "error": error }).to_string().as_bytes())))
}

/// What to do about a request longer than the model's context, which the turn asked again with at most half of
/// the history (`history_sent` is what the last request carried of it, in bytes; `round` the turn's round, past
/// 0 once it carries the turn's own tool calls and results; `refusal` the endpoint's words).
pub(crate) fn too_long_advice(endpoint: &OpenAiEndpoint, history_sent: usize, round: u32, refusal: &str) -> String {
    // Groq's and OpenAI's "Request too large ... on tokens per minute (TPM)": the account's limit, not the model's
    // context, is what the request is over.
    let refusal = refusal.to_lowercase();
    if refusal.contains("tokens per min") || refusal.contains("(tpm)") {
        return format!(
            "the request is over the provider's tokens-per-minute limit for the account, a rate limit and not the \
             model's context: send less (OpenAiEndpoint::max_history_bytes bounds the history; {history_sent} bytes \
             of it went; offer the model fewer tools, have them return less) or raise the account's limit"
        );
    }
    let server_context = "start the server with a larger context (llama.cpp's -c, Ollama's num_ctx, vLLM's \
                          --max-model-len)";
    let advice = too_long_cause(endpoint, history_sent, round, server_context);
    // Servers that count the answer's room in the request's length (vLLM) refuse a large one however short the
    // history is.
    match endpoint.sampling.max_tokens {
        Some(tokens) => format!(
            "{advice}; the answer's room counts too: Sampling::max_tokens ({tokens}) is asked of the same context, \
             lower it"
        ),
        None => advice,
    }
}

/// [`too_long_advice`] without the answer's room.
fn too_long_cause(endpoint: &OpenAiEndpoint, history_sent: usize, round: u32, server_context: &str) -> String {
    match endpoint.context_window {
        _ if history_sent == 0 && round > 0 => format!(
            "this turn's tool calls and their results, with the system prompt, the tools' descriptions and the \
             player's text, are longer than the model's context window (a tool's result may be too large for it): \
             {server_context}, or have the tools return less"
        ),
        _ if history_sent == 0 => format!(
            "the system prompt, the tools' descriptions and the player's text alone are longer than the model's \
             context window, with no earlier turns: {server_context}, or offer the model fewer tools"
        ),
        None => "the conversation is longer than the model's context window: set the window's size in tokens on \
                 the session's endpoint, OpenAiEndpoint::context_window (the sandbox's --context-window), and the \
                 history sent is bounded to fit it"
            .to_string(),
        Some(window) => format!(
            "the request is longer than the model's context window even with {history_sent} bytes of history: \
             OpenAiEndpoint::context_window ({window} tokens) is likely more than the server gives the model \
             ({server_context}, or set the window the server has)"
        ),
    }
}

/// What to do about a refusal that says how the server or the model is set up: one that cannot call tools, a
/// server not started for them. These refuse every request alike, and their words alone do not say what to
/// change. (A request longer than the model's context is the turn's to advise on: [`too_long_advice`].)
fn advice(endpoint: &OpenAiEndpoint, api: &ApiError) -> Option<String> {
    let words = refusal_words(api);
    if words.contains("does not support tools") {
        return Some(format!(
            "model `{}` cannot call tools there: pick a model with tool support (for Ollama, `ollama show <model>` \
             lists `tools` among its capabilities)",
            endpoint.model
        ));
    }
    if words.contains("--jinja") {
        return Some("start llama-server with --jinja: tool calls need the model's own chat template".to_string());
    }
    if words.contains("enable-auto-tool-choice") {
        return Some(
            "start vLLM with --enable-auto-tool-choice --tool-call-parser <the model's parser, e.g. hermes for \
             Qwen>"
                .to_string(),
        );
    }
    None
}

/// An error and its causes (reqwest's own message hides "connection refused" in its source).
fn source_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
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
    fn a_refusal_that_says_how_the_server_or_model_is_set_up_gets_what_to_change() {
        let endpoint = OpenAiEndpoint::new("http://127.0.0.1:8080/v1", "m");
        let advised = |body: &[u8]| advice(&endpoint, &refusal(body)).unwrap_or_default();
        // llama.cpp's server without `--jinja` (a 500).
        let jinja = br#"{"error":{"code":500,"message":"tools param requires --jinja flag","type":"server_error"}}"#;
        assert!(advised(jinja).starts_with("start llama-server with --jinja"), "{}", advised(jinja));
        let openai = br#"{"error":{"message":"This model's maximum context length is 128000 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        // An overflow is the turn's to advise on (`too_long_advice`): it knows what the request carried.
        assert_eq!(advice(&endpoint, &refusal(openai)), None);
        let api_error = |body: &[u8]| {
            let status = reqwest::StatusCode::BAD_REQUEST;
            OpenAIError::ApiError(ApiErrorResponse { status_code: status, api_error: refusal(body) })
        };
        assert!(too_long(&api_error(openai)) && !too_long(&api_error(jinja)));
        assert_eq!(advice(&endpoint, &refusal(br#"{"error":{"message":"bad temperature"}}"#)), None);
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
    fn gemini_and_anthropic_words_for_a_request_longer_than_the_context_are_read_as_such() {
        let gemini = "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).";
        let anthropic = "prompt is too long: 210000 tokens > 200000 maximum";
        for said in [gemini, anthropic] {
            assert!(in_stream_too_long(&json!({ "message": said })), "{said}");
        }
        assert!(!in_stream_too_long(&json!({ "message": "the answer is too long to show" })));
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
