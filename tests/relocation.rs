//! Relocation (H2) and results that say which location they observed (H11).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{AgentTestAppExt, Gate};
use bevy_agent_tools::{LocationRevision, NoArgs};
use common::*;
use serde_json::json;

#[test]
fn h2_world_scoped_call_survives_travel() {
    let (mut app, gate, executions) = gated_app("slow", ToolScope::World);
    let call = app.agent().conversation("a").call("slow", json!({}));
    app.run_until("handler parked", |_| gate.arrived() == 1);
    app.travel("nether");
    gate.open();
    let output = app.run_until_resolved(&call).expect("a World-scoped call continues after travel");
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    assert_eq!(output.observed.location.dimension.as_str(), "nether");
}

#[test]
fn h2_location_scoped_call_admitted_before_travel_gets_location_changed_and_never_runs() {
    let gate = Gate::new();
    let (executions, answered) = (Arc::new(AtomicUsize::new(0)), answers());
    let game = TestGame::default();
    let record = game.record.clone();
    let tool =
        bump_tool_answered("slow_here", ToolScope::Location, executions.clone(), answered.clone(), Some(gate.clone()));
    let mut app = app_with(game, vec![tool]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("slow_here", json!({}));
    app.run_until("handler parked", |_| gate.arrived() == 1);
    app.travel("nether");

    let error = app.run_until_resolved(&call).expect_err("the call needs its location");
    assert_eq!(error.code, ErrorCode::LocationChanged);
    assert_eq!(error.details.revision, Some(LocationRevision(0)), "the error names the revision it was admitted under");
    gate.open();
    app.run_until("the handler's step answered", |_| answered.arrived() == 1);
    assert_eq!(executions.load(Ordering::SeqCst), 0, "its closure never ran");
    // On the same session, told where the player was and is now.
    let relocations: Vec<String> = record.events().into_iter().filter(|e| e.starts_with("relocated")).collect();
    assert_eq!(relocations, ["relocated visit#1 overworld@rev#0->nether@rev#1"]);
    assert_eq!(record.opens.load(Ordering::SeqCst), 1, "travel keeps the session");
}

/// The travel ends the call (H2) before the pump of its frame, so the queued step is refused by the call's end;
/// the pump's own revision recheck (defence in depth behind this) is tested on its own in `src/call/pump.rs`.
#[test]
fn h2_travel_ends_a_location_call_so_its_step_queued_in_the_same_frame_never_runs() {
    let executions = Arc::new(AtomicUsize::new(0));
    let mut app = app_with(TestGame::default(), vec![bump_tool("here", ToolScope::Location, executions.clone(), None)]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("here", json!({}));
    app.wait_for_queued_steps(1);
    app.travel("nether");
    assert_eq!(code(&app.run_until_resolved(&call)), Some(ErrorCode::LocationChanged));
    assert_eq!(executions.load(Ordering::SeqCst), 0);
}

#[test]
fn h11_results_carry_the_visit_and_revision_they_observed() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    let first = app.run_until_resolved(&conversation.call("bump", json!({}))).expect("ok");
    app.travel("nether").travel("overworld");
    let second = app.run_until_resolved(&conversation.call("bump_here", json!({}))).expect("ok");

    assert_eq!(first.observed.visit, second.observed.visit);
    assert_eq!(first.observed.location.revision, LocationRevision(0));
    assert_eq!(second.observed.location.revision, LocationRevision(2));
    assert_eq!(second.observed.location.dimension.as_str(), "overworld");
    let status = app.agent().visit().expect("open");
    assert_eq!(status.info.location, second.observed.location);
}

#[test]
fn h11_a_tools_error_carries_the_revision_its_step_observed_after_travel() {
    let gate = Gate::new();
    let occupied = AgentTool::new("place", "Finds the spot taken.", {
        let gate = gate.clone();
        move |ctx: CallContext<Session>, _: NoArgs| {
            let gate = gate.clone();
            async move {
                gate.pass().await;
                ctx.on_client(|_, _| ()).await?;
                Err::<(), _>(ToolError::new("OCCUPIED", "the spot is taken"))
            }
        }
    });
    let mut app = app_with(TestGame::default(), vec![occupied]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("place", json!({}));
    app.run_until("handler parked", |_| gate.arrived() == 1);
    app.travel("nether");
    gate.open();
    let error = app.run_until_resolved(&call).expect_err("the spot is taken");
    assert_eq!(error.code, ErrorCode::Tool("OCCUPIED".into()));
    assert_eq!(error.details.revision, Some(LocationRevision(1)), "found taken in the nether, where its step ran");
}
