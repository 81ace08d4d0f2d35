//! The reserved arguments every transport accepts on non-read-only tools: `operation_id` (retries with the same
//! id run once) and `task_id` (groups calls; defaults to the conversation).

use serde_json::{json, Map, Value};

use super::ToolInfo;
use crate::call::CallRequest;
use crate::error::{ErrorCode, ToolError};
use crate::ids::{OperationId, TaskId};

/// The reserved argument carrying the operation id.
pub const OPERATION_ID: &str = "operation_id";
/// The reserved argument carrying the task id.
pub const TASK_ID: &str = "task_id";
/// The reserved argument carrying a sessionless MCP client's conversation handle (see `crate::mcp`).
pub(crate) const CONVERSATION: &str = "conversation";

/// The arguments the transports take out of every call before the tool sees it: a tool may not have its own of
/// these names (it would never get them).
pub(crate) const RESERVED: [&str; 3] = [OPERATION_ID, TASK_ID, CONVERSATION];

/// The tool the MCP transport adds to every list (a sessionless client's conversation handle).
pub(crate) const BEGIN_CONVERSATION: &str = "begin_conversation";

/// Refuses a tool named as the transport's own [`BEGIN_CONVERSATION`] (clients would see two and reach only the
/// transport's) or with no name; warns of a name some clients cannot call: Anthropic's API takes tool names of 1
/// to 64 letters, digits, `_` and `-` only (the MCP specification also allows `.`, up to 128).
pub(crate) fn check_name(info: &ToolInfo) -> Result<(), String> {
    let name = info.name.as_str();
    if name.is_empty() {
        return Err("an agent tool needs a name".into());
    }
    if name == BEGIN_CONVERSATION {
        return Err(format!("an agent tool may not be named `{name}`: the MCP transport has a tool of that name"));
    }
    let callable = name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !callable {
        tracing::warn!(
            tool = name,
            "some agents cannot call this tool: name tools with 1 to 64 letters, digits, `_` and `-`"
        );
    }
    for argument in unusable_arguments(info) {
        tracing::warn!(
            tool = name,
            argument,
            "Claude's API refuses this tool, and with it every request of an agent that lists it: name arguments \
             with 1 to 64 letters, digits, `_`, `.` and `-` (`#[serde(rename)]`)"
        );
    }
    Ok(())
}

/// The names of the tool's arguments, as clients see them at its root, that Anthropic's API refuses: it takes
/// property keys of 1 to 64 letters, digits, `_`, `.` and `-` only, and refuses the whole request otherwise.
fn unusable_arguments(info: &ToolInfo) -> Vec<String> {
    let schema = super::flat_root::flat_root(info.client_input_schema());
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return Vec::new() };
    let usable = |key: &str| {
        (1..=64).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    };
    properties.keys().filter(|key| !usable(key)).cloned().collect()
}

const OPERATION_HELP: &str = "Optional. A unique id for this operation: use a UUID (without an MCP session, other \
copies of your client may share your conversation, and so its ids). If you retry a call with \
the same operation_id and the same arguments in the same task (your conversation, unless you send a task_id), it \
runs once and you get the first outcome; different arguments with the same id are refused (OPERATION_CONFLICT). \
After a TIMEOUT, or a CANCELLED with effect_unknown in its details, the effect is unknown: inspect the game before \
starting a new operation_id.";
/// Added to [`OPERATION_HELP`] for a tool that acts where the player is (`ToolScope::Location`).
const OPERATION_HELP_LOCATION: &str = " This tool acts where the player is: a retry after the player \
travelled (even back to the same place) is a new operation, and runs where the player is then.";
const TASK_HELP: &str = "Optional. Groups calls into one task (defaults to this conversation); operation ids are \
scoped to it.";

/// Refuses a tool whose arguments cannot be an object (a client sends an object; MCP publishes an object schema),
/// or that has an argument of a [`RESERVED`] name, at its root or in one of its shapes (`oneOf`, `anyOf`, `allOf`).
pub(crate) fn check_arguments(info: &ToolInfo) -> Result<(), String> {
    let schema = &info.input_schema;
    let object = match schema.get("type") {
        None => true,
        Some(Value::String(kind)) => kind == "object",
        Some(Value::Array(kinds)) => kinds.iter().any(|kind| kind == "object"),
        Some(_) => false,
    };
    if !object {
        return Err(format!(
            "agent tool `{}` takes arguments that are not an object (schema type {}): use a struct, an enum of \
             structs, or NoArgs",
            info.name, schema["type"]
        ));
    }
    // A shape of an enum at the root that is no object (a unit variant of an externally tagged enum is a string)
    // can never be called: clients send an object, and see only the object shapes. None that is: refused.
    let shapes = ["oneOf", "anyOf"].iter().filter_map(|keyword| schema.get(*keyword).and_then(Value::as_array));
    let shapes: Vec<&Value> = shapes.flatten().collect();
    let not_objects: Vec<&Value> = shapes
        .iter()
        .map(|shape| referred(schema, shape).unwrap_or(shape))
        .filter(|shape| {
            let takes = |kind: &Value| kind == "object" || kind == "null";
            match shape.get("type") {
                Some(Value::String(_)) => !shape.get("type").is_some_and(takes),
                Some(Value::Array(kinds)) => !kinds.iter().any(takes),
                Some(_) => true,
                None => shape.get("enum").is_some() || shape.get("const").is_some(),
            }
        })
        .collect();
    let fix = "tag the enum (`#[serde(tag = \"kind\")]`) or give the variants fields";
    if !shapes.is_empty() && not_objects.len() == shapes.len() {
        return Err(format!(
            "agent tool `{}` takes arguments none of whose shapes is an object: a client sends an object; {fix}",
            info.name
        ));
    }
    for shape in not_objects {
        tracing::warn!(tool = %info.name, %shape, "a shape of the tool's arguments is not an object: a client sends an object, so it can never be called; {fix}");
    }
    match RESERVED.iter().find(|name| declares(schema, name)) {
        Some(taken) => Err(format!(
            "agent tool `{}` has an argument named `{taken}`, which the transports take out of every call (it would \
             never reach the tool): rename it",
            info.name
        )),
        None => Ok(()),
    }
}

/// Whether an arguments schema has a property named `name`, at its root or in one of its shapes (`oneOf`,
/// `anyOf`, `allOf`, nested), following the schema's own `$ref`s (`#/$defs/...`: a newtype's arguments).
pub(crate) fn declares(schema: &Value, name: &str) -> bool {
    declares_in(schema, schema, name, 0)
}

/// What `shape` refers to (`$ref` to `#/...`) in `root`, if it refers to something there.
fn referred<'a>(root: &'a Value, shape: &Value) -> Option<&'a Value> {
    let pointer = shape.get("$ref").and_then(Value::as_str)?.strip_prefix('#')?;
    root.pointer(pointer)
}

fn declares_in(root: &Value, shape: &Value, name: &str, depth: usize) -> bool {
    if depth > 16 {
        return false;
    }
    if let Some(target) = referred(root, shape) {
        if declares_in(root, target, name, depth + 1) {
            return true;
        }
    }
    if shape.get("properties").and_then(Value::as_object).is_some_and(|props| props.contains_key(name)) {
        return true;
    }
    let shapes = ["oneOf", "anyOf", "allOf"].iter().filter_map(|key| shape.get(*key).and_then(Value::as_array));
    shapes.flatten().any(|inner| declares_in(root, inner, name, depth + 1))
}

impl ToolInfo {
    /// The tool's own input schema plus `operation_id` and `task_id` for non-read-only tools: what transports
    /// build theirs from (the MCP server adds `conversation` and flattens the root; the OpenAI-compatible backend
    /// leaves the reserved arguments out).
    pub fn client_input_schema(&self) -> Value {
        let mut schema = self.input_schema.clone();
        if self.annotations.read_only {
            return schema;
        }
        if let Some(object) = schema.as_object_mut() {
            let properties = object.entry("properties").or_insert_with(|| Value::Object(Map::new()));
            if let Some(properties) = properties.as_object_mut() {
                let help = match self.scope {
                    super::ToolScope::Location => format!("{OPERATION_HELP}{OPERATION_HELP_LOCATION}"),
                    super::ToolScope::World => OPERATION_HELP.to_string(),
                };
                // As `take_id` reads them: 1 to 256 characters.
                let id =
                    |help: &str| json!({ "type": "string", "minLength": 1, "maxLength": 256, "description": help });
                properties.entry(OPERATION_ID).or_insert(id(&help));
                properties.entry(TASK_ID).or_insert(id(TASK_HELP));
            }
        }
        schema
    }
}

impl ToolInfo {
    /// The shape of a result's JSON as a client reads it: the tool's own output schema without its
    /// [`ImageContent`](super::ImageContent) fields, which travel as image content. Over MCP it is the published
    /// output schema, except for a tool with such fields, which publishes none (its results carry no
    /// `structuredContent`, for clients that would give their model only that).
    pub fn client_output_schema(&self) -> Value {
        let mut schema = self.output_schema.clone();
        let Some(object) = schema.as_object_mut() else { return schema };
        let images: Vec<String> = object
            .get("properties")
            .and_then(Value::as_object)
            .map(|properties| {
                properties.iter().filter(|(_, p)| super::image::is_image_schema(p)).map(|(k, _)| k.clone()).collect()
            })
            .unwrap_or_default();
        if images.is_empty() {
            return schema;
        }
        if let Some(properties) = object.get_mut("properties").and_then(Value::as_object_mut) {
            images.iter().for_each(|name| drop(properties.remove(name)));
        }
        if let Some(required) = object.get_mut("required").and_then(Value::as_array_mut) {
            required.retain(|name| name.as_str().is_none_or(|name| !images.iter().any(|image| image == name)));
        }
        // The definition goes too unless something nested still refers to it: a property, or another definition
        // (a `Vec<Tile>` whose `Tile` holds an image).
        let refers = |value: &Value| value.to_string().contains("/ImageContent\"");
        let defined = object.get("$defs").and_then(Value::as_object);
        let still_used = object.iter().any(|(key, value)| key != "$defs" && refers(value))
            || defined.is_some_and(|defs| defs.iter().any(|(name, def)| name != "ImageContent" && refers(def)));
        if let (false, Some(defs)) = (still_used, object.get_mut("$defs").and_then(Value::as_object_mut)) {
            defs.remove("ImageContent");
            if defs.is_empty() {
                object.remove("$defs");
            }
        }
        schema
    }
}

impl CallRequest {
    /// A request from arguments as a transport receives them: `operation_id` and `task_id` are taken out of the
    /// object (they must be non-empty strings) and the rest are the tool's arguments.
    ///
    /// [`Conversation::request`](crate::Conversation::request) does the same to every request, so an in-process
    /// [`Conversation::call`](crate::Conversation::call) with `operation_id` in its arguments is keyed too.
    pub fn from_wire(tool: impl Into<String>, arguments: Value) -> Result<Self, ToolError> {
        let mut request = CallRequest::new(tool, arguments);
        request.take_wire_ids()?;
        Ok(request)
    }

    /// Moves `operation_id` and `task_id` from the arguments into the request (they must be non-empty strings of
    /// at most 256 characters). One given both ways must be the same in both (`INVALID_INPUT` otherwise).
    pub(crate) fn take_wire_ids(&mut self) -> Result<(), ToolError> {
        let Value::Object(map) = &mut self.arguments else { return Ok(()) };
        let operation = take_id(map, OPERATION_ID)?.map(OperationId::from);
        let task = take_id(map, TASK_ID)?.map(TaskId::from);
        merge(&mut self.operation, operation, OPERATION_ID)?;
        merge(&mut self.task, task, TASK_ID)
    }
}

fn merge<T: PartialEq>(into: &mut Option<T>, from_arguments: Option<T>, field: &str) -> Result<(), ToolError> {
    match (into.as_ref(), from_arguments) {
        (_, None) => Ok(()),
        (None, found) => {
            *into = found;
            Ok(())
        }
        (Some(given), Some(found)) if *given == found => Ok(()),
        (Some(_), Some(_)) => Err(ToolError::with_code(
            ErrorCode::InvalidInput,
            format!("argument `{field}` differs from the one the request was given"),
        )
        .with_detail("field", field)
        .with_detail("reason", "given twice, with different values")),
    }
}

fn take_id(map: &mut Map<String, Value>, field: &str) -> Result<Option<String>, ToolError> {
    match map.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) if !id.is_empty() && id.chars().count() <= 256 => Ok(Some(id)),
        Some(_) => Err(ToolError::with_code(
            ErrorCode::InvalidInput,
            format!("argument `{field}` is invalid: it must be a string of 1 to 256 characters"),
        )
        .with_detail("field", field)
        .with_detail("reason", "not a string of 1 to 256 characters")),
    }
}

#[cfg(test)]
mod tests {
    use schemars::JsonSchema;
    use serde::Serialize;

    use crate::{AgentTool, CallContext, ImageContent, NoArgs};

    #[derive(Serialize, JsonSchema)]
    struct Tile {
        thumb: ImageContent,
    }

    #[derive(Serialize, JsonSchema)]
    struct View {
        shot: ImageContent,
        tiles: Vec<Tile>,
    }

    #[derive(serde::Deserialize, JsonSchema)]
    struct Odd {
        #[serde(rename = "x y")]
        _spaced: u32,
        _plain: u32,
        #[serde(rename = "größe")]
        _accented: u32,
    }

    #[test]
    fn argument_names_claudes_api_refuses_are_told() {
        let odd = AgentTool::new("odd", "Odd names.", |_: CallContext<()>, _: Odd| async move { Ok(()) });
        let mut unusable = super::unusable_arguments(odd.info());
        unusable.sort();
        assert_eq!(unusable, ["größe", "x y"], "the reserved arguments and `_plain` are fine");
    }

    #[test]
    fn an_image_definition_still_referred_to_by_another_definition_stays() {
        let view = AgentTool::new("view", "Looks.", |_: CallContext<()>, _: NoArgs| async move {
            Ok(View { shot: ImageContent::png(""), tiles: Vec::new() })
        });
        let schema = view.info().client_output_schema();
        assert!(schema["properties"].get("shot").is_none(), "the top-level image travels as content: {schema}");
        assert!(schema["$defs"].get("ImageContent").is_some(), "`Tile` still refers to it: {schema}");
    }
}
