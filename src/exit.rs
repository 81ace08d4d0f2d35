//! The game's exit (`AppExit`): the order in which in-game agent sessions, the host and the transports stop
//! ([`AgentToolsExitSystems`]), and the host's part of it.

use std::time::{Duration, Instant};

use bevy::app::{AppExit, MainScheduleOrder};
use bevy::ecs::message::Messages;
use bevy::ecs::schedule::ScheduleLabel;
use bevy::ecs::system::ScheduleSystem;
use bevy::prelude::*;

#[cfg(feature = "render")]
mod render;

#[cfg(feature = "render")]
pub(crate) use render::exit_after_render_extracts;

use crate::lifecycle::WorldLifecycle;
use crate::runtime::AgentRuntime;
use crate::visit::VisitSlot;

/// What happens on `AppExit`, in this order, in the `Last` schedule: in-game agent sessions end or disconnect
/// and their agent processes stop; then the open visit closes (its calls end, `VISIT_ENDED`), its save completes,
/// tool handlers still cleaning up after their calls ended return (at most 2 s: rule H10) and the lifecycle shuts
/// down; then transports send the outcomes of the calls that ended and stop; after
/// `Transport`, the host's runtime stops. The sessions' part is bounded by 5 s (an agent's close: its input closed,
/// 1 s, `SIGTERM`, 2 s, `SIGKILL`), the host's and the transports' by
/// [`AgentToolsPlugin::exit_deadline`](crate::AgentToolsPlugin::exit_deadline). Order a game's own exit work
/// against these: a system in `Last` after `Host` reads the exit's [`VisitClosed`](crate::VisitClosed) and
/// [`VisitSaved`](crate::VisitSaved) messages (the app runs no frame after this one; a save still running at the
/// deadline is reported as failed).
///
/// An `AppExit` written in `Last` after these sets began (by a system not ordered before them) is not missed: then
/// the whole exit, in the same order, runs in a schedule right after `Last` in that frame, so the visit is still
/// closed and saved before the app's runner sees the exit (systems in `Last` do not see that exit's messages).
#[derive(SystemSet, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AgentToolsExitSystems {
    /// In-game agent sessions (`session::AgentSessionsPlugin`, feature `acp` or `openai`).
    Sessions,
    /// The host: the visit's exit, every outstanding save, `WorldLifecycle::shutdown`.
    Host,
    /// Transports (`mcp::McpPlugin`, feature `mcp`).
    Transport,
}

/// Runs right after `Last`: the exit, for an `AppExit` written in `Last` after the exit was decided there.
#[derive(ScheduleLabel, Clone, Debug, PartialEq, Eq, Hash)]
struct LateExit;

/// Where the exit runs, decided once, before its first step: all of it in `Last`, or all of it in [`LateExit`].
/// (Deciding per step would split it: an `AppExit` written between two sets of `Last` would run the later sets
/// there and the earlier ones after, or not at all.)
#[derive(Resource, Clone, Copy, PartialEq, Eq)]
enum ExitIn {
    Last,
    LateExit,
}

/// Sets the exit's order in `Last` and in the schedule after it that catches a late `AppExit`.
pub(crate) fn configure(app: &mut App) {
    if let Some(mut order) = app.world_mut().get_resource_mut::<MainScheduleOrder>() {
        order.insert_after(Last, LateExit);
    }
    let decide_in_last = decide(ExitIn::Last).before(AgentToolsExitSystems::Sessions);
    // Bevy's window-close exits (`exit_on_all_closed`, ...) are written in `Last`: decide after them.
    #[cfg(feature = "winit")]
    let decide_in_last = decide_in_last.after(bevy::window::ExitSystems);
    app.configure_sets(
        Last,
        (AgentToolsExitSystems::Sessions, AgentToolsExitSystems::Host, AgentToolsExitSystems::Transport).chain(),
    )
    .configure_sets(
        LateExit,
        (AgentToolsExitSystems::Sessions, AgentToolsExitSystems::Host, AgentToolsExitSystems::Transport).chain(),
    )
    .add_systems(Last, decide_in_last)
    .add_systems(LateExit, decide(ExitIn::LateExit).before(AgentToolsExitSystems::Sessions));
}

/// Moves [`LateExit`] to the end of the frame's schedules, once every plugin is built: one a plugin inserted after
/// `Last` before this one was built would run after it, and an `AppExit` written there would be missed (no close,
/// no save, no `shutdown`).
pub(crate) fn run_late_exit_last(app: &mut App) {
    if let Some(mut order) = app.world_mut().get_resource_mut::<MainScheduleOrder>() {
        let late = LateExit.intern();
        order.labels.retain(|label| *label != late);
        order.labels.push(late);
    }
}

/// Adds the exit's `systems` (each placed in an [`AgentToolsExitSystems`]) to `Last` and to the schedule after it: they
/// run in the one the exit was decided in.
pub(crate) fn add_exit_systems<M, C: IntoScheduleConfigs<ScheduleSystem, M>>(app: &mut App, systems: impl Fn() -> C) {
    app.add_systems(Last, systems().run_if(exits_in(ExitIn::Last)))
        .add_systems(LateExit, systems().run_if(exits_in(ExitIn::LateExit)));
}

/// Decides that the exit runs in `here` if an `AppExit` is pending and no exit was decided yet.
fn decide(here: ExitIn) -> impl FnMut(&mut World) {
    move |world: &mut World| {
        if world.contains_resource::<ExitIn>() || world.resource::<Messages<AppExit>>().is_empty() {
            return;
        }
        if here == ExitIn::LateExit {
            tracing::debug!("AppExit was written in Last after the exit's steps there: the exit runs after Last");
        }
        world.insert_resource(here);
    }
}

/// Runs the plugin's exit now, for an `AppExit` that no schedule of the frame will see: one written after the
/// frame's schedules ran, as Bevy's `RenderErrorHandler` writes one on a GPU error (in the render sub-app's
/// extract), or by a loop of the game's own that writes it and stops calling `update`. The whole exit runs, in
/// its order ([`AgentToolsExitSystems`]): in-game agent sessions end, the open visit closes and its save
/// completes, `WorldLifecycle::shutdown` runs, the transports and the runtime stop, bounded by
/// [`AgentToolsPlugin::exit_deadline`](crate::AgentToolsPlugin::exit_deadline).
///
/// Returns `true` if it ran the exit; `false`, doing nothing, if no `AppExit` is pending (write one first), the
/// exit already began (it runs once), or the app has no [`AgentToolsPlugin`](crate::AgentToolsPlugin). Call it with
/// the app's main world, outside its schedules. With the crate's `render` feature the plugin calls it itself for
/// an `AppExit` Bevy's renderer writes (see [`AgentToolsPlugin`](crate::AgentToolsPlugin)'s `finish`).
///
/// ```
/// # use bevy::prelude::*;
/// # fn render_error(main_world: &mut World) {
/// // In a handler that gives up on the renderer:
/// main_world.write_message(AppExit::error());
/// bevy_agent_tools::run_pending_exit(main_world); // the open world is saved before the app stops
/// # }
/// ```
pub fn run_pending_exit(world: &mut World) -> bool {
    let pending = world.get_resource::<Messages<AppExit>>().is_some_and(|exits| !exits.is_empty());
    if !pending || !world.contains_resource::<ExitDeadline>() || world.contains_resource::<ExitStarted>() {
        return false;
    }
    tracing::debug!("AppExit was written after the frame's schedules: the exit runs now");
    world.insert_resource(ExitIn::LateExit);
    world.try_run_schedule(LateExit).is_ok()
}

fn exits_in(here: ExitIn) -> impl FnMut(Option<Res<ExitIn>>) -> bool + Clone {
    move |decided: Option<Res<ExitIn>>| decided.is_some_and(|decided| *decided == here)
}

/// How long the exit may take ([`AgentToolsPlugin::exit_deadline`](crate::AgentToolsPlugin::exit_deadline)).
#[derive(Resource, Clone, Copy)]
pub(crate) struct ExitDeadline(pub Duration);

/// Inserted when the exit begins: when it must be over. Transports bound their own stop by it.
#[derive(Resource, Clone, Copy, Debug)]
pub(crate) struct ExitStarted {
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub deadline: Instant,
}

/// How long the exit waits, at most, for tool handlers still running after their calls ended (rule H10: they
/// clean up what they started; one that ignores `ended()` is stopped with the runtime).
pub(crate) const HANDLER_GRACE: Duration = Duration::from_secs(2);

/// On `AppExit`: exits the open visit, waits for every outstanding close completion (bounded, each miss logged
/// with its world), for the tool handlers still running to return (at most [`HANDLER_GRACE`]), calls `shutdown`
/// exactly once, then waits for every operation of the
/// [`WorldStore`](crate::persist::WorldStore), if there is one (bounded by the same deadline). The runtime stops later,
/// in [`stop_runtime`].
pub(crate) fn stop_on_app_exit<L: WorldLifecycle>(world: &mut World) {
    if world.resource::<Messages<AppExit>>().is_empty() || world.contains_resource::<ExitStarted>() {
        return;
    }
    let deadline = crate::deadline::after(Instant::now(), world.resource::<ExitDeadline>().0);
    world.insert_resource(ExitStarted { deadline });
    world.resource_scope(|world, mut slot: Mut<VisitSlot<L>>| {
        if slot.shut_down {
            return;
        }
        slot.shut_down = true;
        slot.exit(world);
        // Calls made with no world open that still wait for their tool end too: their answers go out before the
        // transports stop.
        slot.host.waiting_calls.close();
        for (info, completion) in slot.closing.drain(..) {
            // As between frames: logged, and a `VisitSaved` a system after `AgentToolsExitSystems::Host` can read; a
            // save still running at the deadline is reported as failed (the app does not wait for it).
            let result =
                completion.wait_timeout(deadline.saturating_duration_since(Instant::now())).unwrap_or_else(|| {
                    Err(crate::CompletionError::new("the save did not finish before the exit deadline"))
                });
            match &result {
                Ok(()) => tracing::info!(world = %info.world, visit = %info.visit, "world saved"),
                Err(error) => {
                    tracing::error!(world = %info.world, visit = %info.visit, %error, "saving the world failed")
                }
            }
            world.write_message(crate::visit::VisitSaved { info, result });
        }
        // Handlers whose call ended clean up what they started (rule H10) before the workers stop.
        let waited_from = Instant::now();
        let unfinished = slot.host.running.wait_none(deadline.min(waited_from + HANDLER_GRACE));
        if unfinished > 0 {
            let waited = waited_from.elapsed();
            tracing::warn!(
                unfinished,
                "tool handlers were still running {waited:?} after their calls ended: stopped (a handler that waits \
                 should also wait for `CallContext::ended()`, and stop there)"
            );
        }
        match slot.lifecycle.shutdown().wait_timeout(deadline.saturating_duration_since(Instant::now())) {
            Some(Ok(())) => {}
            Some(Err(error)) => tracing::error!(%error, "the world lifecycle's shutdown failed"),
            None => tracing::error!("the world lifecycle's shutdown did not finish before the exit deadline"),
        }
    });
    // Saves the game started itself (an autosave, a save in `shutdown`) finish too, within the same deadline:
    // the runtime stops next, and a save it cut short would be lost. Each reports its own outcome.
    if let Some(store) = world.get_resource::<crate::persist::WorldStore>() {
        if store.flush().wait_timeout(deadline.saturating_duration_since(Instant::now())).is_none() {
            tracing::error!("saves of the world store did not finish before the exit deadline");
        }
    }
}

/// After the transports stopped ([`AgentToolsExitSystems::Transport`]): stops the runtime, giving its tasks a second.
pub(crate) fn stop_runtime(world: &mut World) {
    if world.contains_resource::<ExitStarted>() && !world.resource::<AgentRuntime>().is_stopped() {
        world.resource_mut::<AgentRuntime>().stop(Duration::from_secs(1));
    }
}
