//! The sandbox: a small voxel world that AI agents play through MCP tools, headless, at a fixed 60 ticks per
//! second (run by [`AgentToolsRunnerPlugin`], which also serves agents' steps between ticks). The console (standard
//! input) stands in for the player: `enter WORLD`, `travel DIMENSION`, `exit`, `status`, `quit`; with `--agent` or
//! `--agent-openai`, the player also chats with an in-game agent: `say TEXT`, `chat-cancel`, `chat-end`, `chat-resume
//! [ID]`, `chat-forget ID`, `chat-allow R`, `chat-deny R` (see `chat.rs`).
//!
//! ```sh
//! cargo run --example sandbox -- [--data-dir DIR] [--port N] [--token-env VAR | --token TOKEN] [--world NAME]
//!     [--tps N] [--autosave SECS]
//!     [--agent "COMMAND ARGS" [--agent-auth METHOD] | --agent-openai URL --model NAME [--api-key-env VAR]
//!     [--context-window TOKENS]]
//!     [--agent-keep]
//!     [--ask-permissions] [--no-console] [--window]
//! ```
//!
//! `--window` (build with `--features window`) shows the world in a window: 3D blocks, the player, a HUD of the
//! agents' calls and conversations, and a chat panel (T) for the in-game agent; WASD walks, the mouse orbits and
//! zooms, L lists worlds, P travels between dimensions, Esc leaves the world; closing the window is `quit`.
//! The frame rate is then the display's, not `--tps`.
//!
//! `--no-console` reads no commands from standard input, whose end would otherwise quit: for a sandbox run in the
//! background, by a service manager, or without a terminal; give it `--world` to enter a world, and end it with a
//! signal (Ctrl+C, `kill`), which closes and saves the visit as `quit` does. It prints where its token is
//! (`token: in PATH`), not the token: a service manager's logs keep what it prints.
//!
//! `--agent-auth METHOD` signs in to the ACP agent with one of the methods it offers (for example Codex's `api-key`,
//! which reads `CODEX_API_KEY` or `OPENAI_API_KEY`); an agent that needs a sign-in without it says which it offers.
//!
//! `--agent-openai` (build with `--features openai`) runs the agent loop in the game against an OpenAI-compatible
//! endpoint (e.g. `http://127.0.0.1:11434/v1` for Ollama), with the API key from the variable `--api-key-env`
//! names (none without it: a key is never sent unasked); `--context-window` gives the model's window in tokens,
//! which the history sent is kept within (Ollama's default is 4,096 under 24 GiB of VRAM). A flag that would change
//! nothing with the others given (`--agent-keep` without an agent, `--context-window` with `--agent`, ...) is refused.
//!
//! Worlds are saved under the data directory (default `sandbox-data/`), one directory per world, as one document
//! (`sandbox.json`: changed blocks with their versions, notes, the player's position in each dimension) written
//! when the visit closes, and while it is open every `--autosave` seconds (default 30) if the world changed (a
//! crash loses at most that much), and loaded in the background when it opens. A visit starts in the overworld; each
//! dimension remembers where the player stood. The player stands on the ground of their column: a block placed
//! under them lifts them, a block broken under them drops them. Logs go to standard error; standard output
//! carries only the lines a program driving the sandbox reads.
//!
//! `build_tower` is a `Location` tool: when the player travels, the host ends it with `LOCATION_CHANGED` at once;
//! the tower keeps `placed` current with `CallContext::set_detail`, so that error says how many blocks it placed.
//! The count is also kept in the visit's tower log, shown by `world_info` as `last_tower` (`placed`, and
//! `status`: `building`, `finished`, or the code that stopped it).

mod batch;
mod chat;
mod console;
mod output;
mod picture;
mod session;
mod terrain;
mod tools;
mod tower;
mod view;
#[cfg(feature = "window")]
mod window;
mod world;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bevy::app::{ScheduleRunnerPlugin, TerminalCtrlCHandlerPlugin};
use bevy::log::LogPlugin;
use bevy::prelude::*;
use bevy_agent_tools::mcp::{McpPlugin, McpServer, McpUnavailable};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::WorldStorePlugin;

use bevy_agent_tools::session::{AgentSessionsPlugin, SessionConfig};
use chat::ChatPlugin;
use console::{check_world_name, say, ConsolePlugin};
use session::Sandbox;
use world::Palette;

const USAGE: &str =
    "usage: sandbox [--data-dir DIR] [--port N] [--token-env VAR | --token TOKEN] [--world NAME] [--tps N] \
[--autosave SECS] \
[--agent \"COMMAND ARGS\" [--agent-auth METHOD] | --agent-openai URL --model NAME [--api-key-env VAR] \
[--context-window TOKENS]] [--agent-keep] [--ask-permissions] [--no-console] \
[--window]";

/// The command line.
struct Args {
    data_dir: PathBuf,
    port: u16,
    token: Option<String>,
    world: Option<String>,
    tps: u32,
    /// `--autosave SECS`: how often a changed world is saved while the player is in it.
    autosave: u64,
    /// The in-game agent's command line, split shell-style.
    agent: Option<Vec<String>>,
    /// `--agent-auth METHOD`: the sign-in method for the ACP agent.
    agent_auth: Option<String>,
    /// `--agent-openai URL`, `--model NAME`, `--api-key-env VAR`: an OpenAI-compatible endpoint instead.
    agent_openai: Option<String>,
    model: Option<String>,
    api_key_env: Option<String>,
    /// `--context-window TOKENS`: the model's context window.
    context_window: Option<u64>,
    agent_keep: bool,
    ask_permissions: bool,
    /// `--no-console`: standard input is not read (only a signal quits).
    no_console: bool,
    /// `--window`: a real window (feature `window`).
    window: bool,
}

impl Args {
    fn parse(mut words: impl Iterator<Item = String>) -> Result<Option<Self>, String> {
        let mut args = Args {
            data_dir: "sandbox-data".into(),
            port: 15777,
            token: None,
            world: None,
            tps: 60,
            autosave: session::AUTOSAVE_EVERY.as_secs(),
            agent: None,
            agent_auth: None,
            agent_openai: None,
            model: None,
            api_key_env: None,
            context_window: None,
            agent_keep: false,
            ask_permissions: false,
            no_console: false,
            window: false,
        };
        let mut tps_given = false;
        while let Some(word) = words.next() {
            let (flag, inline) = match word.split_once('=') {
                Some((flag, value)) => (flag.to_string(), Some(value.to_string())),
                None => (word, None),
            };
            let switch = ["--agent-keep", "--ask-permissions", "--no-console", "--window"].contains(&flag.as_str());
            if let (true, Some(value)) = (switch, &inline) {
                return Err(format!(
                    "{flag} takes no value (got `={value}`): give {flag} to turn it on, nothing to leave it off"
                ));
            }
            match flag.as_str() {
                "-h" | "--help" => return Ok(None),
                "--agent-keep" => {
                    args.agent_keep = true;
                    continue;
                }
                "--ask-permissions" => {
                    args.ask_permissions = true;
                    continue;
                }
                "--no-console" => {
                    args.no_console = true;
                    continue;
                }
                "--window" if cfg!(feature = "window") => {
                    args.window = true;
                    continue;
                }
                "--window" => {
                    return Err("--window: this sandbox was built without the `window` feature (cargo run --example \
                                sandbox --features window -- --window)"
                        .into())
                }
                _ => {}
            }
            const TAKE_VALUES: &[&str] = &[
                "--data-dir",
                "--port",
                "--token",
                "--token-env",
                "--world",
                "--tps",
                "--autosave",
                "--agent",
                "--agent-auth",
                "--agent-openai",
                "--model",
                "--api-key-env",
                "--context-window",
            ];
            if !TAKE_VALUES.contains(&flag.as_str()) {
                return Err(format!("unknown option {flag:?}"));
            }
            let value = inline.or_else(|| words.next()).ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--data-dir" => args.data_dir = value.into(),
                "--port" => {
                    args.port = value.parse().map_err(|_| format!("--port: {value:?} is not a port (0-65535)"))?
                }
                "--token" if value.is_empty() || value.chars().any(|c| c.is_whitespace() || c.is_control()) => {
                    return Err("--token: use a non-empty token without spaces".into());
                }
                "--token" => args.token = Some(value),
                // The token read from the environment: on the command line, any user of the machine could read it
                // (`ps`), and it opens every conversation.
                "--token-env" => match std::env::var(&value) {
                    Ok(token) if !token.is_empty() && !token.chars().any(|c| c.is_whitespace() || c.is_control()) => {
                        args.token = Some(token)
                    }
                    Ok(_) => return Err(format!("--token-env: {value} holds an empty token or one with spaces")),
                    Err(_) => return Err(format!("--token-env: {value} is not set (or not UTF-8)")),
                },
                "--world" => {
                    check_world_name(&value).map_err(|e| format!("--world: {e}"))?;
                    args.world = Some(value);
                }
                "--tps" => {
                    tps_given = true;
                    args.tps =
                        value.parse().ok().filter(|tps| (1..=1000).contains(tps)).ok_or_else(|| {
                            format!("--tps: {value:?} is not a number of ticks per second in 1..=1000")
                        })?;
                }
                "--autosave" => {
                    args.autosave = value
                        .parse()
                        .ok()
                        .filter(|secs| (1..=86_400).contains(secs))
                        .ok_or_else(|| format!("--autosave: {value:?} is not a number of seconds in 1..=86400"))?;
                }
                "--agent" => {
                    let words = shell_words::split(&value).map_err(|e| format!("--agent: {e}"))?;
                    if words.is_empty() {
                        return Err("--agent: name the agent's command".into());
                    }
                    args.agent = Some(words);
                }
                "--agent-auth" if value.trim().is_empty() => {
                    return Err("--agent-auth: name one of the agent's sign-in methods".into())
                }
                "--agent-auth" => args.agent_auth = Some(value),
                "--agent-openai" => args.agent_openai = Some(value),
                "--model" => args.model = Some(value),
                "--api-key-env" => args.api_key_env = Some(value),
                "--context-window" => {
                    args.context_window =
                        Some(value.parse().ok().filter(|tokens| *tokens > 0).ok_or_else(|| {
                            format!("--context-window: {value:?} is not a number of tokens (e.g. 4096)")
                        })?);
                }
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        if args.agent.is_some() && args.agent_openai.is_some() {
            return Err("--agent and --agent-openai: choose one".into());
        }
        if args.agent_openai.is_some() != args.model.is_some() {
            return Err("--agent-openai URL needs --model NAME (and --model needs --agent-openai)".into());
        }
        // A flag that would change nothing is refused, not silently dropped.
        if args.no_console && args.world.is_none() && !args.window {
            return Err("--no-console is for a sandbox in a world of its own: give --world NAME too (nothing else \
                        could enter one)"
                .into());
        }
        let agent_flags = [("--agent-keep", args.agent_keep), ("--ask-permissions", args.ask_permissions)];
        if args.agent_auth.is_some() && args.agent.is_none() {
            return Err("--agent-auth is for an ACP agent: give --agent too (an --agent-openai endpoint takes \
                        --api-key-env)"
                .into());
        }
        let openai_flags =
            [("--api-key-env", args.api_key_env.is_some()), ("--context-window", args.context_window.is_some())];
        if args.agent.is_none() && args.agent_openai.is_none() {
            if let Some((flag, _)) = agent_flags.iter().chain(&openai_flags).find(|(_, given)| *given) {
                return Err(format!("{flag} is for an in-game agent: give --agent or --agent-openai too"));
            }
        }
        if args.agent.is_some() {
            if let Some((flag, _)) = openai_flags.iter().find(|(_, given)| *given) {
                return Err(format!("{flag} is for --agent-openai (an ACP agent reads its own configuration)"));
            }
        }
        if args.agent_openai.is_some() && args.ask_permissions {
            return Err("--ask-permissions is for an ACP agent (--agent): a model behind --agent-openai asks no \
                        permission, it calls the game's tools only"
                .into());
        }
        if args.no_console && !args.window && (args.agent.is_some() || args.agent_openai.is_some()) {
            return Err("--no-console is for a sandbox nobody talks to: an in-game agent is talked to from the \
                        console (`say`), or with --window from its chat panel"
                .into());
        }
        if args.window && tps_given {
            return Err("--tps does not apply with --window: the window's frames run at the display's rate".into());
        }
        Ok(Some(args))
    }

    /// The in-game agent session the command line asks for, if any.
    fn session_config(&self) -> Result<Option<SessionConfig>, String> {
        let config = match (&self.agent, &self.agent_openai, &self.model) {
            (Some(agent), _, _) => chat::acp_config(agent, self.agent_auth.as_deref()),
            (None, Some(url), Some(model)) => {
                Some(openai_config(url, model, self.api_key_env.as_deref(), self.context_window)?)
            }
            _ => None,
        };
        Ok(config.map(|config| chat::with_flags(config, self.agent_keep, self.ask_permissions)))
    }
}

#[cfg(feature = "openai")]
fn openai_config(
    url: &str,
    model: &str,
    api_key_env: Option<&str>,
    context_window: Option<u64>,
) -> Result<SessionConfig, String> {
    use bevy_agent_tools::session::OpenAiEndpoint;
    let mut endpoint = OpenAiEndpoint::new(url, model);
    if let Some(tokens) = context_window {
        endpoint = endpoint.context_window(tokens);
    }
    // The key: only from the variable named. Never taken from OPENAI_API_KEY unasked: it would go to whatever
    // endpoint this is (a local server, a LAN host over plain HTTP).
    if let Some(var) = api_key_env {
        endpoint = endpoint.api_key_env(var);
    }
    Ok(SessionConfig::openai_endpoint(endpoint).system_prompt(
        "You are in a voxel sandbox game. Act through the game's tools; the player reads your messages in the \
         game's console.",
    ))
}

#[cfg(not(feature = "openai"))]
fn openai_config(_: &str, _: &str, _: Option<&str>, _: Option<u64>) -> Result<SessionConfig, String> {
    Err("--agent-openai: this sandbox was built without the `openai` feature (cargo run --example sandbox \
         --features openai)"
        .into())
}

#[cfg(feature = "window")]
fn add_window(app: &mut App, palette: &Arc<Palette>, args: &Args) {
    app.add_plugins(window::default_plugins())
        .add_plugins(window::SandboxWindow { palette: palette.clone(), data_dir: args.data_dir.clone() });
}

#[cfg(not(feature = "window"))]
fn add_window(_: &mut App, _: &Arc<Palette>, _: &Args) {}

/// How long the sandbox, exiting, waits for its last lines to be written (a reader that stopped reading would
/// otherwise keep it).
const LAST_LINES_WITHIN: Duration = Duration::from_secs(5);

fn main() -> AppExit {
    let exit = run();
    output::written(LAST_LINES_WITHIN);
    exit
}

fn run() -> AppExit {
    let args = match Args::parse(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            say(USAGE);
            return AppExit::Success;
        }
        Err(error) => {
            eprintln!("sandbox: {error}\n{USAGE}");
            return AppExit::from_code(2);
        }
    };
    let palette = match Palette::parse(include_str!("../../assets/palette.json")) {
        Ok(palette) => Arc::new(palette),
        Err(error) => {
            eprintln!("sandbox: assets/palette.json: {error}");
            return AppExit::from_code(2);
        }
    };
    let session = match args.session_config() {
        Ok(session) => session,
        Err(error) => {
            eprintln!("sandbox: {error}\n{USAGE}");
            return AppExit::from_code(2);
        }
    };
    let frame = Duration::from_secs(1) / args.tps;

    let mut app = App::new();
    if args.window {
        add_window(&mut app, &palette, &args);
    } else {
        // The crate's runner instead of `ScheduleRunnerPlugin`: the same fixed frame rate, and an agent's steps are
        // also served while the loop waits for the next frame, so a call that reads or changes the world returns
        // in well under a frame (BENCHMARKS.md, MCP vs BRP).
        // Ctrl+C is `AppExit` (exit code 130), as in `DefaultPlugins`: the visit closes and its save completes (1
        // instead if a save failed).
        app.add_plugins((
            MinimalPlugins.build().disable::<ScheduleRunnerPlugin>(),
            AgentToolsRunnerPlugin::run_loop(frame),
            LogPlugin::default(),
            TerminalCtrlCHandlerPlugin,
        ));
    }
    let host = tools::all(palette.clone()).into_iter().fold(
        AgentToolsPlugin::new(Sandbox::new(palette).autosave_every(std::time::Duration::from_secs(args.autosave))),
        |host, tool| host.with_tool(tool),
    );
    app.add_plugins(host)
        .add_plugins(WorldStorePlugin::new(&args.data_dir))
        .add_plugins(ConsolePlugin { enter_at_start: args.world.clone(), read_stdin: !args.no_console });
    info!(data_dir = %args.data_dir.display(), tps = args.tps, "sandbox started");

    let mut mcp = McpPlugin::new().port(args.port).token_file(args.data_dir.join("mcp-token"));
    if let Some(token) = &args.token {
        mcp = mcp.token(token);
    }
    if let Err(error) = mcp.validate() {
        eprintln!("sandbox: {error}");
        return AppExit::from_code(2);
    }
    app.add_plugins(mcp);
    match (app.world().get_resource::<McpServer>(), app.world().get_resource::<McpUnavailable>()) {
        (Some(server), _) => {
            say(format_args!("mcp: {}", server.url()));
            // A token of the player's own (`--token`, often long-lived) is not repeated where logs keep it; nor,
            // without a console (a service, whose output goes to logs others may read), this run's.
            match (&args.token, args.no_console) {
                (Some(_), _) => say(format_args!("token: as given with --token or --token-env")),
                (None, true) => say(format_args!("token: in {}", server.token_file().display())),
                (None, false) => say(format_args!("token: {}", server.token())),
            }
            // Another copy has the port: this one's URL and token file are not the README's.
            if let Some(taken) = server.replaced_port() {
                say(format_args!(
                    "mcp-port-taken: {taken} (another program has it); token-file: {}",
                    server.token_file().display()
                ));
            }
        }
        // The console, the saves and in-process tools work without it.
        (None, unavailable) => {
            let why =
                unavailable.map_or_else(|| "not started".to_string(), |unavailable| unavailable.error.to_string());
            say(format_args!("mcp: unavailable ({why})"));
        }
    }
    if let Some(config) = session {
        app.add_plugins(AgentSessionsPlugin::new().data_dir(args.data_dir.join("agent-sessions")))
            .add_plugins(ChatPlugin { config, kept: args.agent_keep.then(|| args.data_dir.join("kept-session.json")) });
    }

    console::exit_code(app.run())
}
