//! One turn of the agent loop the game runs: the history and the player's text go to the endpoint with the game's
//! tools; streamed text becomes chat; streamed tool calls (assembled from their fragments) run in the game
//! through [`AgentHandle`](crate::AgentHandle) under the session's conversation, so the host's rules apply and the
//! status is `WaitingToolResult` while they run; their results go back; until the model stops, or the round limit.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_openai::types::stream::StreamResponse;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::chunk::Chunk;
use super::failures::{describe, in_stream, too_long};
use super::Shared;
use crate::call::{CallOutcome, CallRequest};
use crate::error::{ErrorCode, ToolError};
use crate::session::backend::{BackendEvent, PromptBlock, StopReason, Usage};

/// A tool call as its fragments arrive.
#[derive(Debug, Default)]
struct PendingCall {
    index: usize,
    id: String,
    name: String,
    arguments: String,
    /// Sent back with the call as it came (Gemini's thought signature).
    extra_content: Option<Value>,
}

/// How long a streamed answer that gave its `finish_reason` may stay silent before it is taken as complete.
const AFTER_FINISH: std::time::Duration = std::time::Duration::from_secs(2);
/// The most a streamed answer may hold (its text, its calls' names and arguments), as for a whole one.
const ANSWER_LIMIT: usize = super::client::WHOLE_ANSWER_LIMIT;
/// The most tool calls one answer may ask for (those past
/// [`max_tool_calls_per_round`](super::OpenAiEndpoint::max_tool_calls_per_round) are answered `BUSY`, unrun, and
/// each answer is a message of the history).
pub(crate) const MAX_CALLS_PER_ANSWER: usize = 256;

/// How one request's answer ended.
enum RoundEnd {
    Done {
        text: String,
        calls: Vec<PendingCall>,
        finish: Option<String>,
        reasoning: Reasoning,
    },
    Cancelled {
        text: String,
    },
    /// The endpoint refused the request as longer than the model's context (the error says what to set).
    TooLong(ToolError),
    /// The endpoint refused the request's `stream_options`, which requests no longer carry: asked again.
    WithoutStreamOptions,
}

/// A reasoning model's thinking in one answer (`reasoning_content` as llama.cpp's server, DeepSeek and Kimi send
/// it, or `reasoning` as Ollama, Groq and newer vLLM do: the first of the two the answer used, so that a server
/// sending both is read once). Never shown. Sent back with the tool calls it led to when it came as
/// `reasoning_content` (and OpenRouter's `reasoning_details` as they came): DeepSeek's and Kimi's thinking modes
/// refuse a tool call's message without it, Gemini's through OpenRouter without its blocks, and
/// llama.cpp gives it to the templates of models trained to see it there (gpt-oss). Never as `reasoning`, which
/// Groq refuses in a request. An answer without tool calls keeps only its text (DeepSeek's reasoner refuses
/// reasoning elsewhere).
#[derive(Default)]
struct Reasoning {
    field: Option<&'static str>,
    text: String,
    /// Thinking the answer's text held, apart: never sent back, whatever `field` says.
    tagged: String,
    /// OpenRouter's reasoning blocks: sent back with the answer's tool calls, as they came.
    details: super::reasoning_details::ReasoningDetails,
}

impl Reasoning {
    /// Adds what `delta` brings of it; returns the bytes added. An empty piece still says which field the
    /// endpoint uses (DeepSeek's thinking mode streams `reasoning_content: ""` when it thought nothing, and refuses
    /// that answer's tool calls sent back without the field), unless another field brought thinking already.
    fn add(&mut self, delta: &super::chunk::Delta) -> Result<usize, super::reasoning_details::TooManyBlocks> {
        let pieces = [("reasoning_content", &delta.reasoning_content), ("reasoning", &delta.reasoning)];
        let mut added = 0;
        for (field, piece) in pieces {
            let Some(piece) = piece.as_deref() else { continue };
            // Until thinking came, the field is the one that brought some (or DeepSeek's empty one).
            let says_field = !piece.is_empty() || (field == "reasoning_content" && self.field.is_none());
            if self.text.is_empty() && says_field {
                self.field = Some(field);
            }
            if !piece.is_empty() && self.field == Some(field) {
                self.text.push_str(piece);
                added += piece.len();
            }
        }
        added += self.details.add(&delta.reasoning_details)?;
        Ok(added)
    }

    /// Adds thinking the answer's text held ([`ThinkTags`](super::think_tags::ThinkTags)): never sent back (the
    /// chat templates of such models leave earlier thinking out).
    fn thought(&mut self, thought: &str) {
        if !thought.trim().is_empty() || !self.tagged.is_empty() {
            self.tagged.push_str(thought);
        }
    }

    fn any(&self) -> bool {
        !self.text.is_empty() || !self.tagged.is_empty()
    }
}

/// Runs turn `turn` to its end and says how it ended. The history gets the turn once it ended (or was cancelled:
/// what was said and done so far, every tool call with its result). A failed turn leaves the history as it was,
/// unless tool calls ran in it: the world may have changed, so they are kept with their results, followed by a
/// line saying the turn failed and why (as the model's own, which every chat template accepts after tool results).
///
/// A turn the endpoint failed (a refusal, a rate limit past its retries, a broken or silent stream, an answer
/// that cannot be used) fails alone: the session takes the next text, with the history as above. A refusal of the
/// key (`401`, `403`, Gemini's `400`) fails the session: its client holds the key, and `resume` reads it again.
pub(crate) async fn run(
    shared: Arc<Shared>,
    turn: u64,
    blocks: Vec<PromptBlock>,
    cancel: CancellationToken,
    killed: Arc<AtomicBool>,
) -> BackendEvent {
    // Each block is its own user message: the player's text word for word, the game's additions apart.
    let mut messages: Vec<Value> =
        blocks.into_iter().map(|PromptBlock::Text(text)| json!({"role": "user", "content": text})).collect();
    match drive(&shared, turn, &mut messages, &cancel, &killed).await {
        Ok(stop) => {
            shared.commit(messages).await;
            BackendEvent::TurnEnded { turn, stop }
        }
        Err(error) => {
            if messages.iter().any(|message| message["role"] == "tool") {
                messages.push(json!({"role": "assistant", "content": failed_note(&error)}));
                shared.commit(messages).await;
            }
            if error.details.extra.get(super::failures::KEY_REFUSED) == Some(&Value::Bool(true)) {
                BackendEvent::TurnFailed { turn, error }
            } else {
                BackendEvent::TurnRefused { turn, error }
            }
        }
    }
}

/// A call's arguments as the history keeps them (and every later request sends them): the JSON object the model
/// wrote, re-serialised, or `{}` for anything else (`{by: 1`, an empty string, an array). Endpoints parse the
/// arguments of the calls in a request's history, and Ollama refuses the whole request (400 "invalid tool call
/// arguments") for one that is not an object, so a small model's typo would fail every later turn. The model
/// still reads, in the call's result, why it did not run.
fn kept_arguments(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(object @ Value::Object(_)) => object.to_string(),
        _ => "{}".to_string(),
    }
}

/// What the player is told when the model's answer was its reasoning alone, cut at the token limit.
fn thought_to_the_limit(endpoint: &super::OpenAiEndpoint) -> ToolError {
    let limit = match endpoint.sampling.max_tokens {
        Some(tokens) => format!("its token limit ({tokens}, `Sampling::max_tokens`)"),
        None => "the endpoint's token limit".to_string(),
    };
    ToolError::new(
        "NO_ANSWER",
        format!(
            "the model spent {limit} reasoning and answered nothing: raise the limit, or turn the model's reasoning \
             down"
        ),
    )
}

/// What the player is told when the model's answer reached its token limit while it wrote tool calls.
fn cut_short(endpoint: &super::OpenAiEndpoint, calls: &[PendingCall]) -> ToolError {
    let limit = match endpoint.sampling.max_tokens {
        Some(tokens) => format!("its token limit ({tokens}, `Sampling::max_tokens`)"),
        None => "the endpoint's token limit".to_string(),
    };
    let names: Vec<String> = calls.iter().map(|call| format!("`{}`", call.name)).collect();
    ToolError::new(
        "CALL_CUT_SHORT",
        format!(
            "the model reached {limit} while it wrote its call to {}: nothing was run; raise the limit",
            names.join(", ")
        ),
    )
}

/// What the player is told when the model's first answer of a turn was empty.
fn answered_nothing(endpoint: &super::OpenAiEndpoint, finish: Option<&str>) -> ToolError {
    if finish == Some("tool_calls") {
        return ToolError::new(
            "NO_ANSWER",
            format!(
                "{} said its answer was tool calls, but sent none: its tool-call parser did not read the model's \
                 (vLLM's --tool-call-parser must match the model; llama.cpp needs --jinja)",
                endpoint.completions_url()
            ),
        );
    }
    let finish = finish.unwrap_or("none");
    ToolError::new(
        "NO_ANSWER",
        format!(
            "{} answered nothing (finish_reason `{finish}`): a server may do so when the conversation is longer than \
             the context it loaded the model with (LM Studio's context length, llama.cpp's -c); its log says more",
            endpoint.completions_url()
        ),
    )
}

/// What the history says after the tool calls of a turn that failed.
fn failed_note(error: &ToolError) -> String {
    format!(
        "[This turn failed before I could answer ({}: {}). The tool calls above ran in the game and their results \
         stand.]",
        error.code, error.message
    )
}

/// Runs the turn's rounds, adding to `messages` what was said and done; on an error, `messages` holds the rounds
/// that were complete (every tool call in it with its result).
async fn drive(
    shared: &Arc<Shared>,
    turn: u64,
    messages: &mut Vec<Value>,
    cancel: &CancellationToken,
    killed: &AtomicBool,
) -> Result<StopReason, ToolError> {
    // The history's share of each request; once a round, half of what was sent, after a refusal for the context's
    // length.
    let mut history_bytes = shared.history_bound();
    for round in 0.. {
        // Each round offers the tools registered now: a world can register some part-way through a turn.
        let tools = shared.tools();
        let mut shrunk = false;
        let end = loop {
            let (request, sent) = shared.request(messages, &tools, history_bytes);
            match stream_round(shared, turn, round, request, cancel).await? {
                // Asked again once with at most half of what was sent (`fitting` cuts it as any history over its
                // bound, to its newest turns within 60% of that): a history kept under a bound larger than the
                // model's context (`context_window` unset, or set too large) then still goes on.
                RoundEnd::TooLong(error) if sent > 0 && !shrunk => {
                    tracing::warn!(session = %shared.conversation, %error, "asking again with less of the history");
                    history_bytes = sent / 2;
                    shrunk = true;
                }
                RoundEnd::TooLong(error) => {
                    let advice = super::failures::too_long_advice(&shared.endpoint, sent, round, &error.message);
                    return Err(ToolError { message: format!("{}: {advice}", error.message), ..error });
                }
                // Once per session: the flag is cleared, so a second refusal is an error like any other.
                RoundEnd::WithoutStreamOptions => {}
                end => {
                    if shrunk {
                        // Taken: later requests start from this share, and the history is cut to it when saved.
                        shared.learn_history_bound(history_bytes);
                    }
                    break end;
                }
            }
        };
        let (text, calls, finish, reasoning) = match end {
            RoundEnd::Cancelled { text } => {
                if !text.is_empty() {
                    messages.push(json!({"role": "assistant", "content": text}));
                }
                return Ok(StopReason::Cancelled);
            }
            RoundEnd::Done { text, calls, finish, reasoning } => (text, calls, finish, reasoning),
            RoundEnd::TooLong(error) => return Err(error),
            RoundEnd::WithoutStreamOptions => return Err(ToolError::internal("a round asked again was not sent")),
        };
        if calls.is_empty() {
            if text.is_empty() && finish.is_none() {
                // Not an answer: a server that failed and said nothing of why in the stream (llama.cpp's `error:`
                // line is read as an error chunk, `answer_end`, and fails the turn with its words before this).
                let only = if reasoning.any() { " (only reasoning)" } else { "" };
                return Err(ToolError::with_code(
                    ErrorCode::AgentUnavailable,
                    format!(
                        "{} ended its answer with no text{only}, no tool call and no finish_reason: the server \
                         likely failed (its log says why)",
                        shared.endpoint.completions_url()
                    ),
                ));
            }
            if text.is_empty() && reasoning.any() && finish.as_deref() == Some("length") {
                // Else the player sees a turn end `max_tokens` with nothing said, and no clue why.
                (shared.sink)(BackendEvent::Notice(thought_to_the_limit(&shared.endpoint)));
            } else if text.is_empty() && round == 0 {
                // Nothing at all to what the player said (LM Studio answers so to a prompt longer than the context
                // it loaded the model with): the turn would end with no word. After tool calls, an empty answer is
                // a model that had nothing to add.
                (shared.sink)(BackendEvent::Notice(answered_nothing(&shared.endpoint, finish.as_deref())));
            }
            // An answer with only a finish_reason is no message: an empty assistant message in the history would
            // make strict endpoints refuse every later request.
            if !text.is_empty() {
                messages.push(json!({"role": "assistant", "content": text}));
            }
            return Ok(stop_reason(finish.as_deref()));
        }
        // The calls are not run, and the history keeps what the model said, without them: past the rounds a turn
        // may take, or when the answer was cut at its token limit (a call's arguments are then cut short too).
        let stop = if finish.as_deref() == Some("length") {
            Some(StopReason::MaxTokens)
        } else {
            (round >= shared.endpoint.max_tool_rounds).then_some(StopReason::MaxTurnRequests)
        };
        if let Some(stop) = stop {
            if stop == StopReason::MaxTokens {
                // Else the player sees the turn end with the call it announced never made, and no clue why.
                (shared.sink)(BackendEvent::Notice(cut_short(&shared.endpoint, &calls)));
            }
            if !text.is_empty() {
                messages.push(json!({"role": "assistant", "content": text}));
            }
            return Ok(stop);
        }
        (shared.sink)(BackendEvent::ToolCall);
        let wire_calls: Vec<Value> = calls
            .iter()
            .map(|call| {
                let arguments = kept_arguments(&call.arguments);
                let mut wire =
                    json!({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}});
                if let Some(extra) = &call.extra_content {
                    wire["extra_content"] = extra.clone();
                }
                wire
            })
            .collect();
        let content = if text.is_empty() { Value::Null } else { Value::String(text) };
        let mut message = json!({"role": "assistant", "content": content, "tool_calls": wire_calls});
        if reasoning.field == Some("reasoning_content") {
            message["reasoning_content"] = Value::String(reasoning.text);
        }
        if let Some(details) = reasoning.details.into_value() {
            message["reasoning_details"] = details;
        }
        messages.push(message);
        let mut cancelled = false;
        let mut images = Vec::new();
        let cap = usize::try_from(shared.endpoint.max_tool_calls_per_round.max(1)).unwrap_or(usize::MAX);
        for (n, call) in calls.iter().enumerate() {
            // A stop that came while the model answered: no call starts after it.
            cancelled |= cancel.is_cancelled();
            let result = match (cancelled, prepare(call)) {
                (true, _) => cancelled_content(killed),
                // Past the cap: not run, and every call still gets its result, as chat completions require.
                (false, _) if n >= cap => over_cap_content(calls.len(), cap),
                (false, Err(refused)) => error_content(&refused),
                (false, Ok(request)) => {
                    let mut running = shared.agent.conversation_handle(&shared.conversation).request(request);
                    let outcome = tokio::select! {
                        biased;
                        outcome = &mut running => Some(outcome),
                        _ = cancel.cancelled() => {
                            cancelled = true;
                            // Cancelled in the game whether or not it is keyed: a dropped call that carries an
                            // `operation_id` would go on running. One that ended first keeps its outcome.
                            (!running.cancel()).then(|| running.try_outcome()).flatten()
                        }
                    };
                    match outcome {
                        Some(outcome) => answer(shared, outcome, &mut images),
                        None => cancelled_content(killed),
                    }
                }
            };
            messages.push(json!({"role": "tool", "tool_call_id": call.id, "content": result}));
        }
        if !images.is_empty() {
            // Chat completions take images in user messages only: the tools' images follow their results.
            let mut parts = vec![json!({"type": "text", "text": super::roles::TOOL_IMAGES})];
            parts.extend(images.into_iter().map(|url| json!({"type": "image_url", "image_url": {"url": url}})));
            messages.push(json!({"role": "user", "content": parts}));
        }
        if cancelled {
            return Ok(StopReason::Cancelled);
        }
    }
    Err(ToolError::internal("the turn's rounds ran out"))
}

/// Sends one request and streams its answer: text as chat deltas (one message per round), tool calls assembled.
async fn stream_round(
    shared: &Arc<Shared>,
    turn: u64,
    round: u32,
    request: Value,
    cancel: &CancellationToken,
) -> Result<RoundEnd, ToolError> {
    let endpoint = &shared.endpoint;
    let stall = endpoint.stall_timeout;
    // Before the first chunk: a local server loading the model, or reading a long prompt on a CPU.
    let first = endpoint.first_answer_timeout.max(stall);
    // Opening may include the bounded retries' waits.
    let open_bound = first.saturating_add(endpoint.max_retry_wait.saturating_mul(endpoint.max_retries));
    let chat = shared.client.chat();
    let opening = tokio::time::timeout(open_bound, chat.create_stream_byot::<Value, Chunk>(request));
    let opened = tokio::select! {
        biased;
        _ = cancel.cancelled() => return Ok(RoundEnd::Cancelled { text: String::new() }),
        opened = opening => opened,
    };
    let mut stream: StreamResponse<Chunk> = match opened {
        Err(_elapsed) => return Err(stalled(shared, open_bound, true)),
        Ok(Err(error)) if too_long(&error) => return Ok(RoundEnd::TooLong(describe(endpoint, error))),
        Ok(Err(error))
            if super::failures::refuses_stream_options(&error)
                && shared.asks_usage.swap(false, std::sync::atomic::Ordering::Relaxed) =>
        {
            tracing::warn!(session = %shared.conversation, error = %describe(endpoint, error), "the endpoint refuses `stream_options`: asking again without it");
            return Ok(RoundEnd::WithoutStreamOptions);
        }
        Ok(Err(error)) => return Err(describe(endpoint, error)),
        Ok(Ok(stream)) => stream,
    };
    let message = format!("t{turn}-r{round}");
    let mut text = String::new();
    let mut calls: Vec<PendingCall> = Vec::new();
    let mut finish = None;
    let mut reasoning = Reasoning::default();
    let mut think_tags = super::think_tags::ThinkTags::default();
    let mut text_calls = super::text_calls::TextCalls::default();
    // What the answer holds so far (a server that streams without end is stopped at the limit, not by memory).
    let mut held = 0usize;
    // Silence is counted from the answer's last bytes, whatever they were: a comment that keeps the connection
    // alive is no event, yet says the endpoint is there.
    shared.heard.now();
    // Whether a chunk came: until then the silence waited for is `first`.
    let mut answering = false;
    loop {
        let silence = if answering { stall } else { first };
        // Once the answer said how it finished, only what may follow it (the usage chunk, `[DONE]`) is awaited, and
        // not for long: a server that then keeps the connection open without a word has given its whole answer.
        let wait =
            if finish.is_some() { stall.min(AFTER_FINISH) } else { silence.saturating_sub(shared.heard.since()) };
        let next = tokio::select! {
            biased;
            // Dropping the stream closes the request: the endpoint stops generating.
            _ = cancel.cancelled() => {
                // What was held back (the start of a tag, the text after a `<tool_call>`) is the model's words all
                // the same: shown and kept, as what came before.
                let split = think_tags.finish();
                reasoning.thought(&split.thought);
                let mut held_back = text_calls.push(&split.shown);
                held_back.push_str(&text_calls.finish(|_| false).1);
                if !held_back.is_empty() {
                    text.push_str(&held_back);
                    (shared.sink)(BackendEvent::MessageChunk { message: Some(message.clone()), text: held_back });
                }
                return Ok(RoundEnd::Cancelled { text });
            }
            next = tokio::time::timeout(wait, stream.next()) => next,
        };
        let chunk = match next {
            Err(_elapsed) if finish.is_some() => break,
            // Bytes came meanwhile (a comment): the silence is counted from them.
            Err(_elapsed) if shared.heard.since() < silence => continue,
            Err(_elapsed) => return Err(stalled(shared, silence, !answering)),
            Ok(None) => break,
            // The answer said how it finished: what breaks after that (a server that sends no `[DONE]`) takes
            // nothing from it.
            Ok(Some(Err(_))) if finish.is_some() => break,
            Ok(Some(Err(error))) => return Err(describe(endpoint, error)),
            Ok(Some(Ok(chunk))) => chunk,
        };
        // What the answer held before this chunk: a chunk that brings nothing of it (only the role, before the
        // prompt is read) does not start the answer's time.
        let before = held;
        if let Some(error) = chunk.error {
            // Before any of the answer: the request was refused, and one too long is asked again shorter.
            if text.is_empty() && calls.is_empty() && super::failures::in_stream_too_long(&error) {
                return Ok(RoundEnd::TooLong(in_stream(endpoint, &error)));
            }
            return Err(in_stream(endpoint, &error));
        }
        if let Some(usage) = chunk.usage {
            let used = if usage.total_tokens > 0 {
                usage.total_tokens
            } else {
                usage.prompt_tokens.saturating_add(usage.completion_tokens)
            };
            (shared.sink)(BackendEvent::Usage(Usage {
                used_tokens: used,
                context_tokens: endpoint.context_window.unwrap_or(0),
                cost: None,
            }));
        }
        for choice in chunk.choices {
            let reasoned = reasoning.add(&choice.delta).map_err(|_| too_many_blocks(shared))?;
            held = held.saturating_add(reasoned);
            if let Some(piece) = choice.delta.content.filter(|piece| !piece.is_empty()) {
                held = held.saturating_add(piece.len());
                let split = think_tags.push(&piece);
                reasoning.thought(&split.thought);
                let shown = text_calls.push(&split.shown);
                if !shown.is_empty() {
                    text.push_str(&shown);
                    (shared.sink)(BackendEvent::MessageChunk { message: Some(message.clone()), text: shown });
                }
            }
            for fragment in choice.delta.tool_calls.unwrap_or_default() {
                // `"null"`, as text, is a placeholder (the GLM model Mistral hosts sends it on later fragments of a
                // call whose real id came first), never an id to send back.
                let id = fragment.id.filter(|id| !id.is_empty() && id != "null");
                let named = fragment.function.as_ref().and_then(|f| f.name.as_deref()).is_some_and(|n| !n.is_empty());
                // A fragment continues the latest call at its index (without an index, the latest call), unless it
                // brings another id *and* a name: then it starts a new call (Ollama gives every call of a parallel
                // answer index 0). An id that changes between fragments of one call, without a name, continues it.
                let latest = match fragment.index {
                    Some(index) => calls.iter().rposition(|call| call.index == index),
                    None => calls.len().checked_sub(1),
                };
                let starts_new =
                    |call: &PendingCall| named && id.as_ref().is_some_and(|id| !call.id.is_empty() && call.id != *id);
                let slot = match latest {
                    Some(slot) if !starts_new(&calls[slot]) => slot,
                    _ if calls.len() == MAX_CALLS_PER_ANSWER => {
                        // At once: a chunk of many calls would otherwise be read whole, each looked for among the
                        // ones before, on a worker nothing can interrupt.
                        return Err(oversized(shared, held, calls.len() + 1));
                    }
                    _ => {
                        calls.push(PendingCall { index: fragment.index.unwrap_or(calls.len()), ..Default::default() });
                        calls.len() - 1
                    }
                };
                let call = &mut calls[slot];
                if let Some(extra) = fragment.extra_content.filter(|extra| !extra.is_null()) {
                    if call.extra_content.is_none() {
                        held = held.saturating_add(extra.to_string().len());
                        call.extra_content = Some(extra);
                    }
                }
                if let Some(id) = id.filter(|id| *id != call.id) {
                    // Ids are held (and sent back with each result) as the rest is: counted, or 256 calls could
                    // each bring an id of an event's size.
                    held = held.saturating_add(id.len());
                    call.id = id;
                }
                if let Some(function) = fragment.function {
                    // A name comes once, or in pieces; a server that repeats it whole in every fragment is read once.
                    if let Some(name) = function.name.filter(|name| *name != call.name) {
                        held = held.saturating_add(name.len());
                        call.name.push_str(&name);
                    }
                    if let Some(arguments) = function.arguments {
                        held = held.saturating_add(arguments.len());
                        call.arguments.push_str(&arguments);
                    }
                }
            }
            if choice.finish_reason.is_some() {
                finish = choice.finish_reason;
            }
        }
        answering |= held > before || finish.is_some();
        if held > ANSWER_LIMIT || calls.len() > MAX_CALLS_PER_ANSWER {
            return Err(oversized(shared, held, calls.len()));
        }
    }
    let split = think_tags.finish();
    reasoning.thought(&split.thought);
    let mut shown = text_calls.push(&split.shown);
    // Calls written as text are the answer's calls only when the server gave none of its own.
    let tools = shared.agent.tools();
    let offered = |name: &str| calls.is_empty() && tools.iter().any(|tool| tool.name == name);
    let (written, rest) = text_calls.finish(offered);
    shown.push_str(&rest);
    if written.len() > MAX_CALLS_PER_ANSWER {
        return Err(oversized(shared, held, written.len()));
    }
    if !written.is_empty() {
        tracing::debug!(session = %shared.conversation, calls = written.len(), "tool calls written in the answer's text");
    }
    calls.extend(written.into_iter().enumerate().map(|(index, call)| PendingCall {
        index,
        id: String::new(),
        name: call.name,
        arguments: call.arguments,
        extra_content: None,
    }));
    if !shown.is_empty() {
        text.push_str(&shown);
        (shared.sink)(BackendEvent::MessageChunk { message: Some(message.clone()), text: shown });
    }
    for (n, call) in calls.iter_mut().enumerate() {
        if call.id.is_empty() {
            call.id = format!("call_{}_{turn}_{round}_{n}", shared.run_mark);
        }
    }
    Ok(RoundEnd::Done { text, calls, finish, reasoning })
}

/// An answer that passed [`ANSWER_LIMIT`] or [`MAX_CALLS_PER_ANSWER`].
fn oversized(shared: &Shared, held: usize, calls: usize) -> ToolError {
    let url = shared.endpoint.completions_url();
    let what = if held > ANSWER_LIMIT {
        format!("over {} MiB of text, reasoning and tool calls", ANSWER_LIMIT / (1024 * 1024))
    } else {
        format!("over {MAX_CALLS_PER_ANSWER} tool calls")
    };
    ToolError::with_code(
        ErrorCode::AgentUnavailable,
        format!("{url} streamed {what} in one answer: the request was abandoned (a model repeating itself?)"),
    )
    .with_detail("url", &url)
    .with_detail("calls", calls)
}

/// An answer past [`MAX_BLOCKS`](super::reasoning_details::MAX_BLOCKS) reasoning blocks.
fn too_many_blocks(shared: &Shared) -> ToolError {
    let url = shared.endpoint.completions_url();
    let most = super::reasoning_details::MAX_BLOCKS;
    ToolError::with_code(
        ErrorCode::AgentUnavailable,
        format!("{url} streamed over {most} reasoning blocks in one answer: the request was abandoned"),
    )
    .with_detail("url", &url)
}

/// `waited`: the stall timeout, or while the request opens, that and the bounded retries' waits.
/// `before_the_answer`: nothing of the answer had come yet, which a local server reading a long prompt on a CPU
/// (minutes, the first turn after a restart or after old turns were dropped) looks like too.
fn stalled(shared: &Shared, waited: std::time::Duration, before_the_answer: bool) -> ToolError {
    let url = shared.endpoint.completions_url();
    let mut message = format!("{url} sent nothing for {waited:?}: the request was abandoned");
    if before_the_answer {
        message.push_str(
            " (before any of the answer: a local server may still have been loading the model or reading the \
             prompt, which takes minutes on a CPU; `OpenAiEndpoint::first_answer_timeout` sets how long that is \
             waited for)",
        );
    } else {
        message.push_str(
            " (after part of the answer: a server that holds a tool call back until the model has written all of it, \
             as Ollama does, sends nothing meanwhile, which takes long on a CPU; `OpenAiEndpoint::stall_timeout` sets \
             how long a silence is waited for)",
        );
    }
    ToolError::with_code(ErrorCode::Timeout, message).with_detail("url", &url)
}

/// The request for one tool call of the model's, or the error it reads instead (arguments that are not a JSON
/// object, a reserved argument of the wrong shape).
fn prepare(call: &PendingCall) -> Result<CallRequest, ToolError> {
    let arguments =
        if call.arguments.trim().is_empty() { Ok(json!({})) } else { serde_json::from_str(&call.arguments) };
    let arguments = match arguments {
        Ok(arguments @ Value::Object(_)) => arguments,
        Ok(_) => return Err(ToolError::invalid_input("arguments", "the arguments must be a JSON object")),
        Err(error) => {
            return Err(ToolError::invalid_input(
                "arguments",
                format!(
                    "the arguments are not valid JSON ({error}): send one JSON object matching the tool's parameters"
                ),
            ))
        }
    };
    CallRequest::from_wire(call.name.clone(), arguments)
}

/// What the model reads of a tool call's outcome: `{"result": <the tool's output>, "observed": {"visit", "world",
/// "location": {"dimension", "revision"}}}` (the visit and location the result belongs to, rule H11, as MCP
/// clients get it in `_meta`), or `{"error": {"code", "message", "details"}}` it can act on (an unknown tool,
/// arguments that are not JSON, and every host rejection included). A tool that is not registered is the host's
/// to judge, as for any agent: the call waits for it while the world loads (or for the plugin's `tool_wait`); a
/// `TOOL_NOT_FOUND` then lists the tools there are.
fn answer(shared: &Shared, outcome: CallOutcome, images: &mut Vec<String>) -> String {
    match outcome {
        Ok(output) => {
            let mut value = output.value;
            let sent = shared.endpoint.images.then_some(images);
            summarize_images(&mut value, sent);
            json!({"result": value, "observed": output.observed}).to_string()
        }
        Err(error) if error.code == ErrorCode::ToolNotFound => {
            let tools = shared.agent.tools();
            let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_str()).collect();
            let listed = format!("{}; the tools are: {}", error.message, names.join(", "));
            error_content(&ToolError { message: listed, ..error })
        }
        Err(error) => error_content(&error),
    }
}

/// The result of a call the turn's stop cancelled (or never ran): who stopped it.
fn cancelled_content(killed: &AtomicBool) -> String {
    let why = if killed.load(Ordering::SeqCst) {
        "the game stopped the turn (its session ended or failed, or the turn ran past its time limit) before this \
         call ended"
    } else {
        "the player cancelled the turn"
    };
    error_content(&ToolError::with_code(ErrorCode::Cancelled, why))
}

/// The result of a call past [`max_tool_calls_per_round`](super::OpenAiEndpoint::max_tool_calls_per_round).
fn over_cap_content(asked: usize, cap: usize) -> String {
    let why = format!(
        "this answer asked for {asked} tool calls and at most {cap} run per answer: this call was not run; ask for \
         it again in your next answer if it is still needed"
    );
    error_content(&ToolError::with_code(ErrorCode::Busy, why).with_detail("max_tool_calls_per_round", cap))
}

fn error_content(error: &ToolError) -> String {
    json!({ "error": error }).to_string()
}

/// Image fields (`{"type": "image", "mimeType", "data"}`) become a line saying what they were. With `sent`, the
/// image goes there as a `data:` URL (to be sent as an image part) and the line says it follows; else the line says
/// the model does not see it.
fn summarize_images(value: &mut Value, mut sent: Option<&mut Vec<String>>) {
    match value {
        Value::Object(object) => {
            let image = object.get("type").and_then(Value::as_str) == Some("image")
                && object.get("data").is_some_and(Value::is_string);
            if image {
                let mime = object.get("mimeType").and_then(Value::as_str).unwrap_or("image/png").to_string();
                let data = object.get("data").and_then(Value::as_str).unwrap_or_default();
                let bytes = data.len() * 3 / 4;
                *value = Value::String(match sent {
                    Some(sent) => {
                        sent.push(format!("data:{mime};base64,{data}"));
                        format!("[{mime} image of about {bytes} bytes: image {} of the images that follow]", sent.len())
                    }
                    None => format!("[{mime} image of about {bytes} bytes, not shown to this model]"),
                });
            } else {
                object.values_mut().for_each(|value| summarize_images(value, sent.as_deref_mut()));
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|value| summarize_images(value, sent.as_deref_mut())),
        _ => {}
    }
}

fn stop_reason(finish: Option<&str>) -> StopReason {
    match finish {
        Some("stop") | Some("end_turn") | None => StopReason::EndTurn,
        Some("length") => StopReason::MaxTokens,
        Some("content_filter") => StopReason::Refusal,
        Some(_) => StopReason::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_in_a_tool_output_are_summarized_and_the_rest_kept() {
        let mut value = json!({"picture": {"type": "image", "mimeType": "image/png", "data": "AAAA"}, "n": 1});
        summarize_images(&mut value, None);
        assert_eq!(value["n"], 1);
        assert_eq!(value["picture"], "[image/png image of about 3 bytes, not shown to this model]");
    }

    #[test]
    fn for_a_model_that_reads_images_each_image_is_kept_as_a_data_url_and_its_place_says_which() {
        let picture = json!({"type": "image", "mimeType": "image/png", "data": "AAAA"});
        let mut value = json!({"views": [picture.clone(), picture], "n": 1});
        let mut sent = Vec::new();
        summarize_images(&mut value, Some(&mut sent));
        assert_eq!(sent, vec!["data:image/png;base64,AAAA".to_string(); 2]);
        assert_eq!(value["views"][1], "[image/png image of about 3 bytes: image 2 of the images that follow]");
        assert_eq!(value["n"], 1);
    }
}
