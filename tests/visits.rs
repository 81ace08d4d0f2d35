//! Visits: one session per visit (H1), failed open (H4), exit order (H5), and entering while a world is open.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{AgentTestAppExt, Gate};
use bevy_agent_tools::{ConversationStatus, VisitClosed, VisitPhase, WorldId, WorldOpenFailed};
use common::*;
use serde_json::json;

#[test]
fn h1_reconnecting_a_conversation_ten_times_opens_the_visit_once() {
    let game = TestGame::default();
    let record = game.record.clone();
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    let agent = app.agent();
    let mut visits = Vec::new();
    for attempt in 0..10 {
        // The agent disconnects (its conversation ends) and comes back: by resuming its id, or by opening it again.
        let conversation = if attempt == 0 {
            agent.conversation("claude")
        } else if attempt % 2 == 1 {
            let resumed = agent.resume("claude").expect("the host still knows the conversation");
            assert_eq!(resumed.snapshot.status, ConversationStatus::Ended, "it was ended by the disconnect");
            let visit = resumed.snapshot.visit.as_ref().map(|visit| visit.visit);
            assert_eq!(visit, visits.first().copied(), "the snapshot names the visit opened first");
            resumed.conversation.resume().expect("the conversation reactivates");
            resumed.conversation
        } else {
            agent.conversation("claude")
        };
        let call = conversation.call("bump", json!({}));
        let output = app.run_until_resolved(&call).expect("bump succeeds");
        assert_eq!(output.value["counter"], attempt + 1, "every reconnection reaches the same session");
        visits.push(output.observed.visit);
        conversation.end().expect("the disconnect ends the conversation");
        app.update();
    }
    assert_eq!(record.opens.load(Ordering::SeqCst), 1, "reconnecting never opens another visit");
    assert_eq!(record.closes.load(Ordering::SeqCst), 0, "reconnecting never closes the visit");
    assert!(visits.windows(2).all(|pair| pair[0] == pair[1]));
}

#[test]
fn h4_failed_open_leaves_no_session_reports_and_the_next_enter_works() {
    let game = TestGame { failing: vec![WorldId::new("corrupt")], ..Default::default() };
    let record = game.record.clone();
    let mut app = app_with(game, vec![]);
    let (_, logged) = common::warnings::with_warnings(|| app.enter_world("corrupt"));
    assert!(
        logged.iter().any(|line| line.contains("corrupt") && (line.starts_with("ERROR") || line.starts_with("WARN"))),
        "the failure is logged, naming the world: {logged:#?}"
    );

    let failures: Vec<WorldOpenFailed> = app.world_mut().resource_mut::<Messages<WorldOpenFailed>>().drain().collect();
    assert_eq!(failures.len(), 1, "the failure is visible as a message");
    assert_eq!(failures[0].world, WorldId::new("corrupt"));
    assert!(failures[0].error.message().contains("corrupt"));
    assert!(app.agent().visit().is_none(), "no session is held");

    let call = app.agent().conversation("a").call("bump", json!({}));
    assert_eq!(code(&app.run_until_resolved(&call)), Some(ErrorCode::NoWorld));
    assert_eq!(record.closes.load(Ordering::SeqCst), 0, "nothing to close after a failed open");

    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("bump", json!({}));
    let output = app.run_until_resolved(&call).expect("the next enter works");
    assert_eq!(output.observed.world, WorldId::new("alpha"));
    assert_ne!(output.observed.visit, failures[0].visit, "the failed visit's id is never reused");
}

#[test]
fn h5_exit_closes_admission_ends_calls_and_closes_once_after_admission_closed() {
    let gate = Gate::new();
    let executions = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let answered = answers();
    let game = TestGame::default();
    let record = game.record.clone();
    let tool =
        bump_tool_answered("slow_bump", ToolScope::World, executions.clone(), answered.clone(), Some(gate.clone()));
    let mut app = app_with(game, vec![tool]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    let in_flight: Vec<_> = (0..3).map(|_| conversation.call("slow_bump", json!({}))).collect();
    app.run_until("three handlers parked at the gate", |_| gate.arrived() == 3);

    app.world_mut().write_message(ExitWorld::new());
    app.update();
    // Read in the exit's frame: Bevy drops a message two message updates later, and on a slow machine the
    // frames below run fixed updates that bring those.
    let closed: Vec<VisitClosed> = app.world_mut().resource_mut::<Messages<VisitClosed>>().drain().collect();

    let late = conversation.call("bump", json!({}));
    assert_eq!(code(&late.try_outcome().expect("rejected at once")), Some(ErrorCode::NoWorld));
    for call in &in_flight {
        let outcome = call.try_outcome().expect("every in-flight call resolved during exit");
        assert_eq!(code(&outcome), Some(ErrorCode::VisitEnded));
    }
    assert_eq!(
        *record.call_during_close.lock(),
        vec![Some(ErrorCode::WorldClosed)],
        "while close runs, admission is already closed"
    );
    assert_eq!(*record.input_during_close.lock(), vec![Some(ErrorCode::WorldClosed)], "and inputs are refused");

    gate.open();
    // Each handler, let go, asks for its step: answered (refused) without running it.
    app.run_until("the three handlers' steps answered", |_| answered.arrived() == 3);
    assert_eq!(executions.load(Ordering::SeqCst), 0, "no in-flight closure runs after exit");
    assert_eq!(record.closes.load(Ordering::SeqCst), 1, "close is called once");
    let later: Vec<VisitClosed> = app.world_mut().resource_mut::<Messages<VisitClosed>>().drain().collect();
    assert_eq!((closed.len(), later.len()), (1, 0), "one VisitClosed");
}

#[test]
fn entering_while_a_world_is_open_exits_then_enters_in_that_order() {
    let game = TestGame::default();
    let record = game.record.clone();
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    app.enter_world("beta");
    let events = record.events();
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(events[0].starts_with("open alpha"));
    assert!(events[1].starts_with("close alpha"));
    assert!(events[2].starts_with("open beta"));
    let status = app.agent().visit().expect("beta is open");
    assert_eq!(status.info.world, WorldId::new("beta"));
    assert_eq!(status.phase, VisitPhase::Open);
}

#[test]
fn messages_written_in_one_frame_apply_in_the_order_they_were_created() {
    let game = TestGame::default();
    let record = game.record.clone();
    let mut app = app_with(game, vec![]);
    // Enter, travel, exit and enter again, all before one frame runs.
    app.world_mut().write_message(EnterWorld::new("alpha"));
    app.world_mut().write_message(TravelTo::new("nether"));
    app.world_mut().write_message(ExitWorld::new());
    app.world_mut().write_message(EnterWorld::new("beta"));
    app.update();
    let events: Vec<String> =
        record.events().iter().map(|e| e.split_whitespace().take(2).collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(events, ["open alpha", "relocated visit#1", "close alpha", "open beta"]);
}

#[derive(States, Clone, Debug, Default, PartialEq, Eq, Hash)]
enum Screen {
    #[default]
    Menu,
    Playing {
        save: &'static str,
        dimension: &'static str,
    },
}

/// Sets the followed state to `screen` and runs the frame that changes it.
fn go(app: &mut App, screen: Screen) {
    app.world_mut().resource_mut::<NextState<Screen>>().set(screen);
    app.update();
}

#[test]
fn a_followed_state_the_app_never_initialized_is_refused_when_the_app_is_built() {
    let follow = || {
        AgentToolsPlugin::new(TestGame::default()).follow_state::<Screen>(|screen| match screen {
            Screen::Menu => None,
            Screen::Playing { save, dimension } => Some(((*save).into(), (*dimension).into())),
        })
    };
    let build = |init: bool| {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut app = App::new();
            app.add_plugins((MinimalPlugins, bevy::state::app::StatesPlugin, follow()));
            if init {
                app.init_state::<Screen>();
            }
            app.finish();
        }))
    };
    let refused = build(false).expect_err("a set-up mistake");
    let said = refused.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(said.contains("State<") && said.contains("init_state"), "{said}");
    build(true).expect("initialized: followed");

    // Without Bevy's `StatesPlugin` no state ever changes: refused too.
    let refused = std::panic::catch_unwind(|| {
        let mut app = App::new();
        app.add_plugins((MinimalPlugins, follow()));
        app.finish();
    })
    .expect_err("a set-up mistake");
    let said = refused.downcast_ref::<&str>().map(|said| said.to_string()).unwrap_or_default();
    assert!(said.contains("StatesPlugin"), "{said}");

    // A sub-state set up right has no `State<S>` until its source allows: not refused either.
    let follow = AgentToolsPlugin::new(TestGame::default()).follow_state::<Paused>(|_| None);
    let mut app = App::new();
    app.add_plugins((MinimalPlugins, bevy::state::app::StatesPlugin, follow));
    app.init_state::<Screen>().add_sub_state::<Paused>();
    app.finish();
}

#[derive(SubStates, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[source(Screen = Screen::Menu)]
enum Paused {
    #[default]
    No,
}

#[test]
fn a_followed_states_type_drives_enter_travel_and_exit() {
    let game = TestGame::default();
    let record = game.record.clone();
    let plugin = AgentToolsPlugin::new(game).follow_state::<Screen>(|screen| match screen {
        Screen::Menu => None,
        Screen::Playing { save, dimension } => Some(((*save).into(), (*dimension).into())),
    });
    let mut app = App::new();
    app.add_plugins((MinimalPlugins, bevy::state::app::StatesPlugin, plugin)).init_state::<Screen>();
    app.finish();
    app.cleanup();
    app.update();
    assert!(app.agent().visit().is_none());

    go(&mut app, Screen::Playing { save: "alpha", dimension: "overworld" });
    go(&mut app, Screen::Playing { save: "alpha", dimension: "nether" });
    let status = app.agent().visit().expect("in alpha");
    assert_eq!(status.info.location.dimension.as_str(), "nether");
    assert_eq!(status.info.location.revision.0, 1);
    go(&mut app, Screen::Playing { save: "beta", dimension: "overworld" });
    go(&mut app, Screen::Menu);
    assert!(app.agent().visit().is_none());
    let events: Vec<String> =
        record.events().iter().map(|e| e.split_whitespace().take(2).collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(events, ["open alpha", "relocated visit#1", "close alpha", "open beta", "close beta"]);
}

/// A game whose level is entities of its own: `close` says how many blocks it found to save.
struct LevelGame {
    seen: Arc<parking_lot::Mutex<Vec<String>>>,
}

#[derive(Component)]
struct Block;

impl WorldLifecycle for LevelGame {
    type Session = ();

    fn open(&self, visit: &VisitInfo, _: &mut World) -> Result<Opened<()>, OpenError> {
        self.seen.lock().push(format!("open {}", visit.world));
        Ok(Opened::ready(()))
    }

    fn close(&self, _: (), world: &mut World) -> Completion {
        let blocks = world.query::<&Block>().iter(world).count();
        self.seen.lock().push(format!("close with {blocks} blocks"));
        Completion::done()
    }
}

#[test]
fn a_followed_state_closes_its_world_before_on_exit_despawns_it_and_opens_it_before_on_enter() {
    // Whichever plugin comes first: Bevy's own order of a state change (`OnExit`, then `OnEnter`, in the frame the
    // state changes) holds either way.
    for states_first in [true, false] {
        followed_level(states_first);
    }
}

fn followed_level(states_first: bool) {
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let plugin =
        AgentToolsPlugin::new(LevelGame { seen: seen.clone() }).follow_state::<Screen>(|screen| match screen {
            Screen::Menu => None,
            Screen::Playing { save, dimension } => Some(((*save).into(), (*dimension).into())),
        });
    let alpha = Screen::Playing { save: "alpha", dimension: "overworld" };
    let mut app = App::new();
    app.add_plugins(MinimalPlugins);
    if states_first {
        app.add_plugins((bevy::state::app::StatesPlugin, plugin));
    } else {
        app.add_plugins((plugin, bevy::state::app::StatesPlugin));
    }
    app.init_state::<Screen>();
    let (entered, exited, scoped) = (seen.clone(), seen.clone(), alpha.clone());
    // The level is spawned from the open world's session, and goes with the state.
    app.add_systems(OnEnter(alpha.clone()), move |world: &mut World| {
        let open = world.with_visit_session::<LevelGame, _>(|visit, _, _| visit.world.clone());
        entered.lock().push(format!("OnEnter sees {open:?}"));
        world.spawn_batch((0..3).map(|_| (Block, DespawnOnExit(scoped.clone()))));
    });
    app.add_systems(OnExit(alpha.clone()), move |agent: Res<AgentHandle>| {
        exited.lock().push(format!("OnExit sees a visit: {}", agent.visit().is_some()));
    });
    app.finish();
    app.cleanup();
    app.update();
    go(&mut app, alpha);
    assert_eq!(seen.lock().len(), 2, "opened, then OnEnter, in the frame the state changed: {:?}", seen.lock());
    go(&mut app, Screen::Menu);
    assert_eq!(
        *seen.lock(),
        ["open alpha", "OnEnter sees Some(WorldId(\"alpha\"))", "close with 3 blocks", "OnExit sees a visit: false"],
        "the world saved is the one the player left, not what was left of it"
    );
    assert_eq!(app.world_mut().query::<&Block>().iter(app.world()).count(), 0, "the state's entities went");
}

#[test]
fn an_app_that_ends_without_app_exit_with_a_world_open_says_the_world_was_not_saved() {
    let ended = |exit: bool| {
        let ((), said) = common::warnings::with_warnings(|| {
            // A game's app (the test harness's apps say nothing: a test loses nothing).
            let mut app = App::new();
            app.add_plugins((MinimalPlugins, AgentToolsPlugin::new(TestGame::default())));
            app.finish();
            app.cleanup();
            app.enter_world("alpha");
            if exit {
                app.world_mut().write_message(AppExit::Success);
                app.update();
            }
            drop(app);
        });
        said.iter().any(|line| line.starts_with("ERROR") && line.contains("AppExit") && line.contains("alpha"))
    };
    assert!(ended(false), "run_once, or a loop that stops calling update: nothing else would show the loss");
    assert!(!ended(true), "AppExit closed and saved it");
    let ((), said) = common::warnings::with_warnings(|| {
        let mut app = app_with(TestGame::default(), vec![]);
        app.enter_world("alpha");
    });
    assert!(said.iter().all(|line| !line.contains("AppExit")), "a test app says nothing: {said:?}");
}

#[test]
fn a_second_lifecycle_is_refused_when_it_is_added() {
    let added = std::panic::catch_unwind(|| {
        let second = AgentToolsPlugin::new(LevelGame { seen: Arc::default() });
        App::new().add_plugins((MinimalPlugins, AgentToolsPlugin::new(TestGame::default()), second));
    });
    let refused = added.expect_err("one host per app");
    let said = refused.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(said.contains("added twice") && said.contains("LevelGame"), "{said}");
}

#[test]
fn a_followed_state_that_starts_in_a_world_opens_it_after_the_games_startup_systems() {
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let plugin =
        AgentToolsPlugin::new(LevelGame { seen: seen.clone() }).follow_state::<Screen>(|screen| match screen {
            Screen::Menu => None,
            Screen::Playing { save, dimension } => Some(((*save).into(), (*dimension).into())),
        });
    let mut app = App::new();
    app.add_plugins((MinimalPlugins, bevy::state::app::StatesPlugin, plugin))
        .insert_state(Screen::Playing { save: "alpha", dimension: "overworld" });
    let started = seen.clone();
    app.add_systems(Startup, move || started.lock().push("Startup".to_string()));
    app.finish();
    app.cleanup();
    app.update();
    assert_eq!(*seen.lock(), ["Startup", "open alpha"]);
    assert!(app.agent().visit().is_some());
}

/// Where the player is, computed from [`Screen`]: it exists only while the player is playing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct InWorld(&'static str);

impl bevy::state::state::ComputedStates for InWorld {
    type SourceStates = Screen;

    fn compute(screen: Screen) -> Option<Self> {
        match screen {
            Screen::Menu => None,
            Screen::Playing { save, .. } => Some(InWorld(save)),
        }
    }
}

#[test]
fn a_followed_computed_state_that_stops_existing_exits_the_world() {
    let game = TestGame::default();
    let record = game.record.clone();
    let plugin =
        AgentToolsPlugin::new(game).follow_state::<InWorld>(|in_world| Some((in_world.0.into(), "overworld".into())));
    let mut app = App::new();
    app.add_plugins((MinimalPlugins, bevy::state::app::StatesPlugin, plugin))
        .init_state::<Screen>()
        .add_computed_state::<InWorld>();
    app.finish();
    app.cleanup();
    app.update();
    go(&mut app, Screen::Playing { save: "alpha", dimension: "overworld" });
    assert_eq!(app.agent().visit().expect("in alpha").info.world.as_str(), "alpha");
    go(&mut app, Screen::Menu);
    assert!(app.agent().visit().is_none(), "back in the menu, `State<InWorld>` is gone: the visit is closed");
    // The same world again: a new visit, not the old one carried on.
    go(&mut app, Screen::Playing { save: "alpha", dimension: "overworld" });
    assert!(app.agent().visit().is_some());
    app.update();
    let events: Vec<String> =
        record.events().iter().map(|e| e.split_whitespace().take(2).collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(events, ["open alpha", "close alpha", "open alpha"]);
}

/// `WorldLifecycle::tick` runs once per frame on the open visit's session, and never without one.
#[test]
fn tick_runs_once_per_frame_on_the_open_session_and_never_between_visits() {
    let record = Arc::new(Record::default());
    let mut app = app_with(TestGame { record: record.clone(), ..Default::default() }, vec![]);
    app.step(3);
    assert_eq!(record.ticks.load(Ordering::SeqCst), 0, "no visit, no tick");
    app.enter_world("alpha"); // one frame: open, then tick
    app.step(4);
    assert_eq!(record.ticks.load(Ordering::SeqCst), 5, "one tick per frame");
    app.exit_world();
    let after_exit = record.ticks.load(Ordering::SeqCst);
    app.step(3);
    assert_eq!(record.ticks.load(Ordering::SeqCst), after_exit, "no tick after the exit");
}

/// `lend(app, by)` adds `by` to the open visit's session as the game's own code reaches it, and returns that visit's
/// world, dimension and counter: what it changes, the tools see, and what they change, it sees; with no visit open
/// there is none to reach.
fn reaches_the_open_visits_session_and_no_other(lend: impl Fn(&mut App, u64) -> Option<(WorldId, String, u64)>) {
    let mut app = app_with(TestGame::default(), vec![]);
    assert_eq!(lend(&mut app, 1), None, "no visit is open");
    app.enter_world("alpha");
    let agent = app.agent().conversation("a");
    assert_eq!(app.run_until_resolved(&agent.call("bump", json!({}))).expect("bumps").value["counter"], 1);
    assert_eq!(lend(&mut app, 10), Some((WorldId::new("alpha"), "overworld".to_string(), 11)), "the tool's change");
    assert_eq!(app.run_until_resolved(&agent.call("bump", json!({}))).expect("bumps").value["counter"], 12);
    app.travel("nether");
    assert_eq!(lend(&mut app, 0).map(|(_, dimension, _)| dimension), Some("nether".to_string()), "where it is now");
    app.exit_world();
    assert_eq!(lend(&mut app, 1), None, "the visit ended");
    app.enter_world("beta");
    assert_eq!(lend(&mut app, 1).map(|(world, _, counter)| (world, counter)), Some((WorldId::new("beta"), 1)));
}

/// The game's own main-thread code reaches the open visit's one session (H1): what it changes, the tools see, and
/// what they change, it sees; with no visit open there is none to reach.
#[test]
fn h1_the_games_own_code_reaches_the_open_visits_session_and_no_other() {
    let lend = |app: &mut App, by: u64| {
        app.world_mut().with_visit_session::<TestGame, _>(|visit, session, _world| {
            session.counter += by;
            (visit.world.clone(), visit.location.dimension.to_string(), session.counter)
        })
    };
    reaches_the_open_visits_session_and_no_other(lend);
}

/// The same through the system parameter [`VisitSession`], for the game's ordinary (not exclusive) systems.
#[test]
fn h1_an_ordinary_systems_visit_session_is_the_open_visits_and_no_other() {
    use bevy::ecs::system::RunSystemOnce;
    #[derive(Resource)]
    struct By(u64);
    let lend = |app: &mut App, by: u64| {
        app.world_mut().insert_resource(By(by));
        let bumped = app.world_mut().run_system_once(|by: Res<By>, mut visit: VisitSession<TestGame>| {
            let (visit, session) = visit.get_mut()?;
            session.counter += by.0;
            Some((visit.world.clone(), visit.location.dimension.to_string(), session.counter))
        });
        let read = app.world_mut().run_system_once(|visit: VisitSession<TestGame>| {
            visit.get().map(|(visit, session)| (visit.world.clone(), session.counter))
        });
        let bumped = bumped.expect("the system runs");
        assert_eq!(read.expect("the system runs"), bumped.clone().map(|(world, _, counter)| (world, counter)));
        bumped
    };
    reaches_the_open_visits_session_and_no_other(lend);
}

/// The harness hands back a future's output as it is: a game's save type need not be `Clone` to be loaded in a test.
#[test]
fn the_harness_runs_a_future_whose_output_cannot_be_cloned() {
    struct Save(#[allow(dead_code)] std::sync::Mutex<u32>);
    let mut app = app_with(TestGame::default(), vec![]);
    let save = app.run_future(async { Save(std::sync::Mutex::new(7)) });
    assert_eq!(save.0.into_inner().expect("not poisoned"), 7);
}
