//! Race tests for the places where threads meet, under shuttle's controlled scheduler: thousands of random (and
//! PCT) interleavings of the real code, each failing one printed as a schedule that `shuttle::replay` reproduces.
//!
//! Run with `cargo test --features shuttle --lib races` (the `shuttle` feature swaps the locks of `crate::sync`
//! for shuttle's; nothing else may run with it on). `SHUTTLE_ITERATIONS` sets the schedules per test.
//!
//! - A main-thread step against an end from another thread (an exit, a cancel): the step's check and its closure
//!   are one step (H8); the on_client enqueue of a worker against an exit draining the queue never runs a step
//!   for an ended call, and the worker's `on_client` future resolves (H13).
//! - A late completion against the exit taking the visit's calls: exactly one outcome per call, one
//!   `CallFinished`, no call left behind, the in-flight counts back to zero, and a call admitted concurrently is
//!   either ended by the exit or refused with `WORLD_CLOSED` (H5, H13).
//! - A retry of an operation whose first call ended before its handler started (the world still loading),
//!   against that call's end and release: the retry runs anew (or joined the first while it waited), never gets
//!   the first's outcome, and keeps its own replay entry (H12).
//! - A retry arriving as its execution's only caller cancels it: it joins (the execution goes on for it) or runs
//!   anew (the execution never started), never joined to an execution that cancel then ends (H12).
//! - The idle timeout ending a conversation as a call of it is admitted: the call is refused or runs on, never
//!   admitted and then cancelled.
//! - A caller of a shared execution cancelling it as it finishes: the caller reads what its conversation's
//!   `CallFinished` said (H13).
//! - An old visit's save against the next visit's load of the same world: the load runs after the save,
//!   whatever order their tasks are scheduled in (H7).
//! - A call that waited for its tool, admitted as the visit it was made in exits: refused, or run and ended by the
//!   exit, never told "it was not run" when it was (H13).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Receiver;
use serde_json::json;

use crate::agent::Call;
use crate::call::{admit, Admitted, CallCore, CallLife, CallOutput, CallRequest, Job};
use crate::conversation::{ConversationEvent, ConversationStatus};
use crate::error::{ErrorCode, ToolError};
use crate::host::HostShared;
use crate::ids::ConversationId;
use crate::persist::turns::Turns;
use crate::tool::AgentTool;
use crate::{CallContext, NoArgs};

fn iterations() -> usize {
    std::env::var("SHUTTLE_ITERATIONS").ok().and_then(|n| n.parse().ok()).unwrap_or(2_000)
}

/// Runs `test` under the random scheduler and under PCT (which finds bugs that need a few unlikely preemptions).
fn explore(test: impl Fn() + Send + Sync + 'static) {
    let test = Arc::new(test);
    let random = test.clone();
    let config = config();
    let scheduler = shuttle::scheduler::RandomScheduler::new(iterations());
    shuttle::Runner::new(scheduler, config.clone()).run(move || random());
    shuttle::Runner::new(shuttle::scheduler::PctScheduler::new(3, iterations()), config).run(move || test());
}

/// Runs `test` once under shuttle (its locks need its scheduler).
fn once(test: impl Fn() + Send + Sync + 'static) {
    shuttle::Runner::new(shuttle::scheduler::RandomScheduler::new(1), config()).run(test);
}

/// Admission validates arguments against the tool's schema, compiling it at the first call: deeper than
/// shuttle's default 32 KiB thread stacks.
fn config() -> shuttle::Config {
    let mut config = shuttle::Config::new();
    config.stack_size = 1 << 20;
    config
}

struct Fixture {
    host: Arc<HostShared>,
    jobs: Receiver<Job>,
    feed: Receiver<ConversationEvent>,
    conversation: ConversationId,
    /// The runtime the host spawns call drivers on. Nothing ever runs on it here; dropping it (last) at the end of
    /// each schedule drops what was spawned, so schedules do not accumulate tasks.
    _runtime: tokio::runtime::Runtime,
}

/// A host with a visit open and one conversation, and a tool `noop` (its handler never runs here: the runtime is
/// idle, so every call stays in flight until something ends it).
fn fixture() -> Fixture {
    fixture_with(None)
}

/// The arguments of the fixture's `count` tool.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Count {
    #[allow(dead_code)]
    n: u32,
}

/// [`fixture`], with the conversations' idle timeout.
fn fixture_with(idle_timeout: Option<Duration>) -> Fixture {
    let (host, jobs, feed, runtime) = crate::host::test_host(idle_timeout);
    let noop = AgentTool::new("noop", "Does nothing.", |_: CallContext<()>, _: NoArgs| async { Ok(()) });
    host.register_tool(Arc::new(noop)).expect("the session type matches");
    let count = AgentTool::new("count", "Takes a number.", |_: CallContext<()>, _: Count| async { Ok(()) });
    host.register_tool(Arc::new(count)).expect("the session type matches");
    Fixture { host, jobs, feed, conversation: ConversationId::new("agent"), _runtime: runtime }
}

fn call(fixture: &Fixture) -> Result<Arc<CallLife>, ToolError> {
    match admit(&fixture.host, &fixture.conversation, CallRequest::new("noop", json!({})))? {
        Admitted::Running { life, .. } => Ok(life),
        Admitted::Retained(..) => unreachable!("no operation ids here"),
    }
}

/// What the exit does with the visit's calls (`Transitions::exit`): close admission, take them, end them.
fn exit(host: &HostShared) {
    for life in host.begin_exit() {
        life.finish(Err(ToolError::with_code(ErrorCode::VisitEnded, "the player left")));
    }
}

fn code(life: &CallLife) -> Option<ErrorCode> {
    let outcome = life.outcome().get().expect("the call has its outcome");
    outcome.err().map(|error| error.code)
}

/// Opens a second conversation, `other`, beside the fixture's.
fn other_conversation(fixture: &Fixture) -> ConversationId {
    let other = ConversationId::new("other");
    fixture.host.conversations.open(&other);
    other
}

/// The keyed request two conversations make to share one execution (same tool, task and operation id).
fn shared_request() -> CallRequest {
    CallRequest::new("noop", json!({})).operation("op").task("shared")
}

/// A thread that finishes `life` with a success; it returns whether that was the call's outcome.
fn finish_ok(life: &Arc<CallLife>) -> shuttle::thread::JoinHandle<bool> {
    let life = life.clone();
    let output = CallOutput { value: json!("done"), observed: life.coords.visit.clone() };
    shuttle::thread::spawn(move || life.finish(Ok(output)))
}

/// The codes of the `CallFinished` events of `conversation` published so far.
fn finished_codes(feed: &Receiver<ConversationEvent>, conversation: &ConversationId) -> Vec<Option<ErrorCode>> {
    feed.try_iter()
        .filter_map(|event| match event {
            ConversationEvent::CallFinished(finished) if &finished.conversation == conversation => Some(finished.code),
            _ => None,
        })
        .collect()
}

fn finished_events(feed: &Receiver<ConversationEvent>, life: &CallLife) -> usize {
    feed.try_iter()
        .filter(|event| matches!(event, ConversationEvent::CallFinished(f) if f.request == life.coords.request))
        .count()
}

#[test]
fn h8_a_step_and_an_end_from_another_thread_never_interleave() {
    explore(|| {
        let fixture = fixture();
        let life = call(&fixture).expect("admitted");
        let (ran, interleaved) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let pump = {
            let (life, ran, interleaved) = (life.clone(), ran.clone(), interleaved.clone());
            shuttle::thread::spawn(move || {
                // The pump's own step: begun, rechecked, then the closure, holding the call's step throughout.
                // (Noted, not asserted, in the closure: the step catches a panic there.)
                let mut open = crate::visit::OpenSession { info: life.coords.visit.clone(), session: (), store: None };
                crate::call::step(&life, Some(&mut open), "test", |_| {
                    let before = life.outcome().is_set();
                    shuttle::thread::yield_now();
                    interleaved.store(before || life.outcome().is_set(), Ordering::SeqCst);
                    ran.store(true, Ordering::SeqCst);
                    Ok(())
                });
            })
        };
        let ender = {
            let host = fixture.host.clone();
            shuttle::thread::spawn(move || exit(&host))
        };
        let canceller = {
            let life = life.clone();
            shuttle::thread::spawn(move || life.fail(ErrorCode::Cancelled, "the agent cancelled"))
        };
        pump.join().expect("pump");
        ender.join().expect("exit");
        let cancelled = canceller.join().expect("cancel");
        assert!(!interleaved.load(Ordering::SeqCst), "the call ended before or in the middle of its step's closure");
        let code = code(&life);
        assert_eq!(code == Some(ErrorCode::Cancelled), cancelled, "the cancel's outcome is the call's iff it won");
        assert!(matches!(code, Some(ErrorCode::Cancelled | ErrorCode::VisitEnded)), "{code:?}");
        assert_eq!(finished_events(&fixture.feed, &life), 1, "one CallFinished");
        // The step ran iff it locked the call before either end: then the end waited for it.
        STEP_RAN[usize::from(ran.load(Ordering::SeqCst))].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    // Across the schedules explored, the step both won (ran whole, the end after it) and lost (never ran): the
    // test saw both sides of the race, not just one.
    let [lost, won] = [&STEP_RAN[0], &STEP_RAN[1]].map(|count| count.load(std::sync::atomic::Ordering::Relaxed));
    assert!(lost > 0 && won > 0, "schedules where the step lost: {lost}, won: {won}");
}

/// Schedules of `h8_a_step_and_an_end_from_another_thread_never_interleave` where the step did not run / ran.
/// (std's atomics, outside shuttle: they count across schedules.)
static STEP_RAN: [std::sync::atomic::AtomicUsize; 2] =
    [std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0)];

#[test]
fn h8_a_worker_queueing_a_step_while_the_exit_drains_the_queue_never_runs_it_and_never_hangs() {
    explore(|| {
        let fixture = fixture();
        let life = call(&fixture).expect("admitted");
        let worker = {
            let core = CallCore { life: life.clone(), host: fixture.host.clone() };
            shuttle::thread::spawn(move || {
                let ctx = CallContext::<()>::new(core);
                // `on_client` queues its step when called; the future then waits for the step or the end.
                let step = ctx.on_client(|_, _| ());
                shuttle::future::block_on(step)
            })
        };
        let main = {
            let (host, jobs) = (fixture.host.clone(), fixture.jobs.clone());
            shuttle::thread::spawn(move || {
                exit(&host);
                while jobs.try_recv().is_ok() {}
            })
        };
        main.join().expect("exit");
        let result = worker.join().expect("worker");
        assert_eq!(result.err().map(|e| e.code), Some(ErrorCode::VisitEnded), "on_client resolves with the end");
        // The next frames' pump: a step queued after the drain meets a call that already ended.
        let mut queued_after = false;
        while let Ok(job) = fixture.jobs.try_recv() {
            let Job::Call { life, .. } = job else { panic!("only the worker's step was queued") };
            queued_after = true;
            assert!(life.begin_step().is_err(), "a step of an ended call would run");
        }
        QUEUED_AFTER_DRAIN[usize::from(queued_after)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    // Both sides of the race were explored: steps the drain took, and steps queued after it.
    let [before, after] =
        [&QUEUED_AFTER_DRAIN[0], &QUEUED_AFTER_DRAIN[1]].map(|n| n.load(std::sync::atomic::Ordering::Relaxed));
    assert!(before > 0 && after > 0, "schedules with the step drained: {before}, queued after the drain: {after}");
}

/// Schedules of `h8_a_worker_queueing_a_step_while_the_exit_drains_the_queue_never_runs_it_and_never_hangs` where
/// no step / a step was queued after the drain. (std's atomics, outside shuttle: they count across schedules.)
static QUEUED_AFTER_DRAIN: [std::sync::atomic::AtomicUsize; 2] =
    [std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0)];

#[test]
fn h13_a_late_completion_racing_the_exit_gives_each_call_exactly_one_outcome() {
    explore(|| {
        let fixture = fixture();
        let early = call(&fixture).expect("admitted");
        let other = call(&fixture).expect("admitted");
        assert!(early.begin_handler(), "its handler runs");
        let completion = {
            let (host, life) = (fixture.host.clone(), early.clone());
            shuttle::thread::spawn(move || {
                // What `drive` does when a handler returns: finish, then release.
                let output = CallOutput { value: json!("done"), observed: life.coords.visit.clone() };
                let won = life.finish(Ok(output));
                host.release_call(&life);
                won
            })
        };
        let exiting = {
            let host = fixture.host.clone();
            shuttle::thread::spawn(move || exit(&host))
        };
        let admitting = {
            let host = fixture.host.clone();
            let conversation = fixture.conversation.clone();
            shuttle::thread::spawn(move || match admit(&host, &conversation, CallRequest::new("noop", json!({}))) {
                Ok(Admitted::Running { life, .. }) => Ok(life),
                Ok(Admitted::Retained(..)) => unreachable!("no operation ids here"),
                Err(error) => Err(error.code),
            })
        };
        let completed = completion.join().expect("completion");
        exiting.join().expect("exit");
        let late = admitting.join().expect("admission");

        assert_eq!(code(&early).is_none(), completed, "the handler's result stands iff it came first");
        assert_eq!(code(&other), Some(ErrorCode::VisitEnded));
        match &late {
            Ok(life) => assert_eq!(code(life), Some(ErrorCode::VisitEnded), "admitted before the exit: ended by it"),
            Err(code) => assert_eq!(*code, ErrorCode::WorldClosed, "admitted after: refused"),
        }
        let events: Vec<ConversationEvent> = fixture.feed.try_iter().collect();
        let mut lives = vec![&early, &other];
        lives.extend(late.as_ref().ok());
        for life in lives {
            let finished = events
                .iter()
                .filter(|event| matches!(event, ConversationEvent::CallFinished(f) if f.request == life.coords.request))
                .count();
            assert_eq!(finished, 1, "one CallFinished for {}", life.coords.request);
        }
        assert_eq!(fixture.host.in_flight(&fixture.conversation), 0, "no call left counted in flight");
        let state = fixture.host.state.lock();
        assert_eq!(state.visit.as_ref().map(|visit| visit.calls.iter().count()), Some(0), "no call left behind");
    });
}

#[test]
fn h13_a_waiting_call_admitted_as_its_visit_exits_is_never_told_it_was_not_run_when_it_was() {
    explore(|| {
        let fixture = fixture();
        let request = CallRequest::new("noop", json!({}));
        // Waiting for its tool (its task never runs here): the tool came, and this thread admits it, as that task
        // would.
        let waiting = crate::conversation::wait_for_tool(
            &fixture.host,
            &fixture.conversation,
            request.clone(),
            Duration::from_secs(60),
        );
        let made_in = fixture.host.state.lock().visit.as_ref().map(|open| open.info.clone());
        let info = made_in.clone().expect("a visit is open");
        let admitting = {
            let (host, conversation, call) = (fixture.host.clone(), fixture.conversation.clone(), waiting.clone());
            let arrival = crate::call::Arrival { at: std::time::Instant::now(), made_in };
            shuttle::thread::spawn(move || {
                match crate::conversation::admit_waiting(&host, &conversation, request, arrival, &call) {
                    Ok(Admitted::Running { life, .. }) => Ok(life),
                    Ok(Admitted::Retained(..)) => unreachable!("no operation ids here"),
                    Err(error) => Err(error.code),
                }
            })
        };
        let exiting = {
            let host = fixture.host.clone();
            shuttle::thread::spawn(move || {
                // The exit's order (`Transitions::exit`): the visit's calls, then those still waiting for a tool.
                exit(&host);
                host.waiting_calls.end_visit(&info);
            })
        };
        exiting.join().expect("exit");
        match admitting.join().expect("admission") {
            Ok(life) => {
                assert_eq!(code(&life), Some(ErrorCode::VisitEnded), "admitted before the exit: ended by it");
                assert!(!waiting.outcome.is_set(), "it ran: its execution's outcome is its own, not \"not run\"");
            }
            Err(code) => assert_eq!(code, ErrorCode::VisitEnded, "refused: the visit it was made in ended"),
        }
    });
}

/// Admits `noop` with operation id `op`: the execution it runs or joins, and whether it owns it.
fn admit_keyed(host: &Arc<HostShared>, conversation: &ConversationId) -> (Arc<CallLife>, bool) {
    match admit(host, conversation, CallRequest::new("noop", json!({})).operation("op")).expect("admitted") {
        Admitted::Running { life, owner, .. } => (life, owner),
        Admitted::Retained(_, outcome) => panic!("a retained outcome: {outcome:?}"),
    }
}

#[test]
fn h12_a_retry_racing_the_end_of_a_call_that_never_started_runs_anew_and_keeps_its_entry() {
    explore(|| {
        let fixture = fixture();
        let (first, _) = admit_keyed(&fixture.host, &fixture.conversation);
        let ending = {
            let (host, life) = (fixture.host.clone(), first.clone());
            shuttle::thread::spawn(move || {
                // What `drive` does when the world is still loading at the call's deadline: finish, then release.
                life.finish(Err(ToolError::with_code(ErrorCode::WorldLoadingTimeout, "still loading")));
                host.release_call(&life);
            })
        };
        let retrying = {
            let (host, conversation) = (fixture.host.clone(), fixture.conversation.clone());
            shuttle::thread::spawn(move || admit_keyed(&host, &conversation))
        };
        ending.join().expect("end");
        let (retry, owner) = retrying.join().expect("retry");
        if Arc::ptr_eq(&retry, &first) {
            // Admitted while the first was still waiting: it joined it, and shares its outcome.
            assert!(!owner);
        } else {
            // Admitted after the first ended: a run of its own, never the first's outcome, and its entry is the
            // key's (the first's release did not forget it): a duplicate of it joins it.
            assert!(owner, "a fresh execution");
            assert!(!retry.outcome().is_set());
            let (duplicate, owner) = admit_keyed(&fixture.host, &fixture.conversation);
            assert!(Arc::ptr_eq(&duplicate, &retry) && !owner, "the retry's entry is kept");
        }
        RETRY_JOINED[usize::from(Arc::ptr_eq(&retry, &first))].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    });
    let [fresh, joined] =
        [&RETRY_JOINED[0], &RETRY_JOINED[1]].map(|count| count.load(std::sync::atomic::Ordering::Relaxed));
    assert!(fresh > 0 && joined > 0, "schedules where the retry ran anew: {fresh}, joined: {joined}");
}

/// The window the race above can fall into, taken in order: the first call finished (its client has the outcome)
/// but not yet released when the retry arrives.
#[test]
fn h12_a_retry_between_the_end_and_the_release_of_a_call_that_never_started_runs_anew() {
    once(|| {
        let fixture = fixture();
        let (first, _) = admit_keyed(&fixture.host, &fixture.conversation);
        first.finish(Err(ToolError::with_code(ErrorCode::WorldLoadingTimeout, "still loading")));
        let (retry, owner) = admit_keyed(&fixture.host, &fixture.conversation);
        assert!(owner && !Arc::ptr_eq(&retry, &first), "a run of its own, not the first's outcome");
        fixture.host.release_call(&first);
        let (duplicate, owner) = admit_keyed(&fixture.host, &fixture.conversation);
        assert!(Arc::ptr_eq(&duplicate, &retry) && !owner, "the first's release left the retry's entry");
    });
}

#[test]
fn h12_a_call_that_never_started_leaves_its_key_free_for_other_arguments_too() {
    once(|| {
        let fixture = fixture();
        let keyed = |n: u32| CallRequest::new("count", json!({ "n": n })).operation("op");
        let first = match admit(&fixture.host, &fixture.conversation, keyed(1)) {
            Ok(Admitted::Running { life, .. }) => life,
            _ => panic!("the first call runs"),
        };
        first.finish(Err(ToolError::with_code(ErrorCode::WorldLoadingTimeout, "still loading")));
        // Before its release (its driver has not run): the same operation with other arguments.
        match admit(&fixture.host, &fixture.conversation, keyed(2)) {
            Ok(Admitted::Running { owner: true, life, .. }) => assert!(!Arc::ptr_eq(&life, &first)),
            Ok(Admitted::Running { .. }) => panic!("joined the call that never started"),
            Ok(Admitted::Retained(_, outcome)) => panic!("a retained outcome: {outcome:?}"),
            Err(error) => panic!("refused: {error:?}"),
        }
    });
}

/// A conversation ends while its caller reads as soon as it is told it stopped waiting: whatever the schedule, it
/// reads the call's own end (its conversation's withdrawal ended it: no one else waits), never that the call goes
/// on for others, and the same however often it reads.
#[test]
fn h12_a_withdrawn_caller_told_it_stopped_waiting_reads_what_its_withdrawal_decided() {
    explore(|| {
        let fixture = fixture();
        let Ok(Admitted::Running { life, seat, .. }) =
            admit(&fixture.host, &fixture.conversation, CallRequest::new("noop", json!({})))
        else {
            panic!("admitted");
        };
        let ending = {
            let (life, conversation) = (life.clone(), fixture.conversation.clone());
            shuttle::thread::spawn(move || {
                life.withdraw(&conversation, "conversation `agent` ended");
            })
        };
        while !seat.withdrawn.is_cancelled() {
            shuttle::thread::yield_now();
        }
        let first = life.withdrawn_outcome(Some(&seat)).expect_err("cancelled");
        assert!(!first.message.contains("goes on"), "nobody else waits: {first:?}");
        ending.join().expect("ended");
        assert_eq!(life.withdrawn_outcome(Some(&seat)).expect_err("cancelled"), first, "the same, read again");
    });
}

/// Schedules of the test above where the retry ran anew / joined the first call.
static RETRY_JOINED: [std::sync::atomic::AtomicUsize; 2] =
    [std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0)];

#[test]
fn h7_the_next_visits_load_runs_after_the_old_visits_save_whatever_the_schedule() {
    explore(|| {
        let turns = Arc::new(Turns::default());
        let saved = Arc::new(AtomicU64::new(0));
        // Main thread: the old visit's close calls save, then the next visit's open calls load, in that order.
        let mut save_turn = turns.take();
        let mut load_turn = turns.take();
        let save = {
            let saved = saved.clone();
            shuttle::thread::spawn(move || {
                shuttle::future::block_on(save_turn.wait());
                shuttle::thread::yield_now();
                saved.store(7, Ordering::SeqCst);
                save_turn.done.succeed();
            })
        };
        let load = {
            let saved = saved.clone();
            shuttle::thread::spawn(move || {
                shuttle::future::block_on(load_turn.wait());
                let seen = saved.load(Ordering::SeqCst);
                load_turn.done.succeed();
                seen
            })
        };
        save.join().expect("save");
        assert_eq!(load.join().expect("load"), 7, "the load saw what the previous visit saved");
        assert!(turns.last().is_some_and(|last| last.is_done()), "the line is empty again");
    });
}

/// A conversation ends while the execution it shares with another conversation's retry (same task and operation)
/// finishes: whatever the order, the execution keeps its own outcome for the other conversation, and the ending
/// conversation's one `CallFinished` says what its caller reads (`CANCELLED` if the end came first).
#[test]
fn h12_a_conversation_ending_as_its_shared_execution_finishes_never_cancels_it_for_the_other_one() {
    explore(|| {
        let fixture = fixture();
        let other = other_conversation(&fixture);
        let Ok(Admitted::Running { life, seat, .. }) = admit(&fixture.host, &fixture.conversation, shared_request())
        else {
            panic!("admitted")
        };
        let Ok(Admitted::Running { life: joined, owner: false, .. }) = admit(&fixture.host, &other, shared_request())
        else {
            panic!("joined")
        };
        assert!(Arc::ptr_eq(&life, &joined));
        let ending = {
            let (host, conversation) = (fixture.host.clone(), fixture.conversation.clone());
            shuttle::thread::spawn(move || host.conversations.end(&conversation).expect("known"))
        };
        let finishing = finish_ok(&life);
        ending.join().expect("end");
        assert!(finishing.join().expect("finish"), "the execution's own outcome is its only one");
        assert!(life.outcome().get().is_some_and(|outcome| outcome.is_ok()), "the other conversation gets it");
        let read = match seat.withdrawn.is_cancelled() {
            true => life.withdrawn_outcome(Some(&seat)),
            false => life.outcome().get().expect("set"),
        };
        let seen = finished_codes(&fixture.feed, &fixture.conversation);
        assert_eq!(seen, vec![read.err().map(|error| error.code)], "one CallFinished, saying what the caller reads");
    });
}

/// A caller of a shared execution cancels just as it finishes: what the caller reads is what its conversation's
/// `CallFinished` said (both `CANCELLED`, or both the execution's outcome), whatever the order.
#[test]
fn h13_a_caller_cancelling_its_shared_execution_as_it_finishes_reads_what_its_call_finished_event_said() {
    explore(|| {
        let fixture = fixture();
        let other = other_conversation(&fixture);
        let Ok(Admitted::Running { life, .. }) = admit(&fixture.host, &fixture.conversation, shared_request()) else {
            panic!("admitted")
        };
        let Ok(Admitted::Running { life: joined, seat, owner: false }) = admit(&fixture.host, &other, shared_request())
        else {
            panic!("joined")
        };
        let retry = Call::running(joined, Some(seat), false);
        let cancelling = shuttle::thread::spawn(move || {
            retry.cancel();
            retry
        });
        let finishing = finish_ok(&life);
        let retry = cancelling.join().expect("cancel");
        assert!(finishing.join().expect("finish"), "the execution's own outcome is its only one");
        let read = retry.try_outcome().expect("the retry has its outcome");
        let seen = finished_codes(&fixture.feed, &other);
        assert_eq!(seen, vec![read.err().map(|error| error.code)], "one CallFinished, saying what the caller reads");
    });
}

/// The idle timeout ends a conversation just as a call of it is admitted: the call is either refused (the
/// conversation had ended before the call was one of its calls) or runs on, never started in the conversation and
/// then cancelled by an idleness it ended.
#[test]
fn an_idle_conversation_ending_as_a_call_of_it_is_admitted_never_cancels_that_call() {
    explore(|| {
        let fixture = fixture_with(Some(Duration::from_secs(1)));
        let ending = {
            let host = fixture.host.clone();
            // An hour on: idle by the clock, whatever the call does to its last activity.
            let later = std::time::Instant::now() + Duration::from_secs(3_600);
            shuttle::thread::spawn(move || host.conversations.end_idle(later))
        };
        let admitted = call(&fixture);
        ending.join().expect("end_idle");
        let started = fixture.feed.try_iter().any(|event| matches!(event, ConversationEvent::CallStarted(_)));
        match admitted {
            Ok(life) if started => {
                assert!(!life.outcome().is_set(), "started, then cancelled: {:?}", life.outcome().get());
                let status = fixture.host.conversations.status(&fixture.conversation);
                assert_eq!(status, Some(ConversationStatus::WaitingToolResult));
            }
            // Refused: the conversation had ended (at admission, or before the call was recorded in it).
            Ok(life) => assert_eq!(code(&life), Some(ErrorCode::Cancelled)),
            Err(error) => assert_eq!(error.code, ErrorCode::Cancelled, "{error:?}"),
        }
    });
}

/// A retry from another conversation joins as the execution finishes: whatever the order, the finished execution
/// is never left behind as a call in flight of the retry's conversation (it would stay `WaitingToolResult`).
#[test]
fn h12_a_retry_joining_as_its_execution_finishes_never_stays_in_flight_for_its_conversation() {
    explore(|| {
        let fixture = fixture();
        let other = other_conversation(&fixture);
        let Ok(Admitted::Running { life, .. }) = admit(&fixture.host, &fixture.conversation, shared_request()) else {
            panic!("admitted")
        };
        // Its handler started: a finished execution is retained for retries.
        assert!(life.begin_handler());
        let finishing = finish_ok(&life);
        let joining = {
            let (host, other) = (fixture.host.clone(), other.clone());
            shuttle::thread::spawn(move || {
                admit(&host, &other, shared_request()).map(|_| ()).map_err(|error| error.code)
            })
        };
        assert!(finishing.join().expect("finish"));
        assert_eq!(joining.join().expect("join"), Ok(()), "joined, or got the retained outcome");
        assert!(fixture.host.conversations.live_call(&other, life.coords.request).is_none(), "nothing left in flight");
        assert_ne!(fixture.host.conversations.status(&other), Some(ConversationStatus::WaitingToolResult));
    });
}

/// A retry from another conversation arrives as the execution's only caller cancels it (its handler not started):
/// as if it came before the cancel (it joins, and the execution goes on for it: the canceller only stopped
/// waiting) or after it (the execution left no trace, and the retry runs anew), never joined to an execution that
/// its other caller's cancel then ends.
#[test]
fn h12_a_retry_arriving_as_the_last_caller_cancels_keeps_the_execution_going_or_runs_anew() {
    explore(|| {
        let fixture = fixture();
        let other = other_conversation(&fixture);
        let Ok(Admitted::Running { life, seat, owner: true }) =
            admit(&fixture.host, &fixture.conversation, shared_request())
        else {
            panic!("admitted")
        };
        let first = Call::running(life.clone(), Some(seat), true);
        let cancelling = shuttle::thread::spawn(move || first.cancel());
        let retry = admit(&fixture.host, &other, shared_request());
        let ended_it = cancelling.join().expect("cancel");
        match retry {
            Ok(Admitted::Running { life: joined, owner: false, .. }) => {
                assert!(Arc::ptr_eq(&joined, &life), "joined the execution");
                assert!(!life.outcome().is_set(), "joined, then ended by the other caller: {:?}", life.outcome().get());
                ARRIVED_BEFORE_CANCEL[1].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(Admitted::Running { life: anew, owner: true, .. }) => {
                assert!(!Arc::ptr_eq(&anew, &life), "a new execution");
                assert!(ended_it, "the cancel ended the first execution");
                assert_eq!(code(&life), Some(ErrorCode::Cancelled));
                ARRIVED_BEFORE_CANCEL[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok(Admitted::Retained(_, outcome)) => {
                panic!("a retained outcome of an execution never started: {outcome:?}")
            }
            Err(error) => panic!("refused: {error:?}"),
        }
    });
    let [after, before] = [&ARRIVED_BEFORE_CANCEL[0], &ARRIVED_BEFORE_CANCEL[1]]
        .map(|count| count.load(std::sync::atomic::Ordering::Relaxed));
    assert!(after > 0 && before > 0, "schedules with the retry after the cancel: {after}, before it: {before}");
}

/// Schedules of `h12_a_retry_arriving_as_the_last_caller_cancels_keeps_the_execution_going_or_runs_anew` where the
/// retry ran anew / joined. (std's atomics, outside shuttle: they count across schedules.)
static ARRIVED_BEFORE_CANCEL: [std::sync::atomic::AtomicUsize; 2] =
    [std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0)];

/// An MCP client's conversation its transport stops naming (a handle forgotten) as a call of it is admitted: the
/// call is never cancelled for it, and the conversation ends once that call finishes, rather than staying open
/// with nothing left to name it.
#[test]
fn a_conversation_no_longer_named_ends_once_the_call_admitted_meanwhile_finishes() {
    explore(|| {
        let fixture = fixture();
        let ending = {
            let (host, id) = (fixture.host.clone(), fixture.conversation.clone());
            shuttle::thread::spawn(move || host.conversations.end_once_idle(&id))
        };
        let admitted = call(&fixture);
        let ended_now = ending.join().expect("end_once_idle");
        let status = || fixture.host.conversations.status(&fixture.conversation);
        match admitted {
            Ok(life) if !life.outcome().is_set() => {
                assert!(!ended_now, "a conversation with a call in flight ended");
                assert_eq!(status(), Some(ConversationStatus::WaitingToolResult));
                assert!(finish_ok(&life).join().expect("finish"), "the call's own outcome");
            }
            // Refused: the conversation had ended before the call was one of its calls.
            Ok(life) => assert_eq!(code(&life), Some(ErrorCode::Cancelled)),
            Err(error) => assert_eq!(error.code, ErrorCode::Cancelled, "{error:?}"),
        }
        assert_eq!(status(), Some(ConversationStatus::Ended), "ended once its last call finished");
    });
}

/// The same conversation named again (its client came back) before that call finishes: it stays open.
#[test]
fn a_conversation_named_again_before_its_last_call_finishes_stays_open() {
    once(|| {
        let fixture = fixture();
        let life = call(&fixture).expect("admitted");
        assert!(!fixture.host.conversations.end_once_idle(&fixture.conversation), "a call is in flight");
        fixture.host.conversations.open(&fixture.conversation);
        assert!(finish_ok(&life).join().expect("finish"));
        let status = fixture.host.conversations.status(&fixture.conversation);
        assert_eq!(status, Some(ConversationStatus::Idle), "named again, it stays");
    });
}
