//! The start-up probe: `GET {base_url}/models` before a session is created or re-attached, so that an endpoint
//! that is not there, or refuses the key, fails `create` rather than the first turn.
//!
//! Other answers are fine (some servers have no such route), except two that mean "not yet", which are asked
//! again every [`POLL`] until the endpoint answers otherwise or the session's start timeout has passed:
//! - `503`: llama.cpp's server answers every route so (`Loading model`) until its model has loaded;
//! - a refused connection: nothing listens yet. vLLM and older llama.cpp servers listen only once their model has
//!   loaded, so a game that starts its own server and then creates a session meets this first.

use std::time::Duration;

use super::config::OpenAiEndpoint;
use super::{client, failures};
use crate::error::{ErrorCode, ToolError};

/// How often the endpoint is asked again while it is not ready.
const POLL: Duration = Duration::from_millis(500);

/// Why the endpoint is asked again.
#[derive(Clone, Copy, PartialEq, Eq)]
enum NotYet {
    /// It answered `503`.
    Loading,
    /// Nothing accepted the connection.
    NotListening,
}

/// Asks the endpoint until it is there and accepts the key, within `start`.
pub(super) async fn probe(endpoint: &OpenAiEndpoint, start: Duration) -> Result<(), ToolError> {
    let deadline = crate::deadline::after_tokio(tokio::time::Instant::now(), start);
    let http = reqwest::Client::builder()
        .build()
        .map_err(|error| ToolError::internal(format!("could not build the HTTP client: {error}")))?;
    let key = client::api_key(endpoint)?;
    // The last "not yet" and its words, for the error if the start timeout passes.
    let mut last: Option<(NotYet, ToolError)> = None;
    loop {
        let mut request = http.get(format!("{}/models", endpoint.base_url));
        if let Some(key) = &key {
            request = request.bearer_auth(key);
        }
        for (name, value) in &endpoint.headers {
            request = request.header(name.as_str(), value.as_str());
        }
        // Sent, and a refusal's body read, within the start timeout.
        let asked = async {
            match request.send().await {
                // The endpoint's own words (OpenAI's "Incorrect API key provided", a proxy's "key expired").
                Ok(response) if matches!(response.status().as_u16(), 401 | 403 | 503) => {
                    let loading = (response.status().as_u16() == 503).then_some(NotYet::Loading);
                    Err((loading, failures::describe(endpoint, client::refused(response).await)))
                }
                Ok(_) => Ok(()),
                Err(error) => {
                    let not_listening = is_refused(&error).then_some(NotYet::NotListening);
                    Err((not_listening, failures::describe(endpoint, async_openai::error::OpenAIError::Reqwest(error))))
                }
            }
        };
        let Ok(answer) = tokio::time::timeout_at(deadline, asked).await else {
            return Err(last.map_or_else(|| silent(endpoint, start), |(why, said)| gave_up(why, said, start)));
        };
        match answer {
            Err((Some(why), said)) => {
                if deadline.saturating_duration_since(tokio::time::Instant::now()) <= POLL {
                    return Err(gave_up(why, said, start));
                }
                tracing::debug!(url = %endpoint.base_url, message = %said.message, "the endpoint is not ready yet");
                last = Some((why, said));
                tokio::time::sleep(POLL).await;
            }
            Err((None, said)) => return Err(said),
            Ok(()) => return Ok(()),
        }
    }
}

/// Whether nothing accepted the connection (the cause reqwest keeps in its error's sources).
fn is_refused(error: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(cause) = source {
        if cause.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused) {
            return true;
        }
        source = cause.source();
    }
    false
}

fn silent(endpoint: &OpenAiEndpoint, start: Duration) -> ToolError {
    ToolError::with_code(ErrorCode::AgentUnavailable, format!("{} did not answer within {start:?}", endpoint.base_url))
}

/// The endpoint was still not ready when the start timeout ran out (`said` is its last answer, described).
fn gave_up(why: NotYet, said: ToolError, start: Duration) -> ToolError {
    let message = match why {
        NotYet::Loading => format!(
            "{} It was still not ready after {start:?} (a server answers so while it loads its model): for a large \
             model, raise `SessionTimeouts::start`",
            said.message
        ),
        NotYet::NotListening => format!(
            "{} Nothing accepted a connection there for {start:?}: check that the server runs at this address and \
             port (some, such as vLLM, listen only once their model has loaded: for a large model, raise \
             `SessionTimeouts::start`)",
            said.message
        ),
    };
    ToolError { message, ..said }
}
