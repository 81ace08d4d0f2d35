//! Sessions that load asynchronously (H3): calls wait for them, bounded by their timeout.

mod common;

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::AgentTestAppExt;
use bevy_agent_tools::{CallRequest, VisitLoadFailed, VisitPhase};
use common::*;
use serde_json::json;

fn loading_game() -> TestGame {
    TestGame { load_async: true, ..Default::default() }
}

#[test]
fn h3_call_during_loading_waits_then_succeeds() {
    let game = loading_game();
    let loading = game.loading.clone();
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    assert_eq!(app.agent().visit().expect("open").phase, VisitPhase::Loading);

    let call = app.agent().conversation("a").call("bump", json!({}));
    app.step(20);
    assert!(call.try_outcome().is_none(), "the call waits for the session to load, it is not rejected");

    loading.lock().take().expect("open handed out a completer").succeed();
    let output = app.run_until_resolved(&call).expect("the call runs once loaded");
    assert_eq!(output.value["counter"], 1);
    assert_eq!(app.agent().visit().expect("open").phase, VisitPhase::Open);
}

#[test]
fn h3_call_past_its_timeout_while_loading_gets_world_loading_timeout() {
    let game = loading_game();
    let loading = game.loading.clone();
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    let call =
        app.agent().conversation("a").request(CallRequest::new("bump", json!({})).timeout(Duration::from_millis(50)));
    let error = app.run_until_resolved(&call).expect_err("loading never finished");
    assert_eq!(error.code, ErrorCode::WorldLoadingTimeout);
    drop(loading.lock().take());
}

#[test]
fn h3_a_call_for_a_tool_the_loading_world_has_not_registered_yet_times_out_with_world_loading_timeout() {
    let game = loading_game();
    let loading = game.loading.clone();
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    let call = app
        .agent()
        .conversation("a")
        .request(CallRequest::new("registered_when_loaded", json!({})).timeout(Duration::from_millis(50)));
    let error = app.run_until_resolved(&call).expect_err("loading never finished");
    assert_eq!(error.code, ErrorCode::WorldLoadingTimeout, "not TOOL_NOT_FOUND: {}", error.message);
    drop(loading.lock().take());
}

#[test]
fn h3_a_call_for_a_tool_that_waited_for_the_load_ends_soon_after_it_with_tool_not_found_or_the_loads_error() {
    // A typo made while the world loads waits for the load, not for its whole timeout (30 s by default) after it.
    let game = loading_game();
    let loading = game.loading.clone();
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("plcae_block", json!({}));
    app.step(3);
    assert!(call.try_outcome().is_none(), "it waits while the world loads");
    let loaded = std::time::Instant::now();
    loading.lock().take().expect("completer").succeed();
    let error = app.run_until_resolved(&call).expect_err("never registered");
    assert_eq!(error.code, ErrorCode::ToolNotFound, "{}", error.message);
    assert!(loaded.elapsed() < Duration::from_secs(15), "ended soon after the load: {:?}", loaded.elapsed());
    // A tool the world registers as it finishes loading is still found.
    let game = loading_game();
    let loading = game.loading.clone();
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("registered_when_loaded", json!({}));
    loading.lock().take().expect("completer").succeed();
    app.step(2);
    let tool = bump_tool("registered_when_loaded", ToolScope::World, Arc::default(), None);
    app.agent().register_tool(tool).expect("registered");
    assert_eq!(app.run_until_resolved(&call).expect("found").value["counter"], 1);
    // A load that fails: its error at once, as a call for a registered tool gets.
    let game = loading_game();
    let loading = game.loading.clone();
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("plcae_block", json!({}));
    let failed = std::time::Instant::now();
    loading.lock().take().expect("completer").fail("region file unreadable");
    let error = app.run_until_resolved(&call).expect_err("load failed");
    assert_eq!(error.code, ErrorCode::Internal, "{}", error.message);
    assert!(error.message.contains("region file unreadable"), "{}", error.message);
    assert!(failed.elapsed() < Duration::from_secs(15), "at once: {:?}", failed.elapsed());
}

#[test]
fn h3_a_session_that_fails_to_load_fails_waiting_calls_with_internal() {
    let game = loading_game();
    let loading = game.loading.clone();
    let mut app = app_with(game, vec![]);
    app.init_resource::<LoadFailures>().add_systems(
        Update,
        |mut read: MessageReader<VisitLoadFailed>, mut seen: ResMut<LoadFailures>| {
            seen.0.extend(read.read().cloned());
        },
    );
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("bump", json!({}));
    loading.lock().take().expect("completer").fail("region file unreadable");
    let error = app.run_until_resolved(&call).expect_err("load failed");
    assert_eq!(error.code, ErrorCode::Internal);
    assert!(error.message.contains("region file unreadable"), "{}", error.message);
    // The game hears of it once, as a message naming the visit and why.
    app.run_until("the failure is reported", |app| !app.world().resource::<LoadFailures>().0.is_empty());
    app.step(3);
    let failed = &app.world().resource::<LoadFailures>().0;
    assert_eq!(failed.len(), 1, "reported once: {failed:?}");
    assert_eq!(failed[0].info.world.as_str(), "alpha");
    assert!(failed[0].error.message().contains("region file unreadable"));
    let phase = app.agent().visit().expect("the visit stays open until the game exits it").phase;
    assert_eq!(phase, VisitPhase::LoadFailed, "what a HUD reads says so too");
}

#[derive(Resource, Default)]
struct LoadFailures(Vec<VisitLoadFailed>);

#[test]
fn h3_exit_during_loading_ends_waiting_calls() {
    let game = loading_game();
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("bump", json!({}));
    app.exit_world();
    assert_eq!(code(&app.run_until_resolved(&call)), Some(ErrorCode::VisitEnded));
}

#[test]
fn h3_input_context_waits_for_a_loading_world_and_is_asked_of_it_once_loaded() {
    let game = loading_game();
    let (loading, record) = (game.loading.clone(), game.record.clone());
    *game.observations.lock() = vec![Some(json!({ "looking_at": "oak_log" }))];
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    let observing = app.agent().runtime().spawn(app.agent().conversation("a").observe_input());
    app.step(20);
    assert!(!observing.is_finished(), "the input waits for the session to load");
    assert_eq!(record.input_asks.load(Ordering::SeqCst), 0, "a session still loading is not asked");

    loading.lock().take().expect("open handed out a completer").succeed();
    let observed = app.run_future(async move { observing.await.map_err(|e| e.to_string()) });
    let observed = observed.expect("joined").expect("observed once loaded");
    assert_eq!(observed.observation.map(|o| o["looking_at"].clone()), Some(json!("oak_log")));
    assert_eq!(record.input_asks.load(Ordering::SeqCst), 1);
}

#[test]
fn h3_input_context_of_a_world_that_fails_to_load_is_internal_and_asks_nothing() {
    let game = loading_game();
    let (loading, record) = (game.loading.clone(), game.record.clone());
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    let observing = app.agent().runtime().spawn(app.agent().conversation("a").observe_input());
    loading.lock().take().expect("completer").fail("region file unreadable");
    let error = app.run_future(async move { observing.await.map_err(|e| e.to_string()) });
    let error = error.expect("joined").expect_err("load failed");
    assert_eq!(error.code, ErrorCode::Internal);
    assert!(error.message.contains("region file unreadable"), "{}", error.message);
    assert_eq!(record.input_asks.load(Ordering::SeqCst), 0);
}

#[test]
fn h3_input_context_awaited_when_the_player_leaves_a_loading_world_is_visit_ended_at_once() {
    let game = loading_game();
    let (loading, record) = (game.loading.clone(), game.record.clone());
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    // Polled once here, so that it is waiting for the load before the exit (a task spawned may not have run yet).
    let mut observing = Box::pin(app.agent().conversation("a").observe_input());
    {
        let _runtime = app.agent().runtime().enter();
        let mut polled = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(observing.as_mut().poll(&mut polled).is_pending(), "it waits for the load");
    }
    let observing = app.agent().runtime().spawn(observing);
    // The load never finishes (its completer is kept): only the exit can end the wait before the timeout.
    app.exit_world();
    let error = app.run_future(async move { observing.await.map_err(|e| e.to_string()) });
    let error = error.expect("joined").expect_err("left");
    assert_eq!(error.code, ErrorCode::VisitEnded, "{error:?}");
    assert_eq!(record.input_asks.load(Ordering::SeqCst), 0);
    drop(loading.lock().take());
}

#[test]
fn h14_an_input_whose_observation_is_no_longer_awaited_is_not_observed_once_the_world_loads() {
    let game = loading_game();
    let (loading, record) = (game.loading.clone(), game.record.clone());
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    // An in-game session stops waiting for the observation after 500 ms and sends its text without one.
    let waiting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (observe, pending) = (app.agent().conversation("a").observe_input(), waiting.clone());
    let observing = app.agent().runtime().spawn(async move {
        let mut observe = std::pin::pin!(observe);
        std::future::poll_fn(|cx| {
            let poll = observe.as_mut().poll(cx);
            pending.store(poll.is_pending(), Ordering::SeqCst);
            poll
        })
        .await
    });
    // Aborted only once it waits for the load: aborted before its first poll, it would never have been asked.
    app.run_until("the observation waits for the load", |_| waiting.load(Ordering::SeqCst));
    app.step(3);
    observing.abort();
    loading.lock().take().expect("completer").succeed();
    // The next input is observed: every job sent before it has run by the time it answers.
    let next = app.run_future(app.agent().conversation("a").observe_input());
    next.expect("the next input is observed");
    assert_eq!(record.input_asks.load(Ordering::SeqCst), 1, "only the input still awaited was observed");
}
