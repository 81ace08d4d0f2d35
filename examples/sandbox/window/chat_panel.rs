//! The chat panel: T opens it, typing fills the input line, Enter sends it to the in-game agent (the same
//! `say` the console has), Ctrl+C cancels the agent's turn, Ctrl+R resumes a session that failed or ended, Esc
//! closes the panel. The agent's replies stream in as they arrive; its status shows on top. A permission request
//! shows the panel without taking the keyboard (the player may be walking): Y allows and N denies while the input
//! line is empty or the panel does not have the keyboard (a prompt that arrives mid-sentence never takes its letters: send or clear the line, then answer;
//! a held key answers one prompt, not every one queued; several wait in the order asked), and the transcript says
//! what became of it once the agent is told (allowed, denied, or timed out if the answer came too late). A text
//! the agent refused (its turn still running, the session ended or failed) says so, and goes back to the input
//! line to be sent again.
//!
//! Bevy's default font has ASCII only: the window puts Fira Mono in its place (Latin, Greek, Cyrillic and their
//! punctuation: an agent's dashes and curly quotes); a game whose players write other scripts gives the panel a
//! font that has them (and turns on `Window::ime_enabled` for input methods).

use std::collections::VecDeque;

use bevy::ecs::system::SystemParam;
use bevy::input::keyboard::{Key, KeyboardInput};
use bevy::prelude::*;
use bevy_agent_tools::session::AgentSessions;
use bevy_agent_tools::{
    ChatDelta, ChatError, ChatErrorScope, ChatMessage, ConversationStatusChanged, PermissionDetail,
    PermissionRequested, PermissionSettled,
};

use super::Focus;
use crate::chat::ChatAnswered;
use crate::console::{ChatCommand, ChatRequest};

/// How many lines of conversation the panel keeps.
const LINES: usize = 14;
/// The most characters of one line of the transcript shown (a long reply, an agent's error with its stderr), so
/// that the panel stays on the screen; the reply streaming in shows its last ones.
const SHOWN_PER_LINE: usize = 400;
/// The longest message the input line takes.
const MAX_INPUT: usize = 2000;

/// What the panel shows.
#[derive(Resource, Default)]
pub struct ChatPanel {
    input: String,
    transcript: VecDeque<String>,
    /// The agent message being streamed: its id and the text so far.
    streaming: Option<(String, String)>,
    status: Option<String>,
    /// The player's session, once the chat task said which (started, re-attached, or resumed by id): only its
    /// status is shown (another one's, as the one it replaced ending, is not).
    session: Option<String>,
    /// The permission requests waiting for the player, in the order asked: number and tool. The first is shown.
    asking: VecDeque<(u64, String)>,
    /// Those the player answered, until they are settled (the transcript then says what the agent was told).
    answered: Vec<(u64, String)>,
}

/// The panel's node and text.
#[derive(Component)]
pub struct ChatPanelNode;
#[derive(Component)]
pub struct ChatPanelText;

pub fn setup(mut commands: Commands) {
    commands
        .spawn((
            ChatPanelNode,
            Node {
                position_type: PositionType::Absolute,
                bottom: px(8),
                right: px(8),
                width: px(520),
                padding: UiRect::all(px(8)),
                ..default()
            },
            BackgroundColor(Color::srgba(0.02, 0.02, 0.08, 0.75)),
            Visibility::Hidden,
        ))
        .with_children(|panel| {
            panel.spawn((ChatPanelText, Text::new(""), TextFont { font_size: FontSize::Px(15.0), ..default() }));
        });
}

/// Keys: T opens the panel; while it is open, typing, Backspace, Enter (send), Ctrl+C (cancel the turn), Ctrl+R
/// (resume) and Esc (close); Y and N answer a permission prompt while the input line is empty.
pub fn type_keys(
    mut keys: MessageReader<KeyboardInput>,
    held: Res<ButtonInput<KeyCode>>,
    mut focus: ResMut<Focus>,
    mut panel: ResMut<ChatPanel>,
    mut requests: MessageWriter<ChatRequest>,
    agents: Option<Res<AgentSessions>>,
) {
    // On a copy: `Focus` is marked changed only when it changed (the Esc that leaves the world looks for that).
    let mut now = *focus;
    // Ctrl as it was before this frame's keys (`held` has them all already), then as each of them leaves it.
    let controls = [KeyCode::ControlLeft, KeyCode::ControlRight];
    let mut ctrl = controls.iter().any(|&c| held.pressed(c) && !held.just_pressed(c) || held.just_released(c));
    for key in keys.read() {
        if controls.contains(&key.key_code) {
            ctrl = key.state.is_pressed();
            continue;
        }
        if !key.state.is_pressed() {
            continue;
        }
        let press = Press { key: &key.logical_key, code: key.key_code, repeat: key.repeat, ctrl };
        if let Some(command) = panel.press(press, &mut now, agents.is_some()) {
            requests.write(ChatRequest(command));
        }
    }
    focus.set_if_neq(now);
}

/// One key pressed: which, whether the key is held (a repeat), and whether Ctrl is.
struct Press<'a> {
    key: &'a Key,
    code: KeyCode,
    repeat: bool,
    ctrl: bool,
}

/// What the chat module answered to the panel's texts: a refused one says so.
pub fn read_answers(mut panel: ResMut<ChatPanel>, mut answers: MessageReader<ChatAnswered>) {
    for answered in answers.read() {
        panel.answered(answered);
    }
}

/// The messages the panel shows.
#[derive(SystemParam)]
pub struct ChatReaders<'w, 's> {
    deltas: MessageReader<'w, 's, ChatDelta>,
    messages: MessageReader<'w, 's, ChatMessage>,
    errors: MessageReader<'w, 's, ChatError>,
    permissions: MessageReader<'w, 's, PermissionRequested>,
    settled: MessageReader<'w, 's, PermissionSettled>,
    statuses: MessageReader<'w, 's, ConversationStatusChanged>,
}

/// One event the panel shows.
enum PanelEvent {
    Delta(ChatDelta),
    Message(ChatMessage),
    Error(ChatError),
    Permission(PermissionRequested),
    Settled(PermissionSettled),
    Status(ConversationStatusChanged),
}

/// The in-game sessions' events, in their conversation's order.
pub fn read_messages(mut panel: ResMut<ChatPanel>, agents: Option<Res<AgentSessions>>, mut read: ChatReaders) {
    let ChatReaders { deltas, messages, errors, permissions, settled, statuses } = &mut read;
    let Some(agents) = agents else { return };
    let mut events: Vec<(u64, PanelEvent)> = Vec::new();
    events.extend(deltas.read().map(|m| (m.sequence, PanelEvent::Delta(m.clone()))));
    events.extend(messages.read().map(|m| (m.sequence, PanelEvent::Message(m.clone()))));
    events.extend(errors.read().map(|m| (m.sequence, PanelEvent::Error(m.clone()))));
    events.extend(permissions.read().map(|m| (m.sequence, PanelEvent::Permission(m.clone()))));
    events.extend(settled.read().map(|m| (m.sequence, PanelEvent::Settled(m.clone()))));
    events.extend(
        statuses
            .read()
            .filter(|m| agents.get(&m.conversation).is_some())
            .map(|m| (m.sequence, PanelEvent::Status(m.clone()))),
    );
    events.sort_by_key(|(sequence, _)| *sequence);
    for (_, event) in events {
        panel.apply(event);
    }
}

/// Shows the panel while it is open (or asking), with its text.
pub fn draw(
    panel: Res<ChatPanel>,
    focus: Res<Focus>,
    mut node: Query<&mut Visibility, With<ChatPanelNode>>,
    mut text: Query<&mut Text, With<ChatPanelText>>,
) {
    if !panel.is_changed() && !focus.is_changed() {
        return;
    }
    if let Ok(mut visibility) = node.single_mut() {
        let open = *focus == Focus::Chat || !panel.asking.is_empty();
        *visibility = if open { Visibility::Visible } else { Visibility::Hidden };
    }
    if let Ok(mut text) = text.single_mut() {
        text.0 = panel.render(*focus == Focus::Chat);
    }
}

impl ChatPanel {
    /// One key press: the command it sends, if any. A waiting prompt takes Y and N while the input line is
    /// empty (or the panel is closed), not from a held key; otherwise they are letters of the line.
    fn press(&mut self, press: Press, focus: &mut Focus, agent: bool) -> Option<ChatCommand> {
        let Press { key, code, repeat, ctrl } = press;
        let answers = self.input.is_empty() || *focus != Focus::Chat;
        if let (true, Some((request, tool))) = (answers, self.asking.front().cloned()) {
            // The letter typed while the panel has the keyboard; else the key where Y and N are (the game's own
            // keys go by where they are too: on another layout, the letter Y may be on a key the game uses).
            let answer = match (key, *focus) {
                (Key::Character(c), Focus::Chat) if c.eq_ignore_ascii_case("y") => Some(true),
                (Key::Character(c), Focus::Chat) if c.eq_ignore_ascii_case("n") => Some(false),
                (_, elsewhere) if elsewhere != Focus::Chat && code == KeyCode::KeyY => Some(true),
                (_, elsewhere) if elsewhere != Focus::Chat && code == KeyCode::KeyN => Some(false),
                _ => None,
            };
            if let Some(allow) = answer {
                if repeat {
                    return None;
                }
                // What the agent is told shows when it is settled: a late answer is a denial (timed out).
                self.asking.pop_front();
                self.answered.push((request, tool));
                return Some(if allow { ChatCommand::Allow(request) } else { ChatCommand::Deny(request) });
            }
        }
        match *focus {
            Focus::Chat if ctrl && matches!(code, KeyCode::KeyC | KeyCode::KeyR) => {
                return match code {
                    _ if repeat || !agent => None,
                    KeyCode::KeyC => Some(ChatCommand::Cancel),
                    _ => Some(ChatCommand::Resume(None)),
                };
            }
            Focus::World if code == KeyCode::KeyT => {
                *focus = Focus::Chat;
                if !agent {
                    self.status = Some(
                        "no agent: start the sandbox with --agent \"COMMAND ARGS\" or --agent-openai URL --model NAME"
                            .into(),
                    );
                }
            }
            Focus::Chat => match key {
                Key::Escape => *focus = Focus::World,
                Key::Enter => {
                    let text = std::mem::take(&mut self.input);
                    if !text.trim().is_empty() && agent {
                        self.push(format!("you: {text}"));
                        return Some(ChatCommand::Say(text));
                    }
                }
                Key::Backspace => {
                    self.input.pop();
                }
                Key::Space if self.input.len() < MAX_INPUT => self.input.push(' '),
                Key::Character(c) if self.input.len() + c.len() <= MAX_INPUT => {
                    self.input.extend(c.chars().filter(|c| !c.is_control()));
                }
                _ => {}
            },
            _ => {}
        }
        None
    }

    /// A refused text says so after the player's line; an agent that could not start (or resume) says why; a
    /// session started or attached becomes the one whose status is shown, and one forgotten is no longer shown.
    fn answered(&mut self, answered: &ChatAnswered) {
        let field =
            |answer: &str, name: &str| answer.split(' ').find_map(|word| word.strip_prefix(name).map(str::to_string));
        match (&answered.command, &answered.answer) {
            (ChatCommand::Say(text), Err(why)) => {
                self.push(format!("[not sent: {why}]"));
                // Back in the line, to send again once the turn has ended (unless the player typed on).
                if self.input.is_empty() {
                    self.input.clone_from(text);
                }
            }
            (ChatCommand::Resume(_) | ChatCommand::Cancel, Err(why)) => self.push(format!("[{why}]")),
            (ChatCommand::Resume(_), Ok(answer)) => {
                if let Some(session) = field(answer, "session=") {
                    let status = field(answer, "status=").unwrap_or_else(|| "idle".into());
                    self.status = Some(format!("{session} {status}"));
                    self.session = Some(session);
                }
            }
            (ChatCommand::Forget(id), Ok(_)) if self.session.as_ref() == Some(id) => {
                self.session = None;
                self.status = Some(format!("{id} forgotten"));
            }
            _ => {}
        }
    }

    /// Shows `event`.
    fn apply(&mut self, event: PanelEvent) {
        match event {
            PanelEvent::Delta(d) => match &mut self.streaming {
                Some((id, text)) if *id == d.message => text.push_str(&d.text),
                _ => self.streaming = Some((d.message, d.text)),
            },
            PanelEvent::Message(m) => {
                self.streaming = None;
                self.push(format!("agent: {}", m.text));
            }
            // What the player can do next: resume a failed session, or go on.
            PanelEvent::Error(e) => {
                self.streaming = None;
                self.push(match e.scope {
                    ChatErrorScope::Session => format!("error {}: {} (Ctrl+R resumes)", e.code, e.message),
                    ChatErrorScope::Turn => format!("error {}: {} (the turn ended)", e.code, e.message),
                    ChatErrorScope::Notice => format!("notice {}: {}", e.code, e.message),
                });
            }
            // Cut, as a line of the transcript is: the keys that answer it stay on the screen.
            PanelEvent::Permission(p) => self.asking.push_back((p.request, shown(action(&p)))),
            // Answered, or settled without the player's key (timed out, withdrawn with its turn): the prompt goes,
            // saying what the agent was told.
            PanelEvent::Settled(s) => {
                let tool = match self.asking.iter().position(|(request, _)| *request == s.request) {
                    Some(at) => self.asking.remove(at).map(|(_, tool)| tool),
                    None => self.answered.iter().position(|(request, _)| *request == s.request).map(|at| {
                        let (_, tool) = self.answered.swap_remove(at);
                        tool
                    }),
                };
                if let Some(tool) = tool {
                    self.push(format!("[{tool}: {}]", s.outcome));
                }
            }
            PanelEvent::Status(s) => {
                if self.session.as_ref().is_none_or(|session| session == s.conversation.as_str()) {
                    self.status = Some(format!("{} {}", s.conversation, s.status));
                }
            }
        }
    }

    fn push(&mut self, line: String) {
        self.transcript.push_back(shown(line));
        // At most LINES lines, and about as many rows on the screen (a row holds about 56 characters).
        let rows = |line: &String| line.chars().count().div_ceil(56).max(1) + line.matches('\n').count();
        while self.transcript.len() > LINES || self.transcript.iter().map(rows).sum::<usize>() > 2 * LINES {
            if self.transcript.len() == 1 {
                break;
            }
            self.transcript.pop_front();
        }
    }

    /// The panel's text: status, transcript, the reply streaming in, the prompt, and the input line while the
    /// panel has the keyboard (`focused`).
    pub fn render(&self, focused: bool) -> String {
        let mut lines = vec![format!("chat  {}", self.status.as_deref().unwrap_or("(no session yet)"))];
        lines.extend(self.transcript.iter().cloned());
        if let Some((_, text)) = &self.streaming {
            let chars = text.chars().count();
            let shown: String = text.chars().skip(chars.saturating_sub(SHOWN_PER_LINE)).collect();
            let cut = if chars > SHOWN_PER_LINE { "…" } else { "" };
            lines.push(format!("agent: {cut}{shown}…"));
        }
        if let Some((request, tool)) = self.asking.front() {
            let more = match self.asking.len() - 1 {
                0 => String::new(),
                n => format!(" ({n} more waiting)"),
            };
            let first = if self.input.is_empty() || !focused { "" } else { " (send or clear your line first)" };
            lines.push(format!("the agent asks to use {tool} (request {request}): Y allow, N deny{first}{more}"));
        }
        match focused {
            true => lines.push(format!(
                "> {}_   (Enter: send, Ctrl+C: cancel the turn, Ctrl+R: resume, Esc: close)",
                self.input
            )),
            false => lines.push("(T: chat)".into()),
        }
        lines.join("\n")
    }
}

/// What the prompt shows beside the action's title, which alone may not say what the player allows: the changes to
/// files the agent sent (an edit's diff reads better than its arguments: the first line it changes, as the file
/// had it and as it would have it), else what the action takes (a command).
fn action(p: &PermissionRequested) -> String {
    let diffs: Vec<String> = p
        .details
        .iter()
        .filter_map(|detail| match detail {
            PermissionDetail::Diff { path, old_text: Some(old), new_text } => {
                let (line, was, would_be) = first_change(old, new_text);
                Some(format!("{path}:{line}: - {was} + {would_be}"))
            }
            PermissionDetail::Diff { path, old_text: None, new_text } => {
                Some(format!("{path} (new): + {}", new_text.lines().next().unwrap_or("")))
            }
            _ => None,
        })
        .collect();
    match (&p.input, diffs.is_empty()) {
        (_, false) => format!("{} [{}]", p.tool, diffs.join("; ")),
        (Some(input), true) => format!("{} {input}", p.tool),
        (None, true) => p.tool.clone(),
    }
}

/// `line` as the panel shows it: at most [`SHOWN_PER_LINE`] characters, a cut marked with `…`.
fn shown(mut line: String) -> String {
    if let Some((cut, _)) = line.char_indices().nth(SHOWN_PER_LINE) {
        line.truncate(cut);
        line.push('…');
    }
    line
}

/// The first line (1-based) where `new` differs from `old`, as each has it (empty where one has no such line).
fn first_change<'a>(old: &'a str, new: &'a str) -> (usize, &'a str, &'a str) {
    let (mut old_lines, mut new_lines) = (old.lines(), new.lines());
    let mut line = 1;
    loop {
        match (old_lines.next(), new_lines.next()) {
            (Some(was), Some(would_be)) if was == would_be => line += 1,
            (was, would_be) => return (line, was.unwrap_or(""), would_be.unwrap_or("")),
        }
    }
}

#[cfg(test)]
mod tests {
    use bevy_agent_tools::{ConversationId, ConversationStatus, PermissionOutcome};

    use super::*;

    fn asked(request: u64, tool: &str) -> PanelEvent {
        let session = ConversationId::new("chat-1");
        PanelEvent::Permission(PermissionRequested {
            session,
            request,
            tool: tool.into(),
            kind: None,
            input: None,
            details: Vec::new(),
            sequence: request,
        })
    }

    fn settled(request: u64, outcome: PermissionOutcome) -> PanelEvent {
        let session = ConversationId::new("chat-1");
        PanelEvent::Settled(PermissionSettled { session, request, outcome, sequence: request + 10 })
    }

    #[test]
    fn a_prompt_shows_the_changes_an_edit_would_make_rather_than_its_arguments() {
        let mut panel = ChatPanel::default();
        let PanelEvent::Permission(mut edit) = asked(1, "Edit notes.txt") else { unreachable!() };
        edit.input = Some(r#"{"file_path":"/w/notes.txt","old_string":"a","new_string":"b"}"#.into());
        edit.details = vec![
            PermissionDetail::Location { path: "/w/notes.txt".into(), line: Some(3) },
            PermissionDetail::Diff {
                path: "/w/notes.txt".into(),
                old_text: Some("use std::io;\ntwo\nthree".into()),
                new_text: "use std::io;\n2\nthree".into(),
            },
            PermissionDetail::Diff { path: "/w/new.txt".into(), old_text: None, new_text: "hello".into() },
        ];
        panel.apply(PanelEvent::Permission(edit));
        let text = panel.render(false);
        assert!(
            text.contains("Edit notes.txt [/w/notes.txt:2: - two + 2; /w/new.txt (new): + hello] (request 1)"),
            "{text}"
        );
        assert!(!text.contains("old_string"), "the diff instead of the arguments: {text}");
        // Without a diff, the input, as before.
        panel.apply(settled(1, PermissionOutcome::Allowed));
        let PanelEvent::Permission(mut run) = asked(2, "run") else { unreachable!() };
        run.input = Some(r#"{"command":"make"}"#.into());
        panel.apply(PanelEvent::Permission(run));
        assert!(panel.render(false).contains(r#"run {"command":"make"} (request 2)"#));
        // A long one is cut, keeping the keys that answer it on the screen.
        panel.apply(settled(2, PermissionOutcome::Denied));
        let PanelEvent::Permission(mut long) = asked(3, "run") else { unreachable!() };
        long.input = Some("x".repeat(3 * SHOWN_PER_LINE));
        panel.apply(PanelEvent::Permission(long));
        let text = panel.render(false);
        let prompt = text.lines().find(|line| line.contains("(request 3)")).expect("the prompt");
        assert!(prompt.contains("x… (request 3): Y allow, N deny") && prompt.len() < SHOWN_PER_LINE + 100, "{prompt}");
    }

    #[test]
    fn prompts_wait_in_the_order_asked_and_one_settled_without_a_key_leaves_the_panel() {
        let mut panel = ChatPanel::default();
        panel.apply(asked(1, "run tests"));
        panel.apply(asked(2, "edit files"));
        assert!(panel.render(true).contains("run tests (request 1): Y allow, N deny (1 more waiting)"));

        // The first timed out: the second is shown, and the transcript says what became of the first.
        panel.apply(settled(1, PermissionOutcome::TimedOut));
        let text = panel.render(true);
        assert!(text.contains("[run tests: timed_out]"), "{text}");
        assert!(text.contains("edit files (request 2): Y allow, N deny") && !text.contains("more waiting"), "{text}");

        panel.apply(settled(2, PermissionOutcome::Withdrawn));
        let text = panel.render(true);
        assert!(text.contains("[edit files: withdrawn]") && !text.contains("Y allow"), "{text}");
        // A settlement of a prompt the player already answered (or never saw) changes nothing.
        panel.apply(settled(3, PermissionOutcome::Allowed));
        assert_eq!(panel.render(true), text);
    }

    fn typed(panel: &mut ChatPanel, focus: &mut Focus, text: &str) -> Vec<ChatCommand> {
        let keys = text.chars().map(|c| match c {
            ' ' => (Key::Space, KeyCode::Space),
            '\n' => (Key::Enter, KeyCode::Enter),
            c => (Key::Character(c.to_string().into()), KeyCode::KeyA),
        });
        keys.filter_map(|(key, code)| panel.press(Press { key: &key, code, repeat: false, ctrl: false }, focus, true))
            .collect()
    }

    #[test]
    fn a_prompt_that_arrives_mid_sentence_never_takes_its_letters_and_an_empty_line_answers_it() {
        let (mut panel, mut focus) = (ChatPanel::default(), Focus::Chat);
        assert!(typed(&mut panel, &mut focus, "build a ").is_empty());
        panel.apply(asked(7, "run tests"));
        assert!(typed(&mut panel, &mut focus, "yellow tower on sand").is_empty(), "no y or n answered it");
        assert!(panel.render(true).contains("> build a yellow tower on sand_"), "{}", panel.render(true));
        assert!(
            panel.render(true).contains("Y allow, N deny (send or clear your line first)"),
            "{}",
            panel.render(true)
        );
        let sent = typed(&mut panel, &mut focus, "\n");
        assert_eq!(sent, [ChatCommand::Say("build a yellow tower on sand".into())]);
        assert_eq!(typed(&mut panel, &mut focus, "n"), [ChatCommand::Deny(7)], "the empty line answers");
        panel.apply(settled(7, PermissionOutcome::Denied));
        assert!(panel.render(true).contains("[run tests: denied]"), "{}", panel.render(true));
    }

    #[test]
    fn a_held_key_answers_one_prompt_and_the_transcript_says_what_the_agent_was_told() {
        let (mut panel, mut focus) = (ChatPanel::default(), Focus::World);
        panel.apply(asked(1, "run tests"));
        panel.apply(asked(2, "edit files"));
        let y = Key::Character("y".into());
        let held = |repeat| Press { key: &y, code: KeyCode::KeyY, repeat, ctrl: false };
        assert_eq!(panel.press(held(false), &mut focus, true), Some(ChatCommand::Allow(1)));
        assert_eq!(panel.press(held(true), &mut focus, true), None, "the key's repeats answer nothing more");
        assert!(panel.render(false).contains("edit files (request 2): Y allow"), "{}", panel.render(false));
        // The answer came after the request timed out: the agent was told no.
        panel.apply(settled(1, PermissionOutcome::TimedOut));
        let text = panel.render(false);
        assert!(text.contains("[run tests: timed_out]") && !text.contains("allowed"), "{text}");
        assert_eq!(focus, Focus::World, "the prompt never took the keyboard");
    }

    #[test]
    fn ctrl_c_cancels_the_turn_and_ctrl_r_resumes_and_neither_types() {
        let (mut panel, mut focus) = (ChatPanel::default(), Focus::Chat);
        let (c, r) = (Key::Character("c".into()), Key::Character("r".into()));
        let ctrl = |key, code| Press { key, code, repeat: false, ctrl: true };
        assert_eq!(panel.press(ctrl(&c, KeyCode::KeyC), &mut focus, true), Some(ChatCommand::Cancel));
        assert_eq!(panel.press(ctrl(&r, KeyCode::KeyR), &mut focus, true), Some(ChatCommand::Resume(None)));
        assert!(panel.render(true).contains("> _"), "{}", panel.render(true));
        let held = |key, code| Press { key, code, repeat: true, ctrl: true };
        assert_eq!(panel.press(held(&c, KeyCode::KeyC), &mut focus, true), None, "a held Ctrl+C cancels once");
        typed(&mut panel, &mut focus, "hi");
        let sent = panel.press(ctrl(&Key::Enter, KeyCode::Enter), &mut focus, true);
        assert_eq!(sent, Some(ChatCommand::Say("hi".into())), "Ctrl does not take Enter");
    }

    #[test]
    fn the_transcript_keeps_to_about_as_many_rows_as_it_has_lines_and_the_newest_stays() {
        let mut panel = ChatPanel::default();
        for n in 0..10 {
            panel.push(format!("agent: {n} {}", "word ".repeat(100)));
        }
        let rows: usize = panel.transcript.iter().map(|line| line.chars().count().div_ceil(56)).sum();
        assert!(rows <= 2 * LINES, "{rows} rows");
        assert!(panel.transcript.back().is_some_and(|line| line.starts_with("agent: 9 ")));
    }

    /// The Esc that leaves the world (`keys::transitions`, next in the chain) only counts when the keys before it
    /// did not change where the keyboard goes: a key that leaves the focus as it was must not mark it changed.
    #[test]
    fn keys_that_leave_the_focus_as_it_was_do_not_mark_it_changed() {
        #[derive(Resource, Default)]
        struct Seen(Vec<bool>);
        let mut app = App::new();
        app.add_message::<KeyboardInput>()
            .add_message::<ChatRequest>()
            .init_resource::<Focus>()
            .init_resource::<ButtonInput<KeyCode>>()
            .init_resource::<ChatPanel>()
            .init_resource::<Seen>()
            .add_systems(
                Update,
                (type_keys, |focus: Res<Focus>, mut seen: ResMut<Seen>| seen.0.push(focus.is_changed())).chain(),
            );
        app.update();
        let mut press = |key: Key, key_code: KeyCode| {
            app.world_mut().write_message(KeyboardInput {
                key_code,
                logical_key: key,
                state: bevy::input::ButtonState::Pressed,
                text: None,
                repeat: false,
                window: Entity::PLACEHOLDER,
            });
            app.update();
            *app.world().resource::<Focus>()
        };
        assert_eq!(press(Key::Escape, KeyCode::Escape), Focus::World);
        assert_eq!(press(Key::Character("t".into()), KeyCode::KeyT), Focus::Chat);
        assert_eq!(press(Key::Escape, KeyCode::Escape), Focus::World);
        let seen = &app.world().resource::<Seen>().0;
        assert_eq!(seen[1..], [false, true, true], "changed when the panel opened and when Esc closed it, only");
    }

    #[test]
    fn a_text_the_agent_refused_says_so_in_the_transcript() {
        let (mut panel, mut focus) = (ChatPanel::default(), Focus::Chat);
        let sent = typed(&mut panel, &mut focus, "hello\n");
        let refused = "SESSION_BUSY turn 1 of session `chat-1` is still running".to_string();
        panel.answered(&ChatAnswered { command: sent[0].clone(), answer: Err(refused.clone()) });
        let text = panel.render(true);
        assert!(text.contains("you: hello") && text.contains(&format!("[not sent: {refused}]")), "{text}");
        assert!(text.contains("> hello_"), "back in the line, to send again: {text}");
        panel.answered(&ChatAnswered { command: ChatCommand::Say("again".into()), answer: Ok("sent".into()) });
        assert_eq!(panel.render(true), text, "a text that went says nothing more");
    }

    fn status(session: &str, status: ConversationStatus) -> PanelEvent {
        PanelEvent::Status(ConversationStatusChanged {
            conversation: ConversationId::new(session),
            previous: ConversationStatus::Idle,
            status,
            source: bevy_agent_tools::StatusSource::Host,
            sequence: 0,
        })
    }

    #[test]
    fn the_status_shown_is_the_players_session_from_its_start_and_not_the_one_it_replaced() {
        let mut panel = ChatPanel::default();
        let answer = |command: ChatCommand, answer: &str| ChatAnswered { command, answer: Ok(answer.into()) };
        // Started: idle at once, not "no session" until the first text.
        panel.answered(&answer(ChatCommand::Resume(None), "started session=chat-1"));
        assert!(panel.render(true).starts_with("chat  chat-1 idle"), "{}", panel.render(true));
        // Another session resumed in its place: the old one's end is not the player's session's status.
        let resumed = "attached session=chat-2 status=idle ended=chat-1";
        panel.answered(&answer(ChatCommand::Resume(Some("chat-2".into())), resumed));
        panel.apply(status("chat-1", ConversationStatus::Ended));
        assert!(panel.render(true).starts_with("chat  chat-2 idle"), "{}", panel.render(true));
        panel.apply(status("chat-2", ConversationStatus::Running));
        assert!(panel.render(true).starts_with("chat  chat-2 running"), "{}", panel.render(true));
        // Forgotten: said, whatever its last status was.
        panel.answered(&answer(ChatCommand::Forget("chat-2".into()), "forgot session=chat-2"));
        assert!(panel.render(true).starts_with("chat  chat-2 forgotten"), "{}", panel.render(true));
    }
}
