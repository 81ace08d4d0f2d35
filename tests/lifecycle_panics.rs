//! A panic in the lifecycle callbacks whose failure has a defined outcome never takes the game down: `open` (H4:
//! reported as `WorldOpenFailed`, no session held), `close` (its completion fails and says so), `input_context`
//! (`INTERNAL`). (`tick`, `relocated` and `shutdown` are not caught: see `WorldLifecycle`.)

use bevy::ecs::message::Messages;
use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app, AgentTestAppExt};
use bevy_agent_tools::{VisitSaved, WorldOpenFailed};
use serde_json::json;

mod common;

/// Panics in whichever callback its world's name says.
struct Panicky;

impl WorldLifecycle for Panicky {
    type Session = String;

    fn open(&self, visit: &VisitInfo, _: &mut World) -> Result<Opened<String>, OpenError> {
        if visit.world.as_str() == "panics_in_open" {
            panic!("the save is on fire");
        }
        Ok(Opened::ready(visit.world.to_string()))
    }

    fn close(&self, world_name: String, _: &mut World) -> Completion {
        if world_name == "panics_in_close" {
            panic!("the disk is on fire");
        }
        Completion::done()
    }

    fn input_context(&self, world_name: &String, _: &World) -> Option<serde_json::Value> {
        if world_name == "panics_in_input" {
            panic!("the eyes are on fire");
        }
        Some(json!({ "world": world_name }))
    }
}

fn app() -> App {
    let peek = AgentTool::new("peek", "Reads the world's name.", |ctx: CallContext<String>, _: NoArgs| async move {
        ctx.on_client(|_, name| name.clone()).await
    })
    .read_only();
    headless_app(AgentToolsPlugin::new(Panicky).with_tool(peek))
}

/// An app that ends without the plugin's exit drops its open world unsaved: the log says so, also when a panic
/// unwound it (the panic's own message says nothing of the world).
#[test]
fn an_app_that_ends_with_a_world_open_without_the_exit_says_the_world_was_not_saved() {
    let built = |world: &str| {
        let mut app = App::new();
        app.add_plugins((MinimalPlugins, AgentToolsPlugin::new(Panicky)));
        app.finish();
        app.cleanup();
        app.world_mut().write_message(EnterWorld::new(world));
        app.update();
        app
    };
    let (unwound, said) = common::warnings::with_warnings(|| {
        std::panic::catch_unwind(|| {
            let mut app = built("meadow");
            app.add_systems(Update, || -> () { panic!("a system is on fire") });
            app.update();
        })
    });
    assert!(unwound.is_err(), "the panic unwound the app");
    let unsaved = |line: &String, world: &str| line.contains("not saved") && line.contains(&format!("world={world}"));
    assert!(said.iter().any(|line| unsaved(line, "meadow") && line.contains("panic")), "{said:#?}");

    let ((), said) = common::warnings::with_warnings(|| drop(built("orchard")));
    assert!(
        said.iter().any(|line| unsaved(line, "orchard") && line.contains("without the plugin's exit")),
        "{said:#?}"
    );
}

#[test]
fn h4_a_panic_in_open_is_world_open_failed_no_visit_is_held_and_the_next_enter_works() {
    let mut app = app();
    app.enter_world("panics_in_open");
    let failed: Vec<WorldOpenFailed> = app.world_mut().resource_mut::<Messages<WorldOpenFailed>>().drain().collect();
    assert_eq!(failed.len(), 1, "one WorldOpenFailed");
    assert_eq!(failed[0].world.as_str(), "panics_in_open");
    assert!(failed[0].error.message().contains("the save is on fire"), "{}", failed[0].error.message());
    assert!(app.agent().visit().is_none(), "no visit is held");
    let call = app.agent().conversation("a").call("peek", json!({}));
    assert_eq!(call.try_outcome().expect("at once").expect_err("no world").code, ErrorCode::NoWorld);

    app.enter_world("meadow");
    let call = app.agent().conversation("a").call("peek", json!({}));
    assert_eq!(app.run_until_resolved(&call).expect("the next enter works").value, json!("meadow"));
}

#[test]
fn a_panic_in_close_fails_its_completion_and_the_game_runs_on() {
    let mut app = app();
    app.enter_world("panics_in_close");
    app.exit_world();
    let saved: Vec<VisitSaved> = app.world_mut().resource_mut::<Messages<VisitSaved>>().drain().collect();
    assert_eq!(saved.len(), 1, "the close's outcome is reported");
    let error = saved[0].result.clone().expect_err("the completion failed");
    assert!(error.to_string().contains("the disk is on fire"), "{error}");
    assert!(app.agent().visit().is_none());

    app.enter_world("meadow");
    let call = app.agent().conversation("a").call("peek", json!({}));
    assert_eq!(app.run_until_resolved(&call).expect("the next visit works").value, json!("meadow"));
}

#[test]
fn h14_a_panic_in_input_context_is_internal_and_the_game_runs_on() {
    let mut app = app();
    app.enter_world("panics_in_input");
    let error = app.run_future(app.agent().conversation("a").observe_input()).expect_err("panicked");
    assert_eq!(error.code, ErrorCode::Internal);
    assert!(error.message.contains("the eyes are on fire"), "{}", error.message);
    let call = app.agent().conversation("a").call("peek", json!({}));
    assert!(app.run_until_resolved(&call).is_ok(), "the game runs on");
}
