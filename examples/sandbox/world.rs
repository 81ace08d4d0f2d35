//! The sandbox's world: the block palette, the two dimensions, the bounds, and a world's state (placed blocks with
//! their versions, notes, where the player stands in each dimension). Terrain comes from [`crate::terrain`]; only
//! changed cells are stored, so a world costs memory for what agents did to it, not for its volume.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::ops::RangeInclusive;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::terrain::{Column, Terrain};

/// x and z of every cell.
pub const XZ_BOUNDS: RangeInclusive<i32> = -256..=255;
/// y of every cell.
pub const Y_BOUNDS: RangeInclusive<i32> = 0..=127;
/// How many notes a world keeps.
pub const MAX_NOTES: usize = 1000;
/// The longest note, in characters (what the `note` tool takes).
pub const MAX_NOTE_CHARS: usize = 500;

/// An index into the [`Palette`].
pub type BlockId = u8;
/// `air` is always the palette's first block.
pub const AIR: BlockId = 0;

/// One kind of block, as `assets/palette.json` describes it.
#[derive(Clone, Debug, Deserialize)]
pub struct BlockKind {
    pub name: String,
    pub rgb: [u8; 3],
    pub symbol: char,
    pub solid: bool,
}

#[derive(Deserialize)]
struct PaletteFile {
    blocks: Vec<BlockKind>,
}

/// The blocks of the game, in the order of `assets/palette.json`.
#[derive(Debug)]
pub struct Palette {
    blocks: Vec<BlockKind>,
    by_name: HashMap<String, BlockId>,
}

impl Palette {
    /// Reads the palette, checking what the game relies on: `air` first, unique names, at most 256 blocks, and
    /// every block the terrain generator uses.
    pub fn parse(json: &str) -> Result<Self, String> {
        let file: PaletteFile = serde_json::from_str(json).map_err(|e| format!("the palette is not valid: {e}"))?;
        if file.blocks.first().map(|b| b.name.as_str()) != Some("air") {
            return Err("the palette's first block must be `air`".into());
        }
        if file.blocks.len() > usize::from(BlockId::MAX) + 1 {
            return Err(format!("the palette has {} blocks; at most 256 fit", file.blocks.len()));
        }
        let mut by_name = HashMap::new();
        for (id, block) in file.blocks.iter().enumerate() {
            let id = BlockId::try_from(id).map_err(|_| "too many blocks".to_string())?;
            if by_name.insert(block.name.clone(), id).is_some() {
                return Err(format!("the palette names `{}` twice", block.name));
            }
        }
        let palette = Self { blocks: file.blocks, by_name };
        for name in crate::terrain::BLOCKS_USED {
            if palette.id(name).is_none() {
                return Err(format!("the palette lacks `{name}`, which the terrain generator uses"));
            }
        }
        Ok(palette)
    }

    pub fn id(&self, name: &str) -> Option<BlockId> {
        self.by_name.get(name).copied()
    }

    /// The id of a block the palette was checked to contain (`AIR` otherwise).
    pub fn known(&self, name: &str) -> BlockId {
        self.id(name).unwrap_or(AIR)
    }

    pub fn kind(&self, id: BlockId) -> &BlockKind {
        self.blocks.get(usize::from(id)).unwrap_or(&self.blocks[0])
    }

    pub fn name(&self, id: BlockId) -> &str {
        &self.kind(id).name
    }

    pub fn is_solid(&self, id: BlockId) -> bool {
        self.kind(id).solid
    }

    /// Every block but air, and but bedrock, which nothing breaks (a model's bedrock would stay in the world for
    /// good): what `place_block` and `build_tower` accept.
    pub fn placeable(&self) -> impl Iterator<Item = &str> {
        self.blocks.iter().skip(1).map(|b| b.name.as_str()).filter(|name| *name != "bedrock")
    }
}

/// The two dimensions. Each has its own terrain and its own placed blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    Overworld,
    Nether,
}

impl Dimension {
    pub const ALL: [Dimension; 2] = [Dimension::Overworld, Dimension::Nether];

    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "overworld" => Ok(Self::Overworld),
            "nether" => Ok(Self::Nether),
            other => Err(format!("unknown dimension {other:?}: use `overworld` or `nether`")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Overworld => "overworld",
            Self::Nether => "nether",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Dimension {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A cell's coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct Pos {
    pub x: i32,
    pub y: i32,
    pub z: i32,
}

impl Pos {
    /// The first coordinate out of bounds, as (field, why). For positions read from a save; a tool's arguments are
    /// bounded by its published schema, which the host checks.
    pub fn check(self) -> Result<Self, (&'static str, String)> {
        check_xz("x", self.x)?;
        check_y("y", self.y)?;
        check_xz("z", self.z)?;
        Ok(self)
    }
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({}, {}, {})", self.x, self.y, self.z)
    }
}

fn check_xz(field: &'static str, value: i32) -> Result<i32, (&'static str, String)> {
    bounded(field, value, &XZ_BOUNDS)
}

fn check_y(field: &'static str, value: i32) -> Result<i32, (&'static str, String)> {
    bounded(field, value, &Y_BOUNDS)
}

fn bounded(field: &'static str, value: i32, range: &RangeInclusive<i32>) -> Result<i32, (&'static str, String)> {
    if range.contains(&value) {
        return Ok(value);
    }
    Err((field, format!("must be in {}..={}, got {value}", range.start(), range.end())))
}

/// Cells per chunk side (x and z); a chunk spans the whole height. The window meshes one chunk at a time.
pub const CHUNK: i32 = 16;

/// A chunk of one dimension: the cells with `x.div_euclid(CHUNK) == cx` and `z.div_euclid(CHUNK) == cz`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkKey {
    pub dimension: Dimension,
    pub cx: i32,
    pub cz: i32,
}

impl ChunkKey {
    /// The chunk holding column (x, z).
    pub fn of(dimension: Dimension, x: i32, z: i32) -> Self {
        Self { dimension, cx: x.div_euclid(CHUNK), cz: z.div_euclid(CHUNK) }
    }

    /// Whether any of its cells is inside the world's bounds.
    #[cfg_attr(not(feature = "window"), allow(dead_code))]
    pub fn in_bounds(self) -> bool {
        let cells = |c: i32| c * CHUNK..(c + 1) * CHUNK;
        let overlaps = |range: std::ops::Range<i32>| range.start <= *XZ_BOUNDS.end() && range.end > *XZ_BOUNDS.start();
        overlaps(cells(self.cx)) && overlaps(cells(self.cz))
    }
}

/// The blocks of one chunk as the window draws them, with a ring of one column of each neighbour (so faces at
/// the chunk's edges are culled like inner ones). Cells above a column's view ceiling (the nether's roof) and
/// out of the world's bounds are air.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "window"), allow(dead_code))] // Read by the window only.
pub struct ChunkBlocks {
    pub key: ChunkKey,
    /// `(CHUNK + 2)² × height` blocks, indexed by [`ChunkBlocks::index`].
    pub blocks: Vec<BlockId>,
}

impl ChunkBlocks {
    /// Columns per side, with the ring.
    pub const SIDE: i32 = CHUNK + 2;
    /// Cells per column.
    pub const HEIGHT: i32 = *Y_BOUNDS.end() + 1;

    /// The index of local cell (x, y, z), x and z in `-1..=CHUNK` (the ring included), y in the world's bounds.
    pub fn index(x: i32, y: i32, z: i32) -> usize {
        (((z + 1) * Self::SIDE + (x + 1)) * Self::HEIGHT + y) as usize
    }

    /// The block at local (x, y, z); air outside the snapshot.
    #[cfg_attr(not(feature = "window"), allow(dead_code))]
    pub fn get(&self, x: i32, y: i32, z: i32) -> BlockId {
        let inside = (-1..=CHUNK).contains(&x) && (-1..=CHUNK).contains(&z) && Y_BOUNDS.contains(&y);
        if !inside {
            return AIR;
        }
        self.blocks.get(Self::index(x, y, z)).copied().unwrap_or(AIR)
    }
}

/// A changed cell: its block and how many times it changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cell {
    pub block: BlockId,
    pub version: u64,
}

/// One dimension's changed cells (by column, then y) and where the player stands in it.
#[derive(Default)]
struct Layer {
    edits: HashMap<(i32, i32), BTreeMap<i32, Cell>>,
    player: Option<Pos>,
}

/// A world's state while it is visited.
pub struct WorldState {
    palette: Arc<Palette>,
    terrain: [Terrain; 2],
    layers: [Layer; 2],
    notes: Vec<String>,
    /// Chunks whose blocks changed since [`WorldState::take_dirty`] was last called (at most every chunk).
    dirty: HashSet<ChunkKey>,
    /// Saved cells whose block this palette does not have (renamed, or from a newer palette): not in the world,
    /// but saved again as they were, so that a palette change never loses them.
    unknown: Vec<SavedCell>,
    /// Counts the changes a save would carry (blocks, notes, where the player is).
    changes: u64,
}

impl WorldState {
    /// A world as generated from its name, nothing changed yet.
    pub fn generate(name: &str, palette: Arc<Palette>) -> Self {
        let terrain = Dimension::ALL.map(|d| Terrain::new(name, d, &palette));
        Self {
            palette,
            terrain,
            layers: Default::default(),
            notes: Vec::new(),
            dirty: HashSet::new(),
            unknown: Vec::new(),
            changes: 0,
        }
    }

    pub fn palette(&self) -> &Arc<Palette> {
        &self.palette
    }

    /// The block at `pos` and its version (0 for a cell nobody changed).
    pub fn block(&self, dimension: Dimension, pos: Pos) -> Cell {
        let layer = &self.layers[dimension.index()];
        if let Some(cell) = layer.edits.get(&(pos.x, pos.z)).and_then(|column| column.get(&pos.y)) {
            return *cell;
        }
        let column = self.terrain[dimension.index()].column(pos.x, pos.z);
        Cell { block: column.block(pos.y), version: 0 }
    }

    /// Sets the block at `pos` (in bounds), and returns its new version. The player, if standing in that column,
    /// is pushed up out of a solid block or falls onto the next solid one.
    pub fn set(&mut self, dimension: Dimension, pos: Pos, block: BlockId) -> u64 {
        // (A save can hold any version: at the largest it stays there.)
        let version = self.block(dimension, pos).version.saturating_add(1);
        self.changes += 1;
        let layer = &mut self.layers[dimension.index()];
        layer.edits.entry((pos.x, pos.z)).or_default().insert(pos.y, Cell { block, version });
        // The cell's chunk, and a neighbour whose edge ring shows it.
        for (dx, dz) in [(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)] {
            self.dirty.insert(ChunkKey::of(dimension, pos.x + dx, pos.z + dz));
        }
        if layer.player.is_some_and(|p| p.x == pos.x && p.z == pos.z) {
            let player = self.player(dimension);
            let settled = self.settle(dimension, player);
            self.layers[dimension.index()].player = Some(settled);
        }
        version
    }

    /// Whether a solid `block` placed at `pos` would have nowhere to push the player to: they stand in that cell
    /// and the one above is solid too (the nether's roof, a ceiling) or past the top of the world. Placing it
    /// would lift them through the ceiling.
    pub fn would_trap_player(&self, dimension: Dimension, pos: Pos, block: BlockId) -> bool {
        let above = Pos { y: pos.y + 1, ..pos };
        self.layers[dimension.index()].player == Some(pos)
            && self.palette.is_solid(block)
            && (pos.y >= *Y_BOUNDS.end() || self.palette.is_solid(self.block(dimension, above).block))
    }

    /// Where the player stands in `dimension`: on the ground at (0, 0) until they have been there.
    pub fn player(&self, dimension: Dimension) -> Pos {
        self.layers[dimension.index()].player.unwrap_or_else(|| self.spawn(dimension))
    }

    /// Moves the player one step across the ground (dx and dz in -1..=1), climbing or falling to the ground of
    /// the column they step into; they stay inside the world's bounds. A column solid up to the top of the world
    /// (the nether's roof, over a tower built up to it) is a wall: the player stays where they are.
    pub fn walk(&mut self, dimension: Dimension, dx: i32, dz: i32) -> Pos {
        let from = self.player(dimension);
        let x = (from.x + dx.clamp(-1, 1)).clamp(*XZ_BOUNDS.start(), *XZ_BOUNDS.end());
        let z = (from.z + dz.clamp(-1, 1)).clamp(*XZ_BOUNDS.start(), *XZ_BOUNDS.end());
        let to = self.settle(dimension, Pos { x, y: from.y, z });
        if self.palette.is_solid(self.block(dimension, to).block) {
            return from;
        }
        self.changes += 1;
        self.layers[dimension.index()].player = Some(to);
        to
    }

    /// The chunks changed since the last call, forgetting them.
    pub fn take_dirty(&mut self) -> Vec<ChunkKey> {
        self.dirty.drain().collect()
    }

    /// A chunk's blocks, for drawing it.
    pub fn chunk_blocks(&self, key: ChunkKey) -> ChunkBlocks {
        let height = ChunkBlocks::HEIGHT;
        let mut blocks = vec![AIR; (ChunkBlocks::SIDE * ChunkBlocks::SIDE * height) as usize];
        let layer = &self.layers[key.dimension.index()];
        for lz in -1..=CHUNK {
            for lx in -1..=CHUNK {
                let (x, z) = (key.cx * CHUNK + lx, key.cz * CHUNK + lz);
                if !XZ_BOUNDS.contains(&x) || !XZ_BOUNDS.contains(&z) {
                    continue;
                }
                let column = self.terrain[key.dimension.index()].column(x, z);
                let edits = layer.edits.get(&(x, z));
                let start = ChunkBlocks::index(lx, 0, lz);
                let cells = &mut blocks[start..start + height as usize];
                for (y, cell) in (0..=column.view_ceiling()).zip(cells.iter_mut()) {
                    *cell = column.block(y);
                }
                for (&y, edit) in edits.into_iter().flatten().filter(|(y, _)| **y <= column.view_ceiling()) {
                    if let Some(cell) = usize::try_from(y).ok().and_then(|y| cells.get_mut(y)) {
                        *cell = edit.block;
                    }
                }
            }
        }
        ChunkBlocks { key, blocks }
    }

    /// Records that the player is in `dimension` (placing them at its spawn on their first visit).
    pub fn arrive(&mut self, dimension: Dimension) -> Pos {
        let player = self.player(dimension);
        let layer = &mut self.layers[dimension.index()];
        if layer.player != Some(player) {
            self.changes += 1;
            layer.player = Some(player);
        }
        player
    }

    fn spawn(&self, dimension: Dimension) -> Pos {
        let y = self.surface(dimension, 0, 0).map_or(1, |top| top + 1);
        self.settle(dimension, Pos { x: 0, y: y.min(*Y_BOUNDS.end()), z: 0 })
    }

    /// Moves `pos` up out of solid blocks, then down onto the first solid block below.
    fn settle(&self, dimension: Dimension, mut pos: Pos) -> Pos {
        let solid = |y| self.palette.is_solid(self.block(dimension, Pos { y, ..pos }).block);
        while pos.y < *Y_BOUNDS.end() && solid(pos.y) {
            pos.y += 1;
        }
        while pos.y > *Y_BOUNDS.start() && !solid(pos.y - 1) {
            pos.y -= 1;
        }
        pos
    }

    /// The highest non-air cell of a column at or below the dimension's view ceiling (the nether has a roof: its
    /// view starts below it).
    pub fn surface(&self, dimension: Dimension, x: i32, z: i32) -> Option<i32> {
        let column = self.terrain[dimension.index()].column(x, z);
        self.surface_in(dimension, &column, x, z).map(|(y, _)| y)
    }

    /// The highest non-air cell (y and block) at or below the view ceiling, for maps and pictures.
    pub fn top(&self, dimension: Dimension, x: i32, z: i32) -> Option<(i32, BlockId)> {
        let column = self.terrain[dimension.index()].column(x, z);
        self.surface_in(dimension, &column, x, z)
    }

    fn surface_in(&self, dimension: Dimension, column: &Column, x: i32, z: i32) -> Option<(i32, BlockId)> {
        let ceiling = column.view_ceiling();
        let edits = self.layers[dimension.index()].edits.get(&(x, z));
        let start = edits
            .and_then(|cells| cells.range(..=ceiling).rev().find(|(_, c)| c.block != AIR).map(|(y, _)| *y))
            .map_or(column.top(), |edited| edited.max(column.top()))
            .min(ceiling);
        (0..=start).rev().find_map(|y| {
            let block = edits.and_then(|cells| cells.get(&y)).map_or_else(|| column.block(y), |cell| cell.block);
            (block != AIR).then_some((y, block))
        })
    }

    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Adds a note; `None` when the world already keeps [`MAX_NOTES`].
    pub fn add_note(&mut self, text: String) -> Option<usize> {
        if self.notes.len() >= MAX_NOTES {
            return None;
        }
        self.notes.push(text);
        self.changes += 1;
        Some(self.notes.len())
    }

    /// How many changes a save would carry were made so far (a save made when this was `n` holds the first `n`).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// How many cells were changed, in all dimensions.
    pub fn changed_cells(&self) -> usize {
        self.layers.iter().flat_map(|layer| layer.edits.values()).map(BTreeMap::len).sum()
    }

    /// What is saved: changed cells (by block name, so a reordered palette still loads), notes, positions.
    pub fn to_save(&self) -> SaveDoc {
        let mut doc = SaveDoc { format: SAVE_FORMAT, notes: self.notes.clone(), ..SaveDoc::default() };
        for dimension in Dimension::ALL {
            let layer = &self.layers[dimension.index()];
            if let Some(player) = layer.player {
                doc.players.insert(dimension, player);
            }
            for (&(x, z), cells) in &layer.edits {
                for (&y, cell) in cells {
                    let block = self.palette.name(cell.block).to_string();
                    doc.blocks.push(SavedCell { dimension, x, y, z, block, version: cell.version });
                }
            }
        }
        // Cells of unknown blocks go back as they came, unless the world has since changed their cell.
        let changed = |c: &SavedCell| {
            self.layers[c.dimension.index()].edits.get(&(c.x, c.z)).is_some_and(|cells| cells.contains_key(&c.y))
        };
        doc.blocks.extend(self.unknown.iter().filter(|c| !changed(c)).cloned());
        doc.blocks.sort_by_key(|c| (c.dimension, c.x, c.z, c.y));
        doc
    }

    /// A world from its save. What cannot be restored (a block no longer in the palette, a cell out of bounds)
    /// is left out and described in the returned warnings; a block the palette does not know is kept for the
    /// next save.
    pub fn from_save(name: &str, palette: Arc<Palette>, doc: SaveDoc) -> (Self, Vec<String>) {
        let mut state = Self::generate(name, palette);
        let mut warnings = Vec::new();
        for cell in doc.blocks {
            let pos = Pos { x: cell.x, y: cell.y, z: cell.z };
            let Some(block) = state.palette.id(&cell.block) else {
                warnings.push(format!(
                    "block {pos} in the {}: `{}` is not in the palette (kept in the save)",
                    cell.dimension, cell.block
                ));
                state.unknown.push(cell);
                continue;
            };
            if let Err((field, why)) = pos.check() {
                warnings.push(format!("block {pos} in the {}: {field} {why}", cell.dimension));
                continue;
            }
            let cells = state.layers[cell.dimension.index()].edits.entry((pos.x, pos.z)).or_default();
            cells.insert(pos.y, Cell { block, version: cell.version });
        }
        for (dimension, player) in doc.players {
            if player.check().is_ok() {
                state.layers[dimension.index()].player = Some(player);
            }
        }
        state.notes = doc.notes;
        state.notes.truncate(MAX_NOTES);
        // A save written by hand (or by another program) may hold notes longer than `note` takes: cut, so that a
        // `notes` answer stays one a model reads whole.
        for (index, note) in state.notes.iter_mut().enumerate() {
            if let Some((cut, _)) = note.char_indices().nth(MAX_NOTE_CHARS) {
                warnings.push(format!("note {index}: longer than {MAX_NOTE_CHARS} characters, cut"));
                note.truncate(cut);
            }
        }
        (state, warnings)
    }
}

/// The save format's version, written into every save.
pub const SAVE_FORMAT: u32 = 1;

/// A world's save: one document, so that blocks, notes and positions are always saved together.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SaveDoc {
    pub format: u32,
    #[serde(default)]
    pub players: BTreeMap<Dimension, Pos>,
    #[serde(default)]
    pub notes: Vec<String>,
    #[serde(default)]
    pub blocks: Vec<SavedCell>,
}

/// One changed cell in a save.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedCell {
    pub dimension: Dimension,
    pub x: i32,
    pub y: i32,
    pub z: i32,
    pub block: String,
    pub version: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saves_notes_longer_than_the_note_tool_takes_are_cut_so_a_notes_answer_stays_bounded() {
        let palette = Arc::new(Palette::parse(include_str!("../../assets/palette.json")).expect("the palette"));
        let long = "é".repeat(MAX_NOTE_CHARS + 10);
        let doc = SaveDoc { format: SAVE_FORMAT, notes: vec!["short".into(), long], ..SaveDoc::default() };
        let (state, warnings) = WorldState::from_save("alpha", palette, doc);
        assert_eq!(state.notes()[0], "short");
        assert_eq!(state.notes()[1].chars().count(), MAX_NOTE_CHARS, "cut at a character, not a byte");
        assert_eq!(warnings, ["note 1: longer than 500 characters, cut"]);
    }
}
