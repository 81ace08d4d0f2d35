//! A tool's parameters as every OpenAI-compatible server reads them: [`inlined`].
//!
//! The schemas the crate derives (schemars) name nested types once, in `$defs`, and refer to them with `$ref`; an
//! enum whose variants have docs is a `oneOf` of constants. JSON Schema and OpenAI allow both, but Ollama reads a
//! tool's parameters into a fixed structure that keeps only `type`, `properties`, `required`, `items`, `enum`,
//! `anyOf` and `description`: a struct or an enum argument reached its models as an untyped field (the sandbox's
//! `travel` as a `dimension` with no list of dimensions). So models are given each reference replaced by what it
//! names (a type that contains itself keeps its reference, and the definitions with it), constants as an `enum`
//! (their docs joined into the description), and no `$schema`. Calls are still checked against the exact schema.

use serde_json::{Map, Value};

/// `schema` with its local references replaced by their definitions and `oneOf`s of constants as `enum`s.
pub(crate) fn inlined(schema: Value) -> Value {
    let Value::Object(mut root) = schema else { return schema };
    root.remove("$schema");
    let defs = root.remove("$defs").or_else(|| root.remove("definitions"));
    let named = defs.as_ref().and_then(Value::as_object).cloned().unwrap_or_default();
    let mut inlined = Value::Object(root);
    let mut kept = false;
    inline(&mut inlined, &named, &mut Vec::new(), &mut kept);
    // A reference left (a type that contains itself): its definitions stay, under the name they had.
    if let (true, Some(defs), Value::Object(root)) = (kept, defs, &mut inlined) {
        root.insert("$defs".into(), defs);
    }
    inlined
}

/// The definition a `$ref` names, if it is a local one (`#/$defs/Name`, `#/definitions/Name`).
fn reference(schema: &Map<String, Value>) -> Option<&str> {
    let target = schema.get("$ref")?.as_str()?;
    target.strip_prefix("#/$defs/").or_else(|| target.strip_prefix("#/definitions/"))
}

/// Inlines in `value`, below definitions `within` (which must not be inlined again in themselves). Sets `kept` when
/// a reference stays.
fn inline(value: &mut Value, named: &Map<String, Value>, within: &mut Vec<String>, kept: &mut bool) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(|item| inline(item, named, within, kept)),
        Value::Object(schema) => {
            let target = reference(schema).map(str::to_string);
            for (key, child) in schema.iter_mut() {
                if key != "$ref" {
                    inline(child, named, within, kept);
                }
            }
            if let Some(target) = target {
                match named.get(&target) {
                    Some(definition) if !within.contains(&target) => {
                        let mut definition = definition.clone();
                        within.push(target);
                        inline(&mut definition, named, within, kept);
                        within.pop();
                        schema.remove("$ref");
                        // The referring schema's own keys (a field's description) over the definition's; two
                        // descriptions both said (the field's, then its type's and its constants').
                        if let Value::Object(definition) = definition {
                            for (key, value) in definition {
                                match (key.as_str(), schema.get(&key), &value) {
                                    ("description", Some(Value::String(own)), Value::String(theirs))
                                        if own != theirs =>
                                    {
                                        let both = format!("{own} ({theirs})");
                                        schema.insert(key, Value::String(both));
                                    }
                                    _ => drop(schema.entry(key).or_insert(value)),
                                }
                            }
                        }
                    }
                    _ => *kept = true,
                }
            }
            constants_as_enum(schema);
        }
        _ => {}
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
                Some(format!("{}: {description}", alternative.get("const")?.as_str()?))
            })
            .collect();
        let values: Vec<Value> = values.into_iter().cloned().collect();
        let same_type = |kind: fn(&Value) -> bool, name: &str| values.iter().all(kind).then(|| name.to_string());
        let kind = same_type(Value::is_string, "string").or_else(|| same_type(Value::is_number, "number"));
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
    fn alternatives_that_are_not_all_constants_stay() {
        let mixed = json!({ "oneOf": [{ "const": "a" }, { "type": "integer" }] });
        assert_eq!(inlined(mixed.clone()), mixed);
        assert_eq!(inlined(json!(true)), json!(true));
    }
}
