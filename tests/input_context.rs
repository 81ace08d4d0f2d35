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
