//! The renderer's exits (feature `render`). Bevy's renderer writes `AppExit` while its sub-apps extract, after
//! the frame's schedules, where the plugin's exit would never see it and the open world would not be saved: its
//! default `RenderErrorHandler` on a GPU error (or a handler of the game's that gives up), and the main thread
//! when the render thread panicked (pipelined rendering). The plugin wraps the extract of Bevy's render sub-apps:
//! once it is done, an `AppExit` it wrote runs the exit there ([`run_pending_exit`](super::run_pending_exit)),
//! before the runner sees it.

use bevy::app::AppLabel;
use bevy::prelude::*;
use bevy::render::pipelined_rendering::RenderExtractApp;
use bevy::render::RenderApp;

/// Wraps the extract of the app's render sub-apps, those it has: `RenderApp` (where Bevy's `RenderErrorHandler`
/// runs) and, with pipelined rendering, `RenderExtractApp` (where the render thread's panic is seen).
pub(crate) fn exit_after_render_extracts(app: &mut App) {
    wrap_extract(app, RenderApp);
    wrap_extract(app, RenderExtractApp);
}

fn wrap_extract(app: &mut App, label: impl AppLabel) {
    let Some(sub_app) = app.get_sub_app_mut(label) else { return };
    let Some(mut extract) = sub_app.take_extract() else { return };
    sub_app.set_extract(move |main_world, sub_world| {
        extract(main_world, sub_world);
        if super::run_pending_exit(main_world) {
            tracing::info!("the renderer ended the app: the plugin's exit ran (the open world was closed and saved)");
        }
    });
}
