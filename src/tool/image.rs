//! Pictures in tool output: a field of this type becomes an image the client can show. Over MCP the picture
//! travels once, as an image content block beside the JSON text of the rest, so no model ever reads base64 as
//! text. A result with a picture has no `structuredContent`, and a tool whose output declares one publishes no
//! output schema: Codex and Claude Code give their model only the `structuredContent` of a result that has one,
//! so its pictures would never reach the model.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An image in a tool's output, shaped like MCP image content: put it in a top-level field of your output struct
/// (over MCP it becomes image content, and the field is not part of the structured result).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ImageContent {
    /// Always `"image"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The MIME type, e.g. `image/png`.
    #[serde(rename = "mimeType")]
    pub mime_type: String,
    /// The image bytes, base64.
    pub data: String,
}

impl ImageContent {
    /// A PNG image from its base64 bytes.
    pub fn png(data_base64: impl Into<String>) -> Self {
        Self { kind: "image".into(), mime_type: "image/png".into(), data: data_base64.into() }
    }

    /// Recognizes a JSON value shaped like an image.
    pub fn from_value(value: &serde_json::Value) -> Option<Self> {
        let object = value.as_object()?;
        (object.get("type")?.as_str()? == "image").then(|| serde_json::from_value(value.clone()).ok())?
    }
}

/// Whether an output schema declares a top-level [`ImageContent`] field (see [`is_image_schema`]).
#[cfg(feature = "mcp")]
pub(crate) fn declares_images(schema: &serde_json::Value) -> bool {
    let properties = schema.get("properties").and_then(serde_json::Value::as_object);
    properties.is_some_and(|properties| properties.values().any(is_image_schema))
}

/// Whether a property of an output schema is an [`ImageContent`] (directly, or as an `Option`).
pub(crate) fn is_image_schema(property: &serde_json::Value) -> bool {
    let refers = |schema: &serde_json::Value| {
        schema.get("$ref").and_then(serde_json::Value::as_str).is_some_and(|r| r.ends_with("/ImageContent"))
    };
    refers(property)
        || ["anyOf", "oneOf", "allOf"].iter().any(|key| {
            property.get(*key).and_then(serde_json::Value::as_array).is_some_and(|options| options.iter().any(refers))
        })
}

/// Takes the image fields out of a tool's output object, as its output schema (`schema`) says them: what is left
/// is the structured result, as the client's output schema describes it
/// ([`client_output_schema`](super::ToolInfo::client_output_schema)); the images go to image content. A field the
/// schema says is an image goes whatever its value (an `Option` left `None` too); one it declares otherwise
/// stays, even shaped like an image; one it does not declare (an output of free-form JSON) goes if it is one.
#[cfg(feature = "mcp")]
pub(crate) fn take_images(
    object: &mut serde_json::Map<String, serde_json::Value>,
    schema: &serde_json::Value,
) -> Vec<ImageContent> {
    let declared = schema.get("properties").and_then(serde_json::Value::as_object);
    let taken = |name: &str, value: &serde_json::Value| match declared.and_then(|declared| declared.get(name)) {
        Some(property) => is_image_schema(property),
        None => ImageContent::from_value(value).is_some(),
    };
    let names: Vec<String> = object.iter().filter(|(name, value)| taken(name, value)).map(|(k, _)| k.clone()).collect();
    names.iter().filter_map(|name| object.remove(name)).filter_map(|value| ImageContent::from_value(&value)).collect()
}
