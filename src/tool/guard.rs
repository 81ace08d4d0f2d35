//! Guards for destructive tools: an explicit confirmation, and the version of the resource the agent last saw.
//!
//! ```
//! use bevy_agent_tools::{DestructiveGuard, ToolError};
//!
//! let guard = DestructiveGuard { confirm: true, expected_version: Some(3) };
//! assert!(guard.confirmed().is_ok());
//! let stale = guard.check_version("block (1, 2, 3)", 4).unwrap_err();
//! assert_eq!(stale.code, bevy_agent_tools::ErrorCode::VersionConflict);
//! ```

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, ToolError};

/// Flatten this into a destructive tool's arguments (`#[serde(flatten)] guard: DestructiveGuard`), then check it
/// in one line each: `args.guard.confirmed()?` before acting, `args.guard.check_version(..)?` inside the
/// `on_client` step that reads the current version.
///
/// Which guard to use: [`AgentTool::requires_confirmation`](crate::AgentTool::requires_confirmation) when every
/// call of the tool must be confirmed (the host refuses unconfirmed calls before the handler runs, and `confirm`
/// is added to the schema, even for [`NoArgs`](crate::NoArgs)); this struct when the handler decides (only some
/// targets are dangerous) or also wants `expected_version`. Its schema carries only its two fields' docs: this
/// comment never reaches a client, whether or not the arguments struct has a doc comment of its own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = no_type_docs)]
pub struct DestructiveGuard {
    /// Must be `true`: this action cannot be undone.
    #[serde(default)]
    pub confirm: bool,
    /// The version of the resource you last read. The action is refused if it changed since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_version: Option<u64>,
}

/// Drops the type's own title and description from its schema, so they never merge into the schema of the
/// arguments it is flattened into.
fn no_type_docs(schema: &mut schemars::Schema) {
    if let Some(object) = schema.as_object_mut() {
        object.remove("title");
        object.remove("description");
    }
}

impl DestructiveGuard {
    /// `CONFIRMATION_REQUIRED` unless `confirm` is true.
    pub fn confirmed(&self) -> Result<(), ToolError> {
        require_confirmation(self.confirm)
    }

    /// `VERSION_CONFLICT` if an expected version was given and differs from `current`.
    pub fn check_version(&self, resource: &str, current: u64) -> Result<(), ToolError> {
        check_version(resource, self.expected_version, current)
    }
}

/// `CONFIRMATION_REQUIRED` unless `confirm` is true.
pub fn require_confirmation(confirm: bool) -> Result<(), ToolError> {
    if confirm {
        return Ok(());
    }
    Err(ToolError::with_code(
        ErrorCode::ConfirmationRequired,
        "this action cannot be undone: call again with `confirm: true` if you mean it",
    ))
}

/// `VERSION_CONFLICT` (with the current version in the details) if `expected` is given and differs from
/// `current`.
pub fn check_version(resource: &str, expected: Option<u64>, current: u64) -> Result<(), ToolError> {
    match expected {
        Some(expected) if expected != current => Err(ToolError::with_code(
            ErrorCode::VersionConflict,
            format!("{resource} changed (version {expected} → {current}): read it again before retrying"),
        )
        .with_detail("resource", resource)
        .with_detail("expected_version", expected)
        .with_detail("current_version", current)),
        _ => Ok(()),
    }
}
