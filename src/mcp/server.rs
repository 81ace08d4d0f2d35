//! The MCP face of the host: `tools/list` from the registry, `tools/call` through [`AgentHandle`], with
//! conversations, cancellation and progress mapped onto the host's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, JsonObject, ListToolsResult,
    MetaObject, PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ServerCapabilities, ServerConfig,
    Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::common::http_header::HEADER_SESSION_ID;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Value};

use super::credentials::BoundConversation;
use super::handles::{begin_conversation_tool, Handles, BEGIN_CONVERSATION, CONVERSATION, CONVERSATION_HELP};
use super::naming::{
    client_conversation, client_identity, conversation_id, handle_conversation, is_session_conversation,
    is_sessionless, session_named, CLIENT_CAPABILITIES_META, CLIENT_INFO_META,
};
use super::progress::{ProgressQueue, SEND_LIMIT};
use super::recent::RecentNames;
use super::sessions::ConversationSessions;
use crate::agent::AgentHandle;
use crate::call::{CallOutcome, CallRequest, Progress, ProgressSink};
use crate::error::{ErrorCode, ToolError};
use crate::ids::ConversationId;
use crate::tool::{declares_images, take_images, ErasedTool, ToolInfo};
use crate::tool::{OPERATION_ID, TASK_ID};

/// The `_meta` key under which results carry the visit and location they observed (rule H11). Its prefix follows
/// MCP's rule for `_meta` keys (labels of letters, digits and hyphens: no `_`).
pub const OBSERVED_META_KEY: &str = "bevy-agent-tools/observed";

/// The `_meta` key under which an error result carries its error (`{"code", "message", "details"}`), the same
/// object its text block holds as JSON.
pub const ERROR_META_KEY: &str = "bevy-agent-tools/error";

const INSTRUCTIONS: &str = "Tools act inside a running game. Each call is bound to the world visit (and, for \
location-scoped tools, the exact location) it was made in: if the player leaves or travels first, the call is \
refused (VISIT_ENDED, LOCATION_CHANGED) and nothing is applied elsewhere. An error result's text is JSON with a \
stable `code`, a `message` and `details`. For non-read-only tools, pass an `operation_id` when you may retry: \
retries run once. After TIMEOUT, or CANCELLED with `effect_unknown` in its details, the effect is unknown: look \
before you retry.";

/// How a client names its conversation, after [`INSTRUCTIONS`].
const CONVERSATIONS: &str = " Retries are recognised within a conversation: your MCP session, or without one \
every client of your client's name and version; to keep your calls apart from other copies of your client, call \
`begin_conversation` once and pass its handle as `conversation` in every call.";

/// The same, for a client whose credential is bound to one conversation (an in-game agent's session).
const BOUND_CONVERSATION: &str = " Retries are recognised within your conversation: every call made with your \
credential.";

/// The server's instructions to a client whose credential is bound to one conversation (`bound`) or not.
fn instructions(bound: bool) -> String {
    [INSTRUCTIONS, if bound { BOUND_CONVERSATION } else { CONVERSATIONS }].concat()
}

/// Whether the request's credential is bound to one conversation ([`BoundConversation`]): it names no other,
/// so it is shown neither `begin_conversation` nor the `conversation` argument.
fn is_bound(context: &RequestContext<RoleServer>) -> bool {
    let parts = context.extensions.get::<axum::http::request::Parts>();
    parts.is_some_and(|parts| parts.extensions.get::<BoundConversation>().is_some())
}

/// Numbers the conversations of sessionless requests without a handle.
static NEXT_REQUEST: AtomicU64 = AtomicU64::new(1);

/// One `ServerHandler` per MCP session (or per request, for 2026-07-28): cheap clones of the agent handle.
#[derive(Clone)]
pub(crate) struct GameServer {
    pub agent: AgentHandle,
    /// The conversation handles minted for sessionless clients.
    pub handles: Handles,
    /// The sessionless clients named by their identity, whose conversations stay open.
    pub clients: RecentNames,
    /// The open 2025-11-25 sessions.
    pub sessions: Arc<ConversationSessions>,
    /// The clients of those sessions, told when the tool list changes.
    pub peers: super::announce::Peers,
    /// This session's client is among [`peers`](Self::peers) (each session has a server of its own): a client
    /// that says `initialized` again is not added again, to be told of each change once per time it said it.
    pub announced: Arc<std::sync::atomic::AtomicBool>,
    /// The tools as MCP shows them, converted once per change.
    pub listed: super::listed::ListedTools,
    /// Cancelled at the game's exit, before the server stops: each `subscriptions/listen` stream then ends with
    /// its final result.
    pub subscriptions_end: tokio_util::sync::CancellationToken,
}

impl GameServer {
    /// Names the conversation a request belongs to ([`conversation_id`]): its credential's (an in-game agent
    /// session), else its `conversation` handle (checked: only minted handles pass), else its MCP session
    /// (2025-11-25), else its client's name and version (a sessionless request's `_meta`), else none: such a
    /// request is a conversation of its own, ended with the request.
    ///
    /// Every request opens its conversation ([`AgentHandle::conversation`]): a conversation that ended (for
    /// example by the plugin's `conversation_idle_timeout`) is reactivated, so a client that comes back with its
    /// handle simply continues in the same visit.
    fn conversation(
        &self,
        arguments: &mut JsonObject,
        context: &RequestContext<RoleServer>,
    ) -> Result<Named, ToolError> {
        let handle = match arguments.remove(CONVERSATION) {
            // A bound credential's calls are its conversation's whatever they name (it is not shown the argument,
            // but a model may still send one).
            _ if is_bound(context) => None,
            None | Some(Value::Null) => None,
            Some(Value::String(handle)) => {
                self.handles.check(&handle)?;
                Some(handle)
            }
            Some(_) => {
                return Err(ToolError::invalid_input(CONVERSATION, "must be the string `begin_conversation` returned"))
            }
        };
        let parts = context.extensions.get::<axum::http::request::Parts>();
        let header = parts.and_then(|p| p.headers.get(HEADER_SESSION_ID)).and_then(|v| v.to_str().ok());
        let version = context.meta.protocol_version();
        let version = version.as_ref().map(|v| v.as_str());
        let sessionless = is_sessionless(version, context.meta.get(CLIENT_CAPABILITIES_META).is_some());
        let session = session_named(header, sessionless, |id| self.sessions.is_open(id));
        let bound = parts.and_then(|p| p.extensions.get::<BoundConversation>());
        let of_session = bound.is_some_and(|bound| bound.of_session);
        let bound = bound.map(|bound| &bound.conversation);
        let client = client_identity(sessionless, context.meta.get(CLIENT_INFO_META));
        let id = conversation_id(bound, handle.as_deref(), session, client.as_deref());
        if let (Some(session), Some(id), Some(_)) = (session, &id, &handle) {
            // A long call of the handle's conversation keeps the session from expiring.
            self.sessions.used(session, id);
        }
        if let Some(client) = client.filter(|client| id.as_ref() == Some(&client_conversation(client))) {
            note_client(&self.agent, &self.clients, &client);
        }
        Ok(Named { id, bound: of_session })
    }
}

/// Notes a request of sessionless client `client`: the conversation of the client used longest ago beyond the
/// number kept ends (it reopens if that client comes back), unless it has calls in flight.
fn note_client(agent: &AgentHandle, clients: &RecentNames, client: &str) {
    let running = |client: &str| agent.host().conversations.waits_for_tools(&client_conversation(client));
    if let Some(forgotten) = clients.used(client, |old| !running(old)) {
        // A call of it admitted since it was chosen is not cancelled: it ends when that call finishes.
        agent.host().conversations.end_once_idle(&client_conversation(&forgotten));
    }
}

/// The conversation a request names, and whether an in-game agent session's credential binds it.
struct Named {
    id: Option<ConversationId>,
    bound: bool,
}

/// The conversation a call runs in. One bound to an in-game agent session is never reopened by a call: once the
/// session ended, a request that passed the bearer check just before its credential was revoked is refused
/// (the conversation ended), instead of reopening it behind the session's back and running a tool. Nor is an
/// MCP session's own: it ends with its session, or when the game ends it, and then its session closes (its
/// client's next request gets 404); a request that arrives before the session is closed is refused, rather
/// than reopening a conversation the game ended (and which nothing would end again).
fn conversation_for_call(agent: &AgentHandle, id: ConversationId, bound: bool) -> crate::agent::Conversation {
    if bound {
        agent.conversation_handle(&id)
    } else if is_session_conversation(&id) {
        agent.conversation_unless_ended(&id)
    } else {
        agent.conversation(id)
    }
}

pub(crate) fn to_mcp_tool(info: &ToolInfo) -> Tool {
    // One object for the model APIs behind the clients, which refuse alternatives at a tool's root.
    let input = match crate::tool::flat_root(info.client_input_schema()) {
        Value::Object(schema) => schema,
        _ => JsonObject::new(),
    };
    let annotations = ToolAnnotations::new()
        .read_only(info.annotations.read_only)
        .destructive(info.annotations.destructive)
        .idempotent(info.annotations.idempotent)
        .open_world(false);
    let mut input = input;
    // MCP requires an object schema at the root, and the TypeScript SDK (Claude Code, Cursor, the Inspector)
    // rejects the whole `tools/list` when one tool's is not exactly `"type": "object"`: an enum of argument structs
    // (`oneOf` of objects) has no type of its own, optional arguments have `["object", "null"]` (a null counts as
    // `{}`; registration refuses arguments that cannot be an object at all).
    input.insert("type".into(), json!("object"));
    // It also refuses a property whose schema is `true` (anything: what schemars writes for `serde_json::Value`).
    anything_as_empty_schema(&mut input);
    // Every tool takes the handle, also one without arguments of its own (its schema has no `properties`).
    if let Some(properties) = input.entry("properties").or_insert_with(|| json!({})).as_object_mut() {
        let handle = json!({ "type": "string", "minLength": 1, "description": CONVERSATION_HELP });
        properties.entry(CONVERSATION).or_insert(handle);
    }
    let mut tool =
        Tool::new(info.name.clone(), info.description.clone(), Arc::new(input)).with_annotations(annotations);
    // A tool with pictures sends no `structuredContent` (see `outcome_to_result`): no output schema either, which
    // the TypeScript SDK would hold each of its results to.
    if let Value::Object(mut output) = info.client_output_schema() {
        if output.get("type").and_then(Value::as_str) == Some("object") && !declares_images(&info.output_schema) {
            anything_as_empty_schema(&mut output);
            tool = tool.with_raw_output_schema(Arc::new(output));
        }
    }
    tool
}

/// `tool` without the `conversation` argument [`to_mcp_tool`] adds, for a client that names no conversation.
fn without_conversation(mut tool: Tool) -> Tool {
    let mut input = (*tool.input_schema).clone();
    if let Some(properties) = input.get_mut("properties").and_then(Value::as_object_mut) {
        properties.remove(CONVERSATION);
    }
    tool.input_schema = Arc::new(input);
    tool
}

/// Writes the properties whose schema is `true` (any value) as `{}`, which means the same.
fn anything_as_empty_schema(schema: &mut JsonObject) {
    if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        for property in properties.values_mut().filter(|property| **property == Value::Bool(true)) {
            *property = json!({});
        }
    }
}

impl ServerHandler for GameServer {
    fn accepted_subscription_filter(
        &self,
        requested: &rmcp::model::SubscriptionFilter,
    ) -> Option<rmcp::model::SubscriptionFilter> {
        super::announce::accepted(requested)
    }

    async fn listen(&self, subscription: rmcp::service::SubscriptionContext) -> Result<(), ErrorData> {
        super::announce::listen(&self.agent, subscription, &self.subscriptions_end).await
    }

    async fn on_initialized(&self, context: rmcp::service::NotificationContext<RoleServer>) {
        if !self.announced.swap(true, std::sync::atomic::Ordering::SeqCst) {
            self.peers.add(context.peer);
        }
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build())
            .with_server_info(server_info())
            .with_instructions(instructions(false))
    }

    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ServerConfig, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let mut info = self.negotiate_initialize(&request)?;
        info.instructions = Some(instructions(is_bound(&context)));
        Ok(info)
    }

    async fn discover(&self, context: RequestContext<RoleServer>) -> Result<rmcp::model::DiscoverResult, ErrorData> {
        let mut info = self.get_info();
        info.instructions = Some(instructions(is_bound(&context)));
        Ok(rmcp::model::DiscoverResult::from_server_info(self.supported_protocol_versions().into_owned(), info))
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        // Every tool comes in one page: no cursor was ever given out, so any is unknown (MCP: "Invalid cursors
        // SHOULD result in an error with code -32602").
        if let Some(cursor) = request.and_then(|request| request.cursor) {
            let shown: String = cursor.chars().take(64).collect();
            return Err(ErrorData::invalid_params(
                format!("unknown cursor `{shown}`: every tool is in the first page (list without a cursor)"),
                None,
            ));
        }
        let registered = self.listed.all(&self.agent);
        let tools: Vec<Tool> = if is_bound(&context) {
            registered.values().cloned().map(without_conversation).collect()
        } else {
            std::iter::once(begin_conversation_tool()).chain(registered.values().cloned()).collect()
        };
        let mut listed = ListToolsResult::with_all_items(tools);
        identify(&mut listed.meta);
        Ok(listed)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        if name == BEGIN_CONVERSATION {
            return Some(begin_conversation_tool());
        }
        self.listed.get(&self.agent, name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let mut response = self.answer_call(request, context).await?;
        if let CallToolResponse::Complete(result) = &mut response {
            identify(&mut result.meta);
        }
        Ok(response)
    }
}

impl GameServer {
    /// What a `tools/call` is answered with ([`call_tool`](ServerHandler::call_tool) adds who answers).
    async fn answer_call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let mut arguments = request.arguments.unwrap_or_default();
        // Minting one names none: a handle sent along (the server's instructions say to send it in every call) is
        // not checked, or a client whose handle was forgotten could never get a new one.
        if request.name == BEGIN_CONVERSATION {
            if is_bound(&context) {
                // Its calls are its session's conversation whatever it names; and minting handles could only push
                // other clients' out (the oldest are forgotten past the number kept).
                let why = "this credential is bound to one conversation (an in-game agent's session): its calls \
                           are that conversation's, and it has no other to begin";
                return Ok(error_result(&ToolError::with_code(ErrorCode::InvalidInput, why)).into());
            }
            let running = |old: &str| self.agent.host().conversations.waits_for_tools(&handle_conversation(old));
            return Ok(match self.handles.mint(|old| !running(old)) {
                Ok((handle, forgotten)) => {
                    if let Some(old) = forgotten {
                        // Its client can no longer name it: it ends, as it had no call in flight (a call admitted
                        // since it was chosen is not cancelled: the conversation then ends when that call does).
                        self.agent.host().conversations.end_once_idle(&handle_conversation(&old));
                    }
                    let value = json!({ "conversation": handle });
                    let mut result = CallToolResult::success(vec![ContentBlock::text(value.to_string())]);
                    result.structured_content = Some(value);
                    result.into()
                }
                Err(error) => error_result(&error).into(),
            });
        }
        let named = match self.conversation(&mut arguments, &context) {
            Ok(named) => named,
            Err(error) => return Ok(error_result(&error).into()),
        };
        // A sessionless request without a handle or a client name: a conversation of its own, ended with it.
        let anonymous = named.id.is_none();
        let keyed = |name: &str| arguments.get(name).is_some_and(|value| !value.is_null());
        // The tool the call is for, as it is now: the call's result is read by its schema even if the tool is
        // replaced or removed while the call runs. (Only a tool that takes the key: an unknown tool is refused as
        // such, a read-only one keys nothing.)
        let registered = self.agent.host().tools.find(&request.name);
        let takes_keys = registered.as_ref().is_some_and(|tool| !tool.info().annotations.read_only);
        if anonymous && takes_keys && keyed(OPERATION_ID) && !keyed(TASK_ID) {
            // Its retry would be another conversation's, whose default task is another: it would run again, where
            // the argument promises it runs once.
            let why = "a retry is recognised within a conversation, and this request names none: send your \
                       client's name in `_meta` (`io.modelcontextprotocol/clientInfo`), a `conversation` handle \
                       from `begin_conversation`, or a `task_id`";
            return Ok(error_result(&ToolError::invalid_input(OPERATION_ID, why)).into());
        }
        let id = named.id.unwrap_or_else(|| {
            ConversationId::new(format!("mcp-request:{}", NEXT_REQUEST.fetch_add(1, Ordering::Relaxed)))
        });
        let conversation = conversation_for_call(&self.agent, id.clone(), named.bound);
        let outcome = self.run(conversation, request.name.to_string(), registered, arguments, &context).await;
        if anonymous {
            let _ = self.agent.end_conversation(&id);
        }
        outcome
    }
}

impl GameServer {
    async fn run(
        &self,
        conversation: crate::agent::Conversation,
        tool: String,
        registered: Option<Arc<dyn ErasedTool>>,
        arguments: JsonObject,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let mut call_request = match CallRequest::from_wire(tool.clone(), Value::Object(arguments)) {
            Ok(call_request) => call_request,
            Err(error) => return Ok(error_result(&error).into()),
        };
        let queue = Arc::new(ProgressQueue::default());
        let mut progress_token = context.meta.get_progress_token();
        if progress_token.is_some() {
            let queue = queue.clone();
            call_request = call_request.progress(ProgressSink::new(move |progress| queue.push(progress)));
        }
        let mut call = conversation.request(call_request);
        if let Some(exchange) = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Arc<super::exchanges::Exchange>>())
        {
            exchange.answers(call.running_probe());
        }
        let mut cancelled = false;
        // Progress is forwarded as it comes; when the outcome is ready, the reports still queued (the handler
        // makes them synchronously, so every report made before the result is queued by then) go out first, in
        // order: a client always sees all of a call's progress before its result.
        let outcome = loop {
            tokio::select! {
                biased;
                progress = queue.next() => notify_progress(context, &mut progress_token, progress).await,
                outcome = &mut call => break outcome,
                _ = context.ct.cancelled(), if !cancelled => {
                    cancelled = true;
                    call.cancel();
                }
            }
        };
        while let Some(progress) = queue.pop() {
            notify_progress(context, &mut progress_token, progress).await;
        }
        // Or as it is now: a call may have waited for its tool to be registered.
        let registered = registered.or_else(|| self.agent.host().tools.find(&tool));
        let schema = registered.as_ref().map_or(&Value::Null, |tool| &tool.info().output_schema);
        outcome_to_result(outcome, schema).map(Into::into)
    }
}

/// Sends one progress report as `notifications/progress` (nothing without a token; a client that went away is not
/// an error here: the call's own cancellation handles it). Nothing once the client cancelled the request: it has
/// forgotten the token (the TypeScript SDK reports progress for a forgotten token as an error). A client that
/// does not take a report within [`SEND_LIMIT`] gets none of the call's later ones (`token` is taken).
async fn notify_progress(context: &RequestContext<RoleServer>, token: &mut Option<ProgressToken>, progress: Progress) {
    let Some(sending) = token.as_ref().filter(|_| !context.ct.is_cancelled()) else { return };
    let mut param = ProgressNotificationParam::new(sending.clone(), progress.progress);
    if let Some(total) = progress.total {
        param = param.with_total(total);
    }
    if let Some(message) = progress.message {
        param = param.with_message(message);
    }
    if tokio::time::timeout(SEND_LIMIT, context.peer.notify_progress(param)).await.is_err() {
        tracing::debug!("an MCP client took no progress report for {SEND_LIMIT:?}: the call's later ones are dropped");
        *token = None;
    }
}

/// Maps a call's outcome onto MCP.
///
/// - Success: `structuredContent` is the output (conforming to the published output schema), a text block
///   carries the same JSON (a string output: the string itself), and `_meta["bevy-agent-tools/observed"]` says
///   which visit and location it saw. Each [`ImageContent`](crate::ImageContent) field of the output travels
///   once, as image content (not in the text); then, and for every result of a tool whose output declares one,
///   there is no `structuredContent`: Codex and Claude Code give their model a result's `structuredContent` alone
///   when it has one, and the picture would never reach it.
/// - A domain error: `isError: true`, one text block holding the error as JSON (`{"code", "message",
///   "details"}`), the same object under `_meta["bevy-agent-tools/error"]`, and no `structuredContent`: clients
///   that check `structuredContent` against the tool's output schema even on errors (the TypeScript SDK, the
///   MCP Inspector) would otherwise throw away the error for not matching it.
/// - An unknown tool: a JSON-RPC error (-32602), as the specification asks.
///
/// `schema` is the tool's output schema: it says which fields are images.
pub(crate) fn outcome_to_result(outcome: CallOutcome, schema: &Value) -> Result<CallToolResult, ErrorData> {
    match outcome {
        Ok(output) => {
            let mut value = output.value;
            let images = value.as_object_mut().map(|object| take_images(object, schema)).unwrap_or_default();
            let pictured = !images.is_empty() || declares_images(schema);
            // A string output is text as it is: quoted as JSON, its lines would reach the model as `\n`s.
            let text = match &value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            let mut content = vec![ContentBlock::text(text)];
            content.extend(images.into_iter().map(|image| ContentBlock::image(image.data, image.mime_type)));
            let mut result = CallToolResult::success(content);
            result.structured_content = (value.is_object() && !pictured).then_some(value);
            let mut meta = JsonObject::new();
            meta.insert(OBSERVED_META_KEY.into(), json!(output.observed));
            Ok(result.with_meta(Some(MetaObject(meta))))
        }
        Err(error) if error.code == ErrorCode::ToolNotFound => {
            Err(ErrorData::invalid_params(error.message.clone(), Some(json!(error))))
        }
        Err(error) => Ok(error_result(&error)),
    }
}

/// The server's name and version, as `initialize`, `server/discover` and every result's `_meta` say them.
fn server_info() -> Implementation {
    Implementation::new("bevy_agent_tools", env!("CARGO_PKG_VERSION"))
}

/// Says who answers in a result's `_meta` (MCP 2026-07-28: servers SHOULD identify themselves in each result;
/// without a session, nothing else tells a client).
pub(crate) fn identify(meta: &mut Option<MetaObject>) {
    meta.get_or_insert_default().0.insert(SERVER_INFO_META_KEY.into(), json!(server_info()));
}

/// Where a result's `_meta` names the server.
const SERVER_INFO_META_KEY: &str = "io.modelcontextprotocol/serverInfo";

/// A domain error as a tool result: see [`outcome_to_result`].
pub(crate) fn error_result(error: &ToolError) -> CallToolResult {
    let error = json!(error);
    let result = CallToolResult::error(vec![ContentBlock::text(error.to_string())]);
    let mut meta = JsonObject::new();
    meta.insert(ERROR_META_KEY.into(), error);
    result.with_meta(Some(MetaObject(meta)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::ConversationStatus;
    use crate::testing::{headless_app, AgentTestAppExt, CounterGame};
    use crate::AgentToolsPlugin;

    #[test]
    fn a_call_bound_to_an_ended_session_or_in_an_ended_mcp_sessions_conversation_never_reopens_it_and_is_refused() {
        let noop =
            crate::AgentTool::new("noop", "Does nothing.", |_: crate::CallContext<u64>, _: crate::NoArgs| async {
                Ok(())
            });
        let mut app = headless_app(AgentToolsPlugin::new(CounterGame).with_tool(noop));
        app.enter_world("alpha");
        let agent = app.agent();
        let session = ConversationId::new("session-ended");
        agent.host().conversations.open_held(&session);
        let _ = agent.host().conversations.end(&session);

        let conversation = conversation_for_call(&agent, session.clone(), true);
        assert_eq!(agent.conversation_status(&session), Some(ConversationStatus::Ended), "not reopened");
        let call = conversation.call("noop", serde_json::json!({}));
        let error = app.run_until_resolved(&call).expect_err("refused: its session ended");
        assert_eq!(error.code, crate::ErrorCode::Cancelled, "{error:?}");

        // An MCP session's own conversation, ended by the game: a request arriving before its session closes
        // neither reopens it nor runs; a new session's conversation is created as usual.
        let ended = super::super::naming::session_conversation("ended-by-the-game");
        let _ = conversation_for_call(&agent, ended.clone(), false);
        assert_eq!(agent.conversation_status(&ended), Some(ConversationStatus::Idle), "created by its first call");
        agent.end_conversation(&ended).expect("known");
        let late = conversation_for_call(&agent, ended.clone(), false).call("noop", serde_json::json!({}));
        let error = app.run_until_resolved(&late).expect_err("refused: the game ended it");
        assert_eq!(error.code, crate::ErrorCode::Cancelled, "{error:?}");
        assert_eq!(agent.conversation_status(&ended), Some(ConversationStatus::Ended), "not reopened");

        // Control: a conversation named by a handle or a client's name reopens, as MCP clients expect.
        let other = ConversationId::new("mcp-client:x/1");
        let _ = agent.conversation(other.clone()).end();
        let _ = conversation_for_call(&agent, other.clone(), false);
        assert_eq!(agent.conversation_status(&other), Some(ConversationStatus::Idle));
    }

    #[test]
    fn a_result_with_a_picture_carries_no_structured_content_and_a_string_output_is_its_own_text() {
        #[derive(serde::Serialize, schemars::JsonSchema)]
        #[serde(deny_unknown_fields)]
        struct Look {
            picture: Option<crate::ImageContent>,
            /// Free-form JSON that happens to be shaped like an image: declared, so it stays.
            raw: Value,
            label: String,
        }
        let tool = crate::AgentTool::new("look", "Looks.", |_: crate::CallContext<u64>, _: crate::NoArgs| async {
            Ok(Look { picture: None, raw: Value::Null, label: String::new() })
        });
        let info = tool.info();
        let client_schema = info.client_output_schema();
        let validator = jsonschema::validator_for(&client_schema).expect("a schema");
        let image = serde_json::json!({ "type": "image", "mimeType": "image/png", "data": "AA==" });
        let observed = crate::VisitInfo {
            visit: crate::VisitId(1),
            world: crate::WorldId::new("alpha"),
            location: crate::Location {
                dimension: crate::DimensionId::new("overworld"),
                revision: crate::LocationRevision(0),
            },
        };
        let text = |result: &CallToolResult| -> Value {
            let text = result.content.first().and_then(|block| block.as_text()).expect("a text block");
            serde_json::from_str(&text.text).expect("JSON")
        };
        for (picture, images) in [(Value::Null, 0), (image.clone(), 1)] {
            let value = serde_json::json!({ "picture": picture, "raw": image, "label": "x" });
            let output = crate::CallOutput { value, observed: observed.clone() };
            let result = outcome_to_result(Ok(output), &info.output_schema).expect("a result");
            // Codex and Claude Code give their model `structuredContent` alone when a result has it: none, so the
            // picture reaches the model; and none published as the tool's output schema either.
            assert_eq!(result.structured_content, None, "picture {picture}");
            let read = text(&result);
            assert_eq!(read, serde_json::json!({ "raw": image, "label": "x" }), "picture {picture}");
            assert!(validator.is_valid(&read), "{read} against {client_schema}");
            assert_eq!(result.content.len(), 1 + images, "the text, and the picture when there is one");
            assert!(result.content.get(1).is_none_or(|block| block.as_image().is_some()));
        }
        assert!(to_mcp_tool(info).output_schema.is_none(), "a tool with pictures publishes no output schema");
        // Free-form output: an image-shaped field is taken, and the result with it has no `structuredContent`.
        let value = serde_json::json!({ "shot": image, "label": "x" });
        let output = crate::CallOutput { value, observed: observed.clone() };
        let result = outcome_to_result(Ok(output), &Value::Null).expect("a result");
        assert_eq!((result.structured_content.clone(), text(&result)), (None, serde_json::json!({ "label": "x" })));
        assert_eq!(result.content.len(), 2);
        // A string output is its own text, lines and quotes as they are.
        let output = crate::CallOutput { value: serde_json::json!("line \"1\"\nline 2"), observed: observed.clone() };
        let result = outcome_to_result(Ok(output), &Value::Null).expect("a result");
        let text = result.content.first().and_then(|block| block.as_text()).map(|text| text.text.clone());
        assert_eq!(text.as_deref(), Some("line \"1\"\nline 2"));
        // Control: without a picture, `structuredContent` is the output.
        let output = crate::CallOutput { value: serde_json::json!({ "label": "x" }), observed };
        let result = outcome_to_result(Ok(output), &Value::Null).expect("a result");
        assert_eq!(result.structured_content, Some(serde_json::json!({ "label": "x" })));
    }

    #[test]
    fn a_client_name_forgotten_beyond_the_bound_ends_its_conversation_unless_calls_of_it_run() {
        let app = headless_app(AgentToolsPlugin::new(CounterGame));
        let agent = app.agent();
        let clients = RecentNames::keeping(1);
        let open = |client: &str| {
            let _ = agent.conversation(client_conversation(client));
            note_client(&agent, &clients, client);
        };
        let status = |client: &str| agent.conversation_status(&client_conversation(client));
        open("a/1");
        open("b/1");
        assert_eq!(status("a/1"), Some(ConversationStatus::Ended), "forgotten: its conversation ended");
        assert_eq!(status("b/1"), Some(ConversationStatus::Idle));

        agent.host().conversations.host_sets(&client_conversation("b/1"), ConversationStatus::WaitingToolResult);
        // The game's `report_error` makes its status `Error`, which wins over a call in flight: still kept.
        agent.host().conversations.host_sets(&client_conversation("b/1"), ConversationStatus::Error);
        open("c/1");
        assert_eq!(status("b/1"), Some(ConversationStatus::Error), "a call of it runs: kept");
        assert_eq!(status("c/1"), Some(ConversationStatus::Idle));
    }
}
