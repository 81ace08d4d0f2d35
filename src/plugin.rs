//! [`AgentToolsPlugin`]: the builder, the system sets, and the wiring.

use std::any::TypeId;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bevy::ecs::schedule::{InternedScheduleLabel, ScheduleLabel, SingleThreadedExecutor};
use bevy::prelude::*;
use bevy::state::state::{StateTransition, StateTransitionSystems, States};

use crate::agent::AgentHandle;
use crate::call::{notice_sleeping_loop, run_jobs, run_jobs_between_frames, BetweenFrames, PumpStats, PumpWindow};
use crate::conversation::{
    end_idle_conversations, publish_conversation_messages, CallFinished, CallProgress, CallStarted, ChatDelta,
    ChatError, ChatMessage, ConversationFeed, ConversationStatusChanged, PermissionRequested, PermissionSettled,
};
use crate::exit::{stop_on_app_exit, stop_runtime, AgentToolsExitSystems};
use crate::host::{HostConfig, HostShared};
use crate::ids::{DimensionId, WorldId};
use crate::lifecycle::WorldLifecycle;
use crate::replay::ReplayRetention;
use crate::runtime::{AgentRuntime, WorkerPriority};
use crate::tool::{AgentTool, ErasedTool, DEFAULT_TOOL_TIMEOUT};
use crate::visit::{
    apply_followed_transitions, apply_transitions, collect_transitions, follow_state, EnterWorld, ExitWorld,
    PendingTransitions, StateTarget, TravelTo, VisitClosed, VisitClosing, VisitLoadFailed, VisitOpened, VisitRelocated,
    VisitSaved, VisitSlot, WorldBinding, WorldOpenFailed,
};

/// The host's systems, in the schedule the plugin runs in (`PostUpdate` unless
/// [`AgentToolsPlugin::in_schedule`] says otherwise), in this order, before Bevy propagates transforms
/// (`TransformSystems::Propagate`): an entity a step moved or spawned is where the game's later systems and the
/// renderer see it in the frame the step ran. (A followed `States` type's transitions are applied in Bevy's
/// `StateTransition` schedule instead: [`AgentToolsPlugin::follow_state`].)
///
/// Conversation events that happened on other threads ([`ConversationStatusChanged`], [`CallStarted`],
/// [`CallProgress`], [`CallFinished`], chat events) are written as messages twice a frame: at the start of
/// `Transitions` (what happened since the last frame, and what a followed state's transitions caused earlier in
/// this one) and at the end of `Pump` (what this frame's transitions and steps caused). The idle timeout of
/// conversations is checked at the start of `Transitions`.
#[derive(SystemSet, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AgentToolsSystems {
    /// Applies this frame's [`EnterWorld`], [`TravelTo`] and [`ExitWorld`] in the order they were created, calling
    /// `open`, `relocated` and `close`; then calls `tick` on the open session.
    Transitions,
    /// Runs queued `on_client` steps, each rechecked right before it runs, until the per-frame budget is spent.
    /// This is the frame's step point; under [`AgentToolsRunnerPlugin`](crate::AgentToolsRunnerPlugin) steps also
    /// run in the wait after the frame, sharing its budget (see [`StepPoints`]).
    Pump,
}

/// Where in the game's loop queued main-thread steps (`on_client` steps, `on_end` cleanups, input observations)
/// run. `every_frame` steps always run in the frame's [`AgentToolsSystems::Pump`], once per frame; a step queued
/// after one waits for that pump too, to keep the queue's order. Set with [`AgentToolsPlugin::step_points`].
///
/// Every point takes steps from the one queue in the order they were queued, rechecks each right before it runs
/// (call live, deadline, visit, location revision: rule H8), and counts against one budget per frame
/// ([`AgentToolsPlugin::pump_budget`]): what the frame's [`AgentToolsSystems::Pump`] spent, the wait after it may
/// only spend the rest of. No point runs during a transition: transitions are applied inside a frame, in
/// [`AgentToolsSystems::Transitions`] (a followed state's, in Bevy's `StateTransition`), and the wait between frames is
/// outside every schedule.
///
/// Why between frames: a headless game at 60 frames per second works well under a millisecond per frame and then
/// waits ~16 ms for the next one. A call arriving in that wait (as a client's next call does, right after the
/// previous answer) waits for the next frame's pump: about a frame per main-thread step. Served in the wait, the
/// step runs within tens of microseconds of arriving. The cost: a step may run at a moment no system of the
/// game runs, between one frame's `Last` and the next frame's `First` (the world is as the last frame left it;
/// messages a step writes are read in the next frame, as with a step in the pump), and a frame may start up to
/// the rest of the budget late when steps keep arriving at its end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StepPoints {
    /// One point per frame: [`AgentToolsSystems::Pump`] only. Steps wait for the next frame, whatever the runner.
    OncePerFrame,
    /// [`AgentToolsSystems::Pump`], and between frames while the app's runner waits for the next frame, if the runner
    /// serves steps there: [`AgentToolsRunnerPlugin`](crate::AgentToolsRunnerPlugin), or a loop of the game's own
    /// that waits with [`AgentToolsAppExt::serve_steps_until`]. Under any other runner (`ScheduleRunnerPlugin`,
    /// winit) this is the same as `OncePerFrame`. The default.
    #[default]
    AlsoBetweenFrames,
}

type Follower = dyn Fn(&mut App, Arc<HostShared>) + Send + Sync;

/// The name of a followed state that the app, once built, does not have (it was never initialized).
type StateCheck = dyn Fn(&App) -> Option<&'static str> + Send + Sync;

/// Adds the agent-tools host for one [`WorldLifecycle`]: one per app (a second one, for another lifecycle, panics
/// when added). The crate's other plugins (`McpPlugin`, `AgentSessionsPlugin`, `WorldStorePlugin`) need it and
/// may be added before or after it: they are set up once both are added.
///
/// ```no_run
/// # use bevy::prelude::*;
/// # use bevy_agent_tools::prelude::*;
/// # struct MyLifecycle;
/// # impl WorldLifecycle for MyLifecycle {
/// #     type Session = ();
/// #     fn open(&self, _: &VisitInfo, _: &mut World) -> Result<Opened<()>, OpenError> { Ok(Opened::ready(())) }
/// #     fn close(&self, _: (), _: &mut World) -> Completion { Completion::done() }
/// # }
/// App::new()
///     // Headless at 60 frames per second (`MinimalPlugins` alone would run frames back to back on a whole core),
///     // and Ctrl+C is an `AppExit`, which closes and saves the open world; a windowed game adds `DefaultPlugins`.
///     .add_plugins((
///         MinimalPlugins.set(bevy::app::ScheduleRunnerPlugin::run_loop(std::time::Duration::from_secs_f64(1.0 / 60.0))),
///         bevy::app::TerminalCtrlCHandlerPlugin,
///     ))
///     .add_plugins(AgentToolsPlugin::new(MyLifecycle).pump_budget(std::time::Duration::from_millis(2)))
///     .run();
/// ```
pub struct AgentToolsPlugin<L: WorldLifecycle> {
    lifecycle: Arc<L>,
    tools: Vec<Arc<dyn ErasedTool>>,
    config: HostConfig,
    default_dimension: DimensionId,
    worker_threads: usize,
    worker_priority: WorkerPriority,
    schedule: InternedScheduleLabel,
    exit_deadline: Duration,
    followers: Vec<Arc<Follower>>,
    state_checks: Vec<Arc<StateCheck>>,
    step_points: StepPoints,
}

impl<L: WorldLifecycle> std::fmt::Debug for AgentToolsPlugin<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentToolsPlugin")
            .field("lifecycle", &std::any::type_name::<L>())
            .field("tools", &self.tools.len())
            .field("default_dimension", &self.default_dimension)
            .field("worker_threads", &self.worker_threads)
            .field("exit_deadline", &self.exit_deadline)
            .finish_non_exhaustive()
    }
}

impl<L: WorldLifecycle> AgentToolsPlugin<L> {
    /// A host for `lifecycle`, with the defaults: 30 s call timeout, 1 ms pump budget per frame, dimension
    /// `"overworld"`, 2 worker threads below the game's threads ([`WorkerPriority::Background`]), `PostUpdate`,
    /// 30 s exit deadline, steps also between frames where the runner serves them
    /// ([`StepPoints::AlsoBetweenFrames`]).
    pub fn new(lifecycle: L) -> Self {
        Self {
            lifecycle: Arc::new(lifecycle),
            tools: Vec::new(),
            config: HostConfig {
                default_timeout: DEFAULT_TOOL_TIMEOUT,
                pump_budget: Duration::from_millis(1),
                replay: ReplayRetention::default(),
                max_in_flight: 32,
                tool_wait: None,
                idle_timeout: None,
            },
            default_dimension: DimensionId::new("overworld"),
            worker_threads: 2,
            worker_priority: WorkerPriority::default(),
            schedule: PostUpdate.intern(),
            exit_deadline: Duration::from_secs(30),
            followers: Vec::new(),
            state_checks: Vec::new(),
            step_points: StepPoints::default(),
        }
    }

    /// Registers a tool (a later one of the same name replaces it).
    ///
    /// # Panics
    ///
    /// At start-up (when the plugin is built), for a tool the host cannot serve, a mistake in the game's set-up:
    /// an empty name or the MCP transport's own `begin_conversation`; arguments that cannot be an object (`()`:
    /// use [`NoArgs`](crate::NoArgs)); an argument named `operation_id`, `task_id` or `conversation` in any of
    /// its shapes (the transports take those out of every call); an
    /// [`argument_enum`](AgentTool::argument_enum) for an argument the tool does not have.
    /// [`AgentHandle::register_tool`] returns the same as an error.
    pub fn with_tool(mut self, tool: AgentTool<L::Session>) -> Self {
        self.tools.push(Arc::new(tool));
        self
    }

    /// The timeout of calls whose tool sets none.
    pub fn default_timeout(mut self, timeout: Duration) -> Self {
        self.config.default_timeout = timeout;
        self
    }

    /// How long the pump may run `on_client` steps per frame, all step points together (the frame's
    /// [`AgentToolsSystems::Pump`] and the wait after it, see [`StepPoints`]). At least one queued step runs per frame,
    /// in the frame's `Pump`, besides the `every_frame` steps (of which at least one runs, the others taking turns
    /// when they do not all fit).
    pub fn pump_budget(mut self, budget: Duration) -> Self {
        self.config.pump_budget = budget;
        self
    }

    /// Where queued steps run: in the frame's [`AgentToolsSystems::Pump`] only ([`StepPoints::OncePerFrame`]), or
    /// also between frames where the app's runner serves them ([`StepPoints::AlsoBetweenFrames`], the default).
    ///
    /// ```no_run
    /// # use bevy::prelude::*;
    /// # use bevy_agent_tools::prelude::*;
    /// # use bevy_agent_tools::StepPoints;
    /// # struct MyLifecycle;
    /// # impl WorldLifecycle for MyLifecycle {
    /// #     type Session = ();
    /// #     fn open(&self, _: &VisitInfo, _: &mut World) -> Result<Opened<()>, OpenError> { Ok(Opened::ready(())) }
    /// #     fn close(&self, _: (), _: &mut World) -> Completion { Completion::done() }
    /// # }
    /// // Steps touch the world only inside the frame, after `Update`, even under `AgentToolsRunnerPlugin`.
    /// let plugin = AgentToolsPlugin::new(MyLifecycle).step_points(StepPoints::OncePerFrame);
    /// ```
    pub fn step_points(mut self, points: StepPoints) -> Self {
        self.step_points = points;
        self
    }

    /// How many outcomes of keyed operations (`operation_id`) a visit retains, in how many bytes, and for how long
    /// (default 10,000 entries, 64 MiB, 10 minutes). The entries count the keyed operations still running too, which
    /// are never evicted: with that many running in a visit at once, another keyed call is refused `BUSY`. At least
    /// one entry (0 is taken as 1).
    pub fn replay_retention(mut self, mut retention: ReplayRetention) -> Self {
        retention.max_entries = retention.max_entries.max(1);
        self.config.replay = retention;
        self
    }

    /// How many calls one conversation may have in flight at once (at least 1: 0 is taken as 1); more get `BUSY`
    /// (default 32). As many more may wait for a tool that is not registered yet ([`tool_wait`](Self::tool_wait)).
    pub fn max_in_flight_per_conversation(mut self, limit: usize) -> Self {
        self.config.max_in_flight = limit.max(1);
        self
    }

    /// How long a call for a tool that is not registered waits for it to be registered (with
    /// [`AgentHandle::register_tool`] or `add_agent_tool`) before it fails with `TOOL_NOT_FOUND`; the call's own
    /// timeout, when it sets one, replaces this wait. By default (and with `Duration::ZERO`) such a call waits only
    /// while the open visit is still loading (up to the default timeout; a second more once the load has finished,
    /// for a world that registers its tools then; at once the load's error if it failed), and is rejected at once
    /// otherwise, so that a mistyped name does not hang. A call that waits is still bound to the visit open when it
    /// was made (rules H5, H9): it ends with `VISIT_ENDED` when that visit ends, and a location-scoped one is refused
    /// with `LOCATION_CHANGED` if the player relocated before its tool appeared; one made with no world open waits for
    /// its tool and a visit both (a game may register its tools before it enters, in `open` or an `OnEnter` system),
    /// runs in that visit, gets `NO_WORLD` if its tool came but no world opened within its wait (`TOOL_NOT_FOUND` if
    /// the tool never came), and ends with `WORLD_CLOSED` if the game exits first. One still waiting when its wait
    /// passes while the world loads gets `WORLD_LOADING_TIMEOUT`.
    pub fn tool_wait(mut self, wait: Duration) -> Self {
        self.config.tool_wait = Some(wait);
        self
    }

    /// Ends a conversation that had no call in flight and no activity (a call, a status report, an open) for
    /// `timeout`. Off by default. This is how conversations end over MCP 2026-07-28, which has no sessions; a
    /// client that comes back later reopens its conversation (`Ended → Idle`). Checked once per frame. Neither an
    /// in-game agent session's conversation nor an MCP 2025-11-25 session's (which ends with its session:
    /// `McpPlugin::session_idle_timeout`) is ended this way.
    pub fn conversation_idle_timeout(mut self, timeout: Duration) -> Self {
        self.config.idle_timeout = Some(timeout);
        self
    }

    /// The dimension an [`EnterWorld`] without one starts in.
    pub fn default_dimension(mut self, dimension: impl Into<DimensionId>) -> Self {
        self.default_dimension = dimension.into();
        self
    }

    /// How many tokio worker threads run handlers and close work (at least one: `0` is taken as 1).
    pub fn worker_threads(mut self, threads: usize) -> Self {
        self.worker_threads = threads;
        self
    }

    /// How the operating system schedules the worker threads against the game's own: below them by default
    /// ([`WorkerPriority::Background`]), so that when the cores are busy (a renderer, a physics step) agent work
    /// waits instead of lengthening frames.
    pub fn worker_priority(mut self, priority: WorkerPriority) -> Self {
        self.worker_priority = priority;
        self
    }

    /// Runs the host's [`AgentToolsSystems`]s in `schedule` instead of `PostUpdate`. It must run once every frame,
    /// after the game's own systems that write transitions (a schedule that never runs applies no transitions
    /// and runs no steps: every call gets `NO_WORLD`, or waits until it times out). `Last` and a schedule the
    /// game runs itself every frame work; `FixedUpdate` does not (it runs zero or several times a frame).
    pub fn in_schedule(mut self, schedule: impl ScheduleLabel) -> Self {
        self.schedule = schedule.intern();
        self
    }

    /// How long `AppExit` waits, in all, for outstanding close completions, tool handlers still returning after
    /// their calls ended (at most 2 s of it), `shutdown` and the world store's saves.
    pub fn exit_deadline(mut self, deadline: Duration) -> Self {
        self.exit_deadline = deadline;
        self
    }

    /// Follows the game's own `States` type instead of (or besides) messages: `target` says, for each state,
    /// which world and dimension the player is in (`None`: not in a world). Each change of the state becomes the
    /// enter, travel or exit that makes the open visit agree. Needs Bevy's `StatesPlugin` (in `DefaultPlugins`,
    /// not in `MinimalPlugins`) and the state set up (`init_state`, or `add_sub_state` / `add_computed_state`).
    /// A sub-state or computed state exists only while its source allows it: when
    /// it goes (the player went back to the menu), the player is outside any world, as for `None`.
    ///
    /// Beside messages, the state has the last word at each of its changes: a [`TravelTo`] sent since the last
    /// change is undone by a change to a state mapped to another dimension (a pause screen mapped to the world's
    /// first dimension takes the player back there). Map each state to where the player really is, or keep one of
    /// the two ways.
    ///
    /// Applied where Bevy changes the state (its `StateTransition` schedule), once the new state is set and before
    /// any `OnExit`: the world a state leaves is closed (and saved) while its entities are still there, before
    /// `OnExit` systems and `DespawnOnExit` remove them; the world a state enters is open in its `OnEnter` systems
    /// (its session reachable, e.g. to spawn the level from it). The start-up state is the exception: its world is
    /// opened in the first frame, after the game's `Startup` systems (a world's `open` may need what they set up).
    ///
    /// # Panics
    ///
    /// When the app is finished (`App::run` does it), if the state was never set up, or the app has no Bevy
    /// `StatesPlugin`: a mistake in the game's set-up, which would otherwise leave every agent's call with
    /// `NO_WORLD`.
    ///
    /// ```
    /// # use bevy::prelude::*;
    /// # use bevy::state::app::StatesPlugin;
    /// # use bevy_agent_tools::prelude::*;
    /// # struct Game;
    /// # impl WorldLifecycle for Game {
    /// #     type Session = ();
    /// #     fn open(&self, _: &VisitInfo, _: &mut World) -> Result<Opened<()>, OpenError> { Ok(Opened::ready(())) }
    /// #     fn close(&self, _: (), _: &mut World) -> Completion { Completion::done() }
    /// # }
    /// #[derive(States, Clone, PartialEq, Eq, Hash, Debug, Default)]
    /// enum Screen {
    ///     #[default]
    ///     Menu,
    ///     Playing { save: String, underground: bool },
    /// }
    ///
    /// let mut app = App::new();
    /// app.add_plugins((MinimalPlugins, StatesPlugin)).init_state::<Screen>().add_plugins(
    ///     AgentToolsPlugin::new(Game).follow_state(|screen: &Screen| match screen {
    ///         Screen::Menu => None,
    ///         Screen::Playing { save, underground } => {
    ///             let dimension = if *underground { "caves" } else { "surface" };
    ///             Some((WorldId::new(save.clone()), DimensionId::new(dimension)))
    ///         }
    ///     }),
    /// );
    /// ```
    pub fn follow_state<S: States>(
        mut self,
        target: impl Fn(&S) -> Option<(WorldId, DimensionId)> + Send + Sync + 'static,
    ) -> Self {
        let target = Arc::new(target);
        self.followers.push(Arc::new(move |app: &mut App, host: Arc<HostShared>| {
            let target = target.clone();
            app.insert_resource(StateTarget::<S> { map: Box::new(move |state| target(state)), host });
            app.add_systems(
                StateTransition,
                (follow_state::<S>, apply_followed_transitions::<L>)
                    .chain()
                    .after(StateTransitionSystems::DependentTransitions)
                    .before(StateTransitionSystems::ExitSchedules),
            );
        }));
        // Every way of setting a state up (`init_state`, `insert_state`, `add_sub_state`, `add_computed_state`) adds
        // its transition messages; a sub-state's or computed state's `State<S>` only exists while its source allows.
        self.state_checks.push(Arc::new(|app: &App| {
            let set_up = app.world().contains_resource::<bevy::ecs::message::Messages<StateTransitionEvent<S>>>();
            (!set_up).then(std::any::type_name::<S>)
        }));
        self
    }
}

/// The schedule recorded by the plugin, for the in-game agent sessions' systems (added by a plugin of their own).
#[derive(Resource, Clone, Copy)]
struct HostSchedule(#[cfg_attr(not(any(feature = "acp", feature = "openai")), allow(dead_code))] InternedScheduleLabel);

#[cfg(any(feature = "acp", feature = "openai"))]
pub(crate) fn app_schedule(app: &App) -> InternedScheduleLabel {
    app.world().resource::<HostSchedule>().0
}

/// Tools given to `add_agent_tool` before the plugin was added: registered when it is built.
#[derive(Resource, Default)]
struct EarlyTools(Vec<Arc<dyn ErasedTool>>);

/// The set-ups of this crate's plugins that were added before the [`AgentToolsPlugin`], in the order they were
/// added: run at the end of its `build`.
#[derive(Resource, Default)]
struct AwaitingHost(Vec<Box<SetUp>>);

/// A plugin's set-up, run once the host is there.
type SetUp = dyn FnOnce(&mut App) + Send + Sync;

/// Runs `set_up` of a plugin of this crate that needs the [`AgentToolsPlugin`] (its runtime, its handle, its
/// schedule): now if the `AgentToolsPlugin` has been built, else at the end of its `build`. So a game adds the
/// crate's plugins in any order, and they are all set up once the last of them is added.
pub(crate) fn when_host_built(app: &mut App, set_up: impl FnOnce(&mut App) + Send + Sync + 'static) {
    if app.world().contains_resource::<AgentHost>() {
        set_up(app);
    } else {
        app.world_mut().get_resource_or_init::<AwaitingHost>().0.push(Box::new(set_up));
    }
}

/// The set-up mistake of a plugin of this crate in an app without an [`AgentToolsPlugin`], found in its `finish`.
pub(crate) fn host_missing(plugin: &str) -> ! {
    panic!("{plugin} needs AgentToolsPlugin, which the app does not have: add it (before or after {plugin})")
}

/// What `add_agent_tool` needs to find the host.
#[derive(Resource, Clone)]
pub(crate) struct AgentHost {
    pub host: Arc<HostShared>,
}

impl AgentHost {
    fn register(&self, tool: Arc<dyn ErasedTool>) {
        if let Err(mistake) = self.host.register_tool(tool) {
            panic!("{mistake}");
        }
    }
}

impl<L: WorldLifecycle> Plugin for AgentToolsPlugin<L> {
    fn build(&self, app: &mut App) {
        if app.world().contains_resource::<AgentHost>() {
            // A second lifecycle would take the first one's handles and runtime, and both would apply every
            // transition: one game, one lifecycle, one host.
            panic!(
                "AgentToolsPlugin was added twice (a second lifecycle, `{}`): an app has one host, for one \
                 WorldLifecycle",
                std::any::type_name::<L>()
            );
        }
        let runtime = AgentRuntime::start(self.worker_threads, self.worker_priority)
            .unwrap_or_else(|error| panic!("agent tools could not start their tokio runtime: {error}"));
        let session_type = (TypeId::of::<L::Session>(), std::any::type_name::<L::Session>());
        let (host, jobs, feed) = HostShared::new(runtime.handle().clone(), self.config.clone(), session_type);
        let agent_host = AgentHost { host: host.clone() };
        let early = app.world_mut().remove_resource::<EarlyTools>().map(|early| early.0).unwrap_or_default();
        for tool in self.tools.iter().cloned().chain(early) {
            agent_host.register(tool);
        }
        app.insert_resource(HostSchedule(self.schedule))
            .insert_resource(runtime)
            .insert_resource(agent_host)
            .insert_resource(AgentHandle::new(host.clone()))
            .insert_resource(WorldBinding::<L>::new(host.clone()))
            .insert_resource(VisitSlot::<L> {
                lifecycle: self.lifecycle.clone(),
                host: host.clone(),
                open: None,
                jobs: jobs.clone(),
                next_frame: Default::default(),
                default_dimension: self.default_dimension.clone(),
                closing: Vec::new(),
                loading: None,
                shut_down: false,
                test_app: false,
            })
            .insert_resource(PumpWindow {
                spent: Duration::ZERO,
                budget: self.config.pump_budget,
                between_frames: self.step_points == StepPoints::AlsoBetweenFrames,
                held: false,
                queue: jobs.clone(),
            })
            .insert_resource(crate::exit::ExitDeadline(self.exit_deadline))
            .insert_resource(ConversationFeed(feed))
            .init_resource::<PendingTransitions>()
            .init_resource::<PumpStats>()
            .add_message::<EnterWorld>()
            .add_message::<TravelTo>()
            .add_message::<ExitWorld>()
            .add_message::<VisitOpened>()
            .add_message::<VisitRelocated>()
            .add_message::<VisitClosing>()
            .add_message::<VisitClosed>()
            .add_message::<ConversationStatusChanged>()
            .add_message::<CallStarted>()
            .add_message::<CallProgress>()
            .add_message::<CallFinished>()
            .add_message::<ChatDelta>()
            .add_message::<ChatMessage>()
            .add_message::<ChatError>()
            .add_message::<PermissionRequested>()
            .add_message::<PermissionSettled>()
            .add_message::<VisitSaved>()
            .add_message::<WorldOpenFailed>()
            .add_message::<VisitLoadFailed>()
            .configure_sets(
                self.schedule,
                // Before transforms propagate: what a step moved is where the game's later systems and the
                // renderer see it, in the frame the step ran.
                (AgentToolsSystems::Transitions, AgentToolsSystems::Pump)
                    .chain()
                    .before(bevy::transform::TransformSystems::Propagate),
            )
            .add_systems(
                self.schedule,
                (
                    (
                        end_idle_conversations,
                        publish_conversation_messages,
                        collect_transitions,
                        apply_transitions::<L>,
                    )
                        .chain()
                        .in_set(AgentToolsSystems::Transitions),
                    (notice_sleeping_loop::<L>, run_jobs::<L>, publish_conversation_messages)
                        .chain()
                        .in_set(AgentToolsSystems::Pump),
                ),
            )
            .add_systems(BetweenFrames, run_jobs_between_frames::<L>)
            .edit_schedule(BetweenFrames, |schedule| {
                schedule.set_executor(SingleThreadedExecutor::new());
            });
        crate::exit::configure(app);
        crate::exit::add_exit_systems(app, || stop_on_app_exit::<L>.in_set(AgentToolsExitSystems::Host));
        // The runtime serves the transports too: it stops once they sent what they owed.
        crate::exit::add_exit_systems(app, || stop_runtime.after(AgentToolsExitSystems::Transport));
        // The crate's plugins added before this one, now that the host is there.
        if let Some(AwaitingHost(set_ups)) = app.world_mut().remove_resource::<AwaitingHost>() {
            for set_up in set_ups {
                set_up(app);
            }
        }
    }

    /// Panics for a state given to [`follow_state`](Self::follow_state) that was never set up (it would never be
    /// followed: every call would get `NO_WORLD`), a mistake in the game's set-up, as `with_tool` panics for its. In a
    /// windowed app (feature `winit`), agent work that needs a frame wakes winit's loop (see
    /// [`AgentHandle::set_wake`]), so a game with reactive updates (`WinitSettings::desktop_app()`) runs that frame
    /// instead of sleeping until the next window event. With the feature `render`, the extract of Bevy's render sub-apps is
    /// wrapped so that an `AppExit` written there (by its `RenderErrorHandler` on a GPU error, or for a render thread
    /// that panicked) runs the plugin's exit ([`run_pending_exit`](crate::run_pending_exit)).
    /// Plugins are all built by now, so the order in which the game added them does not matter.
    fn finish(&self, app: &mut App) {
        crate::exit::run_late_exit_last(app);
        #[cfg(feature = "render")]
        crate::exit::exit_after_render_extracts(app);
        if !self.followers.is_empty() && !app.is_plugin_added::<bevy::state::app::StatesPlugin>() {
            panic!(
                "AgentToolsPlugin::follow_state needs Bevy's `StatesPlugin` (in `DefaultPlugins`, not in \
                 `MinimalPlugins`): without it no state changes, and agents' calls would get NO_WORLD"
            );
        }
        if let Some(missing) = self.state_checks.iter().find_map(|check| check(app)) {
            panic!(
                "AgentToolsPlugin::follow_state: the app has no `State<{missing}>`, so it would never be followed \
                 and agents' calls would get NO_WORLD: initialize it (`app.init_state::<{missing}>()`, with Bevy's \
                 `StatesPlugin`, which `MinimalPlugins` lacks)"
            );
        }
        // Added now, once Bevy's `StatesPlugin` has set up its `StateTransition` schedule (it leaves alone one
        // that exists already: made here first, its sets would be left unordered).
        let host = app.world().resource::<AgentHost>().host.clone();
        for follower in &self.followers {
            follower(app, host.clone());
        }
        #[cfg(feature = "winit")]
        if let Some(wake) = crate::call::winit_wake(app.world()) {
            app.world().resource::<AgentHandle>().set_wake(wake);
        }
    }
}

/// Registering tools on an `App` that has an [`AgentToolsPlugin`].
pub trait AgentToolsAppExt {
    /// Registers `tool`.
    ///
    /// A tool added before the `AgentToolsPlugin` (a plugin of the game's own that brings its tools, added first)
    /// is registered when the plugin is built.
    ///
    /// # Panics
    ///
    /// If the tool is for another session type than the lifecycle's, or for any reason
    /// [`AgentToolsPlugin::with_tool`] gives: mistakes in the game's set-up, found at start-up.
    fn add_agent_tool<S: Send + Sync + 'static>(&mut self, tool: AgentTool<S>) -> &mut Self;

    /// Waits until `until` (returns at once if it passed), running queued main-thread steps as they arrive: the
    /// between-frames step point of [`StepPoints::AlsoBetweenFrames`], for a game loop of its own, between one
    /// `app.update()` and the next ([`AgentToolsRunnerPlugin`](crate::AgentToolsRunnerPlugin) is such a loop).
    ///
    /// Steps already queued run first. Every step is rechecked right before it runs, as in the pump, and the steps
    /// run here spend the budget of the frame that came before ([`AgentToolsPlugin::pump_budget`]); once it is
    /// spent, or with [`StepPoints::OncePerFrame`], or without an `AgentToolsPlugin`, this only sleeps until
    /// `until`. Returns early when a step writes `AppExit`. Call it between frames only, never from a system.
    fn serve_steps_until(&mut self, until: Instant) -> &mut Self;
}

impl AgentToolsAppExt for App {
    fn add_agent_tool<S: Send + Sync + 'static>(&mut self, tool: AgentTool<S>) -> &mut Self {
        let tool: Arc<dyn ErasedTool> = Arc::new(tool);
        match self.world().get_resource::<AgentHost>() {
            Some(host) => host.register(tool),
            None => self.world_mut().get_resource_or_init::<EarlyTools>().0.push(tool),
        }
        self
    }

    fn serve_steps_until(&mut self, until: Instant) -> &mut Self {
        crate::runner::serve_steps_until(self.world_mut(), until);
        self
    }
}
