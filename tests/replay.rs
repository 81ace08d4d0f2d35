//! Replay (H12): calls with the same (tool, task, scope, operation id) share one execution; failures are
//! retained; conflicts run nothing. And the guards of destructive tools.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{AgentTestAppExt, Gate};
use bevy_agent_tools::{
    CallRequest, ConversationEvent, ConversationStatus, DestructiveGuard, NoArgs, Subscription, OPERATION_ID, TASK_ID,
};
use common::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[test]
fn h12_how_long_outcomes_are_kept_is_the_games_choice_and_an_evicted_operation_runs_again() {
    let executions = Arc::new(AtomicUsize::new(0));
    // One call in flight at a time: once the conversation is not busy, its call has its outcome; its operation's
    // entry is completed then or a moment later, and a full table settles such entries before it refuses `BUSY`.
    let plugin = AgentToolsPlugin::new(TestGame::default())
        .replay_retention(bevy_agent_tools::ReplayRetention { max_entries: 2, ..Default::default() })
        .max_in_flight_per_conversation(1)
        .with_tool(bump_tool("counted", ToolScope::World, executions.clone(), None));
    let mut app = bevy_agent_tools::testing::headless_app(plugin);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    let mut run = |operation: &str| {
        let call = conversation.request(keyed("counted", json!({}), operation));
        app.run_until_resolved(&call).expect("runs");
        app.run_until("its entry is completed", |app| !app.agent().is_busy(&"agent".into()));
        executions.load(Ordering::SeqCst)
    };
    assert_eq!(run("op-1"), 1);
    assert_eq!(run("op-2"), 2);
    assert_eq!(run("op-3"), 3);
    assert_eq!(run("op-3"), 3, "kept: op-3's retry gets its outcome");
    assert_eq!(run("op-1"), 4, "op-1's outcome was evicted for op-3's: its retry runs again");
}

#[test]
fn h12_a_retention_of_no_entries_is_taken_as_one_so_keyed_calls_still_run() {
    let executions = Arc::new(AtomicUsize::new(0));
    let plugin = AgentToolsPlugin::new(TestGame::default())
        .replay_retention(bevy_agent_tools::ReplayRetention { max_entries: 0, ..Default::default() })
        .with_tool(bump_tool("counted", ToolScope::World, executions.clone(), None));
    let mut app = bevy_agent_tools::testing::headless_app(plugin);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    let first = app.run_until_resolved(&conversation.request(keyed("counted", json!({}), "op-1")));
    assert!(first.is_ok(), "{first:?}");
    let again = app.run_until_resolved(&conversation.request(keyed("counted", json!({}), "op-1")));
    assert_eq!(again, first, "its one entry replays it");
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}

#[test]
fn h12_a_keyed_call_when_every_kept_entry_is_in_flight_is_refused_busy_and_runs_nothing() {
    let (gate, executions) = (Gate::new(), Arc::new(AtomicUsize::new(0)));
    let plugin = AgentToolsPlugin::new(TestGame::default())
        .replay_retention(bevy_agent_tools::ReplayRetention { max_entries: 1, ..Default::default() })
        .with_tool(bump_tool("slow", ToolScope::World, executions.clone(), Some(gate.clone())));
    let mut app = bevy_agent_tools::testing::headless_app(plugin);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    let first = conversation.request(keyed("slow", json!({}), "op-1"));
    app.run_until("op-1's handler waits at the gate", |_| gate.arrived() == 1);

    // An in-flight entry is never evicted: there is no room for op-2's, and the table does not grow past its cap.
    let second = conversation.request(keyed("slow", json!({}), "op-2")).try_outcome().expect("refused at once");
    let error = second.expect_err("no room to keep its outcome");
    assert_eq!(error.code, ErrorCode::Busy, "{}", error.message);
    assert!(error.message.contains("keyed operations"), "{}", error.message);
    gate.open();
    assert!(app.run_until_resolved(&first).is_ok());
    app.step(3);
    assert_eq!(executions.load(Ordering::SeqCst), 1, "op-2 never ran");
}

fn keyed(tool: &str, args: Value, operation: &str) -> CallRequest {
    CallRequest::new(tool, args).operation(operation)
}

#[test]
fn h12_hundred_concurrent_identical_calls_run_the_handler_once_and_share_one_outcome() {
    let (mut app, gate, executions) = gated_app("slow", ToolScope::World);
    let agent = app.agent();
    let barrier = Arc::new(std::sync::Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (agent, barrier) = (agent.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                (0..25)
                    .map(|_| {
                        agent
                            .conversation(format!("c{t}"))
                            .request(keyed("slow", json!({"by": 2}), "op-1").task("build"))
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let calls: Vec<_> = threads.into_iter().flat_map(|t| t.join().expect("thread")).collect();
    assert_eq!(calls.len(), 100);
    app.run_until("the one execution is parked", |_| gate.arrived() >= 1);
    gate.open();
    let outcomes: Vec<_> = calls.iter().map(|call| app.run_until_resolved(call)).collect();
    assert_eq!(gate.arrived(), 1, "the handler ran once");
    assert_eq!(executions.load(Ordering::SeqCst), 1, "its step ran once");
    assert!(outcomes[0].is_ok());
    assert!(outcomes.iter().all(|o| *o == outcomes[0]), "all 100 got the identical outcome");
}

#[test]
fn h12_null_arguments_and_an_empty_object_are_one_operation_as_the_tool_sees_one_input() {
    let executions = Arc::new(AtomicUsize::new(0));
    let mut app = app_with(TestGame::default(), vec![bump_tool("count", ToolScope::World, executions.clone(), None)]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    let first = app.run_until_resolved(&conversation.request(keyed("count", Value::Null, "op"))).expect("ran");
    let again = app.run_until_resolved(&conversation.request(keyed("count", json!({}), "op")));
    assert_eq!(again.expect("the retained outcome, not OPERATION_CONFLICT").value, first.value);
    assert_eq!(executions.load(Ordering::SeqCst), 1, "ran once");
}

#[test]
fn h12_duplicate_after_completion_gets_the_retained_outcome_without_running() {
    let executions = Arc::new(AtomicUsize::new(0));
    let mut app = app_with(TestGame::default(), vec![bump_tool("count", ToolScope::World, executions.clone(), None)]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    let first = app.run_until_resolved(&conversation.request(keyed("count", json!({"by": 5}), "op")));
    let again = conversation.request(keyed("count", json!({"by": 5}), "op"));
    assert!(!again.is_running(), "answered from the table");
    assert_eq!(again.try_outcome(), Some(first.clone()));
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    assert_eq!(first.expect("ok").value["counter"], 5);
}

#[test]
fn h12_an_in_process_call_with_operation_id_in_its_arguments_runs_once_as_over_mcp() {
    let executions = Arc::new(AtomicUsize::new(0));
    let mut app = app_with(TestGame::default(), vec![bump_tool("count", ToolScope::World, executions.clone(), None)]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    let args = json!({ "by": 5, OPERATION_ID: "op", TASK_ID: "build" });
    let first = app.run_until_resolved(&conversation.call("count", args.clone()));
    let again = conversation.call("count", args);
    assert_eq!(again.try_outcome(), Some(first.clone()), "the retry is answered from the table");
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    let same_key = conversation.request(keyed("count", json!({ "by": 5 }), "op").task("build"));
    assert_eq!(same_key.try_outcome(), Some(first), "the same key, given through the request");

    let twice = keyed("count", json!({ "by": 5, OPERATION_ID: "other" }), "op");
    let refused = conversation.request(twice).try_outcome().expect("at once").expect_err("two ids");
    assert_eq!((refused.code, refused.details.extra["field"].clone()), (ErrorCode::InvalidInput, json!(OPERATION_ID)));
    let empty = conversation.call("count", json!({ "by": 5, OPERATION_ID: "" })).try_outcome().expect("at once");
    assert_eq!(empty.expect_err("empty id").code, ErrorCode::InvalidInput);
    assert_eq!(executions.load(Ordering::SeqCst), 1, "nothing refused ran");
}

#[test]
fn h12_a_read_only_tool_keys_nothing_so_a_repeated_read_sees_the_world_as_it_is_now() {
    let executions = Arc::new(AtomicUsize::new(0));
    let peek = AgentTool::new("peek", "Reads the counter.", |ctx: CallContext<Session>, _: NoArgs| async move {
        ctx.on_client(|_, session| session.counter).await
    })
    .read_only();
    let mut app = app_with(TestGame::default(), vec![bump_tool("count", ToolScope::World, executions, None), peek]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    let read = |app: &mut bevy::prelude::App, arguments: Value| {
        let outcome = app.run_until_resolved(&conversation.call("peek", arguments)).expect("reads");
        outcome.value
    };
    assert_eq!(read(&mut app, json!({ OPERATION_ID: "look" })), json!(0));
    app.run_until_resolved(&conversation.call("count", json!({ "by": 2 }))).expect("bumps");
    assert_eq!(read(&mut app, json!({ OPERATION_ID: "look" })), json!(2), "read again, not replayed");
}

#[derive(Default)]
struct Runs(AtomicUsize);

fn failing_tool(runs: Arc<Runs>) -> AgentTool<Session> {
    AgentTool::new("fails", "Always fails.", move |_ctx: CallContext<Session>, _: NoArgs| {
        let runs = runs.clone();
        async move {
            runs.0.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(ToolError::new("NO_DIAMONDS", "there are no diamonds here"))
        }
    })
}

#[test]
fn h12_failed_outcome_is_retained_the_same_way() {
    let runs = Arc::new(Runs::default());
    let mut app = app_with(TestGame::default(), vec![failing_tool(runs.clone())]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    let first = app.run_until_resolved(&conversation.request(keyed("fails", json!({}), "mine")));
    let again = app.run_until_resolved(&conversation.request(keyed("fails", json!({}), "mine")));
    assert_eq!(first, again);
    assert_eq!(code(&again), Some(ErrorCode::Tool("NO_DIAMONDS".into())));
    assert_eq!(runs.0.load(Ordering::SeqCst), 1);
}

#[test]
fn h12_changed_arguments_conflict_and_run_nothing_but_reordered_keys_do_not() {
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Noted {
        by: u64,
        /// Anything: nested keys and numbers, spelt differently from one retry to the next.
        note: Value,
    }
    let executions = Arc::new(AtomicUsize::new(0));
    let counted = executions.clone();
    let count = AgentTool::new("count", "Counts.", move |_: CallContext<Session>, _: Noted| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move { Ok(()) }
    });
    let mut app = app_with(TestGame::default(), vec![count]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    let args: Value = serde_json::from_str(r#"{"by": 3, "note": {"a": 1, "b": 2.0}}"#).expect("json");
    let first = app.run_until_resolved(&conversation.request(keyed("count", args, "op")));
    assert!(first.is_ok());

    let reordered: Value = serde_json::from_str(r#"{"note": {"b": 2, "a": 1.0}, "by": 3.0}"#).expect("json");
    let same = conversation.request(keyed("count", reordered, "op"));
    assert_eq!(same.try_outcome(), Some(first), "key order and number spelling do not matter");

    let changed = conversation.request(keyed("count", json!({"by": 4, "note": {"a": 1, "b": 2}}), "op"));
    let error = changed.try_outcome().expect("at once").expect_err("conflict");
    assert_eq!(error.code, ErrorCode::OperationConflict);
    assert_eq!(error.details.extra["operation_id"], "op");
    assert_eq!(error.details.extra["arguments_differ"], true);
    // DESIGN §5: a refusal names the visit and location it was refused in.
    let visit = app.agent().visit().expect("open").info;
    assert_eq!(error.details.visit, Some(visit.visit));
    assert_eq!(error.details.world.as_ref(), Some(&visit.world));
    assert_eq!(error.details.revision, Some(visit.location.revision));
    app.step(3);
    assert_eq!(executions.load(Ordering::SeqCst), 1, "nothing ran for the conflict");
}

#[test]
fn h12_different_task_scope_or_tool_with_the_same_operation_id_are_independent() {
    let executions = Arc::new(AtomicUsize::new(0));
    let tools = vec![
        bump_tool("count", ToolScope::World, executions.clone(), None),
        bump_tool("count_too", ToolScope::World, executions.clone(), None),
        bump_tool("count_here", ToolScope::Location, executions.clone(), None),
    ];
    let mut app = app_with(TestGame::default(), tools);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    let run =
        |app: &mut bevy::prelude::App, request: CallRequest| app.run_until_resolved(&conversation.request(request));
    assert!(run(&mut app, keyed("count", json!({}), "op").task("t1")).is_ok());
    assert!(run(&mut app, keyed("count", json!({}), "op").task("t2")).is_ok());
    assert!(run(&mut app, keyed("count_too", json!({}), "op").task("t1")).is_ok());
    assert!(run(&mut app, keyed("count_here", json!({}), "op").task("t1")).is_ok());
    app.travel("nether");
    assert!(
        run(&mut app, keyed("count_here", json!({}), "op").task("t1")).is_ok(),
        "another location is another scope"
    );
    assert_eq!(executions.load(Ordering::SeqCst), 5);
    assert!(run(&mut app, keyed("count_here", json!({}), "op").task("t1")).is_ok());
    assert_eq!(executions.load(Ordering::SeqCst), 5, "the same scope replays");
}

#[test]
fn h12_timed_out_operation_replays_as_timeout_with_effect_unknown_and_does_not_rerun() {
    let (mut app, gate, executions, answered) = gated_app_answered("slow", ToolScope::World);
    let conversation = app.agent().conversation("a");
    let request = keyed("slow", json!({}), "op").timeout(Duration::from_millis(30));
    let first = app.run_until_resolved(&conversation.request(request.clone()));
    let error = first.clone().expect_err("timed out");
    assert_eq!(error.code, ErrorCode::Timeout);
    assert!(error.message.contains("effect is unknown"), "{}", error.message);
    let again = conversation.request(request);
    assert_eq!(again.try_outcome(), Some(first), "replayed, not re-run");
    gate.open();
    app.run_until("the late handler's step answered", |_| answered.arrived() == 1);
    assert_eq!(gate.arrived(), 1, "the handler ran once");
    assert_eq!(executions.load(Ordering::SeqCst), 0, "and its late step never ran");
}

#[test]
fn h12_a_call_that_never_started_is_not_retained_so_a_retry_runs() {
    let game = TestGame { load_async: true, ..Default::default() };
    let loading = game.loading.clone();
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    let request = keyed("bump", json!({}), "op").timeout(Duration::from_millis(30));
    assert_eq!(code(&app.run_until_resolved(&conversation.request(request))), Some(ErrorCode::WorldLoadingTimeout));
    loading.lock().take().expect("completer").succeed();
    let retry = app.run_until_resolved(&conversation.request(keyed("bump", json!({}), "op")));
    assert_eq!(retry.expect("the retry ran").value["counter"], 1);
}

#[test]
fn h12_a_cancelled_operation_whose_handler_started_replays_as_cancelled_with_effect_unknown() {
    let (mut app, gate, _executions) = gated_app("slow", ToolScope::World);
    let conversation = app.agent().conversation("a");
    let first = conversation.request(keyed("slow", json!({}), "op"));
    app.run_until("parked: the handler started", |_| gate.arrived() == 1);
    assert!(first.cancel());
    let error = app.run_until_resolved(&first).expect_err("cancelled");
    assert_eq!((&error.code, error.details.extra.get("effect_unknown")), (&ErrorCode::Cancelled, Some(&json!(true))));
    assert!(error.message.contains("effect is unknown"), "{}", error.message);
    let retry = conversation.request(keyed("slow", json!({}), "op"));
    assert_eq!(retry.try_outcome(), Some(Err(error)), "the retry is told the same, not that nothing happened");
    gate.open();

    // Cancelled before its handler started: nothing ran, nothing is unknown.
    let game = TestGame { load_async: true, ..Default::default() };
    let mut app = app_with(game, vec![]);
    app.enter_world("alpha");
    let waiting = app.agent().conversation("a").request(keyed("bump", json!({}), "op"));
    assert!(waiting.cancel());
    let error = app.run_until_resolved(&waiting).expect_err("cancelled");
    assert_eq!((error.code, error.details.extra.get("effect_unknown")), (ErrorCode::Cancelled, None));
}

#[test]
fn h12_a_new_visit_does_not_see_the_previous_visits_entries() {
    let executions = Arc::new(AtomicUsize::new(0));
    let mut app = app_with(TestGame::default(), vec![bump_tool("count", ToolScope::World, executions.clone(), None)]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    assert!(app.run_until_resolved(&conversation.request(keyed("count", json!({}), "op"))).is_ok());
    app.enter_world("alpha");
    let fresh = conversation.request(keyed("count", json!({}), "op"));
    assert!(fresh.is_running(), "a new visit starts with an empty table");
    assert!(app.run_until_resolved(&fresh).is_ok());
    assert_eq!(executions.load(Ordering::SeqCst), 2);
}

#[test]
fn h12_a_dropped_keyed_call_keeps_running_for_its_retry() {
    let (mut app, gate, executions) = gated_app("slow", ToolScope::World);
    let conversation = app.agent().conversation("a");
    drop(conversation.request(keyed("slow", json!({}), "op")));
    app.run_until("parked", |_| gate.arrived() == 1);
    let retry = conversation.request(keyed("slow", json!({}), "op"));
    assert!(retry.is_running(), "the retry joined the running execution");
    gate.open();
    assert!(app.run_until_resolved(&retry).is_ok());
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}

#[test]
fn h12_a_retry_that_cancels_stops_waiting_and_the_first_caller_still_gets_the_operations_outcome() {
    let (mut app, gate, executions) = gated_app("slow", ToolScope::World);
    let conversation = app.agent().conversation("a");
    let first = conversation.request(keyed("slow", json!({}), "op"));
    app.run_until("parked", |_| gate.arrived() == 1);
    let retry = conversation.request(keyed("slow", json!({}), "op"));
    assert!(retry.is_running(), "the retry joined the running execution");
    assert!(retry.cancel(), "the retry's own call ended");
    let mine = app.run_until_resolved(&retry);
    assert_eq!(mine.map_err(|e| e.code), Err(ErrorCode::Cancelled), "the retry stopped waiting");
    assert_eq!(first.try_outcome(), None, "the first caller still waits for the operation");
    gate.open();
    assert!(app.run_until_resolved(&first).is_ok(), "and gets its outcome");
    assert_eq!(executions.load(Ordering::SeqCst), 1, "its step ran");
    // Awaited only now, after the operation succeeded, the retry's call still says what it said.
    let awaited = app.agent().runtime().block_on(retry);
    assert_eq!(awaited.map_err(|e| e.code), Err(ErrorCode::Cancelled), "one outcome per caller, however it is read");
}

#[test]
fn h12_the_last_caller_waiting_for_an_operation_cancels_it_even_a_retry_of_a_dropped_call() {
    let (mut app, gate, _) = gated_app("slow", ToolScope::World);
    let conversation = app.agent().conversation("a");
    // The first caller went away (a dropped connection): its keyed call runs on for a retry.
    drop(conversation.request(keyed("slow", json!({}), "op")));
    app.run_until("parked", |_| gate.arrived() == 1);
    let retry = conversation.request(keyed("slow", json!({}), "op"));
    assert!(retry.is_running(), "the retry joined the running execution");
    assert!(retry.cancel());
    let again = conversation.request(keyed("slow", json!({}), "op"));
    let retained = app.run_until_resolved(&again);
    assert_eq!(retained.map_err(|e| e.code), Err(ErrorCode::Cancelled), "the operation was cancelled, and retained so");
    gate.open();
}

#[test]
fn h12_a_rejoined_call_counts_as_a_caller_so_another_callers_cancel_leaves_the_retry_waiting() {
    let (mut app, gate, executions) = gated_app("slow", ToolScope::World);
    let conversation = app.agent().conversation("a");
    let first = conversation.request(keyed("slow", json!({}), "op"));
    app.run_until("parked", |_| gate.arrived() == 1);
    let retry = conversation.request(keyed("slow", json!({}), "op"));
    // A HUD observes the call, then stops observing it.
    let request = first.request_id().expect("admitted");
    drop(conversation.rejoin(request).expect("still running"));
    assert!(first.cancel(), "the first caller stops waiting");
    gate.open();
    assert!(app.run_until_resolved(&retry).is_ok(), "the retry still waits for the operation, and gets its outcome");
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}

/// A keyed call of task `shared`, which two conversations name (a client that reconnected under a new session
/// and retried).
fn shared(operation: &str) -> CallRequest {
    keyed("slow", json!({}), operation).task("shared")
}

/// The game's `slow` tool parked at its gate in conversation `a`'s keyed call of task `shared` (operation `op`),
/// with conversation `b` ready to retry it.
struct Parked {
    app: bevy::prelude::App,
    gate: bevy_agent_tools::testing::Gate,
    executions: Arc<AtomicUsize>,
    answered: Gate,
    a: bevy_agent_tools::Conversation,
    b: bevy_agent_tools::Conversation,
    first: bevy_agent_tools::Call,
}

fn a_shared_call_parked() -> Parked {
    let (mut app, gate, executions, answered) = gated_app_answered("slow", ToolScope::World);
    let (a, b) = (app.agent().conversation("a"), app.agent().conversation("b"));
    let first = a.request(shared("op"));
    app.run_until("parked", |_| gate.arrived() == 1);
    Parked { app, gate, executions, answered, a, b, first }
}

/// The `CallFinished` events of one conversation, by code.
fn finished(events: &mut Subscription) -> Vec<Option<ErrorCode>> {
    events
        .drain()
        .into_iter()
        .filter_map(|event| match event {
            ConversationEvent::CallFinished(finished) => Some(finished.code),
            _ => None,
        })
        .collect()
}

#[test]
fn h12_an_ending_conversation_withdraws_only_its_own_callers_and_the_execution_goes_on_for_another_conversation() {
    let Parked { mut app, gate, executions, a, b, first, .. } = a_shared_call_parked();
    let (_, mut a_events) = a.subscribe().expect("a is open");
    let retry = b.request(shared("op"));
    assert_eq!(retry.request_id(), first.request_id(), "b's retry joined a's execution");
    a.end().expect("a ends");
    let mine = first.try_outcome().expect("a's caller stopped waiting when a ended");
    let error = mine.expect_err("cancelled");
    assert_eq!((error.code.clone(), error.message.contains("conversation `a` ended")), (ErrorCode::Cancelled, true));
    // The execution goes on for b: what a asked for may yet happen, so a is not told that nothing did.
    assert_eq!(error.details.extra.get("effect_unknown"), Some(&serde_json::Value::Bool(true)), "{error:?}");
    assert!(error.message.contains("goes on for the other callers"), "{error}");
    assert_eq!(finished(&mut a_events), vec![Some(ErrorCode::Cancelled)], "a saw its call finish as it ended");
    assert_eq!(retry.try_outcome(), None, "b still waits for the execution");
    gate.open();
    assert!(app.run_until_resolved(&retry).is_ok(), "and gets its outcome");
    assert_eq!(executions.load(Ordering::SeqCst), 1, "its step ran, once");
    assert_eq!(finished(&mut a_events), vec![], "the execution's own finish is not a's any more");
    assert_eq!(code(&first.try_outcome().expect("still")), Some(ErrorCode::Cancelled), "a's caller still says so");
}

#[test]
fn h12_what_a_withdrawn_caller_reads_stays_what_it_read_first_whatever_ends_the_call_later() {
    let Parked { mut app, gate, a, b, first, .. } = a_shared_call_parked();
    let retry = b.request(shared("op"));
    a.end().expect("a ends");
    let read = |first: &bevy_agent_tools::Call| first.try_outcome().expect("stopped waiting").expect_err("cancelled");
    let before = read(&first);
    assert!(before.message.contains("conversation `a` ended") && before.message.contains("goes on"), "{before}");
    // Then b gives up too: the call ends, cancelled for b's reason.
    assert!(retry.cancel());
    assert_eq!(code(&app.run_until_resolved(&retry)), Some(ErrorCode::Cancelled));
    assert_eq!(read(&first), before, "a's caller reads what it read before, not b's cancel");
    gate.open();
}

#[test]
fn h12_a_conversation_whose_retry_joined_another_ones_execution_ends_and_the_first_caller_still_gets_it() {
    let Parked { mut app, gate, executions, b, first, .. } = a_shared_call_parked();
    let retry = b.request(shared("op"));
    assert!(retry.is_running());
    // A thread blocked on b's call wakes when b ends, without waiting for the execution.
    let waiter = std::thread::spawn(move || retry.wait_timeout(bevy_agent_tools::testing::HARNESS_LIMIT));
    b.end().expect("b ends");
    let outcome = waiter.join().expect("waiter").expect("woke when b ended");
    assert_eq!(code(&outcome), Some(ErrorCode::Cancelled));
    assert_eq!(first.try_outcome(), None, "a still waits for its call");
    gate.open();
    assert!(app.run_until_resolved(&first).is_ok());
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}

#[test]
fn h12_the_execution_is_cancelled_once_every_conversation_waiting_for_it_ended_or_cancelled_the_task() {
    let Parked { mut app, gate, executions, answered, a, b, first } = a_shared_call_parked();
    let retry = b.request(shared("op"));
    assert_eq!(b.cancel_task("shared"), 1, "b's caller stopped waiting");
    assert_eq!(code(&retry.try_outcome().expect("ended for b")), Some(ErrorCode::Cancelled));
    assert_eq!(first.try_outcome(), None, "the execution goes on for a");
    a.end().expect("a ends");
    assert_eq!(code(&first.try_outcome().expect("ended for a")), Some(ErrorCode::Cancelled));
    gate.open();
    app.run_until("the cancelled handler's step answered", |_| answered.arrived() == 1);
    assert_eq!(executions.load(Ordering::SeqCst), 0, "no one waited for it any more: cancelled, its step never ran");
    let again = app.agent().conversation("c").request(shared("op"));
    assert_eq!(code(&app.run_until_resolved(&again)), Some(ErrorCode::Cancelled), "retained as cancelled");
}

#[test]
fn h12_a_retry_that_joined_another_conversations_execution_is_a_call_in_flight_of_its_own_conversation() {
    let Parked { mut app, gate, b, first, .. } = a_shared_call_parked();
    let (_, mut b_events) = b.subscribe().expect("b is open");
    let request = first.request_id().expect("admitted");
    let retry = b.request(shared("op"));
    assert_eq!(b.status(), ConversationStatus::WaitingToolResult, "b waits for a tool result");
    let (snapshot, _) = b.subscribe().expect("b is open");
    assert_eq!(snapshot.active_calls.iter().map(|call| call.request).collect::<Vec<_>>(), vec![request]);
    let rejoined = b.rejoin(request).expect("b can observe it again, e.g. after a reconnect");
    drop(retry);
    gate.open();
    assert!(app.run_until_resolved(&rejoined).is_ok());
    assert_eq!(b.status(), ConversationStatus::Idle, "and is idle once it finished");
    let events = b_events.drain();
    let started = events.iter().filter(|event| matches!(event, ConversationEvent::CallStarted(_))).count();
    let finished: Vec<_> = events
        .iter()
        .filter_map(|event| match event {
            ConversationEvent::CallFinished(finished) => Some(finished.code.clone()),
            _ => None,
        })
        .collect();
    assert_eq!((started, finished), (1, vec![None]), "b saw its call start and succeed, once: {events:#?}");
    assert!(app.run_until_resolved(&first).is_ok());
}

#[test]
fn h12_a_conversation_whose_every_caller_cancelled_sees_the_call_finish_cancelled_while_it_goes_on_for_others() {
    let Parked { mut app, gate, executions, b, first, .. } = a_shared_call_parked();
    let (_, mut b_events) = b.subscribe().expect("b is open");
    let retry = b.request(shared("op"));
    assert_eq!(b.status(), ConversationStatus::WaitingToolResult);
    assert!(retry.cancel());
    assert_eq!(b.status(), ConversationStatus::Idle, "b no longer waits for it");
    assert_eq!(finished(&mut b_events), vec![Some(ErrorCode::Cancelled)], "b saw its call end as its caller did");
    gate.open();
    assert!(app.run_until_resolved(&first).is_ok(), "the execution went on for a");
    assert_eq!(executions.load(Ordering::SeqCst), 1);
    assert_eq!(finished(&mut b_events), vec![], "its finish is not b's any more");
}

/// Waits at the gate, then reports progress once.
fn reports_after(gate: bevy_agent_tools::testing::Gate) -> AgentTool<Session> {
    AgentTool::new("reports", "Reports progress once the gate opens.", move |ctx: CallContext<Session>, _: NoArgs| {
        let gate = gate.clone();
        async move {
            gate.pass().await;
            ctx.report_progress(1.0, Some(1.0), Some("done".into()));
            Ok(json!({}))
        }
    })
}

#[test]
fn h12_a_retry_that_joined_another_conversations_execution_gets_its_progress_too() {
    let gate = bevy_agent_tools::testing::Gate::new();
    let mut app = app_with(TestGame::default(), vec![reports_after(gate.clone())]);
    app.enter_world("alpha");
    let (a, b) = (app.agent().conversation("a"), app.agent().conversation("b"));
    let (_, mut b_events) = b.subscribe().expect("b is open");
    let keyed = || keyed("reports", json!({}), "op").task("shared");
    // Each caller's own sink, as an MCP client's progressToken is: the retry's client is told too.
    let sink = |seen: &Arc<AtomicUsize>| {
        let seen = seen.clone();
        bevy_agent_tools::ProgressSink::new(move |_| {
            seen.fetch_add(1, Ordering::SeqCst);
        })
    };
    let (to_a, to_b) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let first = a.request(keyed().progress(sink(&to_a)));
    app.run_until("parked", |_| gate.arrived() == 1);
    let retry = b.request(keyed().progress(sink(&to_b)));
    // A third caller that joins, then is dropped (it stops observing): its sink is told nothing more.
    let to_c = Arc::new(AtomicUsize::new(0));
    let third = app.agent().conversation("c").request(keyed().progress(sink(&to_c)));
    assert!(third.is_running() && third.request_id() == first.request_id(), "c joined the execution");
    drop(third);
    gate.open();
    assert!(app.run_until_resolved(&retry).is_ok());
    assert!(app.run_until_resolved(&first).is_ok());
    let progress: Vec<_> = b_events
        .drain()
        .into_iter()
        .filter_map(|event| match event {
            ConversationEvent::CallProgress(progress) => Some((progress.conversation.to_string(), progress.progress)),
            _ => None,
        })
        .collect();
    assert_eq!(progress, vec![("b".to_string(), 1.0)], "b's view of the call it waits for");
    assert_eq!((to_a.load(Ordering::SeqCst), to_b.load(Ordering::SeqCst)), (1, 1), "each caller's sink got it");
    assert_eq!(to_c.load(Ordering::SeqCst), 0, "not the caller that left");
}

#[test]
fn h12_a_conversation_whose_retry_already_left_an_execution_it_does_not_own_ends_without_cancelling_it() {
    let (mut app, gate, executions) = gated_app("slow", ToolScope::World);
    let (a, b) = (app.agent().conversation("a"), app.agent().conversation("b"));
    // a's client went away: its keyed call runs on for a retry.
    drop(a.request(shared("op")));
    app.run_until("parked", |_| gate.arrived() == 1);
    // b retried, then stopped waiting too.
    drop(b.request(shared("op")));
    b.end().expect("b ends");
    let retry = a.request(shared("op"));
    assert!(retry.is_running(), "the execution still runs: b's end did not cancel a's call");
    gate.open();
    assert!(app.run_until_resolved(&retry).is_ok());
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}

#[test]
fn h12_a_caller_that_cancelled_keeps_its_reason_when_its_conversation_ends_later() {
    let Parked { mut app, gate, a, b, first, .. } = a_shared_call_parked();
    let retry = a.request(shared("op"));
    let other = b.request(shared("op"));
    assert!(retry.cancel(), "the retry stops waiting");
    let read = retry.try_outcome().expect("cancelled").expect_err("cancelled").message;
    a.end().expect("a ends");
    let again = retry.try_outcome().expect("cancelled").expect_err("cancelled").message;
    assert_eq!(again, read, "what a caller read stays what it reads");
    assert!(first.try_outcome().is_some_and(|outcome| outcome.is_err()), "a's first caller stopped with a's end");
    gate.open();
    assert!(app.run_until_resolved(&other).is_ok(), "b still gets the execution's outcome");
}

#[test]
fn h12_ending_a_conversation_after_its_call_finished_leaves_the_callers_outcome_as_it_was() {
    let Parked { mut app, gate, a, b, first, .. } = a_shared_call_parked();
    let retry = b.request(shared("op"));
    gate.open();
    assert!(app.run_until_resolved(&first).is_ok());
    a.end().expect("a ends");
    b.end().expect("b ends");
    assert!(first.try_outcome().expect("finished").is_ok(), "a's caller still reads the success");
    assert!(retry.try_outcome().expect("finished").is_ok(), "so does b's");
}

#[derive(Deserialize, JsonSchema)]
struct Smash {
    #[serde(flatten)]
    guard: DestructiveGuard,
}

#[derive(Serialize, JsonSchema)]
struct Smashed {
    version: u64,
}

fn smash_tool(name: &str, confirm_at_host: bool) -> AgentTool<Session> {
    let tool = AgentTool::new(name, "Destroys the counter.", |ctx: CallContext<Session>, args: Smash| async move {
        args.guard.confirmed()?;
        let version = ctx
            .on_client(move |_, session| {
                args.guard.check_version("the counter", session.counter)?;
                session.counter += 1;
                Ok::<_, ToolError>(session.counter)
            })
            .await??;
        Ok(Smashed { version })
    })
    .destructive(true);
    if confirm_at_host {
        tool.requires_confirmation()
    } else {
        tool
    }
}

#[test]
fn destructive_missing_confirmation_and_stale_version_are_rejected_with_nothing_changed() {
    let mut app = app_with(TestGame::default(), vec![smash_tool("smash", false), smash_tool("smash_checked", true)]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    for tool in ["smash", "smash_checked"] {
        let error = app.run_until_resolved(&conversation.call(tool, json!({}))).expect_err("unconfirmed");
        assert_eq!(error.code, ErrorCode::ConfirmationRequired, "{tool}");
    }
    let stale = app.run_until_resolved(&conversation.call("smash", json!({"confirm": true, "expected_version": 7})));
    let error = stale.expect_err("stale");
    assert_eq!(error.code, ErrorCode::VersionConflict);
    assert_eq!(error.details.extra["current_version"], 0);
    let check = app.run_until_resolved(&conversation.call("bump", json!({"by": 0}))).expect("ok");
    assert_eq!(check.value["counter"], 0, "nothing changed");

    let done = app.run_until_resolved(&conversation.call("smash", json!({"confirm": true, "expected_version": 0})));
    assert_eq!(done.expect("current version").value["version"], 1);
}

#[test]
fn reserved_arguments_are_in_schemas_of_mutating_tools_and_taken_off_the_wire() {
    let app = app_with(TestGame::default(), vec![smash_tool("smash", true)]);
    let tools = app.agent().tools();
    let bump = tools.iter().find(|t| t.name == "bump").expect("bump");
    let schema = bump.client_input_schema();
    let help =
        |schema: &serde_json::Value| schema["properties"][OPERATION_ID]["description"].as_str().map(str::to_owned);
    assert!(help(&schema).is_some_and(|d| d.contains("retry") && !d.contains("player travelled")), "{schema}");
    assert!(schema["properties"][TASK_ID].is_object());
    // A location-scoped tool's retries are per location (H12's scope): the model is told.
    let here = tools.iter().find(|t| t.name == "bump_here").expect("bump_here").client_input_schema();
    assert!(help(&here).is_some_and(|d| d.contains("a retry after the player travelled")), "{here}");
    let smash = tools.iter().find(|t| t.name == "smash").expect("smash");
    assert!(smash.client_input_schema()["properties"]["confirm"].is_object());

    let request = CallRequest::from_wire("bump", json!({"by": 1, "operation_id": "op-9", "task_id": "t"})).expect("ok");
    assert_eq!(request.operation.as_ref().map(|o| o.as_str()), Some("op-9"));
    assert_eq!(request.task.as_ref().map(|t| t.as_str()), Some("t"));
    assert_eq!(request.arguments, json!({"by": 1}));
    let bad = CallRequest::from_wire("bump", json!({"operation_id": 5})).expect_err("not a string");
    assert_eq!(bad.code, ErrorCode::InvalidInput);

    // What is published is what is taken: ids of 1 to 256 characters, for both.
    for field in [OPERATION_ID, TASK_ID] {
        let published = jsonschema::validator_for(&schema["properties"][field]).expect("a schema");
        for (id, taken) in [(String::new(), false), ("x".repeat(256), true), ("x".repeat(257), false)] {
            let read = CallRequest::from_wire("bump", json!({ field: id })).is_ok();
            assert_eq!((published.is_valid(&json!(id)), read), (taken, taken), "{field} of {} characters", id.len());
        }
    }
}

#[derive(Deserialize, JsonSchema)]
struct Route {
    path: Vec<Vec<i64>>,
}

/// The canonical form that keys replays keeps every array element apart: `[1, 2]` and `[12]`, `[[1], [2]]` and
/// `[[1, 2]]`, and a reordered array are different arguments.
#[test]
fn h12_same_operation_id_with_arguments_differing_only_inside_an_array_is_operation_conflict() {
    let executions = Arc::new(AtomicUsize::new(0));
    let counted = executions.clone();
    let walk = AgentTool::new("walk", "Walks a path.", move |_: CallContext<Session>, route: Route| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move { Ok(json!({ "steps": route.path.len() })) }
    });
    let mut app = app_with(TestGame::default(), vec![walk]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("a");
    let first = conversation.request(keyed("walk", json!({ "path": [[1, 2], [3]] }), "op"));
    assert!(app.run_until_resolved(&first).is_ok());
    for other in
        [json!([[12], [3]]), json!([[1], [2], [3]]), json!([[1, 2, 3]]), json!([[2, 1], [3]]), json!([[3], [1, 2]])]
    {
        let call = conversation.request(keyed("walk", json!({ "path": other.clone() }), "op"));
        assert_eq!(code(&app.run_until_resolved(&call)), Some(ErrorCode::OperationConflict), "{other}");
    }
    let again = conversation.request(keyed("walk", json!({ "path": [[1.0, 2], [3]] }), "op"));
    assert!(app.run_until_resolved(&again).is_ok(), "the same arguments replay");
    assert_eq!(executions.load(Ordering::SeqCst), 1, "conflicts ran nothing");
}
