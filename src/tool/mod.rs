//! Tool definitions: name, description, typed arguments with a JSON schema, typed output, scope, annotations
//! and timeout, and the registry the host looks them up in.

mod flat_root;
mod guard;
mod image;
pub(crate) mod input;
mod registry;
mod reserved;
mod shapes;

use std::any::TypeId;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::call::{CallContext, CallCore};
use crate::error::ToolError;

#[cfg(any(feature = "mcp", feature = "openai"))]
pub(crate) use flat_root::flat_root;
pub use guard::{check_version, require_confirmation, DestructiveGuard};
pub use image::ImageContent;
#[cfg(feature = "mcp")]
pub(crate) use image::{declares_images, take_images};
pub(crate) use registry::{shown_name, ToolRegistry};
pub(crate) use reserved::{check_arguments, check_name};
#[cfg(feature = "mcp")]
pub(crate) use reserved::{BEGIN_CONVERSATION, CONVERSATION};
pub use reserved::{OPERATION_ID, TASK_ID};

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// How long a call may live when neither the tool nor the call says.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a call survives dimension travel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolScope {
    /// The call survives dimension travel inside its visit (not world exit).
    #[default]
    World,
    /// The call needs the exact location revision it was admitted under: travel ends it with
    /// `LOCATION_CHANGED`, and its pending `on_client` closures never run.
    Location,
}

/// Hints for clients (MCP tool annotations). They describe the tool; they do not enforce anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolAnnotations {
    /// The tool does not change the game.
    pub read_only: bool,
    /// The tool may destroy or overwrite something (meaningful when not read-only).
    pub destructive: bool,
    /// Calling it again with the same arguments has no further effect.
    pub idempotent: bool,
}

impl Default for ToolAnnotations {
    /// MCP's defaults: not read-only, destructive, not idempotent.
    fn default() -> Self {
        Self { read_only: false, destructive: true, idempotent: false }
    }
}

/// What a client can know about a tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolInfo {
    /// Unique name.
    pub name: String,
    /// What it does, for a model to read.
    pub description: String,
    /// JSON schema of the arguments (an object).
    pub input_schema: Value,
    /// JSON schema of the output.
    pub output_schema: Value,
    /// World or Location.
    pub scope: ToolScope,
    /// Read-only, destructive, idempotent.
    pub annotations: ToolAnnotations,
    /// The tool's own timeout; the host default applies when `None`.
    pub timeout: Option<Duration>,
    /// Calls must carry `confirm: true`, or they are refused with `CONFIRMATION_REQUIRED` before anything runs.
    pub requires_confirmation: bool,
}

/// A started handler: arguments already parsed, waiting for its context.
pub(crate) type PreparedCall = Box<dyn FnOnce(CallCore) -> BoxFuture<Result<Value, ToolError>> + Send>;

/// The session-type-erased face of a tool, as the registry holds it.
pub(crate) trait ErasedTool: Send + Sync + 'static {
    fn info(&self) -> &ToolInfo;
    fn session_type(&self) -> (TypeId, &'static str);
    /// A mistake the tool's builder found, or an input schema that cannot be compiled (the published schema is
    /// final by then), which registering it reports.
    fn mistake(&self) -> Option<String>;
    /// Parses the arguments (rejections happen here, before anything runs).
    fn prepare(&self, args: Value) -> Result<PreparedCall, ToolError>;
}

type Handler<S, A> = dyn Fn(CallContext<S>, A) -> BoxFuture<Result<Value, ToolError>> + Send + Sync;

/// A tool for sessions of type `S`: build it with [`AgentTool::new`], register it with
/// [`AgentToolsAppExt::add_agent_tool`](crate::AgentToolsAppExt::add_agent_tool) or
/// [`AgentToolsPlugin::with_tool`](crate::AgentToolsPlugin::with_tool).
///
/// ```
/// use bevy_agent_tools::prelude::*;
/// use schemars::JsonSchema;
/// use serde::{Deserialize, Serialize};
///
/// struct Session { score: u32 }
///
/// #[derive(Deserialize, JsonSchema)]
/// struct AddArgs { points: u32 }
///
/// #[derive(Serialize, JsonSchema)]
/// struct Score { score: u32 }
///
/// let tool = AgentTool::new("add_points", "Adds points to the score.", |ctx: CallContext<Session>, args: AddArgs| async move {
///     let score = ctx.on_client(move |_world, session| { session.score += args.points; session.score }).await?;
///     Ok(Score { score })
/// })
/// .idempotent(false)
/// .destructive(false);
/// assert_eq!(tool.info().name, "add_points");
/// ```
pub struct AgentTool<S> {
    info: ToolInfo,
    /// The published input schema, compiled when the tool is registered (builder methods may still change it until
    /// then), or why it cannot be.
    validator: OnceLock<Result<(jsonschema::Validator, shapes::Shapes), String>>,
    /// Whether the handler's own arguments have a `confirm` (a flattened [`DestructiveGuard`]): if not, the host
    /// takes the `confirm` that [`requires_confirmation`](Self::requires_confirmation) adds out of the arguments
    /// before they are parsed, so arguments that refuse unknown fields still parse.
    handler_confirms: bool,
    /// A mistake a builder method found (an enum for an argument the tool does not have): registering the tool
    /// fails with it, as for the mistakes the host checks.
    mistake: Option<String>,
    start: Arc<dyn Fn(Value) -> Result<PreparedCall, ToolError> + Send + Sync>,
    _session: PhantomData<fn(S)>,
}

impl<S: Send + Sync + 'static> AgentTool<S> {
    /// A tool named `name`, described by `description`, handled by `handler`.
    ///
    /// The argument schema is derived from `A`, the output schema from `O`. Defaults: `World` scope, MCP's
    /// default annotations (not read-only, destructive, not idempotent), the host's default timeout.
    ///
    /// The handler's future runs on the plugin's worker threads, beside the MCP server, and must not block: a
    /// blocking read or sleep holds a worker, and its call cannot time out meanwhile. Await `tokio::fs`, or
    /// [`CallContext::runtime`]'s `spawn_blocking`; reach game state with [`CallContext::on_client`].
    pub fn new<A, O, F, Fut>(name: impl Into<String>, description: impl Into<String>, handler: F) -> Self
    where
        A: DeserializeOwned + JsonSchema + Send + 'static,
        O: Serialize + JsonSchema + 'static,
        F: Fn(CallContext<S>, A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, ToolError>> + Send + 'static,
    {
        let name = name.into();
        let named = name.clone();
        // The fields already warned of: a tool whose output says "none" with an infinity would warn at every call.
        let warned: Arc<crate::sync::Mutex<std::collections::HashSet<String>>> = Arc::default();
        let handler: Arc<Handler<S, A>> = Arc::new(move |ctx, args| {
            let run = handler(ctx, args);
            let (tool, warned) = (named.clone(), warned.clone());
            Box::pin(async move {
                let output = run.await?;
                if let Some(field) = crate::finite::non_finite(&output, None) {
                    if first_of_its_kind(&warned, &field) {
                        tracing::warn!(
                            tool,
                            field,
                            "the tool's output has a float that is NaN or infinite, which JSON sends as null (said \
                             once per field)"
                        );
                    }
                }
                serde_json::to_value(output)
                    .map_err(|error| ToolError::internal(format!("the tool's output is not valid JSON: {error}")))
            })
        });
        let tool_name = name.clone();
        let start = Arc::new(move |args: Value| -> Result<PreparedCall, ToolError> {
            let args: A = input::deserialize(&tool_name, args)?;
            let handler = handler.clone();
            Ok(Box::new(move |core: CallCore| handler(CallContext::new(core), args)))
        });
        Self {
            info: ToolInfo {
                name,
                description: description.into(),
                input_schema: input::input_schema_of::<A>(),
                output_schema: input::output_schema_of::<O>(),
                scope: ToolScope::World,
                annotations: ToolAnnotations::default(),
                timeout: None,
                requires_confirmation: false,
            },
            validator: OnceLock::new(),
            handler_confirms: false,
            mistake: None,
            start,
            _session: PhantomData,
        }
    }

    /// Sets the scope (default `World`).
    pub fn scope(mut self, scope: ToolScope) -> Self {
        self.info.scope = scope;
        self
    }

    /// Marks the tool read-only: neither destructive nor in need of replay keys, and idempotent (reading twice
    /// changes nothing; an [`idempotent(false)`](Self::idempotent) after this says otherwise).
    pub fn read_only(mut self) -> Self {
        self.info.annotations = ToolAnnotations { read_only: true, destructive: false, idempotent: true };
        self
    }

    /// Says whether the tool may destroy or overwrite something. A tool that may is not read-only: this undoes
    /// an earlier [`read_only`](Self::read_only) (its calls take replay keys again, and it is not said idempotent
    /// unless [`idempotent`](Self::idempotent) says so after this).
    ///
    /// ```
    /// # use bevy_agent_tools::prelude::*;
    /// let clear = AgentTool::new("clear", "Clears the board.", |_: CallContext<()>, _: NoArgs| async move { Ok(()) })
    ///     .read_only()
    ///     .destructive(true);
    /// assert!(!clear.info().annotations.read_only && clear.info().annotations.destructive);
    /// assert!(!clear.info().annotations.idempotent, "what read_only implied is undone");
    /// assert!(clear.info().client_input_schema()["properties"].get("operation_id").is_some(), "retries are keyed");
    /// ```
    pub fn destructive(mut self, destructive: bool) -> Self {
        if destructive && self.info.annotations.read_only {
            self.info.annotations.read_only = false;
            self.info.annotations.idempotent = false;
        }
        self.info.annotations.destructive = destructive;
        self
    }

    /// Says whether repeating a call with the same arguments has no further effect.
    pub fn idempotent(mut self, idempotent: bool) -> Self {
        self.info.annotations.idempotent = idempotent;
        self
    }

    /// Sets the tool's timeout (covers waiting for a loading world, the handler, and its main-thread steps).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.info.timeout = Some(timeout);
        self
    }

    /// Refuses calls without `confirm: true` (`CONFIRMATION_REQUIRED`) before anything runs, and adds `confirm`
    /// to the input schema clients see (also for a tool whose arguments are [`NoArgs`]). For destructive tools.
    ///
    /// The host checks `confirm`; the handler need not have it. If the arguments declare a `confirm` of their own
    /// (a flattened [`DestructiveGuard`]), they get it like any other argument; if not, the host takes it out
    /// before they are parsed, so arguments with `#[serde(deny_unknown_fields)]` or an enum of structs work too.
    /// Use this when the whole tool is dangerous; flatten a [`DestructiveGuard`] into the arguments instead when
    /// the handler decides (for example only some targets need confirming) or also needs `expected_version`.
    ///
    /// ```
    /// # use bevy_agent_tools::prelude::*;
    /// let reset = AgentTool::new("reset", "Resets the level.", |_: CallContext<()>, _: NoArgs| async move { Ok(()) })
    ///     .requires_confirmation();
    /// assert_eq!(reset.info().input_schema["properties"]["confirm"]["type"], "boolean");
    /// ```
    pub fn requires_confirmation(mut self) -> Self {
        if !self.info.requires_confirmation {
            // Before `confirm` is added below: whether the handler's own arguments have it.
            self.handler_confirms = reserved::declares(&self.info.input_schema, "confirm");
        }
        self.info.requires_confirmation = true;
        if let Some(schema) = self.info.input_schema.as_object_mut() {
            schema.entry("type").or_insert_with(|| Value::String("object".into()));
            let properties = schema.entry("properties").or_insert_with(|| Value::Object(Default::default()));
            if let Some(properties) = properties.as_object_mut() {
                properties.entry("confirm").or_insert(serde_json::json!({
                    "type": "boolean",
                    "description": "Must be true: this action cannot be undone."
                }));
            }
        }
        self
    }

    /// Lists the values argument `field` accepts, as a JSON schema `enum` a model can read: for choices known only
    /// at run time (a palette loaded from a file), where the argument's Rust type is a plain `String`. Calls are
    /// checked against it like the rest of the schema: a value not in the list is refused with `INVALID_INPUT`
    /// (`details.field`) before the handler runs.
    ///
    /// `field` is the argument's name as the schema has it (after serde's renames), a field of the arguments' own
    /// struct (flattened structs' fields included): fields inside the variants of an enum, or behind a newtype, are
    /// not reached (give those a Rust enum type instead). Naming an argument the tool does not have there is a
    /// mistake in the game's set-up: registering the tool fails
    /// ([`AgentToolsPlugin::with_tool`](crate::AgentToolsPlugin::with_tool) panics at start-up).
    ///
    /// ```
    /// # use bevy_agent_tools::prelude::*;
    /// # #[derive(serde::Deserialize, schemars::JsonSchema)] struct Paint { colour: String }
    /// let tool = AgentTool::new("paint", "Paints the wall.", |_: CallContext<()>, _: Paint| async move { Ok(()) })
    ///     .argument_enum("colour", ["red", "green"]);
    /// assert_eq!(tool.info().input_schema["properties"]["colour"]["enum"], serde_json::json!(["red", "green"]));
    /// ```
    pub fn argument_enum(mut self, field: &str, values: impl IntoIterator<Item = impl Into<String>>) -> Self {
        let mut values: Vec<Value> = values.into_iter().map(|value| Value::String(value.into())).collect();
        if let Some(property) = self.info.input_schema.get_mut("properties").and_then(|p| p.get_mut(field)) {
            if let Some(property) = property.as_object_mut() {
                // An optional argument (`Option<String>`: type `["string", "null"]`) may still be left null.
                let nullable = match property.get("type") {
                    Some(Value::Array(types)) => types.iter().any(|kind| kind == "null"),
                    _ => false,
                };
                if nullable {
                    values.push(Value::Null);
                }
                property.insert("enum".into(), Value::Array(values));
                return self;
            }
        }
        self.mistake.get_or_insert_with(|| {
            format!(
                "agent tool `{}`: argument_enum names `{field}`, an argument the tool does not have among its \
                 arguments' own fields (those inside an enum's variants are not reached)",
                self.info.name
            )
        });
        self
    }

    /// The tool's description for clients.
    pub fn info(&self) -> &ToolInfo {
        &self.info
    }
}

impl<S> std::fmt::Debug for AgentTool<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTool").field("info", &self.info).finish_non_exhaustive()
    }
}

impl<S: Send + Sync + 'static> ErasedTool for AgentTool<S> {
    fn info(&self) -> &ToolInfo {
        &self.info
    }

    fn session_type(&self) -> (TypeId, &'static str) {
        (TypeId::of::<S>(), std::any::type_name::<S>())
    }

    fn mistake(&self) -> Option<String> {
        self.mistake.clone().or_else(|| self.checks().err())
    }

    fn prepare(&self, args: Value) -> Result<PreparedCall, ToolError> {
        let mut args = input::object_arguments(&self.info.name, args)?;
        if self.info.requires_confirmation && !self.handler_confirms {
            input::take_confirm(&self.info.name, &mut args)?;
        }
        // (Registration refused a schema that cannot be compiled: the error is for a tool called without it.)
        let (validator, shapes) = self.checks().map_err(ToolError::internal)?;
        input::validate(&self.info.name, validator, &args)?;
        shapes.check(&self.info.name, &args)?;
        // The game's own parsing code runs here (`deserialize_with`, `try_from`, defaults): a panic in it is the
        // call's `INTERNAL`, as a handler's is.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (self.start)(args))).unwrap_or_else(|panic| {
            Err(ToolError::internal(format!(
                "reading the arguments of `{}` panicked: {}",
                self.info.name,
                crate::panic::panic_message(&*panic)
            )))
        })
    }
}

impl<S> AgentTool<S> {
    /// The published input schema, compiled (at registration, or the first call): what every call's arguments are
    /// checked against, or why it cannot be compiled.
    fn checks(&self) -> Result<&(jsonschema::Validator, shapes::Shapes), String> {
        let compiled = self.validator.get_or_init(|| {
            let schema = self.info.client_input_schema();
            let validator = input::compile_schema(&self.info.name, &schema)?;
            Ok((validator, shapes::Shapes::of(&schema)))
        });
        compiled.as_ref().map_err(String::clone)
    }
}

/// Whether `field` (a path in a tool's output: `enemies[3].distance`) is the first of its kind `warned` has seen:
/// the same field at another index is not (`enemies[].distance`). At most [`FIELDS_WARNED`] kinds are kept, then
/// none is the first any more.
fn first_of_its_kind(warned: &crate::sync::Mutex<std::collections::HashSet<String>>, field: &str) -> bool {
    let mut kind = String::with_capacity(field.len());
    let mut in_index = false;
    for c in field.chars() {
        match c {
            '[' | ']' => {
                in_index = c == '[';
                kind.push(c);
            }
            _ if in_index => {}
            _ => kind.push(c),
        }
    }
    let mut warned = warned.lock();
    warned.len() < FIELDS_WARNED && warned.insert(kind)
}

/// How many kinds of non-finite output fields one tool warns of at most (a map's keys are fields too).
const FIELDS_WARNED: usize = 64;

/// Arguments for tools that take none.
#[derive(Clone, Copy, Debug, Default, Deserialize, JsonSchema)]
pub struct NoArgs {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_finite_output_field_is_warned_of_once_whatever_its_index_and_the_kinds_kept_are_bounded() {
        let warned = crate::sync::Mutex::default();
        assert!(first_of_its_kind(&warned, "enemies[3].distance"));
        assert!(!first_of_its_kind(&warned, "enemies[12].distance"), "the same field at another index");
        assert!(first_of_its_kind(&warned, "enemies[3].bearing"));
        (0..2 * FIELDS_WARNED).for_each(|key| {
            first_of_its_kind(&warned, &format!("scores.player{key}"));
        });
        assert_eq!(warned.lock().len(), FIELDS_WARNED);
    }
}
