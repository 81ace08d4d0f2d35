//! A tool's parameters as every OpenAI-compatible server reads them: [`inlined`].
//!
//! The schemas the crate derives (schemars) name nested types once, in `$defs`, and refer to them with `$ref`; an
//! enum whose variants have docs is a `oneOf` of constants. JSON Schema and OpenAI allow both, but Ollama reads a
//! tool's parameters into a fixed structure that keeps only `type`, `properties`, `required`, `items`, `enum`,
//! `anyOf` and `description`: a struct or an enum argument reached its models as an untyped field (the sandbox's
//! `travel` as a `dimension` with no list of dimensions). So models are given each reference replaced by what it
//! names (a type that contains itself keeps its reference, and the definitions with it), constants as an `enum`
//! (their docs joined into the description), and no `$schema`; and, as Ollama reads neither `oneOf` nor `const`,
//! alternatives that are not all constants (an enum whose variants carry data) as `anyOf`, and a lone constant (a
//! variant's tag) as an `enum` of one. Calls are still checked against the exact schema.

use serde_json::{Map, Value};

/// How large a tool's parameters may grow by inlining: past `GROWTH` times their size (and [`INLINED_LEAST`]), they
/// are sent as they were, references kept. Types that refer to one another are copied once per path through them.
const GROWTH: usize = 4;
const INLINED_LEAST: usize = 16 * 1024;
/// The most definitions inlined in one schema, which stops the copying long before it could take time or memory.
const INLINES_MOST: usize = 256;

/// `schema` with its local references replaced by their definitions and `oneOf`s of constants as `enum`s (as it
/// was, without `$schema`, where that would make it much larger), in the words Ollama reads.
pub(crate) fn inlined(schema: Value) -> Value {
    let mut inlined = references_inlined(schema);
    in_ollamas_words(&mut inlined);
    inlined
}

/// `schema` in the keywords Ollama's tool structure keeps (`anyOf`, `enum`; it drops what it does not know):
/// `oneOf` as `anyOf` (the alternatives of a Rust enum are disjoint, so both say the same), `const` as an `enum`
/// of one.
fn in_ollamas_words(schema: &mut Value) {
    match schema {
        Value::Array(items) => items.iter_mut().for_each(in_ollamas_words),
        Value::Object(keywords) => {
            for (key, child) in keywords.iter_mut() {
                match (key.as_str(), child) {
                    // Values, not schemas.
                    ("const" | "enum" | "default" | "examples", _) => {}
                    // Schemas by name: the names are not keywords.
                    ("properties" | "patternProperties" | "$defs" | "definitions", Value::Object(named)) => {
                        named.values_mut().for_each(in_ollamas_words)
                    }
                    (_, child) => in_ollamas_words(child),
                }
            }
            if !keywords.contains_key("anyOf") {
                if let Some(alternatives) = keywords.remove("oneOf") {
                    keywords.insert("anyOf".into(), alternatives);
                }
            }
            if !keywords.contains_key("enum") {
                if let Some(constant) = keywords.remove("const") {
                    keywords.insert("enum".into(), Value::Array(vec![constant]));
                }
            }
        }
        _ => {}
    }
}

/// `schema` with its local references replaced by their definitions and `oneOf`s of constants as `enum`s; as it
/// was (without `$schema`) where that would make it much larger.
fn references_inlined(schema: Value) -> Value {
    let Value::Object(mut root) = schema else { return schema };
    root.remove("$schema");
    let original = Value::Object(root.clone());
    let (key, defs) = match root.remove("$defs") {
        Some(defs) => ("$defs", Some(defs)),
        None => ("definitions", root.remove("definitions")),
    };
    let named = defs.as_ref().and_then(Value::as_object).cloned().unwrap_or_default();
    let mut walk = Walk { named, within: Vec::new(), kept: false, inlines: 0 };
    let mut inlined = Value::Object(root);
    if walk.inline(&mut inlined).is_none() {
        return original;
    }
    // A reference left (a type that contains itself): its definitions stay, under the name they had.
    if let (true, Some(defs), Value::Object(root)) = (walk.kept, defs, &mut inlined) {
        root.insert(key.into(), defs);
    }
    let limit = original.to_string().len().saturating_mul(GROWTH).max(INLINED_LEAST);
    match inlined.to_string().len() > limit {
        true => original,
        false => inlined,
    }
}

/// The definition a `$ref` names, if it is a local one (`#/$defs/Name`, `#/definitions/Name`).
fn reference(schema: &Map<String, Value>) -> Option<&str> {
    let target = schema.get("$ref")?.as_str()?;
    target.strip_prefix("#/$defs/").or_else(|| target.strip_prefix("#/definitions/"))
}

/// One schema's inlining.
struct Walk {
    /// The definitions, by name.
    named: Map<String, Value>,
    /// The definitions being inlined, outermost first: not inlined again inside themselves.
    within: Vec<String>,
    /// A reference stays.
    kept: bool,
    /// Definitions inlined so far.
    inlines: usize,
}

impl Walk {
    /// Inlines in `value`; `None` past [`INLINES_MOST`].
    fn inline(&mut self, value: &mut Value) -> Option<()> {
        match value {
            Value::Array(items) => items.iter_mut().try_for_each(|item| self.inline(item)),
            Value::Object(schema) => {
                let target = reference(schema).map(str::to_string);
                for (key, child) in schema.iter_mut() {
                    // Values, not schemas: left as they are.
                    if !matches!(key.as_str(), "$ref" | "const" | "enum" | "default" | "examples") {
                        self.inline(child)?;
                    }
                }
                if let Some(target) = target {
                    match self.named.get(&target).cloned() {
                        Some(mut definition) if !self.within.contains(&target) => {
                            self.inlines += 1;
                            if self.inlines > INLINES_MOST {
                                return None;
                            }
                            self.within.push(target);
                            self.inline(&mut definition)?;
                            self.within.pop();
                            schema.remove("$ref");
                            merge(schema, definition);
                        }
                        _ => self.kept = true,
                    }
                }
                constants_as_enum(schema);
                Some(())
            }
            _ => Some(()),
        }
    }
}

/// The referring schema's own keys (a field's description) over its definition's; two descriptions both said
/// (the field's, then its type's and its constants').
fn merge(schema: &mut Map<String, Value>, definition: Value) {
    let Value::Object(definition) = definition else { return };
    for (key, value) in definition {
        match (key.as_str(), schema.get(&key), &value) {
            ("description", Some(Value::String(own)), Value::String(theirs)) if own != theirs => {
                let both = format!("{own} ({theirs})");
                schema.insert(key, Value::String(both));
            }
            _ => drop(schema.entry(key).or_insert(value)),
        }
    }
}

/// A `oneOf` (or `anyOf`) whose every alternative is a constant, as an `enum` of them, their descriptions added to
/// the schema's own.
fn constants_as_enum(schema: &mut Map<String, Value>) {
    for keyword in ["oneOf", "anyOf"] {
        let Some(Value::Array(alternatives)) = schema.get(keyword) else { continue };
        fn constant(alternative: &Value) -> Option<&Value> {
            let alternative = alternative.as_object()?;
            let plain = alternative.keys().all(|key| ["const", "description", "title", "type"].contains(&key.as_str()));
            plain.then(|| alternative.get("const")).flatten()
        }
        let Some(values) = alternatives.iter().map(constant).collect::<Option<Vec<&Value>>>() else { continue };
        if values.is_empty() {
            continue;
        }
        let described: Vec<String> = alternatives
            .iter()
            .filter_map(|alternative| {
                let description = alternative.get("description")?.as_str()?;
                let value = alternative.get("const")?;
                Some(format!("{}: {description}", value.as_str().map_or_else(|| value.to_string(), str::to_string)))
            })
            .collect();
        let values: Vec<Value> = values.into_iter().cloned().collect();
        let same_type = |kind: fn(&Value) -> bool, name: &str| values.iter().all(kind).then(|| name.to_string());
        let integer = |value: &Value| value.is_i64() || value.is_u64();
        let kind = same_type(Value::is_string, "string")
            .or_else(|| same_type(integer, "integer"))
            .or_else(|| same_type(Value::is_number, "number"));
        schema.remove(keyword);
        schema.insert("enum".into(), Value::Array(values));
        if let Some(kind) = kind {
            schema.entry("type").or_insert(Value::String(kind));
        }
        if !described.is_empty() {
            let described = described.join("; ");
            let description = match schema.get("description").and_then(Value::as_str) {
                Some(own) => format!("{own} ({described})"),
                None => described,
            };
            schema.insert("description".into(), Value::String(description));
        }
        return;
    }
}

#[cfg(test)]
mod tests {
    use schemars::JsonSchema;
    use serde_json::json;

    use super::*;

    #[derive(JsonSchema)]
    #[serde(rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Dimension {
        /// The surface.
        Overworld,
        /// Below it.
        Nether,
    }

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Corner {
        x: i32,
        z: i32,
    }

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Build {
        /// Where to build.
        dimension: Dimension,
        corner: Corner,
        corners: Vec<Corner>,
        maybe: Option<Dimension>,
    }

    /// A tree of itself.
    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Node {
        label: String,
        children: Vec<Node>,
    }

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Plant {
        tree: Node,
    }

    fn schema_of<T: JsonSchema>() -> Value {
        serde_json::to_value(schemars::schema_for!(T)).expect("JSON")
    }

    #[test]
    fn nested_types_are_inlined_and_constants_become_an_enum() {
        let exact = schema_of::<Build>();
        assert!(exact.to_string().contains("$ref"), "schemars refers: {exact}");
        let plain = inlined(exact);
        let text = plain.to_string();
        assert!(!text.contains("$ref") && !text.contains("$defs") && !text.contains("$schema"), "{plain:#}");
        let dimension = &plain["properties"]["dimension"];
        assert_eq!(dimension["enum"], json!(["overworld", "nether"]), "{plain:#}");
        assert_eq!(dimension["type"], "string");
        let description = dimension["description"].as_str().unwrap_or_default();
        assert!(
            description.starts_with("Where to build.") && description.contains("nether: Below it."),
            "{description}"
        );
        assert_eq!(plain["properties"]["corner"]["properties"]["x"]["type"], "integer", "{plain:#}");
        assert_eq!(plain["properties"]["corners"]["items"]["required"], json!(["x", "z"]), "{plain:#}");
        assert!(plain["properties"]["maybe"].to_string().contains("overworld"), "{plain:#}");
    }

    #[test]
    fn a_type_that_contains_itself_keeps_its_reference_and_definitions() {
        let plain = inlined(schema_of::<Plant>());
        assert!(plain["$defs"]["Node"].is_object(), "{plain:#}");
        let tree = &plain["properties"]["tree"];
        assert_eq!(tree["properties"]["label"]["type"], "string", "inlined once: {plain:#}");
        assert_eq!(tree["properties"]["children"]["items"]["$ref"], "#/$defs/Node", "{plain:#}");
    }

    #[test]
    fn types_that_refer_to_one_another_are_not_copied_without_end() {
        // Eight types each referring to all the others: every path through them would be a copy.
        let names: Vec<String> = (0..8).map(|n| format!("T{n}")).collect();
        let defs: Map<String, Value> = names
            .iter()
            .map(|name| {
                let fields: Map<String, Value> = names
                    .iter()
                    .filter(|other| *other != name)
                    .map(|other| (other.to_lowercase(), json!({ "$ref": format!("#/$defs/{other}") })))
                    .collect();
                (name.clone(), json!({ "type": "object", "properties": fields }))
            })
            .collect();
        let schema = json!({ "type": "object", "properties": { "root": { "$ref": "#/$defs/T0" } }, "$defs": defs });
        let sent = inlined(schema.clone());
        assert_eq!(sent, schema, "sent as it was, references kept");
        // One big definition referred to many times grows within the bound, or is sent as it was.
        let big: Map<String, Value> = (0..20).map(|n| (format!("f{n}"), json!({ "$ref": "#/$defs/Small" }))).collect();
        let small: Map<String, Value> = (0..20).map(|n| (format!("g{n}"), json!({ "type": "integer" }))).collect();
        let wide = json!({
            "type": "object",
            "properties": (0..20).map(|n| (format!("b{n}"), json!({ "$ref": "#/$defs/Big" }))).collect::<Map<_, _>>(),
            "$defs": { "Big": { "type": "object", "properties": big }, "Small": { "type": "object", "properties": small } },
        });
        let sent = inlined(wide.clone()).to_string().len();
        assert!(sent <= (wide.to_string().len() * GROWTH).max(INLINED_LEAST), "{sent} bytes");
    }

    #[test]
    fn integer_constants_are_integers_and_values_are_not_rewritten() {
        let schema = json!({ "oneOf": [{ "const": 1, "description": "one" }, { "const": 2 }], "default": { "$ref": "#/$defs/X" } });
        let sent = inlined(schema);
        assert_eq!(sent["enum"], json!([1, 2]));
        assert_eq!(sent["type"], "integer");
        assert_eq!(sent["description"], "1: one");
        assert_eq!(sent["default"], json!({ "$ref": "#/$defs/X" }), "a value, not a schema");
    }

    #[test]
    fn alternatives_that_are_not_all_constants_stay_alternatives_in_ollamas_words() {
        let mixed = json!({ "oneOf": [{ "const": "a" }, { "type": "integer" }] });
        assert_eq!(inlined(mixed), json!({ "anyOf": [{ "enum": ["a"] }, { "type": "integer" }] }));
        assert_eq!(inlined(json!(true)), json!(true));
    }

    /// A data-carrying enum, tagged as serde's internally tagged enums are.
    #[derive(JsonSchema)]
    #[serde(tag = "kind", rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Action {
        Move { x: i32 },
        Wait { ticks: u32 },
    }

    #[derive(JsonSchema)]
    #[allow(dead_code)]
    struct Holder {
        action: Action,
        /// A property that is named as a keyword.
        #[serde(rename = "const")]
        named_const: u32,
    }

    #[test]
    fn an_enum_whose_variants_carry_data_reaches_ollama_with_its_shapes_and_tags() {
        // Ollama's tool structure has no `oneOf` and no `const`, and drops what it does not know: the argument
        // would reach its models with its description alone.
        let sent = inlined(schema_of::<Holder>());
        let text = sent.to_string();
        assert!(!text.contains("\"oneOf\""), "{sent:#}");
        let action = &sent["properties"]["action"];
        assert_eq!(action["anyOf"][0]["properties"]["kind"]["enum"], json!(["move"]), "{sent:#}");
        assert_eq!(action["anyOf"][1]["properties"]["ticks"]["type"], "integer", "{sent:#}");
        assert_eq!(sent["properties"]["const"]["type"], "integer", "a property's name is not a keyword: {sent:#}");
    }
}
