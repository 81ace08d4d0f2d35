//! Arguments are checked against the very schema a tool publishes (ranges, enums, lengths, patterns, required,
//! types) before its handler runs, and `INVALID_INPUT` says which field failed and why (DESIGN §5).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bevy_agent_tools::prelude::*;
use bevy_agent_tools::testing::AgentTestAppExt;
use bevy_agent_tools::{CallRequest, DestructiveGuard};
use common::*;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Direction {
    Left,
    Right,
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Waypoint {
    #[schemars(range(min = 0, max = 9))]
    x: i32,
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct PaddleArgs {
    /// Units per second.
    #[schemars(range(min = 10.0, max = 5000.0))]
    speed: f64,
    #[schemars(length(min = 1, max = 8))]
    name: String,
    #[schemars(pattern(r"^[a-z]+$"))]
    tag: String,
    direction: Direction,
    #[schemars(length(max = 3))]
    #[serde(default)]
    path: Vec<Waypoint>,
}

fn paddle(ran: Arc<AtomicUsize>) -> AgentTool<Session> {
    AgentTool::new("move_paddle", "Moves the paddle.", move |_: CallContext<Session>, _: PaddleArgs| {
        ran.fetch_add(1, Ordering::SeqCst);
        async move { Ok(()) }
    })
}

fn valid() -> Value {
    json!({ "speed": 100, "name": "left", "tag": "abc", "direction": "left", "path": [{ "x": 1 }] })
}

fn with(field: &str, value: Value) -> Value {
    let mut args = valid();
    args[field] = value;
    args
}

#[test]
fn arguments_that_break_the_published_schema_are_invalid_input_naming_the_field_and_the_handler_never_runs() {
    let ran = Arc::new(AtomicUsize::new(0));
    let mut app = app_with(TestGame::default(), vec![paddle(ran.clone())]);
    app.enter_world("alpha");
    let mut missing = valid();
    missing.as_object_mut().expect("object").remove("direction");
    let cases = [
        (with("speed", json!(1)), "speed", "minimum"),
        (with("speed", json!(9000.5)), "speed", "maximum"),
        (with("speed", json!("fast")), "speed", "type"),
        (with("name", json!("")), "name", "minLength"),
        (with("name", json!("a-long-name")), "name", "maxLength"),
        (with("tag", json!("ABC")), "tag", "pattern"),
        (with("direction", json!("up")), "direction", "enum"),
        (missing, "direction", "required"),
        (with("path", json!([{ "x": 1 }, { "x": 1 }, { "x": 1 }, { "x": 1 }])), "path", "maxItems"),
        (with("path", json!([{ "x": 1 }, { "x": 12 }])), "path[1].x", "maximum"),
    ];
    for (args, field, keyword) in cases {
        let outcome = app.agent().conversation("a").call("move_paddle", args.clone()).try_outcome();
        let error = outcome.expect("refused at once").expect_err("invalid");
        assert_eq!(error.code, ErrorCode::InvalidInput, "{args}");
        assert_eq!(error.details.extra["field"], json!(field), "{args}: {error:?}");
        assert_eq!(error.details.extra["schema_keyword"], json!(keyword), "{args}: {error:?}");
        let reason = error.details.extra["reason"].as_str().expect("a reason");
        assert!(!reason.is_empty() && error.message.contains(reason), "the message says why: {}", error.message);
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0, "no invalid call reached the handler");

    let ok = app.agent().conversation("a").call("move_paddle", valid());
    assert!(app.run_until_resolved(&ok).is_ok(), "valid arguments pass");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn every_argument_that_breaks_the_schema_is_named_in_one_error_so_one_retry_can_mend_them_all() {
    let mut app = app_with(TestGame::default(), vec![paddle(Arc::default())]);
    app.enter_world("alpha");
    let mut args = with("speed", json!("fast"));
    args["tag"] = json!("ABC");
    args.as_object_mut().expect("object").remove("direction");
    let error = app.agent().conversation("a").call("move_paddle", args.clone()).try_outcome();
    let error = error.expect("refused at once").expect_err("invalid");
    assert_eq!(error.code, ErrorCode::InvalidInput);
    let problems = error.details.extra["problems"].as_array().expect("every problem listed");
    let mut named: Vec<(&str, &str)> = problems
        .iter()
        .map(|problem| {
            (problem["field"].as_str().expect("field"), problem["schema_keyword"].as_str().expect("keyword"))
        })
        .collect();
    named.sort();
    assert_eq!(named, [("direction", "required"), ("speed", "type"), ("tag", "pattern")], "{error:?}");
    assert_eq!(error.details.extra["field"], problems[0]["field"], "`field` is still the first problem's");
    for field in ["`speed`", "`tag`", "`direction`"] {
        assert!(error.message.contains(field), "the message names {field}: {}", error.message);
    }

    let one = app.agent().conversation("a").call("move_paddle", with("speed", json!(1))).try_outcome();
    let one = one.expect("refused at once").expect_err("invalid");
    assert!(one.details.extra.get("problems").is_none(), "one problem needs no list: {one:?}");
}

#[test]
fn a_tool_with_an_argument_of_a_reserved_name_is_refused_at_registration() {
    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Tagged {
        label: String,
        task_id: String,
    }
    let app = app_with(TestGame::default(), vec![]);
    let tag = AgentTool::new("tag", "Tags.", |_: CallContext<Session>, _: Tagged| async move { Ok(()) });
    let refused = app.agent().register_tool(tag).expect_err("its task_id would never reach it");
    assert!(refused.message.contains("`task_id`") && refused.message.contains("`tag`"), "{}", refused.message);
    assert!(app.agent().tools().iter().all(|tool| tool.name != "tag"), "not registered");

    // In one shape of an enum of argument structs too: its fields are arguments at the root of every call.
    #[derive(Deserialize, JsonSchema)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Shapes {
        Plain { label: String },
        Threaded { conversation: String },
    }
    let shaped = AgentTool::new("shaped", "Shapes.", |_: CallContext<Session>, _: Shapes| async move { Ok(()) });
    let refused = app.agent().register_tool(shaped).expect_err("its conversation would never reach it");
    assert!(refused.message.contains("`conversation`"), "{}", refused.message);

    // Arguments that cannot be an object: a client always sends one.
    let unit = AgentTool::new("unit", "Nothing.", |_: CallContext<Session>, _: ()| async move { Ok(()) });
    let refused = app.agent().register_tool(unit).expect_err("not an object");
    assert!(refused.message.contains("not an object"), "{}", refused.message);

    // An enum none of whose shapes is an object (documented unit variants are constants): clients send objects.
    let gait = AgentTool::new("gait", "Walks.", |_: CallContext<Session>, _: Gait| async move { Ok(()) });
    let refused = app.agent().register_tool(gait).expect_err("no shape could ever be called");
    assert!(refused.message.contains("none of whose shapes is an object"), "{}", refused.message);
    // One shape that is not (an externally tagged unit variant is a string): the rest can be called, that one is
    // said to be of no use.
    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    enum External {
        Stop,
        Go { speed: u8 },
    }
    let go = AgentTool::new("go", "Goes.", |_: CallContext<Session>, _: External| async move { Ok(()) });
    let (registered, said) = common::warnings::with_warnings(|| app.agent().register_tool(go));
    registered.expect("`Go` can be called");
    assert!(said.iter().any(|line| line.contains("never be called") && line.contains("Stop")), "{said:?}");
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Named {
    /// A pattern that is not a regular expression (its `]` is missing).
    #[schemars(pattern(r"^[a-z+$"))]
    name: String,
}

#[test]
fn a_tool_whose_input_schema_cannot_be_compiled_is_refused_at_registration_not_run_unchecked() {
    let mut app = app_with(TestGame::default(), vec![]);
    let name = AgentTool::new("name", "Names.", |_: CallContext<Session>, _: Named| async move { Ok(()) });
    let refused = app.agent().register_tool(name).expect_err("its arguments could never be checked");
    assert!(refused.message.contains("input schema of agent tool `name` cannot be compiled"), "{}", refused.message);
    app.enter_world("alpha");
    assert!(!app.agent().tools().iter().any(|tool| tool.name == "name"), "not listed");
}

#[test]
fn an_argument_the_tool_does_not_have_is_invalid_input_naming_it_rather_than_dropped() {
    let ran = Arc::new(AtomicUsize::new(0));
    let mut app = app_with(TestGame::default(), vec![paddle(ran.clone())]);
    app.enter_world("alpha");
    let info = app.agent().tools().into_iter().find(|tool| tool.name == "move_paddle").expect("listed");
    assert_eq!(info.client_input_schema()["additionalProperties"], false, "published as refused");
    // A misspelt guard field (`expectedVersion` for `expected_version`) would skip the check it asks for.
    let misspelt = with("expectedVersion", json!(3));
    let error = app.agent().conversation("a").call("move_paddle", misspelt).try_outcome().expect("at once");
    let error = error.expect_err("refused");
    assert_eq!(error.code, ErrorCode::InvalidInput);
    assert_eq!(error.details.extra["field"], "expectedVersion", "{error:?}");
    assert_eq!(error.details.extra["schema_keyword"], "additionalProperties", "{error:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    // The reserved arguments are not the tool's and are still taken (the transports take them out first).
    let keyed = CallRequest::from_wire("move_paddle", with("operation_id", json!("op-1"))).expect("a request");
    let call = app.agent().conversation("a").request(keyed);
    assert!(app.run_until_resolved(&call).is_ok());
}

/// Arguments in one of several shapes, one with a guard flattened into it.
#[derive(Deserialize, JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case")]
#[allow(dead_code)]
enum Edit {
    Paint {
        colour: String,
    },
    Break {
        x: i32,
        #[serde(flatten)]
        guard: DestructiveGuard,
    },
}

#[test]
fn an_argument_no_shape_of_an_enum_has_is_invalid_input_naming_it_rather_than_dropped() {
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = ran.clone();
    let edit = AgentTool::new("edit", "Edits.", move |_: CallContext<Session>, _: Edit| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move { Ok(()) }
    });
    let mut app = app_with(TestGame::default(), vec![edit]);
    app.enter_world("alpha");
    let call = |app: &mut bevy::app::App, args: Value| {
        let call = app.agent().conversation("a").call("edit", args);
        app.run_until_resolved(&call)
    };
    // A misspelt guard field would skip the version check it asks for; a field of another shape would be dropped.
    for (args, field) in [
        (json!({ "action": "break", "x": 1, "confirm": true, "expectedVersion": 3 }), "expectedVersion"),
        (json!({ "action": "paint", "colour": "red", "x": 1 }), "x"),
    ] {
        let error = call(&mut app, args).expect_err("refused");
        assert_eq!(error.code, ErrorCode::InvalidInput);
        assert_eq!(error.details.extra["field"], field, "{error:?}");
        assert_eq!(error.details.extra["schema_keyword"], "unevaluatedProperties", "{error:?}");
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler never ran");
    // Every shape's own arguments, the guard's and the reserved ones still pass.
    call(&mut app, json!({ "action": "paint", "colour": "red", "operation_id": "op-1" })).expect("paints");
    call(&mut app, json!({ "action": "break", "x": 1, "confirm": true, "expected_version": 3 })).expect("breaks");
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

#[derive(Deserialize, JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum Recipient {
    Name { name: String },
    Id { id: u64 },
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Give {
    count: u32,
    #[serde(flatten)]
    to: Recipient,
}

#[test]
fn arguments_of_two_shapes_at_once_are_invalid_input_naming_what_would_be_dropped() {
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = ran.clone();
    let give = AgentTool::new("give", "Gives.", move |_: CallContext<Session>, _: Give| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move { Ok(()) }
    });
    let mut app = app_with(TestGame::default(), vec![give]);
    app.enter_world("alpha");
    let call = |app: &mut bevy::app::App, args: Value| {
        let call = app.agent().conversation("a").call("give", args);
        app.run_until_resolved(&call)
    };
    // serde would read them as `Name` and drop `id`: the gift would go to whoever is named, not to the id given.
    let error = call(&mut app, json!({ "count": 1, "name": "ada", "id": 7 })).expect_err("refused");
    assert_eq!(error.code, ErrorCode::InvalidInput);
    assert_eq!(error.details.extra["field"], "id", "{error:?}");
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the handler never ran");
    call(&mut app, json!({ "count": 1, "id": 7, "operation_id": "op-1" })).expect("one shape, and a reserved argument");
    call(&mut app, json!({ "count": 1, "name": "ada" })).expect("the other shape");
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

#[derive(Deserialize, JsonSchema)]
struct Aim {
    yaw: f32,
    /// Bounded below only.
    #[schemars(range(min = 0.0))]
    #[serde(default)]
    speed: f32,
}

#[test]
fn an_f32_argument_beyond_what_an_f32_holds_is_invalid_input_not_infinity() {
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let seen_by_tool = seen.clone();
    let aim = AgentTool::new("aim", "Aims.", move |_: CallContext<Session>, args: Aim| {
        seen_by_tool.lock().extend([args.yaw, args.speed].into_iter().filter(|value| *value != 0.0));
        async move { Ok(()) }
    });
    let mut app = app_with(TestGame::default(), vec![aim]);
    app.enter_world("alpha");
    for (args, field, keyword) in [
        (json!({ "yaw": 1e39 }), "yaw", "exclusiveMaximum"),
        (json!({ "yaw": -1e39 }), "yaw", "exclusiveMinimum"),
        (json!({ "yaw": 0, "speed": 1e39 }), "speed", "exclusiveMaximum"),
    ] {
        let call = app.agent().conversation("a").call("aim", args);
        let error = app.run_until_resolved(&call).expect_err("refused");
        assert_eq!(error.code, ErrorCode::InvalidInput);
        assert_eq!(
            (error.details.extra["field"].as_str(), error.details.extra["schema_keyword"].as_str()),
            (Some(field), Some(keyword))
        );
    }
    // `f32::MAX` as it prints (a little above it, read as it): an f32 holds it.
    let call = app.agent().conversation("a").call("aim", json!({ "yaw": 3.4028235e38 }));
    app.run_until_resolved(&call).expect("an f32 holds it");
    assert_eq!(*seen.lock(), [f32::MAX], "the handler never saw infinity");
}

#[test]
fn a_tool_named_as_the_transports_own_is_refused_at_registration() {
    let app = app_with(TestGame::default(), vec![]);
    let twin =
        AgentTool::new("begin_conversation", "Mine.", |_: CallContext<Session>, _: NoArgs| async move { Ok(()) });
    let refused = app.agent().register_tool(twin).expect_err("clients would see two");
    assert!(refused.message.contains("`begin_conversation`"), "{}", refused.message);
}

#[test]
fn schema_reasons_are_readable_for_a_range() {
    let mut app = app_with(TestGame::default(), vec![paddle(Arc::default())]);
    app.enter_world("alpha");
    let error = app.agent().conversation("a").call("move_paddle", with("speed", json!(1))).try_outcome();
    let error = error.expect("at once").expect_err("too slow");
    assert!(error.message.contains("`speed`") && error.message.contains("10"), "{}", error.message);
}

#[test]
fn argument_enum_choices_are_enforced_as_published() {
    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Paint {
        colour: String,
    }
    let paint = AgentTool::new("paint", "Paints.", |_: CallContext<Session>, _: Paint| async move { Ok(()) })
        .argument_enum("colour", ["red", "green"]);
    let mut app = app_with(TestGame::default(), vec![paint]);
    app.enter_world("alpha");
    let error = app.agent().conversation("a").call("paint", json!({ "colour": "blue" })).try_outcome();
    let error = error.expect("at once").expect_err("not a choice");
    assert_eq!(error.code, ErrorCode::InvalidInput);
    assert_eq!(error.details.extra["field"], "colour");
    let ok = app.agent().conversation("a").call("paint", json!({ "colour": "red" }));
    assert!(app.run_until_resolved(&ok).is_ok());
}

#[test]
fn argument_enum_on_an_optional_argument_still_takes_null_and_leaving_it_out() {
    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Trim {
        colour: Option<String>,
    }
    let trim = AgentTool::new("trim", "Trims.", |_: CallContext<Session>, _: Trim| async move { Ok(()) })
        .argument_enum("colour", ["red", "green"]);
    let mut app = app_with(TestGame::default(), vec![trim]);
    app.enter_world("alpha");
    for args in [json!({ "colour": null }), json!({}), json!({ "colour": "green" })] {
        let call = app.agent().conversation("a").call("trim", args.clone());
        assert!(app.run_until_resolved(&call).is_ok(), "{args}");
    }
    let error = app.agent().conversation("a").call("trim", json!({ "colour": "blue" })).try_outcome();
    assert_eq!(error.expect("at once").expect_err("not a choice").details.extra["field"], "colour");
}

#[test]
fn argument_enum_naming_an_argument_the_tool_lacks_is_refused_at_registration() {
    #[derive(Deserialize, JsonSchema)]
    #[serde(rename = "Paint")]
    #[allow(dead_code)]
    struct Paint {
        #[serde(rename = "shade")]
        colour: String,
    }
    let app = app_with(TestGame::default(), vec![]);
    // Misspelt, or the Rust name of an argument serde renames: the enum would never apply, any string would pass.
    for field in ["color", "colour"] {
        let paint = AgentTool::new("paint", "Paints.", |_: CallContext<Session>, _: Paint| async move { Ok(()) })
            .argument_enum(field, ["red", "green"]);
        let refused = app.agent().register_tool(paint).expect_err("the enum names no argument");
        assert!(refused.message.contains(&format!("`{field}`")), "{}", refused.message);
        assert!(app.agent().tools().iter().all(|tool| tool.name != "paint"), "not registered");
    }
    let paint = AgentTool::new("paint", "Paints.", |_: CallContext<Session>, _: Paint| async move { Ok(()) })
        .argument_enum("shade", ["red", "green"]);
    app.agent().register_tool(paint).expect("the argument as the schema names it");
}

#[test]
fn requires_confirmation_on_a_tool_without_arguments_publishes_confirm_and_enforces_it() {
    let reset =
        AgentTool::new("reset", "Resets the bricks.", |_: CallContext<Session>, _: NoArgs| async move { Ok(()) })
            .requires_confirmation();
    let mut app = app_with(TestGame::default(), vec![reset]);
    app.enter_world("alpha");
    let info = app.agent().tools().into_iter().find(|tool| tool.name == "reset").expect("listed");
    let published = info.client_input_schema();
    assert_eq!(published["type"], "object");
    assert_eq!(published["properties"]["confirm"]["type"], "boolean", "clients see `confirm`: {published}");

    let refused = app.agent().conversation("a").call("reset", json!({})).try_outcome().expect("at once");
    assert_eq!(code(&refused), Some(ErrorCode::ConfirmationRequired));
    let mistyped = app.agent().conversation("a").call("reset", json!({ "confirm": "yes" })).try_outcome();
    let mistyped = mistyped.expect("at once").expect_err("not a boolean");
    assert_eq!((mistyped.code, mistyped.details.extra["field"].clone()), (ErrorCode::InvalidInput, json!("confirm")));
    let confirmed = app.agent().conversation("a").call("reset", json!({ "confirm": true }));
    assert!(app.run_until_resolved(&confirmed).is_ok());
}

#[test]
fn requires_confirmation_takes_confirm_out_of_arguments_that_refuse_unknown_fields() {
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Strict {
        row: u32,
    }
    #[derive(Deserialize, JsonSchema)]
    enum Wipe {
        Row { row: u32 },
        Column { column: u32 },
    }
    let ran = Arc::new(AtomicUsize::new(0));
    let (strict_ran, wipe_ran) = (ran.clone(), ran.clone());
    let strict = AgentTool::new("clear_row", "Clears a row.", move |_: CallContext<Session>, args: Strict| {
        strict_ran.fetch_add(args.row as usize, Ordering::SeqCst);
        async move { Ok(()) }
    })
    .requires_confirmation();
    let wipe = AgentTool::new("wipe", "Wipes a row or column.", move |_: CallContext<Session>, args: Wipe| {
        let n = match args {
            Wipe::Row { row } => row,
            Wipe::Column { column } => column,
        };
        wipe_ran.fetch_add(n as usize, Ordering::SeqCst);
        async move { Ok(()) }
    })
    .requires_confirmation();
    let mut app = app_with(TestGame::default(), vec![strict, wipe]);
    app.enter_world("alpha");
    let agent = app.agent().conversation("a");
    for (tool, args) in [("clear_row", json!({ "row": 1 })), ("wipe", json!({ "Row": { "row": 10 } }))] {
        let refused = agent.call(tool, args.clone()).try_outcome().expect("at once");
        assert_eq!(code(&refused), Some(ErrorCode::ConfirmationRequired), "{tool}");
        let mut confirmed = args;
        confirmed["confirm"] = json!(true);
        let call = agent.call(tool, confirmed);
        assert!(app.run_until_resolved(&call).is_ok(), "{tool} runs once confirmed");
    }
    assert_eq!(ran.load(Ordering::SeqCst), 11, "each handler ran once, with its arguments");
    let mistyped = agent.call("clear_row", json!({ "row": 1, "confirm": "yes" })).try_outcome().expect("at once");
    let mistyped = mistyped.expect_err("not a boolean");
    assert_eq!((mistyped.code, mistyped.details.extra["field"].clone()), (ErrorCode::InvalidInput, json!("confirm")));
}

#[test]
fn requires_confirmation_leaves_confirm_to_a_guard_the_arguments_declare_even_behind_a_ref_or_called_twice() {
    #[derive(Deserialize, JsonSchema)]
    struct Inner {
        #[serde(flatten)]
        guard: DestructiveGuard,
    }
    /// A newtype: its schema's root is a `$ref` to `Inner`.
    #[derive(Deserialize, JsonSchema)]
    struct Wrapped(Inner);
    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Strict {}
    let guarded =
        AgentTool::new("guarded", "Guarded.", |_: CallContext<Session>, Wrapped(inner): Wrapped| async move {
            inner.guard.confirmed()
        })
        .requires_confirmation();
    let strict = AgentTool::new("strict", "Strict.", |_: CallContext<Session>, _: Strict| async move { Ok(()) })
        .requires_confirmation()
        .requires_confirmation();
    let mut app = app_with(TestGame::default(), vec![guarded, strict]);
    app.enter_world("alpha");
    for tool in ["guarded", "strict"] {
        let call = app.agent().conversation("a").call(tool, json!({ "confirm": true }));
        assert!(app.run_until_resolved(&call).is_ok(), "{tool}: confirmed, and the handler's guard sees it");
    }
}

#[test]
fn a_flattened_destructive_guard_adds_its_fields_but_never_its_own_doc() {
    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Nested {
        #[serde(flatten)]
        guard: DestructiveGuard,
    }
    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Smash {
        target: String,
        inner: Option<Nested>,
        #[serde(flatten)]
        guard: DestructiveGuard,
    }
    let smash = AgentTool::new("smash", "Smashes.", |_: CallContext<Session>, _: Smash| async move { Ok(()) });
    let schema = smash.info().client_input_schema();
    let text = schema.to_string();
    assert!(schema["properties"]["confirm"].is_object() && schema["properties"]["expected_version"].is_object());
    assert!(!text.contains("Flatten this") && !text.contains("serde(flatten)"), "no Rust docs leak: {schema}");
}

/// Documented variants: schemars writes them as a `oneOf` of constants.
#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
enum Gait {
    /// Slowly.
    Walk,
    /// Fast.
    Run,
}

#[derive(Deserialize, JsonSchema)]
#[allow(dead_code)]
struct Steer {
    turn: Option<Direction>,
    at: Option<Waypoint>,
    gait: Option<Gait>,
}

/// Tagged shapes, one with an enum field (an `enum`, where serde's tag is a `const`).
#[derive(Deserialize, JsonSchema)]
#[serde(tag = "action", rename_all = "snake_case")]
#[allow(dead_code)]
enum Brush {
    Paint { colour: String },
    Fill { x: i32, direction: Direction },
}

#[test]
fn a_value_that_fits_no_alternative_is_explained_by_the_alternative_it_was_meant_for() {
    // An enum is a `oneOf` (or, optional, an `anyOf` with `null`): the validator says only that the value fits
    // none, and flags every property of a tagged one as unexpected. A model needs what its value lacks, where.
    let edit = AgentTool::new("edit", "Edits.", |_: CallContext<Session>, _: Edit| async move { Ok(()) });
    let steer = AgentTool::new("steer", "Steers.", |_: CallContext<Session>, _: Steer| async move { Ok(()) });
    let brush = AgentTool::new("brush", "Brushes.", |_: CallContext<Session>, _: Brush| async move { Ok(()) });
    let mut app = app_with(TestGame::default(), vec![edit, steer, brush]);
    app.enter_world("alpha");
    let mut refused = |tool: &str, args: Value| {
        let call = app.agent().conversation("a").call(tool, args);
        let error = app.run_until_resolved(&call).expect_err("refused");
        assert_eq!(error.code, ErrorCode::InvalidInput, "{error:?}");
        assert!(!error.message.contains("nevaluated") && !error.message.contains("any of the schemas"), "{error:?}");
        (error.details.extra["field"].as_str().unwrap_or_default().to_string(), error.message)
    };
    // The tag names its shape: that shape's own problems.
    let (_, message) = refused("edit", json!({ "action": "break" }));
    assert!(message.contains("`x`") && message.contains("required"), "{message}");
    // A wrong value of an enum field of the shape the tag names is that field's problem, not the tag's.
    let (field, message) = refused("brush", json!({ "action": "fill", "x": 1, "direction": "up" }));
    assert_eq!(field, "direction", "{message}");
    assert!(message.contains(r#""left""#), "{message}");
    // A tag no shape has: the tags there are.
    let (field, message) = refused("edit", json!({ "action": "erase", "x": 1 }));
    assert_eq!(field, "action");
    assert!(message.contains(r#""paint""#) && message.contains(r#""break""#), "{message}");
    // Optional: not `null`, so the value's own type's problem.
    let (field, message) = refused("steer", json!({ "turn": "up" }));
    assert_eq!(field, "turn");
    assert!(message.contains(r#""left""#), "{message}");
    let (field, _) = refused("steer", json!({ "at": { "x": "a" } }));
    assert_eq!(field, "at.x");
    // Documented variants (constants): the choices.
    let (field, message) = refused("steer", json!({ "gait": "Fly" }));
    assert_eq!(field, "gait");
    assert!(message.contains(r#""Walk""#) && message.contains(r#""Run""#), "{message}");
}
