//! Arbitrary bytes as the body of an authorized POST to the game's MCP endpoint: see `entry/mcp_body.rs`.
#![no_main]

// `check_outcome` is for in-process calls; over MCP only the codes are checked.
#[allow(dead_code)]
#[path = "../entry/game.rs"]
mod game;
#[path = "../entry/mcp_body.rs"]
mod mcp_body;
#[path = "../entry/panics.rs"]
mod panics;

use std::sync::{Mutex, OnceLock, PoisonError};

use libfuzzer_sys::fuzz_target;
use mcp_body::McpBody;

/// One game and one connection for the whole fuzzing process: starting a game per input would fuzz start-up.
static HARNESS: OnceLock<Mutex<McpBody>> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let harness = HARNESS.get_or_init(|| Mutex::new(McpBody::new()));
    harness.lock().unwrap_or_else(PoisonError::into_inner).run(data);
});
