//! What a failed request means: the endpoint's refusal or the connection's failure, in words naming what to fix
//! (the key, the server's flags, the model's context), with the key never quoted back.

use async_openai::error::{ApiError, OpenAIError};
use serde_json::{json, Value};

use super::client::{api_key, refusal};
use super::OpenAiEndpoint;
use crate::error::{ErrorCode, ToolError};

pub(crate) const KEY_REFUSED: &str = "key_refused";

/// The shortest key looked for in an endpoint's message to hide it (a shorter one would match ordinary words).
const MIN_KEY_HIDDEN: usize = 6;

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
/// `error:` line ([`DoneWatch`](super::answer_end::DoneWatch)). Its message and code read as a refusal's are,
/// whatever its shape, and what to change where its words say it (a conversation longer than the model's context).
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
    use async_openai::error::ApiErrorResponse;

    use super::*;

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
    fn gemini_and_anthropic_words_for_a_request_longer_than_the_context_are_read_as_such() {
        let gemini = "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).";
        let anthropic = "prompt is too long: 210000 tokens > 200000 maximum";
        for said in [gemini, anthropic] {
            assert!(in_stream_too_long(&json!({ "message": said })), "{said}");
        }
        assert!(!in_stream_too_long(&json!({ "message": "the answer is too long to show" })));
    }
}
