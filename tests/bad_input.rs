//! Bad input gets a clear, structured error at once: never a panic, never a hang.

mod common;

use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::AgentTestAppExt;
use common::*;
use serde_json::json;

#[test]
fn unknown_tool_is_tool_not_found_naming_the_closest_names() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("bumb", json!({}));
    let error = call.try_outcome().expect("rejected at once").expect_err("unknown");
    assert_eq!(error.code, ErrorCode::ToolNotFound);
    assert_eq!(error.details.extra["closest"][0], json!("bump"));
    assert!(error.message.contains("`bump`"), "{}", error.message);
    assert_eq!(error.details.tool.as_deref(), Some("bumb"));
}

#[test]
fn arguments_that_are_not_an_object_are_invalid_input() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    for args in [json!([1, 2]), json!("by=2"), json!(3)] {
        let error =
            app.agent().conversation("a").call("bump", args.clone()).try_outcome().expect("at once").expect_err("bad");
        assert_eq!(error.code, ErrorCode::InvalidInput, "{args}");
        assert!(error.message.contains("must be a JSON object"), "{}", error.message);
    }
}

#[test]
fn arguments_that_fail_the_schema_are_invalid_input_naming_the_field_and_why() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let error = app.agent().conversation("a").call("bump", json!({ "by": "lots" })).try_outcome().expect("at once");
    let error = error.expect_err("bad");
    assert_eq!(error.code, ErrorCode::InvalidInput);
    assert_eq!(error.details.extra["field"], json!("by"));
    // Checked against the published schema first: the reason is the validator's.
    let reason = error.details.extra["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("not of type") && reason.contains("integer"), "{error:?}");
    let error = app.agent().conversation("a").call("bump", json!({ "by": -1 })).try_outcome().expect("at once");
    assert_eq!(error.expect_err("negative").details.extra["field"], json!("by"));
}

#[test]
fn invalid_input_is_reported_even_without_a_world_and_before_admission() {
    let app = app_with(TestGame::default(), vec![]);
    let error = app.agent().conversation("a").call("bump", json!({ "by": [] })).try_outcome().expect("at once");
    assert_eq!(error.expect_err("bad").code, ErrorCode::InvalidInput);
}

#[test]
fn tools_list_their_schemas_scope_and_annotations() {
    let app = app_with(TestGame::default(), vec![]);
    let tools = app.agent().tools();
    let bump = tools.iter().find(|t| t.name == "bump").expect("registered");
    assert_eq!(bump.input_schema["type"], "object");
    assert!(bump.input_schema["properties"]["by"].is_object());
    assert_eq!(bump.output_schema["properties"]["counter"]["type"], "integer");
    let here = tools.iter().find(|t| t.name == "bump_here").expect("registered");
    assert_eq!(here.scope, ToolScope::Location);
}
