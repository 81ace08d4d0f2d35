//! A GPU error's exit (feature `render`). Bevy's default [`RenderErrorHandler`] quits by writing `AppExit` in the
//! render sub-app's extract, after the frame's schedules: the plugin's exit would never see it, and the open world
//! would not be saved. The plugin wraps the handler set when it is finished: the game's (or Bevy's) handler decides
//! first, then, if it wrote `AppExit`, the exit runs there ([`run_pending_exit`](super::run_pending_exit)).

use bevy::prelude::*;
use bevy::render::error_handler::{RenderError, RenderErrorHandler, RenderErrorPolicy};

/// The handler that was set when the plugin was finished: it still decides what a render error does.
#[derive(Resource)]
struct WrappedRenderErrorHandler(RenderErrorHandler);

/// Wraps the app's [`RenderErrorHandler`], if it has one (Bevy's `RenderPlugin` sets it), once.
pub(crate) fn wrap_render_error_handler(app: &mut App) {
    let world = app.world_mut();
    if world.contains_resource::<WrappedRenderErrorHandler>() {
        return;
    }
    let Some(handler) = world.remove_resource::<RenderErrorHandler>() else { return };
    world.insert_resource(WrappedRenderErrorHandler(handler));
    world.insert_resource(RenderErrorHandler(decide_then_exit));
}

/// The wrapped handler decides; an `AppExit` it wrote (Bevy's default handler writes one for every error) runs the
/// plugin's exit before the runner sees it.
fn decide_then_exit(error: &RenderError, main_world: &mut World, render_world: &mut World) -> RenderErrorPolicy {
    let policy = match main_world.get_resource::<WrappedRenderErrorHandler>() {
        Some(wrapped) => (wrapped.0 .0)(error, main_world, render_world),
        None => (RenderErrorHandler::default().0)(error, main_world, render_world),
    };
    if super::run_pending_exit(main_world) {
        tracing::info!("the renderer ended the app: the plugin's exit ran (the open world was closed and saved)");
    }
    policy
}
