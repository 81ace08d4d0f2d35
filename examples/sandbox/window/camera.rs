//! The camera follows the player: drag with a mouse button to orbit, scroll to zoom. WASD walks the player one
//! cell at a time (relative to where the camera looks), through the world state like everything else: the step
//! is applied by the next `tick`.

use std::f32::consts::FRAC_PI_2;
use std::time::Duration;

use bevy::core_pipeline::tonemapping::Tonemapping;
use bevy::input::mouse::{AccumulatedMouseMotion, AccumulatedMouseScroll, MouseScrollUnit};
use bevy::prelude::*;

use super::Focus;
use crate::view::WorldView;

/// How often a held WASD key takes a step.
const STEP_EVERY: Duration = Duration::from_millis(120);

/// Where the camera looks from, around the player.
#[derive(Component)]
pub struct Orbit {
    yaw: f32,
    pitch: f32,
    distance: f32,
}

/// When the player last stepped.
#[derive(Resource, Default)]
pub struct Stride(Option<Duration>);

pub fn setup(mut commands: Commands) {
    commands.spawn((
        Camera3d::default(),
        // Unlit colours straight to the screen: a block's top face is its palette colour.
        Tonemapping::None,
        Orbit { yaw: 0.6, pitch: 0.75, distance: 28.0 },
        Transform::from_xyz(0.0, 90.0, 20.0).looking_at(Vec3::new(0.0, 64.0, 0.0), Vec3::Y),
    ));
}

pub fn orbit(
    buttons: Res<ButtonInput<MouseButton>>,
    motion: Res<AccumulatedMouseMotion>,
    scroll: Res<AccumulatedMouseScroll>,
    view: Res<WorldView>,
    mut camera: Query<(&mut Orbit, &mut Transform)>,
) {
    let Ok((mut orbit, mut transform)) = camera.single_mut() else { return };
    if buttons.pressed(MouseButton::Left) || buttons.pressed(MouseButton::Right) {
        orbit.yaw -= motion.delta.x * 0.006;
        orbit.pitch = (orbit.pitch + motion.delta.y * 0.006).clamp(0.1, FRAC_PI_2 - 0.05);
    }
    let lines = match scroll.unit {
        MouseScrollUnit::Line => scroll.delta.y,
        MouseScrollUnit::Pixel => scroll.delta.y / 40.0,
    };
    orbit.distance = (orbit.distance * (1.0 - lines * 0.1)).clamp(6.0, 120.0);
    let Some(player) = view.player else { return };
    let target = Vec3::new(player.x as f32 + 0.5, player.y as f32 + 1.0, player.z as f32 + 0.5);
    let offset = Vec3::new(
        orbit.distance * orbit.pitch.cos() * orbit.yaw.sin(),
        orbit.distance * orbit.pitch.sin(),
        orbit.distance * orbit.pitch.cos() * orbit.yaw.cos(),
    );
    *transform = Transform::from_translation(target + offset).looking_at(target, Vec3::Y);
}

/// WASD: one step toward where the camera looks (W), away (S), or sideways, while the key is held.
pub fn walk(
    keys: Res<ButtonInput<KeyCode>>,
    time: Res<Time<Real>>,
    focus: Res<Focus>,
    mut stride: ResMut<Stride>,
    mut view: ResMut<WorldView>,
    camera: Query<&Orbit>,
) {
    if *focus != Focus::World || view.player.is_none() {
        return;
    }
    let Ok(orbit) = camera.single() else { return };
    let mut wish = Vec2::ZERO;
    for (key, direction) in
        [(KeyCode::KeyW, Vec2::Y), (KeyCode::KeyS, -Vec2::Y), (KeyCode::KeyA, -Vec2::X), (KeyCode::KeyD, Vec2::X)]
    {
        // A tap shorter than a frame is still a step: it is pressed and released before this system runs.
        if keys.pressed(key) || keys.just_pressed(key) {
            wish += direction;
        }
    }
    let now = time.elapsed();
    if wish == Vec2::ZERO {
        stride.0 = None;
        return;
    }
    if stride.0.is_some_and(|last| now.saturating_sub(last) < STEP_EVERY) {
        return;
    }
    stride.0 = Some(now);
    // The camera looks toward -offset: forward on the ground is (-sin yaw, -cos yaw); right is (cos yaw, -sin yaw).
    let forward = Vec2::new(-orbit.yaw.sin(), -orbit.yaw.cos());
    let right = Vec2::new(orbit.yaw.cos(), -orbit.yaw.sin());
    let step = forward * wish.y + right * wish.x;
    let cell = |v: f32| {
        if v > 0.38 {
            1
        } else if v < -0.38 {
            -1
        } else {
            0
        }
    };
    view.walk = Some((cell(step.x), cell(step.y)));
}
