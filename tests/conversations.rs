//! Conversations (DESIGN §6): the status machine, de-duplicated events in sequence, end and resume, the reconnect
//! snapshot, calls waiting for their tool, and what the game sees as Bevy messages.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app, AgentTestAppExt, Gate};
use bevy_agent_tools::{
    Call, CallFinished, CallProgress, CallRequest, CallStarted, Completer, ConversationEvent, ConversationStatus as S,
    ConversationStatusChanged, NoArgs, Reported, StatusSource, Subscription, VisitClosed, VisitClosing, VisitOpened,
    VisitRelocated, VisitSaved,
};
use common::*;
use serde_json::json;

/// The status changes in `events`, as (previous, status, source).
fn statuses(events: &[ConversationEvent]) -> Vec<(S, S, StatusSource)> {
    events.iter().filter_map(ConversationEvent::as_status).map(|e| (e.previous, e.status, e.source)).collect()
}

fn drain(events: &mut Subscription) -> Vec<ConversationEvent> {
    let drained = events.drain();
    let sequences: Vec<u64> = drained.iter().map(ConversationEvent::sequence).collect();
    assert!(sequences.windows(2).all(|pair| pair[1] == pair[0] + 1), "sequence numbers without gaps: {sequences:?}");
    drained
}

fn gated_app(gate: &Gate) -> App {
    app_with(TestGame::default(), vec![bump_tool("slow_bump", ToolScope::World, Arc::default(), Some(gate.clone()))])
}

#[test]
fn an_observer_of_a_call_never_stops_its_owner_from_cancelling_or_dropping_it() {
    let gate = Gate::new();
    let mut app = gated_app(&gate);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    for drop_it in [false, true] {
        let call = conversation.call("slow_bump", json!({}));
        let request = call.request_id().expect("admitted");
        let observer = conversation.rejoin(request).expect("in flight");
        let (_, mut events) = conversation.subscribe().expect("known");
        if drop_it {
            drop(call);
        } else {
            assert!(call.cancel());
        }
        assert_eq!(
            app.run_until_resolved(&observer).map_err(|e| e.code),
            Err(ErrorCode::Cancelled),
            "the owner's {} ended the call for everyone",
            if drop_it { "drop" } else { "cancel" }
        );
        let finished = drain(&mut events).into_iter().any(|e| matches!(e, ConversationEvent::CallFinished(_)));
        assert!(finished, "it finished, not only for its owner");
    }
}

#[test]
fn a_turn_without_tools_goes_idle_running_idle() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    let (snapshot, mut events) = conversation.subscribe().expect("known");
    assert_eq!(snapshot.status, S::Idle, "a new conversation starts idle, without an event");
    assert_eq!(snapshot.sequence, 0);

    assert_eq!(conversation.turn_started(), Reported::Changed);
    assert_eq!(conversation.status(), S::Running);
    assert_eq!(conversation.turn_ended(), Reported::Changed);

    let events = drain(&mut events);
    assert_eq!(
        statuses(&events),
        [(S::Idle, S::Running, StatusSource::Agent), (S::Running, S::Idle, StatusSource::Agent)]
    );
    assert_eq!(events[0].sequence(), 1);
}

#[test]
fn a_turn_with_a_tool_goes_idle_running_waiting_running_idle() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    let (_, mut events) = conversation.subscribe().expect("known");

    conversation.turn_started();
    let call = conversation.call("bump", json!({}));
    assert_eq!(conversation.status(), S::WaitingToolResult, "the host sets it as soon as the call is admitted");
    app.run_until_resolved(&call).expect("bump succeeds");
    assert_eq!(conversation.status(), S::Running, "the status returned before the agent saw the result");
    conversation.turn_ended();

    assert_eq!(
        statuses(&drain(&mut events)),
        [
            (S::Idle, S::Running, StatusSource::Agent),
            (S::Running, S::WaitingToolResult, StatusSource::Host),
            (S::WaitingToolResult, S::Running, StatusSource::Host),
            (S::Running, S::Idle, StatusSource::Agent),
        ]
    );
}

#[test]
fn host_and_agent_reporting_the_same_status_publish_it_once() {
    let gate = Gate::new();
    let mut app = gated_app(&gate);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    let (_, mut events) = conversation.subscribe().expect("known");

    assert_eq!(conversation.turn_started(), Reported::Changed);
    assert_eq!(conversation.turn_started(), Reported::Unchanged, "running twice is one event");
    let call = conversation.call("slow_bump", json!({}));
    app.run_until("the handler is at the gate", |_| gate.arrived() == 1);
    assert_eq!(conversation.report(S::WaitingToolResult, 10), Reported::Unchanged, "the host already said so");
    gate.open();
    app.run_until_resolved(&call).expect("succeeds");
    assert_eq!(conversation.status(), S::WaitingToolResult, "the agent still says it waits");
    assert_eq!(conversation.report(S::Running, 11), Reported::Changed);
    assert_eq!(conversation.report(S::Running, 12), Reported::Unchanged);

    assert_eq!(
        statuses(&drain(&mut events)),
        [
            (S::Idle, S::Running, StatusSource::Agent),
            (S::Running, S::WaitingToolResult, StatusSource::Host),
            (S::WaitingToolResult, S::Running, StatusSource::Agent),
        ]
    );
}

#[test]
fn out_of_order_and_duplicate_sequence_numbers_are_ignored() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    let (_, mut events) = conversation.subscribe().expect("known");

    assert_eq!(conversation.report(S::Running, 2), Reported::Changed);
    assert_eq!(conversation.report(S::Idle, 2), Reported::Stale, "a duplicate sequence is ignored");
    assert_eq!(conversation.report(S::Idle, 1), Reported::Stale, "an older sequence is ignored");
    assert_eq!(conversation.status(), S::Running, "neither changed the status");
    assert_eq!(conversation.report(S::Error, 5), Reported::Changed);
    assert_eq!(conversation.report(S::Idle, 4), Reported::Stale, "late recovery from before the error");
    assert_eq!(conversation.report(S::Idle, 6), Reported::Changed);

    assert_eq!(
        statuses(&drain(&mut events)),
        [
            (S::Idle, S::Running, StatusSource::Agent),
            (S::Running, S::Error, StatusSource::Agent),
            (S::Error, S::Idle, StatusSource::Agent),
        ]
    );
}

#[test]
fn a_conversation_the_host_forgot_goes_on_numbering_its_events_after_its_last_when_it_comes_back() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let agent = app.agent();
    let conversation = agent.conversation("comes-back");
    let (_, mut events) = conversation.subscribe().expect("known");
    for (n, status) in [S::Running, S::Idle, S::Running].into_iter().enumerate() {
        conversation.report(status, n as u64 + 1);
    }
    conversation.end().expect("ended");
    let last = drain(&mut events).last().map(ConversationEvent::sequence).expect("its events");
    // Nobody subscribes to it any more (a subscription would keep it), and enough others end after it that the
    // host no longer keeps it (it keeps 1,024, and looks for older ones every 64 ends: 1,100 is past both).
    drop(events);
    for n in 0..1_100 {
        agent.conversation(format!("other-{n}")).end().expect("ended");
    }
    assert!(agent.resume("comes-back").is_err(), "forgotten");

    let mut all = agent.subscribe();
    let back = agent.conversation("comes-back");
    // As one never forgotten: it comes back ended and reopens (a HUD that saw it end sees it reopen), and its
    // agent's reports go on after its last too.
    assert_eq!(back.report(S::Running, 1), Reported::Stale, "a report from before it was forgotten");
    assert_eq!(back.report(S::Running, 4), Reported::Changed);
    let seen = all.drain();
    let sequences: Vec<u64> = seen.iter().map(ConversationEvent::sequence).collect();
    assert!(!sequences.is_empty() && sequences.iter().all(|sequence| *sequence > last), "{sequences:?} after {last}");
    assert_eq!(
        statuses(&seen),
        [(S::Ended, S::Idle, StatusSource::Host), (S::Idle, S::Running, StatusSource::Agent)],
        "reopened from ended, as it was last seen"
    );
}

#[test]
fn after_the_last_sequence_number_every_report_is_stale_and_nothing_panics() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    assert_eq!(conversation.report(S::Running, u64::MAX), Reported::Changed);
    // The next number after `u64::MAX` does not exist: a report without one cannot be newer.
    assert_eq!(conversation.turn_ended(), Reported::Stale);
    assert_eq!(conversation.report(S::Idle, u64::MAX), Reported::Stale);
    assert_eq!(conversation.status(), S::Running);
}

#[test]
fn ended_is_published_once_per_transition_and_ending_twice_succeeds() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    let (_, mut events) = conversation.subscribe().expect("known");

    assert_eq!(conversation.end(), Ok(()));
    assert_eq!(conversation.end(), Ok(()), "ending an ended conversation succeeds");
    assert_eq!(conversation.report(S::Ended, 1), Reported::Unchanged, "the agent's duplicate end is no event");
    assert_eq!(conversation.turn_started(), Reported::Refused, "only a resume leaves ended");
    assert_eq!(statuses(&drain(&mut events)), [(S::Idle, S::Ended, StatusSource::Host)]);

    conversation.resume().expect("known");
    assert_eq!(conversation.status(), S::Idle);
    conversation.end().expect("ends again");
    assert_eq!(
        statuses(&drain(&mut events)),
        [(S::Ended, S::Idle, StatusSource::Host), (S::Idle, S::Ended, StatusSource::Host)],
        "a new transition into ended is published once more"
    );
}

#[test]
fn ending_a_conversation_cancels_its_calls_and_never_touches_the_visit() {
    let gate = Gate::new();
    let game = TestGame::default();
    let record = game.record.clone();
    let ended_seen = Arc::new(AtomicUsize::new(0));
    let seen = ended_seen.clone();
    // Open: it only counts the handler in (a call that ends before its handler starts never runs it).
    let watching_started = Gate::new();
    watching_started.open();
    let started = watching_started.clone();
    let watcher = AgentTool::new("watch", "Waits until the call ends.", move |ctx: CallContext<Session>, _: NoArgs| {
        let (seen, started) = (seen.clone(), started.clone());
        async move {
            started.pass().await;
            ctx.ended().await;
            seen.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    });
    let mut app =
        app_with(game, vec![watcher, bump_tool("slow_bump", ToolScope::World, Arc::default(), Some(gate.clone()))]);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    let watching = conversation.call("watch", json!({}));
    let gated = conversation.call("slow_bump", json!({}));
    app.run_until("both handlers started", |_| gate.arrived() == 1 && watching_started.arrived() == 1);

    conversation.end().expect("ends");
    for call in [&watching, &gated] {
        assert_eq!(code(&call.try_outcome().expect("ended at once")), Some(ErrorCode::Cancelled));
    }
    app.run_until("the handler saw ended()", |_| ended_seen.load(Ordering::SeqCst) == 1);
    let refused = conversation.call("bump", json!({})).try_outcome().expect("rejected at once").expect_err("ended");
    assert_eq!(refused.details.extra["conversation_ended"], json!(true));
    assert_eq!(refused.details.tool.as_deref(), Some("bump"), "it names the tool, as every refusal does");

    gate.open();
    app.step(3);
    assert_eq!(record.closes.load(Ordering::SeqCst), 0, "the visit was not closed");
    assert_eq!(record.opens.load(Ordering::SeqCst), 1);
    let other = app.agent().conversation("other").call("bump", json!({}));
    assert!(app.run_until_resolved(&other).is_ok(), "the visit still serves other conversations");
}

#[test]
fn resuming_an_empty_or_unknown_id_fails_with_a_clear_code() {
    let app = app_with(TestGame::default(), vec![]);
    let agent = app.agent();
    assert_eq!(agent.resume("").err().map(|e| e.code), Some(ErrorCode::InvalidInput));
    assert_eq!(agent.resume("nobody").err().map(|e| e.code), Some(ErrorCode::ConversationNotFound));
    assert_eq!(agent.conversation_status(&"nobody".into()), None, "resuming creates nothing");
}

#[test]
fn ending_an_unknown_conversation_is_conversation_not_found_and_creates_nothing() {
    let app = app_with(TestGame::default(), vec![]);
    let agent = app.agent();
    let error = agent.end_conversation(&"nobody".into()).expect_err("nothing to end");
    assert_eq!(error.code, ErrorCode::ConversationNotFound, "{}", error.message);
    assert_eq!(agent.conversation_status(&"nobody".into()), None);
    agent.conversation("known").end().expect("a known one ends");
    agent.end_conversation(&"known".into()).expect("ending an ended one succeeds");
}

#[test]
fn reconnect_with_a_call_in_flight_gets_the_snapshot_first_then_the_outcome() {
    let gate = Gate::new();
    let mut app = gated_app(&gate);
    app.enter_world("alpha");
    app.travel("nether");
    let agent = app.agent();
    {
        let first = agent.conversation("claude");
        first.turn_started();
        first.call("slow_bump", json!({})).detach();
    }
    app.run_until("the handler is at the gate", |_| gate.arrived() == 1);

    let mut resumed = agent.resume("claude").expect("known");
    let snapshot = resumed.snapshot.clone();
    assert_eq!(snapshot.status, S::WaitingToolResult);
    let active = snapshot.active_call().expect("the call in flight is in the snapshot");
    assert_eq!(active.tool, "slow_bump");
    assert!(snapshot.pending_call().is_none());
    let visit = snapshot.visit.clone().expect("a visit is open");
    assert_eq!((visit.world.as_str(), visit.location.revision.0), ("alpha", 1));
    assert!(resumed.events.try_next().is_none(), "nothing before the snapshot is delivered again");

    let rejoined = resumed.conversation.rejoin(active.request).expect("still in flight");
    gate.open();
    let output = app.run_until_resolved(&rejoined).expect("the outcome reaches the reattached conversation");
    assert_eq!(output.value["counter"], 1);

    let events = drain(&mut resumed.events);
    assert_eq!(events[0].sequence(), snapshot.sequence + 1, "live events continue right after the snapshot");
    match &events[0] {
        ConversationEvent::CallFinished(finished) => {
            assert_eq!((finished.request, finished.code.clone()), (active.request, None));
        }
        other => panic!("expected the call to finish first, got {other:?}"),
    }
    assert_eq!(statuses(&events), [(S::WaitingToolResult, S::Running, StatusSource::Host)]);
}

/// World `alpha` loading (its completer in the slot), and a call of conversation `agent` for `world_tool`, a tool
/// not registered yet.
fn calling_world_tool_while_alpha_loads() -> (App, Arc<parking_lot::Mutex<Option<Completer>>>, Call) {
    let game = TestGame { load_async: true, ..Default::default() };
    let loading = game.loading.clone();
    let mut app = late_tool_app(game, None);
    app.enter_world("alpha");
    let call = app.agent().conversation("agent").call("world_tool", json!({}));
    (app, loading, call)
}

/// Runs frames until the call of each of `conversations` waits for its tool.
fn waits_for_its_tool(app: &mut App, conversations: &[&str]) {
    app.run_until("the calls wait for their tools", |app| {
        conversations.iter().all(|conversation| {
            app.agent().resume(*conversation).is_ok_and(|resumed| resumed.snapshot.pending_call().is_some())
        })
    });
}

#[test]
fn an_ended_conversation_someone_subscribes_to_is_not_forgotten_with_the_oldest_ended_ones() {
    let app = headless_app(AgentToolsPlugin::new(TestGame::default()));
    let agent = app.agent();
    let watched = agent.conversation("watched");
    let (_, mut events) = watched.subscribe().expect("subscribed");
    watched.end().expect("ended");
    // More ended conversations than the host keeps (1,024, looked for every 64 ends): the oldest are forgotten.
    for n in 0..1100 {
        agent.conversation(format!("passing-{n}")).end().expect("ended");
    }
    assert_eq!(agent.conversation_status(&"passing-0".into()), None, "the oldest ended one was forgotten");
    events.drain();
    // It comes back: its subscriber hears of it (forgotten, the subscription would have ended with nothing).
    agent.conversation("watched");
    let statuses: Vec<_> = events.drain().iter().filter_map(|event| event.as_status().map(|s| s.status)).collect();
    assert_eq!(statuses, [S::Idle], "Ended → Idle, seen by its subscriber");
}

fn late_tool_app(game: TestGame, wait: Option<Duration>) -> App {
    let mut plugin = AgentToolsPlugin::new(game);
    if let Some(wait) = wait {
        plugin = plugin.tool_wait(wait);
    }
    headless_app(plugin)
}

#[test]
fn h5_a_call_for_a_tool_not_yet_registered_made_while_close_runs_is_refused_world_closed() {
    // `TestGame::close` calls `bump`, which this game never registers: the call would wait for its tool under a
    // visit that is going away.
    let game = TestGame::default();
    let record = game.record.clone();
    let mut app = late_tool_app(game, Some(Duration::MAX));
    app.enter_world("alpha");
    app.exit_world();
    assert_eq!(*record.call_during_close.lock(), vec![Some(ErrorCode::WorldClosed)], "refused, not left waiting");
}

#[test]
fn a_call_for_a_tool_registered_later_completes_once_it_appears() {
    // As long as the clock allows: `Duration::MAX` is no limit, not a panic.
    let mut app = late_tool_app(TestGame::default(), Some(Duration::MAX));
    app.enter_world("alpha");
    let agent = app.agent();
    let conversation = agent.conversation("agent");
    let call = conversation.call("late_bump", json!({"by": 3}));
    waits_for_its_tool(&mut app, &["agent"]);
    assert_eq!(conversation.status(), S::WaitingToolResult);
    assert!(call.try_outcome().is_none(), "not dropped, not rejected: waiting");

    agent.register_tool(bump_tool("late_bump", ToolScope::World, Arc::default(), None)).expect("same session type");
    let output = app.run_until_resolved(&call).expect("runs once the tool is registered");
    assert_eq!(output.value["counter"], 3);
    assert_eq!(conversation.status(), S::Idle);
}

#[test]
fn cancel_task_ends_that_tasks_call_waiting_for_its_tool_saying_why_and_not_another_tasks() {
    let mut app = late_tool_app(TestGame::default(), Some(Duration::MAX));
    app.enter_world("alpha");
    let agent = app.agent();
    let conversation = agent.conversation("agent");
    let build = conversation.request(CallRequest::new("late_bump", json!({})).task("build"));
    let own = conversation.call("late_bump", json!({}));
    app.run_until("both calls wait for their tool", |app| {
        app.agent().resume("agent").is_ok_and(|resumed| resumed.snapshot.pending_calls.len() == 2)
    });

    assert_eq!(conversation.cancel_task("build"), 1, "the waiting call of the task counts as ended");
    // At once: not when its tool comes, nor at its wait's end (none here); saying who cancelled what (a player's
    // cancel of an in-game agent's turn says so the same way).
    let error = app.run_until_resolved(&build).expect_err("cancelled while it waited");
    assert_eq!(error.code, ErrorCode::Cancelled, "{}", error.message);
    assert_eq!(error.message, "the agent cancelled the task while the call waited for its tool");
    assert!(own.try_outcome().is_none(), "the conversation's own task still waits");

    let executions = Arc::new(AtomicUsize::new(0));
    agent.register_tool(bump_tool("late_bump", ToolScope::World, executions.clone(), None)).expect("registers");
    assert_eq!(app.run_until_resolved(&own).expect("runs once the tool comes").value["counter"], 1);
    app.step(3);
    assert_eq!(executions.load(Ordering::SeqCst), 1, "the cancelled call never ran");
}

#[test]
fn cancel_task_ends_that_tasks_running_call_and_not_the_conversations_other_task() {
    let gate = Gate::new();
    let mut app = gated_app(&gate);
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    let build = conversation.request(CallRequest::new("slow_bump", json!({})).task("build"));
    let own = conversation.call("slow_bump", json!({}));
    app.run_until("both handlers wait at the gate", |_| gate.arrived() == 2);

    assert_eq!(conversation.cancel_task("build"), 1, "one call of the task was live");
    gate.open();
    let error = app.run_until_resolved(&build).expect_err("cancelled");
    assert_eq!(error.code, ErrorCode::Cancelled, "{}", error.message);
    assert_eq!(app.run_until_resolved(&own).expect("another task's call goes on").value["counter"], 1);
}

#[test]
fn cancel_task_counts_the_call_waiting_for_its_tool_when_no_world_is_open() {
    // With no visit open there are no admitted calls to end; the waiting one still ends, and is counted.
    let mut app = late_tool_app(TestGame::default(), Some(Duration::MAX));
    let conversation = app.agent().conversation("agent");
    let build = conversation.request(CallRequest::new("late_bump", json!({})).task("build"));
    waits_for_its_tool(&mut app, &["agent"]);

    assert_eq!(conversation.cancel_task("build"), 1, "the waiting call of the task counts as ended");
    let error = app.run_until_resolved(&build).expect_err("cancelled while it waited");
    assert_eq!(error.code, ErrorCode::Cancelled, "{}", error.message);
}

#[test]
fn a_call_made_with_no_world_open_whose_tool_comes_first_runs_in_the_visit_that_opens_then() {
    // A game that registers its tools before it enters the world (in `open`, or in an `OnEnter` system, which runs
    // before the host's transitions in the frame).
    let mut app = late_tool_app(TestGame::default(), Some(Duration::MAX));
    let agent = app.agent();
    let conversation = agent.conversation("agent");
    let call = conversation.call("late_bump", json!({"by": 2}));
    waits_for_its_tool(&mut app, &["agent"]);
    agent.register_tool(bump_tool("late_bump", ToolScope::World, Arc::default(), None)).expect("registers");
    // (Nothing tells when the waiting task has seen its tool: the next test shows that the tool alone does not end
    // the wait, where the wait's end says so.)
    app.step(3);
    app.enter_world("alpha");
    let output = app.run_until_resolved(&call).expect("runs in the visit that opened");
    assert_eq!(output.value["counter"], 2);
    assert_eq!(output.observed.world.as_str(), "alpha");
}

#[test]
fn a_call_made_with_no_world_open_whose_tool_came_but_no_world_gets_no_world_at_its_wait() {
    let mut app = late_tool_app(TestGame::default(), Some(Duration::from_millis(300)));
    let agent = app.agent();
    let call = agent.conversation("agent").call("late_bump", json!({}));
    waits_for_its_tool(&mut app, &["agent"]);
    agent.register_tool(bump_tool("late_bump", ToolScope::World, Arc::default(), None)).expect("registers");
    let error = app.run_until_resolved(&call).expect_err("no world came");
    assert_eq!(error.code, ErrorCode::NoWorld, "{}", error.message);
    assert!(error.message.contains("waited 300ms for one"), "not at once when its tool came: {}", error.message);
    assert_eq!(error.details.tool.as_deref(), Some("late_bump"), "it names its tool");
}

#[test]
fn calls_waiting_for_their_tool_are_held_to_the_in_flight_limit_and_one_more_gets_busy() {
    let plugin = AgentToolsPlugin::new(TestGame::default()).tool_wait(Duration::MAX).max_in_flight_per_conversation(2);
    let mut app = headless_app(plugin);
    app.enter_world("alpha");
    let agent = app.agent();
    let conversation = agent.conversation("agent");
    let waiting = [conversation.call("late_bump", json!({})), conversation.call("late_bump", json!({}))];
    app.run_until("both calls wait for their tool", |app| {
        app.agent().resume("agent").is_ok_and(|resumed| resumed.snapshot.pending_calls.len() == 2)
    });

    let third = conversation.call("late_bump", json!({}));
    let error = app.run_until_resolved(&third).expect_err("over the limit");
    assert_eq!(error.code, ErrorCode::Busy, "{}", error.message);
    assert_eq!(error.details.tool.as_deref(), Some("late_bump"));

    let executions = Arc::new(AtomicUsize::new(0));
    agent.register_tool(bump_tool("late_bump", ToolScope::World, executions.clone(), None)).expect("registers");
    for call in &waiting {
        app.run_until_resolved(call).expect("runs once its tool comes");
    }
    assert_eq!(executions.load(Ordering::SeqCst), 2, "the two that waited ran; the refused one never did");
}

#[test]
fn while_the_world_loads_a_call_waits_for_the_tool_the_world_registers() {
    let (mut app, loading, call) = calling_world_tool_while_alpha_loads();
    let agent = app.agent();
    app.step(2);
    assert!(call.try_outcome().is_none(), "waiting while the world loads");

    agent.register_tool(bump_tool("world_tool", ToolScope::World, Arc::default(), None)).expect("registers");
    if let Some(completer) = loading.lock().take() {
        completer.succeed();
    }
    assert_eq!(app.run_until_resolved(&call).expect("runs").value["counter"], 1);
}

#[test]
fn h5_a_call_waiting_for_its_tool_ends_with_its_visit_and_never_runs_in_the_next_one() {
    // Alpha is still loading when the player leaves it for beta, whose load registers the tool.
    let (mut app, loading, call) = calling_world_tool_while_alpha_loads();
    let agent = app.agent();
    waits_for_its_tool(&mut app, &["agent"]);
    // Alpha's load is still under way when the player leaves (dropped, its completer would fail the load, which
    // a call waiting for the load reads as such: kept until the visit is over).
    let alphas_load = loading.lock().take();
    app.exit_world();
    // It ends with the visit it was made in, in the exit's frame (not at its deadline, 30 s on).
    let error = call.try_outcome().expect("ended by the exit").expect_err("its visit ended");
    assert_eq!(error.code, ErrorCode::VisitEnded, "{}", error.message);
    assert_eq!(error.details.world.as_ref().map(|world| world.as_str()), Some("alpha"));
    drop(alphas_load);

    app.enter_world("beta");
    let executions = Arc::new(AtomicUsize::new(0));
    agent.register_tool(bump_tool("world_tool", ToolScope::World, executions.clone(), None)).expect("registers");
    if let Some(completer) = loading.lock().take() {
        completer.succeed();
    }
    // A call of beta's own, made after the tool came: had the old call been let in with it, its step would have
    // been queued first, and this one's counter would not be the session's first.
    let fresh = agent.conversation("agent").call("world_tool", json!({}));
    assert_eq!(app.run_until_resolved(&fresh).expect("runs in beta").value["counter"], 1);
    app.step(5);
    assert_eq!(executions.load(Ordering::SeqCst), 1, "nothing of the old call ran in beta");
}

#[test]
fn h5_a_call_waiting_for_its_tool_at_app_exit_ends_with_visit_ended_in_the_exits_frame() {
    let mut app = late_tool_app(TestGame::default(), Some(Duration::MAX));
    app.enter_world("alpha");
    let call = app.agent().conversation("agent").call("never_registered", json!({}));
    waits_for_its_tool(&mut app, &["agent"]);
    app.world_mut().write_message(AppExit::Success);
    app.update();
    // No frame follows an exit: it ends there, as the visit's running calls do (its client hears why before the
    // transport stops), not when the runtime stops under it (`INTERNAL`).
    let error = call.try_outcome().expect("ended by the exit").expect_err("its visit ended");
    assert_eq!(error.code, ErrorCode::VisitEnded, "{}", error.message);
}

#[test]
fn h2_a_location_tool_call_waiting_for_its_tool_is_refused_if_the_player_relocated_meanwhile() {
    let mut app = late_tool_app(TestGame::default(), Some(Duration::MAX));
    app.enter_world("alpha");
    let agent = app.agent();
    let here = agent.conversation("agent").call("late_here", json!({}));
    let anywhere = agent.conversation("other").call("late_anywhere", json!({}));
    waits_for_its_tool(&mut app, &["agent", "other"]);
    app.travel("nether");
    app.step(2);
    let executions = Arc::new(AtomicUsize::new(0));
    agent.register_tool(bump_tool("late_here", ToolScope::Location, executions.clone(), None)).expect("registers");
    agent.register_tool(bump_tool("late_anywhere", ToolScope::World, Arc::default(), None)).expect("registers");
    let error = app.run_until_resolved(&here).expect_err("made for the location before the travel");
    assert_eq!(error.code, ErrorCode::LocationChanged, "{}", error.message);
    assert_eq!(executions.load(Ordering::SeqCst), 0, "it never ran");
    // A world-scoped one made in the same visit runs: the visit is the one it was made in.
    assert_eq!(app.run_until_resolved(&anywhere).expect("runs").value["counter"], 1);
}

#[test]
fn the_wait_for_a_tool_counts_toward_the_calls_timeout() {
    let mut app = late_tool_app(TestGame::default(), Some(Duration::MAX));
    app.enter_world("alpha");
    let agent = app.agent();
    let timeout = Duration::from_secs(30);
    let call = agent.conversation("agent").request(CallRequest::new("late_clock", json!({})).timeout(timeout));
    waits_for_its_tool(&mut app, &["agent"]);
    let deadline: Arc<parking_lot::Mutex<Option<std::time::Instant>>> = Arc::default();
    let seen = deadline.clone();
    let clock = AgentTool::new("late_clock", "Says its deadline.", move |ctx: CallContext<Session>, _: NoArgs| {
        *seen.lock() = Some(ctx.deadline());
        async move { Ok(()) }
    });
    let registered = std::time::Instant::now();
    agent.register_tool(clock).expect("registers");
    app.run_until_resolved(&call).expect("runs once the tool is registered");
    let deadline = deadline.lock().expect("the handler ran");
    assert!(deadline < registered + timeout, "the deadline counts from the call's arrival, not from the tool's");
}

#[test]
fn a_call_that_waited_for_its_tool_past_the_tools_timeout_is_refused_and_nothing_of_it_runs_or_is_retained() {
    let mut app = late_tool_app(TestGame::default(), Some(Duration::MAX));
    app.enter_world("alpha");
    let agent = app.agent();
    let conversation = agent.conversation("agent");
    let keyed = || CallRequest::new("brief", json!({})).operation("op-1");
    let call = conversation.request(keyed());
    waits_for_its_tool(&mut app, &["agent"]);
    let ran = Arc::new(AtomicUsize::new(0));
    let runs = ran.clone();
    let brief = AgentTool::new("brief", "Has 50 ms.", move |_: CallContext<Session>, _: NoArgs| {
        runs.fetch_add(1, Ordering::SeqCst);
        async move { Ok(()) }
    })
    .timeout(Duration::from_millis(50));
    // Time passes beyond the tool's own timeout, which the call could not know while it waited.
    std::thread::sleep(Duration::from_millis(100));
    agent.register_tool(brief).expect("registers");
    let error = app.run_until_resolved(&call).expect_err("past its timeout");
    assert_eq!(error.code, ErrorCode::Timeout, "{}", error.message);
    assert_eq!(ran.load(Ordering::SeqCst), 0, "its handler never ran");
    app.run_until_resolved(&conversation.request(keyed())).expect("a retry runs: nothing was retained");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn a_step_that_ends_its_own_conversation_or_task_ends_its_call_and_the_game_runs_on() {
    // A "goodbye" tool and a "stop everything" tool: each ends its own call from inside its main-thread step.
    let goodbye = AgentTool::new("goodbye", "Ends this conversation.", |ctx: CallContext<Session>, _: NoArgs| {
        let conversation = ctx.conversation().clone();
        async move {
            ctx.on_client(move |world, _| world.resource::<AgentHandle>().end_conversation(&conversation)).await??;
            Ok(())
        }
    });
    let stop = AgentTool::new("stop_all", "Cancels this task's calls.", |ctx: CallContext<Session>, _: NoArgs| {
        let (conversation, task) = (ctx.conversation().clone(), ctx.task().clone());
        async move {
            ctx.on_client(move |world, _| world.resource::<AgentHandle>().conversation(conversation).cancel_task(task))
                .await?;
            Ok(())
        }
    });
    let mut app = headless_app(AgentToolsPlugin::new(TestGame::default()).with_tool(goodbye).with_tool(stop));
    app.enter_world("alpha");
    let agent = app.agent().conversation("agent");
    let error = app.run_until_resolved(&agent.call("goodbye", json!({}))).expect_err("its conversation ended");
    assert_eq!(error.code, ErrorCode::Cancelled, "{}", error.message);
    assert_eq!(agent.status(), S::Ended);
    agent.resume().expect("resumes");
    let error = app.run_until_resolved(&agent.call("stop_all", json!({}))).expect_err("its task was cancelled");
    assert_eq!(error.code, ErrorCode::Cancelled, "{}", error.message);
    app.update();
    assert_eq!(agent.status(), S::Idle, "the game ran on");
}

#[test]
fn a_call_for_a_tool_never_registered_times_out_with_tool_not_found() {
    let mut app = late_tool_app(TestGame::default(), Some(Duration::from_millis(30)));
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    let (_, mut events) = conversation.subscribe().expect("known");
    let call = conversation.call("never", json!({}));
    let error = app.run_until_resolved(&call).expect_err("never registered");
    assert_eq!(error.code, ErrorCode::ToolNotFound);
    assert!(error.message.contains("waited"), "{}", error.message);
    assert_eq!(
        statuses(&drain(&mut events)),
        [(S::Idle, S::WaitingToolResult, StatusSource::Host), (S::WaitingToolResult, S::Idle, StatusSource::Host)]
    );
}

#[test]
fn an_idle_conversation_ends_after_the_configured_timeout_and_reopens() {
    let game = TestGame::default();
    let record = game.record.clone();
    let mut app = headless_app(
        AgentToolsPlugin::new(game)
            .with_tool(bump_tool("bump", ToolScope::World, Arc::default(), None))
            .conversation_idle_timeout(Duration::from_millis(20)),
    );
    app.enter_world("alpha");
    let agent = app.agent();
    let conversation = agent.conversation("mcp-client:test/1");
    let call = conversation.call("bump", json!({}));
    app.run_until_resolved(&call).expect("succeeds");
    app.run_until("the idle conversation ended", |_| conversation.status() == S::Ended);
    assert_eq!(record.closes.load(Ordering::SeqCst), 0, "ending never closes the visit");

    let again = agent.conversation("mcp-client:test/1");
    assert_eq!(again.status(), S::Idle, "opening it again reactivates it");
    let call = again.call("bump", json!({}));
    assert_eq!(app.run_until_resolved(&call).expect("the same visit").value["counter"], 2);
}

/// Everything the game saw, one line per message.
#[derive(Resource, Default)]
struct Seen(Vec<String>);

fn record_messages(
    mut opened: MessageReader<VisitOpened>,
    mut conversation: (
        MessageReader<ConversationStatusChanged>,
        MessageReader<CallStarted>,
        MessageReader<CallFinished>,
    ),
    mut relocated: MessageReader<VisitRelocated>,
    mut visit_end: (MessageReader<VisitClosing>, MessageReader<VisitClosed>, MessageReader<VisitSaved>),
    mut seen: ResMut<Seen>,
) {
    let seen = &mut seen.0;
    seen.extend(opened.read().map(|m| format!("opened {}", m.info.world)));
    // Conversation messages of one frame, in their conversation's order.
    let mut frame: Vec<(u64, String)> = Vec::new();
    frame.extend(conversation.0.read().map(|m| (m.sequence, format!("status {} -> {}", m.previous, m.status))));
    frame.extend(
        conversation.1.read().map(|m| (m.sequence, format!("started {} at {}", m.tool, m.visit.location.revision))),
    );
    frame.extend(conversation.2.read().map(|m| (m.sequence, format!("finished {} {:?}", m.tool, m.code))));
    frame.sort();
    seen.extend(frame.into_iter().map(|(_, line)| line));
    seen.extend(relocated.read().map(|m| format!("relocated {} {}", m.to.dimension, m.to.revision)));
    seen.extend(visit_end.0.read().map(|m| format!("closing {}", m.info.world)));
    seen.extend(visit_end.1.read().map(|m| format!("closed {}", m.info.world)));
    seen.extend(visit_end.2.read().map(|m| format!("saved {} {}", m.info.world, m.result.is_ok())));
}

#[test]
fn a_bevy_system_sees_the_exact_sequence_of_a_scripted_session() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.init_resource::<Seen>().add_systems(Last, record_messages);

    app.enter_world("alpha");
    let call = app.agent().conversation("hud").call("bump", json!({}));
    app.run_until_resolved(&call).expect("succeeds");
    app.step(1);
    app.travel("nether");
    app.exit_world();
    app.step(1);

    assert_eq!(
        app.world().resource::<Seen>().0,
        [
            "opened alpha",
            "started bump at rev#0",
            "status idle -> waiting_tool_result",
            "finished bump None",
            "status waiting_tool_result -> idle",
            "relocated nether rev#1",
            "closing alpha",
            "closed alpha",
            "saved alpha true",
        ]
    );
}

/// A tool that reports progress twice, then hands its context out so the test can report once more after the end.
fn progress_tool(kept: Arc<parking_lot::Mutex<Option<CallContext<Session>>>>) -> AgentTool<Session> {
    AgentTool::new("progress", "Reports progress.", move |ctx: CallContext<Session>, _: NoArgs| {
        let kept = kept.clone();
        async move {
            ctx.report_progress(1.0, Some(2.0), Some("half".into()));
            ctx.report_progress(2.0, Some(2.0), None);
            *kept.lock() = Some(ctx);
            Ok(json!({}))
        }
    })
}

#[derive(Resource, Default)]
struct ProgressSeen(Vec<(u64, f64)>);

#[test]
fn progress_is_a_conversation_event_between_start_and_finish_and_never_after() {
    let kept = Arc::new(parking_lot::Mutex::new(None));
    let mut app = app_with(TestGame::default(), vec![progress_tool(kept.clone())]);
    app.init_resource::<ProgressSeen>().add_systems(
        Last,
        |mut read: MessageReader<CallProgress>, mut seen: ResMut<ProgressSeen>| {
            seen.0.extend(read.read().map(|m| (m.sequence, m.progress)));
        },
    );
    app.enter_world("alpha");
    let conversation = app.agent().conversation("hud");
    let (_, mut events) = conversation.subscribe().expect("known");
    let call = conversation.call("progress", json!({}));
    app.run_until_resolved(&call).expect("succeeds");
    let late = kept.lock().take().expect("the handler kept its context");
    late.report_progress(3.0, Some(2.0), Some("after the end".into()));
    app.step(1);

    let events = drain(&mut events);
    let kinds: Vec<String> = events
        .iter()
        .map(|event| match event {
            ConversationEvent::CallStarted(e) => format!("started {}", e.tool),
            ConversationEvent::CallProgress(e) => {
                format!("progress {} {}/{:?} {:?}", e.tool, e.progress, e.total, e.message)
            }
            ConversationEvent::CallFinished(e) => format!("finished {} {:?}", e.tool, e.code),
            ConversationEvent::Status(e) => format!("status {}", e.status),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "started progress",
            "status waiting_tool_result",
            "progress progress 1/Some(2.0) Some(\"half\")",
            "progress progress 2/Some(2.0) None",
            "finished progress None",
            "status idle",
        ]
    );
    let published: Vec<(u64, f64)> = events
        .iter()
        .filter_map(|event| match event {
            ConversationEvent::CallProgress(e) => Some((e.sequence, e.progress)),
            _ => None,
        })
        .collect();
    assert_eq!(app.world().resource::<ProgressSeen>().0, published, "the game reads the same reports as messages");
}

/// Records, for each event logged inside a span, the span's name and fields.
mod spans {
    use std::collections::BTreeMap;
    use std::fmt::Debug;
    use std::sync::OnceLock;

    use parking_lot::Mutex;
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id};
    use tracing::{Event, Subscriber};
    use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
    use tracing_subscriber::registry::LookupSpan;

    pub type Fields = BTreeMap<String, String>;

    #[derive(Default)]
    struct Collect(Fields);

    impl Visit for Collect {
        fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
            self.0.insert(field.name().to_string(), format!("{value:?}").trim_matches('"').to_string());
        }
    }

    /// (span name, span fields, event message) of every event logged inside a span.
    pub fn seen() -> &'static Mutex<Vec<(String, Fields, String)>> {
        static SEEN: OnceLock<Mutex<Vec<(String, Fields, String)>>> = OnceLock::new();
        SEEN.get_or_init(Default::default)
    }

    struct Recorder;

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            let mut fields = Collect::default();
            attrs.record(&mut fields);
            if let Some(span) = ctx.span(id) {
                span.extensions_mut().insert(fields.0);
            }
        }

        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            let Some(span) = ctx.event_span(event) else { return };
            let mut message = Collect::default();
            event.record(&mut message);
            let fields = span.extensions().get::<Fields>().cloned().unwrap_or_default();
            let text = message.0.get("message").cloned().unwrap_or_default();
            seen().lock().push((span.name().to_string(), fields, text));
        }
    }

    /// Installs the recorder for the whole test process (the handlers run on the plugin's threads).
    pub fn install() {
        static INSTALLED: OnceLock<()> = OnceLock::new();
        INSTALLED.get_or_init(|| {
            let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(Recorder));
        });
    }
}

#[test]
fn every_call_runs_inside_a_span_carrying_visit_revision_conversation_request_and_tool() {
    spans::install();
    let traced =
        AgentTool::new("traced", "Logs from its handler.", |ctx: CallContext<Session>, _: NoArgs| async move {
            tracing::info!("inside the handler");
            ctx.on_client(|_, _| ()).await
        });
    let mut app = app_with(TestGame::default(), vec![traced]);
    app.enter_world("alpha");
    app.travel("nether");
    let call = app.agent().conversation("traced-conversation").call("traced", json!({}));
    let request = call.request_id().expect("admitted");
    app.run_until_resolved(&call).expect("succeeds");

    let seen = spans::seen().lock();
    let (name, fields, _) = seen
        .iter()
        .find(|(_, fields, message)| {
            message == "inside the handler"
                && fields.get("conversation").map(String::as_str) == Some("traced-conversation")
        })
        .expect("the handler's log line is inside the call's span");
    assert_eq!(name, "agent_tool_call");
    assert_eq!(fields["visit"], "visit#1");
    assert_eq!(fields["revision"], "1");
    assert_eq!(fields["request"], request.to_string());
    assert_eq!(fields["tool"], "traced");
}

#[test]
fn ending_a_conversation_ends_its_call_waiting_for_a_tool() {
    let mut app = late_tool_app(TestGame::default(), Some(Duration::from_secs(20)));
    app.enter_world("alpha");
    let conversation = app.agent().conversation("agent");
    let call = conversation.call("late_tool", json!({}));
    app.run_until("the call waits for its tool", |_| conversation.status() == S::WaitingToolResult);
    conversation.end().expect("ends");
    let error = app.run_until_resolved(&call).expect_err("ended with its conversation");
    assert_eq!(error.code, ErrorCode::Cancelled);
    assert_eq!(error.details.extra["conversation_ended"], json!(true));
}

#[test]
fn a_tool_added_to_the_app_before_the_plugin_is_registered_when_the_plugin_is_built() {
    // A plugin of the game's own that brings its tools, added before `AgentToolsPlugin`: plugin order is free.
    let executions = Arc::new(AtomicUsize::new(0));
    let mut app = App::new();
    app.add_plugins(MinimalPlugins);
    bevy_agent_tools::AgentToolsAppExt::add_agent_tool(
        &mut app,
        bump_tool("early", ToolScope::World, executions.clone(), None),
    );
    app.add_plugins(AgentToolsPlugin::new(TestGame::default()));
    app.finish();
    app.cleanup();
    app.enter_world("alpha");
    let call = app.agent().conversation("agent").call("early", json!({}));
    assert_eq!(app.run_until_resolved(&call).expect("registered").value["counter"], 1);
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}

#[test]
fn registering_a_tool_for_another_session_type_at_run_time_is_an_error_not_a_panic() {
    let app = app_with(TestGame::default(), vec![]);
    let wrong = AgentTool::new("wrong", "For another game.", |_: CallContext<u32>, _: NoArgs| async move { Ok(()) });
    let error = app.agent().register_tool(wrong).expect_err("refused");
    assert!(error.message.contains("u32"), "{}", error.message);
    assert!(app.agent().tools().iter().all(|tool| tool.name != "wrong"));
}

#[test]
fn the_handles_a_game_keeps_are_debug_and_say_which_call_and_conversation() {
    let executions = Arc::new(AtomicUsize::new(0));
    let tool = bump_tool("count", ToolScope::World, executions, None);
    assert!(format!("{tool:?}").contains("\"count\""));
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let agent = app.agent();
    let conversation = agent.conversation("debugged");
    let call = conversation.call("bump", json!({}));
    assert!(format!("{agent:?}").contains("alpha"), "{agent:?}");
    assert!(format!("{conversation:?}").contains("debugged"), "{conversation:?}");
    let shown = format!("{call:?}");
    assert!(shown.starts_with("Call") && shown.contains("request"), "{shown}");
    let _ = app.run_until_resolved(&call);
}

/// A game system calls a tool and keeps the call in a resource (a HUD button, a scripted event), then reads its
/// outcome in a later frame: a `Call` is `Sync`, and keeping it there does not cancel it.
#[test]
fn a_call_made_by_a_game_system_can_be_kept_in_a_resource_until_it_resolves() {
    #[derive(Resource, Default)]
    struct Kept {
        call: Option<Call>,
        outcome: Option<bevy_agent_tools::CallOutcome>,
    }
    let executions = Arc::new(AtomicUsize::new(0));
    let mut app = app_with(TestGame::default(), vec![bump_tool("bump", ToolScope::World, executions.clone(), None)]);
    app.enter_world("alpha");
    app.init_resource::<Kept>().add_systems(Update, |agent: Res<AgentHandle>, mut kept: ResMut<Kept>| {
        if kept.outcome.is_some() {
            return;
        }
        match &kept.call {
            None => kept.call = Some(agent.conversation("hud").call("bump", json!({ "by": 2 }))),
            Some(call) => kept.outcome = call.try_outcome(),
        }
    });
    app.run_until("the kept call's outcome", |app| app.world().resource::<Kept>().outcome.is_some());
    let outcome = app.world_mut().resource_mut::<Kept>().outcome.take().expect("resolved");
    assert_eq!(outcome.expect("ran").value["counter"], 2);
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}

/// A world's own tool, removed once the player left it: not listed, a new call for it is `TOOL_NOT_FOUND`, and a
/// call of it already running finishes.
#[test]
fn an_unregistered_tool_takes_no_new_calls_and_its_running_ones_finish() {
    let gate = Gate::new();
    let executions = Arc::new(AtomicUsize::new(0));
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let agent = app.agent();
    agent.register_tool(bump_tool("forge", ToolScope::World, executions.clone(), Some(gate.clone()))).expect("ok");
    let running = agent.conversation("a").call("forge", json!({}));
    app.run_until("the call at its gate", |_| gate.arrived() == 1);

    assert!(agent.unregister_tool("forge"));
    assert!(agent.tools().iter().all(|tool| tool.name != "forge"), "no longer listed");
    let refused = agent.conversation("a").call("forge", json!({})).try_outcome().expect("at once");
    assert_eq!(refused.expect_err("unknown now").code, ErrorCode::ToolNotFound);

    gate.open();
    assert!(app.run_until_resolved(&running).is_ok(), "admitted before: it ran on");
    assert_eq!(executions.load(Ordering::SeqCst), 1);
}
