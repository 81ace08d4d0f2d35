//! Pictures in tool output: a field of this type becomes an image the client can show (over MCP, an image
//! content block next to the structured result).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An image in a tool's output, shaped like MCP image content: put it in a field of your output struct.
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
