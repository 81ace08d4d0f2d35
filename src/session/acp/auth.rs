//! Signing in to an ACP agent. Agents that need a sign-in (Codex's adapter without a stored login, Gemini CLI
//! before one was chosen, Claude's adapter without a login) answer `session/new` or the first prompt with ACP's
//! `auth_required` (`-32000`) and list the methods they offer in `initialize`. The game never picks one on its
//! own (a method may open a browser, or bill an API key): when the agent asks, it signs in with the method the game
//! chose ([`SessionConfig::auth_method`](crate::session::SessionConfig::auth_method)) and asks for the session
//! again (for a turn, it refuses the turn saying so and signs in before the next one), and otherwise tells the player
//! what the agent offers and how to sign in. It never signs in unasked: a
//! sign-in replaces the login the person already has (Codex's stored ChatGPT login).

use agent_client_protocol::v1::schema::{AuthMethod, AuthenticateRequest, AuthenticateResponse};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::Agent;

use crate::error::{ErrorCode, ToolError};

/// The sign-in methods an agent offered in `initialize`.
#[derive(Clone, Debug, Default)]
pub(crate) struct SignIn {
    offered: Vec<AuthMethod>,
}

impl SignIn {
    pub(crate) fn new(offered: Vec<AuthMethod>) -> Self {
        Self { offered }
    }

    /// Signs in with `chosen`, which must be a method the agent offered that the game can use (not one run in a
    /// terminal by the person).
    pub(crate) async fn authenticate(&self, cx: &ConnectionTo<Agent>, chosen: &str) -> Result<(), ToolError> {
        let method = self.offered.iter().find(|method| method.id().0.as_ref() == chosen);
        match method {
            None => {
                return Err(self
                    .error(format!("the agent offers no sign-in method `{chosen}`"))
                    .with_detail("auth_method", chosen))
            }
            Some(AuthMethod::Terminal(terminal)) => {
                let how = std::iter::once("the agent's command").chain(terminal.args.iter().map(String::as_str));
                let how = how.collect::<Vec<_>>().join(" ");
                return Err(self
                    .error(format!(
                        "`{chosen}` is a sign-in the person runs in a terminal ({how}), which the game cannot do: \
                         sign in there once"
                    ))
                    .with_detail("auth_method", chosen));
            }
            Some(_) => {}
        }
        let request = AuthenticateRequest::new(chosen.to_string());
        let answer: Result<AuthenticateResponse, _> = cx.send_request(request).block_task().await;
        answer.map(|_| ()).map_err(|error| {
            let said = error.message.trim();
            let data = error.data.as_ref().map(|data| format!(": {data}")).unwrap_or_default();
            ToolError::with_code(
                ErrorCode::AgentUnavailable,
                format!("signing in to the agent with `{chosen}` failed ({said}{data})"),
            )
            .with_detail("auth_method", chosen)
        })
    }

    /// The error for an agent's answer that it needs a sign-in, or `None` for any other error. The agent's own
    /// words go with it where it said more than ACP's default (Claude's adapter says why a login cannot be used).
    pub(crate) fn required(&self, error: &agent_client_protocol::Error) -> Option<ToolError> {
        self.asked(error).map(|what| self.error(what))
    }

    /// What the agent said asking for a sign-in, or `None` if `error` is not that.
    pub(crate) fn asked(&self, error: &agent_client_protocol::Error) -> Option<String> {
        if error.code != agent_client_protocol::ErrorCode::AUTH_REQUIRED {
            return None;
        }
        let said = error.message.trim();
        let said = (!said.is_empty() && !said.eq_ignore_ascii_case("authentication required")).then_some(said);
        let data = error.data.as_ref().filter(|data| !data.is_null()).map(|data| match data {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        });
        let words: Vec<String> = said.map(str::to_string).into_iter().chain(data).collect();
        Some(match words.is_empty() {
            true => "the agent needs you to sign in (ACP auth_required)".to_string(),
            false => format!("the agent needs you to sign in (ACP auth_required: {})", words.join(": ")),
        })
    }

    /// Whether `error` is the agent asking for a sign-in ([`required`](Self::required)).
    pub(crate) fn asked_in(error: &ToolError) -> bool {
        error.details.extra.get("auth_required") == Some(&serde_json::Value::Bool(true))
    }

    /// `what` went wrong, then what the agent offers and how to sign in.
    fn error(&self, what: String) -> ToolError {
        let how = "sign in once with the agent's own command line (for example `codex login`, or `gemini` and pick \
                   a method), or have the game sign in with one of the agent's methods: \
                   SessionConfig::auth_method (the sandbox's --agent-auth ID)";
        let message = match self.offered.is_empty() {
            true => format!("{what}; it offers no sign-in method through ACP: sign in with its own command line"),
            false => format!("{what}; it offers {}: {how}", self.listed()),
        };
        let ids: Vec<String> = self.offered.iter().map(|method| method.id().to_string()).collect();
        ToolError::with_code(ErrorCode::AgentUnavailable, message)
            .with_detail("auth_required", true)
            .with_detail("auth_methods", ids)
    }

    /// The methods offered, as `` `id` (name: description)``.
    fn listed(&self) -> String {
        let one = |method: &AuthMethod| {
            let terminal = if matches!(method, AuthMethod::Terminal(_)) { ", in a terminal" } else { "" };
            match method.description() {
                Some(description) => format!("`{}` ({}{terminal}: {description})", method.id(), method.name()),
                None => format!("`{}` ({}{terminal})", method.id(), method.name()),
            }
        };
        self.offered.iter().map(one).collect::<Vec<_>>().join(", ")
    }
}
