//! The console: standing in for the player. Reads commands from standard input (on its own thread, handed to the
//! game through a channel, one command per frame) and prints one `ok ...` or `error: ...` line per command, and
//! one line per visit event ([`say`]: every line is flushed at once, so a program reading through a pipe sees it).

use std::collections::BTreeSet;
use std::io::{BufRead, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bevy::app::AppExit;
use bevy::prelude::*;
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::{
    AgentToolsExitSystems, ConversationStatusChanged, StatusSource, VisitClosed, VisitId, VisitLoadFailed, VisitOpened,
    VisitPhase, VisitRelocated, VisitSaved, WorldOpenFailed,
};
use crossbeam_channel::{Receiver, TryRecvError};

use crate::session::{Sandbox, VisitSummary};
use crate::world::Dimension;

/// How long `quit` waits for saves before it exits anyway (the plugin then waits once more, bounded too).
const QUIT_DEADLINE: Duration = Duration::from_secs(30);

const USAGE: &str = "commands: help, enter WORLD, travel DIMENSION, exit, status, quit; with --agent or --agent-openai: say TEXT, \
chat-cancel, chat-end, chat-resume [ID], chat-forget ID, chat-allow R, chat-deny R; with --window: screenshot PATH, hud, frames [each]";

/// Set when a save of this run failed, whichever way the sandbox then ends (`quit`, a signal, the window closed).
static A_SAVE_FAILED: AtomicBool = AtomicBool::new(false);

/// The exit code the sandbox ends with: `app_exit`, or 1 if a save failed (a signal's 130 too: a script or a
/// service manager then tells a lost save from a clean stop).
pub fn exit_code(app_exit: AppExit) -> AppExit {
    match A_SAVE_FAILED.load(Ordering::SeqCst) {
        true => AppExit::from_code(1),
        false => app_exit,
    }
}

pub use crate::output::say;

/// The data directory's own entries besides worlds (see `main.rs`): no world may be named so.
pub const NOT_WORLDS: [&str; 3] = ["agent-sessions", "mcp-token", "kept-session.json"];

/// World names are the store's directory names: [`WorldStore::check_world`]'s rule (1 to 64 of `a-z 0-9 _ -`), and
/// none of the data directory's other entries ([`NOT_WORLDS`]: a world `agent-sessions` would save into the in-game
/// sessions' private folder).
pub fn check_world_name(name: &str) -> Result<(), String> {
    if NOT_WORLDS.contains(&name) {
        return Err(format!("`{name}` is a name the sandbox uses for its own files: choose another world name"));
    }
    bevy_agent_tools::persist::WorldStore::check_world(&bevy_agent_tools::WorldId::new(name))
        .map_err(|error| error.to_string())
}

/// Reads standard input and answers on standard output. `enter_at_start` is entered before the first command.
/// Without `read_stdin` (`--no-console`: a sandbox run in the background, by a service manager, in a container
/// without a terminal) no command is read, and only a signal quits.
pub struct ConsolePlugin {
    pub enter_at_start: Option<String>,
    pub read_stdin: bool,
}

enum Input {
    Line(String),
    /// A line longer than [`LINE_LIMIT`] bytes: not read into memory, answered with an error line.
    TooLong,
    End,
}

/// The longest console line read (a `say` of a long message fits many times over): input piped without a newline
/// is not gathered into memory without end.
const LINE_LIMIT: usize = 64 * 1024;

/// Reads one line of at most [`LINE_LIMIT`] bytes into `line` (cleared first); the rest of a longer one is read
/// past and dropped. `None` at the end of input.
fn read_line(input: &mut impl BufRead, line: &mut Vec<u8>) -> Option<Input> {
    line.clear();
    match input.by_ref().take(LINE_LIMIT as u64 + 1).read_until(b'\n', line) {
        Ok(0) | Err(_) => None,
        Ok(_) if line.len() > LINE_LIMIT && line.last() != Some(&b'\n') => {
            // Past the rest of it, a buffer's worth at a time.
            loop {
                let (done, used) = match input.fill_buf() {
                    Ok([]) | Err(_) => (true, 0),
                    Ok(buffer) => match buffer.iter().position(|&b| b == b'\n') {
                        Some(end) => (true, end + 1),
                        None => (false, buffer.len()),
                    },
                };
                input.consume(used);
                if done {
                    return Some(Input::TooLong);
                }
            }
        }
        Ok(_) => {
            let text = String::from_utf8_lossy(line);
            Some(Input::Line(text.trim_end_matches(['\n', '\r']).to_string()))
        }
    }
}

#[derive(Resource)]
struct ConsoleInput(Receiver<Input>);

/// Another way to type into the console: the window's keys send the commands a player would type, so they go
/// through the same checks and print the same lines.
#[derive(Resource, Clone)]
#[cfg_attr(not(feature = "window"), allow(dead_code))] // Read by the window only.
pub struct ConsoleLines(crossbeam_channel::Sender<Input>);

impl ConsoleLines {
    /// Queues `line` as if it had been typed.
    #[cfg_attr(not(feature = "window"), allow(dead_code))]
    pub fn send(&self, line: impl Into<String>) {
        let _ = self.0.send(Input::Line(line.into()));
    }
}

/// What the player asked for, ahead of what the host has applied yet.
#[derive(Resource, Default)]
struct Player {
    /// The world the player is in, or entering.
    world: Option<String>,
    dimension: Option<Dimension>,
    /// The open visit of that world, once it opened (`None` while entering, and after leaving): only its
    /// relocations move the player, not a late one of the visit being left.
    visit: Option<VisitId>,
    quitting: Option<Instant>,
    exit_sent: bool,
    /// Visits closed whose saves have not finished.
    unsaved: BTreeSet<u64>,
    save_failed: bool,
}

impl Plugin for ConsolePlugin {
    fn build(&self, app: &mut App) {
        let (lines, input) = crossbeam_channel::unbounded();
        app.insert_resource(ConsoleLines(lines.clone()));
        let reader = self.read_stdin.then(|| {
            std::thread::Builder::new().name("console".into()).spawn(move || {
                // Bytes, not `lines()`: a line that is not UTF-8 is read as well as it can be (and answered with an
                // error line), never taken for the end of input.
                let mut stdin = std::io::stdin().lock();
                let mut line = Vec::new();
                while let Some(input) = read_line(&mut stdin, &mut line) {
                    if lines.send(input).is_err() {
                        return;
                    }
                }
                let _ = lines.send(Input::End);
            })
        });
        if let Some(Err(error)) = reader {
            error!("cannot read the console: {error}");
        }
        let mut player = Player::default();
        if let Some(world) = &self.enter_at_start {
            app.world_mut().write_message(EnterWorld::new(world.as_str()));
            player.world = Some(world.clone());
            player.dimension = Some(Dimension::Overworld);
        }
        app.insert_resource(ConsoleInput(input))
            .insert_resource(player)
            .init_resource::<VisitSummary>()
            .init_resource::<ChatStatus>()
            .add_message::<ChatRequest>()
            .add_message::<WindowRequest>()
            .add_systems(Update, read_command)
            .add_systems(PostUpdate, (report_conversations, finish_quit).chain().after(AgentToolsSystems::Pump))
            // After the exit's close too (`AgentToolsExitSystems::Host`), so Ctrl+C and a closed window print its
            // lines.
            .add_systems(Last, report_events.after(AgentToolsExitSystems::Host));
    }
}

/// One console command, decoded from a line: what the player asked for, before the game's state is consulted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `enter WORLD`
    Enter(String),
    /// `travel DIMENSION`
    Travel(Dimension),
    /// `exit`
    Exit,
    /// `status`
    Status,
    /// `quit`
    Quit,
    /// `help`: the commands.
    Help,
    /// A command for the in-game agent session (`say`, `chat-*`), answered by the chat module.
    Chat(ChatCommand),
    /// A command for the window (`screenshot`, `hud`, `frames`), answered by the window module.
    Window(WindowCommand),
}

/// What the player (or a test) asks of the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WindowCommand {
    /// `screenshot PATH`: the window as a PNG at PATH (written through Bevy's screenshot).
    Screenshot(String),
    /// `hud`: the text the HUD and the chat panel show now, on one line.
    Hud,
    /// `frames`: frame times and chunk re-mesh times since the last `frames`; `frames each` adds every frame's
    /// time (`each_ms=`), for figures pooled over several periods.
    Frames { each: bool },
}

/// What the player says to the in-game agent session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChatCommand {
    /// `say TEXT`: TEXT is everything after `say` and one separating space, word for word.
    Say(String),
    /// `chat-cancel`
    Cancel,
    /// `chat-end`
    End,
    /// `chat-resume` (the current session) or `chat-resume ID` (a kept one)
    Resume(Option<String>),
    /// `chat-forget ID`: delete a session for good (`AgentSessions::forget`)
    Forget(String),
    /// `chat-allow R`
    Allow(u64),
    /// `chat-deny R`
    Deny(u64),
}

/// A chat command, for the chat module (the console answers it only when no agent is configured).
#[derive(Message, Clone, Debug)]
pub struct ChatRequest(pub ChatCommand);

/// A window command, for the window module (the console answers it only when there is no window).
#[derive(Message, Clone, Debug)]
#[cfg_attr(not(feature = "window"), allow(dead_code))] // Read by the window only.
pub struct WindowRequest(pub WindowCommand);

/// What `status` says of the in-game agent session, read from the chat module when asked (`None` without one).
#[derive(Resource, Default)]
pub struct ChatStatus(pub Option<ReadChatStatus>);

/// Reads the chat part of `status` now.
pub type ReadChatStatus = std::sync::Arc<dyn Fn() -> Option<String> + Send + Sync>;

impl Command {
    /// Decodes one line of input: `Ok(None)` for a blank line (ignored), `Err` with the text of the `error:` line
    /// the console prints for it. Pure, so it can be tested and fuzzed away from the game.
    pub fn parse(line: &str) -> Result<Option<Self>, String> {
        let line = line.trim_start();
        // The command's word, then the rest of the line as it was typed (after the one space or tab after it).
        let (word, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        if word == "screenshot" {
            if rest.trim().is_empty() {
                return Err(format!("screenshot where? `screenshot PATH`; {USAGE}"));
            }
            return Ok(Some(Self::Window(WindowCommand::Screenshot(rest.trim().to_string()))));
        }
        if word == "say" {
            if rest.trim().is_empty() {
                return Err(format!("say what? `say TEXT`; {USAGE}"));
            }
            return Ok(Some(Self::Chat(ChatCommand::Say(rest.to_string()))));
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let request =
            |number: &str| number.parse::<u64>().map_err(|_| format!("{number:?} is not a permission request number"));
        let command = match words.as_slice() {
            [] => return Ok(None),
            ["enter", world] => {
                check_world_name(world)?;
                Self::Enter(world.to_string())
            }
            ["travel", dimension] => Self::Travel(Dimension::parse(dimension)?),
            ["exit"] => Self::Exit,
            ["status"] => Self::Status,
            ["quit"] => Self::Quit,
            ["help"] => Self::Help,
            ["chat-cancel"] => Self::Chat(ChatCommand::Cancel),
            ["chat-end"] => Self::Chat(ChatCommand::End),
            ["chat-resume"] => Self::Chat(ChatCommand::Resume(None)),
            ["chat-resume", id] => Self::Chat(ChatCommand::Resume(Some(id.to_string()))),
            ["chat-forget", id] => Self::Chat(ChatCommand::Forget(id.to_string())),
            ["chat-allow", number] => Self::Chat(ChatCommand::Allow(request(number)?)),
            ["chat-deny", number] => Self::Chat(ChatCommand::Deny(request(number)?)),
            ["hud"] => Self::Window(WindowCommand::Hud),
            ["frames"] => Self::Window(WindowCommand::Frames { each: false }),
            ["frames", "each"] => Self::Window(WindowCommand::Frames { each: true }),
            [command, ..] if COMMANDS.contains(command) => {
                return Err(format!("wrong arguments for `{command}`; {USAGE}"));
            }
            [command, ..] => return Err(format!("unknown command {command:?}; {USAGE}")),
        };
        Ok(Some(command))
    }
}

const COMMANDS: [&str; 16] = [
    "help",
    "enter",
    "travel",
    "exit",
    "status",
    "quit",
    "say",
    "chat-cancel",
    "chat-end",
    "chat-resume",
    "chat-forget",
    "chat-allow",
    "chat-deny",
    "screenshot",
    "hud",
    "frames",
];

/// What the console hands on: chat commands to the chat module (with `--agent`), window commands to the window
/// (with `--window`).
#[derive(bevy::ecs::system::SystemParam)]
struct Forwarded<'w> {
    requests: MessageWriter<'w, ChatRequest>,
    status: Res<'w, ChatStatus>,
    /// Present only with `--agent`.
    agents: Option<Res<'w, bevy_agent_tools::session::AgentSessions>>,
    /// Present only with `--window`.
    window: Option<Res<'w, crate::view::WorldView>>,
    window_requests: MessageWriter<'w, WindowRequest>,
}

/// Runs at most one command per frame, so every command's effects are applied before the next one is read.
fn read_command(
    input: Res<ConsoleInput>,
    mut player: ResMut<Player>,
    mut enter: MessageWriter<EnterWorld>,
    mut travel: MessageWriter<TravelTo>,
    mut exit: MessageWriter<ExitWorld>,
    mut chat: Forwarded,
    status_of: (Res<WorldBinding<Sandbox>>, Res<VisitSummary>),
) {
    let (binding, summary) = status_of;
    let line = match input.0.try_recv() {
        Ok(Input::Line(line)) => line,
        Ok(Input::TooLong) => return say(format!("error: a line of more than {LINE_LIMIT} bytes: not read")),
        Ok(Input::End) | Err(TryRecvError::Disconnected) => {
            if chat.window.is_some() {
                // Closing the window quits: one started without a terminal (a launcher, an IDE) stays open.
                info!("end of input: the window stays open; close it to quit");
                return;
            }
            if player.quitting.is_none() {
                info!("end of input: quitting");
                quit(&mut player, &mut exit);
            }
            return;
        }
        Err(TryRecvError::Empty) => return,
    };
    let Some(command) = Command::parse(&line).transpose() else { return };
    if player.quitting.is_some() {
        return say("error: quitting: no more commands");
    }
    if let (Ok(Command::Chat(request)), Some(_)) = (&command, &chat.agents) {
        // The chat module answers, once the agent has (`ok` as soon as a prompt is sent).
        chat.requests.write(ChatRequest(request.clone()));
        return;
    }
    if let (Ok(Command::Window(request)), Some(_)) = (&command, &chat.window) {
        chat.window_requests.write(WindowRequest(request.clone()));
        return;
    }
    let answer = command.and_then(|command| match command {
        Command::Enter(world) => {
            enter.write(EnterWorld::new(world.as_str()));
            let left = player.world.replace(world.clone());
            player.dimension = Some(Dimension::Overworld);
            player.visit = None;
            Ok(match left {
                Some(left) => format!("leaving {left}, entering {world}"),
                None => format!("entering {world}"),
            })
        }
        Command::Travel(dimension) => {
            if player.world.is_none() {
                return Err("no world is open: enter one first".into());
            }
            if player.dimension == Some(dimension) {
                return Ok(format!("already in the {dimension}"));
            }
            travel.write(TravelTo::new(dimension.as_str()));
            player.dimension = Some(dimension);
            Ok(format!("traveling to the {dimension}"))
        }
        Command::Exit => match player.world.take() {
            Some(world) => {
                exit.write(ExitWorld::new());
                player.dimension = None;
                player.visit = None;
                Ok(format!("leaving {world}"))
            }
            None => Err("no world is open".into()),
        },
        Command::Help => Ok(USAGE.to_string()),
        Command::Status => Ok(match chat.status.0.as_ref().and_then(|read| read()) {
            Some(chat) => format!("{} {chat}", status(&player, &binding, &summary)),
            None => status(&player, &binding, &summary),
        }),
        Command::Chat(_) => Err("no agent configured (start with --agent \"COMMAND ARGS\", or --agent-openai URL \
                                 --model NAME with --features openai)"
            .into()),
        Command::Window(_) => Err("no window (start with --window)".into()),
        Command::Quit => {
            quit(&mut player, &mut exit);
            Ok("quitting".into())
        }
    });
    match answer {
        Ok(answer) => say(format_args!("ok {answer}")),
        Err(error) => say(format_args!("error: {error}")),
    }
}

fn quit(player: &mut Player, exit: &mut MessageWriter<ExitWorld>) {
    player.quitting = Some(Instant::now());
    if player.world.take().is_some() {
        exit.write(ExitWorld::new());
    }
}

fn status(player: &Player, binding: &WorldBinding<Sandbox>, summary: &VisitSummary) -> String {
    let Some(world) = &player.world else { return "no world open".into() };
    let Some(open) = binding.current().filter(|open| open.info.world.as_str() == world) else {
        return format!("entering {world}");
    };
    let phase = match open.phase {
        VisitPhase::Loading => "loading",
        VisitPhase::Open => "open",
        VisitPhase::LoadFailed => "load-failed",
        VisitPhase::Closing => "closing",
    };
    let info = &open.info;
    let mut line = format!(
        "world={world} visit={} phase={phase} dimension={} revision={}",
        info.visit.0, info.location.dimension, info.location.revision.0
    );
    let summary = summary.0.as_ref().filter(|s| s.visit == info.visit);
    match summary.and_then(|s| s.loaded.as_ref()) {
        None => line.push_str(" player=loading"),
        Some(Ok((pos, notes, changed))) => {
            line.push_str(&format!(" player={},{},{} notes={notes} changed={changed}", pos.x, pos.y, pos.z));
            // The visit's changes no autosave made durable yet (the save at the visit's end holds them all).
            let unsaved = summary.map_or(0, |s| s.changes.saturating_sub(s.autosaved));
            line.push_str(&format!(" unsaved={unsaved}"));
        }
        Some(Err(error)) => line.push_str(&format!(" load-error={error:?}")),
    }
    line
}

/// One line per change of an agent conversation's status, so a person watching sees what the agents do.
fn report_conversations(
    mut changed: MessageReader<ConversationStatusChanged>,
    agents: Option<Res<bevy_agent_tools::session::AgentSessions>>,
) {
    // An in-game agent session's changes are `chat-status` lines (the chat module).
    let is_chat =
        |id: &bevy_agent_tools::ConversationId| agents.as_ref().is_some_and(|agents| agents.get(id).is_some());
    for m in changed.read().filter(|m| !is_chat(&m.conversation)) {
        let source = match m.source {
            StatusSource::Host => "host",
            StatusSource::Agent => "agent",
        };
        say(format_args!(
            "conversation id={} status={} previous={} source={source}",
            m.conversation,
            m.status.as_str(),
            m.previous.as_str()
        ));
    }
}

fn report_events(
    mut opened: MessageReader<VisitOpened>,
    mut relocated: MessageReader<VisitRelocated>,
    mut closed: MessageReader<VisitClosed>,
    mut saved: MessageReader<VisitSaved>,
    mut failed: MessageReader<WorldOpenFailed>,
    mut load_failed: MessageReader<VisitLoadFailed>,
    mut player: ResMut<Player>,
) {
    // One command per frame: a frame's events are, in time order, an agent's travel (asked for in the frame
    // before), the previous visit's close, the next one's open, then the saves that finished.
    for m in relocated.read() {
        say(format_args!("relocated visit={} dimension={} revision={}", m.visit.0, m.to.dimension, m.to.revision.0));
        // An agent's `travel` moves the player too (not one of a visit the player already left).
        if player.visit == Some(m.visit) {
            player.dimension = Dimension::parse(m.to.dimension.as_str()).ok();
        }
    }
    for m in closed.read() {
        say(format_args!("visit-closed world={} visit={}", m.info.world, m.info.visit.0));
        if player.visit == Some(m.info.visit) {
            player.visit = None;
        }
    }
    for m in opened.read() {
        say(format_args!("visit-opened world={} visit={}", m.info.world, m.info.visit.0));
        if player.world.as_deref() == Some(m.info.world.as_str()) {
            player.visit = Some(m.info.visit);
            player.dimension = Dimension::parse(m.info.location.dimension.as_str()).ok();
        }
    }
    for m in failed.read() {
        say(format_args!("open-failed world={} visit={} error={:?}", m.world, m.visit.0, m.error.message()));
        if player.world.as_deref() == Some(m.world.as_str()) {
            player.world = None;
            player.dimension = None;
        }
    }
    for m in load_failed.read() {
        // The visit stays open (its tools answer INTERNAL saying why) until the player leaves it.
        say(format_args!("load-failed world={} visit={} error={:?}", m.info.world, m.info.visit.0, m.error.message()));
    }
    for m in saved.read() {
        match &m.result {
            Ok(()) => say(format_args!("saved world={} visit={}", m.info.world, m.info.visit.0)),
            Err(error) => {
                A_SAVE_FAILED.store(true, Ordering::SeqCst);
                say(format_args!(
                    "save-failed world={} visit={} error={:?}",
                    m.info.world,
                    m.info.visit.0,
                    error.message()
                ));
            }
        }
    }
}

/// Once quitting, the world left and every save finished (or the deadline passed): exit, with status 1 if a save
/// failed.
fn finish_quit(
    mut closed: MessageReader<VisitClosed>,
    mut saved: MessageReader<VisitSaved>,
    mut player: ResMut<Player>,
    binding: Res<WorldBinding<Sandbox>>,
    mut exit: MessageWriter<AppExit>,
) {
    // Its own readers: the lines are printed later in the frame (`report_events`, in `Last`).
    for m in closed.read() {
        player.unsaved.insert(m.info.visit.0);
    }
    for m in saved.read() {
        player.unsaved.remove(&m.info.visit.0);
        player.save_failed |= m.result.is_err();
    }
    let Some(since) = player.quitting else { return };
    if player.exit_sent {
        return;
    }
    let late = since.elapsed() > QUIT_DEADLINE;
    if !late && (binding.current().is_some() || !player.unsaved.is_empty()) {
        return;
    }
    if late {
        error!(unsaved = ?player.unsaved, "saves did not finish within {QUIT_DEADLINE:?}; exiting anyway");
    }
    player.exit_sent = true;
    exit.write(if player.save_failed || late { AppExit::from_code(1) } else { AppExit::Success });
}

#[cfg(test)]
mod tests {
    use bevy_agent_tools::{DimensionId, Location, LocationRevision, VisitInfo, WorldId};

    use super::*;

    fn info(world: &str, visit: u64, dimension: &str, revision: u64) -> VisitInfo {
        let location = Location { dimension: DimensionId::new(dimension), revision: LocationRevision(revision) };
        VisitInfo { visit: VisitId(visit), world: WorldId::new(world), location }
    }

    fn relocated(visit: u64, to: &str) -> VisitRelocated {
        VisitRelocated {
            visit: VisitId(visit),
            from: info("", visit, "overworld", 0).location,
            to: info("", visit, to, 1).location,
        }
    }

    #[test]
    fn no_world_is_named_as_the_data_directorys_own_entries() {
        for name in NOT_WORLDS {
            assert!(check_world_name(name).is_err(), "{name}");
        }
        assert!(check_world_name("agent-sessions-2").is_ok());
    }

    #[test]
    fn a_console_line_past_the_limit_is_refused_without_being_gathered_and_the_next_line_is_read() {
        let mut piped = vec![b'x'; LINE_LIMIT * 3];
        piped.extend(b"\nstatus\r\nlast");
        // A small buffer: the long line is read past a buffer at a time.
        let mut input = std::io::BufReader::with_capacity(4096, piped.as_slice());
        let mut line = Vec::new();
        assert!(matches!(read_line(&mut input, &mut line), Some(Input::TooLong)));
        assert!(line.len() <= LINE_LIMIT + 1, "at most the limit is held: {}", line.len());
        assert!(matches!(read_line(&mut input, &mut line), Some(Input::Line(text)) if text == "status"));
        assert!(matches!(read_line(&mut input, &mut line), Some(Input::Line(text)) if text == "last"));
        assert!(read_line(&mut input, &mut line).is_none());
        // A line of exactly the limit is a line.
        let mut exact = vec![b'y'; LINE_LIMIT];
        exact.push(b'\n');
        assert!(
            matches!(read_line(&mut exact.as_slice(), &mut line), Some(Input::Line(text)) if text.len() == LINE_LIMIT)
        );
    }

    #[test]
    fn a_travel_of_the_visit_being_left_does_not_move_the_player_in_the_world_they_enter() {
        let mut app = App::new();
        app.add_message::<VisitOpened>()
            .add_message::<VisitRelocated>()
            .add_message::<VisitClosed>()
            .add_message::<VisitSaved>()
            .add_message::<WorldOpenFailed>()
            .add_message::<VisitLoadFailed>()
            .add_systems(Update, report_events);
        // In alpha's visit 1, then `enter beta`: in one frame an agent's travel of visit 1 to the nether lands,
        // visit 1 closes and beta's visit 2 opens, in the overworld.
        app.insert_resource(Player {
            world: Some("beta".into()),
            dimension: Some(Dimension::Overworld),
            visit: None,
            ..Player::default()
        });
        app.world_mut().write_message(relocated(1, "nether"));
        app.world_mut()
            .write_message(VisitClosed { info: info("alpha", 1, "nether", 1), completion: Completion::done() });
        app.update();
        assert_eq!(app.world().resource::<Player>().dimension, Some(Dimension::Overworld), "entering beta");
        app.world_mut().write_message(VisitOpened { info: info("beta", 2, "overworld", 0) });
        app.update();
        let player = app.world().resource::<Player>();
        assert_eq!((player.visit, player.dimension), (Some(VisitId(2)), Some(Dimension::Overworld)));

        // The open visit's own travel moves the player.
        app.world_mut().write_message(relocated(2, "nether"));
        app.update();
        assert_eq!(app.world().resource::<Player>().dimension, Some(Dimension::Nether));
    }
}
