//! The error every rejection and tool failure is reported with: a stable code, a message a person can act on,
//! and details (visit, revision, request, tool, and whatever else explains it).

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ids::{LocationRevision, RequestId, VisitId, WorldId};

/// The stable error codes. Each variant serializes as its `SCREAMING_SNAKE_CASE` name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum ErrorCode {
    /// No visit is open: the player is not in a world.
    NoWorld,
    /// Admission is closed: the visit is exiting, or the game is (a call still waiting for its tool with no world
    /// open, [`AgentToolsPlugin::tool_wait`](crate::AgentToolsPlugin::tool_wait)).
    WorldClosed,
    /// The call's visit ended before its main-thread step ran.
    VisitEnded,
    /// A `Location`-scoped call's location revision changed.
    LocationChanged,
    /// The session did not finish loading within the call's timeout.
    WorldLoadingTimeout,
    /// No tool with that name is registered.
    ToolNotFound,
    /// The arguments fail the schema or its bounds.
    InvalidInput,
    /// The same operation key arrived with different arguments.
    OperationConflict,
    /// `expected_version` differs from the resource's current version.
    VersionConflict,
    /// A destructive tool was called without the confirmation its definition demands.
    ConfirmationRequired,
    /// The agent cancelled the request (or stopped waiting for it).
    Cancelled,
    /// The deadline passed. Whether the effect happened is unknown: inspect state before retrying.
    Timeout,
    /// The conversation's in-flight limit is reached.
    Busy,
    /// The conversation is not known to the host.
    ConversationNotFound,
    /// A handler panicked or an invariant broke. The game keeps running.
    Internal,
    /// `send_text` while the in-game agent session's turn is running: nothing was sent. Also `resume_session` or
    /// `forget` of a session another copy of the game has open (a session is open in one copy at a time).
    SessionBusy,
    /// The in-game agent session ended: pending work was dropped, and nothing but `resume` works until it is resumed.
    SessionEnded,
    /// `resume_session` with an id that neither the game nor the agent backend knows.
    SessionNotFound,
    /// The agent backend could not be started or reached, or it stopped: the message says why (exit status, the
    /// tail of its stderr, a timeout).
    AgentUnavailable,
    /// A domain error defined by the tool itself (e.g. `BLOCK_NOT_FOUND`).
    #[serde(untagged)]
    Tool(String),
}

impl ErrorCode {
    /// The code named `code`: one of the host's own for its name (`"TIMEOUT"` is [`ErrorCode::Timeout`]), else a
    /// tool's own ([`ErrorCode::Tool`]).
    pub fn named(code: impl Into<String>) -> Self {
        let code = code.into();
        // The host's codes by their wire names; any other string is the untagged `Tool` variant.
        serde_json::from_value(Value::String(code.clone())).unwrap_or(Self::Tool(code))
    }

    /// The code as it appears on the wire.
    pub fn as_str(&self) -> &str {
        match self {
            Self::NoWorld => "NO_WORLD",
            Self::WorldClosed => "WORLD_CLOSED",
            Self::VisitEnded => "VISIT_ENDED",
            Self::LocationChanged => "LOCATION_CHANGED",
            Self::WorldLoadingTimeout => "WORLD_LOADING_TIMEOUT",
            Self::ToolNotFound => "TOOL_NOT_FOUND",
            Self::InvalidInput => "INVALID_INPUT",
            Self::OperationConflict => "OPERATION_CONFLICT",
            Self::VersionConflict => "VERSION_CONFLICT",
            Self::ConfirmationRequired => "CONFIRMATION_REQUIRED",
            Self::Cancelled => "CANCELLED",
            Self::Timeout => "TIMEOUT",
            Self::Busy => "BUSY",
            Self::ConversationNotFound => "CONVERSATION_NOT_FOUND",
            Self::Internal => "INTERNAL",
            Self::SessionBusy => "SESSION_BUSY",
            Self::SessionEnded => "SESSION_ENDED",
            Self::SessionNotFound => "SESSION_NOT_FOUND",
            Self::AgentUnavailable => "AGENT_UNAVAILABLE",
            Self::Tool(code) => code,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a person needs to act on an error: where it happened and what else explains it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetails {
    /// The visit the call was bound to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub visit: Option<VisitId>,
    /// The world of that visit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub world: Option<WorldId>,
    /// The location revision the call was admitted under (or observed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<LocationRevision>,
    /// The request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<RequestId>,
    /// The tool.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Anything else: the field that failed, the closest tool names, the current version... (Keys named as the
    /// fields above are not put here by [`ToolError::with_detail`], which would hide them.)
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A structured error: a stable [`ErrorCode`], a message, and [`ErrorDetails`].
///
/// Handlers return it for domain failures (`ToolError::new("BLOCK_NOT_FOUND", "...")`); the host returns it for
/// every rejection.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolError {
    /// The stable code.
    pub code: ErrorCode,
    /// What happened and what to do next, in words.
    pub message: String,
    /// Where it happened.
    pub details: Box<ErrorDetails>,
}

impl ToolError {
    /// A domain error with a tool-defined code (`"BLOCK_NOT_FOUND"`). A host's code named here (`"TIMEOUT"`) is
    /// that code ([`ErrorCode::named`]), equal to the one the host uses, and treated as the host's would be (a
    /// tool's own `TOOL_NOT_FOUND` reaches an MCP client as the JSON-RPC error an unknown tool is).
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::with_code(ErrorCode::named(code), message)
    }

    /// An error with one of the host's codes. An `ErrorCode::Tool` naming one of them is that code, as in
    /// [`new`](Self::new).
    pub fn with_code(code: ErrorCode, message: impl Into<String>) -> Self {
        let code = match code {
            ErrorCode::Tool(name) => ErrorCode::named(name),
            code => code,
        };
        Self { code, message: message.into(), details: Box::default() }
    }

    /// `INVALID_INPUT` naming the field and why, for bounds a schema cannot express.
    pub fn invalid_input(field: impl Into<String>, why: impl Into<String>) -> Self {
        let (field, why) = (field.into(), why.into());
        Self::with_code(ErrorCode::InvalidInput, format!("argument `{field}` is invalid: {why}"))
            .with_detail("field", field)
            .with_detail("reason", why)
    }

    /// `INTERNAL`, for a broken invariant.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::with_code(ErrorCode::Internal, message)
    }

    /// Adds one entry to the details. A key that names one of the call's coordinates (`visit`, `world`,
    /// `revision`, `request`, `tool`: a game's "tool" may be a pickaxe) is kept as `detail_<key>`, so it never
    /// replaces them.
    pub fn with_detail(mut self, key: impl Into<String>, value: impl Serialize) -> Self {
        let value = serde_json::to_value(value).unwrap_or(Value::Null);
        self.details.extra.insert(detail_key(key.into()), value);
        self
    }

    /// Fills in the call's coordinates where the error does not carry its own.
    pub(crate) fn locate(mut self, at: &crate::call::CallCoordinates) -> Self {
        let d = &mut self.details;
        d.visit.get_or_insert(at.visit.visit);
        d.world.get_or_insert_with(|| at.visit.world.clone());
        d.revision.get_or_insert(at.visit.location.revision);
        d.request.get_or_insert(at.request);
        d.tool.get_or_insert_with(|| at.tool.clone());
        self
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ToolError {}

/// The coordinates [`ErrorDetails`] names itself, beside its `extra` entries.
const COORDINATES: [&str; 5] = ["visit", "world", "revision", "request", "tool"];

/// Where a detail named `key` is kept in [`ErrorDetails::extra`]: a coordinate's name is prefixed `detail_`.
pub(crate) fn detail_key(key: String) -> String {
    if COORDINATES.contains(&key.as_str()) {
        format!("detail_{key}")
    } else {
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_named_as_a_coordinate_never_replaces_it() {
        let mut error = ToolError::new("BROKEN", "the pickaxe broke").with_detail("tool", "pickaxe");
        error.details.tool = Some("mine".into());
        let sent = serde_json::to_value(&error).expect("serializes");
        assert_eq!(sent["details"]["tool"], "mine", "the call's tool, as the host said");
        assert_eq!(sent["details"]["detail_tool"], "pickaxe", "the game's detail, kept");
        let read: ToolError = serde_json::from_value(sent).expect("reads back");
        assert_eq!(read, error);
    }

    #[test]
    fn a_tool_code_named_as_one_of_the_hosts_is_that_code_however_it_is_made() {
        let made = ToolError::with_code(ErrorCode::Tool("TOOL_NOT_FOUND".into()), "gone");
        assert_eq!(made.code, ErrorCode::ToolNotFound);
        assert_eq!(ToolError::with_code(ErrorCode::Tool("MINE".into()), "m").code, ErrorCode::Tool("MINE".into()));
    }

    #[test]
    fn a_code_named_as_one_of_the_hosts_is_that_code_and_any_other_is_the_tools() {
        assert_eq!(ToolError::new("TIMEOUT", "slow").code, ErrorCode::Timeout);
        assert_eq!(ErrorCode::named("NO_WORLD"), ErrorCode::NoWorld);
        assert_eq!(ErrorCode::named("BLOCK_NOT_FOUND"), ErrorCode::Tool("BLOCK_NOT_FOUND".into()));
        // Every host code round-trips through its name.
        for code in [ErrorCode::VersionConflict, ErrorCode::AgentUnavailable, ErrorCode::Internal] {
            assert_eq!(ErrorCode::named(code.as_str()), code);
        }
    }
}
