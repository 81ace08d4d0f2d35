//! One ACP connection, run as a task on the plugin's runtime: set-up (initialize, new or re-attached session),
//! then the session core's commands until it closes or the agent goes away.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, CloseSessionRequest, ContentBlock, HttpHeader, Implementation,
    InitializeRequest, InitializeResponse, LoadSessionRequest, McpServer, McpServerHttp, NewSessionRequest,
    PromptRequest, RequestPermissionRequest, ResumeSessionRequest, SessionId, SessionNotification, SessionUpdate,
    SystemPrompt, TextContent,
};
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{AcpAgent, Agent, Client};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender, WeakUnboundedSender};
use tokio::sync::{oneshot, watch};

use super::auth::SignIn;
use super::ending::{Ending, SignInAgain, TurnAnswer};
use super::updates::{self, Replay};
use super::{quirks, Command};
use crate::error::{ErrorCode, ToolError};
use crate::session::backend::{Attached, BackendEvent, EventSink, PromptBlock, Setup};

/// The connection's end, once it ended: `Some(why)` for a failure (exit status, stderr tail), `Some("")` for a
/// clean end.
pub(crate) type ExitWatch = watch::Receiver<Option<String>>;

/// What set-up opened.
pub(crate) struct Opened {
    pub session: String,
    pub attached: Attached,
    pub system_prompt_sent: bool,
}

/// What set-up waits for: a start that runs out of time names it. A sign-in is not counted against the start's
/// timeout (the person may be signing in in a browser): it has its own.
/// Watched by the start's wait, which works its deadline out again at each change.
pub(crate) type StartStep = Arc<watch::Sender<Step>>;

/// What set-up waits for now, and how long it has spent signing in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Step {
    pub waiting: Waiting,
    /// A sign-in is under way.
    pub signing_in: bool,
    /// The sign-ins that ended, together.
    pub signed_in_for: Duration,
}

/// What set-up waits for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Waiting {
    /// The answer to a request (`initialize`, `session/new`, ...).
    Answer(&'static str),
    /// The end of the history an agent replays after it answered `session/load` (Gemini CLI).
    Replay,
}

impl std::fmt::Display for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Waiting::Answer(request) => write!(f, "no answer to {request}"),
            Waiting::Replay => f.write_str("it answered session/load, then its replay of the history did not end"),
        }
    }
}

/// The first step: the agent is started and asked to `initialize`.
fn first_step() -> StartStep {
    let first = Step { waiting: Waiting::Answer("initialize"), signing_in: false, signed_in_for: Duration::ZERO };
    Arc::new(watch::Sender::new(first))
}

pub(crate) struct Running {
    pub ready: oneshot::Receiver<Result<Opened, ToolError>>,
    pub step: StartStep,
    pub task: tokio::task::JoinHandle<()>,
    pub exit: ExitWatch,
}

/// Waits until the connection ended; returns why it failed, if it did.
pub(crate) async fn wait_exit(mut exit: ExitWatch) -> Option<String> {
    let ended = exit.wait_for(Option::is_some).await.ok()?.clone();
    ended.filter(|why| !why.is_empty())
}

/// Starts the agent and its connection's task.
pub(crate) fn spawn(
    agent: AcpAgent,
    setup: Setup,
    auth_method: Option<String>,
    sink: EventSink,
    runtime: &tokio::runtime::Handle,
) -> (UnboundedSender<Command>, Running) {
    let (commands, inbox) = unbounded_channel();
    let again_to = commands.downgrade();
    let (ready_tx, ready) = oneshot::channel();
    let (exit_tx, exit) = watch::channel(None);
    let replay = Replay::default();
    let step = first_step();
    let stepping = step.clone();
    let task = runtime.spawn({
        let sink = sink.clone();
        let exit = exit.clone();
        let ending = Ending::default();
        async move {
            let (end, gone, asked_to_close) = (ending.clone(), sink.clone(), ending.closing.clone());
            let notifications = sink.clone();
            let permissions = sink.clone();
            let registered = setup.agent.clone();
            let game_session = setup.conversation.clone();
            let replaying = replay.clone();
            let agent_name = AgentName::default();
            let named = agent_name.clone();
            let ours = OurSession::default();
            let (heard_for, asked_for) = (ours.clone(), ours.clone());
            let codex_calls = super::codex::CodexCalls::default();
            let heard_calls = codex_calls.clone();
            let ended = Client
                .v1()
                .name("bevy_agent_tools")
                .on_receive_notification(
                    async move |notification: SessionNotification, _cx| {
                        // An update of another session (one the agent had before a resume started anew, or keeps
                        // beside this one) is not this session's chat.
                        if heard_for.get().is_some_and(|ours| **ours != *notification.session_id.0) {
                            tracing::debug!(session = %notification.session_id, "an update of another session: dropped");
                            return Ok(());
                        }
                        if let SessionUpdate::ToolCall(call) = &notification.update {
                            heard_calls.heard(call);
                        }
                        updates::forward(&notifications, &replaying, notification.update);
                        Ok(())
                    },
                    agent_client_protocol::on_receive_notification!(),
                )
                .on_receive_request(
                    async move |request: RequestPermissionRequest, responder, cx: ConnectionTo<Agent>| {
                        // Another session's request is not this session's player's to answer.
                        if asked_for.get().is_some_and(|ours| **ours != *request.session_id.0) {
                            tracing::warn!(
                                session = %game_session,
                                other = %request.session_id,
                                "the agent asked permission for another session of its own: refused"
                            );
                            let message = format!("session {} is not this connection's", request.session_id);
                            let error = agent_client_protocol::Error::new(
                                agent_client_protocol::ErrorCode::RESOURCE_NOT_FOUND,
                                message,
                            );
                            return responder.respond_with_error(error);
                        }
                        let (reply, decision) = oneshot::channel();
                        let fields = &request.tool_call.fields;
                        let announced = codex_calls.take(&request.tool_call.tool_call_id.0);
                        let tool = fields
                            .title
                            .clone()
                            .or_else(|| fields.name.clone())
                            .or_else(|| announced.clone())
                            .unwrap_or_else(|| request.tool_call.tool_call_id.to_string());
                        let agent = named.get().map(String::as_str);
                        // One of the game's own tools, reached through the game's MCP server: guarded by the
                        // host's rules (H1–H14, its confirmations), not by the permission policy; allowed unless
                        // the player cancelled the turn (the request crossed the cancel).
                        let registered = |name: &str| registered.is_registered(name);
                        let game_tool = updates::is_game_tool(fields, registered)
                            || super::codex::approves_game_tool(&request, agent, announced.as_deref(), registered);
                        let withdrawn = tokio_util::sync::CancellationToken::new();
                        let (kind, input) = updates::kind_and_input(fields);
                        let ask = BackendEvent::Permission {
                            tool: tool.clone(),
                            kind,
                            input,
                            details: updates::permission_details(fields),
                            game_tool,
                            allow_once: updates::can_allow_once(&request.options),
                            reply,
                            withdrawn: withdrawn.clone(),
                        };
                        permissions(ask);
                        let taken_back = responder.cancellation();
                        // The answer may take the player a minute: wait for it outside the dispatch loop.
                        cx.spawn(async move {
                            use crate::session::backend::PermissionDecision;
                            let mut decision = decision;
                            let decision = tokio::select! {
                                biased;
                                decision = &mut decision => decision,
                                // `$/cancel_request`: the prompt is taken down and settled, then the agent is
                                // answered (`cancelled`, as ACP says), so the game hears of it first.
                                () = taken_back.cancelled() => {
                                    tracing::debug!(%tool, "the agent took its permission request back");
                                    withdrawn.cancel();
                                    decision.await
                                }
                            };
                            let decision = decision.unwrap_or(PermissionDecision::Deny);
                            let response = match (game_tool, decision) {
                                (true, PermissionDecision::Allow) => {
                                    tracing::debug!(%tool, "the agent asked permission for a game tool: allowed");
                                    updates::game_tool_response(&request.options)
                                }
                                (_, decision) => updates::permission_response(&request.options, decision),
                            };
                            responder.respond(response)
                        })
                    },
                    agent_client_protocol::on_receive_request!(),
                )
                .connect_with(agent, async move |cx: ConnectionTo<Agent>| {
                    let start =
                        Start { ready: ready_tx, replay, step: stepping, auth_method, agent_name, again_to, ours };
                    let ran = run(cx, setup, inbox, start, Reports { sink, exit, ending }).await;
                    if ran.is_ok() {
                        asked_to_close.store(true, Ordering::SeqCst);
                    }
                    ran
                })
                .await;
            let why = match ended {
                Ok(()) => String::new(),
                Err(error) => describe(&error),
            };
            let _ = exit_tx.send(Some(why.clone()));
            end.ended.store(true, Ordering::SeqCst);
            end.report_exit(&gone, &why);
        }
    });
    (commands, Running { ready, step, task, exit })
}

/// The error's message and what its data carries (for a process that exited: its status and stderr tail),
/// keeping at most the last 2,000 characters.
pub(super) fn describe(error: &agent_client_protocol::Error) -> String {
    let data = match &error.data {
        Some(serde_json::Value::String(data)) => Some(data.clone()),
        Some(serde_json::Value::Null) | None => None,
        Some(other) => Some(other.to_string()),
    };
    let whole = match data {
        Some(data) => format!("{}: {}", error.message.trim(), data.trim()),
        None => error.message.trim().to_string(),
    };
    let chars: Vec<char> = whole.chars().collect();
    match chars.len().checked_sub(2000) {
        Some(start) if start > 0 => format!("…{}", chars[start..].iter().collect::<String>()),
        _ => whole,
    }
}

/// Whether `error` says the agent's side of the connection is gone (it exited or closed its output).
pub(super) fn agent_gone(error: &agent_client_protocol::Error) -> bool {
    agent_client_protocol::is_connection_terminated(error) || agent_client_protocol::is_incoming_transport_closed(error)
}

/// Whether the agent's answer to `session/resume` or `session/load` says it does not know the session: ACP's
/// `-32002` (resource not found), or, from agents that use another code, words that say the session was not found
/// (not any "not found": an API key, a model or a method not found is the agent's own trouble), in the error's
/// message or in its data: agents built on ACP's TypeScript SDK answer a thrown "Session not found" with `-32603`
/// "Internal error", their own words in `data` (as a string, or a string field of an object). Codex and Gemini
/// CLI keep no session before its first prompt, and say so in words of their own: Codex's "no rollout found for
/// thread id …" (also for a thread it never had), Gemini's "No previous sessions found for this project." (none
/// at all) and "Invalid session identifier …".
fn unknown_session(error: &agent_client_protocol::Error) -> bool {
    const THEIR_WORDS: [&str; 4] =
        ["no rollout found", "thread not found", "no previous sessions found", "invalid session identifier"];
    let says_so = |text: &str| {
        let text = text.to_ascii_lowercase();
        text.contains("session") && (text.contains("not found") || text.contains("unknown"))
            || THEIR_WORDS.iter().any(|words| text.contains(words))
    };
    let data = match &error.data {
        Some(serde_json::Value::String(text)) => vec![text.as_str()],
        Some(serde_json::Value::Object(fields)) => fields.values().filter_map(serde_json::Value::as_str).collect(),
        _ => Vec::new(),
    };
    error.code == agent_client_protocol::ErrorCode::RESOURCE_NOT_FOUND
        || says_so(&error.message)
        || data.into_iter().any(says_so)
}

pub(super) fn unavailable(what: &str, error: &agent_client_protocol::Error) -> ToolError {
    ToolError::with_code(ErrorCode::AgentUnavailable, format!("{what}: {}", describe(error)))
}

/// Where a turn's end is reported, the connection's end, and who reports an end nobody asked for.
struct Reports {
    sink: EventSink,
    exit: ExitWatch,
    ending: Ending,
}

/// What set-up reports to and goes by: where its outcome goes, the replay of a loaded session, the step it waits
/// for, and the sign-in method the game chose.
struct Start {
    ready: oneshot::Sender<Result<Opened, ToolError>>,
    replay: Replay,
    step: StartStep,
    auth_method: Option<String>,
    agent_name: AgentName,
    /// The connection's commands, for a sign-in a turn's answer asks to make again ([`SignInAgain`]); weak, so
    /// that the connection still ends when its link lets go.
    again_to: WeakUnboundedSender<Command>,
    ours: OurSession,
}

/// The agent's name, from its answer to `initialize` (some requests are read as one agent sends them).
type AgentName = Arc<std::sync::OnceLock<String>>;

/// The agent's id of the session this connection serves, once it is open: updates of other ids are dropped.
type OurSession = Arc<std::sync::OnceLock<String>>;

async fn run(
    cx: ConnectionTo<Agent>,
    setup: Setup,
    mut inbox: UnboundedReceiver<Command>,
    Start { ready, replay, step, auth_method, agent_name, again_to, ours }: Start,
    Reports { sink, exit, ending }: Reports,
) -> Result<(), agent_client_protocol::Error> {
    let opened = match open(&cx, &setup, auth_method.as_deref(), &replay, &step, &agent_name).await {
        Ok(opened) => opened,
        Err(error) => {
            let _ = ready.send(Err(error));
            return Ok(());
        }
    };
    let session = SessionId::new(opened.session.clone());
    let _ = ours.set(opened.session.clone());
    let can_close = opened.can_close;
    let sign_in = opened.sign_in;
    let again = auth_method.clone().map(|method| SignInAgain { commands: again_to, method });
    let (agent, conversation) = (setup.agent.clone(), setup.conversation.clone());
    let _ = ready.send(Ok(Opened {
        session: opened.session,
        attached: opened.attached,
        system_prompt_sent: opened.system_prompt_sent,
    }));
    while let Some(command) = inbox.recv().await {
        match command {
            Command::Prompt { turn, blocks } => {
                // Whatever a loaded session's replay still sends after this is the turn's.
                replay.stop();
                let mut prompt: Vec<ContentBlock> = blocks
                    .into_iter()
                    .map(|PromptBlock::Text(text)| ContentBlock::Text(TextContent::new(text)))
                    .collect();
                // Agents run a prompt that starts with `/` as a command of their own (Claude's adapter: `/init`
                // writes files; Gemini CLI, which joins the blocks, also `$`: `/extensions install` installs
                // code): the player's words (which a game may take from anyone) are never one.
                let first = prompt.first().and_then(|block| match block {
                    ContentBlock::Text(text) => Some(text.text.trim_start()),
                    _ => None,
                });
                if first.is_some_and(|text| text.starts_with(['/', '$'])) {
                    let said = "[The player's message, word for word; not a command for you:]";
                    prompt.insert(0, ContentBlock::Text(TextContent::new(said)));
                }
                let answer =
                    TurnAnswer::new(turn, sink.clone(), exit.clone(), ending.clone(), sign_in.clone(), again.clone());
                // Reported in the connection's order (the dispatch of what the agent sends next waits for it): the
                // callback is registered before the request goes out (`prepare_request`; a request sent first could
                // be answered before the order is asked for).
                let sent = cx.prepare_request(PromptRequest::new(session.clone(), prompt)).on_receiving_result(
                    move |result| {
                        answer.report(result);
                        std::future::ready(Ok(()))
                    },
                );
                if let Err(error) = sent {
                    // The connection is ending: the dropped answer reports the agent's end.
                    tracing::debug!(error = %describe(&error), "the prompt could not be sent");
                }
            }
            Command::Cancel { by_player } => {
                cx.send_notification(CancelNotification::new(session.clone()))?;
                // The turn's tool calls running in the game stop too (the agent reads `CANCELLED` as their result),
                // as an OpenAI-compatible session's do: the world does not go on changing after the player's stop.
                if by_player {
                    let stopped = agent.host().cancel_calls(&conversation, None, "the player cancelled the turn");
                    tracing::debug!(%conversation, stopped, "the cancelled turn's tool calls were cancelled");
                }
            }
            Command::SignInAgain => {
                let Some(method) = auth_method.as_deref() else { continue };
                // Before the next prompt, which is queued after this: the agent takes it signed in.
                let timeout = setup.timeouts.sign_in;
                match tokio::time::timeout(timeout, sign_in.authenticate(&cx, method)).await {
                    Ok(Ok(())) => {
                        tracing::info!(method, "signed in to the agent again, as it asked during the session")
                    }
                    Ok(Err(error)) => sink(BackendEvent::Notice(error)),
                    Err(_) => sink(BackendEvent::Notice(ToolError::with_code(
                        ErrorCode::AgentUnavailable,
                        format!("signing in to the agent again with `{method}` took longer than {timeout:?}"),
                    ))),
                }
            }
            Command::Close { end_session, within } => {
                if end_session && can_close {
                    let closed = cx.send_request(CloseSessionRequest::new(session.clone())).block_task();
                    if within.run(closed).await.is_none() {
                        tracing::debug!(?within, "the agent did not answer session/close in time");
                    }
                }
                return Ok(());
            }
        }
    }
    Ok(())
}

struct Open {
    session: String,
    attached: Attached,
    system_prompt_sent: bool,
    can_close: bool,
    sign_in: SignIn,
}

/// `initialize`, then a new session or a re-attached one.
async fn open(
    cx: &ConnectionTo<Agent>,
    setup: &Setup,
    auth_method: Option<&str>,
    replay: &Replay,
    step: &StartStep,
    agent_name: &AgentName,
) -> Result<Open, ToolError> {
    let at = |request: &'static str| step.send_modify(|step| step.waiting = Waiting::Answer(request));
    at("initialize");
    // No `fs`, no `terminal`: the agent gets no access to the player's machine through the game.
    let initialize = InitializeRequest::new(ProtocolVersion::V1)
        .client_capabilities(ClientCapabilities::new())
        .client_info(Implementation::new("bevy_agent_tools", env!("CARGO_PKG_VERSION")));
    let info: InitializeResponse =
        cx.send_request(initialize).block_task().await.map_err(|error| unavailable("initialize failed", &error))?;
    if let Some(agent) = &info.agent_info {
        let _ = agent_name.set(agent.name.clone());
    }
    let sign_in = SignIn::new(info.auth_methods.clone());
    // Signed in only when the agent asks for it: a sign-in replaces the login the person may have (Codex's stored
    // ChatGPT login, Gemini's chosen method).
    match (attach(cx, setup, &info, &sign_in, replay, step).await, auth_method) {
        (Err(error), Some(chosen)) if SignIn::asked_in(&error) => {
            at("authenticate");
            let since = Instant::now();
            step.send_modify(|step| step.signing_in = true);
            let signed_in = tokio::time::timeout(setup.timeouts.sign_in, sign_in.authenticate(cx, chosen)).await;
            step.send_modify(|step| {
                step.signing_in = false;
                step.signed_in_for += since.elapsed();
            });
            let signed_in = signed_in.map_err(|_| {
                let after = setup.timeouts.sign_in;
                ToolError::with_code(
                    ErrorCode::AgentUnavailable,
                    format!("signing in to the agent with `{chosen}` did not finish within {after:?}"),
                )
                .with_detail("auth_method", chosen)
            })?;
            signed_in?;
            attach(cx, setup, &info, &sign_in, replay, step).await
        }
        (attached, _) => attached,
    }
}

/// A new session, or the one `setup` re-attaches.
async fn attach(
    cx: &ConnectionTo<Agent>,
    setup: &Setup,
    info: &InitializeResponse,
    sign_in: &SignIn,
    replay: &Replay,
    step: &StartStep,
) -> Result<Open, ToolError> {
    let at = |request: &'static str| step.send_modify(|step| step.waiting = Waiting::Answer(request));
    let refused = |what: &str, error: &agent_client_protocol::Error| {
        sign_in.required(error).unwrap_or_else(|| unavailable(what, error))
    };
    let capabilities = &info.agent_capabilities;
    if !capabilities.mcp_capabilities.http {
        return Err(ToolError::with_code(
            ErrorCode::AgentUnavailable,
            "the agent does not accept HTTP MCP servers (mcpCapabilities.http), so it cannot reach the game's tools",
        ));
    }
    let endpoint = setup.require_mcp()?;
    let servers = vec![McpServer::Http(
        McpServerHttp::new(updates::GAME_SERVER, endpoint.url.clone())
            .headers(vec![HttpHeader::new("Authorization", format!("Bearer {}", endpoint.credential))]),
    )];
    let cwd = setup.working_directory.clone();
    let can_close = capabilities.session_capabilities.close.is_some();
    let takes_system_prompt = capabilities.session_capabilities.system_prompt.is_some();
    let system_prompt = setup
        .system_prompt
        .as_ref()
        .filter(|_| takes_system_prompt)
        .map(|prompt| SystemPrompt::new(vec![ContentBlock::Text(TextContent::new(prompt.clone()))]));
    let agent_name = info.agent_info.as_ref().map(|agent| agent.name.as_str());
    // An agent that takes it otherwise (Claude's, in `_meta`) gets it there.
    let untaken = setup.system_prompt.as_deref().filter(|_| !takes_system_prompt);
    let (meta, carried_in_meta) = quirks::session_meta(agent_name, untaken);
    let system_prompt_sent = system_prompt.is_some() || carried_in_meta;

    if let Some(id) = &setup.resume {
        let session = SessionId::new(id.clone());
        let resumed = if capabilities.session_capabilities.resume.is_some() {
            at("session/resume");
            let request = ResumeSessionRequest::new(session, cwd.clone())
                .mcp_servers(servers.clone())
                .system_prompt(system_prompt.clone())
                .meta(meta.clone());
            Some(cx.send_request(request).block_task().await.map(|_| Attached::Resumed))
        } else if capabilities.load_session {
            // The agent replays the history as updates, before it answers or (Gemini CLI) after: not shown as new
            // chat, until the first prompt is sent (or the load failed).
            at("session/load");
            replay.start();
            let request = LoadSessionRequest::new(session, cwd.clone())
                .mcp_servers(servers.clone())
                .system_prompt(system_prompt.clone())
                .meta(meta.clone());
            let loaded = cx.send_request(request).block_task().await.map(|_| Attached::Loaded);
            match loaded {
                // What it still replays after answering (Gemini CLI replays then) is let pass first.
                Ok(_) => {
                    step.send_modify(|step| step.waiting = Waiting::Replay);
                    replay.quiet(updates::REPLAY_QUIET, updates::REPLAY_LIMIT).await
                }
                Err(_) => replay.stop(),
            }
            Some(loaded)
        } else {
            None
        };
        match resumed {
            Some(Ok(attached)) => {
                let sign_in = sign_in.clone();
                return Ok(Open { session: id.clone(), attached, system_prompt_sent, can_close, sign_in });
            }
            Some(Err(error)) if agent_gone(&error) => {
                return Err(unavailable("the agent stopped while re-attaching the session", &error))
            }
            // The agent does not know the session (in its message or, as TypeScript agents say it, its data): the
            // caller may start anew (`Replaced`), or it is `SESSION_NOT_FOUND`.
            Some(Err(error)) if unknown_session(&error) && setup.new_if_unresumable => {
                let why = describe(&error);
                tracing::warn!(session = %id, %why, "the agent no longer knows the session: it is replaced");
            }
            Some(Err(error)) if unknown_session(&error) => {
                return Err(crate::session::record::not_found(id).with_detail("agent_error", describe(&error)))
            }
            // The agent's own trouble (auth, rate limit, a failure inside it) says nothing about the session: it
            // is not reported unknown, so a retry can still re-attach it.
            Some(Err(error)) => return Err(refused("the agent could not re-attach the session", &error)),
            None if !setup.new_if_unresumable => {
                return Err(crate::session::record::not_found(id)
                    .with_detail("agent_error", "the agent can neither resume nor load sessions"))
            }
            None => {}
        }
    }
    at("session/new");
    let request = NewSessionRequest::new(cwd).mcp_servers(servers).system_prompt(system_prompt).meta(meta);
    let created = cx.send_request(request).block_task().await.map_err(|error| refused("session/new failed", &error))?;
    let attached = if setup.resume.is_some() { Attached::Replaced } else { Attached::New };
    let sign_in = sign_in.clone();
    Ok(Open { session: created.session_id.to_string(), attached, system_prompt_sent, can_close, sign_in })
}

#[cfg(test)]
mod tests {
    use agent_client_protocol::Error;

    use super::unknown_session;

    #[test]
    fn only_an_answer_about_the_session_counts_as_an_unknown_session() {
        assert!(unknown_session(&Error::new(-32002, "resource not found")));
        assert!(unknown_session(&Error::new(-32603, "Session sess-1 not found")));
        assert!(unknown_session(&Error::new(-32602, "unknown session id")));
        for trouble in ["API key not found", "Method not found", "model not found", "provider overloaded"] {
            assert!(!unknown_session(&Error::new(-32603, trouble)), "{trouble}");
            let in_data = Error::new(-32603, "Internal error").data(serde_json::json!({ "details": trouble }));
            assert!(!unknown_session(&in_data), "{trouble} in data");
        }
    }

    #[test]
    fn an_unknown_session_said_only_in_the_errors_data_as_typescript_agents_say_it_counts() {
        let internal = || Error::new(-32603, "Internal error");
        assert!(unknown_session(&internal().data(serde_json::json!("Session sess-1 not found"))));
        assert!(unknown_session(&internal().data(serde_json::json!({ "details": "Session not found: sess-1" }))));
        assert!(!unknown_session(&internal()), "a bare internal error says nothing about the session");
        assert!(!unknown_session(&internal().data(serde_json::json!(["session not found"]))), "only text is read");
    }

    #[test]
    fn codex_and_gemini_words_for_a_session_they_never_kept_count_as_an_unknown_session() {
        // What codex-acp and Gemini CLI answer `session/resume` / `session/load` for a session that had no prompt
        // (they keep none before it) or that they do not know, through ACP's TypeScript SDK.
        let said = [
            "no rollout found for thread id 019ee0dd-6f13-7043-995f-d88646e16316",
            "thread/resume failed: no rollout found for thread id abc",
            "No previous sessions found for this project.",
            "Invalid session identifier \"3f2a\". Use --list-sessions to see available sessions.",
        ];
        for words in said {
            let in_data = Error::new(-32603, "Internal error").data(serde_json::json!({ "details": words }));
            assert!(unknown_session(&in_data), "{words}");
            assert!(unknown_session(&Error::new(-32600, words)), "{words}");
        }
    }
}
