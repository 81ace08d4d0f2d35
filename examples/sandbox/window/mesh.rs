//! A chunk's mesh: one quad per block face that touches air, coloured with the block's palette colour. The
//! material shows the vertex colours as they are: the light is baked into them (tops full, sides and bottoms
//! darker), so a top face shows exactly the palette's colour on screen.

use bevy::asset::RenderAssetUsages;
use bevy::mesh::{Indices, PrimitiveTopology};
use bevy::prelude::*;

use crate::world::{ChunkBlocks, Palette, AIR, CHUNK};

/// One face direction: the neighbour it looks at, its four corners (unit cube, counter-clockwise seen from
/// outside), and how much light it gets.
struct Face {
    normal: [i32; 3],
    corners: [[f32; 3]; 4],
    shade: f32,
}

const FACES: [Face; 6] = [
    Face { normal: [0, 1, 0], corners: [[0., 1., 0.], [0., 1., 1.], [1., 1., 1.], [1., 1., 0.]], shade: 1.0 },
    Face { normal: [0, -1, 0], corners: [[0., 0., 0.], [1., 0., 0.], [1., 0., 1.], [0., 0., 1.]], shade: 0.45 },
    Face { normal: [1, 0, 0], corners: [[1., 0., 0.], [1., 1., 0.], [1., 1., 1.], [1., 0., 1.]], shade: 0.75 },
    Face { normal: [-1, 0, 0], corners: [[0., 0., 0.], [0., 0., 1.], [0., 1., 1.], [0., 1., 0.]], shade: 0.6 },
    Face { normal: [0, 0, 1], corners: [[0., 0., 1.], [1., 0., 1.], [1., 1., 1.], [0., 1., 1.]], shade: 0.85 },
    Face { normal: [0, 0, -1], corners: [[0., 0., 0.], [0., 1., 0.], [1., 1., 0.], [1., 0., 0.]], shade: 0.65 },
];

/// The faces a chunk shows, in chunk-local coordinates (the chunk's entity is placed at its corner). `None` when
/// it shows nothing (all air).
pub fn chunk_mesh(chunk: &ChunkBlocks, palette: &Palette) -> Option<Mesh> {
    let mut positions: Vec<[f32; 3]> = Vec::new();
    let mut normals: Vec<[f32; 3]> = Vec::new();
    let mut colors: Vec<[f32; 4]> = Vec::new();
    let mut indices: Vec<u32> = Vec::new();
    let colour_of: Vec<[f32; 4]> = (0..=u8::MAX)
        .map(|id| {
            let [r, g, b] = palette.kind(id).rgb;
            Color::srgb_u8(r, g, b).to_linear().to_f32_array()
        })
        .collect();
    for z in 0..CHUNK {
        for x in 0..CHUNK {
            for y in 0..ChunkBlocks::HEIGHT {
                let block = chunk.get(x, y, z);
                if block == AIR {
                    continue;
                }
                let [r, g, b, a] = colour_of[usize::from(block)];
                for face in &FACES {
                    let [nx, ny, nz] = face.normal;
                    if chunk.get(x + nx, y + ny, z + nz) != AIR {
                        continue;
                    }
                    let base = positions.len() as u32;
                    for [cx, cy, cz] in face.corners {
                        positions.push([x as f32 + cx, y as f32 + cy, z as f32 + cz]);
                        normals.push([nx as f32, ny as f32, nz as f32]);
                        colors.push([r * face.shade, g * face.shade, b * face.shade, a]);
                    }
                    indices.extend([base, base + 1, base + 2, base, base + 2, base + 3]);
                }
            }
        }
    }
    if indices.is_empty() {
        return None;
    }
    let mesh = Mesh::new(PrimitiveTopology::TriangleList, RenderAssetUsages::RENDER_WORLD)
        .with_inserted_attribute(Mesh::ATTRIBUTE_POSITION, positions)
        .with_inserted_attribute(Mesh::ATTRIBUTE_NORMAL, normals)
        .with_inserted_attribute(Mesh::ATTRIBUTE_COLOR, colors)
        .with_inserted_indices(Indices::U32(indices));
    Some(mesh)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::{ChunkKey, Dimension};

    fn palette() -> Palette {
        Palette::parse(include_str!("../../../assets/palette.json")).expect("the palette")
    }

    fn empty() -> ChunkBlocks {
        let len = (ChunkBlocks::SIDE * ChunkBlocks::SIDE * ChunkBlocks::HEIGHT) as usize;
        ChunkBlocks { key: ChunkKey { dimension: Dimension::Overworld, cx: 0, cz: 0 }, blocks: vec![AIR; len] }
    }

    fn faces(mesh: &Mesh) -> usize {
        mesh.indices().map_or(0, |indices| indices.len() / 6)
    }

    #[test]
    fn a_lone_block_shows_six_faces_and_two_touching_blocks_ten() {
        let palette = palette();
        let gold = palette.id("gold").expect("gold");
        let mut chunk = empty();
        assert!(chunk_mesh(&chunk, &palette).is_none(), "air shows nothing");
        chunk.blocks[ChunkBlocks::index(3, 10, 3)] = gold;
        assert_eq!(chunk_mesh(&chunk, &palette).map(|m| faces(&m)), Some(6));
        chunk.blocks[ChunkBlocks::index(3, 11, 3)] = gold;
        assert_eq!(chunk_mesh(&chunk, &palette).map(|m| faces(&m)), Some(10), "the shared faces are culled");
    }

    #[test]
    fn a_block_in_the_neighbours_ring_hides_the_edge_face_but_is_not_drawn() {
        let palette = palette();
        let stone = palette.id("stone").expect("stone");
        let mut chunk = empty();
        chunk.blocks[ChunkBlocks::index(0, 5, 0)] = stone;
        chunk.blocks[ChunkBlocks::index(-1, 5, 0)] = stone;
        assert_eq!(chunk_mesh(&chunk, &palette).map(|m| faces(&m)), Some(5));
    }
}
