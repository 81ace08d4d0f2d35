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
    let Value::Object(exact) = schema else { return schema };
    let defs = exact.get("$defs").or_else(|| exact.get("definitions")).cloned().unwrap_or(Value::Null);
    // A root that is only a reference (a newtype of an enum): what it names, the root's own keys kept.
    let mut root = match reference(&exact).and_then(|name| defs.get(name)).and_then(Value::as_object) {
        Some(named) => beside(&exact, named),
        None => exact.clone(),
    };
    if !COMPOSING.iter().any(|keyword| root.contains_key(*keyword)) {
        // A reference to one object schema that takes no other properties (a newtype of an argument struct): that
        // object, closed with the keyword model APIs know, without the type's own doc (as a plain struct's root).
        let takes_others = root.contains_key("additionalProperties") || root.contains_key("patternProperties");
        if reference(&exact).is_some()
            && !takes_others
            && root.get("unevaluatedProperties") == Some(&Value::Bool(false))
        {
            root.remove("unevaluatedProperties");
            root.remove("title");
            root.remove("description");
            root.insert("additionalProperties".into(), Value::Bool(false));
            return Value::Object(root);
        }
        return Value::Object(exact);
    }
    let shape = shape_of(&root, &defs, &mut Vec::new());
    for keyword in COMPOSING.iter().chain(&["$ref"]) {
        root.remove(*keyword);
    }
    root.insert("type".into(), json!("object"));
    root.insert("properties".into(), Value::Object(shape.properties));
    // One object listing every shape's properties: what no shape has is refused as before, in the keyword model
    // APIs know (`unevaluatedProperties` is 2020-12's and only counts through the alternatives just merged).
    if root.remove("unevaluatedProperties") == Some(Value::Bool(false)) {
        root.insert("additionalProperties".into(), Value::Bool(false));
    }
    if shape.required.is_empty() {
        root.remove("required");
    } else {
        root.insert("required".into(), json!(shape.required));
    }
    let groups: Vec<String> = shape.groups.iter().map(|forms| forms.join("; or ")).collect();
    if !groups.is_empty() {
        let described = format!("Arguments in one of these forms: {}.", groups.join(". And in one of these: "));
        let description = match root.get("description").and_then(Value::as_str) {
            Some(own) => format!("{own} {described}"),
            None => described,
        };
        root.insert("description".into(), Value::String(description));
    }
    Value::Object(root)
}

/// The definition name of a schema that is a reference into `$defs` (or `definitions`).
fn reference(schema: &Map<String, Value>) -> Option<&str> {
    let reference = schema.get("$ref").and_then(Value::as_str)?;
    reference.strip_prefix("#/$defs/").or_else(|| reference.strip_prefix("#/definitions/"))
}

/// The schema `named` with the keys a reference to it has beside its `$ref` (schemars puts an internally tagged
/// newtype variant's tag there, and a variant's doc comment): their properties and required ones added.
fn beside(reference: &Map<String, Value>, named: &Map<String, Value>) -> Map<String, Value> {
    let mut merged = named.clone();
    for (key, value) in reference.iter().filter(|(key, _)| key.as_str() != "$ref") {
        match (key.as_str(), merged.get_mut(key), value) {
            ("properties", Some(Value::Object(properties)), Value::Object(more)) => {
                properties.extend(more.iter().map(|(name, schema)| (name.clone(), schema.clone())));
            }
            ("required", Some(Value::Array(required)), Value::Array(more)) => {
                required.extend(more.iter().filter(|name| !required.contains(name)).cloned().collect::<Vec<_>>());
            }
            _ => {
                merged.insert(key.clone(), value.clone());
            }
        }
    }
    merged
}

/// The shape of object schema `schema`: its own properties, and those of its alternatives merged. `inside` are
/// the definitions being resolved: one met again (a recursive type) is left opaque, with no properties.
fn shape_of(schema: &Map<String, Value>, defs: &Value, inside: &mut Vec<String>) -> Shape {
    let mut shape = Shape::own(schema);
    if let Some(Value::Array(parts)) = schema.get("allOf") {
        for part in parts {
            let part = shape_of_part(part, defs, inside);
            shape.and(&part);
            shape.groups.extend(part.groups);
        }
    }
    for keyword in ["oneOf", "anyOf"] {
        let Some(Value::Array(alternatives)) = schema.get(keyword) else { continue };
        let shapes: Vec<Shape> =
            alternatives.iter().map(|alternative| shape_of_part(alternative, defs, inside)).collect();
        // Shapes that are not objects (a unit variant's bare string, `null`) cannot be arguments: left out.
        let shapes: Vec<Shape> = shapes.into_iter().filter(|shape| !shape.properties.is_empty()).collect();
        let Some(first) = shapes.first() else { continue };
        let mut either = Shape { required: first.required.clone(), ..Shape::default() };
        let mut forms = Vec::new();
        for alternative in &shapes {
            // An alternative made of alternatives itself (an optional enum): its own forms, one level.
            match alternative.groups.is_empty() {
                true => forms.push(alternative.form()),
                false => forms.extend(alternative.groups.iter().flatten().cloned()),
            }
            either.or(alternative);
        }
        shape.and(&either);
        shape.groups.push(forms);
    }
    shape
}

fn shape_of_part(part: &Value, defs: &Value, inside: &mut Vec<String>) -> Shape {
    let Some(part) = part.as_object() else { return Shape::default() };
    let Some(name) = reference(part) else { return shape_of(part, defs, inside) };
    let Some(named) = defs.get(name).and_then(Value::as_object) else { return shape_of(part, defs, inside) };
    if inside.iter().any(|seen| seen == name) {
        return Shape::default();
    }
    inside.push(name.to_string());
    let shape = shape_of(&beside(part, named), defs, inside);
    inside.pop();
    shape
}

/// The properties of an object schema and those it requires.
#[derive(Default)]
struct Shape {
    properties: Map<String, Value>,
    required: Vec<String>,
    /// What it is for (a variant's doc comment).
    description: Option<String>,
    /// The forms of each set of alternatives it was made of.
    groups: Vec<Vec<String>>,
}

impl Shape {
    /// The properties `schema` has itself.
    fn own(schema: &Map<String, Value>) -> Self {
        let properties = schema.get("properties").and_then(Value::as_object).cloned().unwrap_or_default();
        let required = schema.get("required").and_then(Value::as_array).into_iter().flatten();
        let description = schema.get("description").and_then(Value::as_str).map(str::to_string);
        let required = required.filter_map(Value::as_str).map(str::to_string).collect();
        Self { properties, required, description, groups: Vec::new() }
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

    /// How a model reads this shape: its properties, the required ones first, its constants, what it is for.
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
        assert_eq!(flat["additionalProperties"], false, "what no shape has is refused, in the keyword APIs know");
        assert!(flat.get("unevaluatedProperties").is_none(), "{flat}");
        let description = flat["description"].as_str().unwrap_or_default();
        assert!(description.contains(r#"action = "left" (Turns left.)"#), "{description}");
        assert!(description.contains("hard?"), "{description}");
    }

    #[test]
    fn a_newtype_of_an_argument_struct_is_shown_as_that_struct_closed() {
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[allow(dead_code)]
        struct Place {
            x: i32,
        }
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[allow(dead_code)]
        struct Wrapped(Place);
        let exact = input_schema_of::<Wrapped>();
        let flat = flat_root(exact.clone());
        if exact.get("$ref").is_some() {
            assert!(flat.get("$ref").is_none() && flat.get("unevaluatedProperties").is_none(), "{flat}");
            assert_eq!(flat["additionalProperties"], false, "{flat}");
            assert_eq!(flat["properties"]["x"]["type"], "integer", "{flat}");
        } else {
            assert_eq!(flat["additionalProperties"], false, "schemars inlined it: closed as a struct: {flat}");
        }
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
    fn a_tagged_newtype_variant_keeps_its_tag_beside_its_reference() {
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[allow(dead_code)]
        struct PlaceArgs {
            x: i32,
        }
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[serde(tag = "action")]
        #[allow(dead_code)]
        enum Command {
            /// Places a block.
            Place(PlaceArgs),
            Break {
                x: i32,
            },
        }
        let flat = flat_root(input_schema_of::<Command>());
        assert_eq!(flat["properties"]["action"]["enum"], json!(["Place", "Break"]), "{flat}");
        let mut required: Vec<&str> =
            flat["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        required.sort_unstable();
        assert_eq!(required, ["action", "x"], "{flat}");
        let description = flat["description"].as_str().unwrap_or_default();
        assert!(description.contains(r#"action = "Place" (Places a block.)"#), "{description}");
    }

    #[test]
    fn a_recursive_type_is_flattened_without_following_it_forever() {
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[serde(untagged)]
        #[allow(dead_code)]
        enum Target {
            Name { name: String },
            Group { all: Vec<Target> },
            Nested(Box<Target>),
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
        assert!(["count", "name", "all"].iter().all(|name| properties.contains_key(*name)), "{flat}");
        let flat = flat_root(input_schema_of::<Option<Target>>());
        assert!(flat["properties"].get("name").is_some(), "{flat}");
    }

    #[test]
    fn an_optional_enum_two_flattened_enums_and_a_root_reference_name_their_forms() {
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[serde(tag = "action")]
        #[allow(dead_code)]
        enum Action {
            Jump { height: u8 },
            Duck,
        }
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[serde(tag = "mode")]
        #[allow(dead_code)]
        enum Mode {
            Fast,
            Slow { by: u8 },
        }
        #[derive(serde::Deserialize, schemars::JsonSchema)]
        #[allow(dead_code)]
        struct Both {
            #[serde(flatten)]
            action: Action,
            #[serde(flatten)]
            mode: Mode,
        }
        let optional = flat_root(input_schema_of::<Option<Action>>());
        assert_eq!(optional["properties"]["action"]["enum"], json!(["Jump", "Duck"]), "{optional}");
        let description = optional["description"].as_str().unwrap_or_default();
        assert_eq!(description.matches("one of these forms").count(), 1, "not nested: {description}");
        assert!(description.contains(r#"action = "Duck""#), "{description}");

        let both = flat_root(input_schema_of::<Both>());
        assert_eq!(roots_alternatives(&both), Vec::<&str>::new(), "{both}");
        assert_eq!(both["required"], json!(["action", "mode"]), "{both}");
        let description = both["description"].as_str().unwrap_or_default();
        assert!(
            description.contains(r#"action = "Jump""#) && description.contains(r#"mode = "Slow""#),
            "{description}"
        );

        let referenced = json!({
            "$ref": "#/$defs/Action",
            "$defs": { "Action": input_schema_of::<Action>() }
        });
        let flat = flat_root(referenced);
        assert_eq!(flat["properties"]["action"]["enum"], json!(["Jump", "Duck"]), "{flat}");
        assert!(flat.get("$ref").is_none(), "{flat}");
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
