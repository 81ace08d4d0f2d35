//! `tool_args`: an input is the JSON `arguments` of a tool call, sent to every tool of the fuzz game through the
//! path every transport takes: [`CallRequest::from_wire`] (which takes out the reserved `operation_id` and
//! `task_id`) and a conversation of the app's [`AgentHandle`](bevy_agent_tools::AgentHandle), on a headless app
//! whose frames this harness runs.
//!
//! Every call must end, within [`CALL_LIMIT`], in a success or a structured error with one of the host's codes
//! ([`check_outcome`]); nothing may panic, here or on the plugin's threads.

use std::time::{Duration, Instant};

use bevy::prelude::App;
use bevy_agent_tools::testing::{headless_app, AgentTestAppExt};
use bevy_agent_tools::{Call, CallRequest, Conversation, VisitId};
use serde_json::Value;

use crate::game::{self, check_outcome, is_allowed_code};
use crate::panics;

/// How long the calls of one input may take before the input counts as a hang. Each needs a few frames.
pub const CALL_LIMIT: Duration = Duration::from_secs(10);

/// One headless game in the fuzz world, kept for every input of the process.
pub struct ToolArgs {
    app: App,
    conversation: Conversation,
    visit: VisitId,
    tools: Vec<String>,
}

impl ToolArgs {
    /// Starts the game and enters the fuzz world.
    pub fn new() -> Self {
        panics::watch();
        let mut app = headless_app(game::plugin());
        app.enter_world(game::WORLD);
        let agent = app.agent();
        let visit = agent.visit().expect("the fuzz world opens in one frame").info.visit;
        let tools = agent.tools().into_iter().map(|tool| tool.name).collect();
        Self { app, conversation: agent.conversation("fuzz"), visit, tools }
    }

    /// Calls every tool with `data` as its arguments, if `data` is JSON, and checks every outcome.
    pub fn run(&mut self, data: &[u8]) {
        let Ok(arguments) = serde_json::from_slice::<Value>(data) else { return };
        let mut calls: Vec<(&str, Call)> = Vec::with_capacity(self.tools.len());
        for tool in &self.tools {
            match CallRequest::from_wire(tool.as_str(), arguments.clone()) {
                Ok(request) => calls.push((tool, self.conversation.request(request))),
                Err(error) => assert!(
                    is_allowed_code(&error.code) && !error.message.is_empty(),
                    "reserved arguments refused without a proper error: {error:?}"
                ),
            }
        }
        let deadline = Instant::now() + CALL_LIMIT;
        for (tool, call) in &calls {
            let outcome = loop {
                if let Some(outcome) = call.try_outcome() {
                    break outcome;
                }
                assert!(Instant::now() < deadline, "hang: `{tool}` did not resolve within {CALL_LIMIT:?}");
                self.app.update();
                // The handler runs on the plugin's threads: give it a moment to queue its next step.
                if let Some(outcome) = call.wait_timeout(Duration::from_micros(200)) {
                    break outcome;
                }
            };
            check_outcome(tool, &outcome, self.visit);
        }
        panics::assert_none("these tool arguments");
    }
}

impl Default for ToolArgs {
    fn default() -> Self {
        Self::new()
    }
}
