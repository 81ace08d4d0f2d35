//! Actions over several frames (`CallContext::every_frame`, `next_frame`) and main-thread cleanup when a call ends
//! (`CallContext::on_end`): no timer or tokio in the tool, every frame's step rechecked as `on_client` is (H8),
//! and the producer's cleanup runs while the visit is still open (H10).

mod common;

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bevy::diagnostic::FrameCount;
use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::{AgentTestAppExt, Gate};
use bevy_agent_tools::VisitId;
use common::*;
use parking_lot::Mutex;
use serde_json::json;

type Frames = Arc<Mutex<Vec<u32>>>;

/// Records the frame of each run; done after `runs` runs.
fn slide(scope: ToolScope, runs: usize, frames: Frames) -> AgentTool<Session> {
    AgentTool::new("slide", "Moves one step per frame.", move |ctx: CallContext<Session>, _: NoArgs| {
        let frames = frames.clone();
        async move {
            let ran = ctx
                .every_frame(move |world, session| {
                    let mut frames = frames.lock();
                    frames.push(world.resource::<FrameCount>().0);
                    session.counter += 1;
                    if frames.len() == runs {
                        ControlFlow::Break(frames.len())
                    } else {
                        ControlFlow::Continue(())
                    }
                })
                .await?;
            Ok(json!({ "ran": ran }))
        }
    })
    .scope(scope)
}

#[test]
fn every_frame_runs_its_step_once_per_frame_until_it_says_it_is_done() {
    let frames = Frames::default();
    let mut app = app_with(TestGame::default(), vec![slide(ToolScope::World, 5, frames.clone())]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("slide", json!({}));
    app.wait_for_queued_steps(1);
    for frame in 1..=4 {
        app.update();
        assert_eq!(frames.lock().len(), frame, "one run per frame");
        assert!(call.try_outcome().is_none(), "not done after {frame} runs");
    }
    let output = app.run_until_resolved(&call).expect("success");
    assert_eq!(output.value["ran"], 5);
    let seen = frames.lock().clone();
    assert!(seen.windows(2).all(|pair| pair[1] == pair[0] + 1), "consecutive frames, never two runs in one: {seen:?}");
    app.step(3);
    assert_eq!(frames.lock().len(), 5, "a step that said it was done never runs again");
}

#[test]
fn every_frame_steps_stop_once_nobody_waits_for_them() {
    // A handler that gives up on its action (a timeout won, a select took another branch) and goes on: the
    // action stops, rather than change the world every frame until the call ends.
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let gate = Gate::new();
    let held = gate.clone();
    let tool = AgentTool::new("give_up", "Gives up.", move |ctx: CallContext<Session>, _: NoArgs| {
        let (counted, held) = (counted.clone(), held.clone());
        async move {
            let action = ctx.every_frame(move |_, _| {
                counted.fetch_add(1, Ordering::SeqCst);
                ControlFlow::<()>::Continue(())
            });
            drop(action);
            held.pass().await;
            Ok(())
        }
    });
    let mut app = app_with(TestGame::default(), vec![tool]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("give_up", json!({}));
    app.run_until("the handler waits at its gate", |_| gate.arrived() == 1);
    app.step(3);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the dropped action never ran");
    gate.open();
    app.run_until_resolved(&call).expect("done");
}

/// Between frames (the step point of `serve_steps_until`) an `every_frame` step does not run: a game counting
/// frames would see two runs in one. It runs in the next frame's pump, and a step queued after it waits with it.
#[test]
fn every_frame_steps_run_only_in_the_frames_pump_and_steps_queued_after_them_keep_their_order() {
    let frames = Frames::default();
    let executions = Arc::new(AtomicUsize::new(0));
    let tools = vec![
        slide(ToolScope::World, 3, frames.clone()),
        bump_tool("count", ToolScope::World, executions.clone(), None),
    ];
    let mut app = app_with(TestGame::default(), tools);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("slide", json!({}));
    app.wait_for_queued_steps(1);
    let after = app.agent().conversation("b").call("count", json!({}));
    app.wait_for_queued_steps(2);
    app.serve_steps_until(std::time::Instant::now());
    assert!(frames.lock().is_empty(), "no run between frames");
    assert_eq!(executions.load(Ordering::SeqCst), 0, "the step behind it waits with it");
    app.update();
    assert_eq!(frames.lock().len(), 1, "its first run, in the frame's pump");
    assert_eq!(executions.load(Ordering::SeqCst), 1, "then the step queued after it");
    assert!(after.wait_timeout(bevy_agent_tools::testing::HARNESS_LIMIT).expect("resolved").is_ok());
    app.serve_steps_until(std::time::Instant::now());
    assert_eq!(frames.lock().len(), 1, "not again before the next frame");
    let output = app.run_until_resolved(&call).expect("success");
    assert_eq!(output.value["ran"], 3);
    let seen = frames.lock().clone();
    assert!(seen.windows(2).all(|pair| pair[1] == pair[0] + 1), "one run per frame: {seen:?}");
}

#[test]
fn every_frame_steps_stop_when_a_travel_ends_a_location_call_and_never_run_again() {
    let frames = Frames::default();
    let mut app = app_with(TestGame::default(), vec![slide(ToolScope::Location, 100, frames.clone())]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("slide", json!({}));
    app.wait_for_queued_steps(1);
    app.step(2);
    assert_eq!(frames.lock().len(), 2);
    app.travel("nether");
    assert_eq!(code(&app.run_until_resolved(&call)), Some(ErrorCode::LocationChanged));
    app.step(3);
    assert_eq!(frames.lock().len(), 2, "no run after the travel");
}

#[test]
fn every_frame_steps_stop_when_the_call_is_cancelled_or_its_visit_ends() {
    for end in ["cancel", "exit"] {
        let frames = Frames::default();
        let mut app = app_with(TestGame::default(), vec![slide(ToolScope::World, 100, frames.clone())]);
        app.enter_world("alpha");
        let call = app.agent().conversation("a").call("slide", json!({}));
        app.wait_for_queued_steps(1);
        app.step(2);
        match end {
            "cancel" => assert!(call.cancel()),
            _ => {
                app.exit_world();
            }
        }
        let expected = if end == "cancel" { ErrorCode::Cancelled } else { ErrorCode::VisitEnded };
        assert_eq!(code(&app.run_until_resolved(&call)), Some(expected), "{end}");
        app.step(3);
        assert_eq!(frames.lock().len(), 2, "{end}: no run after the call ended");
    }
}

#[test]
fn every_frame_step_that_panics_ends_the_call_with_internal_and_the_game_runs_on() {
    let tool =
        AgentTool::new("wobble", "Panics in its second frame.", |ctx: CallContext<Session>, _: NoArgs| async move {
            ctx.every_frame(|_, session| {
                session.counter += 1;
                if session.counter == 2 {
                    panic!("wobbled over");
                }
                ControlFlow::<()>::Continue(())
            })
            .await?;
            Ok(())
        });
    let mut app = app_with(TestGame::default(), vec![tool]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("wobble", json!({}));
    let error = app.run_until_resolved(&call).expect_err("panicked");
    assert_eq!(error.code, ErrorCode::Internal);
    assert!(error.message.contains("wobbled over"), "{}", error.message);
    let after = app.agent().conversation("a").call("bump", json!({}));
    assert!(app.run_until_resolved(&after).is_ok(), "the game runs on");
}

#[test]
fn next_frame_resolves_once_per_frame_and_with_the_reason_when_the_call_ends() {
    let frames = Frames::default();
    let seen = frames.clone();
    let walk =
        AgentTool::new("walk", "Takes three steps, one per frame.", move |ctx: CallContext<Session>, _: NoArgs| {
            let seen = seen.clone();
            async move {
                for _ in 0..3 {
                    ctx.next_frame().await?;
                    let frame = ctx.on_client(|world, _| world.resource::<FrameCount>().0).await?;
                    seen.lock().push(frame);
                }
                Ok(())
            }
        });
    let parked = Arc::new(Mutex::new(None));
    let last = parked.clone();
    let waiting = Arc::new(AtomicBool::new(false));
    let started = waiting.clone();
    let wait = AgentTool::new("wait", "Waits for frames forever.", move |ctx: CallContext<Session>, _: NoArgs| {
        let (last, started) = (last.clone(), started.clone());
        async move {
            started.store(true, Ordering::SeqCst);
            loop {
                if let Err(reason) = ctx.next_frame().await {
                    *last.lock() = Some(reason.code.clone());
                    return Err::<(), _>(reason);
                }
            }
        }
    });
    let mut app = app_with(TestGame::default(), vec![walk, wait]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("walk", json!({}));
    assert!(app.run_until_resolved(&call).is_ok());
    let seen = frames.lock().clone();
    assert_eq!(seen.len(), 3);
    assert!(seen.windows(2).all(|pair| pair[1] > pair[0]), "each step in a later frame: {seen:?}");

    let call = app.agent().conversation("a").call("wait", json!({}));
    // Its handler runs on a worker: cancelled before it started, it would never run (and never see the end).
    app.run_until("the handler waits for frames", |_| waiting.load(Ordering::SeqCst));
    app.step(2);
    assert!(call.cancel());
    app.run_until("the handler saw the end", |_| parked.lock().is_some());
    assert_eq!(*parked.lock(), Some(ErrorCode::Cancelled), "next_frame gives the reason the call ended");
}

/// A tool that registers a cleanup recording why its call ended, then waits at `gate` (if any) before its step.
fn with_cleanup(scope: ToolScope, gate: Option<Gate>, record: Arc<Record>) -> AgentTool<Session> {
    AgentTool::new("grab", "Holds something until its call ends.", move |ctx: CallContext<Session>, _: NoArgs| {
        let (gate, record) = (gate.clone(), record.clone());
        async move {
            ctx.on_end(move |world, session, reason| {
                let why = reason.map_or("success".to_string(), |error| error.code.to_string());
                world.resource_mut::<WorldLog>().0.push((session.visit, format!("cleanup {why}")));
                record.events.lock().push(format!("cleanup {why} visit {}", session.visit));
            });
            if let Some(gate) = gate {
                gate.pass().await;
            }
            ctx.on_client(|_, session| session.counter += 1).await?;
            Ok(())
        }
    })
    .scope(scope)
}

fn cleanups(app: &App) -> Vec<String> {
    app.world()
        .resource::<WorldLog>()
        .0
        .iter()
        .map(|(_, what)| what.clone())
        .filter(|w| w.starts_with("cleanup"))
        .collect()
}

#[test]
fn on_end_runs_on_the_main_thread_after_success_and_after_cancel_while_the_visit_is_open() {
    let record = Arc::new(Record::default());
    let game = TestGame { record: record.clone(), ..Default::default() };
    let mut app = app_with(game, vec![with_cleanup(ToolScope::World, None, record.clone())]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("grab", json!({}));
    assert!(app.run_until_resolved(&call).is_ok());
    app.run_until("the cleanup ran", |app| !cleanups(app).is_empty());
    assert_eq!(cleanups(&app), ["cleanup success"]);

    let gate = Gate::new();
    let mut app = app_with(TestGame::default(), vec![with_cleanup(ToolScope::World, Some(gate.clone()), record)]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("grab", json!({}));
    app.run_until("handler parked", |_| gate.arrived() == 1);
    assert!(call.cancel());
    app.step(1);
    assert_eq!(cleanups(&app), ["cleanup CANCELLED"], "ran in the first frame after the cancel");
    app.step(2);
    assert_eq!(cleanups(&app).len(), 1, "once");
}

#[test]
fn on_end_runs_after_a_travel_ends_a_location_call_in_that_frame() {
    let record = Arc::new(Record::default());
    let gate = Gate::new();
    let mut app = app_with(TestGame::default(), vec![with_cleanup(ToolScope::Location, Some(gate.clone()), record)]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("grab", json!({}));
    app.run_until("handler parked", |_| gate.arrived() == 1);
    app.travel("nether"); // one frame: the travel, then the pump
    assert_eq!(code(&call.try_outcome().expect("ended by the travel")), Some(ErrorCode::LocationChanged));
    assert_eq!(cleanups(&app), ["cleanup LOCATION_CHANGED"], "ran in the travel's frame, in the same visit");
    gate.open();
}

#[test]
fn on_end_runs_at_exit_before_close_gets_the_session_and_never_after_the_visit_closed() {
    let record = Arc::new(Record::default());
    let game = TestGame { record: record.clone(), ..Default::default() };
    let gate = Gate::new();
    let mut app = app_with(game, vec![with_cleanup(ToolScope::World, Some(gate.clone()), record.clone())]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("grab", json!({}));
    app.run_until("handler parked", |_| gate.arrived() == 1);
    app.exit_world();
    assert_eq!(code(&call.try_outcome().expect("ended by the exit")), Some(ErrorCode::VisitEnded));
    let events: Vec<String> = record.events().into_iter().filter(|e| !e.starts_with("open")).collect();
    let visit = VisitId(1);
    assert_eq!(
        events,
        [format!("cleanup VISIT_ENDED visit {visit}"), format!("close alpha {visit}")],
        "the cleanup ran before close"
    );

    // A cleanup registered once the visit closed never runs, even when another visit opens.
    let late = Arc::new(Mutex::new(None::<CallContext<Session>>));
    let keep = late.clone();
    let hold = AgentTool::new("hold", "Keeps its context.", move |ctx: CallContext<Session>, _: NoArgs| {
        let keep = keep.clone();
        async move {
            *keep.lock() = Some(ctx.clone());
            ctx.ended().await;
            Ok(())
        }
    });
    app.agent().register_tool(hold).expect("registered");
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("hold", json!({}));
    app.run_until("context kept", |_| late.lock().is_some());
    app.exit_world();
    assert!(call.try_outcome().is_some());
    let ctx = late.lock().take().expect("kept");
    let ran = Arc::new(Mutex::new(false));
    let flag = ran.clone();
    ctx.on_end(move |_, _, _| *flag.lock() = true);
    app.enter_world("beta");
    app.step(3);
    assert!(!*ran.lock(), "a cleanup of a closed visit is dropped unrun");
}

#[test]
fn on_end_registered_after_its_call_ended_still_runs_while_the_visit_is_open() {
    let late = Arc::new(Mutex::new(None::<CallContext<Session>>));
    let keep = late.clone();
    let quick = AgentTool::new(
        "quick",
        "Finishes at once, keeping its context.",
        move |ctx: CallContext<Session>, _: NoArgs| {
            let keep = keep.clone();
            async move {
                *keep.lock() = Some(ctx);
                Ok(())
            }
        },
    );
    let mut app = app_with(TestGame::default(), vec![quick]);
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("quick", json!({}));
    assert!(app.run_until_resolved(&call).is_ok());
    let ctx = late.lock().take().expect("kept");
    let ran = Arc::new(Mutex::new(None));
    let flag = ran.clone();
    ctx.on_end(move |_, session, reason| *flag.lock() = Some((session.visit, reason.is_none())));
    app.step(1);
    let visit = app.agent().visit().expect("open").info.visit;
    assert_eq!(*ran.lock(), Some((visit, true)), "ran in the next frame, told the call succeeded");
}

#[derive(Component)]
struct Marker;

/// The frame each step that moved the marker ran in, and what `Last` saw of it in each frame: (frame, global x).
#[derive(Resource, Clone, Default)]
struct Moves {
    stepped: Arc<Mutex<Vec<u32>>>,
    seen: Arc<Mutex<Vec<(u32, f32)>>>,
}

#[test]
fn a_step_that_moves_an_entity_is_propagated_in_the_frame_it_ran() {
    let moves = Moves::default();
    let stepped = moves.stepped.clone();
    let mover = AgentTool::new("move_it", "Moves the marker.", move |ctx: CallContext<Session>, _: NoArgs| {
        let stepped = stepped.clone();
        async move {
            ctx.on_client(move |world, _| {
                let mut markers = world.query_filtered::<&mut Transform, With<Marker>>();
                for mut transform in markers.iter_mut(world) {
                    transform.translation.x = 5.0;
                }
                stepped.lock().push(world.resource::<FrameCount>().0);
            })
            .await?;
            Ok(())
        }
    });
    let plugin = AgentToolsPlugin::new(TestGame::default()).with_tool(mover);
    let mut app = bevy_agent_tools::testing::headless_app_with(plugin, bevy::transform::TransformPlugin);
    app.insert_resource(moves.clone());
    app.add_systems(
        Last,
        |moves: Res<Moves>, frame: Res<FrameCount>, markers: Query<&GlobalTransform, With<Marker>>| {
            for global in &markers {
                moves.seen.lock().push((frame.0, global.translation().x));
            }
        },
    );
    app.world_mut().spawn((Marker, Transform::default()));
    app.enter_world("alpha");
    let call = app.agent().conversation("a").call("move_it", json!({}));
    app.run_until_resolved(&call).expect("moved");
    let frame = moves.stepped.lock().first().copied().expect("the step ran");
    let seen = moves.seen.lock().iter().find(|(seen, _)| *seen == frame).map(|(_, x)| *x);
    assert_eq!(seen, Some(5.0), "the game's later systems and the renderer see where the step put it");
}
