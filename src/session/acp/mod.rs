//! The ACP backend: the game is an Agent Client Protocol client, the agent a child process speaking JSON-RPC on
//! its standard input and output (the official `agent-client-protocol` crate, which owns the process: its own
//! process group, stdin closed then `SIGTERM` then `SIGKILL` on shutdown, a bounded stderr tail on failure).
//!
//! One connection per session: `initialize` (no `fs`, no `terminal` capability), then `session/new` with the
//! game's MCP server as an `http` entry carrying the session's bearer credential (or `session/resume`,
//! `session/load` to re-attach), then `session/prompt` per turn, `session/cancel` to cancel, `session/close` (where
//! the agent offers it) when the session ends. `session/update` notifications become chat deltas, message
//! boundaries and usage; `session/request_permission` goes to the session's policy.

mod auth;
mod codex;
mod connection;
mod ending;
mod quirks;
mod updates;

use std::sync::Arc;

use agent_client_protocol::{AcpAgent, AcpAgentConfig};
use tokio::sync::mpsc::UnboundedSender;

use super::backend::{BoxFuture, CloseWithin, EventSink, Link, PromptBlock, Setup};
use super::{AcpAgentCommand, Backend, Connected};
use crate::error::{ErrorCode, ToolError};

/// Starts ACP agents from a command line.
pub(crate) struct AcpBackend {
    command: AcpAgentCommand,
    runtime: tokio::runtime::Handle,
}

impl AcpBackend {
    pub(crate) fn new(command: AcpAgentCommand, runtime: tokio::runtime::Handle) -> Self {
        Self { command, runtime }
    }
}

/// The game's environment variables that hold its MCP token (a game that reads it from, say, `GAME_MCP_TOKEN`),
/// emptied for the agent process, which inherits the game's environment: the agent reaches the game with its
/// session's own credential, revoked when the session ends, never with the token that opens every conversation.
fn without_game_token(game_token: &str) -> Vec<(String, String)> {
    std::env::vars_os()
        .filter(|(_, value)| !game_token.is_empty() && value.to_str().is_some_and(|value| value.contains(game_token)))
        .filter_map(|(name, _)| name.into_string().ok())
        .map(|name| (name, String::new()))
        .collect()
}

impl Backend for AcpBackend {
    fn connect(&self, setup: Setup, sink: EventSink) -> BoxFuture<Result<Connected, ToolError>> {
        // Without the game's MCP server the agent would have no tools: refuse before starting its process.
        let game_token = match setup.require_mcp() {
            Ok(mcp) => mcp.game_token.clone(),
            Err(error) => return Box::pin(std::future::ready(Err(error))),
        };
        let config = AcpAgentConfig::new(spawned_program(&self.command.program))
            .args(self.command.args.clone())
            .envs(without_game_token(&game_token))
            .envs(quirks::environment())
            .envs(self.command.env.iter().cloned());
        let agent = AcpAgent::new(config);
        let described = self.command.to_string();
        let program = self.command.program.clone();
        let auth_method = self.command.auth_method.clone();
        let runtime = self.runtime.clone();
        Box::pin(async move {
            let start = setup.timeouts.start;
            let (commands, running) = connection::spawn(agent, setup, auth_method, sink, &runtime);
            let connection::Running { ready, step, task, exit } = running;
            let mut starting = Starting { task: task.abort_handle(), done: false };
            let ready = within_start(start, &step, ready).await;
            let failure = match ready {
                Some(Ok(Ok(opened))) => {
                    starting.done = true;
                    let link = AcpLink { commands, backend_session: opened.session, task: Arc::new(task), exit };
                    return Ok((Arc::new(link) as Arc<dyn Link>, opened.attached, opened.system_prompt_sent));
                }
                Some(Ok(Err(error))) => error,
                Some(Err(_dropped)) => {
                    ToolError::with_code(ErrorCode::AgentUnavailable, "the agent stopped while starting")
                }
                None => {
                    task.abort();
                    let waited_for = step.borrow().waiting;
                    return Err(ToolError::with_code(
                        ErrorCode::AgentUnavailable,
                        format!("the agent `{described}` did not start within {start:?} ({waited_for})"),
                    )
                    .with_detail("agent", &described));
                }
            };
            if failure.code != ErrorCode::AgentUnavailable {
                task.abort();
                return Err(failure);
            }
            // The connection's own end says more (the exit status and the stderr tail): wait for it briefly.
            let exited = tokio::time::timeout(std::time::Duration::from_secs(3), connection::wait_exit(exit)).await;
            task.abort();
            let mut why = match exited {
                Ok(Some(exit)) => format!("{}; {exit}", failure.message),
                _ => failure.message.clone(),
            };
            if find_program(&program, &path_extensions()).is_none() {
                why = format!("no program `{program}` was found (neither a file at that path nor on PATH); {why}");
            }
            // Its details stay (a sign-in's methods, the URL).
            let message = format!("the agent `{described}` could not start: {why}");
            Err(ToolError { message, ..failure }.with_detail("agent", &described))
        })
    }
}

/// The extensions a program's name may leave out: on Windows, `PATHEXT`'s (after none); elsewhere, none.
fn path_extensions() -> Vec<String> {
    if cfg!(windows) {
        std::iter::once(String::new()).chain(windows_extensions()).collect()
    } else {
        vec![String::new()]
    }
}

/// `PATHEXT`'s extensions, the ones Windows starts a program by.
fn windows_extensions() -> Vec<String> {
    let listed = std::env::var("PATHEXT").unwrap_or_else(|_| ".COM;.EXE;.BAT;.CMD".into());
    listed.split(';').filter(|extension| !extension.is_empty()).map(str::to_string).collect()
}

/// The file `program` names: a path, or found in `PATH`'s directories ([`find_in`]).
fn find_program(program: &str, extensions: &[String]) -> Option<std::path::PathBuf> {
    let path = std::path::Path::new(program);
    if path.components().count() > 1 {
        return path.is_file().then(|| path.to_path_buf());
    }
    let dirs: Vec<std::path::PathBuf> =
        std::env::var_os("PATH").map(|paths| std::env::split_paths(&paths).collect()).unwrap_or_default();
    find_in(program, &dirs, extensions)
}

/// The first of `dirs` holding a file named `program` with one of `extensions` added (tried in order).
fn find_in(program: &str, dirs: &[std::path::PathBuf], extensions: &[String]) -> Option<std::path::PathBuf> {
    dirs.iter()
        .flat_map(|dir| extensions.iter().map(move |extension| dir.join(format!("{program}{extension}"))))
        .find(|file| file.is_file())
}

/// What to start for `program`. On Windows, a process is started from an `.exe` only, found without `PATHEXT`:
/// `npx`, `gemini` and the npm-installed adapters are `.cmd` scripts, found there only at their full path (which
/// std runs through `cmd.exe`, its arguments escaped), and never by their bare name, which npm gives a shell
/// script for other shells beside them. Elsewhere, `program` as it is.
fn spawned_program(program: &str) -> String {
    if !cfg!(windows) {
        return program.to_string();
    }
    match find_program(program, &windows_extensions()) {
        Some(file) if !file.extension().is_some_and(|extension| extension.eq_ignore_ascii_case("exe")) => {
            file.to_string_lossy().into_owned()
        }
        _ => program.to_string(),
    }
}

/// A command to the connection's task. `Cancel` sends `session/cancel`; with `by_player` (the player's cancel, not
/// an end, which ends them itself with the session's conversation) it cancels the session's tool calls running in
/// the game too.
pub(crate) enum Command {
    Prompt {
        turn: u64,
        blocks: Vec<PromptBlock>,
    },
    Cancel {
        by_player: bool,
    },
    Close {
        end_session: bool,
        within: CloseWithin,
    },
    /// The agent refused a turn asking for a sign-in: sign in again with the game's method, before the next
    /// prompt (queued after this).
    SignInAgain,
}

struct AcpLink {
    commands: UnboundedSender<Command>,
    backend_session: String,
    task: Arc<tokio::task::JoinHandle<()>>,
    exit: connection::ExitWatch,
}

impl Link for AcpLink {
    fn backend_session(&self) -> &str {
        &self.backend_session
    }

    fn prompt(&self, turn: u64, blocks: Vec<PromptBlock>) -> Result<(), ToolError> {
        self.commands
            .send(Command::Prompt { turn, blocks })
            .map_err(|_| ToolError::with_code(ErrorCode::AgentUnavailable, "the agent's connection is closed"))
    }

    fn cancel(&self) {
        let _ = self.commands.send(Command::Cancel { by_player: true });
    }

    fn stop_for_end(&self) {
        let _ = self.commands.send(Command::Cancel { by_player: false });
    }

    fn close(&self, end_session: bool, within: CloseWithin) -> BoxFuture<()> {
        // The connection closes the agent's stdin, waits 1 s, sends SIGTERM, waits 2 s, sends SIGKILL.
        let stopped_within = within.and(std::time::Duration::from_secs(4));
        let sent = self.commands.send(Command::Close { end_session, within }).is_ok();
        let task = self.task.clone();
        let exit = self.exit.clone();
        Box::pin(async move {
            if !sent {
                task.abort();
                return;
            }
            if stopped_within.run(connection::wait_exit(exit)).await.is_none() {
                task.abort();
            }
        })
    }

    fn kill(&self) {
        // Dropping the connection's future kills the agent's whole process group.
        self.task.abort();
    }
}

/// Waits for `ready` at most `start`, not counting the time spent signing in (which has its own timeout): `None`
/// if that time passed.
async fn within_start<T>(
    start: std::time::Duration,
    step: &connection::StartStep,
    mut ready: tokio::sync::oneshot::Receiver<T>,
) -> Option<Result<T, tokio::sync::oneshot::error::RecvError>> {
    let started = tokio::time::Instant::now();
    let mut changes = step.subscribe();
    loop {
        let (signing_in, signed_in_for) = {
            let step = changes.borrow_and_update();
            (step.signing_in, step.signed_in_for)
        };
        // No deadline while a sign-in runs; after it, the start's time less what signing in took.
        let deadline = crate::deadline::after_tokio(started, start.saturating_add(signed_in_for));
        tokio::select! {
            ready = &mut ready => return Some(ready),
            // A step changed (a sign-in began or ended): the deadline is worked out again. The sender is kept
            // by `step`, so this never ends.
            _ = changes.changed() => {}
            () = tokio::time::sleep_until(deadline), if !signing_in => return None,
        }
    }
}

/// The connection's task while `connect` waits for it: a caller that drops `connect` midway (a timeout around
/// `create`, a game task dropped with its menu) stops the agent instead of leaving it running, unheld.
struct Starting {
    task: tokio::task::AbortHandle,
    done: bool,
}

impl Drop for Starting {
    fn drop(&mut self) {
        if !self.done {
            // Aborting the connection's future kills the agent's process group.
            self.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_program_is_found_on_path_or_at_its_path() {
        let none = [String::new()];
        assert!(super::find_program("sh", &none).is_some(), "on PATH");
        assert!(super::find_program("/bin/sh", &none).is_some() || cfg!(windows));
        assert!(super::find_program("no-such-agent-program-here", &none).is_none());
        assert!(super::find_program("./no/such/agent", &none).is_none());
    }

    #[test]
    fn a_program_named_without_its_extension_is_found_with_the_first_that_fits() {
        // As on Windows, where `npx` is `npx.cmd` in a directory of PATH, after one that has none, beside npm's
        // shell script `npx` for other shells, which Windows cannot start.
        let (empty, npm) = (tempfile::tempdir().expect("a folder"), tempfile::tempdir().expect("a folder"));
        // (Upper case: Windows' file names are not, this test's may be.)
        std::fs::write(npm.path().join("agent-shim.CMD"), "@echo off").expect("written");
        std::fs::write(npm.path().join("agent-shim"), "#!/bin/sh").expect("written");
        let dirs = [empty.path().to_path_buf(), npm.path().to_path_buf()];
        let found = super::find_in("agent-shim", &dirs, &super::windows_extensions());
        assert_eq!(found, Some(npm.path().join("agent-shim.CMD")), "what is started");
        assert_eq!(super::find_in("agent-shim", &dirs, &[String::new()]), Some(npm.path().join("agent-shim")));
    }
}
