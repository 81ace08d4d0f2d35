//! The MCP transport: a Streamable HTTP server (the official `rmcp` SDK, both protocol generations it speaks)
//! on the plugin's runtime, secure by default.
//!
//! Add it after [`AgentToolsPlugin`](crate::AgentToolsPlugin):
//!
//! ```no_run
//! # use bevy::prelude::*;
//! # use bevy_agent_tools::prelude::*;
//! # use bevy_agent_tools::mcp::McpPlugin;
//! # fn add(app: &mut App) {
//! app.add_plugins(McpPlugin::new().port(15777));
//! let server = app.world().resource::<bevy_agent_tools::mcp::McpServer>();
//! println!("mcp: {}", server.url());
//! # }
//! ```
//!
//! Security, on by default: loopback only (a non-loopback bind is refused unless
//! [`McpPlugin::allow_non_loopback`]); a bearer token (generated per run unless set, written to a file readable
//! only by the user, never logged in full); `Origin` checked against an allow-list (requests without `Origin`, as
//! non-browser clients send, pass); `Host` checked; a request body limit; the per-conversation in-flight limit of
//! the host (429 at the HTTP layer, `BUSY` as an error result for a call that races past it). Refusals: 401
//! (token), 403 (Origin, Host), 413 (body), 429 (in-flight limit).
//!
//! A tool call travels as `tools/call`; domain errors come back as results with `isError: true` and the error
//! (`code`, `message`, `details`) in `structuredContent`; an unknown tool is a JSON-RPC error (-32602). Successful
//! results carry the visit and location they observed under `_meta["bevy_agent_tools/observed"]`.

mod limit;
mod naming;
mod parse;
mod plugin;
mod security;
mod server;
mod sessions;

pub use plugin::{McpPlugin, McpServer};
pub use security::McpConfigError;
pub use server::{ERROR_META_KEY, OBSERVED_META_KEY};
