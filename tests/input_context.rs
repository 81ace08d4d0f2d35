//! Input context (H14): asked on the main thread once per input; `None` means none and is never replaced by an
//! older value.

mod common;

use std::sync::atomic::Ordering;

use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::AgentTestAppExt;
use common::*;
use serde_json::json;

#[test]
fn h14_input_context_is_asked_once_per_input_and_none_after_some_is_none() {
    let game = TestGame::default();
    *game.observations.lock() =
        vec![Some(json!({ "looking_at": "oak_log" })), None, Some(json!({ "looking_at": "sand" }))];
    let record = game.record.clone();
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");

    let first = app.run_future(conversation.observe_input()).expect("observed");
    assert_eq!(first.observation.as_ref().map(|o| o["looking_at"].clone()), Some(json!("oak_log")));
    assert_eq!(record.input_asks.load(Ordering::SeqCst), 1, "one input, one ask");

    let second = app.run_future(conversation.observe_input()).expect("observed");
    assert_eq!(second.observation, None, "None after Some is delivered as None");
    assert_eq!(record.input_asks.load(Ordering::SeqCst), 2);

    let third = app.run_future(conversation.observe_input()).expect("observed");
    assert_eq!(third.observation.as_ref().map(|o| o["looking_at"].clone()), Some(json!("sand")));
    assert_eq!(record.input_asks.load(Ordering::SeqCst), 3);
    assert_eq!(third.observed.world.as_str(), "alpha");
}

#[test]
fn h14_input_without_a_world_is_no_world_and_asks_nothing() {
    let game = TestGame::default();
    let record = game.record.clone();
    let mut app = app_with(game, vec![]);
    let error = app.run_future(app.agent().conversation("a").observe_input()).expect_err("no world");
    assert_eq!(error.code, ErrorCode::NoWorld);
    assert_eq!(record.input_asks.load(Ordering::SeqCst), 0);
}

#[test]
fn h14_an_input_no_longer_awaited_when_its_frame_comes_is_not_observed() {
    let game = TestGame::default();
    let record = game.record.clone();
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    // The input's observation is queued for the next frame, and the frame comes late: the in-game session has
    // stopped waiting (after 500 ms) and sent its text without it.
    let agent = app.agent();
    let observing = agent.runtime().spawn(agent.conversation("a").observe_input());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while agent.queued_steps() == 0 {
        assert!(std::time::Instant::now() < deadline, "the observation was never queued");
        std::thread::yield_now();
    }
    observing.abort();
    let aborted = agent.runtime().block_on(observing);
    assert!(aborted.is_err_and(|error| error.is_cancelled()), "dropped before its frame");
    app.step(1);
    assert_eq!(record.input_asks.load(Ordering::SeqCst), 0, "the game was not asked for it");
    app.run_future(agent.conversation("a").observe_input()).expect("the next input is observed");
    assert_eq!(record.input_asks.load(Ordering::SeqCst), 1);
}
