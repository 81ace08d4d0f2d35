//! [`JobSender`]: the sending end of the main thread's job queue. Whoever queues a job also wakes the game's loop,
//! when the game has one that sleeps (a windowed app with reactive updates): without that, a step would wait for
//! the next window event.

use std::sync::{Arc, OnceLock};

use crossbeam_channel::{SendError, Sender};

use super::Job;

/// Wakes the game's loop so that it runs a frame soon.
pub(crate) type Wake = Box<dyn Fn() + Send + Sync>;

/// Queues jobs for the main thread and wakes its loop.
#[derive(Clone)]
pub(crate) struct JobSender {
    jobs: Sender<Job>,
    wake: Arc<OnceLock<Wake>>,
}

impl JobSender {
    pub(crate) fn new(jobs: Sender<Job>) -> Self {
        Self { jobs, wake: Arc::default() }
    }

    /// Queues `job`, then wakes the loop (if a wake was set).
    pub(crate) fn send(&self, job: Job) -> Result<(), SendError<Job>> {
        self.jobs.send(job)?;
        self.wake();
        Ok(())
    }

    /// Wakes the loop (if a wake was set): for work that needs a frame without a job, such as an `every_frame`
    /// step that is not done or a handler awaiting the next frame.
    pub(crate) fn wake(&self) {
        if let Some(wake) = self.wake.get() {
            wake();
        }
    }

    /// Jobs queued and not taken yet.
    pub(crate) fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether a wake was set.
    pub(crate) fn has_wake(&self) -> bool {
        self.wake.get().is_some()
    }

    /// Sets how to wake the game's loop; the first one set stays (`false` if one was set already).
    pub(crate) fn set_wake(&self, wake: Wake) -> bool {
        self.wake.set(wake).is_ok()
    }
}

/// Frames further apart than this, with steps waiting for them: the game's loop may sleep between frames.
const SLEEPING_LOOP: std::time::Duration = std::time::Duration::from_secs(2);
/// How many frames in a row found steps waiting that long before it is said: one late frame is a hitch (a level
/// loading, a debugger's pause), not a loop that sleeps.
const LATE_IN_A_ROW: u8 = 3;

/// Warns once when steps waited for [`LATE_IN_A_ROW`] frames in a row (of those that found steps waiting) that each
/// came more than [`SLEEPING_LOOP`] after the one before, while nothing wakes the game's loop: a windowed game with
/// reactive updates (`WinitSettings::desktop_app()`) serves a step only at its next window event (an unfocused one
/// waits a minute, and its calls time out) unless it has the crate's `winit` feature or sets a wake
/// ([`AgentHandle::set_wake`](crate::AgentHandle::set_wake)); a headless loop that slow serves a step a frame
/// unless `AgentToolsRunnerPlugin` serves them between its frames.
/// (On the main thread, as the pump: where the game's log subscriber, if it set one for its thread, is.)
pub(crate) fn notice_sleeping_loop<L: crate::lifecycle::WorldLifecycle>(
    world: &mut bevy::prelude::World,
    mut seen: bevy::prelude::Local<(bool, u8)>,
) {
    let (warned, late_in_a_row) = &mut *seen;
    let time = world.get_resource::<bevy::time::Time<bevy::time::Real>>();
    let waited = time.map(|time| time.delta()).unwrap_or_default();
    let Some(slot) = world.get_resource::<crate::visit::VisitSlot<L>>() else { return };
    if *warned || slot.jobs.is_empty() || slot.host.jobs.has_wake() {
        return;
    }
    if waited < SLEEPING_LOOP {
        *late_in_a_row = 0;
        return;
    }
    *late_in_a_row += 1;
    if *late_in_a_row < LATE_IN_A_ROW {
        return;
    }
    *warned = true;
    tracing::warn!(
        ?waited,
        steps = slot.jobs.len(),
        "agents' steps waited for frames that each came {waited:?} after the one before, {LATE_IN_A_ROW} frames in \
         a row: if the game's loop sleeps between frames (WinitSettings::desktop_app), turn on bevy_agent_tools' \
         `winit` feature or set a wake with AgentHandle::set_wake, or its agents' calls wait for the next window \
         event; a headless loop this slow serves steps between its frames with AgentToolsRunnerPlugin::run_loop \
         (said once)"
    );
}

/// A wake for a windowed app (Bevy's `WinitPlugin`): `WinitUserEvent::WakeUp` through the event loop's proxy,
/// which makes a loop with reactive updates run a frame. `None` without a winit event loop.
#[cfg(feature = "winit")]
pub(crate) fn winit_wake(world: &bevy::prelude::World) -> Option<Wake> {
    use bevy::winit::{EventLoopProxyWrapper, WinitUserEvent};
    let proxy = (**world.get_resource::<EventLoopProxyWrapper>()?).clone();
    Some(Box::new(move || {
        // Fails only once the event loop is gone: the app is exiting, and its exit answers every call.
        let _ = proxy.send_event(WinitUserEvent::WakeUp);
    }))
}
