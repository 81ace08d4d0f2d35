//! Turning an agent's JSON into typed arguments, with `INVALID_INPUT` errors that name the field and why.

use jsonschema::error::ValidationErrorKind;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ErrorCode, ToolError};

/// The JSON schema of a tool's arguments `T` as clients get it: schemars' output, made to speak to a model rather
/// than to a Rust developer (see [`publishable`]), and closed: an argument the tool does not have is refused with
/// `INVALID_INPUT` naming it (see [`close`]), rather than dropped by serde without a word (a misspelt
/// `expectedVersion` would skip the version check it asks for).
pub(crate) fn input_schema_of<T: JsonSchema>() -> Value {
    let mut schema = schemars::SchemaGenerator::default().into_root_schema_for::<T>().to_value();
    bound_f32(&mut schema);
    publishable(&mut schema);
    close(&mut schema);
    schema
}

/// The JSON schema of a tool's output `O` as clients get it: what `O` serializes to (schemars' serialize
/// contract: a field serde skips when empty is not `required`, as it would be for deserializing).
pub(crate) fn output_schema_of<O: JsonSchema>() -> Value {
    let settings = schemars::generate::SchemaSettings::default().for_serialize();
    let mut schema = settings.into_generator().into_root_schema_for::<O>().to_value();
    publishable(&mut schema);
    nullable_numbers(&mut schema);
    schema
}

/// Lets every number of an output schema be `null` too: JSON has no NaN or infinity, and a tool's output with such a
/// float is sent with `null` there (the plugin logs a warning naming the field). A client that checks results
/// against the published schema (the TypeScript SDK's, so Claude Code's and Cursor's) would otherwise throw the
/// whole result away.
fn nullable_numbers(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            match object.get_mut("type") {
                Some(kind) if kind == "number" => *kind = serde_json::json!(["number", "null"]),
                Some(Value::Array(kinds))
                    if kinds.iter().any(|k| k == "number") && !kinds.iter().any(|k| k == "null") =>
                {
                    kinds.push("null".into())
                }
                _ => {}
            }
            for (key, value) in object.iter_mut() {
                match key.as_str() {
                    // Names to schemas: every value is a schema, whatever its name.
                    "properties" | "$defs" | "definitions" | "patternProperties" | "dependentSchemas" => {
                        if let Value::Object(named) = value {
                            named.values_mut().for_each(nullable_numbers);
                        }
                    }
                    // Data (a default, examples, the allowed values), and what a value must not be.
                    "default" | "examples" | "const" | "enum" | "not" => {}
                    key if key.starts_with("x-") => {}
                    _ => nullable_numbers(value),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(nullable_numbers),
        _ => {}
    }
}

/// Keywords at an object schema's root under which it takes other properties: such a schema is left open, as
/// its author wrote it.
const OPEN_KEYWORDS: &[&str] = &["additionalProperties", "patternProperties", "unevaluatedProperties"];

/// Keywords that make a schema of others.
const COMPOSING_KEYWORDS: &[&str] = &["allOf", "anyOf", "oneOf", "$ref"];

/// Closes an argument schema that takes no other properties of its own (none of [`OPEN_KEYWORDS`]): a plain object
/// schema (a struct of arguments, flattened helpers included, since schemars merges their properties, or none,
/// [`NoArgs`](crate::NoArgs)) gets `additionalProperties: false`; one made of others (an enum of argument shapes,
/// a struct with a flattened enum, a newtype's `$ref`) gets `unevaluatedProperties: false`, which counts the
/// properties of the shape the arguments match (JSON Schema 2020-12; `additionalProperties` would refuse them).
/// The reserved arguments the transports take out before validation, and `confirm`, are among the properties
/// clients are shown. (A field's serde `alias` is not in the schema: a call that uses it is refused.)
pub(crate) fn close(schema: &mut Value) {
    let Value::Object(root) = schema else { return };
    if OPEN_KEYWORDS.iter().any(|keyword| root.contains_key(*keyword)) {
        return;
    }
    if COMPOSING_KEYWORDS.iter().any(|keyword| root.contains_key(*keyword)) {
        root.insert("unevaluatedProperties".into(), Value::Bool(false));
        return;
    }
    let plain = root.get("type") == Some(&Value::String("object".into()))
        && root.get("properties").is_none_or(Value::is_object);
    if plain {
        root.insert("additionalProperties".into(), Value::Bool(false));
    }
}

/// The `format`s schemars writes for Rust's integer and float types. JSON Schema 2020-12 defines none of them, so
/// validators warn about each ("unknown format ignored"); the bounds they stand for are already in
/// `minimum`/`maximum` where they matter.
const RUST_FORMATS: &[&str] = &[
    "int8", "int16", "int32", "int64", "int128", "int", "uint8", "uint16", "uint32", "uint64", "uint128", "uint",
    "float", "double",
];

/// Gives every `f32` (schemars' `format: "float"`) the bounds of a finite `f32`, unless it has bounds of its own:
/// serde reads a larger JSON number into an `f32` as infinity (`1e39 as f32`), which a handler would take into
/// the game's state (a `Transform`, a save that JSON then cannot hold) where `INVALID_INPUT` belongs.
fn bound_f32(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            if object.get("format").and_then(Value::as_str) == Some("float") {
                // Halfway between `f32::MAX` (2^128 - 2^104) and 2^128: below it a number rounds to a finite `f32`
                // (`3.4028235e38`, how `f32::MAX` prints, included), from it on to infinity. Each side on its own:
                // a field bounded below only still needs its top.
                let overflow = 2f64.powi(128) - 2f64.powi(103);
                if !object.contains_key("maximum") && !object.contains_key("exclusiveMaximum") {
                    object.insert("exclusiveMaximum".into(), Value::from(overflow));
                }
                if !object.contains_key("minimum") && !object.contains_key("exclusiveMinimum") {
                    object.insert("exclusiveMinimum".into(), Value::from(-overflow));
                }
            }
            object.values_mut().for_each(bound_f32);
        }
        Value::Array(items) => items.iter_mut().for_each(bound_f32),
        _ => {}
    }
}

/// Cleans a derived schema for publication:
///
/// - the root's `title` and `description` go: they are the Rust name and doc comment of the arguments (or
///   output) type, and with `#[serde(flatten)]` the doc of a flattened helper such as
///   [`DestructiveGuard`](crate::DestructiveGuard). What a tool does is its own description's job; fields keep
///   their docs;
/// - schemars' non-standard numeric `format`s go, everywhere.
pub(crate) fn publishable(schema: &mut Value) {
    if let Value::Object(root) = schema {
        root.remove("title");
        root.remove("description");
    }
    strip_rust_formats(schema);
}

fn strip_rust_formats(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            if object.get("format").and_then(Value::as_str).is_some_and(|format| RUST_FORMATS.contains(&format)) {
                object.remove("format");
            }
            object.values_mut().for_each(strip_rust_formats);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_rust_formats),
        _ => {}
    }
}

/// Writes integral floating-point numbers (`3.0`, `1e2`) as integers, so that how a client spells a number never
/// changes what it means: `3.0` fits a `u32` argument, and replays compare equal.
pub(crate) fn normalize_numbers(value: &mut Value) {
    match value {
        Value::Number(number) => {
            // Any integral float an integer argument could hold (the validator takes `1e16` as an integer too).
            if let Some(float) = number.as_f64().filter(|f| number.is_f64() && f.fract() == 0.0) {
                if float >= i64::MIN as f64 && float < i64::MAX as f64 {
                    *value = Value::from(float as i64);
                } else if float >= 0.0 && float < u64::MAX as f64 {
                    *value = Value::from(float as u64);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize_numbers),
        Value::Object(map) => map.values_mut().for_each(normalize_numbers),
        _ => {}
    }
}

/// Checks the shape of `args` before anything else: numbers normalized, `null` read as `{}`, anything but an
/// object refused.
pub(crate) fn object_arguments(tool: &str, mut args: Value) -> Result<Value, ToolError> {
    normalize_numbers(&mut args);
    match args {
        Value::Null => Ok(Value::Object(Default::default())),
        Value::Object(map) => Ok(Value::Object(map)),
        other => Err(ToolError::with_code(
            ErrorCode::InvalidInput,
            format!("the arguments of `{tool}` must be a JSON object, not {}", kind_of(&other)),
        )
        .with_detail("field", "")
        .with_detail("reason", "not an object")),
    }
}

/// Takes `confirm` out of the arguments of a tool that
/// [requires confirmation](crate::AgentTool::requires_confirmation) but whose own arguments do not declare it (the
/// host has already read it). Refused like a schema violation if it is there and not a boolean.
pub(crate) fn take_confirm(tool: &str, args: &mut Value) -> Result<(), ToolError> {
    let Some(confirm) = args.as_object_mut().and_then(|map| map.remove("confirm")) else { return Ok(()) };
    if confirm.is_boolean() {
        return Ok(());
    }
    let reason = format!("{confirm} is not of type \"boolean\"");
    Err(ToolError::with_code(ErrorCode::InvalidInput, format!("argument `confirm` of `{tool}` is invalid: {reason}"))
        .with_detail("field", "confirm")
        .with_detail("reason", reason)
        .with_detail("schema_keyword", "type"))
}

/// The schema a tool publishes, compiled once: calls are checked against exactly what clients were shown
/// (`minimum`/`maximum`, `enum`, lengths, `pattern`, `required`, types), before the handler runs.
///
/// Why not, when the schema cannot be compiled (a `pattern` that is not a regular expression, a hand-written
/// schema with a remote `$ref`: the validator is built without network or file access): registering the tool
/// fails with it, a mistake in the game's set-up, rather than the tool taking arguments it never checks.
pub(crate) fn compile_schema(tool: &str, schema: &Value) -> Result<jsonschema::Validator, String> {
    jsonschema::validator_for(schema).map_err(|error| {
        format!(
            "the input schema of agent tool `{tool}` cannot be compiled ({error}): every call's arguments are checked \
             against it; fix the schema (a `pattern` must be a regular expression; remote `$ref`s are not fetched)"
        )
    })
}

/// How many of the arguments' problems one error lists.
const PROBLEMS_LISTED: usize = 10;
/// How many of the validator's errors are read (the rest are not counted).
const ERRORS_READ: usize = 64;
/// How deep alternatives inside alternatives are explained.
const ALTERNATIVES_DEPTH: usize = 8;

/// Where an error is, in the form `pos.x` or `blocks[2]` (empty: the arguments as a whole).
fn path_of(location: &jsonschema::paths::Location) -> String {
    let mut field = String::new();
    for segment in location.iter() {
        match segment {
            jsonschema::paths::LocationSegment::Property(name) => push_property(&mut field, &name),
            jsonschema::paths::LocationSegment::Index(index) => field.push_str(&format!("[{index}]")),
        }
    }
    field
}

/// Why `given` is refused, with every choice there is (a model needs them all to pick one).
fn not_one_of(given: impl std::fmt::Display, choices: &[String]) -> String {
    format!("{given} is not one of {}", choices.join(", "))
}

/// Whether `path` is a property right inside `parent`.
fn is_property_of(parent: &str, path: &str) -> bool {
    let rest = match parent {
        "" => path,
        parent => match path.strip_prefix(parent).and_then(|rest| rest.strip_prefix('.')) {
            Some(rest) => rest,
            None => return false,
        },
    };
    !rest.is_empty() && !rest.contains(['.', '['])
}

/// What a model can act on, for one of the validator's errors. A value that fits none of its alternatives (an
/// enum: `oneOf`/`anyOf`) is explained by the alternative it was meant for: an alternative whose tag (a property
/// right inside, refused by `const`: serde's tags are constants, where an enum field is an `enum`) or whose type
/// (`null` for an `Option`) is not the value's is not it.
/// One left: its own problems, where they are. None left: the tag is not one of those the alternatives take.
/// Several: the problems they all have (a property every one requires), or all their constants as one choice.
fn explained(error: &jsonschema::ValidationError<'_>, depth: usize) -> Vec<Problem> {
    let context = match error.kind() {
        ValidationErrorKind::OneOfNotValid { context } | ValidationErrorKind::AnyOf { context } => context,
        _ => return vec![Problem::of(error)],
    };
    if depth >= ALTERNATIVES_DEPTH {
        return vec![Problem::of(error)];
    }
    let at = path_of(error.instance_path());
    let mut tags: Vec<(String, Value, String)> = Vec::new();
    let mut meant = Vec::new();
    for branch in context {
        let mut fits = true;
        for inner in branch {
            let path = path_of(inner.instance_path());
            match inner.kind() {
                ValidationErrorKind::Type { .. } if path == at => fits = false,
                ValidationErrorKind::Constant { expected_value } if is_property_of(&at, &path) => {
                    fits = false;
                    tags.push((path, (**expected_value).clone(), inner.instance().to_string()));
                }
                _ => {}
            }
        }
        if fits {
            meant.push(branch);
        }
    }
    let own_problems = |branch: &Vec<jsonschema::ValidationError<'static>>| -> Vec<Problem> {
        branch.iter().flat_map(|inner| explained(inner, depth + 1)).collect()
    };
    match meant.as_slice() {
        [branch] => own_problems(branch),
        [] => match tags.first() {
            Some((path, _, given)) => {
                let choices: Vec<String> =
                    tags.iter().filter(|(at, ..)| at == path).map(|(_, value, _)| value.to_string()).collect();
                let reason = not_one_of(given, &choices);
                vec![Problem { field: path.clone(), reason, keyword: "const".into() }]
            }
            None => vec![Problem::of(error)],
        },
        branches => {
            let constants: Option<Vec<String>> = branches
                .iter()
                .flat_map(|branch| branch.iter())
                .map(|inner| match inner.kind() {
                    ValidationErrorKind::Constant { expected_value } => Some(vec![expected_value.to_string()]),
                    ValidationErrorKind::Enum { options } => {
                        options.as_array().map(|values| values.iter().map(Value::to_string).collect())
                    }
                    _ => None,
                })
                .collect::<Option<Vec<Vec<String>>>>()
                .map(|all| all.concat());
            if let Some(choices) = constants.filter(|choices| !choices.is_empty()) {
                let reason = not_one_of(error.instance(), &choices);
                return vec![Problem { field: at, reason, keyword: "enum".into() }];
            }
            // What every alternative finds wrong (a property they all require), where they agree.
            let mut each = branches.iter().map(|branch| own_problems(branch));
            let first = each.next().unwrap_or_default();
            let rest: Vec<Vec<Problem>> = each.collect();
            let shared: Vec<Problem> = first
                .into_iter()
                .filter(|problem| {
                    rest.iter()
                        .all(|other| other.iter().any(|o| o.field == problem.field && o.reason == problem.reason))
                })
                .collect();
            match shared.is_empty() {
                true => vec![Problem::of(error)],
                false => shared,
            }
        }
    }
}

/// `INVALID_INPUT` naming the first argument that breaks the published schema (`details.field`, in the form
/// `pos.x` or `blocks[2]`) and why (`details.reason`, the validator's words, e.g. "1 is less than the minimum of
/// 10"). When more than one breaks it, `details.problems` lists them (the first [`PROBLEMS_LISTED`], each
/// `{field, reason, schema_keyword}`; `details.problems_unlisted` counts the rest, of the first [`ERRORS_READ`]
/// the validator reports) and the message names them, so an agent can mend them in a single retry.
pub(crate) fn validate(tool: &str, validator: &jsonschema::Validator, args: &Value) -> Result<(), ToolError> {
    let errors: Vec<jsonschema::ValidationError<'_>> = validator.iter_errors(args).take(ERRORS_READ).collect();
    // Where alternatives failed (an enum): properties unevaluated there are only that failure's echo (no branch
    // was taken, so none of its properties counts as evaluated), and would call a right tag unexpected.
    let alternatives: Vec<String> = errors
        .iter()
        .filter(|error| {
            matches!(error.kind(), ValidationErrorKind::OneOfNotValid { .. } | ValidationErrorKind::AnyOf { .. })
        })
        .map(|error| path_of(error.instance_path()))
        .collect();
    let echo = |error: &jsonschema::ValidationError<'_>| {
        matches!(error.kind(), ValidationErrorKind::UnevaluatedProperties { .. })
            && alternatives.contains(&path_of(error.instance_path()))
    };
    let mut problems = errors.iter().filter(|error| !echo(error)).flat_map(|error| explained(error, 0));
    let Some(first) = problems.next() else { return Ok(()) };
    let others: Vec<Problem> = problems.by_ref().take(PROBLEMS_LISTED - 1).collect();
    // Only counted: the rest are not described.
    let unlisted = problems.count();
    let Problem { field, reason, keyword } = &first;
    let mut message = if field.is_empty() {
        format!("the arguments of `{tool}` are invalid: {reason}")
    } else {
        format!("argument `{field}` of `{tool}` is invalid: {reason}")
    };
    if !others.is_empty() {
        let named: Vec<String> = others.iter().map(Problem::short).collect();
        message.push_str(&format!("; also {}", named.join("; ")));
    }
    if unlisted > 0 {
        message.push_str(&format!("; and {unlisted} more"));
    }
    let mut error = ToolError::with_code(ErrorCode::InvalidInput, message)
        .with_detail("field", field)
        .with_detail("reason", reason)
        .with_detail("schema_keyword", keyword);
    if !others.is_empty() {
        let listed: Vec<Value> = std::iter::once(&first).chain(&others).map(Problem::to_json).collect();
        error = error.with_detail("problems", listed);
    }
    if unlisted > 0 {
        error = error.with_detail("problems_unlisted", unlisted);
    }
    Err(error)
}

/// One way the arguments break the published schema.
struct Problem {
    /// Where, in the form `pos.x` or `blocks[2]` (empty: the arguments as a whole).
    field: String,
    /// Why, in the validator's words.
    reason: String,
    /// The schema keyword broken (`minimum`, `required`, ...).
    keyword: String,
}

impl Problem {
    fn of(error: &jsonschema::ValidationError<'_>) -> Self {
        let mut field = path_of(error.instance_path());
        // `required` and `additionalProperties` are reported at the object that lacks or has the property: name it.
        match error.kind() {
            ValidationErrorKind::Required { property } => {
                push_property(&mut field, property.as_str().unwrap_or_default())
            }
            ValidationErrorKind::AdditionalProperties { unexpected }
            | jsonschema::error::ValidationErrorKind::UnevaluatedProperties { unexpected } => {
                if let Some(name) = unexpected.first() {
                    push_property(&mut field, name)
                }
            }
            _ => {}
        }
        let mut reason = match error.kind() {
            // The validator names a few choices and counts the rest: a model needs them all to pick one.
            ValidationErrorKind::Enum { options } => match options.as_array() {
                Some(choices) => {
                    let choices: Vec<String> = choices.iter().map(Value::to_string).collect();
                    not_one_of(error.instance(), &choices)
                }
                None => error.to_string(),
            },
            _ => error.to_string(),
        };
        truncate(&mut reason, 2000);
        Problem { field, reason, keyword: error.kind().keyword().to_string() }
    }

    /// `field`: reason, for the message's list of the other problems (a long reason cut short: the details have
    /// it whole).
    fn short(&self) -> String {
        let mut reason = self.reason.clone();
        truncate(&mut reason, 200);
        match self.field.as_str() {
            "" => reason,
            field => format!("`{field}`: {reason}"),
        }
    }

    fn to_json(&self) -> Value {
        serde_json::json!({ "field": self.field, "reason": self.reason, "schema_keyword": self.keyword })
    }
}

/// Cuts `text` to at most `limit` bytes (on a character boundary), marking the cut.
fn truncate(text: &mut String, limit: usize) {
    if text.len() > limit {
        let cut = (0..=limit).rev().find(|at| text.is_char_boundary(*at)).unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
}

fn push_property(field: &mut String, name: &str) {
    if !field.is_empty() {
        field.push('.');
    }
    field.push_str(name);
}

/// Parses `args` (a JSON object; `null` counts as `{}`) into `A`.
#[cfg(test)]
pub(crate) fn parse<A: DeserializeOwned>(tool: &str, args: Value) -> Result<A, ToolError> {
    deserialize(tool, object_arguments(tool, args)?)
}

/// Deserializes arguments that [`object_arguments`] accepted into `A`.
pub(crate) fn deserialize<A: DeserializeOwned>(tool: &str, args: Value) -> Result<A, ToolError> {
    serde_path_to_error::deserialize(args).map_err(|error| {
        let path = error.path().to_string();
        let reason = error.into_inner().to_string();
        // serde reports a missing field at the object that lacks it ("missing field `x`"): name the field.
        let missing = reason.strip_prefix("missing field `").and_then(|rest| rest.split('`').next());
        let field = match (path.as_str(), missing) {
            (".", Some(name)) => name.to_string(),
            (".", None) => String::new(),
            (path, Some(name)) => format!("{path}.{name}"),
            (path, None) => path.to_string(),
        };
        let message = if field.is_empty() {
            format!("the arguments of `{tool}` are invalid: {reason}")
        } else {
            format!("argument `{field}` of `{tool}` is invalid: {reason}")
        };
        ToolError::with_code(ErrorCode::InvalidInput, message).with_detail("field", field).with_detail("reason", reason)
    })
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use schemars::JsonSchema;
    use serde::Deserialize;
    use serde_json::json;

    use super::*;

    #[test]
    fn an_integral_float_of_any_size_an_integer_holds_is_that_integer() {
        let mut numbers = serde_json::json!([3.0, 1e16, -1e18, 1.5e19, 1e20, 2.5]);
        super::normalize_numbers(&mut numbers);
        let sixteen: i64 = 10_000_000_000_000_000;
        let nineteen: u64 = 15_000_000_000_000_000_000;
        let eighteen: i64 = -1_000_000_000_000_000_000;
        assert_eq!(numbers, serde_json::json!([3, sixteen, eighteen, nineteen, 1e20, 2.5]));
        let parsed: i64 = super::parse("t", serde_json::json!({ "b": 1e16 }))
            .map(|args: std::collections::HashMap<String, i64>| args["b"])
            .expect("an i64");
        assert_eq!(parsed, sixteen);
    }
    #[test]
    fn every_number_of_an_output_schema_may_be_null_but_data_and_integers_stay_as_they_are() {
        let mut schema = json!({
            "type": "object",
            "properties": {
                "speed": {"type": "number"},
                "default": {"type": "number"},
                "count": {"type": "integer"},
                "maybe": {"type": ["number", "null"]},
                "many": {"type": "array", "items": {"$ref": "#/$defs/Point"}},
                "shape": {"const": {"type": "number"}, "default": {"type": "number"}, "not": {"type": "number"}}
            },
            "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number", "enum": [1.5]}}}}
        });
        nullable_numbers(&mut schema);
        let nullable = json!(["number", "null"]);
        assert_eq!(schema["properties"]["speed"]["type"], nullable);
        assert_eq!(schema["properties"]["default"]["type"], nullable, "a property named like a keyword");
        assert_eq!(schema["properties"]["count"]["type"], "integer");
        assert_eq!(schema["properties"]["maybe"]["type"], nullable, "not twice");
        assert_eq!(schema["$defs"]["Point"]["properties"]["x"]["type"], nullable);
        let shape = &schema["properties"]["shape"];
        assert_eq!([&shape["const"], &shape["default"], &shape["not"]], [&json!({"type": "number"}); 3]);
        assert_eq!(schema["type"], "object");
    }
    use crate::DestructiveGuard;

    /// Rust docs here must not reach a model.
    #[derive(Deserialize, JsonSchema)]
    #[allow(dead_code)]
    struct Args {
        /// West–east.
        x: i32,
        count: u64,
        small: u8,
        ratio: f32,
        wide: i128,
        wider: u128,
        size: usize,
        offset: isize,
        precise: f64,
        #[serde(flatten)]
        guard: DestructiveGuard,
    }

    #[test]
    fn published_schemas_carry_no_rust_docs_of_the_type_and_no_schemars_formats() {
        let schema = input_schema_of::<Args>();
        let text = schema.to_string();
        assert!(schema.get("description").is_none() && schema.get("title").is_none(), "{schema}");
        assert!(!text.contains("serde(flatten)") && !text.contains("Rust docs"), "{schema}");
        assert!(!text.contains("\"format\""), "no int32/uint64/uint8/float formats: {schema}");
        assert_eq!(schema["properties"]["x"]["description"], "West–east.", "fields keep their docs");
        assert_eq!(schema["properties"]["count"]["minimum"], 0, "bounds stay");
    }

    #[test]
    fn argument_schemas_are_closed_and_output_schemas_follow_what_serializes() {
        assert_eq!(input_schema_of::<Args>()["additionalProperties"], false, "flattened helpers included");
        assert_eq!(input_schema_of::<crate::NoArgs>()["additionalProperties"], false, "none at all");
        #[derive(serde::Serialize, JsonSchema)]
        #[allow(dead_code)]
        enum Either {
            A { a: u8 },
            B { b: u8 },
        }
        let either = input_schema_of::<Either>();
        assert_eq!(either["unevaluatedProperties"], false, "a oneOf root counts the matched shape's properties");
        assert!(either.get("additionalProperties").is_none(), "which additionalProperties would refuse: {either}");
        let mut open = json!({ "type": "object", "additionalProperties": { "type": "integer" } });
        close(&mut open);
        assert_eq!(open, json!({ "type": "object", "additionalProperties": { "type": "integer" } }), "left as written");
        #[derive(serde::Serialize, JsonSchema)]
        #[allow(dead_code)]
        struct Out {
            #[serde(skip_serializing_if = "Vec::is_empty")]
            warnings: Vec<String>,
            count: u32,
        }
        assert_eq!(output_schema_of::<Out>()["required"], json!(["count"]), "`warnings` may be left out");
    }

    #[test]
    fn a_missing_required_argument_names_the_field() {
        let error = parse::<Args>("t", json!({ "count": 1, "small": 1, "ratio": 1.0 })).err().expect("refused");
        assert_eq!(error.code, ErrorCode::InvalidInput);
        assert_eq!(error.details.extra["field"], "x", "{error:?}");
        assert!(error.message.contains("`x`"), "{}", error.message);
    }
}
