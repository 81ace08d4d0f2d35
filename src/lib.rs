#![doc = include_str!("../README.md")]
#![warn(missing_docs, missing_debug_implementations)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod agent;
mod call;
mod completion;
mod conversation;
mod deadline;
mod error;
mod exit;
mod file_lock;
mod finite;
mod host;
mod ids;
mod lifecycle;
#[cfg(feature = "mcp")]
pub mod mcp;
mod panic;
pub mod persist;
mod plain_file;
mod plugin;
#[cfg(any(feature = "mcp", feature = "openai"))]
mod private;
#[cfg(all(test, feature = "shuttle"))]
mod races;
mod replay;
mod runner;
mod runtime;
#[cfg(any(feature = "acp", feature = "openai"))]
pub mod session;
mod signal;
mod sync;
pub mod testing;
mod tool;
mod visit;

pub use agent::{AgentHandle, Call, Conversation, Resumed};
pub use call::{
    CallContext, CallOutcome, CallOutput, CallRequest, Ended, InputContext, Progress, ProgressSink, PumpStats,
};
pub use completion::{Completer, Completion, CompletionError, CompletionResult};
pub use conversation::{
    ActiveCall, CallFinished, CallProgress, CallStarted, ChatDelta, ChatError, ChatErrorScope, ChatMessage,
    ConversationEvent, ConversationSnapshot, ConversationStatus, ConversationStatusChanged, PendingCall,
    PermissionDetail, PermissionOutcome, PermissionRequested, PermissionSettled, Reported, StatusSource, Subscription,
    PERMISSION_DETAILS_LIMIT, PERMISSION_INPUT_LIMIT,
};
pub use error::{ErrorCode, ErrorDetails, ToolError};
pub use exit::{run_pending_exit, AgentToolsExitSystems};
pub use host::{VisitPhase, VisitStatus};
pub use ids::{ConversationId, DimensionId, LocationRevision, OperationId, RequestId, TaskId, VisitId, WorldId};
pub use lifecycle::{Location, OpenError, Opened, VisitInfo, WorldLifecycle};
pub use persist::{Loaded, StoreError, WorldStore, WorldStorePlugin};
pub use plugin::{AgentToolsAppExt, AgentToolsPlugin, AgentToolsSystems, StepPoints};
pub use replay::ReplayRetention;
pub use runner::AgentToolsRunnerPlugin;
pub use runtime::{AgentRuntime, WorkerPriority};
pub use tool::{
    check_version, require_confirmation, AgentTool, DestructiveGuard, ImageContent, NoArgs, ToolAnnotations, ToolInfo,
    ToolScope, DEFAULT_TOOL_TIMEOUT, OPERATION_ID, TASK_ID,
};
pub use visit::{
    EnterWorld, ExitWorld, TravelTo, VisitClosed, VisitClosing, VisitLoadFailed, VisitOpened, VisitRelocated,
    VisitSaved, VisitSession, VisitSessionExt, WorldBinding, WorldOpenFailed,
};

/// Internals exposed for the crate's benchmarks only; not part of the API.
#[doc(hidden)]
pub mod internals {
    pub use crate::replay::{canonical_arguments, Begin, ReplayKey, ReplayTable};
}

/// Everything you need to get started: the trait to implement, the plugin, tools, contexts and errors, and the
/// messages a game's systems read (a visit's, a call's, a conversation's).
pub mod prelude {
    pub use crate::{
        AgentHandle, AgentTool, AgentToolsAppExt, AgentToolsPlugin, AgentToolsRunnerPlugin, AgentToolsSystems,
        CallContext, CallFinished, CallOutcome, CallOutput, Completion, ConversationEvent, ConversationId,
        ConversationStatus, ConversationStatusChanged, DimensionId, EnterWorld, ErrorCode, ExitWorld, Location, NoArgs,
        OpenError, Opened, ToolError, ToolScope, TravelTo, VisitClosed, VisitInfo, VisitLoadFailed, VisitOpened,
        VisitRelocated, VisitSaved, VisitSession, VisitSessionExt, WorldBinding, WorldId, WorldLifecycle,
        WorldOpenFailed,
    };
}
