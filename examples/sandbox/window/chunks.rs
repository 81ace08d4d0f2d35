//! The world in 3D: one mesh entity per chunk around the player, built from the snapshots `tick` hands over
//! (see `crate::view`), re-meshed only when a block of that chunk changes; and the player as a tall box.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bevy::prelude::*;
use bevy::render::render_resource::AsBindGroup;
use bevy::shader::ShaderRef;

use super::mesh::chunk_mesh;
use crate::view::WorldView;
use crate::world::{ChunkKey, Dimension, Palette, CHUNK};

/// Chunks drawn around the player's chunk in each direction.
const VIEW_RADIUS: i32 = 4;

/// The player's colour: nothing in the palette looks like it.
const PLAYER_RGB: [u8; 3] = [230, 40, 170];

/// The chunks on screen, and what re-meshing costs.
#[derive(Resource, Default)]
pub struct ChunkMeshes {
    shown_for: Option<(bevy_agent_tools::VisitId, Dimension)>,
    entities: HashMap<ChunkKey, Entity>,
    /// How long each mesh built since the last `frames` took.
    pub mesh_times: Vec<Duration>,
}

/// The chunks' shader (`blocks.wgsl`), registered by the window plugin.
pub const BLOCKS_SHADER: Handle<Shader> = bevy::asset::uuid_handle!("6b0f3c52-2d7e-4e0a-9a47-51c3d2f0b8a1");

/// The chunks' material: the vertex colours and nothing else (see `blocks.wgsl`).
#[derive(Asset, TypePath, AsBindGroup, Debug, Clone, Default)]
pub struct BlockMaterial {}

impl Material for BlockMaterial {
    fn fragment_shader() -> ShaderRef {
        ShaderRef::Handle(BLOCKS_SHADER)
    }
}

/// The one material every chunk uses.
#[derive(Resource)]
pub struct ChunkMaterial(Handle<BlockMaterial>);

/// The palette the meshes are coloured from.
#[derive(Resource)]
pub struct MeshPalette(pub Arc<Palette>);

#[derive(Component)]
pub struct PlayerMarker;

pub fn setup(
    mut commands: Commands,
    mut meshes: ResMut<Assets<Mesh>>,
    mut materials: ResMut<Assets<StandardMaterial>>,
    mut blocks: ResMut<Assets<BlockMaterial>>,
) {
    commands.insert_resource(ChunkMaterial(blocks.add(BlockMaterial::default())));
    let [r, g, b] = PLAYER_RGB;
    commands.spawn((
        PlayerMarker,
        Mesh3d(meshes.add(Cuboid::new(0.6, 1.8, 0.6))),
        MeshMaterial3d(materials.add(StandardMaterial {
            base_color: Color::srgb_u8(r, g, b),
            unlit: true,
            ..default()
        })),
        Transform::default(),
        Visibility::Hidden,
    ));
}

/// Meshes the fresh snapshots, drops chunks that left the view (or the world), and asks for the missing ones.
pub fn sync_chunks(
    mut commands: Commands,
    mut view: ResMut<WorldView>,
    mut shown: ResMut<ChunkMeshes>,
    palette: Res<MeshPalette>,
    material: Res<ChunkMaterial>,
    mut meshes: ResMut<Assets<Mesh>>,
    mut player: Query<(&mut Transform, &mut Visibility), With<PlayerMarker>>,
) {
    if shown.shown_for != view.shown {
        for (_, entity) in shown.entities.drain() {
            commands.entity(entity).despawn();
        }
        shown.shown_for = view.shown;
    }
    for snapshot in std::mem::take(&mut view.snapshots) {
        let key = snapshot.key;
        let started = Instant::now();
        let mesh = chunk_mesh(&snapshot, &palette.0);
        crate::view::record_time(&mut shown.mesh_times, started.elapsed());
        let old = shown.entities.remove(&key);
        if let Some(entity) = old {
            commands.entity(entity).despawn();
        }
        if let Some(mesh) = mesh {
            let corner = Vec3::new((key.cx * CHUNK) as f32, 0.0, (key.cz * CHUNK) as f32);
            let entity = commands
                .spawn((
                    Mesh3d(meshes.add(mesh)),
                    MeshMaterial3d(material.0.clone()),
                    Transform::from_translation(corner),
                ))
                .id();
            shown.entities.insert(key, entity);
        }
    }
    let Ok((mut transform, mut visibility)) = player.single_mut() else { return };
    let (Some((_, dimension)), Some(pos)) = (view.shown, view.player) else {
        *visibility = Visibility::Hidden;
        view.wanted.clear();
        return;
    };
    *visibility = Visibility::Visible;
    transform.translation = Vec3::new(pos.x as f32 + 0.5, pos.y as f32 + 0.9, pos.z as f32 + 0.5);

    let centre = ChunkKey::of(dimension, pos.x, pos.z);
    let near = |key: &ChunkKey| (key.cx - centre.cx).abs().max((key.cz - centre.cz).abs());
    // Chunks far behind are dropped (with a margin, so walking along an edge does not churn).
    let far: Vec<ChunkKey> = view.drawn.iter().filter(|key| near(key) > VIEW_RADIUS + 1).copied().collect();
    for key in far {
        view.drawn.remove(&key);
        if let Some(entity) = shown.entities.remove(&key) {
            commands.entity(entity).despawn();
        }
    }
    let mut wanted: Vec<ChunkKey> = (-VIEW_RADIUS..=VIEW_RADIUS)
        .flat_map(|dz| (-VIEW_RADIUS..=VIEW_RADIUS).map(move |dx| (dx, dz)))
        .map(|(dx, dz)| ChunkKey { dimension, cx: centre.cx + dx, cz: centre.cz + dz })
        .filter(|key| key.in_bounds() && !view.drawn.contains(key))
        .collect();
    wanted.sort_by_key(|key| (near(key), key.cx, key.cz));
    view.wanted = wanted;
}
