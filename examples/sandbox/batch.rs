//! `place_blocks`: many `place_block`s in one call, so that a model building a floor or a wall spends one round
//! trip rather than one per block. All of them in one main-thread step, in order, each answered on its own.

use std::sync::Arc;

use bevy_agent_tools::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::session::Visit;
use crate::tools::{block_id, bounds_text, called_in, place_one, step, PlaceArgs, PlaceOutput};
use crate::world::Palette;

/// The most blocks one call places: one frame's work, and an answer a model reads whole.
const MOST: usize = 64;

#[derive(Deserialize, JsonSchema)]
struct PlaceManyArgs {
    /// The blocks to place, in order, each as `place_block` takes it (1 to 64).
    #[schemars(length(min = 1, max = 64))]
    blocks: Vec<PlaceArgs>,
}

#[derive(Serialize, JsonSchema)]
struct PlacedOne {
    /// As `place_block` answers: the block and the cell's version, whether it changed.
    #[serde(flatten)]
    placed: Option<PlaceOutput>,
    /// Why this one was not placed (`CODE: message`), as `place_block` would have failed; the others are placed
    /// all the same.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Serialize, JsonSchema)]
struct PlaceManyOutput {
    /// One per block asked for, in the same order.
    results: Vec<PlacedOne>,
    /// How many cells changed.
    changed: usize,
}

/// Places up to [`MOST`] blocks in one step.
pub fn place_blocks(palette: Arc<Palette>) -> AgentTool<Visit> {
    AgentTool::new(
        "place_blocks",
        format!(
            "Places up to {MOST} blocks, in order, as `place_block` places each ({}): one call for a floor or a \
             wall. Each block is answered on its own, in the same order: placed, or why not (the others are placed \
             all the same). Send an `operation_id` to make retries safe.",
            bounds_text()
        ),
        move |ctx: CallContext<Visit>, args: PlaceManyArgs| {
            let palette = palette.clone();
            async move {
                let dimension = called_in(&ctx)?;
                if args.blocks.len() > MOST {
                    return Err(ToolError::invalid_input("blocks", format!("at most {MOST} blocks in one call")));
                }
                // Read before the step: a wrong position or block name is this block's answer, not the call's.
                let asked: Vec<_> = args
                    .blocks
                    .into_iter()
                    .map(|one| Ok((one.at.pos()?, block_id(&palette, &one.block)?, one.expected_version)))
                    .collect();
                step(&ctx, move |_, visit| {
                    let state = visit.state()?;
                    let results: Vec<PlacedOne> = asked
                        .into_iter()
                        .map(|one: Result<_, ToolError>| {
                            let placed = one
                                .and_then(|(pos, block, expected)| place_one(state, dimension, pos, block, expected));
                            match placed {
                                Ok(placed) => PlacedOne { placed: Some(placed), error: None },
                                Err(error) => PlacedOne {
                                    placed: None,
                                    error: Some(format!("{}: {}", error.code, error.message)),
                                },
                            }
                        })
                        .collect();
                    let changed = results.iter().filter(|one| one.placed.as_ref().is_some_and(|p| p.changed)).count();
                    Ok(PlaceManyOutput { results, changed })
                })
                .await
            }
        },
    )
    .scope(ToolScope::Location)
    .destructive(false)
    .idempotent(true)
}
