//! The picture `observe` returns: a top-down view around the player, one square per column in the colour of its
//! highest block (shaded by height), the player in red. Encoded as an indexed PNG with the `png` crate: the
//! picture is a few dozen flat colours, so a palette and deflate make it a few KB (radius 32: under 30 KB on the
//! wire, base64 and all).

use std::collections::HashMap;

use crate::world::{Dimension, Pos, WorldState, XZ_BOUNDS};

/// The pixels of a picture, drawn from the world on the main thread, and its description; encoded elsewhere.
pub struct Drawn {
    rgb: Vec<u8>,
    side: u32,
    summary: String,
}

impl Drawn {
    /// The PNG: off the main thread (the tool encodes it on its worker, after its step).
    pub fn encode(self) -> Result<Picture, String> {
        let png = encode_png(self.side, self.side, &self.rgb)
            .map_err(|error| format!("could not encode the picture: {error}"))?;
        Ok(Picture { png, width: self.side, height: self.side, summary: self.summary })
    }
}

/// A drawn picture and a one-line description of it.
pub struct Picture {
    pub png: Vec<u8>,
    pub width: u32,
    pub height: u32,
    pub summary: String,
}

const PLAYER: [u8; 3] = [230, 30, 30];
const OUTSIDE: [u8; 3] = [0, 0, 0];

/// Draws the columns within `radius` of `player` (a square of `2 * radius + 1` columns, north up): only what
/// needs the world, so the main-thread step stays short.
pub fn top_down(state: &WorldState, dimension: Dimension, player: Pos, radius: i32) -> Drawn {
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
    Drawn { rgb, side, summary }
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

/// A PNG of `width` × `height` pixels (`rgb` row by row, 3 bytes a pixel, no padding): indexed colour when the
/// picture has at most 256 colours (it always does here), else 8-bit RGB. Best compression: the pictures are small
/// and flat, and encoding one takes well under a millisecond.
pub fn encode_png(width: u32, height: u32, rgb: &[u8]) -> Result<Vec<u8>, png::EncodingError> {
    let mut colours: Vec<[u8; 3]> = Vec::new();
    let mut indices = Vec::with_capacity(rgb.len() / 3);
    for pixel in rgb.chunks_exact(3) {
        let colour = [pixel[0], pixel[1], pixel[2]];
        let index = match colours.iter().position(|c| *c == colour) {
            Some(index) => index,
            None => {
                colours.push(colour);
                colours.len() - 1
            }
        };
        indices.push(u8::try_from(index).unwrap_or(u8::MAX));
    }
    let mut png = Vec::new();
    let mut encoder = png::Encoder::new(&mut png, width, height);
    encoder.set_compression(png::Compression::High);
    let data = if colours.len() <= 256 {
        encoder.set_color(png::ColorType::Indexed);
        encoder.set_depth(png::BitDepth::Eight);
        encoder.set_palette(colours.concat());
        indices
    } else {
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        rgb.to_vec()
    };
    let mut writer = encoder.write_header()?;
    writer.write_image_data(&data)?;
    writer.finish()?;
    Ok(png)
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
