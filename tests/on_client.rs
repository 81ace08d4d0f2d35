//! Main-thread steps: rechecked as one step (H8), bound to the call's own visit (H9), owned cleanup after the
//! caller stops waiting (H10), panics become INTERNAL (H13), and the per-frame budget.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bevy::diagnostic::FrameCount;
use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{headless_app, headless_app_with, AgentTestAppExt, Gate, HARNESS_LIMIT};
use bevy_agent_tools::{AgentToolsRunnerPlugin, ConversationEvent, NoArgs, PumpStats, RequestId, StepPoints};
use common::*;
use parking_lot::Mutex;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

/// The exit ends the call (H5) and drains the queue of its dead steps before the pump runs; the pump's own
/// recheck of the visit (defence in depth behind this) is tested on its own in `src/call/pump.rs`.
#[test]
fn h5_exit_ends_the_call_and_drains_its_queued_step_before_the_pump_of_that_frame() {
    let executions = Arc::new(AtomicUsize::new(0));
    let mut app = app_with(TestGame::default(), vec![bump_tool("count", ToolScope::World, executions.clone(), None)]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("count", json!({}));
    app.wait_for_queued_steps(1);
    // The exit is applied in AgentToolsSystems::Transitions, before AgentToolsSystems::Pump of the same frame.
    app.exit_world();
    assert_eq!(code(&call.try_outcome().expect("resolved by the exit")), Some(ErrorCode::VisitEnded));
    assert_eq!(app.agent().queued_steps(), 0, "the dead step was dropped, not left queued");
    assert_eq!(app.world().resource::<PumpStats>().last_frame, 0, "the exit drained it: the pump found nothing");
    app.step(3);
    assert_eq!(executions.load(Ordering::SeqCst), 0, "the queued step never ran");
}

/// A call's `is_active()` turns false, and its `report_progress` reaches nobody, once the call ended.
#[test]
fn is_active_and_progress_stop_when_the_call_ends() {
    let gate = Gate::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let reports = Arc::new(AtomicUsize::new(0));
    let tool = {
        let (gate, seen) = (gate.clone(), seen.clone());
        AgentTool::new("watch", "Reports progress around an end.", move |ctx: CallContext<Session>, _: NoArgs| {
            let (gate, seen) = (gate.clone(), seen.clone());
            async move {
                seen.lock().push(ctx.is_active());
                ctx.report_progress(1.0, None, None);
                gate.pass().await;
                ctx.ended().await;
                seen.lock().push(ctx.is_active());
                ctx.report_progress(2.0, None, None);
                seen.lock().push(true); // the handler got past its late report
                Ok(())
            }
        })
    };
    let mut app = app_with(TestGame::default(), vec![tool]);
    app.enter_world("alpha");
    let counter = reports.clone();
    let sink = bevy_agent_tools::ProgressSink::new(move |_| {
        counter.fetch_add(1, Ordering::SeqCst);
    });
    let call =
        app.agent().conversation("a").request(bevy_agent_tools::CallRequest::new("watch", json!({})).progress(sink));
    app.run_until("handler parked", |_| gate.arrived() == 1);
    assert_eq!(reports.load(Ordering::SeqCst), 1, "the report of a live call arrives");
    assert!(call.cancel());
    gate.open();
    app.run_until("the handler went on after the end", |_| seen.lock().len() == 3);
    assert_eq!(*seen.lock(), [true, false, true], "is_active() before and after the end");
    assert_eq!(reports.load(Ordering::SeqCst), 1, "no report after the end");
}

#[test]
fn h8_cancelled_call_step_is_dropped_unrun() {
    let executions = Arc::new(AtomicUsize::new(0));
    let mut app = app_with(TestGame::default(), vec![bump_tool("count", ToolScope::World, executions.clone(), None)]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("count", json!({}));
    app.wait_for_queued_steps(1);
    assert!(call.cancel());
    app.step(2);
    assert_eq!(code(&call.try_outcome().expect("cancelled")), Some(ErrorCode::Cancelled));
    assert_eq!(executions.load(Ordering::SeqCst), 0);
}

/// What a handler's late `on_client` got, written by the handler itself.
type Seen = Arc<Mutex<Option<Result<u64, ErrorCode>>>>;

fn late_tool(gate: Gate, seen: Seen) -> AgentTool<Session> {
    AgentTool::new("late", "Does async work, then touches the world.", move |ctx: CallContext<Session>, _: NoArgs| {
        let (gate, seen) = (gate.clone(), seen.clone());
        async move {
            gate.pass().await;
            let result = ctx
                .on_client(|world, session| {
                    session.counter += 100;
                    world.resource_mut::<WorldLog>().0.push((session.visit, "late".into()));
                    session.counter
                })
                .await;
            *seen.lock() = Some(result.as_ref().map(|c| *c).map_err(|e| e.code.clone()));
            result.map(|_| ())
        }
    })
}

#[test]
fn h9_step_after_the_player_entered_another_world_is_rejected_and_the_new_world_is_untouched() {
    let gate = Gate::new();
    let seen: Seen = Arc::default();
    let mut app = app_with(TestGame::default(), vec![late_tool(gate.clone(), seen.clone())]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("late", json!({}));
    app.run_until("handler parked", |_| gate.arrived() == 1);
    app.enter_world("beta");
    let beta = app.agent().visit().expect("beta open").info.visit;

    gate.open();
    app.run_until("handler finished", |_| seen.lock().is_some());
    assert_eq!(*seen.lock(), Some(Err(ErrorCode::VisitEnded)), "the late step is rejected");
    assert_eq!(code(&call.try_outcome().expect("ended")), Some(ErrorCode::VisitEnded));
    let log = &app.world().resource::<WorldLog>().0;
    assert!(log.iter().all(|(visit, _)| *visit != beta), "beta was never touched: {log:?}");
    let check = app.run_until_resolved(&app.agent().conversation("b").call("bump", json!({}))).expect("ok");
    assert_eq!(check.value["counter"], 1, "beta's session counter was untouched by the late step");
}

#[derive(Default)]
struct Cleanup {
    started: AtomicUsize,
    cleaned: AtomicUsize,
    touched: AtomicUsize,
    late_step: Mutex<Option<ErrorCode>>,
}

#[test]
fn h10_handler_whose_caller_stopped_waiting_still_cleans_up_and_never_touches_the_world() {
    let cleanup = Arc::new(Cleanup::default());
    let state = cleanup.clone();
    let tool = AgentTool::new("download", "Long I/O.", move |ctx: CallContext<Session>, _: NoArgs| {
        let state = state.clone();
        async move {
            // Work accepted: the handler owns it from here.
            state.started.fetch_add(1, Ordering::SeqCst);
            let reason = ctx.ended().await;
            // The caller stopped waiting; release what was started (async, like closing a file).
            tokio::task::yield_now().await;
            state.cleaned.fetch_add(1, Ordering::SeqCst);
            let touch = state.clone();
            let late = ctx.on_client(move |_, _| touch.touched.fetch_add(1, Ordering::SeqCst)).await;
            *state.late_step.lock() = late.err().map(|e| e.code);
            Err::<(), _>(reason)
        }
    });
    let mut app = app_with(TestGame::default(), vec![tool]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("download", json!({}));
    app.run_until("work started", |_| cleanup.started.load(Ordering::SeqCst) == 1);
    drop(call); // The caller stops waiting: the call is cancelled and `ended()` fires.
    app.run_until("cleanup finished", |_| cleanup.late_step.lock().is_some());
    assert_eq!(cleanup.cleaned.load(Ordering::SeqCst), 1, "the handler finished its cleanup");
    assert_eq!(*cleanup.late_step.lock(), Some(ErrorCode::Cancelled));
    app.step(3);
    assert_eq!(cleanup.touched.load(Ordering::SeqCst), 0, "nothing it did afterwards touched the world");
}

#[test]
fn h13_panic_in_handler_gives_internal_and_the_app_keeps_updating() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let error = app.run_until_resolved(&app.agent().conversation("a").call("panics", json!({}))).expect_err("panics");
    assert_eq!(error.code, ErrorCode::Internal);
    assert!(error.message.contains("handler exploded"));
    app.step(3);
    assert!(app.run_until_resolved(&app.agent().conversation("a").call("bump", json!({}))).is_ok());
}

#[test]
fn h13_panic_before_the_handlers_first_await_gives_internal_and_the_app_keeps_updating() {
    // The handler function itself panics while building its future (synchronous code before any `async`).
    let eager =
        AgentTool::new("eager_panic", "Panics before returning its future.", |_: CallContext<Session>, _: NoArgs| {
            if true {
                panic!("panicked while starting");
            }
            async { Ok(()) }
        });
    let mut app = app_with(TestGame::default(), vec![eager]);
    app.enter_world("alpha");
    let error =
        app.run_until_resolved(&app.agent().conversation("a").call("eager_panic", json!({}))).expect_err("panics");
    assert_eq!(error.code, ErrorCode::Internal);
    assert!(error.message.contains("panicked while starting"), "{}", error.message);
    let output = app.run_until_resolved(&app.agent().conversation("a").call("bump", json!({}))).expect("still works");
    assert_eq!(output.value["counter"], 1);
}

#[test]
fn h10_a_handler_that_panics_while_cleaning_up_after_its_call_ended_harms_nothing() {
    /// Counts its drop: the handler's future unwound by its panic.
    struct Unwound(Arc<AtomicUsize>);
    impl Drop for Unwound {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let gate = Gate::new();
    let (cleaning, unwound) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let tool = AgentTool::new("cleanup_panics", "Panics in its cleanup.", {
        let (gate, cleaning, unwound) = (gate.clone(), cleaning.clone(), unwound.clone());
        move |ctx: CallContext<Session>, _: NoArgs| {
            let (gate, cleaning, unwound) = (gate.clone(), cleaning.clone(), unwound.clone());
            async move {
                let _unwound = Unwound(unwound);
                gate.pass().await;
                ctx.ended().await;
                cleaning.fetch_add(1, Ordering::SeqCst);
                if true {
                    panic!("cleanup exploded");
                }
                Ok(())
            }
        }
    });
    let mut app = app_with(TestGame::default(), vec![tool]);
    let mut events = app.agent().subscribe();
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("cleanup_panics", json!({}));
    app.run_until("handler started", |_| gate.arrived() == 1);
    assert!(call.cancel());
    gate.open();
    assert_eq!(code(&call.try_outcome().expect("cancelled at once")), Some(ErrorCode::Cancelled));
    app.run_until("the handler panicked in its cleanup", |_| unwound.load(Ordering::SeqCst) == 1);
    assert_eq!(cleaning.load(Ordering::SeqCst), 1);
    let output = app.run_until_resolved(&app.agent().conversation("a").call("bump", json!({}))).expect("still works");
    assert_eq!(output.value["counter"], 1);
    // The call had its one outcome: the panic after it is not another.
    let finished: Vec<_> = events
        .drain()
        .into_iter()
        .filter_map(|event| match event {
            bevy_agent_tools::ConversationEvent::CallFinished(finished) if finished.tool == "cleanup_panics" => {
                Some(finished.code)
            }
            _ => None,
        })
        .collect();
    assert_eq!(finished, [Some(ErrorCode::Cancelled)]);
}

#[test]
fn h13_panic_in_on_client_step_gives_internal_and_the_app_keeps_updating() {
    let mut app = app_with(TestGame::default(), vec![]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("panics_on_client", json!({}));
    let error = app.run_until_resolved(&call).expect_err("panics");
    assert_eq!(error.code, ErrorCode::Internal);
    assert!(error.message.contains("step exploded"));
    app.step(3);
    let output = app.run_until_resolved(&app.agent().conversation("a").call("bump", json!({}))).expect("still works");
    assert_eq!(output.value["counter"], 1);
}

#[test]
fn h13_every_call_ends_with_exactly_one_outcome_even_when_its_caller_and_visit_race() {
    let (mut app, gate, _) = gated_app("slow", ToolScope::World);
    let mut events = app.agent().subscribe();
    let conversation = app.agent().conversation("a");
    let calls: Vec<_> = (0..20).map(|_| conversation.call("slow", json!({}))).collect();
    app.run_until("parked", |_| gate.arrived() == 20);
    // Every second call is cancelled on another thread while the game ends the visit under them.
    let start = std::sync::Barrier::new(2);
    let (cancelling, kept): (Vec<_>, Vec<_>) = calls.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
    let (cancelling, cancelled): (Vec<_>, Vec<bool>) = std::thread::scope(|scope| {
        let canceller = scope.spawn(|| {
            start.wait();
            let cancelled = cancelling.iter().map(|(_, call)| call.cancel()).collect();
            (cancelling, cancelled)
        });
        start.wait();
        gate.open();
        app.exit_world();
        canceller.join().expect("the cancelling thread")
    });
    let mut calls: Vec<_> = cancelling.into_iter().chain(kept).collect();
    calls.sort_by_key(|(i, _)| *i);
    let calls: Vec<_> = calls.into_iter().map(|(_, call)| call).collect();
    app.step(2);
    let mut finished: std::collections::BTreeMap<RequestId, Vec<Option<ErrorCode>>> = Default::default();
    while let Some(event) = events.try_next() {
        if let ConversationEvent::CallFinished(done) = event {
            finished.entry(done.request).or_default().push(done.code);
        }
    }
    for (i, call) in calls.iter().enumerate() {
        let outcome = call.try_outcome().expect("every call ended");
        let expected = match i % 2 {
            // A cancel that ended the call made it CANCELLED; one that came after the visit's end changed nothing.
            0 if cancelled[i / 2] => ErrorCode::Cancelled,
            _ => ErrorCode::VisitEnded,
        };
        assert_eq!(code(&outcome), Some(expected.clone()), "call {i}'s outcome is the one that ended it");
        let request = call.request_id().expect("an admitted call has a request id");
        assert_eq!(finished.get(&request), Some(&vec![Some(expected)]), "call {i} finished once, with its outcome");
    }
    assert_eq!(finished.len(), calls.len(), "no other call finished");
}

#[derive(Deserialize, JsonSchema)]
struct Burst {
    steps: usize,
    #[serde(default)]
    spin_micros: u64,
}

fn burst_app(budget: Duration, order: Arc<Mutex<Vec<usize>>>) -> App {
    burst_app_at(budget, StepPoints::default(), order)
}

fn burst_app_at(budget: Duration, points: StepPoints, order: Arc<Mutex<Vec<usize>>>) -> App {
    let tool = AgentTool::new("burst", "Queues many steps.", move |ctx: CallContext<Session>, args: Burst| {
        let order = order.clone();
        async move {
            let spin = Duration::from_micros(args.spin_micros);
            let steps: Vec<_> = (0..args.steps)
                .map(|i| {
                    let order = order.clone();
                    ctx.on_client(move |_, _| {
                        let started = Instant::now();
                        while started.elapsed() < spin {
                            std::hint::spin_loop();
                        }
                        order.lock().push(i);
                    })
                })
                .collect();
            for step in steps {
                step.await?;
            }
            Ok(())
        }
    });
    let plugin = AgentToolsPlugin::new(TestGame::default()).pump_budget(budget).step_points(points).with_tool(tool);
    let mut app = headless_app(plugin);
    app.enter_world("alpha");
    app
}

#[test]
fn budget_ten_thousand_steps_run_across_frames_in_fifo_order_and_none_is_lost() {
    let order = Arc::new(Mutex::new(Vec::new()));
    // A zero budget still runs one step per frame: each frame stops at the budget.
    let mut app = burst_app(Duration::ZERO, order.clone());
    let call = app.agent().conversation("a").call("burst", json!({ "steps": 10_000 }));
    app.wait_for_queued_steps(10_000);
    for frame in 0..10_000 {
        app.update();
        let stats = *app.world().resource::<PumpStats>();
        assert_eq!(stats.last_frame, 1, "frame {frame} ran past its budget");
        assert_eq!(stats.left_queued, 9_999 - frame, "what did not fit stays queued");
    }
    assert!(app.run_until_resolved(&call).is_ok());
    assert_eq!(*order.lock(), (0..10_000).collect::<Vec<_>>(), "all ran, in FIFO order");
}

#[test]
fn budget_every_frame_steps_that_spend_the_frames_budget_still_leave_a_queued_step_its_turn_each_frame() {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let busy =
        AgentTool::new("busy", "Works every frame until cancelled.", move |ctx: CallContext<Session>, _: NoArgs| {
            let counted = counted.clone();
            async move {
                ctx.every_frame(move |_, _| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    std::ops::ControlFlow::<()>::Continue(())
                })
                .await?;
                Ok(())
            }
        });
    let bumps = Arc::new(AtomicUsize::new(0));
    // A zero budget: each frame's budget is spent by its first step, the repeating one.
    let plugin = AgentToolsPlugin::new(TestGame::default())
        .pump_budget(Duration::ZERO)
        .with_tool(busy)
        .with_tool(bump_tool("bump", ToolScope::World, bumps.clone(), None));
    let mut app = headless_app(plugin);
    app.enter_world("alpha");
    let agent = app.agent();
    let busy = agent.conversation("a").call("busy", json!({}));
    app.wait_for_queued_steps(1);
    app.update();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the repeating step runs from now on, every frame");

    let bump = agent.conversation("b").call("bump", json!({}));
    app.wait_for_queued_steps(1);
    app.update();
    assert_eq!(bumps.load(Ordering::SeqCst), 1, "the queued step ran in the next frame, not after the repeating one");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "and so did the repeating step");
    assert!(app.run_until_resolved(&bump).is_ok());
    busy.cancel();
    assert_eq!(code(&app.run_until_resolved(&busy)), Some(ErrorCode::Cancelled));
}

#[test]
fn budget_a_frame_stops_once_its_time_is_spent() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut app = burst_app(Duration::from_millis(1), order.clone());
    // Each step takes at least 250 µs, so at most four fit in a 1 ms budget, however slow the machine.
    let call = app.agent().conversation("a").call("burst", json!({ "steps": 40, "spin_micros": 250 }));
    app.wait_for_queued_steps(40);
    let mut frames = 0;
    while order.lock().len() < 40 {
        app.update();
        frames += 1;
        let ran = app.world().resource::<PumpStats>().last_frame;
        assert!((1..=4).contains(&ran), "frame {frames} ran {ran} steps");
    }
    assert!(frames >= 10);
    assert!(app.run_until_resolved(&call).is_ok());
    assert_eq!(*order.lock(), (0..40).collect::<Vec<_>>());
}

#[test]
fn details_the_handler_recorded_reach_the_error_that_ended_the_call() {
    let gate = Gate::new();
    let passed = gate.clone();
    let tool =
        AgentTool::new("tower", "Places blocks until it is stopped.", move |ctx: CallContext<Session>, _: NoArgs| {
            let gate = passed.clone();
            async move {
                for placed in 1..=2u32 {
                    ctx.on_client(|_, session| session.counter += 1).await?;
                    ctx.set_detail("placed", placed);
                }
                ctx.set_detail("tool", "pickaxe");
                gate.pass().await;
                Ok(())
            }
        })
        .scope(ToolScope::Location);
    let mut app = app_with(TestGame::default(), vec![tool]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("tower", json!({}));
    app.run_until("two blocks placed", |_| gate.arrived() == 1);
    app.travel("nether");
    let error = app.run_until_resolved(&call).expect_err("ended by the travel");
    assert_eq!(error.code, ErrorCode::LocationChanged);
    assert_eq!(error.details.extra["placed"], 2, "the agent learns what was already done");
    assert_eq!(error.details.tool.as_deref(), Some("tower"), "a detail named as a coordinate never replaces it");
    assert_eq!(error.details.extra["detail_tool"], "pickaxe", "it is kept beside it");
}

// Step points: the frame's pump, and the wait between frames (`serve_steps_until`, `AgentToolsRunnerPlugin`).

fn frame_count(app: &App) -> u32 {
    app.world().resource::<FrameCount>().0
}

#[test]
fn points_steps_between_frames_run_in_queue_order_without_a_frame() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut app = burst_app(Duration::from_secs(10), order.clone());
    let frame = frame_count(&app);
    let call = app.agent().conversation("a").call("burst", json!({ "steps": 100 }));
    app.wait_for_queued_steps(100);
    app.serve_steps_until(Instant::now());
    assert_eq!(*order.lock(), (0..100).collect::<Vec<_>>(), "all ran between frames, in FIFO order");
    assert_eq!(frame_count(&app), frame, "no frame ran");
    assert_eq!(app.world().resource::<PumpStats>().last_frame, 100, "counted in the frame before");
    assert!(call.wait_timeout(HARNESS_LIMIT).expect("resolved without a frame").is_ok());
}

#[test]
fn points_steps_between_frames_spend_only_what_the_frames_pump_left_of_its_budget() {
    let order = Arc::new(Mutex::new(Vec::new()));
    // A zero budget: the frame's pump runs its one step, nothing is left for between frames.
    let mut app = burst_app(Duration::ZERO, order.clone());
    let call = app.agent().conversation("a").call("burst", json!({ "steps": 3 }));
    app.wait_for_queued_steps(3);
    app.serve_steps_until(Instant::now());
    assert!(order.lock().is_empty(), "the frame's empty pump already spent a zero budget");
    app.update();
    assert_eq!(order.lock().len(), 1, "one step per frame");
    app.serve_steps_until(Instant::now());
    assert_eq!(order.lock().len(), 1, "none between frames");
    app.step(2);
    assert!(app.run_until_resolved(&call).is_ok());
    assert_eq!(*order.lock(), vec![0, 1, 2]);

    // 1 ms: steps of at least 250 µs each, queued after the frame's pump found nothing, run between frames until
    // the budget is spent (at most four), and no more until the next frame opens a new budget.
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut app = burst_app(Duration::from_millis(1), order.clone());
    let call = app.agent().conversation("a").call("burst", json!({ "steps": 40, "spin_micros": 250 }));
    app.wait_for_queued_steps(40);
    app.serve_steps_until(Instant::now());
    let between = order.lock().len();
    // At most four; none at all if this shared machine descheduled the test past the budget (that steps run
    // between frames at all is shown above, with a budget that never runs out).
    assert!(between <= 4, "{between} steps ran between frames");
    app.serve_steps_until(Instant::now());
    assert_eq!(order.lock().len(), between, "the frame's budget is spent: nothing more until the next frame");
    let mut frames = 0;
    while order.lock().len() < 40 {
        let before = order.lock().len();
        app.update();
        app.serve_steps_until(Instant::now());
        frames += 1;
        let ran = order.lock().len() - before;
        assert!((1..=4).contains(&ran), "frame {frames} and the wait after it ran {ran} steps");
        assert_eq!(app.world().resource::<PumpStats>().last_frame, ran, "both points counted in one frame");
    }
    assert!(app.run_until_resolved(&call).is_ok());
    assert_eq!(*order.lock(), (0..40).collect::<Vec<_>>());
}

#[test]
fn points_a_step_is_rechecked_right_before_it_runs_between_frames() {
    let executions = Arc::new(AtomicUsize::new(0));
    let quick = bump_tool("quick", ToolScope::World, executions.clone(), None).timeout(Duration::from_millis(50));
    let tools = vec![bump_tool("count", ToolScope::World, executions.clone(), None), quick];
    let mut app = app_with(TestGame::default(), tools);
    app.enter_world("alpha");

    let cancelled = app.agent().conversation("a").call("count", json!({}));
    app.wait_for_queued_steps(1);
    assert!(cancelled.cancel());
    app.serve_steps_until(Instant::now());
    assert_eq!(app.agent().queued_steps(), 0, "taken off the queue");
    assert_eq!(executions.load(Ordering::SeqCst), 0, "a cancelled call's step never runs");
    assert_eq!(code(&cancelled.try_outcome().expect("ended")), Some(ErrorCode::Cancelled));

    let late = app.agent().conversation("a").call("quick", json!({}));
    app.wait_for_queued_steps(1);
    let outcome = late.wait_timeout(HARNESS_LIMIT).expect("the deadline ends the call without a frame");
    assert_eq!(code(&outcome), Some(ErrorCode::Timeout));
    app.serve_steps_until(Instant::now());
    assert_eq!(executions.load(Ordering::SeqCst), 0, "a timed-out call's step never runs");

    let live = app.agent().conversation("a").call("count", json!({}));
    app.wait_for_queued_steps(1);
    app.serve_steps_until(Instant::now());
    assert!(live.wait_timeout(HARNESS_LIMIT).expect("resolved").is_ok());
    assert_eq!(executions.load(Ordering::SeqCst), 1, "a live call's step runs");
}

#[test]
fn points_a_game_configured_for_one_point_runs_steps_only_in_the_frames_pump() {
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut app = burst_app_at(Duration::from_secs(10), StepPoints::OncePerFrame, order.clone());
    let call = app.agent().conversation("a").call("burst", json!({ "steps": 3 }));
    app.wait_for_queued_steps(3);
    app.serve_steps_until(Instant::now());
    assert!(order.lock().is_empty(), "nothing runs between frames");
    assert_eq!(app.agent().queued_steps(), 3);
    app.update();
    assert_eq!(*order.lock(), vec![0, 1, 2], "the frame's pump runs them");
    assert!(app.run_until_resolved(&call).is_ok());
}

#[test]
fn points_the_runner_warns_when_a_schedule_runner_added_after_it_took_its_place() {
    let build = |runner_first: bool| {
        common::warnings::with_warnings(|| {
            let mut app = App::new();
            let runner = AgentToolsRunnerPlugin::run_loop(Duration::from_millis(16));
            if runner_first {
                app.add_plugins(runner).add_plugins(MinimalPlugins);
            } else {
                app.add_plugins(MinimalPlugins).add_plugins(runner);
            }
            app.add_plugins(AgentToolsPlugin::new(TestGame::default()));
            app.finish();
        })
        .1
    };
    let replaced = build(true);
    assert!(replaced.iter().any(|line| line.contains("replaced its loop")), "{replaced:?}");
    let in_place = build(false);
    assert!(!in_place.iter().any(|line| line.contains("AgentToolsRunnerPlugin")), "{in_place:?}");
}

/// The runner's frames are an hour apart: only a step served between frames lets these calls finish.
#[test]
fn points_the_runner_serves_steps_between_frames_and_a_step_that_exits_ends_the_wait() {
    let frame_of_step =
        AgentTool::new("frame", "The frame count.", |ctx: CallContext<Session>, _: NoArgs| async move {
            ctx.on_client(|world, _| world.resource::<FrameCount>().0).await
        });
    let quit = AgentTool::new("quit", "Quits the game.", |ctx: CallContext<Session>, _: NoArgs| async move {
        ctx.on_client(|world, _| {
            world.write_message(AppExit::Success);
        })
        .await
    });
    let (agent_tx, agent_rx) = crossbeam_channel::bounded(1);
    let (exit_tx, exit_rx) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        // Every step of this test runs in the one wait between two frames: a budget it never spends.
        let plugin = AgentToolsPlugin::new(TestGame::default())
            .pump_budget(Duration::from_secs(10))
            .with_tool(frame_of_step)
            .with_tool(quit);
        let mut app = headless_app_with(plugin, AgentToolsRunnerPlugin::run_loop(Duration::from_secs(3600)));
        app.enter_world("alpha");
        let _ = agent_tx.send(app.agent());
        let _ = exit_tx.send(app.run());
    });
    let agent = agent_rx.recv_timeout(HARNESS_LIMIT).expect("the game started");
    let conversation = agent.conversation("a");
    // Once this one ran, the runner is past its first frame: the next frame is an hour away.
    conversation.call("frame", json!({})).wait_timeout(HARNESS_LIMIT).expect("served").expect("ok");
    let first = conversation.call("frame", json!({})).wait_timeout(HARNESS_LIMIT).expect("served between frames");
    let second = conversation.call("frame", json!({})).wait_timeout(HARNESS_LIMIT).expect("served between frames");
    let (first, second) = (first.expect("ok").value, second.expect("ok").value);
    assert_eq!(first, second, "both in the same wait between two frames");
    let quit = conversation.call("quit", json!({}));
    assert_eq!(exit_rx.recv_timeout(HARNESS_LIMIT).expect("the game exited at once"), AppExit::Success);
    assert!(quit.wait_timeout(HARNESS_LIMIT).is_some(), "the quit call ended too");
}

#[test]
fn steps_late_frames_kept_waiting_are_warned_of_once_unless_the_game_can_be_woken_or_it_was_one_hitch() {
    // `late` of every 4 frames come 5 s after the one before.
    let warned = |woken: bool, late: usize| {
        let ((), said) = common::warnings::with_warnings(|| {
            let executions = Arc::new(AtomicUsize::new(0));
            let mut app = app_with(TestGame::default(), vec![bump_tool("bump", ToolScope::World, executions, None)]);
            app.enter_world("alpha");
            if woken {
                app.agent().set_wake(|| ());
            }
            // A loop that sleeps between window events: each frame comes 5 s after the one before; or a hitch.
            for frame in 0..4 {
                let gap = if frame < late { Duration::from_secs(5) } else { Duration::from_millis(16) };
                app.insert_resource(bevy::time::TimeUpdateStrategy::ManualDuration(gap));
                let call = app.agent().conversation("a").call("bump", serde_json::json!({}));
                let until = Instant::now() + HARNESS_LIMIT;
                while app.agent().queued_steps() == 0 {
                    assert!(Instant::now() < until, "the step was never queued");
                    std::thread::yield_now();
                }
                app.update();
                assert!(app.run_until_resolved(&call).is_ok());
            }
        });
        said.iter().filter(|line| line.contains("`winit` feature")).count()
    };
    assert_eq!(warned(false, 4), 1, "said once");
    assert_eq!(warned(true, 4), 0, "a game that wakes its loop is served at once");
    assert_eq!(warned(false, 1), 0, "one late frame is a hitch (a level loading), not a loop that sleeps");
}
