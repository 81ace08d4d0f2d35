//! Feature `render`: when Bevy's renderer ends the app (an `AppExit` written as its sub-apps extract, after the
//! frame's schedules: its `RenderErrorHandler` on a GPU error, a render thread that panicked), the open world is
//! still closed and saved before the runner stops.

mod common;

use std::sync::atomic::Ordering;

use bevy::app::{AppLabel, SubApp};
use bevy::prelude::*;
use bevy::render::error_handler::{ErrorType, RenderError, RenderErrorHandler, RenderErrorPolicy};
use bevy::render::pipelined_rendering::RenderExtractApp;
use bevy::render::RenderApp;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::AgentTestAppExt;
use bevy_agent_tools::AgentRuntime;
use common::TestGame;

/// A game in world `alpha` whose render sub-app `label` extracts with `extract`, as Bevy's does (the render
/// sub-apps' own worlds need no renderer for that).
fn rendering_game(
    game: TestGame,
    label: impl AppLabel,
    extract: impl FnMut(&mut World, &mut World) + Send + 'static,
) -> App {
    let mut app = App::new();
    app.add_plugins(MinimalPlugins);
    let mut render = SubApp::new();
    render.set_extract(extract);
    app.insert_sub_app(label, render);
    app.add_plugins(AgentToolsPlugin::new(game));
    app.finish();
    app.cleanup();
    app.enter_world("alpha");
    app
}

/// Set in the main world: the renderer fails in the next frame's extract.
#[derive(Resource)]
struct Fails;

/// What Bevy's `RenderApp` extract does first: on an error, the main world's `RenderErrorHandler` decides.
fn handle_a_gpu_error(main_world: &mut World, render_world: &mut World) {
    if main_world.remove_resource::<Fails>().is_none() {
        return;
    }
    let error = RenderError { ty: ErrorType::Validation, description: "injected".into(), source: None };
    let handler = main_world.resource::<RenderErrorHandler>().0;
    let policy = handler(&error, main_world, render_world);
    render_world.insert_resource(Policy(matches!(policy, RenderErrorPolicy::StopRendering)));
}

/// Set in the render world: the handler decided to stop rendering (`true`), or not.
#[derive(Resource)]
struct Policy(bool);

fn decided_to_stop_rendering(app: &App) -> Option<bool> {
    app.sub_app(RenderApp).world().get_resource::<Policy>().map(|policy| policy.0)
}

#[test]
fn h6_a_gpu_error_that_ends_the_app_closes_and_saves_the_open_world_in_that_frame() {
    let game = TestGame::default();
    let record = game.record.clone();
    let mut app = rendering_game(game, RenderApp, handle_a_gpu_error);
    app.init_resource::<RenderErrorHandler>(); // Bevy's: quits on every error
    app.insert_resource(Fails);
    app.update();
    assert_eq!(decided_to_stop_rendering(&app), Some(true), "Bevy's handler decided, as without the plugin");
    assert!(app.should_exit().is_some(), "it wrote AppExit: the runner stops after this frame");
    assert_eq!(record.closes.load(Ordering::SeqCst), 1, "the visit was closed (and saved) already");
    assert!(app.world().resource::<AgentRuntime>().is_stopped(), "the whole exit ran");
}

#[test]
fn h6_a_render_thread_that_panicked_ends_the_app_and_the_open_world_is_still_saved() {
    let game = TestGame::default();
    let record = game.record.clone();
    // Pipelined rendering: the main thread's extract finds the render thread gone and writes AppExit.
    let mut app = rendering_game(game, RenderExtractApp, |main_world, _| {
        if main_world.remove_resource::<Fails>().is_some() {
            main_world.write_message(AppExit::error());
        }
    });
    app.insert_resource(Fails);
    app.update();
    assert!(app.should_exit().is_some());
    assert_eq!(record.closes.load(Ordering::SeqCst), 1, "the visit was closed (and saved) already");
}

#[test]
fn a_gpu_error_the_games_handler_ignores_leaves_the_world_open() {
    let game = TestGame::default();
    let record = game.record.clone();
    let mut app = rendering_game(game, RenderApp, handle_a_gpu_error);
    app.insert_resource(RenderErrorHandler(|_, _, _| RenderErrorPolicy::Ignore));
    app.insert_resource(Fails);
    app.update();
    assert_eq!(decided_to_stop_rendering(&app), Some(false), "the game's handler decided");
    assert!(app.should_exit().is_none());
    assert_eq!(record.closes.load(Ordering::SeqCst), 0, "no exit: the world stays open");
    assert!(app.agent().visit().is_some());
    app.update();
    assert!(app.agent().visit().is_some(), "and the game goes on");
}
