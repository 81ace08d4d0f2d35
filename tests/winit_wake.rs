//! A windowed game whose loop sleeps (winit with reactive updates, as `WinitSettings::desktop_app()` sets: a frame
//! on a window event, else after a long wait) serves an agent's step at once: queueing the step, an `every_frame`
//! step that is not done, a handler awaiting the next frame, or a conversation event on its way to the game's
//! messages wakes winit's event loop (feature `winit`). Under Xvfb, rendering on software Vulkan.
//!
//! The game runs as a windowed game does: in a process of its own, winit on its main thread, and its X server up
//! until the process has ended (the test binary starts itself again as the game: no test harness, `main` below).
//! Its exit status is the verdict: a failed assertion, or any fault up to the process's end, fails the test.

mod common;

use std::ops::ControlFlow;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use bevy::prelude::*;
use bevy::winit::{UpdateMode, WinitSettings};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::{CallOutcome, ConversationStatusChanged, NoArgs};
use common::window::Xvfb;
use common::*;
use serde_json::json;

/// How long the loop sleeps without a window event: longer than a call's deadline (30 s), so a step that waited
/// for the loop's own timer would time out; short enough that a broken wake still ends the test soon (the frame
/// the timer brings sees that the agent's thread gave up and exits).
const SLEEP: Duration = Duration::from_secs(40);
/// How long the test waits for each call before it fails: below a call's deadline (30 s) and the loop's sleep, so
/// a step served only by the loop's own timer still fails it, with room for a loaded machine's slow frames.
const SERVED_WITHIN: Duration = Duration::from_secs(25);

fn tools() -> [AgentTool<Session>; 4] {
    let peek = AgentTool::new("peek", "Reads the counter.", |ctx: CallContext<Session>, _: NoArgs| async move {
        Ok(json!({ "counter": ctx.on_client(|_, session| session.counter).await? }))
    });
    // Needs three frames in a row: each step that is not done asks for the next frame.
    let slide = AgentTool::new(
        "slide",
        "Counts up once a frame, three times.",
        |ctx: CallContext<Session>, _: NoArgs| async move {
            let mut runs = 0;
            ctx.every_frame(move |_, session| {
                session.counter += 1;
                runs += 1;
                if runs == 3 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .await?;
            Ok(json!({}))
        },
    );
    // Waits for two frames without queueing a step.
    let wait = AgentTool::new("wait_frames", "Waits two frames.", |ctx: CallContext<Session>, _: NoArgs| async move {
        ctx.next_frame().await?;
        ctx.next_frame().await?;
        Ok(json!({}))
    });
    let quit = AgentTool::new("quit", "Ends the app.", |ctx: CallContext<Session>, _: NoArgs| async move {
        ctx.on_client(|world, _| world.write_message(AppExit::Success)).await?;
        Ok(json!({}))
    });
    [peek, slide, wait, quit]
}

/// Whether `quit`'s step ran in time. Its step ends the app, so its call either finishes first or the exit closes
/// the visit before the handler returns (`VISIT_ENDED`, as for any call the exit overtakes): both mean served.
fn quit_served(outcome: &Option<CallOutcome>) -> bool {
    match outcome {
        Some(Ok(_)) => true,
        Some(Err(error)) => error.code == ErrorCode::VisitEnded,
        None => false,
    }
}

/// Set in the child process: it is the game.
const GAME: &str = "BEVY_AGENT_TOOLS_WINIT_WAKE_GAME";
const TEST: &str = "a_step_wakes_a_windowed_game_whose_loop_sleeps_and_is_served_at_once";
/// How long the game's process may take, start to end.
const GAME_LIMIT: Duration = Duration::from_secs(600);
/// What the game prints once its checks passed, before its process ends.
const CHECKED: &str = "checks passed";

fn main() -> ExitCode {
    if std::env::var_os(GAME).is_some() {
        a_step_wakes_a_windowed_game_whose_loop_sleeps_and_is_served_at_once();
        println!("{CHECKED}");
        return ExitCode::SUCCESS;
    }
    // What a test harness is asked by test runners: the list, and a name filter.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|arg| arg == "--list") {
        println!("{TEST}: test");
        return ExitCode::SUCCESS;
    }
    if args.iter().any(|arg| !arg.starts_with('-') && !TEST.contains(arg.as_str())) {
        println!("running 0 tests (filtered out: {TEST})");
        return ExitCode::SUCCESS;
    }
    let xvfb = Xvfb::start();
    let exe = std::env::current_exe().expect("the test binary's path");
    let child = Command::new(exe)
        .env(GAME, "1")
        .env("DISPLAY", &xvfb.display)
        .env_remove("WAYLAND_DISPLAY")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("the game starts");
    // The game's own waits are bounded (the window's first frames, each call); this bounds its teardown too.
    let pid = child.id();
    let (ended_tx, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || ended_tx.send(child.wait_with_output()));
    let Ok(Ok(game)) = ended.recv_timeout(GAME_LIMIT) else {
        let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        println!("test {TEST} ... FAILED: the game's process did not end within {GAME_LIMIT:?}");
        return ExitCode::FAILURE;
    };
    drop(xvfb);
    let checked = String::from_utf8_lossy(&game.stdout).lines().any(|line| line == CHECKED);
    match (game.status.success(), checked) {
        (true, true) => {
            println!("test {TEST} ... ok");
            ExitCode::SUCCESS
        }
        (_, false) => {
            println!("test {TEST} ... FAILED: the game's process ended with {} (its checks above)", game.status);
            ExitCode::FAILURE
        }
        // A fault in the process's teardown (the renderer's driver, say) still fails it, said for what it is.
        (false, true) => {
            println!("test {TEST} ... FAILED: its checks passed, then the process ended with {}", game.status);
            ExitCode::FAILURE
        }
    }
}

fn a_step_wakes_a_windowed_game_whose_loop_sleeps_and_is_served_at_once() {
    let mut plugin = AgentToolsPlugin::new(TestGame::default());
    for tool in tools() {
        plugin = plugin.with_tool(tool);
    }
    let mut app = App::new();
    // Bevy's default plugins as a windowed game has them (the renderer on software Vulkan here).
    app.add_plugins(DefaultPlugins)
        .insert_resource(WinitSettings {
            focused_mode: UpdateMode::reactive_low_power(SLEEP),
            unfocused_mode: UpdateMode::reactive_low_power(SLEEP),
        })
        .add_plugins(plugin);
    let agent = app.world().resource::<AgentHandle>().clone();

    // The world opens in the first frame; then the loop sleeps until a window event or a wake.
    let (opened_tx, opened) = mpsc::channel();
    app.add_systems(Startup, |mut enter: MessageWriter<EnterWorld>| {
        enter.write(EnterWorld::new("alpha"));
    });
    app.add_systems(Last, move |agent: Res<AgentHandle>| {
        if agent.visit().is_some() {
            let _ = opened_tx.send(());
        }
    });

    // If the wake is broken the `quit` step is never served in time: the agent's thread says it gave up, and
    // the next frame the loop's own timer brings ends the app.
    let gave_up = Arc::new(AtomicBool::new(false));
    let exit_if_given_up = gave_up.clone();
    app.add_systems(Last, move |mut exit: MessageWriter<AppExit>| {
        if exit_if_given_up.load(Ordering::Acquire) {
            exit.write(AppExit::error());
        }
    });

    // A conversation event published off the main thread (an in-game agent's reply, a permission prompt, a status)
    // reaches the game as a Bevy message in the frame its wake brings.
    let (chat_seen_tx, chat_seen) = mpsc::channel();
    app.add_systems(Last, move |mut statuses: MessageReader<ConversationStatusChanged>| {
        if statuses.read().any(|changed| changed.conversation.as_str() == "chat") {
            let _ = chat_seen_tx.send(());
        }
    });

    let calls = std::thread::spawn(move || {
        // Creating the window and the software renderer before the first frame can take long on a loaded machine.
        let served = opened.recv_timeout(common::window::WAIT).is_ok().then(|| {
            let conversation = agent.conversation("agent");
            let call = |tool: &str| conversation.call(tool, json!({})).wait_timeout(SERVED_WITHIN);
            let (peek, slide, wait) = (call("peek"), call("slide"), call("wait_frames"));
            agent.conversation("chat").turn_started();
            let chat = chat_seen.recv_timeout(SERVED_WITHIN).is_ok();
            (peek, slide, wait, chat, call("quit"))
        });
        if !served.as_ref().is_some_and(|calls| quit_served(&calls.4)) {
            gave_up.store(true, Ordering::Release);
        }
        served
    });
    let exit = app.run();
    let (peek, slide, wait, chat, quit) =
        calls.join().expect("the agent's thread").expect("the world opened in the first frames");
    // (The first call can also be served by the window's first events; the others come once they are over.)
    let served = "served while the loop slept: queueing its step (or asking for a frame) woke the loop";
    assert_eq!(peek.expect(served).expect("peek succeeds").value["counter"], 0);
    assert!(matches!(slide, Some(Ok(_))), "slide, three frames in a row, {served}: {slide:?}");
    assert!(matches!(wait, Some(Ok(_))), "wait_frames, two frames with no step, {served}: {wait:?}");
    assert!(chat, "a conversation's status change reached the game while the loop slept: publishing it woke the loop");
    assert!(quit_served(&quit), "quit {served}: {quit:?}");
    assert_eq!(exit, AppExit::Success);
}
