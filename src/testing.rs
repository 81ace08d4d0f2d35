//! A headless harness for testing tools through world transitions: enter, travel, exit, step frames, hold a
//! call in flight across a transition, run until a call resolves.
//!
//! ```
//! use bevy::prelude::*;
//! use bevy_agent_tools::prelude::*;
//! use bevy_agent_tools::testing::{headless_app, AgentTestAppExt};
//!
//! struct Game;
//! impl WorldLifecycle for Game {
//!     type Session = u32;
//!     fn open(&self, _: &VisitInfo, _: &mut World) -> Result<Opened<u32>, OpenError> { Ok(Opened::ready(0)) }
//!     fn close(&self, _: u32, _: &mut World) -> Completion { Completion::done() }
//! }
//!
//! let tool = AgentTool::new("bump", "Adds one.", |ctx: CallContext<u32>, _: bevy_agent_tools::NoArgs| async move {
//!     ctx.on_client(|_, counter| { *counter += 1; *counter }).await
//! });
//! let mut app = headless_app(AgentToolsPlugin::new(Game).with_tool(tool));
//! app.enter_world("alpha");
//! let call = app.agent().conversation("test").call("bump", serde_json::json!({}));
//! let output = app.run_until_resolved(&call).unwrap();
//! assert_eq!(output.value, 1);
//! ```
//!
//! A [`Gate`] holds a handler in flight while the test makes a transition; here a `Location` tool's call, whose
//! step the travel stops:
//!
//! ```
//! # use bevy::prelude::*;
//! # use bevy_agent_tools::prelude::*;
//! # use bevy_agent_tools::testing::{headless_app, AgentTestAppExt, Gate};
//! # struct Game;
//! # impl WorldLifecycle for Game {
//! #     type Session = u32;
//! #     fn open(&self, _: &VisitInfo, _: &mut World) -> Result<Opened<u32>, OpenError> { Ok(Opened::ready(0)) }
//! #     fn close(&self, _: u32, _: &mut World) -> Completion { Completion::done() }
//! # }
//! let gate = Gate::new();
//! let held = gate.clone();
//! let plant = AgentTool::new("plant", "Plants here.", move |ctx: CallContext<u32>, _: bevy_agent_tools::NoArgs| {
//!     let held = held.clone();
//!     async move {
//!         held.pass().await; // waits here until the test opens the gate
//!         ctx.on_client(|_, planted| { *planted += 1; *planted }).await
//!     }
//! })
//! .scope(ToolScope::Location);
//! let mut app = headless_app(AgentToolsPlugin::new(Game).with_tool(plant));
//! app.enter_world("alpha");
//! let call = app.agent().conversation("test").call("plant", serde_json::json!({}));
//! app.run_until("the handler is at the gate", |_| gate.arrived() == 1);
//! app.travel("nether");
//! gate.open();
//! let error = app.run_until_resolved(&call).unwrap_err();
//! assert_eq!(error.code, ErrorCode::LocationChanged, "the step never ran in the nether");
//! ```
//!
//! A game that follows a `States` type of its own ([`AgentToolsPlugin::follow_state`]) needs Bevy's
//! `StatesPlugin`, which `MinimalPlugins` lacks, and the state initialized: [`headless_app_with`] adds them.
//!
//! ```
//! # use bevy::prelude::*;
//! # use bevy::state::app::StatesPlugin;
//! # use bevy_agent_tools::prelude::*;
//! # use bevy_agent_tools::testing::{headless_app_with, AgentTestAppExt};
//! # struct Game;
//! # impl WorldLifecycle for Game {
//! #     type Session = u32;
//! #     fn open(&self, _: &VisitInfo, _: &mut World) -> Result<Opened<u32>, OpenError> { Ok(Opened::ready(0)) }
//! #     fn close(&self, _: u32, _: &mut World) -> Completion { Completion::done() }
//! # }
//! #[derive(States, Clone, Debug, Default, PartialEq, Eq, Hash)]
//! enum Screen { #[default] Menu, Playing }
//!
//! let plugin = AgentToolsPlugin::new(Game).follow_state(|screen: &Screen| match screen {
//!     Screen::Menu => None,
//!     Screen::Playing => Some((WorldId::new("alpha"), DimensionId::new("overworld"))),
//! });
//! let mut app = headless_app_with(plugin, (StatesPlugin, |app: &mut App| {
//!     app.init_state::<Screen>();
//! }));
//! app.world_mut().resource_mut::<NextState<Screen>>().set(Screen::Playing);
//! app.step(2);
//! assert!(app.agent().visit().is_some_and(|visit| visit.info.world == WorldId::new("alpha")));
//! ```

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bevy::app::Plugins;
use bevy::prelude::*;

use crate::agent::{AgentHandle, Call};
use crate::call::CallOutcome;
use crate::ids::{DimensionId, WorldId};
use crate::lifecycle::WorldLifecycle;
use crate::plugin::AgentToolsPlugin;
use crate::signal::OnceSignal;
use crate::visit::{EnterWorld, ExitWorld, TravelTo};

/// How long the harness runs frames for one wait before it fails the test instead of hanging.
pub const HARNESS_LIMIT: Duration = Duration::from_secs(30);

/// A `MinimalPlugins` app with `plugin` added, finished and cleaned up, ready for `update()`.
pub fn headless_app<L: WorldLifecycle>(plugin: AgentToolsPlugin<L>) -> App {
    headless_app_with(plugin, ())
}

/// [`headless_app`] with more plugins added after it (a transport, the game's own), before finishing. A game
/// that follows its `States` passes Bevy's `StatesPlugin` and what initializes them, e.g.
/// `(StatesPlugin, |app: &mut App| { app.init_state::<Screen>(); })`: set up before the plugin checks for them.
pub fn headless_app_with<L: WorldLifecycle, M>(plugin: AgentToolsPlugin<L>, more: impl Plugins<M>) -> App {
    let mut app = App::new();
    app.add_plugins(MinimalPlugins).add_plugins(plugin).add_plugins(more);
    app.finish();
    app.cleanup();
    // A test ends with its world open as it likes: nothing to save, nothing to warn of.
    app.world_mut().resource_mut::<crate::visit::VisitSlot<L>>().test_app = true;
    app
}

/// Story-like steps on an `App` with an [`AgentToolsPlugin`].
pub trait AgentTestAppExt {
    /// Writes [`EnterWorld`] for `world` and runs one frame.
    fn enter_world(&mut self, world: impl Into<WorldId>) -> &mut Self;
    /// Writes [`EnterWorld`] for `world` in `dimension` and runs one frame.
    fn enter_world_in(&mut self, world: impl Into<WorldId>, dimension: impl Into<DimensionId>) -> &mut Self;
    /// Writes [`TravelTo`] and runs one frame.
    fn travel(&mut self, dimension: impl Into<DimensionId>) -> &mut Self;
    /// Writes [`ExitWorld`] and runs one frame.
    fn exit_world(&mut self) -> &mut Self;
    /// Runs `frames` frames.
    fn step(&mut self, frames: usize) -> &mut Self;
    /// The app's [`AgentHandle`].
    fn agent(&self) -> AgentHandle;
    /// Runs frames until `call` resolves, and returns its outcome. Fails the test after [`HARNESS_LIMIT`].
    fn run_until_resolved(&mut self, call: &Call) -> CallOutcome;
    /// Runs frames until `done` returns true. Fails the test, naming `what`, after [`HARNESS_LIMIT`].
    fn run_until(&mut self, what: &str, done: impl FnMut(&mut App) -> bool) -> &mut Self;
    /// Waits, without running frames, until at least `steps` jobs are queued for the main thread
    /// ([`AgentHandle::queued_steps`]: `on_client` steps, and the host's own, such as an ended call's `on_end`
    /// clean-up). Fails the test after [`HARNESS_LIMIT`].
    fn wait_for_queued_steps(&self, steps: usize);
    /// Runs `future` on the plugin's runtime while running frames, and returns its output.
    fn run_future<F>(&mut self, future: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static;
}

impl AgentTestAppExt for App {
    fn enter_world(&mut self, world: impl Into<WorldId>) -> &mut Self {
        self.world_mut().write_message(EnterWorld::new(world));
        self.step(1)
    }

    fn enter_world_in(&mut self, world: impl Into<WorldId>, dimension: impl Into<DimensionId>) -> &mut Self {
        self.world_mut().write_message(EnterWorld::new(world).in_dimension(dimension));
        self.step(1)
    }

    fn travel(&mut self, dimension: impl Into<DimensionId>) -> &mut Self {
        self.world_mut().write_message(TravelTo::new(dimension));
        self.step(1)
    }

    fn exit_world(&mut self) -> &mut Self {
        self.world_mut().write_message(ExitWorld::new());
        self.step(1)
    }

    fn step(&mut self, frames: usize) -> &mut Self {
        for _ in 0..frames {
            self.update();
        }
        self
    }

    fn agent(&self) -> AgentHandle {
        self.world().resource::<AgentHandle>().clone()
    }

    fn run_until_resolved(&mut self, call: &Call) -> CallOutcome {
        let started = Instant::now();
        loop {
            if let Some(outcome) = call.try_outcome() {
                return outcome;
            }
            assert!(
                started.elapsed() < HARNESS_LIMIT,
                "call {:?} did not resolve within {HARNESS_LIMIT:?}",
                call.request_id()
            );
            self.update();
            if let Some(outcome) = call.wait_timeout(Duration::from_micros(200)) {
                return outcome;
            }
        }
    }

    fn run_until(&mut self, what: &str, mut done: impl FnMut(&mut App) -> bool) -> &mut Self {
        let started = Instant::now();
        while !done(self) {
            assert!(started.elapsed() < HARNESS_LIMIT, "{what}: not reached within {HARNESS_LIMIT:?}");
            self.update();
            std::thread::yield_now();
        }
        self
    }

    fn wait_for_queued_steps(&self, steps: usize) {
        let agent = self.agent();
        let started = Instant::now();
        while agent.queued_steps() < steps {
            assert!(started.elapsed() < HARNESS_LIMIT, "{steps} steps were not queued within {HARNESS_LIMIT:?}");
            std::thread::yield_now();
        }
    }

    fn run_future<F>(&mut self, future: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (output, outcome) = crossbeam_channel::bounded(1);
        self.agent().runtime().spawn(async move {
            let _ = output.send(future.await);
        });
        let started = Instant::now();
        loop {
            assert!(started.elapsed() < HARNESS_LIMIT, "future did not resolve within {HARNESS_LIMIT:?}");
            self.update();
            match outcome.recv_timeout(Duration::from_micros(200)) {
                Ok(output) => return output,
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => panic!("the future panicked"),
            }
        }
    }
}

/// Holds handlers at a point until the test opens it: put `gate.pass().await` in a handler, run until
/// [`arrived`](Gate::arrived) counts it, make a transition, then [`open`](Gate::open). A gate does not watch the
/// call's `ended()`: a handler still held at the game's exit holds the exit up to 2 s (rule H10's wait for
/// handlers), so open gates before the exit, or select on `ctx.ended()` beside `pass()`.
#[derive(Clone, Default)]
pub struct Gate {
    inner: Arc<GateInner>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("arrived", &self.arrived()).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct GateInner {
    arrived: AtomicUsize,
    arrival: tokio::sync::Notify,
    opened: OnceSignal<()>,
}

impl Default for OnceSignal<()> {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// A closed gate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts this arrival, then waits until the gate is open.
    pub async fn pass(&self) {
        self.inner.arrived.fetch_add(1, Ordering::SeqCst);
        self.inner.arrival.notify_waiters();
        self.inner.opened.wait().await;
    }

    /// How many have arrived.
    pub fn arrived(&self) -> usize {
        self.inner.arrived.load(Ordering::SeqCst)
    }

    /// Waits until at least `count` have arrived. Cancel-safe.
    pub async fn arrivals(&self, count: usize) {
        loop {
            let arrival = self.inner.arrival.notified();
            tokio::pin!(arrival);
            arrival.as_mut().enable();
            if self.arrived() >= count {
                return;
            }
            arrival.await;
        }
    }

    /// Opens the gate for everyone waiting and everyone to come.
    pub fn open(&self) {
        self.inner.opened.set(());
    }
}

type GameCommand = Box<dyn FnOnce(&mut App) + Send>;

/// A game running its frames on its own thread, for tests that talk to it from outside (a transport, a second
/// process): commands run between frames, on the game's thread.
pub struct RunningGame {
    commands: crossbeam_channel::Sender<GameCommand>,
    thread: Option<std::thread::JoinHandle<()>>,
    agent: AgentHandle,
}

impl std::fmt::Debug for RunningGame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningGame").field("running", &self.thread.is_some()).finish_non_exhaustive()
    }
}

impl RunningGame {
    /// Builds the app on a new thread with `build` (which should call `finish` and `cleanup`, as
    /// [`headless_app`] does) and runs a frame every `frame` until [`stop`](Self::stop).
    pub fn spawn(frame: Duration, build: impl FnOnce() -> App + Send + 'static) -> Self {
        let (commands, queue) = crossbeam_channel::unbounded::<GameCommand>();
        let (agent_tx, agent_rx) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new()
            .name("game".into())
            .spawn(move || {
                let mut app = build();
                let _ = agent_tx.send(app.agent());
                loop {
                    match queue.recv_timeout(frame) {
                        Ok(command) => command(&mut app),
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
                    }
                    app.update();
                    if app.should_exit().is_some() {
                        break;
                    }
                }
            })
            .expect("spawn the game thread");
        let agent = agent_rx.recv_timeout(HARNESS_LIMIT).expect("the game started");
        Self { commands, thread: Some(thread), agent }
    }

    /// The game's [`AgentHandle`].
    pub fn agent(&self) -> AgentHandle {
        self.agent.clone()
    }

    /// Runs `command` on the game thread between frames and returns its result.
    pub fn with_app<R: Send + 'static>(&self, command: impl FnOnce(&mut App) -> R + Send + 'static) -> R {
        let (reply, result) = crossbeam_channel::bounded(1);
        let command: GameCommand = Box::new(move |app| {
            let _ = reply.send(command(app));
        });
        self.commands.send(command).expect("the game is running");
        result.recv_timeout(HARNESS_LIMIT).expect("the game ran the command")
    }

    /// Queues `command` without waiting for it.
    pub fn send(&self, command: impl FnOnce(&mut App) + Send + 'static) {
        let _ = self.commands.send(Box::new(command));
    }

    /// Writes `AppExit`, lets the game run its last frame (saves, shutdown) and joins its thread.
    pub fn stop(mut self) {
        self.send(|app| {
            app.world_mut().write_message(AppExit::Success);
        });
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for RunningGame {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = self.commands.send(Box::new(|app: &mut App| {
                app.world_mut().write_message(AppExit::Success);
            }));
            let _ = thread.join();
        }
    }
}

/// The smallest world lifecycle: a `u64` counter as each visit's session, nothing saved. For benches, transport
/// tests and examples that need a world but no game.
#[derive(Debug)]
pub struct CounterGame;

impl WorldLifecycle for CounterGame {
    type Session = u64;

    fn open(
        &self,
        _visit: &crate::lifecycle::VisitInfo,
        _world: &mut World,
    ) -> Result<crate::Opened<u64>, crate::OpenError> {
        Ok(crate::Opened::ready(0))
    }

    fn close(&self, _session: u64, _world: &mut World) -> crate::Completion {
        crate::Completion::done()
    }
}
