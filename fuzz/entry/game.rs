//! The game the `mcp_body` and `tool_args` targets fuzz: one world whose session is a small board, and tools whose
//! typed arguments cover the shapes agents send (integers, floats, strings, enums tagged three ways, nested and
//! flattened structs, optional and defaulted fields, unknown fields denied), World and Location scope, read-only
//! and destructive, a confirmation and a version guard, and progress over several frames.
//!
//! The tools never panic and never return `INTERNAL` or a code of their own, so any outcome outside the host's
//! codes (DESIGN §5, without `INTERNAL`) is a finding: see [`check_outcome`].

use std::collections::HashMap;

use bevy::prelude::World;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::{check_version, CallOutcome, Completion, DestructiveGuard, NoArgs, VisitId};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The world every fuzz game enters before the first input.
pub const WORLD: &str = "fuzz";

/// Cells the board keeps before it forgets them all: fuzzing runs millions of calls in one process, and memory
/// must not grow with them.
const MAX_CELLS: usize = 4096;

/// The codes a call of these tools may end with. `INTERNAL` is left out on purpose: it means a panic or a broken
/// invariant, which is exactly what fuzzing looks for.
const ALLOWED_CODES: &[ErrorCode] = &[
    ErrorCode::NoWorld,
    ErrorCode::WorldClosed,
    ErrorCode::VisitEnded,
    ErrorCode::LocationChanged,
    ErrorCode::WorldLoadingTimeout,
    ErrorCode::ToolNotFound,
    ErrorCode::InvalidInput,
    ErrorCode::OperationConflict,
    ErrorCode::VersionConflict,
    ErrorCode::ConfirmationRequired,
    ErrorCode::Cancelled,
    ErrorCode::Timeout,
    ErrorCode::Busy,
    ErrorCode::ConversationNotFound,
];

/// Whether `code` is one the host may answer a fuzzed call with (see [`ALLOWED_CODES`]).
pub fn is_allowed_code(code: &ErrorCode) -> bool {
    ALLOWED_CODES.contains(code)
}

/// Panics (the fuzz failure) unless `outcome` is a success observed in `visit` (rule H11) or a structured error
/// with an allowed code, a message and, for `INVALID_INPUT`, the field and the reason (DESIGN §5).
pub fn check_outcome(tool: &str, outcome: &CallOutcome, visit: VisitId) {
    match outcome {
        Ok(output) => assert_eq!(output.observed.visit, visit, "`{tool}` succeeded in another visit: {output:?}"),
        Err(error) => {
            assert!(is_allowed_code(&error.code), "`{tool}` ended with a code outside DESIGN §5: {error:?}");
            assert!(!error.message.is_empty(), "`{tool}` ended with an error without a message: {error:?}");
            if error.code == ErrorCode::InvalidInput {
                let says = |key: &str| error.details.extra.contains_key(key);
                assert!(says("field") && says("reason"), "INVALID_INPUT must name the field and why: {error:?}");
            }
        }
    }
}

/// The lifecycle: every visit starts with an empty board; nothing is saved.
pub struct FuzzGame;

impl WorldLifecycle for FuzzGame {
    type Session = Board;

    fn open(&self, _visit: &VisitInfo, _world: &mut World) -> Result<Opened<Board>, OpenError> {
        Ok(Opened::ready(Board::default()))
    }

    fn close(&self, _board: Board, _world: &mut World) -> Completion {
        Completion::done()
    }
}

/// A visit's state: a counter, cells with versions, notes.
#[derive(Default)]
pub struct Board {
    counter: u64,
    cells: HashMap<Pos, (Block, u64)>,
    notes: usize,
}

impl Board {
    fn version(&self, pos: Pos) -> u64 {
        self.cells.get(&pos).map_or(0, |(_, version)| *version)
    }

    fn set(&mut self, pos: Pos, block: Block) -> u64 {
        if self.cells.len() >= MAX_CELLS {
            self.cells.clear();
        }
        let version = self.version(pos) + 1;
        self.cells.insert(pos, (block, version));
        version
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub struct Pos {
    x: i32,
    y: i32,
    z: i32,
}

/// An externally tagged unit enum, as strings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Block {
    Stone,
    Gold,
    Glass,
}

#[derive(Deserialize, JsonSchema)]
struct BumpArgs {
    /// How much to add.
    #[serde(default = "one")]
    by: u32,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize, JsonSchema)]
struct PlaceArgs {
    #[serde(flatten)]
    at: Pos,
    block: Block,
    expected_version: Option<u64>,
}

#[derive(Deserialize, JsonSchema)]
struct RemoveArgs {
    at: Pos,
    #[serde(flatten)]
    guard: DestructiveGuard,
}

#[derive(Clone, Copy, Deserialize, JsonSchema)]
struct Color {
    r: f32,
    g: f32,
    b: f32,
    alpha: Option<f64>,
}

/// An internally tagged enum: serde buffers the whole object before it knows the variant.
#[derive(Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Pattern {
    Solid,
    Stripes { width: u8 },
    Gradient { to: Color },
}

#[derive(Deserialize, JsonSchema)]
struct PaintArgs {
    from: Pos,
    to: Pos,
    color: Color,
    pattern: Pattern,
    label: Option<String>,
    #[serde(default)]
    tags: Vec<String>,
    scale: Option<f64>,
    offset: Option<i64>,
}

/// An untagged enum: serde tries each variant against buffered content.
#[derive(Deserialize, JsonSchema)]
#[serde(untagged)]
enum Target {
    At(Pos),
    Named(String),
    Many(Vec<Pos>),
}

#[derive(Deserialize, JsonSchema)]
struct LookArgs {
    target: Target,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NoteArgs {
    text: String,
    #[serde(default)]
    pinned: bool,
}

#[derive(Deserialize, JsonSchema)]
struct ProgressArgs {
    /// 1 to 5 frames, each one a step with a progress report.
    steps: u8,
}

#[derive(Serialize, JsonSchema)]
struct Counter {
    counter: u64,
}

#[derive(Serialize, JsonSchema)]
struct Cell {
    block: Option<Block>,
    version: u64,
}

#[derive(Serialize, JsonSchema)]
struct Painted {
    cells: u64,
    label: Option<String>,
}

fn unit_interval(field: &str, value: f64) -> Result<(), ToolError> {
    if (0.0..=1.0).contains(&value) {
        return Ok(());
    }
    Err(ToolError::invalid_input(field, "must be between 0 and 1"))
}

impl Color {
    fn check(&self, field: &str) -> Result<(), ToolError> {
        unit_interval(&format!("{field}.r"), f64::from(self.r))?;
        unit_interval(&format!("{field}.g"), f64::from(self.g))?;
        unit_interval(&format!("{field}.b"), f64::from(self.b))?;
        self.alpha.map_or(Ok(()), |alpha| unit_interval(&format!("{field}.alpha"), alpha))
    }
}

/// The fuzz game's tools, the same for every target.
pub fn tools() -> Vec<AgentTool<Board>> {
    vec![
        AgentTool::new("bump", "Adds to the counter.", |ctx: CallContext<Board>, args: BumpArgs| async move {
            let counter = ctx
                .on_client(move |_, board| {
                    board.counter = board.counter.wrapping_add(u64::from(args.by));
                    board.counter
                })
                .await?;
            Ok(Counter { counter })
        })
        .destructive(false),
        AgentTool::new("peek", "Reads the counter.", |ctx: CallContext<Board>, _: NoArgs| async move {
            Ok(Counter { counter: ctx.on_client(|_, board| board.counter).await? })
        })
        .read_only(),
        AgentTool::new("place", "Places a block here.", |ctx: CallContext<Board>, args: PlaceArgs| async move {
            let version = ctx
                .on_client(move |_, board| {
                    check_version("the cell", args.expected_version, board.version(args.at))?;
                    Ok::<_, ToolError>(board.set(args.at, args.block))
                })
                .await??;
            Ok(Cell { block: Some(args.block), version })
        })
        .scope(ToolScope::Location)
        .destructive(false),
        AgentTool::new("remove", "Removes a block.", |ctx: CallContext<Board>, args: RemoveArgs| async move {
            args.guard.confirmed()?;
            let version = ctx
                .on_client(move |_, board| {
                    args.guard.check_version("the cell", board.version(args.at))?;
                    Ok::<_, ToolError>(board.cells.remove(&args.at).map_or(0, |(_, version)| version))
                })
                .await??;
            Ok(Cell { block: None, version })
        })
        .requires_confirmation(),
        AgentTool::new("paint", "Paints an area.", |ctx: CallContext<Board>, args: PaintArgs| async move {
            args.color.check("color")?;
            if let Pattern::Gradient { to } = &args.pattern {
                to.check("pattern.to")?;
            }
            if let Pattern::Stripes { width: 0 } = args.pattern {
                return Err(ToolError::invalid_input("pattern.width", "must be at least 1"));
            }
            if args.label.as_ref().is_some_and(|label| label.chars().count() > 64) {
                return Err(ToolError::invalid_input("label", "must be at most 64 characters"));
            }
            if args.tags.len() > 8 {
                return Err(ToolError::invalid_input("tags", "at most 8 tags"));
            }
            if args.scale.is_some_and(|scale| !(scale > 0.0 && scale <= 16.0)) {
                return Err(ToolError::invalid_input("scale", "must be in (0, 16]"));
            }
            let span = |a: i32, b: i32| u64::from(a.abs_diff(b)) + 1;
            let cells = span(args.from.x, args.to.x)
                .saturating_mul(span(args.from.y, args.to.y))
                .saturating_mul(span(args.from.z, args.to.z));
            let offset = args.offset.unwrap_or(0);
            let counter = ctx.on_client(move |_, board| board.counter.wrapping_add_signed(offset)).await?;
            Ok(Painted { cells: cells.wrapping_add(counter), label: args.label })
        })
        .destructive(false),
        AgentTool::new("look", "Looks at something.", |ctx: CallContext<Board>, args: LookArgs| async move {
            let at = match args.target {
                Target::At(pos) => vec![pos],
                Target::Named(name) if name.is_empty() => {
                    return Err(ToolError::invalid_input("target", "name something"));
                }
                Target::Named(_) => Vec::new(),
                Target::Many(positions) => positions.into_iter().take(16).collect(),
            };
            let cells = ctx
                .on_client(move |_, board| {
                    at.iter()
                        .map(|pos| {
                            let cell = board.cells.get(pos);
                            Cell { block: cell.map(|(block, _)| *block), version: cell.map_or(0, |(_, v)| *v) }
                        })
                        .collect::<Vec<_>>()
                })
                .await?;
            Ok(serde_json::json!({ "cells": cells }))
        })
        .read_only(),
        AgentTool::new("note", "Writes a note.", |ctx: CallContext<Board>, args: NoteArgs| async move {
            if args.text.chars().count() > 200 {
                return Err(ToolError::invalid_input("text", "must be at most 200 characters"));
            }
            let notes = ctx
                .on_client(move |_, board| {
                    board.notes = board.notes.wrapping_add(1 + usize::from(args.pinned));
                    board.notes
                })
                .await?;
            Ok(serde_json::json!({ "notes": notes }))
        })
        .destructive(false),
        AgentTool::new("progress", "Takes a few frames.", |ctx: CallContext<Board>, args: ProgressArgs| async move {
            if !(1..=5).contains(&args.steps) {
                return Err(ToolError::invalid_input("steps", "must be between 1 and 5"));
            }
            for step in 1..=args.steps {
                ctx.on_client(|_, board| board.counter).await?;
                ctx.report_progress(f64::from(step), Some(f64::from(args.steps)), None);
            }
            Ok(Counter { counter: u64::from(args.steps) })
        })
        .destructive(false),
    ]
}

/// The host plugin with every tool registered.
pub fn plugin() -> AgentToolsPlugin<FuzzGame> {
    tools().into_iter().fold(AgentToolsPlugin::new(FuzzGame), |plugin, tool| plugin.with_tool(tool))
}
