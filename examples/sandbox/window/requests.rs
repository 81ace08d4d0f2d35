//! The window's console commands: `screenshot PATH` (the window as a PNG, through Bevy's screenshot), `hud` (the
//! text the HUD and the chat panel show), `frames` (frame times, the host's time per frame, and the chunk
//! snapshot and mesh times of re-meshing, since the last `frames`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use bevy::prelude::*;
use bevy::render::view::screenshot::{Screenshot, ScreenshotCaptured};

use super::chat_panel::ChatPanelText;
use super::chunks::ChunkMeshes;
use super::hud::HudText;
use crate::chat::one_line;
use crate::console::{say, WindowCommand, WindowRequest};
use crate::view::{record_time, WorldView};

/// Every frame's length since the last `frames` (the newest [`TIMES_KEPT`](crate::view::TIMES_KEPT)), and the
/// time the host's systems took in each.
#[derive(Resource, Default)]
pub struct FrameTimes {
    frames: Vec<Duration>,
    host: Vec<Duration>,
    host_started: Option<Instant>,
}

pub fn record_frame(time: Res<Time<Real>>, mut frames: ResMut<FrameTimes>) {
    if time.delta() > Duration::ZERO {
        record_time(&mut frames.frames, time.delta());
    }
}

/// Runs right before the host's sets (`AgentToolsSystems::Transitions`, then `Pump`).
pub fn host_started(mut frames: ResMut<FrameTimes>) {
    frames.host_started = Some(Instant::now());
}

/// Runs right after them: the host's main-thread time this frame (with whatever ran in between on the same
/// schedule; an upper bound).
pub fn host_finished(mut frames: ResMut<FrameTimes>) {
    if let Some(started) = frames.host_started.take() {
        record_time(&mut frames.host, started.elapsed());
    }
}

pub fn answer(
    mut commands: Commands,
    mut requests: MessageReader<WindowRequest>,
    mut frames: ResMut<FrameTimes>,
    mut meshes: ResMut<ChunkMeshes>,
    mut view: ResMut<WorldView>,
    hud: Query<&Text, With<HudText>>,
    chat: Query<&Text, With<ChatPanelText>>,
) {
    for WindowRequest(command) in requests.read() {
        match command {
            WindowCommand::Screenshot(path) => {
                let path = PathBuf::from(path);
                commands
                    .spawn(Screenshot::primary_window())
                    .observe(move |captured: On<ScreenshotCaptured>| save(&path, &captured.image));
            }
            WindowCommand::Hud => {
                let text = |text: Result<&Text, _>| text.map(|t| one_line(&t.0)).unwrap_or_default();
                say(format_args!("ok hud {} | chat {}", text(hud.single()), text(chat.single())));
            }
            WindowCommand::Frames { each } => {
                let every = if *each {
                    let times = frames.frames.iter().map(|t| format!("{:.2}", t.as_secs_f64() * 1e3));
                    format!(" each_ms={}", times.collect::<Vec<_>>().join(","))
                } else {
                    String::new()
                };
                let frame = stats(&mut frames.frames);
                let host = stats(&mut frames.host);
                let mesh = stats(&mut meshes.mesh_times);
                let snapshot = stats(&mut view.snapshot_times);
                say(format_args!("ok frames {frame} host {host} snapshot {snapshot} mesh {mesh}{every}"));
            }
        }
    }
}

fn save(path: &std::path::Path, image: &Image) {
    let written = image.clone().try_into_dynamic().map_err(|e| e.to_string()).and_then(|picture| {
        let rgb = picture.to_rgb8();
        rgb.save(path).map(|()| (rgb.width(), rgb.height())).map_err(|e| e.to_string())
    });
    match written {
        Ok((width, height)) => say(format_args!("ok screenshot {} {width}x{height}", path.display())),
        Err(error) => say(format_args!("error: screenshot {}: {}", path.display(), one_line(&error))),
    }
}

/// `n=N median_ms=M p99_ms=P max_ms=X` of `times`, which it empties.
fn stats(times: &mut Vec<Duration>) -> String {
    let mut sorted: Vec<f64> = times.drain(..).map(|t| t.as_secs_f64() * 1e3).collect();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| sorted.get(((sorted.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0.0);
    format!("n={} median_ms={:.3} p99_ms={:.3} max_ms={:.3}", sorted.len(), at(0.5), at(0.99), at(1.0))
}
