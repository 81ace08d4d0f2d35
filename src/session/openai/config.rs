//! What a game says about an OpenAI-compatible endpoint: where it is, which model, where the API key is, and how
//! the agent loop runs against it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::session::{SessionBackend, SessionConfig};

/// An OpenAI-compatible chat completions endpoint (`POST {base_url}/chat/completions`, streamed): Ollama
/// (`http://127.0.0.1:11434/v1`), llama.cpp's `llama-server --jinja`, LM Studio, vLLM, the Player2 app
/// (`http://127.0.0.1:4315/v1`, header `player2-game-key`), OpenAI (`https://api.openai.com/v1`, needs the
/// `openai-tls` feature).
///
/// Kept in the session's record (to resume it after a restart): the API key never is, only the name of the
/// environment variable it is read from, at each connection.
///
/// ```
/// # use bevy_agent_tools::session::{OpenAiEndpoint, Sampling, SessionConfig, TokenLimitField};
/// let local = SessionConfig::openai("http://127.0.0.1:11434/v1", "qwen3:4b");
/// let cloud = SessionConfig::openai_endpoint(
///     OpenAiEndpoint::new("https://api.openai.com/v1", "gpt-5-mini")
///         .api_key_env("OPENAI_API_KEY")
///         .max_tool_rounds(12)
///         .token_limit_field(TokenLimitField::MaxCompletionTokens)
///         .sampling(Sampling { max_tokens: Some(4096), ..Sampling::default() }),
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpenAiEndpoint {
    /// The API's base URL, up to and including `/v1`.
    pub base_url: String,
    /// The model's name, as the endpoint knows it.
    pub model: String,
    /// The environment variable holding the API key (sent as `Authorization: Bearer`), read at each connection.
    /// `None`: no key (local servers).
    pub api_key_env: Option<String>,
    /// Extra headers on every request (Player2's `player2-game-key`). Stored in the session's record: put no
    /// secret here.
    pub headers: Vec<(String, String)>,
    /// Sampling parameters; unset ones are the endpoint's defaults.
    pub sampling: Sampling,
    /// At most this many rounds of tool calls per turn; the model asking for more ends the turn with
    /// [`StopReason::MaxTurnRequests`](crate::session::StopReason::MaxTurnRequests), the calls not run. Default 8.
    pub max_tool_rounds: u32,
    /// At most this many of the tool calls of one answer run (at least one); each call past it is not run, and the
    /// model reads instead an error result (`BUSY`) that states the limit, so it can ask again in its next answer.
    /// Default 32.
    #[serde(default = "default_max_tool_calls_per_round")]
    pub max_tool_calls_per_round: u32,
    /// How long the endpoint may stay silent between two chunks of its answer before the turn fails with
    /// `TIMEOUT`. Default 60 s. Any bytes count, also the comments some endpoints send to keep a waiting request
    /// alive; Ollama sends none while the model writes a tool call, so raise it for a slow model that writes long
    /// arguments.
    pub stall_timeout: Duration,
    /// How long the endpoint may stay silent before the first chunk of its answer, a chunk that says only the
    /// answer's role not counting (if longer than [`stall_timeout`](Self::stall_timeout)): a local server loads
    /// the model into memory at its first request (Ollama, LM Studio) and reads the whole prompt before it
    /// answers, minutes on a CPU, and a reasoning model may think that long before it streams a word. Default
    /// 5 min.
    #[serde(default = "default_first_answer_timeout")]
    pub first_answer_timeout: Duration,
    /// Retries of a request answered `429` or `5xx` (but `501` and `505`, which say the same however often
    /// asked, and a `429` saying the request is too large for a tokens-per-minute limit, which is asked again with
    /// less history), each after the wait the endpoint asked for (`retry-after-ms`, else `Retry-After`), else
    /// after 250 ms, 500 ms, 1 s... Default 3.
    pub max_retries: u32,
    /// The longest wait before one retry. An endpoint that asks for longer is waited for whole, and the wait
    /// spends as many retries as it spans; one that asks for longer than the retries left may wait in all (a daily
    /// limit) fails the turn at once, its error saying how long it asked for, rather than being asked again sooner
    /// in vain. Default 20 s.
    pub max_retry_wait: Duration,
    /// The history's bound, in bytes of JSON (an image counted as 4,000, about what a model reads of it, whatever
    /// the size of its `data:` URL): past it the oldest turns are dropped (whole turns, never the
    /// current one; the model is told how many) down to 60% of it, so that the turns after a drop all start alike
    /// and a local server reuses the prompt it read for the turn before. Default 512 KiB.
    pub max_history_bytes: usize,
    /// The model's context window in tokens, if known: reported in [`Usage::context_tokens`](crate::session::Usage),
    /// and it bounds the history sent with each request to two bytes of JSON per token of the window (at about
    /// four bytes a token, half the window; the rest is left to the system prompt, the tools, the turn and the
    /// answer), when that is below [`max_history_bytes`](Self::max_history_bytes); the newest turn is always kept.
    /// Set it for local models with
    /// small windows: Ollama's default (4,096 tokens) silently cuts a prompt that is too long from its start,
    /// system prompt included, and llama.cpp's server refuses it.
    pub context_window: Option<u64>,
    /// Whether the model reads images: then an image a tool returns (e.g. the sandbox's `observe`) is sent as an
    /// image part (a `data:` URL in a user message after the tool results, the only place chat completions take
    /// images, with an assistant line saying they follow between them, as Mistral's API and strict templates want;
    /// the history keeps the newest four, an older one replaced by a line saying so); otherwise it is summarized in
    /// the tool's result as a line saying what it was. Default false.
    #[serde(default)]
    pub images: bool,
    /// The name of the request's field for [`Sampling::max_tokens`]: `max_tokens` (the default, which local servers
    /// take) or `max_completion_tokens` (which OpenAI's reasoning models want: they refuse `max_tokens`).
    #[serde(default)]
    pub token_limit_field: TokenLimitField,
}

fn default_max_tool_calls_per_round() -> u32 {
    32
}

fn default_first_answer_timeout() -> Duration {
    Duration::from_secs(300)
}

/// The request field that carries [`Sampling::max_tokens`], as the endpoint names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenLimitField {
    /// `max_tokens`: Ollama, llama.cpp's server, LM Studio, vLLM, and OpenAI's older models.
    #[default]
    MaxTokens,
    /// `max_completion_tokens`: OpenAI's newer models (its reasoning models refuse `max_tokens`).
    MaxCompletionTokens,
}

impl TokenLimitField {
    /// The field's name in the request.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxTokens => "max_tokens",
            Self::MaxCompletionTokens => "max_completion_tokens",
        }
    }
}

/// Sampling parameters sent with each request (`None`: the endpoint's default). The endpoint's default is not always
/// the model's: Ollama's `/v1` takes a missing `temperature` or `top_p` as 1.0, over the values the model was
/// published with (set them for small models that call tools), and reads only `max_tokens`
/// ([`TokenLimitField::MaxTokens`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// `temperature`.
    pub temperature: Option<f32>,
    /// `top_p`.
    pub top_p: Option<f32>,
    /// The most tokens one answer may have, sent as `max_tokens` or as `max_completion_tokens` as the endpoint
    /// wants it ([`OpenAiEndpoint::token_limit_field`]).
    pub max_tokens: Option<u32>,
    /// `seed`, for endpoints that honour it.
    pub seed: Option<i64>,
}

impl OpenAiEndpoint {
    /// An endpoint with no API key and the defaults.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into().trim_end_matches('/').to_string(),
            model: model.into(),
            api_key_env: None,
            headers: Vec::new(),
            sampling: Sampling::default(),
            max_tool_rounds: 8,
            max_tool_calls_per_round: default_max_tool_calls_per_round(),
            stall_timeout: Duration::from_secs(60),
            first_answer_timeout: default_first_answer_timeout(),
            max_retries: 3,
            max_retry_wait: Duration::from_secs(20),
            max_history_bytes: 512 * 1024,
            context_window: None,
            images: false,
            token_limit_field: TokenLimitField::MaxTokens,
        }
    }

    /// The most tool calls of one answer that run (see [`max_tool_calls_per_round`](Self::max_tool_calls_per_round)).
    pub fn max_tool_calls_per_round(mut self, calls: u32) -> Self {
        self.max_tool_calls_per_round = calls;
        self
    }

    /// The request field for the answer's token limit (see [`token_limit_field`](Self::token_limit_field)):
    /// [`TokenLimitField::MaxCompletionTokens`] for OpenAI's reasoning models.
    pub fn token_limit_field(mut self, field: TokenLimitField) -> Self {
        self.token_limit_field = field;
        self
    }

    /// Sends tools' images to the model as image parts (for vision models); see [`images`](Self::images).
    pub fn images(mut self, send: bool) -> Self {
        self.images = send;
        self
    }

    /// Reads the API key from environment variable `name`.
    pub fn api_key_env(mut self, name: impl Into<String>) -> Self {
        self.api_key_env = Some(name.into());
        self
    }

    /// Adds a header to every request (stored in the session's record: no secrets).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The sampling parameters.
    pub fn sampling(mut self, sampling: Sampling) -> Self {
        self.sampling = sampling;
        self
    }

    /// The most rounds of tool calls in one turn.
    pub fn max_tool_rounds(mut self, rounds: u32) -> Self {
        self.max_tool_rounds = rounds;
        self
    }

    /// How long the endpoint may stay silent between two chunks of its answer.
    pub fn stall_timeout(mut self, timeout: Duration) -> Self {
        self.stall_timeout = timeout;
        self
    }

    /// How long the endpoint may stay silent before the first chunk of its answer.
    pub fn first_answer_timeout(mut self, timeout: Duration) -> Self {
        self.first_answer_timeout = timeout;
        self
    }

    /// Retries after `429` and `5xx` (not `501`, `505`), and the longest wait before one.
    pub fn retries(mut self, max_retries: u32, max_wait: Duration) -> Self {
        self.max_retries = max_retries;
        self.max_retry_wait = max_wait;
        self
    }

    /// The history's bound in bytes.
    pub fn max_history_bytes(mut self, bytes: usize) -> Self {
        self.max_history_bytes = bytes;
        self
    }

    /// The model's context window in tokens (see [`context_window`](Self::context_window)).
    pub fn context_window(mut self, tokens: u64) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// The history's bound for this endpoint: [`max_history_bytes`](Self::max_history_bytes), and two bytes per
    /// token of the context window where that is less.
    pub(crate) fn history_bound(&self) -> usize {
        let window = self.context_window.map(|tokens| usize::try_from(tokens.saturating_mul(2)).unwrap_or(usize::MAX));
        window.map_or(self.max_history_bytes, |window| window.min(self.max_history_bytes))
    }

    /// `{base_url}/chat/completions`, as errors name it.
    pub(crate) fn completions_url(&self) -> String {
        format!("{}/chat/completions", self.base_url)
    }
}

impl SessionConfig {
    /// A session whose agent loop the game runs against the OpenAI-compatible endpoint at `base_url` (e.g.
    /// `http://127.0.0.1:11434/v1` for Ollama) with `model`, without an API key. See [`OpenAiEndpoint`] for the
    /// rest.
    pub fn openai(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Self::openai_endpoint(OpenAiEndpoint::new(base_url, model))
    }

    /// A session with the OpenAI-compatible `endpoint`.
    pub fn openai_endpoint(endpoint: OpenAiEndpoint) -> Self {
        Self::new(SessionBackend::OpenAi(endpoint))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_kept_in_a_record_before_the_newer_settings_existed_reads_back_with_their_defaults() {
        let mut stored = serde_json::to_value(OpenAiEndpoint::new("http://127.0.0.1:11434/v1", "m")).expect("JSON");
        let fields = stored.as_object_mut().expect("an object");
        fields.remove("max_tool_calls_per_round");
        fields.remove("token_limit_field");
        let endpoint: OpenAiEndpoint = serde_json::from_value(stored).expect("read back");
        assert_eq!(endpoint, OpenAiEndpoint::new("http://127.0.0.1:11434/v1", "m"));
        assert_eq!((endpoint.max_tool_calls_per_round, endpoint.token_limit_field), (32, TokenLimitField::MaxTokens));
    }
}
