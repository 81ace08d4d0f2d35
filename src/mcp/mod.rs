//! The MCP transport: a Streamable HTTP server (the official `rmcp` SDK, both protocol generations it speaks)
//! on the plugin's runtime, secure by default.
//!
//! It needs the [`AgentToolsPlugin`](crate::AgentToolsPlugin), added before or after it: the server starts once
//! both are added, and the app then has [`McpServer`] (or [`McpUnavailable`]):
//!
//! ```no_run
//! # use bevy::prelude::*;
//! # use bevy_agent_tools::prelude::*;
//! # use bevy_agent_tools::mcp::{McpPlugin, McpServer, McpUnavailable};
//! # fn add(app: &mut App) {
//! app.add_plugins(McpPlugin::new().port(15777));
//! match app.world().get_resource::<McpServer>() {
//!     Some(server) => println!("mcp: {}", server.url()),
//!     None => println!("no mcp: {}", app.world().resource::<McpUnavailable>().error),
//! }
//! # }
//! ```
//!
//! Start-up never stops the game. A taken port is replaced by a free one (logged; [`McpPlugin::strict_port`]
//! refuses instead); when the server cannot start at all, the error is logged, [`McpUnavailable`] takes the place of
//! [`McpServer`], and the game runs without MCP.
//!
//! Security, on by default: loopback only (a non-loopback bind is refused unless
//! [`McpPlugin::allow_non_loopback`]); a bearer token (generated per run unless set, written to a file readable
//! only by the user, never logged in full); `Origin` checked against an allow-list (requests without `Origin`, as
//! non-browser clients send, pass); `Host` checked; a request body limit; the per-conversation in-flight limit of
//! the host (`BUSY`, an error result for the request, answered at the HTTP layer before the call reaches the MCP
//! service, or by the host for a call that races past it); at most [`McpPlugin::max_connections`] connections, and
//! a request that takes over [`McpPlugin::request_read_timeout`] to arrive is let go. Refusals: 403 (Origin, Host:
//! with or without a token), 401 (token; its `WWW-Authenticate` names `invalid_token` when a token was sent), 413
//! (body), 408 (a body that stopped coming), 503 (too many connections). There is no OAuth: an OAuth client's
//! discovery after a 401 (`/.well-known/...`) is answered 404, token or not, with a body saying what to send.
//!
//! A 2025-11-25 client that ends its session with `DELETE` is answered 204 No Content; a `DELETE` (like any
//! request) naming a session that does not exist any more (the game ended its conversation, or it expired), 404.
//!
//! A tool call travels as `tools/call`. A successful result carries the output as `structuredContent` (matching
//! the tool's published `outputSchema`) and as JSON text (a string output: the string itself). An
//! [`ImageContent`](crate::ImageContent) field of the output travels once, as image content, not in the text; a
//! result with one has no `structuredContent`, nor does a tool whose output declares one publish an output schema
//! (Codex and Claude Code give their model only `structuredContent` when a result has it). The visit and
//! location it observed are under `_meta["bevy-agent-tools/observed"]` ([`OBSERVED_META_KEY`]).
//!
//! A domain error (`NO_WORLD`, `INVALID_INPUT`, `LOCATION_CHANGED`, ...) is a result with `isError: true` whose one
//! text block is the error as JSON, the same object also under `_meta["bevy-agent-tools/error"]`
//! ([`ERROR_META_KEY`]):
//!
//! ```json
//! {"content": [{"type": "text", "text": "{\"code\":\"INVALID_INPUT\",\"details\":{\"field\":\"x\",\"reason\":\"9999 is greater than the maximum of 255\",\"tool\":\"place_block\",...},\"message\":\"argument `x` of `place_block` is invalid: 9999 is greater than the maximum of 255\"}"}],
//!  "_meta": {"bevy-agent-tools/error": {"code": "INVALID_INPUT", "message": "...", "details": {"field": "x", ...}}},
//!  "isError": true}
//! ```
//!
//! An error result has no `structuredContent`: the TypeScript SDK's `callTool()` and the MCP Inspector check
//! `structuredContent` against the tool's output schema even on errors, and would throw away an error shaped
//! otherwise. The text block is what every client shows (and a model reads); programs read the `_meta` entry. An
//! unknown tool is a JSON-RPC error (-32602); a body that is not one JSON-RPC message is refused with HTTP 400 and
//! a JSON-RPC error: a parse error (-32700) for malformed JSON, an invalid request (-32600) for a batch or a
//! wrong shape.
//!
//! Conversations: a 2025-11-25 client's MCP session is its conversation. A sessionless (2026-07-28) request
//! names its client in `_meta` (`io.modelcontextprotocol/clientInfo`), and its conversation is its client's
//! (DESIGN §7): every request of the same client name and version, with the game's token, is one conversation
//! (one in-flight limit, and the default task of its operation-id replays), so a retry with the same
//! `operation_id` runs once without the client doing anything more. Copies of the same client that want to be
//! kept apart use a server-minted handle (SEP-2567): the built-in tool `begin_conversation` returns
//! `{"conversation": "cv-..."}`, and the client passes it as the `conversation` argument (in every tool's schema)
//! of its later calls. Only minted handles pass (`CONVERSATION_NOT_FOUND`). A sessionless request that names no
//! client is a conversation of its own, ended with the request. A `task_id` is shared by every conversation that
//! names it. A request presenting an in-game agent session's credential ([`Credentials`]) is that session's
//! conversation. A request that names none of these (sessionless, no client name, no handle) is a conversation of
//! its own, so the per-conversation in-flight limit does not bound such requests together: the connection cap does.
//! The 1,000 client names used most recently keep their conversations open; the conversation of
//! one used longer ago ends, and opens again when it comes back.
//!
//! Progress: the reports a handler makes before its result reach the client (as `notifications/progress`, when
//! the request carried a progress token) before the result, in order. MCP wants each to go forward: one that is not
//! finite, or does not go forward and says nothing new, is dropped. A client that reads them slower than the
//! tool makes them gets at most 4,096 waiting (a newer report replaces the latest waiting, so the last one still
//! comes), one that reads none for 5 s gets no more of that call's, and none follow a cancel.
//!
//! Resumption (2025-11-25 sessions): a response stream starts with a priming event and `retry: 3000`. A client
//! whose connection dropped comes back with `GET` and `Last-Event-ID` and gets the events it missed, the result
//! included, even when the call finished while it was away. The server keeps, per session, the events of the 16
//! most recent finished requests (each its last 64 events) plus those of requests still running, and drops them
//! when the session ends. A client that stops reading a stream without closing it holds up nothing else of its
//! session: once it has taken in nothing for 5 s while events wait for it, its connection gets no more (it ends
//! after what it was given; the client can resume for the rest).
//! An answer that takes over a second is a stream with a keep-alive every 2 s (a sessionless 2026-07-28 answer too,
//! which rmcp otherwise sends only once it has one).
//!
//! Logs: rmcp's own lines (several INFO lines per connection, an ERROR when a client goes away before its
//! response) are quiet by default on the plugin's threads; set `BEVY_AGENT_TOOLS_RMCP_LOG=info` (or `debug`,
//! `trace`) to see them, subject to the game's own log filter ([`RMCP_LOG_ENV`]).
//!
//! Schemas are published for models: the Rust doc comment of an arguments or output type (and of a flattened
//! helper such as [`DestructiveGuard`](crate::DestructiveGuard)) is left out, fields keep theirs; schemars'
//! non-standard `format`s (`uint64`, `int32`, ...) are removed; choices known only at run time can be listed with
//! [`AgentTool::argument_enum`](crate::AgentTool::argument_enum).

mod announce;
mod connections;
mod credentials;
mod exchanges;
mod handles;
mod late_answers;
mod limit;
mod listed;
mod listen;
mod naming;
mod parse;
mod plugin;
mod progress;
pub(crate) mod quiet;
mod recent;
mod request_ids;
mod security;
mod server;
mod sessions;
mod stream_log;
mod termination;

pub use credentials::Credentials;
pub(crate) use exchanges::RunningProbe;
pub use plugin::{McpPlugin, McpServer, McpUnavailable};
pub use quiet::RMCP_LOG_ENV;
pub use security::{McpConfigError, McpConfigErrorKind};
pub use server::{ERROR_META_KEY, OBSERVED_META_KEY};
