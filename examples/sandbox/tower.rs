//! `build_tower`: a long-running `Location` tool that places one block per frame through one `on_client` step
//! each, reports progress, and stops cleanly when its call ends (travel, exit, cancel).

use std::sync::Arc;
use std::time::Duration;

use bevy::diagnostic::FrameCount;
use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::session::{TowerReport, Visit};
use crate::tools::{block_id, called_in, invalid, step, FrameTime};
use crate::world::{check_xz, Palette, Pos, Y_BOUNDS};

#[derive(Deserialize, JsonSchema)]
struct TowerArgs {
    /// West–east, -256 to 255.
    #[schemars(range(min = -256, max = 255))]
    x: i32,
    /// North–south, -256 to 255.
    #[schemars(range(min = -256, max = 255))]
    z: i32,
    /// How many blocks to stack on the ground (1 to 64).
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

enum Laid {
    Placed,
    /// The frame of the previous block is still running: wait for the next one.
    SameFrame,
}

pub fn build_tower(palette: Arc<Palette>) -> AgentTool<Visit> {
    let blocks: Vec<String> = palette.placeable().map(String::from).collect();
    AgentTool::new(
        "build_tower",
        "Stacks `height` blocks on the ground at x, z, one block per frame, reporting progress. Stops when the \
         call ends (the player travels or leaves, or you cancel); the error then has `placed` in its details, and \
         world_info's `last_tower` says how many blocks were placed and why it stopped.",
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
    let (x, z) = (check_xz("x", args.x).map_err(invalid)?, check_xz("z", args.z).map_err(invalid)?);
    if !(1..=64).contains(&args.height) {
        return Err(ToolError::invalid_input("height", format!("must be in 1..=64, got {}", args.height)));
    }
    let block = block_id(&palette, &args.block)?;
    let (height, request) = (args.height, ctx.request_id().0);
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
    let (base, log, frame) = step(&ctx, move |world, visit| {
        let ground = visit.state()?.surface(dimension, x, z).unwrap_or(0);
        let base = ground + 1;
        let room = Y_BOUNDS.end() - ground;
        if i64::from(height) > i64::from(room) {
            return Err(ToolError::invalid_input(
                "height",
                format!("only {room} blocks fit above the ground at ({x}, {z}) (y {base}..=127)"),
            ));
        }
        visit.towers.start(report);
        let frame = world.get_resource::<FrameTime>().map_or(Duration::from_secs(1) / 60, |f| f.0);
        Ok((base, visit.towers.clone(), frame))
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
    let mut placed = 0;
    let mut last_frame = None;
    while placed < height {
        tokio::select! {
            biased;
            reason = ctx.ended() => return Err(stopped(reason, placed)),
            () = tokio::time::sleep(frame) => {}
        }
        let pos = Pos { x, y: base + placed as i32, z };
        let log = log.clone();
        let laid = step(&ctx, move |world, visit| {
            let now = world.get_resource::<FrameCount>().map(|f| f.0);
            if now.is_some() && now == last_frame {
                return Ok((Laid::SameFrame, now));
            }
            let state = visit.state()?;
            let cell = state.block(dimension, pos);
            if state.palette().is_solid(cell.block) && cell.block != block {
                let there = state.palette().name(cell.block).to_string();
                return Err(ToolError::new("BLOCKED", format!("{there} at {pos} is in the way")));
            }
            state.set(dimension, pos, block);
            log.update(request, |r| r.placed += 1);
            Ok((Laid::Placed, now))
        })
        .await;
        match laid {
            Ok((Laid::SameFrame, _)) => {}
            Ok((Laid::Placed, now)) => {
                placed += 1;
                last_frame = now;
                // Whoever ends the call (a travel, an exit, a cancel), its error says how far the tower got.
                ctx.set_detail("placed", placed);
                let message = format!("placed {placed} of {height} blocks");
                ctx.report_progress(f64::from(placed), Some(f64::from(height)), Some(message));
            }
            Err(reason) => return Err(stopped(reason, placed)),
        }
    }
    log.update(request, |r| r.status = "finished".into());
    let top = base + placed as i32 - 1;
    Ok(TowerOutput { placed, x, z, from_y: base, to_y: top, block: args.block })
}
