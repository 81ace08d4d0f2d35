//! [`flat_root`]: a tool's argument schema as models are given it, without `oneOf`, `anyOf` or `allOf` at its root.
//!
//! An enum of argument shapes (`#[serde(tag = "action")] enum Steer { Left { by: u32 }, Right { by: u32 } }`), or a
//! struct with a flattened enum, has a schema made of alternatives at its root. JSON Schema and MCP allow it, but
//! the model APIs behind the clients do not: Anthropic's refuses the whole request ("input_schema does not support
//! oneOf, allOf, or anyOf at the top level": Claude Code drops the tool or fails every request of its session), and
//! Gemini's and OpenAI's strict mode refuse it too. So clients are shown one object: every property any shape has,
//! required only where every shape requires it, the same property's different schemas as one (its constant values
//! gathered in an `enum`, else an `anyOf` below the root), and a root description naming the shapes. The exact
//! schema is still the one calls are checked against: arguments that mix two shapes are refused with
//! `INVALID_INPUT` saying why.

#![cfg_attr(not(any(feature = "mcp", feature = "openai")), allow(dead_code))]

use serde_json::{json, Map, Value};

/// The keywords that make a schema of others.
const COMPOSING: [&str; 3] = ["allOf", "oneOf", "anyOf"];

/// `schema` with the alternatives at its root merged into one object schema, as described in the module's doc.
/// A schema without them is returned as it is.
pub(crate) fn flat_root(schema: Value) -> Value {
    let Value::Object(mut root) = schema else { return schema };
    if !COMPOSING.iter().any(|keyword| root.contains_key(*keyword)) {
        return Value::Object(root);
    }
    let defs = root.get("$defs").or_else(|| root.get("definitions")).cloned().unwrap_or(Value::Null);
    let mut merged = Shape::of(&root);
    if let Some(Value::Array(all)) = root.remove("allOf") {
        for part in &all {
            merged.and(&Shape::of_flat(&resolve(part, &defs), &defs));
        }
    }
    let mut forms = Vec::new();
    for keyword in ["oneOf", "anyOf"] {
        let Some(Value::Array(alternatives)) = root.remove(keyword) else { continue };
        let shapes: Vec<Shape> =
            alternatives.iter().map(|alternative| Shape::of_flat(&resolve(alternative, &defs), &defs)).collect();
        // Shapes that are not objects (a unit variant's bare string) cannot be arguments: left out.
        let shapes: Vec<Shape> = shapes.into_iter().filter(|shape| !shape.properties.is_empty()).collect();
        let Some(first) = shapes.first() else { continue };
        let mut either = Shape { required: first.required.clone(), ..Shape::default() };
        for shape in &shapes {
            forms.push(shape.form());
            either.or(shape);
        }
        merged.and(&either);
    }
    root.insert("type".into(), json!("object"));
    root.insert("properties".into(), Value::Object(merged.properties));
    if merged.required.is_empty() {
        root.remove("required");
    } else {
        root.insert("required".into(), json!(merged.required));
    }
    if !forms.is_empty() {
        let described = format!("Arguments in one of these forms: {}.", forms.join("; or "));
        let description = match root.get("description").and_then(Value::as_str) {
            Some(own) => format!("{own} {described}"),
            None => described,
        };
        root.insert("description".into(), Value::String(description));
    }
    Value::Object(root)
}

/// The schema `#/$defs/NAME` (or `#/definitions/NAME`) names, if `schema` is such a reference.
fn resolve(schema: &Value, defs: &Value) -> Value {
    let named = schema
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|reference| reference.strip_prefix("#/$defs/").or_else(|| reference.strip_prefix("#/definitions/")));
    match named.and_then(|name| defs.get(name)) {
        Some(target) => target.clone(),
        None => schema.clone(),
    }
}

/// The properties of an object schema and those it requires.
#[derive(Default)]
struct Shape {
    properties: Map<String, Value>,
    required: Vec<String>,
    /// What it is for (a variant's doc comment).
    description: Option<String>,
}

impl Shape {
    fn of(schema: &Map<String, Value>) -> Self {
        let properties = schema.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
        let required = schema.get("required").and_then(Value::as_array).into_iter().flatten();
        let description = schema.get("description").and_then(Value::as_str).map(str::to_string);
        Self { properties, required: required.filter_map(Value::as_str).map(str::to_string).collect(), description }
    }

    /// The shape of `schema`, its own alternatives merged first (an enum inside a flattened enum).
    fn of_flat(schema: &Value, defs: &Value) -> Self {
        let mut schema = schema.clone();
        if let (Value::Object(object), false) = (&mut schema, defs.is_null()) {
            object.entry("$defs").or_insert_with(|| defs.clone());
        }
        match flat_root(schema) {
            Value::Object(object) => Self::of(&object),
            _ => Self::default(),
        }
    }

    /// Both this and `other` hold: every property of either, every required one of either.
    fn and(&mut self, other: &Shape) {
        for (name, schema) in &other.properties {
            merge_property(&mut self.properties, name, schema);
        }
        for name in &other.required {
            if !self.required.contains(name) {
                self.required.push(name.clone());
            }
        }
    }

    /// This or `other` holds: every property of either, required only where both require it.
    fn or(&mut self, other: &Shape) {
        for (name, schema) in &other.properties {
            merge_property(&mut self.properties, name, schema);
        }
        self.required.retain(|name| other.required.contains(name));
    }

    /// How a model reads this shape: its properties, the required ones first.
    fn form(&self) -> String {
        let mut names: Vec<String> = self.required.clone();
        names
            .extend(self.properties.keys().filter(|name| !self.required.contains(name)).map(|name| format!("{name}?")));
        let constants: Vec<String> = self
            .properties
            .iter()
            .filter_map(|(name, schema)| schema.get("const").map(|value| format!("{name} = {value}")))
            .collect();
        let form = match constants.is_empty() {
            true => format!("{{{}}}", names.join(", ")),
            false => format!("{{{}}} with {}", names.join(", "), constants.join(", ")),
        };
        match &self.description {
            Some(description) => format!("{form} ({description})"),
            None => form,
        }
    }
}

/// Adds `schema` as property `name`'s: as it is if it has none yet or the same one, else together with the one it
/// has: their constants as one `enum` where both are constants of one type, else as an `anyOf`.
fn merge_property(properties: &mut Map<String, Value>, name: &str, schema: &Value) {
    let Some(existing) = properties.get_mut(name) else {
        properties.insert(name.to_string(), schema.clone());
        return;
    };
    if existing == schema {
        return;
    }
    let constants = |schema: &Value| -> Option<(Option<Value>, Vec<Value>)> {
        let kind = schema.get("type").cloned();
        match (schema.get("const"), schema.get("enum").and_then(Value::as_array)) {
            (Some(value), None) => Some((kind, vec![value.clone()])),
            (None, Some(values)) => Some((kind, values.clone())),
            _ => None,
        }
    };
    if let (Some((kind, mut values)), Some((other_kind, others))) = (constants(existing), constants(schema)) {
        if kind == other_kind {
            for value in others {
                if !values.contains(&value) {
                    values.push(value);
                }
            }
            let mut merged = Map::new();
            if let Some(kind) = kind {
                merged.insert("type".into(), kind);
            }
            merged.insert("enum".into(), Value::Array(values));
            *existing = Value::Object(merged);
            return;
        }
    }
    let only_alternatives = existing.as_object().is_some_and(|object| object.len() == 1);
    match existing.get_mut("anyOf").and_then(Value::as_array_mut) {
        Some(alternatives) if only_alternatives => {
            if !alternatives.contains(schema) {
                alternatives.push(schema.clone());
            }
        }
        _ => *existing = json!({ "anyOf": [existing.clone(), schema.clone()] }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::input::input_schema_of;

    fn roots_alternatives(schema: &Value) -> Vec<&str> {
        COMPOSING.into_iter().filter(|keyword| schema.get(*keyword).is_some()).collect()
    }

    #[test]
    fn an_internally_tagged_enum_becomes_one_object_with_its_tag_an_enum() {
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[serde(tag = "action", rename_all = "snake_case")]
        #[allow(dead_code)]
        enum Steer {
            /// Turns left.
            Left {
                by: u32,
            },
            Right {
                by: u32,
                hard: Option<bool>,
            },
        }
        let exact = input_schema_of::<Steer>();
        assert!(!roots_alternatives(&exact).is_empty(), "the exact schema has its alternatives: {exact}");
        let flat = flat_root(exact);
        assert_eq!(roots_alternatives(&flat), Vec::<&str>::new(), "{flat}");
        assert_eq!(flat["type"], "object");
        assert_eq!(flat["properties"]["action"]["enum"], json!(["left", "right"]), "{flat}");
        assert_eq!(flat["properties"]["by"]["type"], "integer", "{flat}");
        assert!(flat["properties"].get("hard").is_some(), "a property of one shape only: {flat}");
        assert_eq!(flat["required"], json!(["action", "by"]), "required by every shape: {flat}");
        let description = flat["description"].as_str().unwrap_or_default();
        assert!(description.contains(r#"action = "left" (Turns left.)"#), "{description}");
        assert!(description.contains("hard?"), "{description}");
    }

    #[test]
    fn an_externally_tagged_enum_of_structs_lists_each_variant_none_required() {
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[allow(dead_code)]
        struct Place {
            x: i32,
        }
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[allow(dead_code)]
        enum Command {
            Place(Place),
            Break { x: i32 },
        }
        let flat = flat_root(input_schema_of::<Command>());
        assert_eq!(roots_alternatives(&flat), Vec::<&str>::new(), "{flat}");
        let properties = flat["properties"].as_object().expect("properties");
        assert!(properties.contains_key("Place") && properties.contains_key("Break"), "{flat}");
        assert!(flat.get("required").is_none(), "no variant is required by every shape: {flat}");
        // A variant that refers to a definition still finds it: the definitions stay at the root.
        assert!(flat.get("$defs").is_some_and(|defs| defs.get("Place").is_some()), "{flat}");
    }

    #[test]
    fn an_untagged_enum_of_referenced_structs_and_a_flattened_enum_merge_too() {
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[allow(dead_code)]
        struct ByName {
            name: String,
        }
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[allow(dead_code)]
        struct ById {
            id: u64,
        }
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[serde(untagged)]
        #[allow(dead_code)]
        enum Target {
            Name(ByName),
            Id(ById),
        }
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[allow(dead_code)]
        struct Give {
            count: u32,
            #[serde(flatten)]
            target: Target,
        }
        let flat = flat_root(input_schema_of::<Give>());
        assert_eq!(roots_alternatives(&flat), Vec::<&str>::new(), "{flat}");
        let properties = flat["properties"].as_object().expect("properties");
        assert!(["count", "name", "id"].iter().all(|name| properties.contains_key(*name)), "{flat}");
        assert_eq!(flat["required"], json!(["count"]), "{flat}");
    }

    #[test]
    fn a_schema_without_alternatives_at_its_root_is_left_as_it_is() {
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[allow(dead_code)]
        struct Plain {
            x: i32,
            mode: Option<Mode>,
        }
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[allow(dead_code)]
        enum Mode {
            Fast,
            Slow { by: u8 },
        }
        let exact = input_schema_of::<Plain>();
        assert_eq!(flat_root(exact.clone()), exact);
    }

    #[test]
    fn one_property_with_schemas_that_differ_keeps_both_below_the_root() {
        let schema = json!({
            "oneOf": [
                { "type": "object", "properties": { "at": { "type": "integer" } }, "required": ["at"] },
                { "type": "object", "properties": { "at": { "type": "string" } }, "required": ["at"] },
                { "type": "object", "properties": { "at": { "type": "boolean" } }, "required": ["at"] }
            ]
        });
        let flat = flat_root(schema);
        let kinds: Vec<&Value> = flat["properties"]["at"]["anyOf"].as_array().expect("anyOf").iter().collect();
        assert_eq!(kinds.len(), 3, "{flat}");
        assert_eq!(flat["required"], json!(["at"]));
    }
}
