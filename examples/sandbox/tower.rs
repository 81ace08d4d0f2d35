//! `build_tower`: a long-running `Location` tool that places one block per frame through
//! [`CallContext::every_frame`], reports progress, and stops cleanly when its call ends (travel, exit, cancel).

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::session::{TowerReport, Visit};
use crate::tools::{block_id, called_in, player_in_the_way, step};
use crate::world::{Palette, Pos, Y_BOUNDS};

#[derive(Deserialize, JsonSchema)]
struct TowerArgs {
    /// West–east, -256 to 255.
    #[schemars(range(min = -256, max = 255))]
    x: i32,
    /// North–south, -256 to 255.
    #[schemars(range(min = -256, max = 255))]
    z: i32,
    /// How many blocks to stack on the column's highest block (1 to 64).
    #[schemars(range(min = 1, max = 64))]
    height: u32,
    /// A block name from the palette.
    block: String,
}

#[derive(Serialize, JsonSchema)]
struct TowerOutput {
    /// How many blocks were placed.
    placed: u32,
    x: i32,
    z: i32,
    /// The lowest and highest block of the tower.
    from_y: i32,
    to_y: i32,
    block: String,
}

pub fn build_tower(palette: Arc<Palette>) -> AgentTool<Visit> {
    let blocks: Vec<String> = palette.placeable().map(String::from).collect();
    AgentTool::new(
        "build_tower",
        "Stacks `height` blocks on the highest block of the column at x, z (under water or lava, on the bottom: \
         the tower rises \
         through the liquid), one block per frame, reporting progress; a player standing there rides up on it. \
         Refused with BLOCKED (nothing placed; `room` in its details) when fewer than `height` blocks fit under \
         the first block above. Stops when the call ends (the player travels or leaves, or you cancel), or with \
         BLOCKED when something gets in the way (a block, or the player's head against a ceiling); the error then \
         has `placed` in its details, and world_info's `last_tower` says how many blocks were placed and why it \
         stopped.",
        move |ctx: CallContext<Visit>, args: TowerArgs| {
            let palette = palette.clone();
            async move { tower(ctx, args, palette).await }
        },
    )
    .argument_enum("block", blocks)
    .scope(ToolScope::Location)
    .destructive(false)
    .idempotent(false)
    .timeout(Duration::from_secs(300))
}

async fn tower(ctx: CallContext<Visit>, args: TowerArgs, palette: Arc<Palette>) -> Result<TowerOutput, ToolError> {
    let dimension = called_in(&ctx)?;
    // x, z and height are within the published schema's bounds: the host checked them before this ran.
    let (x, z, height) = (args.x, args.z, args.height);
    let block = block_id(&palette, &args.block)?;
    // Said before any step: a travel, an exit or a cancel may end the call before the first block, or before the
    // step that finds where it starts.
    ctx.set_detail("placed", 0);
    let request = ctx.request_id().0;
    let report = TowerReport {
        request,
        dimension,
        x,
        z,
        block: args.block.clone(),
        height,
        placed: 0,
        status: "building".into(),
    };
    let (base, log) = step(&ctx, move |_world, visit| {
        let state = visit.state()?;
        let solid = |y: i32| state.palette().is_solid(state.block(dimension, Pos { x, y, z }).block);
        // On the solid ground, also under a lake or a sea (where a player there stands).
        let mut base = state.surface(dimension, x, z).map_or(0, |ground| ground + 1);
        while base > *Y_BOUNDS.start() && !solid(base - 1) {
            base -= 1;
        }
        // Up to the first solid block in the way (the nether's roof), or the top of the world.
        let room = (base..=*Y_BOUNDS.end()).take_while(|y| !solid(*y)).count();
        if height as usize > room {
            let message = match room {
                0 => format!("no block fits above the ground at ({x}, {z}): y {base} is taken"),
                _ => format!(
                    "only {room} blocks fit above the ground at ({x}, {z}) (y {base}..={}): a block is in the way",
                    base + room as i32 - 1
                ),
            };
            return Err(ToolError::new("BLOCKED", message).with_detail("placed", 0).with_detail("room", room));
        }
        visit.towers.start(report);
        Ok((base, visit.towers.clone()))
    })
    .await?;
    let stopped = |reason: ToolError, placed: u32| {
        log.update(request, |r| r.status = reason.code.to_string());
        info!(%dimension, x, z, placed, height, code = %reason.code, "tower stopped");
        ToolError {
            message: format!("{}; the tower stopped after {placed} of {height} blocks", reason.message),
            ..reason
        }
        .with_detail("placed", placed)
    };
    // One block per frame: the host runs the step once each frame, rechecking the call (a travel, an exit or a
    // cancel stops it before the next block) as it does every main-thread step.
    let placed = Arc::new(AtomicU32::new(0));
    let (progress, counted, step_log) = (ctx.clone(), placed.clone(), log.clone());
    let built = ctx
        .every_frame(move |_world, visit| {
            let done = counted.load(Ordering::Relaxed);
            let pos = Pos { x, y: base + done as i32, z };
            let state = match visit.state() {
                Ok(state) => state,
                Err(error) => return ControlFlow::Break(Err(error)),
            };
            let cell = state.block(dimension, pos);
            if state.palette().is_solid(cell.block) {
                let there = state.palette().name(cell.block).to_string();
                return ControlFlow::Break(Err(ToolError::new("BLOCKED", format!("{there} at {pos} is in the way"))));
            }
            // The tower lifts a player standing on it, until their head reaches a ceiling.
            if state.would_trap_player(dimension, pos, block) {
                return ControlFlow::Break(Err(player_in_the_way(pos)));
            }
            state.set(dimension, pos, block);
            step_log.update(request, |r| r.placed += 1);
            let done = done + 1;
            counted.store(done, Ordering::Relaxed);
            // Whoever ends the call (a travel, an exit, a cancel), its error says how far the tower got.
            progress.set_detail("placed", done);
            let message = format!("placed {done} of {height} blocks");
            progress.report_progress(f64::from(done), Some(f64::from(height)), Some(message));
            if done == height {
                ControlFlow::Break(Ok(()))
            } else {
                ControlFlow::Continue(())
            }
        })
        .await;
    let placed = placed.load(Ordering::Relaxed);
    match built.and_then(|built| built) {
        Ok(()) => {
            log.update(request, |r| r.status = "finished".into());
            let top = base + placed as i32 - 1;
            Ok(TowerOutput { placed, x, z, from_y: base, to_y: top, block: args.block })
        }
        Err(reason) => Err(stopped(reason, placed)),
    }
}
