//! Arguments of one shape. An untagged enum of argument shapes (`#[serde(untagged)] enum Target { Name { name:
//! String }, Id { id: u64 } }`, at the root or flattened into the arguments) publishes its shapes as the `anyOf`
//! of the arguments' schema, which takes arguments that fit two shapes at once (`{"name": "ada", "id": 7}`): the
//! whole schema counts every property some shape evaluated. serde takes the first shape that fits and drops the
//! rest without a word, so a call would run on part of what the agent asked. Here such arguments are refused
//! with `INVALID_INPUT` naming what the shape they were read as has no room for.

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
                let open = jsonschema::validator_for(&Value::Object(open)).ok()?;
                let closed = jsonschema::validator_for(&Value::Object(closed)).ok()?;
                Some((open, closed))
            })
            .collect();
        Self(shapes.unwrap_or_default())
    }

    /// Refuses `args` (valid against the whole schema) when the first shape they fit, the one serde reads them as,
    /// leaves some of their properties unread.
    pub(crate) fn check(&self, tool: &str, args: &Value) -> Result<(), ToolError> {
        let Some((_, closed)) = self.0.iter().find(|(open, _)| open.is_valid(args)) else { return Ok(()) };
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
    }
}
