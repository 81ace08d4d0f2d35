//! The OpenAI-compatible backend: the game runs the agent loop itself, in process, against any chat completions
//! endpoint (Ollama, llama.cpp's server, LM Studio, vLLM, the Player2 app, OpenAI), through `async-openai`.
//!
//! - **A turn** ([`turn`]): the session's history, the system prompt and the player's text go to
//!   `POST {base_url}/chat/completions` (streamed, `stream_options.include_usage` unless the endpoint refuses it) with the game's registered
//!   tools as function tools (the schemas the MCP server publishes, without the reserved arguments: this loop never
//!   retries a call itself, and their text would fill a small model's context). Streamed text
//!   becomes chat deltas, one message per request; streamed tool calls are assembled from their fragments and run
//!   one after the other (at most [`OpenAiEndpoint::max_tool_calls_per_round`] of one answer; the model reads an
//!   error for each call past it) in the game through [`AgentHandle`] under the session's conversation (so H1–H14
//!   apply and the status is `WaitingToolResult` while one runs; no MCP credential is used); their results go back as
//!   `tool` messages (errors as `{"error": {"code", "message", "details"}}`, which the model can act on: an
//!   unknown tool or arguments that are not JSON included), and the model is asked again, until it answers
//!   without tool calls or [`OpenAiEndpoint::max_tool_rounds`] is reached
//!   ([`StopReason::MaxTurnRequests`](crate::session::StopReason::MaxTurnRequests)).
//! - **Cancel** drops the request in flight (the connection closes, the endpoint stops generating) or the tool
//!   call running (cancelled in the game), and the turn ends as cancelled. A turn the game stops (past the turn
//!   timeout, or ended with its session) stops the same way, and what it said and did is kept in the history.
//! - **History** is the game's ([`history`]): kept under the game's data directory, written atomically after each
//!   turn, bounded (oldest turns dropped when a turn is saved, and left out of each request), reloaded by `resume`
//!   and by `resume_session` after a restart (one that cannot be read is kept aside, as `history.json.unreadable`,
//!   where the session starts anew).
//! - **Start** ([`probe`]): the endpoint is asked for its model list first, and asked again while it answers
//!   `503` or refuses connections (loading its model), within the session's start timeout.
//! - **Faults**: connection refused and other HTTP failures are `AGENT_UNAVAILABLE` naming the URL; `401`/`403`
//!   names the key's environment variable, with the endpoint's own words (the key hidden where they quote it);
//!   `429` and `5xx` (not `501`, `505`) are retried a bounded number of times honouring `Retry-After` (one that
//!   asks for longer than the retries may wait in all fails at once); an endpoint silent for
//!   [`OpenAiEndpoint::first_answer_timeout`] before its answer, or [`OpenAiEndpoint::stall_timeout`] within it, is
//!   `TIMEOUT` (but an answer that gave its `finish_reason` is complete after
//!   2 s of silence, whether or not `[DONE]` follows); a malformed chunk is `AGENT_UNAVAILABLE` quoting it. A
//!   refusal that says how the server or model is set up (a model without tool support, llama.cpp without
//!   `--jinja`, vLLM without `--enable-auto-tool-choice`, a conversation longer than the model's context) says
//!   what to change; one for the context's length is first asked again, once a round, with the history sent bounded
//!   to half of it (and so, cut as any history over its bound is, to its newest turns within 30% of it); a share
//!   the endpoint took bounds the history from then on, for the rest of the session's run. A failed turn fails
//!   alone: the session stays `Idle` and takes the next text (the endpoint may be back), with the history as it
//!   was before that turn, or, if tool calls ran in it, with them and their results and a line saying the turn
//!   failed: the model then knows what it changed in the world. A refused API key (`401`, `403`) fails the session
//!   (status `Error`): `resume` reconnects, reading the key again.

mod answer_end;
mod chunk;
mod client;
mod config;
mod failures;
mod history;
mod inlined;
mod probe;
mod reasoning_details;
mod roles;
mod text_calls;
mod think_tags;
mod turn;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_openai::config::OpenAIConfig;
use async_openai::Client;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

pub use config::{OpenAiEndpoint, Sampling, TokenLimitField};

use super::backend::{Attached, BackendEvent, BoxFuture, CloseWithin, EventSink, Link, PromptBlock, Setup};
use super::{Backend, Connected};
use crate::agent::AgentHandle;
use crate::error::{ErrorCode, ToolError};
use crate::ids::ConversationId;
use crate::panic::{panic_message, CatchUnwind};
use crate::tool::{OPERATION_ID, TASK_ID};
use history::History;

/// Opens sessions against one endpoint.
pub(crate) struct OpenAiBackend {
    endpoint: OpenAiEndpoint,
    runtime: tokio::runtime::Handle,
}

impl OpenAiBackend {
    pub(crate) fn new(endpoint: OpenAiEndpoint, runtime: tokio::runtime::Handle) -> Self {
        Self { endpoint, runtime }
    }
}

impl Backend for OpenAiBackend {
    fn connect(&self, setup: Setup, sink: EventSink) -> BoxFuture<Result<Connected, ToolError>> {
        let endpoint = self.endpoint.clone();
        let runtime = self.runtime.clone();
        Box::pin(async move {
            let heard = answer_end::Heard::new();
            let client = client::build(&endpoint, setup.timeouts.start, heard.clone())?;
            probe::probe(&endpoint, setup.timeouts.start).await?;
            let history_path = history::path(&setup.session_dir);
            let (history, attached) = open_history(&history_path, &setup, &runtime).await?;
            let shared = Arc::new(Shared {
                endpoint,
                client,
                heard,
                agent: setup.agent,
                conversation: setup.conversation.clone(),
                system_prompt: setup.system_prompt,
                history: Mutex::new(history),
                learned_bound: Mutex::new(None),
                asks_usage: std::sync::atomic::AtomicBool::new(true),
                run_mark: run_mark(),
                history_path,
                sink,
                runtime: runtime.clone(),
            });
            let link = OpenAiLink {
                shared,
                backend_session: setup.conversation.to_string(),
                running: Mutex::new(None),
                stopping: Mutex::new(None),
                runtime,
                close_within: setup.close_within,
            };
            // The system prompt goes as the `system` message of every request.
            Ok((Arc::new(link) as Arc<dyn Link>, attached, true))
        })
    }
}

/// A mark that differs from run to run of a session (random, as std's hash keys are): 8 hex digits.
fn run_mark() -> String {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    format!("{:08x}", random as u32)
}

/// The history to start from: a new session's empty one (written at once, so that `resume_session` finds it),
/// or the stored one of a session being re-attached.
async fn open_history(
    path: &std::path::Path,
    setup: &Setup,
    runtime: &tokio::runtime::Handle,
) -> Result<(History, Attached), ToolError> {
    let io = |error: String| ToolError::with_code(ErrorCode::AgentUnavailable, error);
    if let Some(id) = &setup.resume {
        let file = path.to_path_buf();
        let loaded = runtime.spawn_blocking(move || history::load(&file)).await.map_err(|e| io(e.to_string()))?;
        match loaded {
            Ok(Some(history)) => return Ok((history, Attached::Resumed)),
            Ok(None) if !setup.new_if_unresumable => {
                return Err(crate::session::record::not_found(id).with_detail("agent_error", "no stored history"))
            }
            // Damaged, or not to be trusted (others may write it): its chat cannot be re-attached, as an ACP
            // agent's unknown session cannot.
            Err(error)
                if !setup.new_if_unresumable
                    && matches!(
                        error.kind(),
                        std::io::ErrorKind::InvalidData
                            | std::io::ErrorKind::UnexpectedEof
                            | std::io::ErrorKind::PermissionDenied
                    ) =>
            {
                return Err(ToolError::with_code(
                    ErrorCode::SessionNotFound,
                    format!(
                        "session `{id}`'s stored history at {} is damaged or not used ({error}): its chat cannot \
                         be resumed; create a new session (forget this one to delete it)",
                        path.display()
                    ),
                )
                .with_detail("session", id.as_str())
                .with_detail("agent_error", format!("the stored history is unreadable: {error}")))
            }
            // The file could not be read now (its permissions, the disk): the session is kept for a later try.
            Err(error) if !setup.new_if_unresumable => {
                return Err(io(format!(
                    "could not read session `{id}`'s stored history at {} ({error}): the session is kept, try again",
                    path.display()
                ))
                .with_detail("session", id.as_str()))
            }
            Err(error) => {
                // Kept aside, not written over: a file the game could not read now (its permissions, the disk) may
                // be read later, or by hand.
                let aside = history::aside(path);
                if let Err(moved) = std::fs::rename(path, &aside) {
                    return Err(io(format!(
                        "the stored history at {} is unreadable ({error}) and could not be kept aside as {} \
                         ({moved}): it is left as it is and the session is not resumed",
                        path.display(),
                        aside.display()
                    )));
                }
                tracing::warn!(session = %id, %error, kept = %aside.display(), "the stored history is unreadable: it is kept aside and the session starts anew");
            }
            Ok(None) => {}
        }
    }
    let attached = if setup.resume.is_some() { Attached::Replaced } else { Attached::New };
    let history = History::default();
    let (file, empty) = (path.to_path_buf(), history.clone());
    runtime
        .spawn_blocking(move || history::save(&file, &empty))
        .await
        .map_err(|e| io(e.to_string()))?
        .map_err(|error| io(format!("could not write the session's history at {}: {error}", path.display())))?;
    Ok((history, attached))
}

/// A tool's published arguments schema without the reserved arguments (`operation_id`, `task_id`,
/// `conversation`), in its properties and its required list. They are for clients that retry a call themselves
/// (the same `operation_id` runs once); this loop never does, and their descriptions, about a kilobyte a tool,
/// would fill a small local model's context. A model that sends them anyway is still understood: the host takes
/// them out of the arguments as from any agent's ([`CallRequest::from_wire`](crate::CallRequest::from_wire)).
fn without_reserved(mut schema: Value) -> Value {
    let Some(object) = schema.as_object_mut() else { return schema };
    if let Some(properties) = object.get_mut("properties").and_then(Value::as_object_mut) {
        RESERVED.iter().for_each(|name| drop(properties.remove(*name)));
    }
    if let Some(required) = object.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|name| name.as_str().is_none_or(|name| !RESERVED.contains(&name)));
    }
    schema
}

/// The arguments the transports take out of every call (as `crate::tool::reserved::RESERVED`, whose module is
/// private; `conversation`, the MCP transport's, is named here as text because its constant exists only with the
/// `mcp` feature).
const RESERVED: [&str; 3] = [OPERATION_ID, TASK_ID, "conversation"];

/// What the turns of one connection share.
pub(crate) struct Shared {
    endpoint: OpenAiEndpoint,
    client: Client<OpenAIConfig>,
    /// When `client` last got bytes of an answer.
    heard: answer_end::Heard,
    agent: AgentHandle,
    conversation: ConversationId,
    system_prompt: Option<String>,
    history: Mutex<History>,
    /// The history's share of a request that the endpoint took after refusing a larger one as longer than the
    /// model's context: from then on the history is bounded by it too (this run of the session only), so that
    /// every later turn is not refused once first, and the prompt's start stays the same from turn to turn.
    learned_bound: Mutex<Option<usize>>,
    /// Whether requests ask for the usage (`stream_options.include_usage`): until the endpoint refuses the field
    /// (Mistral's API, which sends the usage anyway), then no more in this run of the session.
    asks_usage: std::sync::atomic::AtomicBool,
    /// This run's mark in the ids given to tool calls that came without one: turn numbers start again after a
    /// restart, and the history the model reads must not hold two calls of one id.
    run_mark: String,
    history_path: PathBuf,
    sink: EventSink,
    runtime: tokio::runtime::Handle,
}

impl Shared {
    /// What the history is bounded by: the endpoint's bound, or less once the endpoint showed it takes less.
    fn history_bound(&self) -> usize {
        let configured = self.endpoint.history_bound();
        self.learned_bound.lock().map_or(configured, |learned| learned.min(configured))
    }

    /// The endpoint took a request whose history was `bytes`, after refusing a larger one as too long.
    fn learn_history_bound(&self, bytes: usize) {
        let mut learned = self.learned_bound.lock();
        *learned = Some(learned.map_or(bytes, |before| before.min(bytes)));
    }

    /// The game's tools as function tools: the schemas the MCP server publishes, without the reserved arguments
    /// ([`without_reserved`]), their nested types inlined ([`inlined`](inlined::inlined)).
    fn tools(&self) -> Vec<Value> {
        self.agent
            .tools()
            .iter()
            .map(|tool| {
                json!({"type": "function", "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": inlined::inlined(crate::tool::flat_root(without_reserved(tool.client_input_schema()))),
                }})
            })
            .collect()
    }

    /// The request for the turn's `messages` so far: system prompt, the history bounded to `history_bytes`
    /// ([`History::fitting`]: a history saved under a larger bound, or before the context window was set, is
    /// bounded here), then them. Also the bytes of history it carries.
    fn request(&self, messages: &[Value], tools: &[Value], history_bytes: usize) -> (Value, usize) {
        let mut all = Vec::new();
        if let Some(prompt) = &self.system_prompt {
            all.push(json!({"role": "system", "content": prompt}));
        }
        let sent_bytes = {
            let history = self.history.lock();
            let sent = history.fitting(history_bytes);
            // Right after the system prompt: its count changes only when turns are dropped (a history is cut well
            // below its bound, `history`), and then the first turn after it changes too, so a server's cached
            // prompt is reused as far as it was anyway.
            if sent.left_out > 0 {
                all.push(json!({"role": "system", "content": format!(
                    "[{} earlier turns of this conversation were dropped to keep the history bounded]",
                    sent.left_out
                )}));
            }
            all.extend(sent.turns.iter().flatten().cloned());
            sent.bytes
        };
        all.extend(messages.iter().cloned());
        // What a request carries of images is bounded too, however many the turn's rounds added.
        history::forget_old_images(all.iter_mut());
        let mut request = json!({
            "model": self.endpoint.model,
            "messages": roles::alternating(all),
            "stream": true,
        });
        if let Value::Object(object) = &mut request {
            if self.asks_usage.load(std::sync::atomic::Ordering::Relaxed) {
                object.insert("stream_options".into(), json!({"include_usage": true}));
            }
            if !tools.is_empty() {
                object.insert("tools".into(), Value::Array(tools.to_vec()));
            }
            let sampling = &self.endpoint.sampling;
            let fields = [
                ("temperature", sampling.temperature.map(|v| json!(v))),
                ("top_p", sampling.top_p.map(|v| json!(v))),
                (self.endpoint.token_limit_field.as_str(), sampling.max_tokens.map(|v| json!(v))),
                ("seed", sampling.seed.map(|v| json!(v))),
            ];
            for (name, value) in fields {
                if let Some(value) = value {
                    object.insert(name.into(), value);
                }
            }
        }
        (request, sent_bytes)
    }

    /// Adds the turn's messages to the history and writes it (durably, before the turn's end is reported). A
    /// write that fails (a full disk) is logged as an error and shown to the player (a `ChatError`,
    /// `HISTORY_NOT_SAVED`), and the turn still ends: the history in memory goes on, and the file keeps the last
    /// one written (what a resume after a restart finds).
    async fn commit(&self, messages: Vec<Value>) {
        let snapshot = {
            let mut history = self.history.lock();
            history.push(messages, self.history_bound());
            history.clone()
        };
        let path = self.history_path.clone();
        let written = self.runtime.spawn_blocking(move || {
            history::save(&path, &snapshot).map_err(|error| format!("{}: {error}", path.display()))
        });
        let failed = match written.await {
            Ok(saved) => saved.err(),
            Err(error) => Some(error.to_string()),
        };
        if let Some(why) = failed {
            tracing::error!(session = %self.conversation, %why, "could not save the session's history");
            // (A session that ended meanwhile, its folder forgotten, shows nothing: the core drops it.)
            (self.sink)(BackendEvent::Notice(ToolError::new(
                "HISTORY_NOT_SAVED",
                format!(
                    "the conversation so far could not be saved ({why}): the agent remembers it until the game \
                     exits, a resume after that starts from the last turn saved"
                ),
            )));
        }
    }
}

struct Running {
    cancel: CancellationToken,
    /// Set before `cancel` when the game (not the player) stops the turn (its time limit, the session's end or
    /// failure): the model is told which.
    killed: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

struct OpenAiLink {
    shared: Arc<Shared>,
    backend_session: String,
    running: Mutex<Option<Running>>,
    /// A killed turn ending (see [`Link::kill`]).
    stopping: Mutex<Option<tokio::task::JoinHandle<()>>>,
    runtime: tokio::runtime::Handle,
    close_within: CloseWithin,
}

impl Link for OpenAiLink {
    fn backend_session(&self) -> &str {
        &self.backend_session
    }

    fn prompt(&self, turn: u64, blocks: Vec<PromptBlock>) -> Result<(), ToolError> {
        let cancel = CancellationToken::new();
        let killed = Arc::new(AtomicBool::new(false));
        let shared = self.shared.clone();
        let (token, by_game) = (cancel.clone(), killed.clone());
        // A turn the session gave up on after its cancel (past the cancel grace) may still be winding down: it
        // ends first (it was cancelled), so that what it keeps lands in the history before this turn reads it.
        let previous = self.running.lock().take().map(|running| running.task);
        let task = self.runtime.spawn(async move {
            if let Some(previous) = previous {
                let _ = previous.await;
            }
            // A panic in the loop (a bug) still ends the turn, `INTERNAL`, rather than leaving it to the turn
            // timeout.
            let running = CatchUnwind(Box::pin(turn::run(shared.clone(), turn, blocks, token, by_game)));
            let event = running.await.unwrap_or_else(|panic| BackendEvent::TurnFailed {
                turn,
                error: ToolError::internal(format!("the turn's loop panicked: {}", panic_message(&*panic))),
            });
            (shared.sink)(event);
        });
        *self.running.lock() = Some(Running { cancel, killed, task });
        Ok(())
    }

    fn cancel(&self) {
        if let Some(running) = self.running.lock().as_ref() {
            running.cancel.cancel();
        }
    }

    fn stop_for_end(&self) {
        if let Some(running) = self.running.lock().as_ref() {
            running.killed.store(true, Ordering::SeqCst);
            running.cancel.cancel();
        }
    }

    fn close(&self, _end_session: bool, within: CloseWithin) -> BoxFuture<()> {
        // The history stays on disk: `resume` continues the conversation. A turn still running ends as a cancel
        // ends it (what was said and done so far is kept, every time), within the close timeout; else it is
        // stopped where it is.
        let running = self.running.lock().take();
        Box::pin(async move {
            let Some(Running { cancel, task, .. }) = running else { return };
            cancel.cancel();
            let abort = task.abort_handle();
            if within.run(task).await.is_none() {
                abort.abort();
            }
        })
    }

    fn kill(&self) {
        // No more requests or tool calls from now (the turn stops at its next step, its tool call cancelled in
        // the game); what it said and did is written to the history, as a cancel writes it, within the close
        // timeout, so that the model knows after a resume what it changed in the world.
        // Now, not when the task below first runs: the turn must not start another request or tool call.
        self.stop_for_end();
        let stopping = self.runtime.spawn(self.close(false, self.close_within.clone()));
        *self.stopping.lock() = Some(stopping);
    }

    fn settled(&self) -> BoxFuture<()> {
        // Asked before `kill` ran (the session's failure kills its link just after recording it): wind the turn
        // down here, as the kill would.
        let stopping = self.stopping.lock().take();
        let winding = stopping.is_none().then(|| self.close(false, self.close_within.clone()));
        Box::pin(async move {
            if let Some(stopping) = stopping {
                let _ = stopping.await;
            }
            if let Some(winding) = winding {
                winding.await;
            }
        })
    }
}
