//! [`AgentToolsRunnerPlugin`]: `ScheduleRunnerPlugin`'s fixed-rate loop, whose wait between frames serves queued
//! main-thread steps (the between-frames step point of [`StepPoints`]).

use std::time::{Duration, Instant};

use bevy::app::{AppExit, PluginsState, ScheduleRunnerPlugin};
use bevy::ecs::message::Messages;
use bevy::prelude::*;

use crate::call::{BetweenFrames, PumpStats, PumpWindow};
#[cfg(doc)]
use crate::{AgentToolsAppExt, StepPoints};

/// Runs the app's frames at a fixed rate, like `ScheduleRunnerPlugin::run_loop(wait)`, and serves queued
/// main-thread steps (`on_client`, ...) in the wait between frames instead of sleeping through it.
///
/// A headless game at 60 frames per second spends well under a millisecond on a frame and sleeps the rest. Under
/// `ScheduleRunnerPlugin` a call that arrives in that sleep waits for the next frame's
/// [`Pump`](crate::AgentToolsSystems::Pump): ~16 ms. Under this runner its step runs as soon as it is queued, with
/// the same rules as in the pump (FIFO order, the recheck right before it runs, one budget per frame shared with
/// the frame's pump: see [`StepPoints`]). Frames start on time as before, up to what is left of the frame's
/// budget late when steps keep arriving at its end. With [`StepPoints::OncePerFrame`] it sleeps like
/// `ScheduleRunnerPlugin`.
///
/// Add it after `MinimalPlugins` (its runner replaces `ScheduleRunnerPlugin`'s: the last runner set wins):
///
/// ```no_run
/// # use std::time::Duration;
/// # use bevy::prelude::*;
/// # use bevy_agent_tools::prelude::*;
/// # use bevy_agent_tools::AgentToolsRunnerPlugin;
/// # struct MyLifecycle;
/// # impl WorldLifecycle for MyLifecycle {
/// #     type Session = ();
/// #     fn open(&self, _: &VisitInfo, _: &mut World) -> Result<Opened<()>, OpenError> { Ok(Opened::ready(())) }
/// #     fn close(&self, _: (), _: &mut World) -> Completion { Completion::done() }
/// # }
/// App::new()
///     // (Ctrl+C is an `AppExit`, which closes and saves the open world, only with `TerminalCtrlCHandlerPlugin`.)
///     .add_plugins((MinimalPlugins, bevy::app::TerminalCtrlCHandlerPlugin))
///     .add_plugins(AgentToolsPlugin::new(MyLifecycle))
///     .add_plugins(AgentToolsRunnerPlugin::run_loop(Duration::from_secs_f64(1.0 / 60.0)))
///     .run();
/// ```
///
/// Not for windowed games: they run under winit's event loop, whose runner this would replace if added after
/// `DefaultPlugins` (and lose to if added before); there, steps run in the frame's pump. A loop of a game's own can
/// serve steps the same way with [`AgentToolsAppExt::serve_steps_until`]. The plugin warns when the app is built
/// if a `ScheduleRunnerPlugin` added after it took its place.
#[derive(Clone, Copy, Debug)]
pub struct AgentToolsRunnerPlugin {
    wait: Duration,
}

/// Whether a `ScheduleRunnerPlugin` had been added when [`AgentToolsRunnerPlugin`] set its runner.
#[derive(Resource)]
struct RunnerSetAfterScheduleRunner(bool);

impl AgentToolsRunnerPlugin {
    /// A frame every `wait` (from the start of one frame to the start of the next, as `ScheduleRunnerPlugin`
    /// counts it); a frame that takes longer is followed at once by the next.
    pub fn run_loop(wait: Duration) -> Self {
        Self { wait }
    }
}

impl Plugin for AgentToolsRunnerPlugin {
    fn build(&self, app: &mut App) {
        let wait = self.wait;
        let before = app.is_plugin_added::<ScheduleRunnerPlugin>();
        app.insert_resource(RunnerSetAfterScheduleRunner(before));
        app.set_runner(move |mut app: App| {
            if app.plugins_state() != PluginsState::Cleaned {
                while app.plugins_state() == PluginsState::Adding {
                    bevy::tasks::tick_global_task_pools_on_main_thread();
                }
                app.finish();
                app.cleanup();
            }
            loop {
                let started = Instant::now();
                app.update();
                if let Some(exit) = app.should_exit() {
                    return exit;
                }
                serve_steps_until(app.world_mut(), crate::deadline::after(started, wait));
            }
        });
    }

    fn finish(&self, app: &mut App) {
        let set_after = app.world_mut().remove_resource::<RunnerSetAfterScheduleRunner>().is_some_and(|set| set.0);
        if !set_after && app.is_plugin_added::<ScheduleRunnerPlugin>() {
            warn!(
                "ScheduleRunnerPlugin was added after AgentToolsRunnerPlugin and replaced its loop: steps are served \
                 only in the frame's pump. Add AgentToolsRunnerPlugin after MinimalPlugins, or disable \
                 ScheduleRunnerPlugin in it"
            );
        }
    }
}

/// Waits until `until`, running queued steps as they arrive while the frame's budget lasts; sleeps once it is
/// spent, or when the app serves no steps between frames. Returns early when a step asks the app to exit, so that
/// the exit's frame runs at once.
pub(crate) fn serve_steps_until(world: &mut World, until: Instant) {
    let Some(queue) = world.get_resource::<PumpWindow>().map(|window| window.queue.clone()) else {
        return sleep_until(until);
    };
    loop {
        if !world.resource::<PumpWindow>().may_run() {
            return sleep_until(until);
        }
        if queue.is_empty() {
            let mut select = crossbeam_channel::Select::new();
            select.recv(&queue);
            // Readiness takes nothing off the queue; it may be spurious, hence the loop.
            if select.ready_deadline(until).is_err() {
                return;
            }
            continue;
        }
        let before = world.resource::<PumpStats>().total;
        let _ = world.try_run_schedule(BetweenFrames);
        if world.resource::<PumpStats>().total == before {
            // Steps are queued but none could run (the budget ran out meanwhile): never spin on them.
            return sleep_until(until);
        }
        if world.get_resource::<Messages<AppExit>>().is_some_and(|exits| !exits.is_empty()) {
            return;
        }
    }
}

fn sleep_until(until: Instant) {
    let now = Instant::now();
    if until > now {
        std::thread::sleep(until - now);
    }
}
