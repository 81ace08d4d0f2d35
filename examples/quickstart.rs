//! A scripted tour of the host, without MCP: one world lifecycle and two tools, called by an in-process agent
//! through enter, travel and exit, with the outcome of each call printed. The app is driven frame by frame by
//! the `testing` harness and exits when the tour ends: to start a game of your own, take the README's "Write your
//! first tool", which runs until closed and serves MCP. Run with `cargo run --example quickstart`.

use std::time::Duration;

use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::AgentTestAppExt;
use bevy_agent_tools::NoArgs;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The game's per-world state.
struct Garden {
    flowers: u32,
}

struct Gardens;

impl WorldLifecycle for Gardens {
    type Session = Garden;

    fn open(&self, visit: &VisitInfo, _world: &mut World) -> Result<Opened<Garden>, OpenError> {
        info!("opening {} as {}", visit.world, visit.visit);
        Ok(Opened::ready(Garden { flowers: 0 }))
    }

    fn close(&self, garden: Garden, _world: &mut World) -> Completion {
        info!("closing a garden with {} flowers", garden.flowers);
        Completion::done()
    }
}

#[derive(Deserialize, JsonSchema)]
struct Plant {
    /// How many flowers to plant.
    // A field's doc comment is its description in the published schema, which the model reads; the range is
    // there too, and checked before the handler runs (`INVALID_INPUT` naming `count` otherwise).
    #[schemars(range(min = 1, max = 100))]
    count: u32,
}

#[derive(Serialize, JsonSchema)]
struct Flowers {
    flowers: u32,
}

fn main() {
    let plant = AgentTool::new("plant", "Plants flowers here.", |ctx: CallContext<Garden>, args: Plant| async move {
        let flowers = ctx.on_client(move |_world, garden| {
            garden.flowers += args.count;
            garden.flowers
        });
        Ok(Flowers { flowers: flowers.await? })
    })
    .scope(ToolScope::Location)
    .destructive(false);
    let count = AgentTool::new("count", "Counts the flowers.", |ctx: CallContext<Garden>, _: NoArgs| async move {
        Ok(Flowers { flowers: ctx.on_client(|_, garden| garden.flowers).await? })
    })
    .read_only();

    let mut app = App::new();
    app.add_plugins((MinimalPlugins, bevy::log::LogPlugin::default())).add_plugins(
        AgentToolsPlugin::new(Gardens).with_tool(plant).with_tool(count).default_timeout(Duration::from_secs(5)),
    );
    app.finish();
    app.cleanup();

    let agent = app.agent().conversation("quickstart");
    let show = |what: &str, outcome: String| println!("{what:<28} {outcome}");

    show("plant before entering:", view(app.run_until_resolved(&agent.call("plant", json!({ "count": 3 })))));
    app.enter_world("meadow");
    show("plant 3 in the meadow:", view(app.run_until_resolved(&agent.call("plant", json!({ "count": 3 })))));
    show("plant 500:", view(app.run_until_resolved(&agent.call("plant", json!({ "count": 500 })))));
    app.travel("greenhouse");
    show("count after travel:", view(app.run_until_resolved(&agent.call("count", json!({})))));
    show("a tool that does not exist:", view(app.run_until_resolved(&agent.call("plnt", json!({})))));
    app.exit_world();
    show("count after exit:", view(app.run_until_resolved(&agent.call("count", json!({})))));
    app.world_mut().write_message(AppExit::Success);
    app.update();
}

fn view(outcome: bevy_agent_tools::CallOutcome) -> String {
    match outcome {
        Ok(output) => {
            format!("ok {} (observed {} at {})", output.value, output.observed.visit, output.observed.location.revision)
        }
        Err(error) => format!("{}: {}", error.code, error.message),
    }
}
