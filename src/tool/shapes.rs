//! Arguments of one shape. An untagged enum of argument shapes (`#[serde(untagged)] enum Target { Name { name:
//! String }, Id { id: u64 } }`, at the root or flattened into the arguments) publishes its shapes as the `anyOf`
//! of the arguments' schema, which takes arguments that fit two shapes at once (`{"name": "ada", "id": 7}`): the
//! whole schema counts every property some shape evaluated. serde takes the first shape that fits and drops the
//! rest without a word, so a call would run on part of what the agent asked. Here such arguments are refused
//! with `INVALID_INPUT` naming what the shape they were read as has no room for.
//!
//! Which shape serde reads them as is told by each shape's schema, with its `format`s checked (a `Uuid` field's
//! `uuid`: serde refuses a string that is not one, and goes on to the next shape). A field read by code of the
//! game's own (`deserialize_with`, `try_from`) beyond what its schema says can make serde take a later shape than
//! its schema does, and a format serde reads more loosely than its schema's checker (a `Uuid` written without
//! hyphens, which serde takes and the `uuid` format does not) an earlier one: then the dropped properties named are
//! those of the shape the schema judged. Only the arguments' own `anyOf` is looked at: one untagged enum at their
//! root or flattened into them (two flattened ones are an `allOf` of alternatives, not checked).

use serde_json::{Map, Value};

use crate::error::{ErrorCode, ToolError};

/// Each shape of the arguments' root `anyOf`, in order: the schema with that shape alone, open (does it fit?) and
/// closed (is every given property one of its own or the arguments' common ones?).
pub(crate) struct Shapes(Vec<(jsonschema::Validator, jsonschema::Validator)>);

impl Shapes {
    /// The shapes of `schema` (a closed argument schema, see [`close`](super::input::close)); none when its root
    /// has no `anyOf`, is not closed, or a shape's schema cannot be compiled.
    pub(crate) fn of(schema: &Value) -> Self {
        let Value::Object(root) = schema else { return Self(Vec::new()) };
        let (Some(Value::Array(alternatives)), Some(Value::Bool(false))) =
            (root.get("anyOf"), root.get("unevaluatedProperties"))
        else {
            return Self(Vec::new());
        };
        let shapes: Option<Vec<_>> = alternatives
            .iter()
            .map(|alternative| {
                let closed = alone(root, alternative);
                let mut open = closed.clone();
                open.remove("unevaluatedProperties");
                let compile =
                    |schema| jsonschema::options().should_validate_formats(true).build(&Value::Object(schema));
                let (open, closed) = (compile(open).ok()?, compile(closed).ok()?);
                Some((open, closed))
            })
            .collect();
        Self(shapes.unwrap_or_default())
    }

    /// Refuses `args` (valid against the whole schema) when the first shape they fit, the one serde reads them as,
    /// leaves some of their properties unread.
    pub(crate) fn check(&self, tool: &str, args: &Value) -> Result<(), ToolError> {
        let Some((_, closed)) = self.0.iter().find(|(open, _)| open.is_valid(args)) else { return Ok(()) };
        if closed.is_valid(args) {
            return Ok(());
        }
        let dropped: Vec<String> = closed
            .iter_errors(args)
            .filter_map(|error| match error.kind() {
                jsonschema::error::ValidationErrorKind::UnevaluatedProperties { unexpected } => {
                    Some(unexpected.clone())
                }
                _ => None,
            })
            .flatten()
            .collect();
        let Some(field) = dropped.first() else { return Ok(()) };
        let named: Vec<String> = dropped.iter().map(|name| format!("`{name}`")).collect();
        let reason = format!(
            "the arguments fit more than one of the tool's shapes, and are read as the first they fit, which has no \
             {}: give the arguments of one shape only",
            named.join(", ")
        );
        Err(ToolError::with_code(
            ErrorCode::InvalidInput,
            format!("argument `{field}` of `{tool}` is invalid: {reason}"),
        )
        .with_detail("field", field.as_str())
        .with_detail("reason", reason)
        .with_detail("schema_keyword", "anyOf"))
    }
}

/// `root` with its `anyOf` replaced by `alternative` alone (beside its other keywords: the arguments' common
/// properties, a flattened guard's `allOf`).
fn alone(root: &Map<String, Value>, alternative: &Value) -> Map<String, Value> {
    let mut schema = root.clone();
    schema.remove("anyOf");
    match schema.get_mut("allOf") {
        Some(Value::Array(all)) => all.push(alternative.clone()),
        _ => {
            schema.insert("allOf".into(), Value::Array(vec![alternative.clone()]));
        }
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::input::input_schema_of;
    use serde_json::json;

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[serde(untagged)]
    #[allow(dead_code)]
    enum Target {
        Name { name: String },
        Both { name: String, id: u64 },
        Id { id: u64 },
        // serde refuses a `kind` that is not a date, and reads such arguments as `Tag`.
        Dated { kind: Date },
        Tag { kind: String, weight: u32 },
    }

    /// A date, as serde reads it from a string (its schema's `format` says so).
    #[allow(dead_code)]
    struct Date(String);

    impl schemars::JsonSchema for Date {
        fn schema_name() -> std::borrow::Cow<'static, str> {
            "Date".into()
        }
        fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
            schemars::json_schema!({ "type": "string", "format": "date" })
        }
    }

    impl<'de> serde::Deserialize<'de> for Date {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            let text = String::deserialize(deserializer)?;
            let date = text.len() == 10 && text.chars().all(|c| c.is_ascii_digit() || c == '-');
            date.then_some(Self(text)).ok_or_else(|| serde::de::Error::custom("not a date"))
        }
    }

    #[derive(serde::Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)]
    struct Give {
        count: u32,
        #[serde(flatten)]
        target: Target,
    }

    #[test]
    fn arguments_read_as_a_shape_without_room_for_all_of_them_are_refused_naming_what_would_be_dropped() {
        let shapes = Shapes::of(&input_schema_of::<Give>());
        // Read as `Name` (the first shape they fit), `id` would be dropped.
        let error = shapes.check("give", &json!({ "count": 1, "name": "ada", "id": 7 })).expect_err("refused");
        assert_eq!(error.code, ErrorCode::InvalidInput);
        assert_eq!(error.details.extra["field"], "id", "{error:?}");
        assert!(error.message.contains("one shape only"), "{}", error.message);
        // Each shape alone, with the arguments' common property, passes.
        for args in [json!({ "count": 1, "name": "ada" }), json!({ "count": 1, "id": 7 })] {
            shapes.check("give", &args).expect("one shape");
        }
        let shapes = Shapes::of(&input_schema_of::<Target>());
        assert!(shapes.check("target", &json!({ "name": "ada", "id": 7 })).is_err(), "at the root too");
        shapes.check("target", &json!({ "id": 7 })).expect("one shape");
        // Not a date: serde reads it as `Tag`, which takes every property given.
        shapes.check("target", &json!({ "kind": "rare", "weight": 2 })).expect("read as `Tag`, nothing dropped");
        let error = shapes.check("target", &json!({ "kind": "2026-12-05", "weight": 2 })).expect_err("refused");
        assert_eq!(error.details.extra["field"], "weight", "read as `Dated`: {error:?}");
    }
}
