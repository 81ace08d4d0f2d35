//! The player's chat with an in-game agent (`--agent "COMMAND ARGS"`, or `--agent-openai URL --model NAME`; the
//! backend makes no difference here): the session is created at start-up, the
//! console's `say` and `chat-*` commands drive it, and its conversation's messages become lines:
//!
//! ```text
//! chat-starting                                  at start-up: the agent starts (commands typed meanwhile wait)
//! chat-status session=ID status=S previous=P     every status change, once, in order
//! chat session=ID: TEXT                          each completed agent message (newlines as \n)
//! chat-error session=ID scope=S code=C message=M
//!                                                S: session (it failed: a crash is AGENT_UNAVAILABLE; chat-resume),
//!                                                turn (that turn ended) or notice (nothing failed)
//! chat-turn-ended session=ID stop=S              a turn cut short: S is max_tokens, max_turn_requests, refusal
//!                                                or other (a turn that ended normally, or cancelled, says nothing)
//! chat-permission session=ID request=R [kind=K] [input="I"] tool=T
//!                                                the agent asks (the input a JSON string); with
//!                                                --ask-permissions answer chat-allow/deny R
//! chat-permission-settled session=ID request=R outcome=O
//!                                                it no longer waits: allowed, denied, timed_out or withdrawn
//! ```
//!
//! Commands are handled one at a time, in order, by one task (a `say` right after another sees the first turn
//! running); their answers (`ok ...`, `error: ...`) come from there.
//!
//! With `--agent-keep` the session outlives the sandbox: its id is noted in `kept-session.json` in the data
//! directory, with the session's configuration, and the next start with the same agent flags re-attaches it.
//! With other flags, or if it is gone, a new one is created and noted instead; if another copy of the sandbox has
//! it open, this copy chats in a session of its own; if its agent fails, `chat-resume` tries again. `chat-resume
//! ID` notes the session it attaches.

use std::path::PathBuf;
use std::sync::Arc;

use bevy::prelude::*;
use bevy_agent_tools::session::{AgentSession, AgentSessions, Attached, PermissionPolicy, SessionConfig, StopReason};
use bevy_agent_tools::{
    AgentRuntime, ChatError, ChatMessage, ConversationEvent, ConversationStatusChanged, ErrorCode, PermissionRequested,
    PermissionSettled, ToolError,
};
use parking_lot::Mutex;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::console::{say, ChatCommand, ChatRequest, ChatStatus};

/// What the command line asked for.
pub struct ChatPlugin {
    /// The session to create: its backend, and the flags (`--agent-keep`, `--ask-permissions`) already applied.
    pub config: SessionConfig,
    /// With `--agent-keep`: where the kept session is noted, to re-attach it at the next start.
    pub kept: Option<PathBuf>,
}

/// The note of the kept session: its id, and the configuration it was created with.
#[derive(serde::Serialize, serde::Deserialize)]
struct KeptNote {
    session: String,
    config: SessionConfig,
}

/// The session's configuration for an ACP agent's command line, and the sign-in method `--agent-auth` chose.
pub fn acp_config(agent: &[String], auth_method: Option<&str>) -> Option<SessionConfig> {
    let (program, args) = agent.split_first()?;
    let config = SessionConfig::acp(program, args.iter().cloned()).system_prompt(
        "You are in a voxel sandbox game. Act through the game's MCP tools (server `game`); the player reads your \
         messages in the game (its console, or its chat panel in a window).",
    );
    Some(match auth_method {
        Some(method) => config.auth_method(method),
        None => config,
    })
}

/// Applies `--agent-keep` (the session survives the game's exit, re-attached at the next start) and
/// `--ask-permissions` (the player answers the agent's permission requests).
pub fn with_flags(config: SessionConfig, keep: bool, ask: bool) -> SessionConfig {
    let config = config.auto_end_on_disconnect(!keep);
    if ask {
        config.permissions(PermissionPolicy::AskPlayer)
    } else {
        config
    }
}

/// The player's session, shared by the command task and the systems.
#[derive(Resource, Clone)]
struct Chat {
    commands: UnboundedSender<ChatCommand>,
    /// The command task's answers, for [`ChatAnswered`].
    answers: crossbeam_channel::Receiver<ChatAnswered>,
}

/// What the chat task answered to one of the player's commands (the console prints it as `ok ...` or
/// `error: ...`): the window's chat panel shows a text that was not sent.
#[derive(Message, Clone, Debug)]
#[cfg_attr(not(feature = "window"), allow(dead_code))] // Read by the window only.
pub struct ChatAnswered {
    pub command: ChatCommand,
    /// `CODE message` when refused.
    pub answer: Result<String, String>,
}

impl Plugin for ChatPlugin {
    fn build(&self, app: &mut App) {
        let config = self.config.clone();
        let kept = self.kept.clone();
        let sessions = app.world().resource::<AgentSessions>().clone();
        let runtime = app.world().resource::<AgentRuntime>().handle().clone();
        let (commands, inbox) = unbounded_channel();
        let (answered, answers) = crossbeam_channel::unbounded();
        let current = Arc::new(Mutex::new(None));
        let opening = Opening { sessions, config, kept };
        runtime.spawn(run(opening, inbox, current.clone(), answered));
        app.insert_resource(ChatStatus(Some(Arc::new(status_of(current)))))
            .insert_resource(Chat { commands, answers })
            .add_message::<ChatAnswered>()
            .add_systems(Update, forward_commands)
            .add_systems(PostUpdate, (print_chat, publish_answers).after(bevy_agent_tools::AgentToolsSystems::Pump));
    }
}

fn publish_answers(chat: Res<Chat>, mut answered: MessageWriter<ChatAnswered>) {
    answered.write_batch(chat.answers.try_iter());
}

fn forward_commands(mut requests: MessageReader<ChatRequest>, chat: Res<Chat>) {
    for ChatRequest(command) in requests.read() {
        let _ = chat.commands.send(command.clone());
    }
}

/// What opens the player's session: the sessions, the configuration, and where a kept one is noted.
#[derive(Clone)]
struct Opening {
    sessions: AgentSessions,
    config: SessionConfig,
    kept: Option<PathBuf>,
}

/// Opens the session (re-attaching the kept one, with `--agent-keep`), then handles the player's commands in
/// order.
async fn run(
    opening: Opening,
    mut inbox: UnboundedReceiver<ChatCommand>,
    current: Arc<Mutex<Option<AgentSession>>>,
    answered: crossbeam_channel::Sender<ChatAnswered>,
) {
    let sessions = opening.sessions.clone();
    // An agent can take a while to start (`npx` fetching it, a sign-in): commands typed meanwhile wait for it.
    say("chat-starting");
    // The window's chat panel shows the outcome too (it has no console line to point at).
    let started = reattach_kept(&opening, &current).await.map_err(|error| {
        say(format_args!(
            "chat-error session=none scope=session code={} message={}",
            error.code,
            one_line(&error.message)
        ));
        format!("the agent did not start: {} {}", error.code, one_line(&error.message))
    });
    let _ = answered.send(ChatAnswered { command: ChatCommand::Resume(None), answer: started });
    while let Some(command) = inbox.recv().await {
        let asked = command.clone();
        let session = current.lock().clone();
        let answer = match (command, session) {
            (ChatCommand::Resume(Some(id)), previous) => match sessions.resume_session(id).await {
                Ok(session) => {
                    let mut answer = format!("attached session={} status={}", session.id(), session.status());
                    note_kept(&opening, session.id().as_str()).await;
                    *current.lock() = Some(session.clone());
                    // The session it replaces ends (its agent stops; a kept one stays on disk, ended).
                    if let Some(previous) = previous.filter(|previous| previous.id() != session.id()) {
                        previous.end().await;
                        answer.push_str(&format!(" ended={}", previous.id()));
                    }
                    Ok(answer)
                }
                Err(error) => Err(error),
            },
            (ChatCommand::Forget(id), current_session) => match sessions.forget(id.as_str()).await {
                Ok(()) => {
                    if current_session.is_some_and(|session| session.id().as_str() == id) {
                        *current.lock() = None;
                    }
                    Ok(format!("forgot session={id}"))
                }
                Err(error) => Err(error),
            },
            (ChatCommand::Allow(request), _) => answer_permission(&sessions, request, true),
            (ChatCommand::Deny(request), _) => answer_permission(&sessions, request, false),
            // The agent failed to start (a slow first `npx`, a missing key fixed since): try again.
            (ChatCommand::Resume(None), None) => reattach_kept(&opening, &current).await,
            (_, None) => Err(ToolError::with_code(
                ErrorCode::AgentUnavailable,
                "there is no agent session: it failed to start (see the chat-error line) or was forgotten; \
                 chat-resume starts one",
            )),
            (ChatCommand::Say(text), Some(session)) => match session.start_turn(text).await {
                Ok(turn) => {
                    // The outcome shows as chat lines; a failure also as a chat-error line; a turn cut short (a
                    // limit, a refusal) also says why, or its reply would just stop.
                    let id = session.id().clone();
                    tokio::spawn(async move {
                        let stop = turn.await.ok().map(|end| end.stop_reason);
                        if let Some(stop) =
                            stop.filter(|stop| !matches!(stop, StopReason::EndTurn | StopReason::Cancelled))
                        {
                            say(format_args!("chat-turn-ended session={id} stop={}", stop.as_str()));
                        }
                    });
                    Ok("sent".to_string())
                }
                Err(error) => Err(error),
            },
            (ChatCommand::Cancel, Some(session)) => {
                if session.cancel() {
                    Ok("cancelling the turn".into())
                } else {
                    Err(ToolError::new("NO_TURN", "no turn is running"))
                }
            }
            (ChatCommand::End, Some(session)) => {
                session.end().await;
                Ok(format!("ended session={}", session.id()))
            }
            (ChatCommand::Resume(None), Some(session)) => match session.resume().await {
                Ok(Attached::Replaced) => Ok(format!(
                    "resumed session={} in a new agent session: the agent could not re-attach the old one",
                    session.id()
                )),
                Ok(_) => Ok(format!("resumed session={}", session.id())),
                Err(error) => Err(error),
            },
        };
        let answer = match answer {
            Ok(answer) => {
                say(format_args!("ok {answer}"));
                Ok(answer)
            }
            Err(error) => {
                let why = format!("{} {}", error.code, one_line(&error.message));
                say(format_args!("error: {why}"));
                Err(why)
            }
        };
        let _ = answered.send(ChatAnswered { command: asked, answer });
    }
}

/// Re-attaches the session the last run with the same configuration kept, if there is one and it can be;
/// otherwise [`start`]s one.
async fn reattach_kept(opening: &Opening, current: &Mutex<Option<AgentSession>>) -> Result<String, ToolError> {
    let note = read_note(opening.kept.clone()).await.filter(|note| note.config == opening.config);
    if let Some(KeptNote { session: id, .. }) = note {
        match opening.sessions.resume_session(id.as_str()).await {
            Ok(session) => {
                let status = session.status();
                say(format_args!("chat-status session={} status={status} previous=none", session.id()));
                *current.lock() = Some(session);
                // The window's panel shows it: a kept session ended before the restart is still ended.
                return Ok(format!("attached session={id} status={status}"));
            }
            // Gone (forgotten, or its agent no longer knows it): a new one is kept in its place.
            Err(error) if error.code == ErrorCode::SessionNotFound => {
                warn!(session = %id, %error, "the kept session is gone: starting anew");
            }
            // Open in another copy of the sandbox: this copy chats in a session of its own, not noted, and not
            // kept (nothing would name it after).
            Err(error) if error.code == ErrorCode::SessionBusy => {
                warn!(session = %id, %error, "the kept session is open elsewhere: starting one for this copy");
                let unkept = Opening { config: opening.config.clone().auto_end_on_disconnect(true), ..opening.clone() };
                return start(&unkept, current, false).await;
            }
            // The agent's own trouble: the kept session stays, for `chat-resume` to try again.
            Err(error) => return Err(error),
        }
    }
    start(opening, current, true).await
}

/// Creates the session the command line asked for and makes it the current one (with `--agent-keep` and `note`,
/// noted as the kept one).
async fn start(opening: &Opening, current: &Mutex<Option<AgentSession>>, note: bool) -> Result<String, ToolError> {
    let session = opening.sessions.create(opening.config.clone()).await?;
    say(format_args!("chat-status session={} status=idle previous=none", session.id()));
    if note {
        note_kept(opening, session.id().as_str()).await;
    }
    let started = format!("started session={}", session.id());
    *current.lock() = Some(session);
    Ok(started)
}

/// With `--agent-keep`, notes session `id` as the one the next start re-attaches (written aside, then renamed
/// over the last note: a crash leaves one or the other). On a blocking thread: the crate's workers this runs on
/// must not wait for a disk.
async fn note_kept(opening: &Opening, id: &str) {
    let Some(path) = opening.kept.clone() else { return };
    let note = KeptNote { session: id.to_string(), config: opening.config.clone() };
    let shown = path.display().to_string();
    let written = tokio::task::spawn_blocking(move || {
        let aside = path.with_extension(format!("json.{}.new", std::process::id()));
        let bytes = serde_json::to_vec_pretty(&note).map_err(std::io::Error::other)?;
        std::fs::write(&aside, bytes)?;
        std::fs::rename(&aside, &path)
    })
    .await
    .unwrap_or_else(|stopped| Err(std::io::Error::other(stopped)));
    if let Err(error) = written {
        warn!(path = %shown, %error, "could not note the kept session: the next start makes a new one");
    }
}

/// The kept session's note, if there is a readable one (read on a blocking thread, as [`note_kept`] writes it).
async fn read_note(path: Option<PathBuf>) -> Option<KeptNote> {
    let path = path?;
    let bytes = tokio::task::spawn_blocking({
        let path = path.clone();
        move || std::fs::read(path)
    })
    .await
    .ok()?
    .ok()?;
    serde_json::from_slice(&bytes).map_err(|error| warn!(path = %path.display(), %error, "unreadable note")).ok()
}

fn answer_permission(sessions: &AgentSessions, request: u64, allow: bool) -> Result<String, ToolError> {
    if sessions.answer_permission(request, allow) {
        Ok(format!("{} request={request}", if allow { "allowed" } else { "denied" }))
    } else {
        Err(ToolError::new("NO_REQUEST", format!("no permission request {request} is waiting")))
    }
}

/// `text` as a JSON string, on one line: its quotes escaped, and every control character (JSON escapes only those
/// below U+0020; DEL and the C1 controls, such as U+009B, move a terminal's cursor too) as `\uXXXX`.
fn quoted(text: &str) -> String {
    let json = serde_json::Value::String(text.to_string()).to_string();
    let mut quoted = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            c if c.is_control() => quoted.push_str(&format!("\\u{:04x}", c as u32)),
            c => quoted.push(c),
        }
    }
    quoted
}

/// `text` on one line, as the console prints an agent's words: line breaks as `\n` and `\r`, and every other control
/// character escaped too (an agent's text or its stderr tail could otherwise move the cursor, clear the screen or
/// print a line that looks like the game's own).
pub fn one_line(text: &str) -> String {
    let mut line = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => line.push_str("\\n"),
            '\r' => line.push_str("\\r"),
            c if c.is_control() => line.extend(c.escape_unicode()),
            c => line.push(c),
        }
    }
    line
}

/// Prints the sessions' events as lines, in their conversation's order (the messages of one frame are sorted
/// by sequence number: each kind of message is its own queue).
fn print_chat(
    sessions: Res<AgentSessions>,
    mut statuses: MessageReader<ConversationStatusChanged>,
    mut messages: MessageReader<ChatMessage>,
    mut errors: MessageReader<ChatError>,
    mut permissions: MessageReader<PermissionRequested>,
    mut settled: MessageReader<PermissionSettled>,
) {
    let mut events: Vec<ConversationEvent> = Vec::new();
    events.extend(
        statuses.read().filter(|s| sessions.get(&s.conversation).is_some()).cloned().map(ConversationEvent::Status),
    );
    events.extend(messages.read().cloned().map(ConversationEvent::ChatMessage));
    events.extend(errors.read().cloned().map(ConversationEvent::ChatError));
    events.extend(permissions.read().cloned().map(ConversationEvent::PermissionRequested));
    events.extend(settled.read().cloned().map(ConversationEvent::PermissionSettled));
    events.sort_by(|a, b| (a.conversation(), a.sequence()).cmp(&(b.conversation(), b.sequence())));
    for event in events {
        match event {
            ConversationEvent::Status(s) => {
                say(format_args!("chat-status session={} status={} previous={}", s.conversation, s.status, s.previous))
            }
            ConversationEvent::ChatMessage(m) => say(format_args!("chat session={}: {}", m.session, one_line(&m.text))),
            ConversationEvent::ChatError(e) => {
                let (session, scope, code, message) = (&e.session, e.scope, &e.code, one_line(&e.message));
                say(format_args!("chat-error session={session} scope={scope} code={code} message={message}"))
            }
            ConversationEvent::PermissionRequested(p) => {
                // The action's kind, input (a shell command) and details (the files and changes it names), when
                // the agent sent them: the input and the details' JSON quoted as JSON strings, as they may hold
                // spaces; the title last, running to the line's end.
                let kind = p.kind.as_deref().map(|kind| format!(" kind={}", one_line(kind))).unwrap_or_default();
                let input = p.input.as_deref().map(|input| format!(" input={}", quoted(input))).unwrap_or_default();
                let details = match serde_json::to_string(&p.details) {
                    Ok(json) if !p.details.is_empty() => format!(" details={}", quoted(&json)),
                    _ => String::new(),
                };
                say(format_args!(
                    "chat-permission session={} request={}{kind}{input}{details} tool={}",
                    p.session,
                    p.request,
                    one_line(&p.tool)
                ))
            }
            ConversationEvent::PermissionSettled(p) => say(format_args!(
                "chat-permission-settled session={} request={} outcome={}",
                p.session, p.request, p.outcome
            )),
            _ => {}
        }
    }
}

/// `status`'s chat part, read when it is asked for (so it says what a command answered before it left: after
/// `ok forgot`, no session): the current session, its status and usage.
fn status_of(current: Arc<Mutex<Option<AgentSession>>>) -> impl Fn() -> Option<String> + Send + Sync {
    move || {
        let session = current.lock().clone()?;
        let usage = match session.usage() {
            Some(usage) => format!("{}/{}", usage.used_tokens, usage.context_tokens),
            None => "none".into(),
        };
        Some(format!("chat={} chat-status={} usage={usage}", session.id(), session.status()))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_agents_words_reach_the_console_on_one_line_with_no_control_character_left() {
        let said = "done\r\nok quitting\u{1b}[2J\u{7}";
        assert_eq!(super::one_line(said), "done\\r\\nok quitting\\u{1b}[2J\\u{7}");
    }

    #[test]
    fn a_permission_prompts_input_reaches_the_console_as_a_json_string_with_no_control_character_left() {
        let input = "{\"command\":\"rm -rf /\"}\n\u{7f}\u{9b}2J";
        let quoted = super::quoted(input);
        assert_eq!(quoted, r#""{\"command\":\"rm -rf /\"}\n\u007f\u009b2J""#);
        let read: String = serde_json::from_str(&quoted).expect("a JSON string");
        assert_eq!(read, input, "read back as it was sent");
    }
}
