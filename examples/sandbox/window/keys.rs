//! The player's world transitions from the keyboard, sent as the console commands a player would type (so they
//! print the same lines and follow the same rules): L lists the worlds in the data directory, last saved first,
//! and a digit enters one (0: a new world); P travels between the overworld and the nether; Esc leaves the world.

use std::path::PathBuf;

use super::hud::Hud;
use super::Focus;
use crate::console::{check_world_name, ConsoleLines};
use crate::session::SAVE_DOCUMENT;
use bevy::prelude::*;

/// The data directory, where each world is a directory.
#[derive(Resource)]
pub struct DataDir(pub PathBuf);

/// The world list, while it is open.
#[derive(Resource, Default)]
pub struct WorldList(pub Vec<String>);

#[derive(Component)]
pub struct WorldListText;

pub fn setup(mut commands: Commands) {
    commands.spawn((
        WorldListText,
        Text::new(""),
        TextFont { font_size: FontSize::Px(18.0), ..default() },
        Node {
            position_type: PositionType::Absolute,
            top: px(120),
            left: percent(38),
            padding: UiRect::all(px(12)),
            ..default()
        },
        BackgroundColor(Color::srgba(0.0, 0.0, 0.0, 0.8)),
        Visibility::Hidden,
    ));
}

/// The worlds saved under `dir`, the last saved first (at most nine: one per digit): the folders with a sandbox
/// save (its primary or previous file) in them, not the data dir's other folders (`agent-sessions`).
fn worlds(dir: &std::path::Path) -> Vec<String> {
    // When the world was last saved: its newest save file's modification time.
    let saved = |world: &std::path::Path| {
        [format!("{SAVE_DOCUMENT}.json"), format!("{SAVE_DOCUMENT}.json.prev")]
            .iter()
            .filter_map(|file| std::fs::metadata(world.join(file)).ok().filter(|meta| meta.is_file()))
            .map(|meta| meta.modified().unwrap_or(std::time::SystemTime::UNIX_EPOCH))
            .max()
    };
    let mut found: Vec<(std::time::SystemTime, String)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|entry| Some((saved(&entry.path())?, entry.file_name().into_string().ok()?)))
        .filter(|(_, name)| check_world_name(name).is_ok())
        .collect();
    found.sort_by(|(a_saved, a), (b_saved, b)| b_saved.cmp(a_saved).then_with(|| a.cmp(b)));
    found.into_iter().take(9).map(|(_, name)| name).collect()
}

pub fn transitions(
    keys: Res<ButtonInput<KeyCode>>,
    mut focus: ResMut<Focus>,
    mut list: ResMut<WorldList>,
    data_dir: Res<DataDir>,
    hud: Res<Hud>,
    console: Res<ConsoleLines>,
) {
    match *focus {
        Focus::World => {
            if keys.just_pressed(KeyCode::KeyL) {
                list.0 = worlds(&data_dir.0);
                *focus = Focus::WorldList;
            } else if keys.just_pressed(KeyCode::KeyP) {
                if let Some(open) = hud.visit() {
                    let to = if open.location.dimension.as_str() == "nether" { "overworld" } else { "nether" };
                    console.send(format!("travel {to}"));
                }
            } else if keys.just_pressed(KeyCode::Escape) && hud.visit().is_some() && !focus.is_changed() {
                // (An Esc that just closed the chat panel or the list is not also a request to leave.)
                console.send("exit");
            }
        }
        Focus::WorldList => {
            if keys.just_pressed(KeyCode::Escape) || keys.just_pressed(KeyCode::KeyL) {
                *focus = Focus::World;
                return;
            }
            let digits = [
                KeyCode::Digit0,
                KeyCode::Digit1,
                KeyCode::Digit2,
                KeyCode::Digit3,
                KeyCode::Digit4,
                KeyCode::Digit5,
                KeyCode::Digit6,
                KeyCode::Digit7,
                KeyCode::Digit8,
                KeyCode::Digit9,
            ];
            let Some(digit) = digits.iter().position(|key| keys.just_pressed(*key)) else { return };
            let world = match digit {
                // Not one of the listed nine: one with no folder at all (the list holds nine at most).
                0 => (1..).map(|n| format!("world-{n}")).find(|name| !data_dir.0.join(name).exists()),
                n => list.0.get(n - 1).cloned(),
            };
            if let Some(world) = world {
                console.send(format!("enter {world}"));
                *focus = Focus::World;
            }
        }
        Focus::Chat => {}
    }
}

pub fn draw_list(
    list: Res<WorldList>,
    focus: Res<Focus>,
    hud: Res<Hud>,
    mut text: Query<(&mut Text, &mut Visibility), With<WorldListText>>,
) {
    if !list.is_changed() && !focus.is_changed() {
        return;
    }
    let Ok((mut text, mut visibility)) = text.single_mut() else { return };
    if *focus != Focus::WorldList {
        *visibility = Visibility::Hidden;
        return;
    }
    let mut lines = vec!["worlds (a digit enters, Esc closes)".to_string()];
    let open = hud.visit().map(|open| open.world.as_str());
    lines.extend(list.0.iter().enumerate().map(|(i, name)| match open == Some(name.as_str()) {
        true => format!("{}  {name}  (open: entering it again starts a new visit)", i + 1),
        false => format!("{}  {name}", i + 1),
    }));
    lines.push("0  a new world".into());
    text.0 = lines.join("\n");
    *visibility = Visibility::Visible;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_world_list_holds_the_saved_worlds_and_not_the_sessions_folder_beside_them() {
        let data = tempfile::tempdir().unwrap();
        for (folder, file) in [("alpha", "sandbox.json"), ("beta", "sandbox.json.prev"), ("agent-sessions", "x")] {
            std::fs::create_dir(data.path().join(folder)).unwrap();
            std::fs::write(data.path().join(folder).join(file), b"{}").unwrap();
        }
        std::fs::create_dir(data.path().join("empty")).unwrap();
        let mut listed = worlds(data.path());
        listed.sort();
        assert_eq!(listed, ["alpha", "beta"]);
    }

    #[test]
    fn the_world_list_shows_the_nine_last_saved_worlds_newest_first() {
        let data = tempfile::tempdir().unwrap();
        let start = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        // world-1 .. world-12, world-N saved N minutes after the start; world-2 saved last of all.
        for n in 1..=12u64 {
            let folder = data.path().join(format!("world-{n}"));
            std::fs::create_dir(&folder).unwrap();
            let file = std::fs::File::create(folder.join("sandbox.json")).unwrap();
            let minutes = if n == 2 { 100 } else { n };
            file.set_modified(start + std::time::Duration::from_secs(60 * minutes)).unwrap();
        }
        let expected: Vec<String> =
            ["world-2", "world-12", "world-11", "world-10", "world-9", "world-8", "world-7", "world-6", "world-5"]
                .map(String::from)
                .to_vec();
        assert_eq!(worlds(data.path()), expected, "not by name: world-10 after world-1, world-9 unreachable");
    }
}
