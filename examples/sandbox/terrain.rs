//! Terrain generated from a world's name: the same name always gives the same hills, seas, lava lakes and roof.
//! Nothing is stored: a column is computed when it is asked for, from a seed and a little value noise.

use crate::world::{BlockId, Dimension, Palette, AIR, Y_BOUNDS};

/// Blocks the generator places; the palette must have them all.
pub const BLOCKS_USED: [&str; 12] = [
    "stone",
    "dirt",
    "grass",
    "sand",
    "snow",
    "water",
    "bedrock",
    "netherrack",
    "soul_sand",
    "lava",
    "glowstone",
    "quartz_ore",
];

const SEA_LEVEL: i32 = 48;
const LAVA_LEVEL: i32 = 26;

/// The generator of one dimension of one world.
#[derive(Clone, Debug)]
pub struct Terrain {
    seed: u64,
    dimension: Dimension,
    ids: Ids,
}

#[derive(Clone, Copy, Debug)]
struct Ids {
    stone: BlockId,
    dirt: BlockId,
    grass: BlockId,
    sand: BlockId,
    snow: BlockId,
    water: BlockId,
    bedrock: BlockId,
    netherrack: BlockId,
    soul_sand: BlockId,
    lava: BlockId,
    glowstone: BlockId,
    quartz: BlockId,
}

/// One generated column: enough to answer for any y without storing the cells.
#[derive(Clone, Copy, Debug)]
pub struct Column {
    dimension: Dimension,
    /// The highest solid ground block.
    ground: i32,
    /// Water (overworld) or lava (nether) fills air up to here.
    fluid: i32,
    /// Nether only: the lowest block of the roof.
    roof: i32,
    surface: BlockId,
    salt: u64,
    ids: Ids,
}

impl Terrain {
    pub fn new(world: &str, dimension: Dimension, palette: &Palette) -> Self {
        let salt = match dimension {
            Dimension::Overworld => 0x6f76_6572,
            Dimension::Nether => 0x6e65_7468,
        };
        let ids = Ids {
            stone: palette.known("stone"),
            dirt: palette.known("dirt"),
            grass: palette.known("grass"),
            sand: palette.known("sand"),
            snow: palette.known("snow"),
            water: palette.known("water"),
            bedrock: palette.known("bedrock"),
            netherrack: palette.known("netherrack"),
            soul_sand: palette.known("soul_sand"),
            lava: palette.known("lava"),
            glowstone: palette.known("glowstone"),
            quartz: palette.known("quartz_ore"),
        };
        Self { seed: fnv1a(world.as_bytes()) ^ salt, dimension, ids }
    }

    pub fn column(&self, x: i32, z: i32) -> Column {
        let (ids, seed) = (self.ids, self.seed);
        let salt = hash3(seed, x, 0, z);
        let hills = noise(seed, x, z, 48.0) * 0.8 + noise(seed ^ 1, x, z, 12.0) * 0.2;
        match self.dimension {
            Dimension::Overworld => {
                let ground = 38 + (hills * 40.0) as i32;
                let surface = match ground {
                    g if g <= SEA_LEVEL + 1 => ids.sand,
                    g if g >= 72 => ids.snow,
                    _ => ids.grass,
                };
                Column { dimension: self.dimension, ground, fluid: SEA_LEVEL, roof: i32::MAX, surface, salt, ids }
            }
            Dimension::Nether => {
                let ground = 20 + (hills * 30.0) as i32;
                let roof = 100 + (noise(seed ^ 2, x, z, 16.0) * 17.0) as i32;
                let surface = if noise(seed ^ 3, x, z, 10.0) > 0.65 { ids.soul_sand } else { ids.netherrack };
                Column { dimension: self.dimension, ground, fluid: LAVA_LEVEL, roof, surface, salt, ids }
            }
        }
    }
}

impl Column {
    pub fn block(&self, y: i32) -> BlockId {
        let ids = &self.ids;
        if y == *Y_BOUNDS.start() {
            return ids.bedrock;
        }
        match self.dimension {
            Dimension::Overworld => match y {
                y if y > self.ground => {
                    if y <= self.fluid {
                        ids.water
                    } else {
                        AIR
                    }
                }
                y if y == self.ground => self.surface,
                y if y >= self.ground - 3 && self.surface != ids.snow => {
                    if self.surface == ids.sand {
                        ids.sand
                    } else {
                        ids.dirt
                    }
                }
                _ => ids.stone,
            },
            Dimension::Nether => match y {
                y if y == *Y_BOUNDS.end() => ids.bedrock,
                y if y == self.roof && self.salt.is_multiple_of(13) => ids.glowstone,
                y if y >= self.roof => ids.netherrack,
                y if y > self.ground => {
                    if y <= self.fluid {
                        ids.lava
                    } else {
                        AIR
                    }
                }
                y if y == self.ground => self.surface,
                y if hash3(self.salt, 0, y, 0).is_multiple_of(29) => ids.quartz,
                _ => ids.netherrack,
            },
        }
    }

    /// The highest non-air generated cell at or below [`view_ceiling`](Self::view_ceiling).
    pub fn top(&self) -> i32 {
        self.ground.max(self.fluid).min(self.view_ceiling())
    }

    /// Where a top-down view starts: the sky in the overworld, just under the roof in the nether.
    pub fn view_ceiling(&self) -> i32 {
        match self.dimension {
            Dimension::Overworld => *Y_BOUNDS.end(),
            Dimension::Nether => self.roof - 1,
        }
    }
}

/// Smooth value noise in 0..1 at a scale of `cell` blocks.
fn noise(seed: u64, x: i32, z: i32, cell: f64) -> f64 {
    let (fx, fz) = (f64::from(x) / cell, f64::from(z) / cell);
    let (x0, z0) = (fx.floor(), fz.floor());
    let (tx, tz) = (smooth(fx - x0), smooth(fz - z0));
    let (ix, iz) = (x0 as i32, z0 as i32);
    let corner = |dx: i32, dz: i32| (hash3(seed, ix + dx, 0, iz + dz) >> 11) as f64 / (1u64 << 53) as f64;
    let top = lerp(corner(0, 0), corner(1, 0), tx);
    let bottom = lerp(corner(0, 1), corner(1, 1), tx);
    lerp(top, bottom, tz)
}

fn smooth(t: f64) -> f64 {
    t * t * (3.0 - 2.0 * t)
}

fn lerp(a: f64, b: f64, t: f64) -> f64 {
    a + (b - a) * t
}

/// A stable hash of a name (FNV-1a): unlike std's hashers, guaranteed the same on every build.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3))
}

/// splitmix64 over a seed and three coordinates.
fn hash3(seed: u64, x: i32, y: i32, z: i32) -> u64 {
    let mut h = seed
        ^ (x as u32 as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (y as u32 as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
        ^ (z as u32 as u64).wrapping_mul(0x1656_67b1_9e37_79f9);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}
