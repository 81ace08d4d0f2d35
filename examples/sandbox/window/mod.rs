//! `--window` (feature `window`): the sandbox in a real Bevy window, with full `DefaultPlugins`. Everything the
//! headless sandbox does stays (console, lines, tools, saves, MCP); the window adds the world in 3D (`chunks`,
//! `mesh`, `camera`), a HUD fed by the crate's messages (`hud`), the chat panel (`chat_panel`), keys for the
//! player's world transitions (`keys`), and the console commands `screenshot`, `hud` and `frames` (`requests`).
//! Closing the window is `quit`: the visit closes, its save completes, and the process exits 0.

mod camera;
mod chat_panel;
mod chunks;
mod hud;
mod keys;
mod mesh;
mod requests;

use std::path::PathBuf;
use std::sync::Arc;

use bevy::app::PluginGroupBuilder;
use bevy::prelude::*;
use bevy::window::{ExitCondition, WindowCloseRequested, WindowResolution};
use bevy_agent_tools::AgentToolsSystems;

use crate::console::ConsoleLines;
use crate::view::WorldView;
use crate::world::Palette;

/// The window's font (see `SandboxWindow::build`).
const FONT: &[u8] = include_bytes!("../../../assets/fonts/FiraMono-Medium.ttf");

/// Where the keyboard goes.
#[derive(Resource, Default, Clone, Copy, PartialEq, Eq, Debug)]
pub enum Focus {
    /// WASD walks, L lists worlds, P travels, Esc leaves the world, T opens the chat.
    #[default]
    World,
    /// The chat panel's input line.
    Chat,
    /// The world list: a digit enters a world.
    WorldList,
}

/// Bevy's default plugins for the window: closing it asks the sandbox to quit instead of closing at once, so
/// the visit's save completes first.
pub fn default_plugins() -> PluginGroupBuilder {
    DefaultPlugins.set(bevy::window::WindowPlugin {
        primary_window: Some(Window {
            title: "bevy_agent_tools sandbox".into(),
            resolution: WindowResolution::new(1280, 720),
            ..default()
        }),
        exit_condition: ExitCondition::DontExit,
        close_when_requested: false,
        ..default()
    })
}

/// The window's systems and resources.
pub struct SandboxWindow {
    pub palette: Arc<Palette>,
    pub data_dir: PathBuf,
}

impl Plugin for SandboxWindow {
    fn build(&self, app: &mut App) {
        let air = self.palette.kind(crate::world::AIR).rgb;
        bevy::asset::load_internal_asset!(app, chunks::BLOCKS_SHADER, "blocks.wgsl", Shader::from_wgsl);
        app.add_plugins(MaterialPlugin::<chunks::BlockMaterial>::default());
        app.insert_resource(ClearColor(Color::srgb_u8(air[0], air[1], air[2])))
            .insert_resource(chunks::MeshPalette(self.palette.clone()))
            .insert_resource(keys::DataDir(self.data_dir.clone()))
            .init_resource::<WorldView>()
            .init_resource::<Focus>()
            // Written by the chat module when there is an agent (`--agent`): the panel reads it either way.
            .add_message::<crate::chat::ChatAnswered>()
            .init_resource::<chunks::ChunkMeshes>()
            .init_resource::<hud::Hud>()
            .init_resource::<chat_panel::ChatPanel>()
            .init_resource::<keys::WorldList>()
            .init_resource::<camera::Stride>()
            .init_resource::<requests::FrameTimes>()
            .add_systems(Startup, (chunks::setup, camera::setup, hud::setup, chat_panel::setup, keys::setup))
            .add_systems(First, requests::record_frame)
            .add_systems(PostUpdate, requests::host_started.before(AgentToolsSystems::Transitions))
            .add_systems(PostUpdate, requests::host_finished.after(AgentToolsSystems::Pump))
            .add_systems(Update, (chat_panel::type_keys, keys::transitions, camera::walk, close_is_quit).chain())
            .add_systems(
                PostUpdate,
                // After the host's steps, which run before transforms propagate: a block placed is meshed and
                // drawn in the frame its step ran.
                (chunks::sync_chunks, camera::orbit)
                    .chain()
                    .after(AgentToolsSystems::Pump)
                    .before(bevy::transform::TransformSystems::Propagate),
            )
            .add_systems(
                PostUpdate,
                (
                    (hud::read_messages, hud::draw).chain(),
                    (chat_panel::read_answers, chat_panel::read_messages, chat_panel::draw).chain(),
                    keys::draw_list,
                    requests::answer,
                )
                    .after(AgentToolsSystems::Pump)
                    .before(bevy::ui::UiSystems::Prepare),
            );
    }

    /// Bevy's default font has ASCII only, and agents write dashes, curly quotes and accents: the window's text
    /// uses Fira Mono (SIL Open Font License 1.1: `assets/fonts/FiraMono-LICENSE`) in its place, which has Latin,
    /// Greek and Cyrillic with their punctuation. Set once every plugin is built (Bevy's `TextPlugin` sets its own
    /// there), before the first frame loads it.
    fn finish(&self, app: &mut App) {
        let set = app.world_mut().get_resource_mut::<Assets<Font>>().map(|mut fonts| {
            fonts.insert(AssetId::default(), Font::from_bytes(FONT.to_vec())).map_err(|error| error.to_string())
        });
        match set {
            Some(Ok(())) => {}
            Some(Err(error)) => warn!("the window's font could not be set, Bevy's ASCII one stays: {error}"),
            None => warn!("the window has no fonts (Bevy's `TextPlugin` is missing): its text is not drawn"),
        }
    }
}

/// Closing the window is the console's `quit`.
fn close_is_quit(
    mut requests: MessageReader<WindowCloseRequested>,
    console: Res<ConsoleLines>,
    mut asked: Local<bool>,
) {
    if requests.read().count() > 0 && !*asked {
        *asked = true;
        console.send("quit");
    }
}

#[cfg(test)]
mod tests {
    use super::FONT;

    #[test]
    fn the_windows_font_has_the_characters_agents_write_beyond_ascii() {
        let face = ttf_parser::Face::parse(FONT, 0).expect("the font parses");
        // Typographic punctuation, accented Latin, Greek and Cyrillic, the euro sign, arrows.
        for c in "’‘“”—–…•·→←éèêàâüöäßñçøåœÉÇΩπλЖжщ€".chars() {
            assert!(face.glyph_index(c).is_some(), "{c:?} ({:#x}) has no glyph", c as u32);
        }
        // The control: a character it does not have is told apart.
        assert!(face.glyph_index('漢').is_none());
    }
}
