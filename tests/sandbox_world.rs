//! The sandbox example's world and tools, in process: terrain, bounds, versions, saves, and the tools through the
//! host (enter, place, conflict, replay, travel during a tower, exit, re-enter). The example's modules are
//! compiled into this test with `#[path]`, so they are tested exactly as the example runs them.

#[allow(dead_code)]
#[path = "../examples/sandbox/batch.rs"]
mod batch;
#[allow(dead_code)]
#[path = "../examples/sandbox/output.rs"]
mod output;
#[allow(dead_code)]
#[path = "../examples/sandbox/picture.rs"]
mod picture;
#[allow(dead_code)]
#[path = "../examples/sandbox/session.rs"]
mod session;
#[allow(dead_code)]
#[path = "../examples/sandbox/terrain.rs"]
mod terrain;
#[allow(dead_code)]
#[path = "../examples/sandbox/tools.rs"]
mod tools;
#[allow(dead_code)]
#[path = "../examples/sandbox/tower.rs"]
mod tower;
#[allow(dead_code)]
#[path = "../examples/sandbox/view.rs"]
mod view;
#[allow(dead_code)]
#[path = "../examples/sandbox/world.rs"]
mod world;

use std::sync::Arc;

use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::AgentTestAppExt;
use bevy_agent_tools::{CallOutcome, CallRequest, VisitSaved, WorldStorePlugin};
use serde_json::{json, Value};

use world::{Dimension, Palette, Pos, WorldState};

fn palette() -> Arc<Palette> {
    Arc::new(Palette::parse(include_str!("../assets/palette.json")).expect("the palette parses"))
}

fn sandbox(data_dir: &std::path::Path) -> App {
    sandbox_autosaving(data_dir, session::AUTOSAVE_EVERY)
}

fn sandbox_autosaving(data_dir: &std::path::Path, every: std::time::Duration) -> App {
    let palette = palette();
    let sandbox = session::Sandbox::new(palette.clone()).autosave_every(every);
    let host = tools::all(palette).into_iter().fold(AgentToolsPlugin::new(sandbox), |host, tool| host.with_tool(tool));
    let mut app = App::new();
    app.add_plugins(MinimalPlugins).add_plugins(host).add_plugins(WorldStorePlugin::new(data_dir));
    app.finish();
    app.cleanup();
    app
}

fn ok(outcome: CallOutcome) -> Value {
    outcome.unwrap_or_else(|error| panic!("expected success, got {error}")).value
}

fn err(outcome: CallOutcome) -> bevy_agent_tools::ToolError {
    outcome.expect_err("expected an error")
}

fn call(app: &mut App, tool: &str, args: Value) -> CallOutcome {
    let call = app.agent().conversation("test").call(tool, args);
    app.run_until_resolved(&call)
}

fn wait_saved(app: &mut App) {
    app.run_until("the visit is saved", |app| {
        !app.world_mut().resource_mut::<Messages<VisitSaved>>().drain().collect::<Vec<_>>().is_empty()
    });
}

#[test]
fn terrain_is_the_same_for_the_same_name_and_differs_between_names_and_dimensions() {
    let palette = palette();
    let (a, again, b) = (
        WorldState::generate("alpha", palette.clone()),
        WorldState::generate("alpha", palette.clone()),
        WorldState::generate("beta", palette),
    );
    let samples: Vec<Pos> =
        (-256..=255).step_by(37).flat_map(|x| (0..=127).step_by(9).map(move |y| Pos { x, y, z: x / 2 })).collect();
    let blocks = |w: &WorldState, d| samples.iter().map(|p| w.block(d, *p).block).collect::<Vec<_>>();
    assert_eq!(blocks(&a, Dimension::Overworld), blocks(&again, Dimension::Overworld));
    assert_eq!(blocks(&a, Dimension::Nether), blocks(&again, Dimension::Nether));
    assert_ne!(blocks(&a, Dimension::Overworld), blocks(&b, Dimension::Overworld), "another name, other terrain");
    assert_ne!(blocks(&a, Dimension::Overworld), blocks(&a, Dimension::Nether), "each dimension has its own");
    let nether_roof = a.block(Dimension::Nether, Pos { x: 0, y: 127, z: 0 }).block;
    assert_eq!(a.palette().name(nether_roof), "bedrock");
}

#[test]
fn bounds_are_checked_and_name_the_field() {
    assert!(Pos { x: -256, y: 0, z: 255 }.check().is_ok());
    assert_eq!(Pos { x: 256, y: 0, z: 0 }.check().unwrap_err().0, "x");
    assert_eq!(Pos { x: 0, y: 128, z: 0 }.check().unwrap_err().0, "y");
    assert_eq!(Pos { x: 0, y: 0, z: -257 }.check().unwrap_err().0, "z");
}

#[test]
fn bedrock_which_nothing_breaks_is_not_placed_by_a_tool() {
    let data = tempfile::tempdir().expect("a data dir");
    let mut app = sandbox(data.path());
    app.enter_world("alpha");
    for (tool, args) in [
        ("place_block", json!({ "x": 3, "y": 100, "z": 3, "block": "bedrock" })),
        ("build_tower", json!({ "x": 3, "z": 3, "height": 2, "block": "bedrock" })),
    ] {
        let error = err(call(&mut app, tool, args));
        assert_eq!(error.code, bevy_agent_tools::ErrorCode::InvalidInput, "{tool}: {error}");
        assert_eq!(error.details.extra["field"], "block", "{tool}: {error:?}");
    }
    assert!(!palette().placeable().any(|name| name == "bedrock"));
}

#[test]
fn a_cell_version_increases_on_every_change_and_survives_a_save() {
    let palette = palette();
    let mut state = WorldState::generate("alpha", palette.clone());
    let at = Pos { x: 3, y: 100, z: -4 };
    assert_eq!(state.block(Dimension::Overworld, at).version, 0);
    let stone = palette.id("stone").expect("stone");
    assert_eq!(state.set(Dimension::Overworld, at, stone), 1);
    assert_eq!(state.set(Dimension::Overworld, at, world::AIR), 2);
    assert_eq!(state.set(Dimension::Overworld, at, stone), 3);
    assert_eq!(state.block(Dimension::Nether, at).version, 0, "the nether has its own cells");
    state.add_note("a note".into());
    let (restored, warnings) = WorldState::from_save("alpha", palette, state.to_save());
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(restored.block(Dimension::Overworld, at).version, 3);
    assert_eq!(restored.block(Dimension::Overworld, at).block, stone);
    assert_eq!(restored.notes(), ["a note"]);
}

#[test]
fn observe_returns_a_png_of_the_asked_size() {
    let state = WorldState::generate("alpha", palette());
    let drawn =
        picture::top_down(&state, Dimension::Overworld, state.player(Dimension::Overworld), 4).encode().expect("drawn");
    assert_eq!(&drawn.png[..8], b"\x89PNG\r\n\x1a\n");
    assert_eq!(&drawn.png[12..16], b"IHDR");
    assert_eq!(u32::from_be_bytes(drawn.png[16..20].try_into().expect("4 bytes")), drawn.width);
    assert!(drawn.summary.contains("overworld"), "{}", drawn.summary);
    assert_eq!(picture::base64(b"any carnal pleas"), "YW55IGNhcm5hbCBwbGVhcw==");
}

#[test]
fn a_changed_world_is_saved_while_the_player_is_in_it_so_a_crash_loses_only_what_came_after() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut app = sandbox_autosaving(dir.path(), std::time::Duration::ZERO);
    app.enter_world("alpha");
    let (x, y, z) = (5, 120, 5);
    ok(call(&mut app, "place_block", json!({"x": x, "y": y, "z": z, "block": "gold"})));
    let summary = |app: &mut App| {
        let summary = app.world().resource::<session::VisitSummary>();
        summary.0.as_ref().map_or((0, 0), |summary| (summary.changes, summary.autosaved))
    };
    // The frame after the change: its count includes it.
    app.update();
    let (changes, _) = summary(&mut app);
    assert!(changes > 0);
    app.run_until("the change is saved", |app| summary(app).1 >= changes);
    // The game dies: no exit, no close, no save at the end.
    drop(app);

    let mut app = sandbox_autosaving(dir.path(), std::time::Duration::ZERO);
    app.enter_world("alpha");
    let cell = ok(call(&mut app, "get_block", json!({"x": x, "y": y, "z": z})));
    assert_eq!((cell["block"].as_str(), cell["version"].as_u64()), (Some("gold"), Some(1)));
    // A visit changes nothing by going on (the player arrives once): nothing is saved again and again.
    for _ in 0..3 {
        app.update();
    }
    assert_eq!(summary(&mut app), (0, 0), "nothing changed, nothing saved");
}

#[test]
fn tools_place_conflict_replay_break_and_note_then_the_world_is_there_on_the_next_visit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut app = sandbox(dir.path());
    app.enter_world("alpha");
    let info = ok(call(&mut app, "world_info", json!({})));
    assert_eq!(info["dimension"], "overworld");
    let (x, y, z) = (5, 120, 5);

    let placed = ok(call(&mut app, "place_block", json!({"x": x, "y": y, "z": z, "block": "gold"})));
    assert_eq!(placed["version"], 1);
    let stale =
        err(call(&mut app, "place_block", json!({"x": x, "y": y, "z": z, "block": "gold", "expected_version": 0})));
    assert_eq!(stale.code, ErrorCode::VersionConflict);

    let unknown = err(call(&mut app, "place_block", json!({"x": x, "y": y + 1, "z": z, "block": "diamond"})));
    assert_eq!(unknown.code, ErrorCode::InvalidInput);
    assert!(unknown.message.contains("block") && unknown.message.contains("planks"), "{}", unknown.message);
    let outside = err(call(&mut app, "get_block", json!({"x": 300, "y": 1, "z": 0})));
    assert_eq!(outside.details.extra["field"], "x");

    let conversation = app.agent().conversation("retry");
    let args = json!({"x": x, "y": y + 1, "z": z, "block": "brick"});
    let first =
        app.run_until_resolved(&conversation.request(CallRequest::new("place_block", args.clone()).operation("op-1")));
    let again = app.run_until_resolved(&conversation.request(CallRequest::new("place_block", args).operation("op-1")));
    assert_eq!(first, again, "a retry with the same operation id gets the same outcome");
    assert_eq!(ok(call(&mut app, "get_block", json!({"x": x, "y": y + 1, "z": z})))["version"], 1, "it ran once");

    let unconfirmed = err(call(&mut app, "break_block", json!({"x": x, "y": y, "z": z})));
    assert_eq!(unconfirmed.code, ErrorCode::ConfirmationRequired);
    let broken =
        ok(call(&mut app, "break_block", json!({"x": x, "y": y, "z": z, "confirm": true, "expected_version": 1})));
    assert_eq!((broken["broken"].as_str(), broken["version"].as_u64()), (Some("gold"), Some(2)));
    assert_eq!(ok(call(&mut app, "note", json!({"text": "gold was here"})))["notes"], 1);
    let long = err(call(&mut app, "note", json!({"text": "x".repeat(501)})));
    assert_eq!(long.details.extra["field"], "text");

    app.exit_world();
    wait_saved(&mut app);
    app.enter_world("alpha");
    let cell = ok(call(&mut app, "get_block", json!({"x": x, "y": y + 1, "z": z})));
    assert_eq!((cell["block"].as_str(), cell["version"].as_u64()), (Some("brick"), Some(1)));
    assert_eq!(ok(call(&mut app, "get_block", json!({"x": x, "y": y, "z": z})))["version"], 2);
    assert_eq!(ok(call(&mut app, "notes", json!({})))["notes"], json!(["gold was here"]));
    // The newest ones only, as many as asked (a model reads the answer whole), and how many there are.
    ok(call(&mut app, "note", json!({"text": "then brick"})));
    let newest = ok(call(&mut app, "notes", json!({"last": 1})));
    assert_eq!((newest["notes"].clone(), newest["total"].clone()), (json!(["then brick"]), json!(2)));
    assert_eq!(err(call(&mut app, "notes", json!({"last": 51}))).code, ErrorCode::InvalidInput);
}

#[test]
fn travel_during_build_tower_stops_it_with_location_changed_and_the_count_is_kept() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut app = sandbox(dir.path());
    app.enter_world("alpha");
    ok(call(&mut app, "world_info", json!({})));
    let tower = app
        .agent()
        .conversation("builder")
        .call("build_tower", json!({"x": 10, "z": 10, "height": 64, "block": "planks"}));
    app.run_until("a few blocks are placed", |app| {
        let info = ok(call(app, "world_info", json!({})));
        info["last_tower"]["placed"].as_u64().is_some_and(|placed| placed >= 3)
    });
    let traveled = ok(call(&mut app, "travel", json!({"dimension": "nether"})));
    assert_eq!((traveled["dimension"].as_str(), traveled["revision"].as_u64()), (Some("nether"), Some(1)));
    let stopped = err(app.run_until_resolved(&tower));
    assert_eq!(stopped.code, ErrorCode::LocationChanged);

    let info = ok(call(&mut app, "world_info", json!({})));
    let report = &info["last_tower"];
    let placed = report["placed"].as_u64().expect("placed");
    assert!((3..64).contains(&placed), "{report}");
    assert_eq!(report["status"], "LOCATION_CHANGED");
    assert_eq!(stopped.details.extra["placed"].as_u64(), Some(placed), "the agent's error says how far it got");
    ok(call(&mut app, "travel", json!({"dimension": "overworld"})));
    let base = ok(call(&mut app, "look", json!({"radius": 1})));
    assert_eq!(base["dimension"], "overworld");
    let mut planks = 0;
    for y in 0..=127 {
        if ok(call(&mut app, "get_block", json!({"x": 10, "y": y, "z": 10})))["block"] == "planks" {
            planks += 1;
        }
    }
    assert_eq!(planks, placed, "the report counts exactly the blocks in the world");
}

#[test]
fn place_blocks_places_a_floor_in_one_call_and_answers_each_block_on_its_own() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut app = sandbox(dir.path());
    app.enter_world("alpha");
    let seen = ok(call(&mut app, "look", json!({"radius": 1})));
    let (px, pz) = (seen["player"]["x"].as_i64().unwrap(), seen["player"]["z"].as_i64().unwrap());
    let y = seen["heights"][1][2].as_i64().expect("the column east of the player") + 1;
    let at = |dx: i64, block: &str| json!({"x": px + dx, "y": y, "z": pz, "block": block});
    // Two blocks placed; one of a name the palette lacks, and one into a cell the first of them filled: refused,
    // each on its own, and the rest placed all the same.
    let asked = json!({"blocks": [at(1, "gold"), at(1, "stone"), at(1, "unobtainium"), at(2, "brick")]});
    let placed = ok(call(&mut app, "place_blocks", asked));
    let results = placed["results"].as_array().expect("results").clone();
    assert_eq!(results.len(), 4, "{placed}");
    assert_eq!((results[0]["block"].as_str(), results[0]["changed"].as_bool()), (Some("gold"), Some(true)));
    assert!(results[1]["error"].as_str().is_some_and(|why| why.starts_with("OCCUPIED")), "{placed}");
    assert!(results[2]["error"].as_str().is_some_and(|why| why.contains("unobtainium")), "{placed}");
    assert_eq!(results[3]["changed"], true, "{placed}");
    assert_eq!(placed["changed"], 2);
    // What clients that check a result against the published output schema (the TypeScript SDK) accept.
    let tools = app.agent().tools();
    let schema = tools.iter().find(|tool| tool.name == "place_blocks").expect("listed").client_output_schema();
    let published = jsonschema::validator_for(&schema).expect("a schema");
    assert!(published.is_valid(&placed), "{placed} against {schema}");
    let east = ok(call(&mut app, "get_block", json!({"x": px + 1, "y": y, "z": pz})));
    assert_eq!(east["block"], "gold", "the refused stone changed nothing");
    let too_many = json!({"blocks": (0..65).map(|dx| at(dx, "gold")).collect::<Vec<_>>()});
    assert_eq!(err(call(&mut app, "place_blocks", too_many)).code, ErrorCode::InvalidInput);
}

#[test]
fn look_gives_each_columns_ground_height_where_a_block_placed_on_it_goes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut app = sandbox(dir.path());
    app.enter_world("alpha");
    let seen = ok(call(&mut app, "look", json!({"radius": 1})));
    let player = &seen["player"];
    let (px, pz) = (player["x"].as_i64().unwrap(), player["z"].as_i64().unwrap());
    // Rows north to south, columns west to east, the player in the middle: the first row's first column is the
    // one `north_west` names.
    assert_eq!((seen["north_west"]["x"].as_i64(), seen["north_west"]["z"].as_i64()), (Some(px - 1), Some(pz - 1)));
    let east = seen["heights"][1][2].as_i64().expect("a column in the world");
    let on_it = json!({"x": px + 1, "y": east + 1, "z": pz, "block": "gold"});
    assert_eq!(ok(call(&mut app, "place_block", on_it))["changed"], true);
    let again = ok(call(&mut app, "look", json!({"radius": 1})));
    assert_eq!(again["heights"][1][2].as_i64(), Some(east + 1), "{again}");
    assert_eq!(again["map"].as_str().unwrap().lines().nth(1).unwrap().chars().nth(2), Some('$'), "{again}");
}

#[test]
fn walking_into_a_column_solid_up_to_the_nether_roof_is_a_wall_the_player_never_climbs_into() {
    let mut state = WorldState::generate("alpha", palette());
    let start = state.arrive(Dimension::Nether);
    let netherrack = state.palette().id("netherrack").expect("in the palette");
    let next = Pos { x: start.x + 1, ..start };
    for y in start.y..=127 {
        state.set(Dimension::Nether, Pos { y, ..next }, netherrack);
    }
    assert_eq!(state.walk(Dimension::Nether, 1, 0), start, "a wall: the player stays");
    assert_eq!(state.player(Dimension::Nether), start);
    // The control: with one free cell at the top, the step climbs the column.
    state.set(Dimension::Nether, Pos { y: 127, ..next }, world::AIR);
    assert_eq!(state.walk(Dimension::Nether, 1, 0), Pos { y: 127, ..next });
}

#[test]
fn build_tower_in_the_nether_says_how_many_blocks_fit_under_its_roof() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut app = sandbox(dir.path());
    app.enter_world("alpha");
    ok(call(&mut app, "travel", json!({"dimension": "nether"})));
    // The same terrain as the game's: the free cells above the solid ground of a column (under any lava lake),
    // up to the roof.
    let world = WorldState::generate("alpha", palette());
    let free_above = |x: i32, z: i32| {
        let solid = |y: i32| world.palette().is_solid(world.block(Dimension::Nether, Pos { x, y, z }).block);
        let mut base = world.surface(Dimension::Nether, x, z).map_or(0, |ground| ground + 1);
        while base > 0 && !solid(base - 1) {
            base -= 1;
        }
        (base..=127).take_while(|y| !solid(*y)).count()
    };
    let (x, z) = (-256..=255)
        .step_by(7)
        .flat_map(|x| (-256..=255).step_by(7).map(move |z| (x, z)))
        .find(|(x, z)| free_above(*x, *z) < 64)
        .expect("a column with less than 64 cells under the roof");
    let refused = err(call(&mut app, "build_tower", json!({"x": x, "z": z, "height": 64, "block": "planks"})));
    assert_eq!(refused.code.to_string(), "BLOCKED", "the world is in the way, not the argument");
    let room = free_above(x, z);
    assert!(refused.message.contains(&format!("only {room} blocks fit")), "{}", refused.message);
    assert_eq!(
        (refused.details.extra["placed"].as_u64(), refused.details.extra["room"].as_u64()),
        (Some(0), Some(room as u64))
    );
    let built = ok(call(&mut app, "build_tower", json!({"x": x, "z": z, "height": room, "block": "planks"})));
    assert_eq!(built["placed"].as_u64(), Some(room as u64), "{built}");
}

#[test]
fn a_tower_in_a_lake_stands_on_its_bottom_and_rises_through_the_water() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut app = sandbox(dir.path());
    app.enter_world("alpha");
    let world = WorldState::generate("alpha", palette());
    let water = world.palette().id("water").expect("water");
    let (x, z) = (-256..=255)
        .step_by(5)
        .flat_map(|x| (-256..=255).step_by(5).map(move |z| (x, z)))
        .find(|(x, z)| {
            let top = world.surface(Dimension::Overworld, *x, *z).expect("a surface");
            world.block(Dimension::Overworld, Pos { x: *x, y: top, z: *z }).block == water
        })
        .expect("a column of the lake the player spawns in");
    let surface = world.surface(Dimension::Overworld, x, z).expect("a surface");
    let built = ok(call(&mut app, "build_tower", json!({"x": x, "z": z, "height": 3, "block": "stone"})));
    let from_y = built["from_y"].as_i64().expect("from_y");
    assert!(from_y <= i64::from(surface), "the tower starts under the water's surface (y {surface}): {built}");
    let below = ok(call(&mut app, "get_block", json!({"x": x, "y": from_y - 1, "z": z})));
    assert_ne!(below["block"], "water", "it stands on the bottom, not on water: {built}");
    assert_eq!(built["placed"], 3, "{built}");
}

#[test]
fn a_tower_under_the_player_lifts_them_until_their_head_meets_the_nether_roof_and_never_through_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut app = sandbox(dir.path());
    app.enter_world("alpha");
    ok(call(&mut app, "travel", json!({"dimension": "nether"})));
    let player = ok(call(&mut app, "world_info", json!({})))["player"].clone();
    let at = |axis: &str| player[axis].as_i64().and_then(|n| i32::try_from(n).ok()).expect("a coordinate");
    let (x, y, z) = (at("x"), at("y"), at("z"));
    let world = WorldState::generate("alpha", palette());
    assert_eq!(world.surface(Dimension::Nether, x, z).map(|ground| ground + 1), Some(y), "on the ground: {player}");
    let roof = (y..=127)
        .find(|y| world.palette().is_solid(world.block(Dimension::Nether, Pos { x, y: *y, z }).block))
        .expect("a roof above the player");
    let mut room = roof - y;
    // Towers of at most 64 blocks: the first ones carry the player up, still with room above them.
    while room > 64 {
        let built = ok(call(&mut app, "build_tower", json!({"x": x, "z": z, "height": 64, "block": "stone"})));
        assert_eq!(built["placed"], 64, "{built}");
        room -= 64;
    }

    // The last tower fits under the roof, but the player standing on it does not.
    let stopped = err(call(&mut app, "build_tower", json!({"x": x, "z": z, "height": room, "block": "planks"})));
    assert_eq!(stopped.code.to_string(), "BLOCKED", "{}", stopped.message);
    assert_eq!(stopped.details.extra["placed"].as_i64(), Some(i64::from(room - 1)), "{}", stopped.message);
    let lifted = ok(call(&mut app, "world_info", json!({})))["player"].clone();
    assert_eq!(lifted["y"].as_i64(), Some(i64::from(roof - 1)), "head against the roof, never above it: {lifted}");
    let placed = err(call(&mut app, "place_block", json!({"x": x, "y": roof - 1, "z": z, "block": "stone"})));
    assert_eq!(placed.code.to_string(), "BLOCKED", "nor does a block placed where they stand: {}", placed.message);
}

#[test]
fn a_saved_block_the_palette_does_not_know_is_kept_for_the_next_save_until_its_cell_changes() {
    let cell = |block: &str| world::SavedCell {
        dimension: Dimension::Overworld,
        x: 3,
        y: 100,
        z: 3,
        block: block.into(),
        version: 4,
    };
    let doc = world::SaveDoc { format: world::SAVE_FORMAT, blocks: vec![cell("unobtainium")], ..Default::default() };
    let (mut state, warnings) = WorldState::from_save("alpha", palette(), doc);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(state.to_save().blocks, [cell("unobtainium")], "saved again as it came");
    let planks = state.palette().id("planks").expect("in the palette");
    state.set(Dimension::Overworld, Pos { x: 3, y: 100, z: 3 }, planks);
    let blocks = state.to_save().blocks;
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    assert_eq!(blocks[0].block, "planks", "the world changed that cell since");
}

#[test]
fn a_save_from_a_newer_sandbox_is_neither_loaded_nor_saved_over() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut app = sandbox(dir.path());
    let newer =
        world::SaveDoc { format: world::SAVE_FORMAT + 1, notes: vec!["from the future".into()], ..Default::default() };
    let store = app.world().resource::<bevy_agent_tools::WorldStore>().clone();
    store.save(&"alpha".into(), session::SAVE_DOCUMENT, newer).wait().expect("saved");
    let before = std::fs::read(dir.path().join("alpha").join("sandbox.json")).expect("the save");
    app.enter_world("alpha");
    let refused = err(call(&mut app, "world_info", json!({})));
    assert!(refused.message.contains("newer sandbox"), "{}", refused.message);
    app.exit_world();
    let mut result = None;
    app.run_until("the visit's save reported", |app| {
        result = app.world_mut().resource_mut::<Messages<VisitSaved>>().drain().next().map(|saved| saved.result);
        result.is_some()
    });
    let refused = result.and_then(Result::err).map(|error| error.to_string()).expect("not reported as saved");
    assert!(refused.contains("newer sandbox") && refused.contains("nothing was saved"), "{refused}");
    let after = std::fs::read(dir.path().join("alpha").join("sandbox.json")).expect("the save");
    assert_eq!(before, after, "left as it is");
}
