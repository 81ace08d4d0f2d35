//! Feature `render`: a GPU error that makes Bevy's renderer end the app (its `RenderErrorHandler` writes `AppExit`
//! after the frame's schedules) still closes and saves the open world; a game's handler still decides.

mod common;

use std::sync::atomic::Ordering;

use bevy::prelude::*;
use bevy::render::error_handler::{ErrorType, RenderError, RenderErrorHandler, RenderErrorPolicy};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::AgentTestAppExt;
use bevy_agent_tools::AgentRuntime;
use common::TestGame;

/// A game in world `alpha` whose app has `handler` as Bevy's `RenderPlugin` would set it, and the render error
/// handler the plugin left in its place.
fn rendering_game(game: TestGame, handler: RenderErrorHandler) -> (App, RenderErrorHandler) {
    let mut app = App::new();
    app.add_plugins(MinimalPlugins);
    app.insert_resource(handler);
    app.add_plugins(AgentToolsPlugin::new(game));
    app.finish();
    app.cleanup();
    app.enter_world("alpha");
    let installed = RenderErrorHandler(app.world().resource::<RenderErrorHandler>().0);
    (app, installed)
}

/// What Bevy's renderer does on a GPU error: the main world's handler, from the render sub-app's extract.
fn render_error(app: &mut App, handler: &RenderErrorHandler) -> RenderErrorPolicy {
    let error = RenderError { ty: ErrorType::Validation, description: "injected".into(), source: None };
    (handler.0)(&error, app.world_mut(), &mut World::new())
}

#[test]
fn h6_a_render_error_that_ends_the_app_closes_and_saves_the_open_world_before_the_runner_stops() {
    let game = TestGame::default();
    let record = game.record.clone();
    let (mut app, installed) = rendering_game(game, RenderErrorHandler::default());
    let policy = render_error(&mut app, &installed);
    assert!(matches!(policy, RenderErrorPolicy::StopRendering), "Bevy's handler decided, as without the plugin");
    assert!(app.should_exit().is_some(), "it wrote AppExit: the runner stops after this frame");
    assert_eq!(record.closes.load(Ordering::SeqCst), 1, "the visit was closed (and saved) already");
    assert!(app.world().resource::<AgentRuntime>().is_stopped(), "the whole exit ran");
}

#[test]
fn a_render_error_the_games_handler_ignores_leaves_the_world_open() {
    let game = TestGame::default();
    let record = game.record.clone();
    let (mut app, installed) = rendering_game(game, RenderErrorHandler(|_, _, _| RenderErrorPolicy::Ignore));
    let policy = render_error(&mut app, &installed);
    assert!(matches!(policy, RenderErrorPolicy::Ignore), "the game's handler decided");
    assert!(app.should_exit().is_none());
    assert_eq!(record.closes.load(Ordering::SeqCst), 0, "no exit: the world stays open");
    assert!(app.agent().visit().is_some());
}
