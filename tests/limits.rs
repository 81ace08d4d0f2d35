//! The per-conversation in-flight limit (`BUSY`), progress reports, and time limits as long as the clock allows.

mod common;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use bevy::app::AppExit;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app, AgentTestAppExt, Gate};
use bevy_agent_tools::{CallRequest, NoArgs, Progress, ProgressSink};
use common::*;
use parking_lot::Mutex;
use serde_json::json;

/// A game in world `alpha` with a `slow` tool held at a gate and `limit` calls in flight per conversation.
fn limited(limit: usize) -> (bevy::app::App, Gate) {
    let gate = Gate::new();
    let slow = bump_tool("slow", ToolScope::World, Arc::new(AtomicUsize::new(0)), Some(gate.clone()));
    let plugin = AgentToolsPlugin::new(TestGame::default()).max_in_flight_per_conversation(limit).with_tool(slow);
    let mut app = headless_app(plugin);
    app.enter_world("alpha");
    (app, gate)
}

#[test]
fn busy_when_a_conversation_is_over_its_in_flight_limit_and_others_are_unaffected() {
    let (mut app, gate) = limited(2);
    let greedy = app.agent().conversation("greedy");
    let first = [greedy.call("slow", json!({})), greedy.call("slow", json!({}))];
    let third = greedy.call("slow", json!({}));
    let error = third.try_outcome().expect("at once").expect_err("busy");
    assert_eq!(error.code, ErrorCode::Busy);
    assert_eq!(error.details.extra["limit"], 2);
    let other = app.agent().conversation("other").call("slow", json!({}));
    assert!(other.is_running(), "the limit is per conversation");
    gate.open();
    for call in first.iter().chain([&other]) {
        assert!(app.run_until_resolved(call).is_ok());
    }
    assert!(app.run_until_resolved(&greedy.call("slow", json!({}))).is_ok(), "room again once calls finished");
}

#[test]
fn busy_never_counts_a_call_whose_caller_already_has_its_outcome() {
    let (mut app, _gate) = limited(1);
    let agent = app.agent().conversation("agent");
    for round in 0..20 {
        let call = agent.call("slow", json!({}));
        assert!(call.cancel());
        assert_eq!(call.try_outcome().map(|o| o.map_err(|e| e.code)), Some(Err(ErrorCode::Cancelled)));
        // The caller has its outcome: its next call is not refused, even before the host forgot the first.
        let next = agent.call("slow", json!({}));
        let refused = next.try_outcome().and_then(|o| o.err()).map(|e| e.code);
        assert_ne!(refused, Some(ErrorCode::Busy), "round {round}");
        assert!(next.cancel());
        app.update();
    }
}

#[test]
fn a_retry_at_the_limit_joins_its_running_operation_or_gets_its_retained_outcome_instead_of_busy() {
    let gate = Gate::new();
    let plugin = AgentToolsPlugin::new(TestGame::default())
        .max_in_flight_per_conversation(1)
        .with_tool(bump_tool("slow", ToolScope::World, Arc::new(AtomicUsize::new(0)), Some(gate.clone())))
        .with_tool(bump_tool("quick", ToolScope::World, Arc::new(AtomicUsize::new(0)), None));
    let mut app = headless_app(plugin);
    app.enter_world("alpha");
    let agent = app.agent().conversation("agent");
    let keyed = |tool: &str| CallRequest::new(tool, json!({})).operation(format!("op-{tool}"));
    let done = app.run_until_resolved(&agent.request(keyed("quick"))).expect("ran");
    let running = agent.request(keyed("slow"));
    assert!(running.is_running(), "the conversation is at its limit now");
    let joined = agent.request(keyed("slow"));
    assert!(joined.is_running(), "a retry joins its running operation: {:?}", joined.try_outcome());
    let retained = agent.request(keyed("quick")).try_outcome().expect("at once");
    assert_eq!(retained.expect("the retained outcome").value, done.value);
    let other = agent.call("quick", json!({})).try_outcome().and_then(|o| o.err()).map(|e| e.code);
    assert_eq!(other, Some(ErrorCode::Busy), "a new execution is still refused");
    gate.open();
    assert!(app.run_until_resolved(&joined).is_ok());
}

#[test]
fn busy_never_counts_a_call_the_conversation_stopped_waiting_for_that_goes_on_for_another() {
    let (mut app, gate) = limited(1);
    let (a, b) = (app.agent().conversation("a"), app.agent().conversation("b"));
    let shared = || CallRequest::new("slow", json!({})).operation("op").task("shared");
    let first = a.request(shared());
    let retry = b.request(shared());
    assert!(first.is_running() && retry.is_running(), "b's retry joined a's execution");
    let control = a.call("slow", json!({})).try_outcome().and_then(|o| o.err()).map(|e| e.code);
    assert_eq!(control, Some(ErrorCode::Busy), "the control: a is at its limit while it waits");
    assert_eq!(a.cancel_task("shared"), 1, "a stops waiting; the execution goes on for b");
    let next = a.call("slow", json!({}));
    assert!(next.is_running(), "a waits for nothing: {:?}", next.try_outcome());
    gate.open();
    assert!(app.run_until_resolved(&retry).is_ok() && app.run_until_resolved(&next).is_ok());
}

#[test]
fn progress_reports_reach_the_caller_in_order() {
    let tool = AgentTool::new("long", "Reports progress.", |ctx: CallContext<Session>, _: NoArgs| async move {
        for step in 1..=3 {
            ctx.on_client(|_, session| session.counter += 1).await?;
            ctx.report_progress(step as f64, Some(3.0), Some(format!("step {step}")));
        }
        Ok(())
    });
    let mut app = headless_app(AgentToolsPlugin::new(TestGame::default()).with_tool(tool));
    app.enter_world("alpha");
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let sink = {
        let seen = seen.clone();
        ProgressSink::new(move |progress| seen.lock().push(progress))
    };
    let call = app.agent().conversation("a").request(CallRequest::new("long", json!({})).progress(sink));
    assert!(app.run_until_resolved(&call).is_ok());
    let seen = seen.lock();
    assert_eq!(seen.iter().map(|p| p.progress).collect::<Vec<_>>(), [1.0, 2.0, 3.0]);
    assert_eq!(seen[2].message.as_deref(), Some("step 3"));
    assert_eq!(seen[0].total, Some(3.0));
}

#[test]
fn a_time_limit_too_long_for_the_clock_means_no_limit_and_never_panics() {
    // `Duration::MAX` is how a game says "no limit"; `Instant + Duration::MAX` would panic.
    let plugin = AgentToolsPlugin::new(TestGame::default())
        .default_timeout(Duration::MAX)
        .exit_deadline(Duration::MAX)
        .with_tool(bump_tool("bump", ToolScope::World, Arc::default(), None))
        .with_tool(bump_tool("patient", ToolScope::World, Arc::default(), None).timeout(Duration::MAX));
    let mut app = headless_app(plugin);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    let calls = [
        conversation.call("bump", json!({"by": 1})),
        conversation.call("patient", json!({"by": 1})),
        conversation.request(CallRequest::new("bump", json!({"by": 1})).timeout(Duration::MAX)),
    ];
    for call in &calls {
        assert!(app.run_until_resolved(call).is_ok());
        assert!(call.wait_timeout(Duration::MAX).is_some_and(|outcome| outcome.is_ok()));
    }
    app.world_mut().write_message(AppExit::Success);
    app.run_until("the app exits", |app| app.should_exit().is_some());
}
