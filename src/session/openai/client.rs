//! The HTTP side: `async-openai`'s client (its SSE parsing, its error types) with this crate's own, lenient chunk
//! types (`byot`: local servers omit fields OpenAI always sends) and a bounded retry under it (its middleware
//! hook) that honours `Retry-After`. Failures become errors a person can act on.

use std::time::{Duration, SystemTime};

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::HttpRequestFactory;
use async_openai::Client;
use serde::Deserialize;

use super::OpenAiEndpoint;
use crate::error::{ErrorCode, ToolError};

/// One streamed chunk, as lenient as the servers that send it.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Chunk {
    #[serde(default)]
    pub choices: Vec<Choice>,
    #[serde(default)]
    pub usage: Option<UsageReport>,
    /// An error reported inside the stream (some servers do, after a `200`).
    #[serde(default)]
    pub error: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Choice {
    #[serde(default)]
    pub delta: Delta,
    #[serde(default)]
    pub finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Delta {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallChunk>>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ToolCallChunk {
    #[serde(default)]
    pub index: Option<usize>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub function: Option<FunctionChunk>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct FunctionChunk {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub arguments: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct UsageReport {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
}

/// The API key, read from the variable the game named. `Ok(None)` when it named none.
pub(crate) fn api_key(endpoint: &OpenAiEndpoint) -> Result<Option<String>, ToolError> {
    let Some(var) = &endpoint.api_key_env else { return Ok(None) };
    match std::env::var(var) {
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

/// The client for `endpoint`: its key and headers, a connect timeout, and the bounded retry.
pub(crate) fn build(endpoint: &OpenAiEndpoint, connect_timeout: Duration) -> Result<Client<OpenAIConfig>, ToolError> {
    if endpoint.base_url.starts_with("https://") && !cfg!(feature = "openai-tls") {
        return Err(ToolError::with_code(
            ErrorCode::AgentUnavailable,
            format!("{} is HTTPS: build bevy_agent_tools with the `openai-tls` feature", endpoint.base_url),
        ));
    }
    let invalid = |what: String| ToolError::invalid_input("headers", what);
    // No key: an empty one (`OpenAIConfig` would otherwise read OPENAI_API_KEY behind the game's back).
    let mut config = OpenAIConfig::new()
        .with_api_base(endpoint.base_url.clone())
        .with_api_key(api_key(endpoint)?.unwrap_or_default());
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
    let retry = Retry { http, max_retries: endpoint.max_retries, max_wait: endpoint.max_retry_wait };
    Ok(Client::with_config(config).with_http_service(tower::service_fn(move |factory: HttpRequestFactory| {
        let retry = retry.clone();
        async move { retry.send(factory).await }
    })))
}

/// Sends a request again after `429` and `5xx`, a bounded number of times, waiting what `Retry-After` asks (up to
/// a bound) or a doubling backoff.
#[derive(Clone)]
struct Retry {
    http: reqwest::Client,
    max_retries: u32,
    max_wait: Duration,
}

impl Retry {
    async fn send(&self, factory: HttpRequestFactory) -> Result<reqwest::Response, OpenAIError> {
        let mut attempt = 0u32;
        loop {
            let mut request = factory.build().await?;
            // The client always sends `Authorization: Bearer <key>`: without a key, none at all rather than an
            // empty one (which strict proxies refuse).
            let authorization = request.headers().get(reqwest::header::AUTHORIZATION);
            if authorization.is_some_and(|value| value.as_bytes().trim_ascii() == b"Bearer") {
                request.headers_mut().remove(reqwest::header::AUTHORIZATION);
            }
            let response = self.http.execute(request).await.map_err(OpenAIError::Reqwest)?;
            let status = response.status();
            let retryable = status.as_u16() == 429 || status.is_server_error();
            if !retryable || attempt >= self.max_retries {
                return Ok(response);
            }
            let asked = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| retry_after(value, SystemTime::now()));
            let backoff = Duration::from_millis(250).saturating_mul(2u32.saturating_pow(attempt));
            let wait = asked.unwrap_or(backoff).min(self.max_wait);
            tracing::debug!(%status, ?wait, attempt, "the endpoint asked to retry");
            drop(response);
            attempt += 1;
            tokio::time::sleep(wait).await;
        }
    }
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
        // The client's only timeout is its connect timeout (the session's start timeout): silence once connected
        // is the stall timeout's, which says so itself.
        OpenAIError::Reqwest(error) if error.is_timeout() => ToolError::with_code(
            ErrorCode::Timeout,
            format!("could not connect to {url} in time: {}", source_chain(&error)),
        )
        .with_detail("url", &url),
        OpenAIError::Reqwest(error) => unavailable(format!("the request to {url} failed: {}", source_chain(&error))),
        OpenAIError::ApiError(api) => {
            let status = api.status_code.as_u16();
            let said = api.api_error.message.chars().take(500).collect::<String>();
            let message = match status {
                401 | 403 => match &endpoint.api_key_env {
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
                500..=599 => format!("{url} failed ({status}: {said}), still after {} retries", endpoint.max_retries),
                _ => format!("{url} refused the request ({status}: {said})"),
            };
            unavailable(message).with_detail("status", status)
        }
        OpenAIError::JSONDeserialize(error, content) => unavailable(format!(
            "{url} sent a malformed chunk ({error}): {}",
            content.chars().take(200).collect::<String>()
        )),
        OpenAIError::StreamError(error) => unavailable(format!("the stream from {url} broke: {error}")),
        other => unavailable(format!("the request to {url} failed: {other}")),
    }
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
}
