//! The sandbox's agent tools, as issue 9's table fixes them. `Location` tools capture the dimension they were
//! called in and act there only; the host ends them with `LOCATION_CHANGED` if the player travels first.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::{check_version, DestructiveGuard, ImageContent, NoArgs};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::picture;
use crate::session::{TowerReport, Visit};
use crate::world::{BlockId, Dimension, Palette, Pos, WorldState, AIR, XZ_BOUNDS, Y_BOUNDS};

/// Every tool of the sandbox.
pub fn all(palette: Arc<Palette>) -> Vec<AgentTool<Visit>> {
    vec![
        world_info(),
        look(),
        observe(),
        get_block(),
        place_block(palette.clone()),
        crate::batch::place_blocks(palette.clone()),
        break_block(palette.clone()),
        travel(),
        crate::tower::build_tower(palette),
        note(),
        notes(),
    ]
}

/// Runs one main-thread step that can itself fail.
pub(crate) async fn step<R: Send + 'static>(
    ctx: &CallContext<Visit>,
    f: impl FnOnce(&mut World, &mut Visit) -> Result<R, ToolError> + Send + 'static,
) -> Result<R, ToolError> {
    ctx.on_client(f).await?
}

/// The dimension a `Location` call was admitted in.
pub(crate) fn called_in(ctx: &CallContext<Visit>) -> Result<Dimension, ToolError> {
    Dimension::parse(ctx.visit().location.dimension.as_str()).map_err(ToolError::internal)
}

/// The error of a block that would go where the player stands under a ceiling (see
/// [`WorldState::would_trap_player`](crate::world::WorldState::would_trap_player)).
pub(crate) fn player_in_the_way(pos: Pos) -> ToolError {
    ToolError::new(
        "BLOCKED",
        format!("the player stands at {pos} with no room above to step up: the block would trap them"),
    )
    .with_detail("player", true)
}

pub(crate) fn block_id(palette: &Palette, name: &str) -> Result<BlockId, ToolError> {
    match palette.id(name).filter(|_| palette.placeable().any(|placeable| placeable == name)) {
        Some(id) => Ok(id),
        None => {
            let names: Vec<&str> = palette.placeable().collect();
            Err(ToolError::invalid_input(
                "block",
                format!("{name:?} is not a block of the palette; use one of: {}", names.join(", ")),
            )
            .with_detail("palette", names))
        }
    }
}

pub(crate) fn bounds_text() -> String {
    format!("x and z in {}..={}, y in {}..={}", XZ_BOUNDS.start(), XZ_BOUNDS.end(), Y_BOUNDS.start(), Y_BOUNDS.end())
}

// ---- world_info -------------------------------------------------------------------------------------------------

#[derive(Serialize, JsonSchema)]
struct WorldInfo {
    world: String,
    visit: u64,
    dimension: Dimension,
    revision: u64,
    /// Where the player stands: the cell their feet are in (the ground they stand on is the block below, at y - 1).
    player: Pos,
    /// How many notes the world has.
    notes: usize,
    /// How many cells were changed, in all dimensions.
    changed_cells: usize,
    /// The latest `build_tower` of this visit, with how many blocks it placed and how it ended.
    last_tower: Option<TowerReport>,
}

fn world_info() -> AgentTool<Visit> {
    AgentTool::new(
        "world_info",
        "Where the player is: world, visit, dimension, location revision, and the player's x/y/z.",
        |ctx: CallContext<Visit>, _: NoArgs| async move {
            step(&ctx, |_, visit| {
                let dimension = visit.dimension()?;
                let (world, id, revision) = (visit.world.to_string(), visit.visit.0, visit.location.revision.0);
                let last_tower = visit.towers.last();
                let state = visit.state()?;
                Ok(WorldInfo {
                    world,
                    visit: id,
                    dimension,
                    revision,
                    player: state.player(dimension),
                    notes: state.notes().len(),
                    changed_cells: state.changed_cells(),
                    last_tower,
                })
            })
            .await
        },
    )
    .read_only()
}

// ---- look and observe -------------------------------------------------------------------------------------------

#[derive(Deserialize, JsonSchema)]
struct LookArgs {
    /// How far to look around the player, in blocks (1 to 16).
    #[schemars(range(min = 1, max = 16))]
    radius: i32,
}

/// A column of the world, by its x (west–east) and z (north–south).
#[derive(Serialize, JsonSchema)]
struct Column {
    x: i32,
    z: i32,
}

#[derive(Serialize, JsonSchema)]
struct LookOutput {
    dimension: Dimension,
    player: Pos,
    radius: i32,
    /// The column of the map's first character (its first row's first column): row r, column c is the column at
    /// x = north_west.x + c, z = north_west.z + r.
    north_west: Column,
    /// One line per z (north first), one character per x (west first): the highest block of each column. `@`
    /// is the player.
    map: String,
    /// The same rows and columns as `map`: the y of each column's highest block, water or lava too (a block
    /// placed on it goes at y + 1, below the world's top and the nether's roof), `null` outside the world or where
    /// a column has none.
    heights: Vec<Vec<Option<i32>>>,
    /// What each character of the map means.
    legend: BTreeMap<String, String>,
}

fn look() -> AgentTool<Visit> {
    AgentTool::new(
        "look",
        "A text map of the columns around the player, seen from above: each character is the highest block of one \
         column (see the legend); `@` is the player. Rows go north to south (z increasing), columns west to east, \
         from the column `north_west` names. `heights` gives the y of each column's highest block (water or lava \
         too) in the same layout: a block placed on it goes at y + 1, where there is room.",
        |ctx: CallContext<Visit>, args: LookArgs| async move {
            let dimension = called_in(&ctx)?;
            step(&ctx, move |_, visit| {
                let state = visit.state()?;
                let player = state.player(dimension);
                let palette = state.palette().clone();
                let mut legend = BTreeMap::from([("@".to_string(), "you".to_string())]);
                let mut map = String::new();
                let mut heights = Vec::new();
                for z in player.z - args.radius..=player.z + args.radius {
                    let mut row = Vec::new();
                    for x in player.x - args.radius..=player.x + args.radius {
                        let inside = XZ_BOUNDS.contains(&x) && XZ_BOUNDS.contains(&z);
                        row.push(inside.then(|| state.top(dimension, x, z).map(|(y, _)| y)).flatten());
                        let symbol = if (x, z) == (player.x, player.z) {
                            '@'
                        } else if !XZ_BOUNDS.contains(&x) || !XZ_BOUNDS.contains(&z) {
                            legend.insert("!".into(), "outside the world".into());
                            '!'
                        } else {
                            let block = state.top(dimension, x, z).map_or(AIR, |(_, block)| block);
                            let kind = palette.kind(block);
                            legend.entry(kind.symbol.to_string()).or_insert_with(|| kind.name.clone());
                            kind.symbol
                        };
                        map.push(symbol);
                    }
                    map.push('\n');
                    heights.push(row);
                }
                let north_west = Column { x: player.x - args.radius, z: player.z - args.radius };
                Ok(LookOutput { dimension, player, radius: args.radius, north_west, map, heights, legend })
            })
            .await
        },
    )
    .scope(ToolScope::Location)
    .read_only()
}

#[derive(Deserialize, JsonSchema)]
struct ObserveArgs {
    /// How far to look around the player, in blocks (1 to 32).
    #[schemars(range(min = 1, max = 32))]
    radius: i32,
}

#[derive(Serialize, JsonSchema)]
struct ObserveOutput {
    /// One line describing the picture.
    summary: String,
    /// The picture (a PNG). Over MCP it travels as image content only.
    picture: ImageContent,
    width: u32,
    height: u32,
}

fn observe() -> AgentTool<Visit> {
    AgentTool::new(
        "observe",
        "A top-down picture (PNG) of the columns around the player, each in its highest block's colour, lighter \
         above the player and darker below; the player is red, in the centre. North is up and west is left; each \
         column is a square of `width / (2 * radius + 1)` pixels. Also a one-line summary.",
        |ctx: CallContext<Visit>, args: ObserveArgs| async move {
            let dimension = called_in(&ctx)?;
            let drawn = step(&ctx, move |_, visit| {
                let state = visit.state()?;
                Ok(picture::top_down(state, dimension, state.player(dimension), args.radius))
            })
            .await?;
            // Encoded here, on the tool's worker: the main thread only gathered the columns.
            let drawn = drawn.encode().map_err(ToolError::internal)?;
            Ok(ObserveOutput {
                summary: drawn.summary,
                picture: ImageContent::png(picture::base64(&drawn.png)),
                width: drawn.width,
                height: drawn.height,
            })
        },
    )
    .scope(ToolScope::Location)
    .read_only()
}

// ---- blocks -----------------------------------------------------------------------------------------------------

#[derive(Deserialize, JsonSchema)]
pub(crate) struct At {
    /// West–east, -256 to 255.
    #[schemars(range(min = -256, max = 255))]
    x: i32,
    /// Height, 0 to 127.
    #[schemars(range(min = 0, max = 127))]
    y: i32,
    /// North–south, -256 to 255.
    #[schemars(range(min = -256, max = 255))]
    z: i32,
}

impl At {
    /// The host checked the arguments against the published schema; checked here too, against the world's own
    /// bounds, so that a world made smaller than the schema says still refuses a block outside it.
    pub fn pos(&self) -> Result<Pos, ToolError> {
        Pos { x: self.x, y: self.y, z: self.z }.check().map_err(|(field, why)| ToolError::invalid_input(field, why))
    }
}

#[derive(Serialize, JsonSchema)]
struct BlockOutput {
    block: String,
    /// Increases each time the cell changes (0: never changed). Pass it as `expected_version` to act only if
    /// nobody changed the cell since.
    version: u64,
}

fn get_block() -> AgentTool<Visit> {
    AgentTool::new(
        "get_block",
        format!("The block at x, y, z in the player's dimension, and its version ({}).", bounds_text()),
        |ctx: CallContext<Visit>, args: At| async move {
            let (dimension, pos) = (called_in(&ctx)?, args.pos()?);
            step(&ctx, move |_, visit| {
                let state = visit.state()?;
                let cell = state.block(dimension, pos);
                Ok(BlockOutput { block: state.palette().name(cell.block).into(), version: cell.version })
            })
            .await
        },
    )
    .scope(ToolScope::Location)
    .read_only()
}

#[derive(Deserialize, JsonSchema)]
pub(crate) struct PlaceArgs {
    #[serde(flatten)]
    pub at: At,
    /// The block to place (one of the palette's names).
    pub block: String,
    /// The cell's version you last read: the block is placed only if the cell has not changed since.
    #[serde(default)]
    pub expected_version: Option<u64>,
}

#[derive(Serialize, JsonSchema)]
pub(crate) struct PlaceOutput {
    pub block: String,
    pub version: u64,
    /// False when the block was already there (nothing changed).
    pub changed: bool,
}

/// Places `block` at `pos`, as `place_block` does (and `place_blocks`, for each of its blocks).
pub(crate) fn place_one(
    state: &mut WorldState,
    dimension: Dimension,
    pos: Pos,
    block: BlockId,
    expected_version: Option<u64>,
) -> Result<PlaceOutput, ToolError> {
    let cell = state.block(dimension, pos);
    check_version(&format!("block {pos}"), expected_version, cell.version)?;
    let name = state.palette().name(block).to_string();
    if cell.block == block {
        return Ok(PlaceOutput { block: name, version: cell.version, changed: false });
    }
    if state.palette().is_solid(cell.block) {
        let there = state.palette().name(cell.block).to_string();
        return Err(ToolError::new(
            "OCCUPIED",
            format!("there is already {there} at {pos}: break it first (break_block)"),
        )
        .with_detail("block", there)
        .with_detail("version", cell.version));
    }
    if state.would_trap_player(dimension, pos, block) {
        return Err(player_in_the_way(pos));
    }
    let version = state.set(dimension, pos, block);
    Ok(PlaceOutput { block: name, version, changed: true })
}

fn place_block(palette: Arc<Palette>) -> AgentTool<Visit> {
    let blocks: Vec<String> = palette.placeable().map(String::from).collect();
    AgentTool::new(
        "place_block",
        format!(
            "Places a block at x, y, z in the player's dimension ({}), into air or liquid; placing the block that is \
             already there changes nothing. With `expected_version`, fails with VERSION_CONFLICT if the cell changed \
             since you read it. Send an `operation_id` to make retries safe.",
            bounds_text()
        ),
        move |ctx: CallContext<Visit>, args: PlaceArgs| {
            let palette = palette.clone();
            async move {
                let (dimension, pos) = (called_in(&ctx)?, args.at.pos()?);
                let block = block_id(&palette, &args.block)?;
                step(&ctx, move |_, visit| place_one(visit.state()?, dimension, pos, block, args.expected_version))
                    .await
            }
        },
    )
    .argument_enum("block", blocks)
    .scope(ToolScope::Location)
    .destructive(false)
    .idempotent(true)
}

#[derive(Deserialize, JsonSchema)]
struct BreakArgs {
    #[serde(flatten)]
    at: At,
    #[serde(flatten)]
    guard: DestructiveGuard,
}

#[derive(Serialize, JsonSchema)]
struct BreakOutput {
    /// What was there.
    broken: String,
    /// The cell's new version (it is air now).
    version: u64,
}

fn break_block(palette: Arc<Palette>) -> AgentTool<Visit> {
    let bedrock = palette.id("bedrock");
    AgentTool::new(
        "break_block",
        format!(
            "Breaks the block at x, y, z in the player's dimension ({}), leaving air. Needs `confirm: true`. With \
             `expected_version`, fails with VERSION_CONFLICT if the cell changed since you read it. Bedrock cannot \
             be broken.",
            bounds_text()
        ),
        // `confirm` is the host's to check (`requires_confirmation`, below: every break is dangerous); the
        // flattened guard brings `expected_version`.
        move |ctx: CallContext<Visit>, args: BreakArgs| async move {
            let (dimension, pos) = (called_in(&ctx)?, args.at.pos()?);
            step(&ctx, move |_, visit| {
                let state = visit.state()?;
                let cell = state.block(dimension, pos);
                args.guard.check_version(&format!("block {pos}"), cell.version)?;
                let broken = state.palette().name(cell.block).to_string();
                if cell.block == AIR {
                    return Err(ToolError::new("NO_BLOCK", format!("there is only air at {pos}: nothing to break"))
                        .with_detail("version", cell.version));
                }
                if Some(cell.block) == bedrock {
                    return Err(ToolError::new("UNBREAKABLE", format!("the bedrock at {pos} cannot be broken")));
                }
                let version = state.set(dimension, pos, AIR);
                Ok(BreakOutput { broken, version })
            })
            .await
        },
    )
    .scope(ToolScope::Location)
    .destructive(true)
    .idempotent(false)
    .requires_confirmation()
}

// ---- travel -----------------------------------------------------------------------------------------------------

#[derive(Deserialize, JsonSchema)]
struct TravelArgs {
    /// Where to go: `overworld` or `nether`.
    dimension: Dimension,
}

#[derive(Serialize, JsonSchema)]
struct TravelOutput {
    dimension: Dimension,
    /// The location revision after the travel.
    revision: u64,
    /// False when the player was already there.
    traveled: bool,
}

fn travel() -> AgentTool<Visit> {
    AgentTool::new(
        "travel",
        "Takes the player to another dimension. Calls of location tools still running (e.g. build_tower) end with \
         LOCATION_CHANGED. Returns the new location revision.",
        |ctx: CallContext<Visit>, args: TravelArgs| async move {
            let to = args.dimension;
            let before = step(&ctx, move |world, visit| {
                let revision = visit.location.revision.0;
                if visit.dimension()? == to {
                    return Ok(Err(revision));
                }
                world.write_message(TravelTo::new(to.as_str()));
                Ok(Ok(revision))
            })
            .await?;
            let before = match before {
                Err(revision) => return Ok(TravelOutput { dimension: to, revision, traveled: false }),
                Ok(revision) => revision,
            };
            // The host applies the travel in the next frame's transitions: look again once a frame until it shows
            // (within a frame or two; the call's timeout bounds it).
            let (dimension, revision) = ctx
                .every_frame(move |_, visit| {
                    let revision = visit.location.revision.0;
                    if revision > before {
                        ControlFlow::Break(visit.dimension().map(|dimension| (dimension, revision)))
                    } else {
                        ControlFlow::Continue(())
                    }
                })
                .await??;
            Ok(TravelOutput { dimension, revision, traveled: true })
        },
    )
    .destructive(false)
    .idempotent(false)
}

// ---- notes ------------------------------------------------------------------------------------------------------

#[derive(Deserialize, JsonSchema)]
struct NoteArgs {
    /// What to remember about this world (1 to 500 characters).
    #[schemars(length(min = 1, max = crate::world::MAX_NOTE_CHARS))]
    text: String,
}

#[derive(Serialize, JsonSchema)]
struct NoteCount {
    /// How many notes the world has now.
    notes: usize,
}

fn note() -> AgentTool<Visit> {
    AgentTool::new(
        "note",
        "Writes a note into this world (kept with its save; up to 500 characters; a world keeps at most 1,000, and \
         notes are never removed). Returns how many notes it has.",
        |ctx: CallContext<Visit>, args: NoteArgs| async move {
            // The schema bounds the length (checked by the host); it cannot say "not only spaces".
            if args.text.trim().is_empty() {
                return Err(ToolError::invalid_input("text", "must not be only spaces"));
            }
            step(&ctx, move |_, visit| {
                let notes = visit.state()?.add_note(args.text).ok_or_else(|| {
                    let most = crate::world::MAX_NOTES;
                    let why = format!(
                        "the world keeps at most {most} notes and has them all: notes are never removed, so keep \
                         this one in your own memory"
                    );
                    ToolError::new("NOTES_FULL", why)
                })?;
                Ok(NoteCount { notes })
            })
            .await
        },
    )
    .destructive(false)
    .idempotent(false)
}

#[derive(Deserialize, JsonSchema)]
struct NotesArgs {
    /// How many of the newest notes to return (1 to 50; 20 if left out).
    #[schemars(range(min = 1, max = 50))]
    last: Option<usize>,
}

#[derive(Serialize, JsonSchema)]
struct NotesOutput {
    /// The newest notes, oldest of them first.
    notes: Vec<String>,
    /// How many notes the world has in all.
    total: usize,
}

fn notes() -> AgentTool<Visit> {
    AgentTool::new(
        "notes",
        "The newest notes written in this world (20, or `last`), oldest of them first, and how many it has in all.",
        |ctx: CallContext<Visit>, args: NotesArgs| async move {
            // At most 50 of 500 characters: an answer a model reads whole, whatever the world keeps.
            let last = args.last.unwrap_or(20);
            step(&ctx, move |_, visit| {
                let all = visit.state()?.notes();
                Ok(NotesOutput { notes: all[all.len().saturating_sub(last)..].to_vec(), total: all.len() })
            })
            .await
        },
    )
    .read_only()
}
