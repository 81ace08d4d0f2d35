//! Turning an agent's JSON into typed arguments, with `INVALID_INPUT` errors that name the field and why.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ErrorCode, ToolError};

pub(crate) fn schema_of<T: JsonSchema>() -> Value {
    schemars::SchemaGenerator::default().into_root_schema_for::<T>().to_value()
}

/// Writes integral floating-point numbers (`3.0`, `1e2`) as integers, so that how a client spells a number never
/// changes what it means: `3.0` fits a `u32` argument, and replays compare equal.
pub(crate) fn normalize_numbers(value: &mut Value) {
    match value {
        Value::Number(number) => {
            if let Some(float) = number.as_f64().filter(|f| number.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15) {
                *value = Value::from(float as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize_numbers),
        Value::Object(map) => map.values_mut().for_each(normalize_numbers),
        _ => {}
    }
}

/// Parses `args` (a JSON object; `null` counts as `{}`) into `A`.
pub(crate) fn parse<A: DeserializeOwned>(tool: &str, mut args: Value) -> Result<A, ToolError> {
    normalize_numbers(&mut args);
    let args = match args {
        Value::Null => Value::Object(Default::default()),
        Value::Object(map) => Value::Object(map),
        other => {
            return Err(ToolError::with_code(
                ErrorCode::InvalidInput,
                format!("the arguments of `{tool}` must be a JSON object, not {}", kind_of(&other)),
            )
            .with_detail("field", "")
            .with_detail("reason", "not an object"));
        }
    };
    serde_path_to_error::deserialize(args).map_err(|error| {
        let path = error.path().to_string();
        let field = if path == "." { String::new() } else { path };
        let reason = error.into_inner().to_string();
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
