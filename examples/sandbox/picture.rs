//! The picture `observe` returns: a top-down view around the player, one square per column in the colour of its
//! highest block (shaded by height), the player in red. Encoded as a PNG here, with a tiny encoder (stored
//! deflate blocks, no compression library) since the pictures are small.

use std::collections::HashMap;

use crate::world::{Dimension, Pos, WorldState, XZ_BOUNDS};

/// A drawn picture and a one-line description of it.
pub struct Picture {
    pub png: Vec<u8>,
    pub width: u32,
    pub height: u32,
    pub summary: String,
}

const PLAYER: [u8; 3] = [230, 30, 30];
const OUTSIDE: [u8; 3] = [0, 0, 0];

/// Draws the columns within `radius` of `player` (a square of `2 * radius + 1` columns, north up).
pub fn top_down(state: &WorldState, dimension: Dimension, player: Pos, radius: i32) -> Picture {
    let cells = 2 * radius + 1;
    let scale = (256 / cells).clamp(2, 16);
    let side = (cells * scale) as u32;
    let mut rgb = vec![0u8; (side * side * 3) as usize];
    let mut counts: HashMap<&str, usize> = HashMap::new();
    let mut highest: Option<(i32, i32, i32)> = None;
    let palette = state.palette().clone();
    for row in 0..cells {
        for col in 0..cells {
            let (x, z) = (player.x - radius + col, player.z - radius + row);
            let colour = if x == player.x && z == player.z {
                PLAYER
            } else if !XZ_BOUNDS.contains(&x) || !XZ_BOUNDS.contains(&z) {
                OUTSIDE
            } else {
                match state.top(dimension, x, z) {
                    None => OUTSIDE,
                    Some((y, block)) => {
                        *counts.entry(palette.name(block)).or_default() += 1;
                        if highest.is_none_or(|(top, _, _)| y > top) {
                            highest = Some((y, x, z));
                        }
                        shade(palette.kind(block).rgb, y - player.y)
                    }
                }
            };
            fill(&mut rgb, side, col * scale, row * scale, scale, colour);
        }
    }
    let summary = describe(dimension, player, radius, &counts, highest);
    Picture { png: encode_png(side, side, &rgb), width: side, height: side, summary }
}

/// Lighter above the player, darker below.
fn shade(rgb: [u8; 3], above_player: i32) -> [u8; 3] {
    let factor = (1.0 + f64::from(above_player) * 0.015).clamp(0.55, 1.35);
    rgb.map(|c| (f64::from(c) * factor).round().clamp(0.0, 255.0) as u8)
}

fn fill(rgb: &mut [u8], side: u32, left: i32, top: i32, scale: i32, colour: [u8; 3]) {
    for y in top..top + scale {
        for x in left..left + scale {
            let at = ((y as u32 * side + x as u32) * 3) as usize;
            if let Some(pixel) = rgb.get_mut(at..at + 3) {
                pixel.copy_from_slice(&colour);
            }
        }
    }
}

fn describe(
    dimension: Dimension,
    player: Pos,
    radius: i32,
    counts: &HashMap<&str, usize>,
    highest: Option<(i32, i32, i32)>,
) -> String {
    let total: usize = counts.values().sum();
    let mut common: Vec<_> = counts.iter().collect();
    common.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let mostly: Vec<_> =
        common.iter().take(3).map(|(name, n)| format!("{name} {}%", **n * 100 / total.max(1))).collect();
    let mut summary = format!(
        "{dimension} seen from above within {radius} blocks of the player at {player} (red): {}",
        if mostly.is_empty() { "nothing".to_string() } else { mostly.join(", ") }
    );
    if let Some((y, x, z)) = highest {
        summary.push_str(&format!("; highest point y={y} at ({x}, {z})"));
    }
    summary
}

/// An 8-bit RGB PNG of `width` × `height` pixels (`rgb` row by row, no padding).
pub fn encode_png(width: u32, height: u32, rgb: &[u8]) -> Vec<u8> {
    let row = width as usize * 3;
    let mut raw = Vec::with_capacity((row + 1) * height as usize);
    for line in rgb.chunks(row.max(1)).take(height as usize) {
        raw.push(0); // filter: none
        raw.extend_from_slice(line);
    }
    let mut header = Vec::with_capacity(13);
    header.extend_from_slice(&width.to_be_bytes());
    header.extend_from_slice(&height.to_be_bytes());
    header.extend_from_slice(&[8, 2, 0, 0, 0]); // 8 bits, RGB, deflate, adaptive filters, no interlace
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut png, b"IHDR", &header);
    chunk(&mut png, b"IDAT", &zlib_stored(&raw));
    chunk(&mut png, b"IEND", &[]);
    png
}

fn chunk(png: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    png.extend_from_slice(&(data.len() as u32).to_be_bytes());
    png.extend_from_slice(kind);
    png.extend_from_slice(data);
    let mut crc = crc32fast::Hasher::new();
    crc.update(kind);
    crc.update(data);
    png.extend_from_slice(&crc.finalize().to_be_bytes());
}

/// A zlib stream of uncompressed ("stored") deflate blocks.
fn zlib_stored(data: &[u8]) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    let blocks: Vec<&[u8]> = if data.is_empty() { vec![&[]] } else { data.chunks(65_535).collect() };
    let last = blocks.len() - 1;
    for (i, block) in blocks.iter().enumerate() {
        out.push(u8::from(i == last));
        let len = block.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(block);
    }
    let (mut a, mut b) = (1u32, 0u32);
    for byte in data {
        a = (a + u32::from(*byte)) % 65_521;
        b = (b + a) % 65_521;
    }
    out.extend_from_slice(&((b << 16) | a).to_be_bytes());
    out
}

/// Standard base64 with padding, for carrying the PNG in JSON.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let n = group.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= group.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
