//! The per-conversation in-flight limit (`BUSY`), progress reports, and time limits as long as the clock allows.

mod common;

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use bevy::app::AppExit;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app, AgentTestAppExt, Gate};
use bevy_agent_tools::{CallRequest, NoArgs, Progress, ProgressSink};
use common::*;
use parking_lot::Mutex;
use serde_json::json;

/// A game in world `alpha` with a `slow` tool held at a gate and `limit` calls in flight per conversation.
fn limited(limit: usize) -> (bevy::app::App, Gate) {
    let gate = Gate::new();
    let slow = bump_tool("slow", ToolScope::World, Arc::new(AtomicUsize::new(0)), Some(gate.clone()));
    let plugin = AgentToolsPlugin::new(TestGame::default()).max_in_flight_per_conversation(limit).with_tool(slow);
    let mut app = headless_app(plugin);
    app.enter_world("alpha");
    (app, gate)
}

#[test]
fn busy_when_a_conversation_is_over_its_in_flight_limit_and_others_are_unaffected() {
    let (mut app, gate) = limited(2);
    let greedy = app.agent().conversation("greedy");
    let first = [greedy.call("slow", json!({})), greedy.call("slow", json!({}))];
    let third = greedy.call("slow", json!({}));
    let error = third.try_outcome().expect("at once").expect_err("busy");
    assert_eq!(error.code, ErrorCode::Busy);
    assert_eq!(error.details.extra["limit"], 2);
    let other = app.agent().conversation("other").call("slow", json!({}));
    assert!(other.is_running(), "the limit is per conversation");
    gate.open();
    for call in first.iter().chain([&other]) {
        assert!(app.run_until_resolved(call).is_ok());
    }
    assert!(app.run_until_resolved(&greedy.call("slow", json!({}))).is_ok(), "room again once calls finished");
}

#[test]
fn an_in_flight_limit_of_zero_is_one_not_every_call_busy() {
    let (mut app, gate) = limited(0);
    let agent = app.agent().conversation("agent");
    let first = agent.call("slow", json!({}));
    assert!(first.is_running(), "one call runs");
    let second = agent.call("slow", json!({})).try_outcome().expect("at once").expect_err("busy");
    assert_eq!((second.code, &second.details.extra["limit"]), (ErrorCode::Busy, &json!(1)));
    gate.open();
    assert!(app.run_until_resolved(&first).is_ok());
}

#[test]
fn busy_never_counts_a_call_whose_caller_already_has_its_outcome() {
    let (mut app, _gate) = limited(1);
    let agent = app.agent().conversation("agent");
    for round in 0..20 {
        let call = agent.call("slow", json!({}));
        assert!(call.cancel());
        assert_eq!(call.try_outcome().map(|o| o.map_err(|e| e.code)), Some(Err(ErrorCode::Cancelled)));
        // The caller has its outcome: its next call is not refused, even before the host forgot the first.
        let next = agent.call("slow", json!({}));
        let refused = next.try_outcome().and_then(|o| o.err()).map(|e| e.code);
        assert_ne!(refused, Some(ErrorCode::Busy), "round {round}");
        assert!(next.cancel());
        app.update();
    }
}

#[test]
fn a_retry_at_the_limit_joins_its_running_operation_or_gets_its_retained_outcome_instead_of_busy() {
    let gate = Gate::new();
    let plugin = AgentToolsPlugin::new(TestGame::default())
        .max_in_flight_per_conversation(1)
        .with_tool(bump_tool("slow", ToolScope::World, Arc::new(AtomicUsize::new(0)), Some(gate.clone())))
        .with_tool(bump_tool("quick", ToolScope::World, Arc::new(AtomicUsize::new(0)), None));
    let mut app = headless_app(plugin);
    app.enter_world("alpha");
    let agent = app.agent().conversation("agent");
    let keyed = |tool: &str| CallRequest::new(tool, json!({})).operation(format!("op-{tool}"));
    let done = app.run_until_resolved(&agent.request(keyed("quick"))).expect("ran");
    let running = agent.request(keyed("slow"));
    assert!(running.is_running(), "the conversation is at its limit now");
    let joined = agent.request(keyed("slow"));
    assert!(joined.is_running(), "a retry joins its running operation: {:?}", joined.try_outcome());
    let retained = agent.request(keyed("quick")).try_outcome().expect("at once");
    assert_eq!(retained.expect("the retained outcome").value, done.value);
    let other = agent.call("quick", json!({})).try_outcome().and_then(|o| o.err()).map(|e| e.code);
    assert_eq!(other, Some(ErrorCode::Busy), "a new execution is still refused");
    gate.open();
    assert!(app.run_until_resolved(&joined).is_ok());
}

#[test]
fn busy_never_counts_a_call_the_conversation_stopped_waiting_for_that_goes_on_for_another() {
    let (mut app, gate) = limited(1);
    let (a, b) = (app.agent().conversation("a"), app.agent().conversation("b"));
    let shared = || CallRequest::new("slow", json!({})).operation("op").task("shared");
    let first = a.request(shared());
    let retry = b.request(shared());
    assert!(first.is_running() && retry.is_running(), "b's retry joined a's execution");
    let control = a.call("slow", json!({})).try_outcome().and_then(|o| o.err()).map(|e| e.code);
    assert_eq!(control, Some(ErrorCode::Busy), "the control: a is at its limit while it waits");
    assert_eq!(a.cancel_task("shared"), 1, "a stops waiting; the execution goes on for b");
    let next = a.call("slow", json!({}));
    assert!(next.is_running(), "a waits for nothing: {:?}", next.try_outcome());
    gate.open();
    assert!(app.run_until_resolved(&retry).is_ok() && app.run_until_resolved(&next).is_ok());
}

#[test]
fn h13_a_call_waited_for_elsewhere_gets_an_outcome_when_the_game_is_dropped_without_an_exit() {
    let (mut app, gate) = limited(8);
    // Awaited on a runtime of the caller's own (a game's networking thread, say), not the plugin's.
    let call = app.agent().conversation("a").call("slow", json!({}));
    app.run_until("the handler waits at its gate", |_| gate.arrived() == 1);
    // The app unwinds from a panic, or is dropped: no `AppExit`, the plugin's runtime stops with it.
    drop(app);
    let error = awaited_elsewhere(call).expect_err("the game stopped");
    assert_eq!(error.code, ErrorCode::VisitEnded, "{error:?}");
}

/// The outcome of `call` awaited on a runtime of the caller's own; panics if none comes within 10 s.
fn awaited_elsewhere(call: bevy_agent_tools::Call) -> bevy_agent_tools::CallOutcome {
    let caller = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    let outcome = caller.block_on(async { tokio::time::timeout(Duration::from_secs(10), call).await });
    outcome.expect("an outcome, not a wait without end")
}

#[test]
fn h13_a_call_that_waited_for_its_tool_then_ran_reads_its_executions_end_when_the_game_is_dropped() {
    let gate = Gate::new();
    let plugin = AgentToolsPlugin::new(TestGame::default()).tool_wait(Duration::from_secs(600));
    let mut app = headless_app(plugin);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("late", json!({}));
    app.agent()
        .register_tool(bump_tool("late", ToolScope::World, Arc::new(AtomicUsize::new(0)), Some(gate.clone())))
        .expect("registered");
    app.run_until("the handler waits at its gate", |_| gate.arrived() == 1);
    drop(app);
    let error = awaited_elsewhere(call).expect_err("the game stopped");
    assert_eq!(error.code, ErrorCode::VisitEnded, "it ran: not that it stopped while waiting for its tool: {error:?}");
}

#[test]
fn progress_reports_reach_the_caller_in_order() {
    let tool = AgentTool::new("long", "Reports progress.", |ctx: CallContext<Session>, _: NoArgs| async move {
        for step in 1..=3 {
            ctx.on_client(|_, session| session.counter += 1).await?;
            ctx.report_progress(step as f64, Some(3.0), Some(format!("step {step}")));
        }
        Ok(())
    });
    let mut app = headless_app(AgentToolsPlugin::new(TestGame::default()).with_tool(tool));
    app.enter_world("alpha");
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let sink = {
        let seen = seen.clone();
        ProgressSink::new(move |progress| seen.lock().push(progress))
    };
    let call = app.agent().conversation("a").request(CallRequest::new("long", json!({})).progress(sink));
    assert!(app.run_until_resolved(&call).is_ok());
    let seen = seen.lock();
    assert_eq!(seen.iter().map(|p| p.progress).collect::<Vec<_>>(), [1.0, 2.0, 3.0]);
    assert_eq!(seen[2].message.as_deref(), Some("step 3"));
    assert_eq!(seen[0].total, Some(3.0));
}

#[test]
fn a_time_limit_too_long_for_the_clock_means_no_limit_and_never_panics() {
    // `Duration::MAX` is how a game says "no limit"; `Instant + Duration::MAX` would panic.
    let plugin = AgentToolsPlugin::new(TestGame::default())
        .default_timeout(Duration::MAX)
        .exit_deadline(Duration::MAX)
        .with_tool(bump_tool("bump", ToolScope::World, Arc::default(), None))
        .with_tool(bump_tool("patient", ToolScope::World, Arc::default(), None).timeout(Duration::MAX));
    let mut app = headless_app(plugin);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    let calls = [
        conversation.call("bump", json!({"by": 1})),
        conversation.call("patient", json!({"by": 1})),
        conversation.request(CallRequest::new("bump", json!({"by": 1})).timeout(Duration::MAX)),
    ];
    for call in &calls {
        assert!(app.run_until_resolved(call).is_ok());
        assert!(call.wait_timeout(Duration::MAX).is_some_and(|outcome| outcome.is_ok()));
    }
    app.world_mut().write_message(AppExit::Success);
    app.run_until("the app exits", |app| app.should_exit().is_some());
}

/// A game whose `close` starts a save that never finishes (a hung disk), counting its `shutdown`s.
#[derive(Default)]
struct HungSave {
    /// Kept, never resolved.
    saves: Arc<Mutex<Vec<bevy_agent_tools::Completer>>>,
    shutdowns: Arc<AtomicUsize>,
}

impl WorldLifecycle for HungSave {
    type Session = ();

    fn open(&self, _: &VisitInfo, _: &mut bevy::prelude::World) -> Result<Opened<()>, OpenError> {
        Ok(Opened::ready(()))
    }

    fn close(&self, _: (), _: &mut bevy::prelude::World) -> Completion {
        let (completer, save) = Completion::pending();
        self.saves.lock().push(completer);
        save
    }

    fn shutdown(&self) -> Completion {
        self.shutdowns.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Completion::done()
    }
}

/// What the game read of `VisitSaved` on the exit's frame.
#[derive(bevy::prelude::Resource, Clone, Default)]
struct SavedSeen(Arc<Mutex<Vec<String>>>);

fn saved_seen(
    mut saved: bevy::prelude::MessageReader<bevy_agent_tools::VisitSaved>,
    seen: bevy::prelude::Res<SavedSeen>,
) {
    seen.0.lock().extend(saved.read().map(|saved| format!("{:?}", saved.result)));
}

#[test]
fn h6_an_exit_whose_save_never_finishes_waits_only_its_deadline_then_says_so_and_shuts_down() {
    use bevy::prelude::IntoScheduleConfigs;
    let game = HungSave::default();
    let (saves, shutdowns) = (game.saves.clone(), game.shutdowns.clone());
    let seen = SavedSeen::default();
    let (exited, exit) = std::sync::mpsc::channel();
    let in_game = seen.clone();
    // The exit frame runs on a thread of its own: an exit that waited for the save for ever fails the test here
    // instead of hanging it.
    std::thread::spawn(move || {
        let mut app = headless_app(AgentToolsPlugin::new(game).exit_deadline(Duration::from_millis(200)));
        app.insert_resource(in_game)
            .add_systems(bevy::prelude::Last, saved_seen.after(bevy_agent_tools::AgentToolsExitSystems::Host));
        app.enter_world("alpha");
        app.world_mut().write_message(AppExit::Success);
        app.update();
        let _ = exited.send(app.should_exit().is_some());
    });
    let exited = exit.recv_timeout(bevy_agent_tools::testing::HARNESS_LIMIT).expect("the exit ended at its deadline");
    assert!(exited, "the app exits");
    assert_eq!(saves.lock().len(), 1, "the visit's close started its save");
    let seen = seen.0.lock().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].contains("did not finish before the exit deadline"), "the game is told: {seen:?}");
    assert_eq!(shutdowns.load(std::sync::atomic::Ordering::SeqCst), 1, "shutdown still ran, once");
}

#[test]
fn h6_the_plugins_workers_stop_at_the_exit() {
    let mut app = headless_app(AgentToolsPlugin::new(TestGame::default()));
    app.enter_world("alpha");
    let runtime = app.agent().runtime().clone();
    // Awaited on a runtime of the test's own: the plugin's runs it until the exit, and is gone after.
    let outside = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    assert_eq!(outside.block_on(runtime.spawn(async { "ran" })).ok(), Some("ran"), "the workers run before the exit");
    app.world_mut().write_message(AppExit::Success);
    app.update();
    assert!(app.should_exit().is_some());
    let after = runtime.spawn(async { "ran" });
    let joined = outside.block_on(async { tokio::time::timeout(HARNESS, after).await }).expect("resolves at once");
    assert!(joined.is_err_and(|error| error.is_cancelled()), "a task spawned after the exit never runs");
}

const HARNESS: Duration = bevy_agent_tools::testing::HARNESS_LIMIT;

#[test]
fn h10_a_handler_cleaning_up_after_its_call_ended_at_the_exit_finishes_before_the_workers_stop() {
    exit_with_a_handler_cleaning_up();
}

#[test]
fn h6_a_game_that_runs_its_app_inside_a_tokio_runtime_of_its_own_exits_as_any_game_does() {
    // `#[tokio::main] async fn main() { app.run(); }`: tokio refuses to block there, so the exit stops the
    // plugin's workers another way; it still closes the visit, ends its calls and waits for their cleanup.
    let outer = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    outer.block_on(async { exit_with_a_handler_cleaning_up() });
}

/// Exits while a handler holds a resource it releases once its call ended, and checks the exit: the visit closed
/// once, the call ended `VISIT_ENDED`, and the handler's cleanup ran to its end before the workers stopped.
fn exit_with_a_handler_cleaning_up() {
    let cleaned = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tool = AgentTool::new("holds", "Holds a resource until its call ends, then releases it.", {
        let (cleaned, started) = (cleaned.clone(), started.clone());
        move |ctx: CallContext<Session>, _: NoArgs| {
            let (cleaned, started) = (cleaned.clone(), started.clone());
            async move {
                started.store(true, std::sync::atomic::Ordering::SeqCst);
                ctx.ended().await;
                // Releasing what it holds takes a moment (a file to close, a native resource to free).
                tokio::time::sleep(Duration::from_millis(50)).await;
                cleaned.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
        }
    });
    let game = TestGame::default();
    let record = game.record.clone();
    let mut app = headless_app(AgentToolsPlugin::new(game).with_tool(tool));
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("holds", json!({}));
    app.run_until("the handler holds its resource", |_| started.load(std::sync::atomic::Ordering::SeqCst));
    app.world_mut().write_message(AppExit::Success);
    app.update();
    assert_eq!(app.should_exit(), Some(AppExit::Success));
    assert_eq!(record.closes.load(std::sync::atomic::Ordering::SeqCst), 1, "the visit was closed");
    assert_eq!(call.try_outcome().map(|outcome| outcome.map_err(|e| e.code)), Some(Err(ErrorCode::VisitEnded)));
    assert!(cleaned.load(std::sync::atomic::Ordering::SeqCst), "its cleanup ran to its end before the workers stopped");
}

#[test]
fn h5_no_world_opens_after_the_exit() {
    let game = TestGame::default();
    let record = game.record.clone();
    let mut app = headless_app(AgentToolsPlugin::new(game));
    app.enter_world("alpha");
    app.world_mut().write_message(AppExit::Success);
    app.update();
    let opens = record.opens.load(std::sync::atomic::Ordering::SeqCst);
    // A game loop that goes on after `AppExit` (or transitions placed after the exit in its frame): the world
    // would never be closed or saved, and its calls would have no worker.
    app.enter_world("beta");
    assert_eq!(record.opens.load(std::sync::atomic::Ordering::SeqCst), opens, "no `open` after `shutdown`");
    assert!(app.agent().visit().is_none());
}

/// A schedule of the game's own, inserted after `Last` before the plugin was added.
#[derive(bevy::ecs::schedule::ScheduleLabel, Clone, Debug, PartialEq, Eq, Hash)]
struct AfterLast;

#[test]
fn h6_an_app_exit_written_in_a_schedule_after_last_still_closes_the_visit() {
    use bevy::prelude::{IntoScheduleConfigs, Res};
    let game = TestGame::default();
    let record = game.record.clone();
    let mut app = bevy::app::App::new();
    app.add_plugins(bevy::MinimalPlugins);
    app.world_mut().resource_mut::<bevy::app::MainScheduleOrder>().insert_after(bevy::prelude::Last, AfterLast);
    app.init_schedule(AfterLast);
    app.add_plugins(AgentToolsPlugin::new(game));
    app.add_systems(AfterLast, quit.run_if(|quit: Option<Res<Quit>>| quit.is_some()));
    app.finish();
    app.cleanup();
    app.enter_world("alpha");
    app.insert_resource(Quit);
    app.update();
    assert!(app.should_exit().is_some());
    assert_eq!(record.closes.load(std::sync::atomic::Ordering::SeqCst), 1, "the visit was closed");
}

#[derive(bevy::prelude::Resource)]
struct Quit;

fn quit(mut exit: bevy::prelude::MessageWriter<AppExit>) {
    exit.write(AppExit::Success);
}
