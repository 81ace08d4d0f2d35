//! [`AgentSessionsPlugin`]: adds [`AgentSessions`], the chat messages, and the exit that stops every agent.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bevy::app::AppExit;
use bevy::prelude::*;

use super::messages::{apply_permission_answers, PermissionAnswer};
use super::permission::PermissionBook;
use super::record::Records;
use super::requests::{
    serve_session_requests, take_session_answers, write_session_answers, SessionAnswered, SessionRequest,
    SessionRequests,
};
use super::{AgentSessions, SessionHost};
use crate::agent::AgentHandle;
use crate::exit::AgentToolsExitSystems;
#[cfg(feature = "mcp")]
use crate::mcp::{McpServer, McpUnavailable};
use crate::plugin::{app_schedule, AgentToolsSystems};
use crate::runtime::AgentRuntime;

/// How long `AppExit` waits for agents to close their sessions and exit: the agent gets its stdin closed, one
/// second, `SIGTERM`, two seconds, then `SIGKILL`; this bounds the whole.
const EXIT_DEADLINE: Duration = Duration::from_secs(5);

/// Adds in-game agent sessions: the [`AgentSessions`] resource, the [`PermissionAnswer`] message (read in the
/// host's schedule, before [`AgentToolsSystems::Transitions`]), the [`SessionRequest`] and [`SessionAnswered`]
/// messages (the session API for systems; read and written in the host's schedule, around [`AgentToolsSystems::Pump`];
/// the chat messages, [`ChatDelta`](crate::ChatDelta) and the others, are written with the other conversation messages,
/// see [`AgentToolsSystems`](crate::AgentToolsSystems)), and, on `AppExit`, the end (or, for sessions with
/// `auto_end_on_disconnect(false)`, the disconnection) of every session, with its agent process stopped
/// ([`AgentToolsExitSystems::Sessions`]).
///
/// It needs the [`AgentToolsPlugin`](crate::AgentToolsPlugin), added before or after it: its resources and messages
/// are there once both are added (for the game's own plugins added later to use). An ACP agent reaches the
/// game's tools through the MCP server of `McpPlugin` (added before or after this plugin: a session created before
/// the app is finished waits for it, within its start timeout), and a session with one fails to start
/// (`AGENT_UNAVAILABLE`, saying why) when the game serves no MCP (the plugin not added, or `McpUnavailable`).
/// Sessions with an OpenAI-compatible backend call the tools in process and need no MCP server.
///
/// ```no_run
/// # use bevy::prelude::*;
/// # use bevy_agent_tools::session::AgentSessionsPlugin;
/// # fn add(app: &mut App) {
/// app.add_plugins(AgentSessionsPlugin::new().data_dir("data/agent-sessions"));
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct AgentSessionsPlugin {
    /// `None`: the default, in the user's own temporary directory.
    data_dir: Option<PathBuf>,
}

impl Default for AgentSessionsPlugin {
    fn default() -> Self {
        Self::new()
    }
}

impl AgentSessionsPlugin {
    /// Sessions keep their records and working directories in the user's own directory inside the system's
    /// temporary directory (`/tmp/bevy_agent_tools-1000/sessions` on Linux for user 1000); set
    /// [`data_dir`](Self::data_dir) to keep them with the game's data.
    pub fn new() -> Self {
        Self { data_dir: None }
    }

    /// Where sessions keep their records (`<dir>/<id>/session.json`, to resume them after a restart) and their
    /// empty working directories (`<dir>/<id>/workspace`); on Unix, each running copy of the game also keeps a
    /// locked file in `<dir>/.runs` while it runs, so another copy sharing `dir` knows which sessions are still
    /// its own. Each session's folder is the user's alone (mode 0700 on
    /// Unix), and a record or history this user does not own, or that others may write, is not read: keep `dir`
    /// on a file system with Unix permissions (not FAT, exFAT or a Windows drive under WSL). A record names the
    /// agent program its session starts: keep `dir` out of what players share or download (a shared save folder).
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }
}

impl Plugin for AgentSessionsPlugin {
    /// Sets the sessions up on the [`AgentToolsPlugin`](crate::AgentToolsPlugin)'s runtime: now, or when that
    /// plugin is added, if it was not yet.
    fn build(&self, app: &mut App) {
        let plugin = self.clone();
        crate::plugin::when_host_built(app, move |app| plugin.set_up(app));
    }

    /// Tells the sessions the game's MCP server, or why it has none: every plugin is built by now, `McpPlugin`
    /// whether it was added before or after this one.
    ///
    /// # Panics
    ///
    /// If the app has no `AgentToolsPlugin`.
    fn finish(&self, app: &mut App) {
        let world = app.world();
        let Some(sessions) = world.get_resource::<AgentSessions>() else {
            crate::plugin::host_missing("AgentSessionsPlugin");
        };
        let server = game_mcp(world).unwrap_or_else(|| Err("McpPlugin was not added to the app".into()));
        sessions.host().server.send_if_modified(|known| known.is_none() && known.replace(server).is_none());
    }
}

impl AgentSessionsPlugin {
    fn set_up(&self, app: &mut App) {
        let world = app.world();
        let agent = world.resource::<AgentHandle>().clone();
        let runtime = world.resource::<AgentRuntime>().handle().clone();
        let host = Arc::new(SessionHost {
            agent: agent.clone(),
            server: tokio::sync::watch::Sender::new(game_mcp(app.world())),
            records: Records::new(self.data_dir.clone(), runtime.clone()),
            permissions: PermissionBook::new(agent.clone(), runtime.clone()),
            runtime,
            in_use: Default::default(),
            exiting: Default::default(),
        });
        // What a game that did not exit cleanly left of sessions it did not keep.
        let records = host.records.clone();
        host.runtime.spawn_blocking(move || records.sweep_unkept());
        let schedule = app_schedule(app);
        app.insert_resource(AgentSessions::new(host))
            .init_resource::<SessionRequests>()
            .add_message::<PermissionAnswer>()
            .add_message::<SessionRequest>()
            .add_message::<SessionAnswered>()
            .add_systems(
                schedule,
                (
                    apply_permission_answers.before(AgentToolsSystems::Transitions),
                    (serve_session_requests, take_session_answers)
                        .chain()
                        .after(AgentToolsSystems::Transitions)
                        .before(AgentToolsSystems::Pump),
                    write_session_answers.after(AgentToolsSystems::Pump),
                ),
            );
        crate::exit::add_exit_systems(app, || disconnect_on_app_exit.in_set(AgentToolsExitSystems::Sessions));
    }
}

/// The game's MCP server as the app has it, or why it has none; `None` when `McpPlugin` has not been built (yet).
fn game_mcp(world: &World) -> Option<Result<super::McpServer, String>> {
    #[cfg(feature = "mcp")]
    match (world.get_resource::<McpServer>(), world.get_resource::<McpUnavailable>()) {
        (Some(server), _) => Some(Ok(server.clone())),
        (None, Some(unavailable)) => Some(Err(format!("its MCP server did not start ({})", unavailable.error))),
        (None, None) => None,
    }
    #[cfg(not(feature = "mcp"))]
    {
        let _ = world;
        Some(Err("the crate was built without its `mcp` feature".to_string()))
    }
}

fn disconnect_on_app_exit(mut exits: MessageReader<AppExit>, sessions: Res<AgentSessions>) {
    if exits.read().next().is_some() {
        sessions.disconnect_all(EXIT_DEADLINE);
    }
}
