//! In-game agent sessions (DESIGN §6b) with the ACP backend, against a real agent process: the scripted ACP
//! agent in tests/fixtures (the official ACP crate on its stdio, the official MCP client to call the game), a
//! real game loop, the real MCP server. Only the model's choices are scripted.

mod common;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bevy::ecs::message::MessageId;
use bevy::prelude::*;
use bevy_agent_tools::mcp::{McpPlugin, McpServer};
use bevy_agent_tools::prelude::*;
use bevy_agent_tools::session::*;
use bevy_agent_tools::testing::{headless_app_with, Gate, RunningGame};
use bevy_agent_tools::{
    CallFinished, CallStarted, ConversationEvent, ConversationId, ConversationStatus, ConversationStatusChanged,
    Reported,
};
use common::game_log::GameLog;
use common::*;
use parking_lot::Mutex;

const TOKEN: &str = "sessions-test-token-0123456789";
/// A bound for waits on things that happen in milliseconds: a failure, not a slow machine, if it passes.
const LIMIT: Duration = Duration::from_secs(30);

/// The scripted agent, built once per run.
fn scripted_agent() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| example("scripted_acp_agent"))
}

/// Everything the game wrote about sessions and conversations, as lines, in the order read; and the answers to
/// its session requests.
#[derive(Resource, Clone, Default)]
struct Log(GameLog, Arc<Mutex<Vec<SessionAnswered>>>);

impl Log {
    fn lines(&self) -> Vec<String> {
        self.0.lines()
    }
    /// The answer to `request`, once the game wrote it.
    fn answer(&self, request: MessageId<SessionRequest>) -> SessionAnswered {
        // Answers are kept before their lines are written.
        self.wait_for(&format!("answered {} ", request.id));
        let answers = self.1.lock();
        answers.iter().find(|answer| answer.request == request).cloned().expect("kept with its line")
    }
    fn wait_for(&self, what: &str) -> String {
        self.0.wait_for(what, LIMIT)
    }
    /// The line of session `session`'s next permission request put to the player, and the request's number.
    fn permission_asked(&self, session: &str) -> (String, u64) {
        let line = self.wait_for(&format!("permission {session} "));
        let request = line.split(' ').nth(2).and_then(|n| n.parse().ok()).expect("a request number");
        (line, request)
    }
}

#[allow(clippy::too_many_arguments)]
fn record(
    log: Res<Log>,
    mut deltas: MessageReader<ChatDelta>,
    mut messages: MessageReader<ChatMessage>,
    mut errors: MessageReader<ChatError>,
    mut permissions: MessageReader<PermissionRequested>,
    mut settled: MessageReader<PermissionSettled>,
    mut statuses: MessageReader<ConversationStatusChanged>,
    mut started: MessageReader<CallStarted>,
    mut finished: MessageReader<CallFinished>,
    mut answered: MessageReader<SessionAnswered>,
) {
    let mut lines = Vec::new();
    lines.extend(deltas.read().map(|d| format!("delta {} {}: {}", d.session, d.message, d.text)));
    lines.extend(messages.read().map(|m| format!("message {} {}: {}", m.session, m.message, m.text)));
    lines.extend(errors.read().map(|e| format!("error {} {} [{}]: {}", e.session, e.code, e.scope, e.message)));
    lines.extend(permissions.read().map(|p| format!("permission {} {} {}", p.session, p.request, p.tool)));
    lines.extend(settled.read().map(|p| format!("settled {} {} {}", p.session, p.request, p.outcome)));
    lines.extend(
        statuses.read().map(|s| format!("status {} {}->{} {:?}", s.conversation, s.previous, s.status, s.source)),
    );
    lines.extend(started.read().map(|c| format!("call-started {} {}", c.conversation, c.tool)));
    lines.extend(finished.read().map(|c| format!("call-finished {} {} {:?}", c.conversation, c.tool, c.code)));
    // Last: an answer read in the same frame as the chat its work published is logged after it.
    for answer in answered.read() {
        lines.push(format!("answered {} {:?}", answer.request.id, answer.outcome));
        log.1.lock().push(answer.clone());
    }
    log.0.write(lines);
}

/// A running game in world `alpha` with `bump` and a `held` bump that parks at `gate`, serving MCP, with
/// agent sessions whose records live in `dirs.data` and whose scripted agents remember in `dirs.state`.
struct Game {
    game: RunningGame,
    sessions: AgentSessions,
    log: Log,
    gate: Gate,
    executions: Arc<AtomicUsize>,
    /// `held`'s handlers whose step was answered (run or refused).
    answered: Gate,
    url: String,
    /// What the world's `input_context` answers next, one per ask.
    observations: Arc<Mutex<Vec<Option<serde_json::Value>>>>,
    /// What the world's lifecycle saw (how often the game was asked for an observation, ...).
    record: Arc<Record>,
}

#[derive(Clone)]
struct Dirs {
    data: PathBuf,
    state: PathBuf,
    _root: Arc<tempfile::TempDir>,
}

impl Dirs {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        Self { data: root.path().join("sessions"), state: root.path().join("agent-state"), _root: Arc::new(root) }
    }

    /// How many scripted agents of this test are alive (zombies included: an unreaped child is a leak too; a
    /// zombie of this test binary cannot be told apart from another of its tests', so this is an upper bound while
    /// other tests run; another process's zombies are not counted).
    fn agents_alive(&self) -> usize {
        self.agents(true)
    }

    /// How many scripted agents of this test are running (zombies left out).
    fn agents_running(&self) -> usize {
        self.agents(false)
    }

    fn agents(&self, zombies: bool) -> usize {
        let needle = self.state.to_string_lossy().to_string();
        // (Linux's: elsewhere every agent would count as gone.)
        let entries = std::fs::read_dir("/proc").expect("/proc lists this machine's processes");
        entries
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().chars().all(|c| c.is_ascii_digit()))
            .filter(|entry| {
                std::fs::read(entry.path().join("cmdline"))
                    .map(|cmdline| String::from_utf8_lossy(&cmdline).contains(&needle))
                    .unwrap_or(false)
                    || zombies
                        && std::fs::read_to_string(entry.path().join("stat")).is_ok_and(|stat| {
                            // A zombie has no cmdline left; its name is still the program's.
                            stat.contains("(scripted_acp_ag")
                                && stat.split(") ").nth(1).is_some_and(|rest| rest.starts_with('Z'))
                        })
                        && std::fs::read_to_string(entry.path().join("status")).is_ok_and(|status| {
                            status.lines().any(|line| line == format!("PPid:\t{}", std::process::id()))
                        })
            })
            .count()
    }

    fn wait_no_agents(&self, within: Duration) {
        let until = Instant::now() + within;
        while self.agents_alive() > 0 {
            assert!(Instant::now() < until, "an agent process outlived its session");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Game {
    fn start(dirs: &Dirs) -> Self {
        Self::start_with(dirs, |mcp| mcp)
    }

    /// [`start`](Self::start), with the MCP server configured by `configure`.
    fn start_with(dirs: &Dirs, configure: fn(McpPlugin) -> McpPlugin) -> Self {
        let gate = Gate::new();
        let (executions, answered) = (Arc::new(AtomicUsize::new(0)), answers());
        let log = Log::default();
        let observations: Arc<Mutex<Vec<Option<serde_json::Value>>>> = Arc::default();
        let built_observations = observations.clone();
        let lifecycle_record = Arc::new(Record::default());
        let built_record = lifecycle_record.clone();
        let (data, built_gate, built_executions, built_answered, built_log) =
            (dirs.data.clone(), gate.clone(), executions.clone(), answered.clone(), log.clone());
        let game = RunningGame::spawn(Duration::from_millis(2), move || {
            let lifecycle = TestGame { observations: built_observations, record: built_record, ..TestGame::default() };
            let held = bump_tool_answered("held", ToolScope::World, built_executions, built_answered, Some(built_gate));
            let tools = AgentToolsPlugin::new(lifecycle)
                .with_tool(bump_tool("bump", ToolScope::World, Arc::default(), None))
                .with_tool(held);
            let token_file = data.with_extension("token");
            let mut app = headless_app_with(
                tools,
                (
                    configure(McpPlugin::new().port(0).token(TOKEN).token_file(token_file)),
                    AgentSessionsPlugin::new().data_dir(data),
                ),
            );
            app.insert_resource(built_log).add_systems(Update, record);
            bevy_agent_tools::testing::AgentTestAppExt::enter_world(&mut app, "alpha");
            app
        });
        let (sessions, url) = game.with_app(|app| {
            let url = app.world().resource::<bevy_agent_tools::mcp::McpServer>().url().to_string();
            (app.world().resource::<AgentSessions>().clone(), url)
        });
        Self { game, sessions, log, gate, executions, answered, url, observations, record: lifecycle_record }
    }

    fn block_on<T>(&self, future: impl std::future::Future<Output = T>) -> T {
        self.game.agent().runtime().block_on(async {
            tokio::time::timeout(LIMIT, future).await.expect("the session answered within the test's limit")
        })
    }

    /// Writes `requests` as messages in one frame, in order; returns their ids.
    fn requests<const N: usize>(&self, requests: [SessionRequest; N]) -> [MessageId<SessionRequest>; N] {
        self.game.with_app(|app| {
            requests.map(|request| app.world_mut().write_message(request).expect("the message is registered"))
        })
    }

    fn create(&self, config: SessionConfig) -> Result<AgentSession, ToolError> {
        self.block_on(self.sessions.create(config))
    }

    fn counter(&self) -> u64 {
        self.game.with_app(|app| app.world().resource::<WorldLog>().0.len() as u64)
    }

    /// The game's log once it has read every message sent so far: the game's systems write what they read a frame
    /// or more after the event, so a line that is not there yet might still come without these frames.
    fn log_after_frames(&self) -> Vec<String> {
        self.game.with_app(|app| (0..3).for_each(|_| app.update()));
        self.log.lines()
    }
}

fn agent(dirs: &Dirs, flags: &[&str]) -> SessionConfig {
    let mut args = vec!["--state".to_string(), dirs.state.to_string_lossy().to_string()];
    args.extend(flags.iter().map(|flag| flag.to_string()));
    let timeouts = SessionTimeouts { start: Duration::from_secs(20), ..Default::default() };
    SessionConfig::acp(scripted_agent().to_string_lossy(), args).timeouts(timeouts)
}

fn code_of<T: std::fmt::Debug>(result: Result<T, ToolError>) -> (ErrorCode, String) {
    let error = result.expect_err("an error");
    (error.code, error.message)
}

#[test]
fn s_a_turn_streams_deltas_and_its_tool_call_changes_the_world_as_the_sessions_own_conversation() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    let id = session.id().to_string();
    assert_eq!(session.status(), ConversationStatus::Idle);

    let hello = game.block_on(session.send_text("hello there")).expect("the turn ends");
    assert_eq!(hello.stop_reason, StopReason::EndTurn);
    assert_eq!(hello.final_message.as_deref(), Some("You said: hello there"));
    let turn = game.block_on(session.send_text(r#"call bump {"by": 1}"#)).expect("the turn ends");
    let answer = turn.final_message.expect("a final message");
    assert!(answer.starts_with("bump answered: ") && answer.contains("\"counter\":1"), "{answer}");
    assert_eq!(game.counter(), 1, "the agent's tool call changed the world once");

    game.log.wait_for(&format!("message {id} {id}-m3: bump answered"));
    game.log.0.wait_until("six status changes", LIMIT, |lines| {
        (lines.iter().filter(|line| line.starts_with(&format!("status {id} "))).count() >= 6).then_some(())
    });
    let lines: Vec<String> = game.log.lines().into_iter().filter(|line| line.contains(&id)).collect();
    let deltas: Vec<&String> = lines.iter().filter(|line| line.starts_with(&format!("delta {id} {id}-m1:"))).collect();
    assert_eq!(deltas.len(), 3, "the first reply streamed in its three pieces: {lines:#?}");
    let first_message = format!("message {id} {id}-m1: You said: hello there");
    assert!(lines.contains(&first_message), "{lines:#?}");
    assert!(lines.contains(&format!("call-started {id} bump")), "the call is the session's conversation's: {lines:#?}");
    let statuses: Vec<&String> = lines.iter().filter(|line| line.starts_with("status")).collect();
    let expected = [
        format!("status {id} idle->running Host"),
        format!("status {id} running->idle Agent"),
        format!("status {id} idle->running Host"),
        format!("status {id} running->waiting_tool_result Host"),
        format!("status {id} waiting_tool_result->running Host"),
        format!("status {id} running->idle Agent"),
    ];
    assert_eq!(statuses.iter().map(|s| s.as_str()).collect::<Vec<_>>(), expected.each_ref().map(|s| s.as_str()));
    // The message before the tool call ended at it; the one after is the turn's last.
    assert!(lines.iter().any(|line| line == &format!("message {id} {id}-m2: Calling bump.")), "{lines:#?}");
    let usage = session.usage().expect("the agent reported its usage");
    assert_eq!(usage.context_tokens, 200_000);
    assert_eq!(usage.cost, Some(Cost { amount: 0.25, currency: "USD".into() }), "with its cost");
    game.block_on(session.end());
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn a_message_the_agent_sends_right_after_answering_is_kept_apart_from_its_turn_and_completed_when_the_next_starts() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    let id = session.id().to_string();
    let turn = game.block_on(session.send_text("later a late thought")).expect("the turn ends");
    assert_eq!(turn.final_message.as_deref(), Some("more later"));
    // The agent speaks after its turn ended: streamed as it comes.
    game.log.wait_for(&format!("delta {id} {id}-m2: a late thought"));

    let next = game.block_on(session.send_text("next")).expect("the turn ends");
    assert_eq!(next.final_message.as_deref(), Some("You said: next"), "the new turn's message is its own");
    game.log.wait_for(&format!("message {id} {id}-m3: You said: next"));
    let messages: Vec<String> =
        game.log.lines().into_iter().filter(|line| line.starts_with(&format!("message {id} "))).collect();
    let expected = [
        format!("message {id} {id}-m1: more later"),
        format!("message {id} {id}-m2: a late thought"),
        format!("message {id} {id}-m3: You said: next"),
    ];
    assert_eq!(messages, expected, "the message between turns was completed, before the next turn's");
    game.block_on(session.end());
    dirs.wait_no_agents(LIMIT);
}

/// The ids of the chat messages in `events`.
fn message_ids(events: &[ConversationEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|event| match event {
            ConversationEvent::ChatMessage(message) => Some(message.message.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn chat_message_ids_never_repeat_across_runs_of_a_session_resumed_after_a_restart() {
    let dirs = Dirs::new();
    let (id, mut seen) = {
        let game = Game::start(&dirs);
        let session = game.create(agent(&dirs, &[]).auto_end_on_disconnect(false)).expect("starts");
        let mut events = game.game.agent().subscribe();
        game.block_on(session.send_text("hello")).expect("a turn");
        (session.id().clone(), message_ids(&events.drain()))
    };
    dirs.wait_no_agents(LIMIT);
    assert_eq!(seen.len(), 1, "{seen:?}");

    for run in 2..=3 {
        let game = Game::start(&dirs);
        let session = game.block_on(game.sessions.resume_session(id.clone())).expect("re-attached");
        let mut events = game.game.agent().subscribe();
        game.block_on(session.send_text("hello again")).expect("a turn");
        let this_run = message_ids(&events.drain());
        assert_eq!(this_run.len(), 1, "run {run}: {this_run:?}");
        assert!(!seen.contains(&this_run[0]), "run {run} repeats an id of an earlier run: {this_run:?} {seen:?}");
        assert!(this_run[0].starts_with(id.as_str()), "{this_run:?}");
        seen.extend(this_run);
        drop(session);
        drop(game);
        dirs.wait_no_agents(LIMIT);
    }
}

#[test]
fn an_in_game_agent_cannot_begin_other_conversations_and_so_push_other_clients_handles_out() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    let turn = game.block_on(session.send_text("call begin_conversation {}")).expect("the turn ends");
    let answer = turn.final_message.expect("a final message");
    assert!(answer.contains("INVALID_INPUT") && !answer.contains("cv-"), "no handle minted: {answer}");
    game.block_on(session.end());
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn an_agent_that_stays_silent_past_the_mcp_session_idle_timeout_keeps_its_tools() {
    let dirs = Dirs::new();
    let idle = Duration::from_millis(300);
    let game = Game::start_with(&dirs, |mcp| mcp.session_idle_timeout(Duration::from_millis(300)));
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    let turn = game.block_on(session.send_text(r#"call bump {"by": 1}"#)).expect("the turn ends");
    assert!(turn.final_message.is_some_and(|m| m.contains("\"counter\":1")), "the agent's MCP session works");
    // The player says nothing for a while: the agent's MCP session hears nothing. A client's session opened after
    // its last request, and as silent, expires: the agent's has been idle past the timeout by then, and longer.
    let address = game.game.with_app(|app| app.world().resource::<McpServer>().address());
    let plain = common::raw_mcp::open_session(address, TOKEN);
    common::raw_mcp::wait_until_session_expires(address, TOKEN, &plain, idle, LIMIT);
    let turn = game.block_on(session.send_text(r#"call bump {"by": 1}"#)).expect("the turn ends");
    let answer = turn.final_message.expect("a final message");
    assert!(answer.starts_with("bump answered: ") && answer.contains("\"counter\":2"), "{answer}");
    game.block_on(session.end());
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn s3_a_world_exit_during_the_agents_tool_call_ends_the_call_not_the_turn_and_applies_nothing() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    let turn = game.block_on(session.start_turn(r#"call held {}"#)).expect("sent");
    game.block_on(game.gate.arrivals(1));
    assert_eq!(session.status(), ConversationStatus::WaitingToolResult);
    game.game.with_app(|app| {
        app.world_mut().write_message(ExitWorld::new());
    });
    game.gate.open();
    let ended = game.block_on(turn).expect("the turn still ends");
    let answer = ended.final_message.expect("a final message");
    assert!(answer.contains("VISIT_ENDED"), "the agent was told: {answer}");
    game.block_on(game.answered.arrivals(1));
    assert_eq!(game.executions.load(std::sync::atomic::Ordering::SeqCst), 0, "nothing was applied, then or later");
    assert_eq!(session.status(), ConversationStatus::Idle, "the session goes on");
}

#[test]
fn a_said_text_whose_turn_fails_is_answered_as_sent_and_failed_not_as_refused() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let [create] = game.requests([SessionRequest::Create(agent(&dirs, &[]))]);
    let Ok(SessionReply::Created { session: id }) = game.log.answer(create).outcome else {
        panic!("created: {:#?}", game.log.lines())
    };
    let say = |text: &str| SessionRequest::Say { session: id.clone(), text: text.into() };
    // The agent crashes in the turn: the text reached it; the player should not be told it was not sent.
    let [crashed] = game.requests([say("crash")]);
    let Ok(SessionReply::TurnFailed(error)) = game.log.answer(crashed).outcome else {
        panic!("sent, then failed: {:#?}", game.log.lines())
    };
    assert_eq!(error.code, ErrorCode::AgentUnavailable, "{}", error.message);
    // The session failed: the next text is not sent, and says so.
    let [refused] = game.requests([say("hello")]);
    assert!(game.log.answer(refused).outcome.is_err(), "not sent while the session is failed");
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn session_requests_as_messages_run_in_order_per_session_and_each_is_answered_once_after_its_chat() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let say =
        |session: &ConversationId, text: &str| SessionRequest::Say { session: session.clone(), text: text.into() };
    let unknown = ConversationId::new("chat-unknown");
    let [create, nobody] = game.requests([SessionRequest::Create(agent(&dirs, &[])), say(&unknown, "hi")]);
    let Ok(SessionReply::Created { session: id }) = game.log.answer(create).outcome else {
        panic!("created: {:#?}", game.log.lines())
    };
    assert_eq!(game.log.answer(nobody).outcome.map_err(|e| e.code), Err(ErrorCode::SessionNotFound));

    // Written in one frame: the first text is sent before the second is tried, and the cancel comes after both.
    let [waiting, busy, cancel] =
        game.requests([say(&id, "wait"), say(&id, "hello"), SessionRequest::Cancel { session: id.clone() }]);
    assert_eq!(game.log.answer(busy).outcome.map_err(|e| e.code), Err(ErrorCode::SessionBusy));
    assert_eq!(game.log.answer(cancel).outcome, Ok(SessionReply::Cancelled { running: true }));
    let Ok(SessionReply::TurnEnded(cancelled)) = game.log.answer(waiting).outcome else { panic!("a turn's end") };
    assert_eq!(cancelled.stop_reason, StopReason::Cancelled);

    // A turn's answer comes after the chat and the status change its turn published.
    let [hello] = game.requests([say(&id, "hello there")]);
    let Ok(SessionReply::TurnEnded(turn)) = game.log.answer(hello).outcome else { panic!("a turn's end") };
    assert_eq!(turn.final_message.as_deref(), Some("You said: hello there"));
    let lines = game.log.lines();
    let at = |wanted: &dyn Fn(&String) -> bool| lines.iter().position(wanted).expect("logged");
    let answered = at(&|line| line.starts_with(&format!("answered {} ", hello.id)));
    assert!(
        at(&|line| line.starts_with(&format!("message {id} ")) && line.ends_with("You said: hello there")) < answered
    );
    assert!(at(&|line| line == &format!("status {id} running->idle Agent")) < answered, "{lines:#?}");

    // Ended, a text is refused; resumed, the session goes on with its history (the refused texts never reached
    // the agent); forgotten, it is gone.
    let [end, refused, resume, history] = game.requests([
        SessionRequest::End { session: id.clone() },
        say(&id, "hello"),
        SessionRequest::Resume { session: id.clone() },
        say(&id, "history"),
    ]);
    assert_eq!(game.log.answer(end).outcome, Ok(SessionReply::Ended));
    assert_eq!(game.log.answer(refused).outcome.map_err(|e| e.code), Err(ErrorCode::SessionEnded));
    assert!(matches!(game.log.answer(resume).outcome, Ok(SessionReply::Resumed(_))));
    let Ok(SessionReply::TurnEnded(turn)) = game.log.answer(history).outcome else { panic!("a turn's end") };
    assert_eq!(turn.final_message.as_deref(), Some("I remember 3 turns"));
    let [forget, gone] = game.requests([SessionRequest::Forget { session: id.clone() }, say(&id, "hello")]);
    assert_eq!(game.log.answer(forget).outcome, Ok(SessionReply::Forgotten));
    assert_eq!(game.log.answer(gone).outcome.map_err(|e| e.code), Err(ErrorCode::SessionNotFound));
    dirs.wait_no_agents(LIMIT);

    let asked = [create, nobody, waiting, busy, cancel, hello, end, refused, resume, history, forget, gone];
    let answers = game.log.1.lock().clone();
    for request in asked {
        assert_eq!(answers.iter().filter(|answer| answer.request == request).count(), 1, "request {}", request.id);
    }
    assert_eq!(answers.len(), asked.len(), "nothing else answered");
}

#[test]
fn the_answer_to_a_session_request_wakes_a_game_loop_that_sleeps_until_something_happens() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let (woken, wakes) = std::sync::mpsc::channel();
    assert!(game.game.agent().set_wake(move || {
        let _ = woken.send(());
    }));
    while wakes.try_recv().is_ok() {}
    // Refused at once: no conversation event comes with it, only the answer.
    let unknown = ConversationId::new("chat-unknown");
    let [nobody] = game.requests([SessionRequest::Say { session: unknown, text: "hi".into() }]);
    assert_eq!(game.log.answer(nobody).outcome.map_err(|e| e.code), Err(ErrorCode::SessionNotFound));
    wakes.recv_timeout(LIMIT).expect("the answer woke the loop");
}

#[test]
fn s1_send_text_during_a_turn_is_session_busy_and_nothing_is_sent_and_cancel_ends_the_turn() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    let waiting = game.block_on(session.start_turn("wait")).expect("sent");
    let asks = game.record.input_asks.load(Ordering::SeqCst);
    let (code, message) = code_of(game.block_on(session.send_text("hello")));
    assert_eq!(code, ErrorCode::SessionBusy, "{message}");
    assert_eq!(game.record.input_asks.load(Ordering::SeqCst), asks, "refused before the game is asked to observe");
    assert!(session.cancel());
    let cancelled = game.block_on(waiting).expect("the turn ends");
    assert_eq!(cancelled.stop_reason, StopReason::Cancelled);
    let history = game.block_on(session.send_text("history")).expect("the turn ends");
    assert_eq!(
        history.final_message.as_deref(),
        Some("I remember 2 turns"),
        "the refused text never reached the agent"
    );
}

/// How many rounds a race test runs: `ci`, or `SESSION_RACE_ROUNDS` (the long runs in RELIABILITY.md).
fn rounds(ci: usize) -> usize {
    std::env::var("SESSION_RACE_ROUNDS").ok().and_then(|n| n.parse().ok()).unwrap_or(ci)
}

/// A HUD on another thread reading the session's status all the while, until dropped.
struct Hud {
    done: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Hud {
    fn watch(session: &AgentSession) -> Self {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (session, watching) = (session.clone(), done.clone());
        let thread = std::thread::spawn(move || {
            while !watching.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::black_box(session.status());
            }
        });
        Self { done, thread: Some(thread) }
    }
}

impl Drop for Hud {
    fn drop(&mut self) {
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A chat box that sends `text` again and again while the session refuses it with `refused`: it goes the instant
/// the session takes it.
async fn send_when_taken(session: &AgentSession, text: &str, refused: ErrorCode) -> PendingTurn {
    loop {
        match session.start_turn(text).await {
            Ok(pending) => return pending,
            Err(error) if error.code == refused => tokio::task::yield_now().await,
            Err(error) => panic!("{error}"),
        }
    }
}

#[test]
fn the_session_api_works_awaited_on_an_executor_that_is_not_tokio() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    game.observations.lock().push(Some(serde_json::json!({ "standing_on": "grass" })));
    // Bevy's own executor (`bevy::tasks::block_on`), as a game's task pools run it: no tokio runtime here.
    use bevy::tasks::block_on;
    assert!(tokio::runtime::Handle::try_current().is_err());
    let session = block_on(game.sessions.create(agent(&dirs, &[]))).expect("starts");
    let turn = block_on(session.send_text("blocks")).expect("the turn ends");
    assert!(turn.final_message.is_some_and(|blocks| blocks.contains("standing_on")), "observed, then sent");
    block_on(session.end());
    assert_eq!(session.status(), ConversationStatus::Ended);
    assert_eq!(block_on(session.resume()).expect("resumed"), Attached::Resumed);
    let id = session.id().clone();
    assert_eq!(block_on(game.sessions.resume_session(id.clone())).expect("found").id(), &id);
    block_on(game.sessions.forget(id)).expect("forgotten");
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn s4_the_players_text_is_never_an_agents_own_command() {
    // A text that starts with `/` or `$` is a command of the agent's own to Claude's adapter and Gemini CLI (which
    // writes files or installs extensions): the player's words, which a game may take from anyone, reach the agent
    // as words, unchanged.
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    for text in ["/extensions install https://example.invalid/x", "  $ rm -rf ~", "/init"] {
        let turn = game.block_on(session.send_text(text)).expect("the turn ends");
        let said = turn.final_message.unwrap_or_default();
        assert_eq!(said, format!("You said: {text}"), "read as the player's words, not run");
    }
    game.block_on(session.end());
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn an_agent_that_answers_a_turn_with_an_error_fails_that_turn_only_and_takes_the_next_text() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    let id = session.id().to_string();
    game.block_on(session.send_text("hello")).expect("a turn");
    let (code, message) = code_of(game.block_on(session.send_text("refuse provider overloaded")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("provider overloaded"), "the agent's words: {message}");
    game.log.wait_for(&format!("error {id} AGENT_UNAVAILABLE [turn]"));
    assert_eq!(session.status(), ConversationStatus::Idle, "the session is not failed");
    assert_eq!(dirs.agents_running(), 1, "its agent is kept");
    let next = game.block_on(session.send_text("history")).expect("the next text is taken");
    // (The refused turn is not one it remembers.)
    assert_eq!(next.final_message.as_deref(), Some("I remember 2 turns"), "by the same agent session");

    // An agent that answers a cancelled turn with ACP's "request cancelled" error: the turn was cancelled.
    let waiting = game.block_on(session.start_turn("wait-error")).expect("sent");
    assert!(session.cancel());
    assert_eq!(game.block_on(waiting).expect("it ends").stop_reason, StopReason::Cancelled);
    assert_eq!(session.status(), ConversationStatus::Idle);

    // Or with an internal error saying it aborted (Gemini CLI): cancelled too, not the agent's failure.
    let waiting = game.block_on(session.start_turn("wait-aborted")).expect("sent");
    assert!(session.cancel());
    assert_eq!(game.block_on(waiting).expect("it ends").stop_reason, StopReason::Cancelled);
    assert_eq!(session.status(), ConversationStatus::Idle);
    // The same error in a turn nobody cancelled is the agent's.
    let (code, _) = code_of(game.block_on(session.send_text("refuse This operation was aborted")));
    assert_eq!(code, ErrorCode::AgentUnavailable);
}

#[test]
fn the_status_is_running_while_a_turn_runs_even_one_sent_the_instant_the_last_one_ended() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    let _hud = Hud::watch(&session);
    for round in 0..rounds(100) {
        let first = game.block_on(session.start_turn("hello")).expect("sent");
        // The next text goes while the first turn's end is being published.
        let waiting = game.block_on(send_when_taken(&session, "wait", ErrorCode::SessionBusy));
        // The first turn's outcome is sent after everything its end published.
        game.block_on(first).expect("the first turn ends");
        assert_eq!(session.status(), ConversationStatus::Running, "round {round}: the second turn runs");
        assert!(session.cancel());
        assert_eq!(game.block_on(waiting).expect("it ends").stop_reason, StopReason::Cancelled);
        assert_eq!(session.status(), ConversationStatus::Idle, "round {round}: no turn runs");
    }
}

#[test]
fn the_status_is_running_while_a_turn_runs_even_one_sent_the_instant_a_resume_went_live() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    let _hud = Hud::watch(&session);
    for round in 0..rounds(5) {
        let (code, _) = code_of(game.block_on(session.send_text("crash")));
        assert_eq!(code, ErrorCode::AgentUnavailable);
        let resumed = game.game.agent().runtime().spawn({
            let session = session.clone();
            async move { session.resume().await }
        });
        // The text goes the instant the resumed session takes it, while its `Idle` is being published.
        let waiting = game.block_on(send_when_taken(&session, "wait", ErrorCode::AgentUnavailable));
        game.block_on(resumed).expect("the resume task").expect("resumed");
        assert_eq!(session.status(), ConversationStatus::Running, "round {round}: the turn runs");
        assert!(session.cancel());
        assert_eq!(game.block_on(waiting).expect("it ends").stop_reason, StopReason::Cancelled);
    }
}

#[test]
fn s2_an_agent_that_fails_to_start_is_agent_unavailable_with_its_stderr_and_leaves_nothing() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let (code, message) = code_of(game.create(agent(&dirs, &["--fail-start"])));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains("no API key configured"), "the stderr tail: {message}");
    assert!(message.contains("exit status: 2"), "the exit status: {message}");
    assert!(!message.contains("no program"), "{message}");
    dirs.wait_no_agents(LIMIT);

    // A program that is not installed: said in those words, not only as the OS error.
    let missing = SessionConfig::acp("no-such-acp-agent", ["--acp"]);
    let (code, message) = code_of(game.create(missing));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains("no program `no-such-acp-agent` was found"), "{message}");

    // A start that runs out of time says which answer it waited for (time enough to start the agent and have its
    // `initialize` answered, in the second case).
    for (flag, start, waited_for) in [("--hang-init", 500, "initialize"), ("--hang-new-session", 5000, "session/new")] {
        let mut hanging = agent(&dirs, &[flag]);
        hanging.timeouts.start = Duration::from_millis(start);
        let (code, message) = code_of(game.create(hanging));
        assert_eq!(code, ErrorCode::AgentUnavailable);
        let said = format!("did not start within {:?} (no answer to {waited_for})", Duration::from_millis(start));
        assert!(message.contains(&said), "{message}");
        dirs.wait_no_agents(LIMIT);
    }
    wait_no_session_folders(&dirs);
    // Whatever their agents said on the way out, the game heard nothing of sessions it never got.
    let heard: Vec<String> = game.log_after_frames().into_iter().filter(|line| line.contains("chat-")).collect();
    assert!(heard.is_empty(), "events of sessions that never started: {heard:#?}");
}

/// The sessions' folders in `dirs.data` (not `.runs`, where each run of the game says it is going).
fn session_folders(dirs: &Dirs) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(&dirs.data) else { return Vec::new() };
    let names = entries.filter_map(Result::ok).map(|entry| entry.file_name().to_string_lossy().to_string());
    names.filter(|name| name != ".runs").collect()
}

fn wait_no_session_folders(dirs: &Dirs) {
    let until = Instant::now() + LIMIT;
    while !session_folders(dirs).is_empty() {
        assert!(Instant::now() < until, "a session that never started left its folder: {:?}", session_folders(dirs));
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_create_dropped_midway_leaves_no_agent_credential_conversation_or_folder() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let credentials = game.game.with_app(|app| app.world().resource::<McpServer>().credentials().clone());
    // An agent that never answers `initialize`, and a start timeout far away: only the drop ends the create.
    let sessions = game.sessions.clone();
    let config = agent(&dirs, &["--hang-init"]);
    let creating = game.game.agent().runtime().spawn(async move { sessions.create(config).await });
    let until = Instant::now() + LIMIT;
    while credentials.live() == 0 || dirs.agents_alive() == 0 {
        assert!(Instant::now() < until, "the agent was started with a credential");
        std::thread::sleep(Duration::from_millis(5));
    }
    let folders = session_folders(&dirs);
    assert_eq!(folders.len(), 1, "{folders:?}");
    let id = ConversationId::new(folders[0].clone());
    assert_eq!(game.game.agent().conversation_status(&id), Some(ConversationStatus::Idle));

    // The game gives up on it (a timeout around `create`, a task dropped with its menu).
    creating.abort();
    assert!(game.block_on(creating).is_err_and(|error| error.is_cancelled()));
    assert_eq!(credentials.live(), 0, "its credential was revoked");
    assert_eq!(game.game.agent().conversation_status(&id), None, "its conversation was forgotten");
    dirs.wait_no_agents(LIMIT);
    wait_no_session_folders(&dirs);
}

#[test]
fn a_create_awaited_off_tokio_and_dropped_once_its_session_is_ready_leaves_nothing() {
    use bevy::tasks::{block_on, poll_once};
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let credentials = game.game.with_app(|app| app.world().resource::<McpServer>().credentials().clone());
    let mut creating = Box::pin(game.sessions.create(agent(&dirs, &[])));
    assert!(block_on(poll_once(&mut creating)).is_none(), "under way, on the plugin's runtime");
    // The session's record is its last step: the session is ready (or all but), its result unclaimed.
    let until = Instant::now() + LIMIT;
    while !session_folders(&dirs).iter().any(|id| dirs.data.join(id).join("session.json").is_file()) {
        assert!(Instant::now() < until, "the session was created");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(creating);
    dirs.wait_no_agents(LIMIT);
    wait_no_session_folders(&dirs);
    assert_eq!(credentials.live(), 0, "its credential was revoked");
}

#[test]
fn s2_an_agent_that_crashes_mid_turn_fails_the_turn_and_resume_restarts_it_in_the_same_session() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    let id = session.id().to_string();
    let (code, message) = code_of(game.block_on(session.send_text("crash")));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains("crashing on purpose"), "the stderr tail: {message}");
    assert_eq!(session.status(), ConversationStatus::Error);
    game.log.wait_for(&format!("error {id} AGENT_UNAVAILABLE [session]"));
    dirs.wait_no_agents(LIMIT);
    let (code, _) = code_of(game.block_on(session.send_text("hello")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "a failed session answers with its failure until resumed");

    resumes_into_the_same_agent_session(&game, &session);
}

#[test]
fn s2_an_agent_that_exits_between_turns_fails_the_session_at_once_saying_why() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    let id = session.id().to_string();
    let turn = game.block_on(session.send_text("leave")).expect("the turn ends");
    assert_eq!(turn.final_message.as_deref(), Some("leaving after this turn"));

    // No message from the player is needed for the game to learn of it.
    let error = game.log.wait_for(&format!("error {id} AGENT_UNAVAILABLE [session]"));
    assert!(error.contains("leaving between turns"), "the stderr tail: {error}");
    assert_eq!(session.status(), ConversationStatus::Error);
    let (code, message) = code_of(game.block_on(session.send_text("hello")));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains("the agent stopped") && message.contains("leaving between turns"), "{message}");
    dirs.wait_no_agents(LIMIT);

    resumes_into_the_same_agent_session(&game, &session);
}

#[test]
fn s2_an_agent_that_exits_the_instant_it_ends_a_turn_fails_the_session_without_another_message() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    // Its answer and its exit reach the game together: in most rounds the answer first, in some the exit.
    let _hud = Hud::watch(&session);
    for round in 0..rounds(100) {
        match game.block_on(session.send_text("leave-now")) {
            Ok(turn) => assert_eq!(turn.stop_reason, StopReason::EndTurn),
            // The exit overtook the answer: the turn fails with it.
            Err(error) => assert_eq!(error.code, ErrorCode::AgentUnavailable, "round {round}: {error}"),
        }
        // Either way, the game learns of the exit by itself.
        let until = Instant::now() + LIMIT;
        while session.status() != ConversationStatus::Error {
            assert!(Instant::now() < until, "round {round}: the exit was never reported: {:#?}", game.log.lines());
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(game.block_on(session.resume()).expect("resumed"), Attached::Resumed);
    }
}

/// After one turn and a failure: `resume` restarts the agent in the same agent session (it remembers both turns).
fn resumes_into_the_same_agent_session(game: &Game, session: &AgentSession) {
    assert_eq!(game.block_on(session.resume()).expect("resumed"), Attached::Resumed);
    assert_eq!(session.status(), ConversationStatus::Idle);
    let history = game.block_on(session.send_text("history")).expect("the turn ends");
    assert_eq!(history.final_message.as_deref(), Some("I remember 2 turns"), "the same agent session");
}

#[test]
fn s3_ending_a_session_never_touches_the_visit_and_it_stays_resumable_past_the_bound_on_ended_conversations() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let agent_handle = game.game.agent();
    let visit = agent_handle.visit().expect("the world is open").info.visit;
    let session = game.create(agent(&dirs, &[])).expect("starts");
    let id = session.id().to_string();
    game.block_on(session.end());
    let untouched = |when: &str| {
        assert_eq!(game.record.opens.load(Ordering::SeqCst), 1, "{when}: no visit was opened");
        assert_eq!(game.record.closes.load(Ordering::SeqCst), 0, "{when}: the visit was not closed");
        let now = agent_handle.visit().map(|status| status.info.visit);
        assert_eq!(now, Some(visit), "{when}: the same visit is open");
    };
    untouched("after the session ended");
    // Clients that come and go (each stateless MCP request that names no client is a conversation that ends)
    // past the host's bound on ended conversations it keeps (1,024, looked for every 64 ends: 1,100 is past both).
    for n in 0..1_100 {
        agent_handle.conversation(format!("passing-{n}")).end().expect("an open conversation ends");
    }
    let first = agent_handle.conversation_status(&ConversationId::new("passing-0"));
    assert_eq!(first, None, "the host forgot the first of the others");
    let kept = agent_handle.conversation_status(session.id());
    assert_eq!(kept, Some(ConversationStatus::Ended), "the game's own ended session is kept past the bound");

    assert_eq!(game.block_on(session.resume()).expect("resumed"), Attached::Resumed);
    untouched("after the session resumed");
    assert_eq!(session.status(), ConversationStatus::Idle);
    let turn = game.block_on(session.send_text("hello")).expect("the turn ends");
    assert_eq!(turn.final_message.as_deref(), Some("You said: hello"));
    let chat = game.log.wait_for(&format!("message {id} "));
    assert!(chat.ends_with("You said: hello"), "the game sees the resumed session's chat: {chat}");
}

#[test]
fn s2_a_session_awaited_on_a_runtime_of_the_games_own_without_timers_reaches_its_outcomes() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let (sessions, config) = (game.sessions.clone(), agent(&dirs, &[]));
    // A runtime the game built for its own work, without tokio's timers or I/O: the session's waits need both.
    let (done, outcome) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let own = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        let turn = own.block_on(async move {
            let session = sessions.create(config).await?;
            session.send_text("hello").await
        });
        let _ = done.send(turn.map(|turn| turn.final_message));
    });
    let turn = outcome.recv_timeout(LIMIT).expect("an outcome, not a panic or a hang");
    assert_eq!(turn.expect("the turn ends").as_deref(), Some("You said: hello"));
}

#[test]
fn s2_a_turn_the_agent_never_ends_times_out_and_the_agent_is_stopped() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let mut config = agent(&dirs, &[]);
    config.timeouts.turn = Duration::from_millis(500);
    let session = game.create(config).expect("the session starts");
    let (code, _) = code_of(game.block_on(session.send_text("hang")));
    assert_eq!(code, ErrorCode::Timeout);
    assert_eq!(session.status(), ConversationStatus::Error);
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn s2_a_session_that_fails_mid_call_cancels_its_tool_call_running_in_the_game_which_never_applies() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let mut config = agent(&dirs, &[]);
    // Long enough for the agent's call to reach the game on a loaded machine, which the turn's timeout then fails.
    config.timeouts.turn = Duration::from_secs(5);
    let session = game.create(config).expect("the session starts");
    let pending = game.block_on(session.start_turn("call held {}")).expect("sent");
    game.block_on(game.gate.arrivals(1));
    // The turn times out while its call is held: the session fails and its agent is stopped.
    let (code, message) = code_of(game.block_on(pending));
    assert_eq!(code, ErrorCode::Timeout, "{message}");
    assert_eq!(session.status(), ConversationStatus::Error);
    game.gate.open();
    game.block_on(game.answered.arrivals(1));
    assert_eq!(game.executions.load(Ordering::SeqCst), 0, "the failed session's call never changed the world");
    // Nor does a call that reaches its conversation after the failure (a request that passed the credential check
    // just before the credential was revoked), until the session is resumed.
    let conversation = game.game.agent().conversation(session.id().clone());
    let (code, message) = code_of(game.block_on(conversation.call("bump", serde_json::json!({}))));
    assert_eq!(code, ErrorCode::Cancelled, "{message}");
    assert!(message.contains("failed"), "{message}");
    let before = game.counter();
    game.block_on(session.resume()).expect("resumed");
    assert_eq!(session.status(), ConversationStatus::Idle, "no call of the failed turn is left in flight");
    game.block_on(conversation.call("bump", serde_json::json!({}))).expect("resumed: its calls run again");
    assert_eq!(game.counter(), before + 1);
}

#[test]
fn a_sessions_conversation_is_ended_only_by_ending_the_session_never_alone_through_the_agent_handle() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("starts");
    let agent = game.game.agent();
    let (code, message) = code_of(agent.end_conversation(session.id()));
    assert_eq!(code, ErrorCode::InvalidInput, "{message}");
    assert!(message.contains("end the session"), "{message}");
    let (code, _) = code_of(agent.conversation(session.id().clone()).end());
    assert_eq!(code, ErrorCode::InvalidInput);
    assert_eq!(agent.conversation(session.id().clone()).report(ConversationStatus::Ended, 1), Reported::Refused);
    // The session is untouched: it takes text, and its tool calls run in its conversation.
    assert_eq!(session.status(), ConversationStatus::Idle);
    let turn = game.block_on(session.send_text("call bump {}")).expect("the turn ends");
    let answer = turn.final_message.expect("the agent's last message");
    assert!(answer.starts_with("bump answered: {") && !answer.contains("error"), "{answer}");
    game.block_on(session.end());
    assert_eq!(agent.conversation_status(session.id()), Some(ConversationStatus::Ended));
}

#[test]
fn a_close_timeout_as_long_as_the_clock_allows_still_ends_the_session_and_its_agent() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // `Duration::MAX`: wait for the agent to close however long it takes (it closes at once).
    let timeouts = SessionTimeouts { start: Duration::from_secs(20), close: Duration::MAX, ..Default::default() };
    let config = agent(&dirs, &[]).timeouts(timeouts);
    let session = game.create(config).expect("the session starts");
    game.block_on(session.end());
    assert_eq!(session.status(), ConversationStatus::Ended);
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn end_rejects_pending_work_with_session_ended_publishes_ended_once_and_revokes_the_credential() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("the session starts");
    let id = session.id().to_string();
    let credential = session.credential().expect("a credential");
    assert_ne!(post_tools_list(&game.url, &credential), 401, "the credential works while the session lives");
    let waiting = game.block_on(session.start_turn("wait")).expect("sent");
    game.block_on(session.end());
    let (code, _) = code_of(game.block_on(waiting));
    assert_eq!(code, ErrorCode::SessionEnded);
    game.block_on(session.end());
    assert_eq!(session.status(), ConversationStatus::Ended);
    assert_eq!(post_tools_list(&game.url, &credential), 401, "an ended session's credential is refused");
    let (code, _) = code_of(game.block_on(session.send_text("hello")));
    assert_eq!(code, ErrorCode::SessionEnded);
    dirs.wait_no_agents(LIMIT);
    game.log.wait_for(&format!("status {id} running->ended"));
    let log = game.log_after_frames();
    let ended = log.iter().filter(|line| line.contains(&id) && line.ends_with("->ended Host")).count();
    assert_eq!(ended, 1, "Ended is published once");

    // Opening the session's conversation (a HUD subscribing to it) never resumes the ended session (§6b).
    let agent = game.game.agent();
    let opened = agent.conversation(session.id().clone());
    assert_eq!((opened.status(), session.status()), (ConversationStatus::Ended, ConversationStatus::Ended));
    assert_eq!(opened.resume().expect_err("the session's to resume").code, ErrorCode::SessionEnded);
    assert_eq!(session.status(), ConversationStatus::Ended);

    assert_eq!(game.block_on(session.resume()).expect("resumed"), Attached::Resumed);
    assert_eq!(session.status(), ConversationStatus::Idle);
    let new_credential = session.credential().expect("a new credential");
    assert_ne!(new_credential, credential);
    let history = game.block_on(session.send_text("history")).expect("the turn ends");
    assert_eq!(history.final_message.as_deref(), Some("I remember 2 turns"));
}

#[test]
fn resume_session_after_a_restart_reattaches_a_kept_session_and_an_ended_one_stays_ended() {
    let dirs = Dirs::new();
    let (kept, ended) = {
        let game = Game::start(&dirs);
        let kept = game.create(agent(&dirs, &[]).auto_end_on_disconnect(false)).expect("starts");
        game.block_on(kept.send_text("hello")).expect("a turn");
        let ended = game.create(agent(&dirs, &[]).auto_end_on_disconnect(false)).expect("starts");
        game.block_on(ended.end());
        (kept.id().clone(), ended.id().clone())
    };
    dirs.wait_no_agents(LIMIT);

    let game = Game::start(&dirs);
    let resumed = game.block_on(game.sessions.resume_session(kept.clone())).expect("re-attached");
    assert_eq!(resumed.status(), ConversationStatus::Idle);
    let history = game.block_on(resumed.send_text("history")).expect("the turn ends");
    assert_eq!(history.final_message.as_deref(), Some("I remember 2 turns"), "the agent's own session, resumed");

    let still_ended = game.block_on(game.sessions.resume_session(ended.clone())).expect("found");
    assert_eq!(still_ended.status(), ConversationStatus::Ended);
    let (code, _) = code_of(game.block_on(still_ended.send_text("hello")));
    assert_eq!(code, ErrorCode::SessionEnded);

    let (code, _) = code_of(game.block_on(game.sessions.resume_session("chat-00000000deadbeef")));
    assert_eq!(code, ErrorCode::SessionNotFound);
    let (code, _) = code_of(game.block_on(game.sessions.resume_session("")));
    assert_eq!(code, ErrorCode::InvalidInput);
}

#[test]
fn at_exit_a_session_that_is_not_kept_leaves_nothing_on_disk_and_a_kept_one_stays() {
    let dirs = Dirs::new();
    let (unkept, kept) = {
        let game = Game::start(&dirs);
        let unkept = game.create(agent(&dirs, &[])).expect("starts");
        game.block_on(unkept.send_text("hello")).expect("a turn");
        let kept = game.create(agent(&dirs, &[]).auto_end_on_disconnect(false)).expect("starts");
        assert!(dirs.data.join(unkept.id().as_str()).join("session.json").exists(), "the control: its record");
        (unkept.id().clone(), kept.id().clone())
    };
    assert!(!dirs.data.join(unkept.as_str()).exists(), "nothing resumes it after the game: its folder is gone");
    assert!(dirs.data.join(kept.as_str()).join("session.json").exists(), "kept for resume_session");
}

#[test]
fn a_session_not_kept_that_a_game_which_did_not_exit_left_behind_is_deleted_at_the_next_start() {
    let dirs = Dirs::new();
    let (left, kept) = (kept_session(&dirs), kept_session(&dirs));
    // As a game that crashed leaves a session it did not keep: its record, marked not kept, of a run that is over
    // (this process's pid, another run's number).
    let record = dirs.data.join(left.as_str()).join("session.json");
    let mut text: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).expect("its record")).expect("JSON");
    assert_eq!(text["config"]["auto_end_on_disconnect"], false, "{text}");
    assert_eq!(text["owner"]["pid"], std::process::id(), "{text}");
    text["config"]["auto_end_on_disconnect"] = true.into();
    let run = text["owner"]["run"].as_u64().expect("a run");
    text["owner"]["run"] = run.wrapping_add(1).into();
    std::fs::write(&record, serde_json::to_vec_pretty(&text).expect("JSON")).expect("written");
    let game = Game::start(&dirs);
    let until = Instant::now() + LIMIT;
    while dirs.data.join(left.as_str()).exists() {
        assert!(Instant::now() < until, "the left-behind session was not deleted");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(dirs.data.join(kept.as_str()).join("session.json").exists(), "a kept one stays");
    game.block_on(game.sessions.resume_session(kept)).expect("and resumes");
}

/// A kept session (`auto_end_on_disconnect(false)`) of a game that then stopped, its agent gone.
fn kept_session(dirs: &Dirs) -> ConversationId {
    let id = {
        let game = Game::start(dirs);
        let session = game.create(agent(dirs, &[]).auto_end_on_disconnect(false)).expect("starts");
        session.id().clone()
    };
    dirs.wait_no_agents(LIMIT);
    id
}

#[test]
fn a_kept_session_is_open_in_one_copy_of_the_game_at_a_time() {
    let dirs = Dirs::new();
    let id = kept_session(&dirs);
    let (first, second) = (Game::start(&dirs), Game::start(&dirs));
    let session = first.block_on(first.sessions.resume_session(id.clone())).expect("re-attached in one copy");
    // The other copy (sharing the data directory) is refused, not given a second agent on the same session.
    let (code, message) = code_of(second.block_on(second.sessions.resume_session(id.clone())));
    assert_eq!(code, ErrorCode::SessionBusy, "{message}");
    assert!(message.contains("another copy of the game"), "{message}");
    assert_eq!(dirs.agents_running(), 1, "one agent on it");
    let (code, _) = code_of(second.block_on(second.sessions.forget(id.clone())));
    assert_eq!(code, ErrorCode::SessionBusy, "not deleted under the copy that has it");
    assert!(dirs.data.join(id.as_str()).join("session.json").exists());
    // The first copy lets it go when it exits: the other one can take it then.
    drop(session);
    drop(first);
    dirs.wait_no_agents(LIMIT);
    let resumed = second.block_on(second.sessions.resume_session(id)).expect("free now");
    let turn = second.block_on(resumed.send_text("history")).expect("the turn ends");
    assert_eq!(turn.final_message.as_deref(), Some("I remember 1 turns"), "the same agent session");
}

#[test]
fn an_ended_session_lets_its_folder_go_and_takes_it_again_to_resume() {
    let dirs = Dirs::new();
    let (first, second) = (Game::start(&dirs), Game::start(&dirs));
    let session = first.create(agent(&dirs, &[]).auto_end_on_disconnect(false)).expect("starts");
    let id = session.id().clone();
    first.block_on(session.end());
    // Ended here, it is no longer this copy's: another copy of the game may take it.
    let theirs = second.block_on(second.sessions.resume_session(id.clone())).expect("not busy once ended");
    assert_eq!(second.block_on(theirs.resume()).expect("resumed there"), Attached::Resumed);
    let (code, message) = code_of(first.block_on(session.resume()));
    assert_eq!(code, ErrorCode::SessionBusy, "taken again to resume, and refused while the other has it: {message}");
    second.block_on(theirs.end());
    assert_eq!(first.block_on(session.resume()).expect("free again"), Attached::Resumed);
    // Taken up again from its record, after the other copy's run (the first run is 0, the other copy's 1).
    let record = std::fs::read(dirs.data.join(id.as_str()).join("session.json")).expect("its record");
    let record: serde_json::Value = serde_json::from_slice(&record).expect("JSON");
    assert_eq!(record["runs"], 2, "a run of its own, after the other copy's: {record}");
    let turn = first.block_on(session.send_text("history")).expect("the turn ends");
    assert_eq!(turn.final_message.as_deref(), Some("I remember 1 turns"), "the same agent session");
}

#[test]
fn an_ended_session_another_copy_only_looked_at_is_not_held_by_it() {
    let dirs = Dirs::new();
    let (first, second) = (Game::start(&dirs), Game::start(&dirs));
    let session = first.create(agent(&dirs, &[]).auto_end_on_disconnect(false)).expect("starts");
    let id = session.id().clone();
    first.block_on(session.end());
    // The other copy's menu of past chats reads it: ended, it stays ended, and that copy keeps nothing of it.
    let shown = second.block_on(second.sessions.resume_session(id.clone())).expect("read");
    let (code, _) = code_of(second.block_on(shown.send_text("hello?")));
    assert_eq!(code, ErrorCode::SessionEnded);
    assert_eq!(first.block_on(session.resume()).expect("not held by a copy that only looked"), Attached::Resumed);
    let (code, message) = code_of(second.block_on(shown.resume()));
    assert_eq!(code, ErrorCode::SessionBusy, "taken to resume, and refused while the first has it: {message}");
}

/// The file descriptors this process has open (Linux).
#[cfg(target_os = "linux")]
fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|entries| entries.count()).unwrap_or(0)
}

#[cfg(target_os = "linux")]
#[test]
fn sessions_created_and_ended_one_after_another_hold_no_file_open() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let warm = game.create(agent(&dirs, &[])).expect("starts");
    game.block_on(warm.end());
    dirs.wait_no_agents(LIMIT);
    let before = open_files();
    for _ in 0..60 {
        let session = game.create(agent(&dirs, &[])).expect("starts");
        game.block_on(session.end());
    }
    dirs.wait_no_agents(LIMIT);
    let after = open_files();
    // Each ended session held its folder's lock (an open directory) until the game exited: 60 more. (Tests
    // running beside this one open files too: the margin is theirs.)
    assert!(after < before + 30, "{before} files open before, {after} after 60 sessions ended");
}

#[test]
fn two_resume_sessions_of_one_id_at_once_share_one_session_and_one_agent_that_works() {
    let dirs = Dirs::new();
    let id = kept_session(&dirs);
    let game = Game::start(&dirs);
    let (a, b) = game.block_on(async {
        tokio::join!(game.sessions.resume_session(id.clone()), game.sessions.resume_session(id.clone()))
    });
    let (a, b) = (a.expect("the first resumes"), b.expect("the second gets the same session"));
    assert_eq!(dirs.agents_running(), 1, "one agent: the second call waited for the first");
    assert_eq!(a.status(), ConversationStatus::Idle);

    let turn = game.block_on(b.send_text(r#"call bump {"by": 1}"#)).expect("the turn ends");
    assert!(turn.final_message.is_some_and(|message| message.starts_with("bump answered")), "the tool ran");
    assert_eq!(game.counter(), 1);
    assert_eq!(a.status(), ConversationStatus::Idle, "not ended by a discarded second connection");
    assert!(!game
        .log_after_frames()
        .iter()
        .any(|line| line.starts_with(&format!("status {id} ")) && line.contains("->ended")));
}

#[test]
fn resume_session_of_a_session_the_agent_forgot_is_session_not_found_and_creates_nothing() {
    let dirs = Dirs::new();
    let id = kept_session(&dirs);
    std::fs::remove_dir_all(&dirs.state).expect("the agent forgets everything");
    let game = Game::start(&dirs);
    let (code, _) = code_of(game.block_on(game.sessions.resume_session(id.clone())));
    assert_eq!(code, ErrorCode::SessionNotFound);
    assert!(game.sessions.get(&id).is_none());
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn an_agent_that_fails_to_reattach_for_reasons_of_its_own_is_agent_unavailable_and_the_session_survives_for_a_retry() {
    let dirs = Dirs::new();
    let id = kept_session(&dirs);
    let trouble = dirs.state.join("resume-fails");
    std::fs::write(&trouble, "").expect("the agent's provider is down");
    let game = Game::start(&dirs);
    let (code, message) = code_of(game.block_on(game.sessions.resume_session(id.clone())));
    assert_eq!(code, ErrorCode::AgentUnavailable, "not SESSION_NOT_FOUND, which tells the game to drop the id");
    assert!(message.contains("overloaded"), "the agent's own words: {message}");
    std::fs::remove_file(&trouble).expect("the provider is back");
    let session = game.block_on(game.sessions.resume_session(id.clone())).expect("the same session re-attaches");
    let history = game.block_on(session.send_text("history")).expect("the turn ends");
    assert_eq!(history.final_message.as_deref(), Some("I remember 1 turns"), "the agent's own session, kept");
}

#[test]
fn resume_session_of_a_session_an_agent_says_it_forgot_only_in_its_errors_data_is_session_not_found() {
    let dirs = Dirs::new();
    let id = kept_session(&dirs);
    std::fs::remove_dir_all(&dirs.state).expect("the agent forgets everything");
    std::fs::create_dir_all(&dirs.state).expect("its state folder");
    // As agents built on ACP's TypeScript SDK answer: -32603 "Internal error", "Session not found" in `data`.
    std::fs::write(dirs.state.join("typescript-errors"), "").expect("it words errors as TypeScript agents do");
    let game = Game::start(&dirs);
    let (code, message) = code_of(game.block_on(game.sessions.resume_session(id.clone())));
    assert_eq!(code, ErrorCode::SessionNotFound, "not AGENT_UNAVAILABLE at every try: {message}");
    assert!(game.sessions.get(&id).is_none());
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn a_resume_while_the_agent_has_trouble_of_its_own_keeps_its_session_for_a_later_resume() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("starts");
    game.block_on(session.send_text("hello")).expect("a turn");
    assert!(game.block_on(session.send_text("crash")).is_err());
    let before = session.backend_session();
    // Resuming a crashed session while the agent's provider fails: no new agent session replaces the one it
    // remembers (a passing error must not cost the conversation's history).
    let trouble = dirs.state.join("resume-fails");
    std::fs::write(&trouble, "").expect("the agent's provider is down");
    let (code, _) = code_of(game.block_on(session.resume()));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert_eq!(session.backend_session(), before, "not replaced by a new agent session");
    std::fs::remove_file(&trouble).expect("the provider is back");
    assert_eq!(game.block_on(session.resume()).expect("resumed"), Attached::Resumed);
    let history = game.block_on(session.send_text("history")).expect("the turn ends");
    assert_eq!(history.final_message.as_deref(), Some("I remember 3 turns"), "the agent's own session, kept");
}

/// A session's record names the program its resume starts: one that another user could have written (not this
/// user's, or writable by others) is not used, and its program never runs. The control: the same record, private
/// again, is used (and its program runs).
#[cfg(unix)]
#[test]
fn s4_a_session_record_others_could_have_written_is_not_resumed_and_its_program_never_runs() {
    use std::os::unix::fs::PermissionsExt;
    let dirs = Dirs::new();
    let id = kept_session(&dirs);
    let folder = dirs.data.join(id.as_str());
    let mode = |path: &Path| std::fs::metadata(path).expect("metadata").permissions().mode() & 0o777;
    assert_eq!(mode(&folder), 0o700, "a session's folder is the user's alone");
    let record = folder.join("session.json");
    assert_eq!(mode(&record), 0o600);

    // Someone rewrites the record to start a program of theirs.
    let marker = dirs.state.with_extension("ran");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).expect("the record")).expect("JSON");
    let command = json.pointer_mut("/config/backend").expect("the backend");
    assert_eq!(command["type"], "acp");
    command["program"] = "touch".into();
    command["args"] = serde_json::json!([marker.to_string_lossy()]);
    std::fs::write(&record, serde_json::to_vec(&json).expect("JSON")).expect("rewritten");
    std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o666)).expect("chmod");

    let game = Game::start(&dirs);
    let (code, message) = code_of(game.block_on(game.sessions.resume_session(id.clone())));
    assert_eq!(code, ErrorCode::SessionNotFound, "{message}");
    assert!(message.contains("is not used") && message.contains("may be written by other users"), "{message}");
    assert!(!marker.exists(), "the record's program never ran");

    std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let (code, message) = code_of(game.block_on(game.sessions.resume_session(id)));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(marker.exists(), "the control: a private record is used");
}

#[test]
fn forget_deletes_a_kept_session_for_good_and_ends_a_live_one_first() {
    let dirs = Dirs::new();
    let kept = kept_session(&dirs);
    assert!(dirs.data.join(kept.as_str()).join("session.json").is_file());
    let game = Game::start(&dirs);
    game.block_on(game.sessions.forget(kept.clone())).expect("forgotten");
    assert!(!dirs.data.join(kept.as_str()).exists(), "its folder is gone");
    let (code, _) = code_of(game.block_on(game.sessions.resume_session(kept.clone())));
    assert_eq!(code, ErrorCode::SessionNotFound, "it can never be resumed");
    let (code, _) = code_of(game.block_on(game.sessions.forget(kept)));
    assert_eq!(code, ErrorCode::SessionNotFound, "forgetting twice: nothing left to forget");

    let live = game.create(agent(&dirs, &[]).auto_end_on_disconnect(false)).expect("starts");
    game.block_on(live.send_text("hello")).expect("a turn");
    game.block_on(game.sessions.forget(live.id().clone())).expect("forgotten");
    assert_eq!(live.status(), ConversationStatus::Ended, "ended first");
    dirs.wait_no_agents(LIMIT);
    assert!(!dirs.data.join(live.id().as_str()).exists(), "its folder is gone");
    let (code, message) = code_of(game.block_on(live.send_text("still there?")));
    assert_eq!(code, ErrorCode::SessionEnded, "{message}");
    let (code, _) = code_of(game.block_on(live.resume()));
    assert_eq!(code, ErrorCode::SessionNotFound, "its handle cannot bring it back");
    assert!(!dirs.data.join(live.id().as_str()).exists(), "nor write its record again");
    assert_eq!(game.game.agent().conversation_status(live.id()), None, "the host no longer keeps its conversation");

    let (code, _) = code_of(game.block_on(game.sessions.forget("")));
    assert_eq!(code, ErrorCode::InvalidInput);
    let (code, _) = code_of(game.block_on(game.sessions.forget("../elsewhere")));
    assert_eq!(code, ErrorCode::SessionNotFound, "an id that is not the game's never names a path");

    // The data dir may hold the game's own things: what is not a session is never deleted.
    let worlds = dirs.data.join("worlds");
    std::fs::create_dir_all(worlds.join("alpha")).expect("a folder of the game's");
    std::fs::write(dirs.data.join("settings"), "{}").expect("a file of the game's");
    for name in ["worlds", "settings"] {
        let (code, _) = code_of(game.block_on(game.sessions.forget(name)));
        assert_eq!(code, ErrorCode::SessionNotFound, "{name}");
    }
    assert!(worlds.join("alpha").is_dir() && dirs.data.join("settings").is_file(), "both kept");
}

#[test]
fn a_permission_prompt_shows_the_file_and_the_change_an_edit_would_make() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[]).permissions(PermissionPolicy::AskPlayer)).expect("starts");
    let id = session.id().to_string();
    let mut events = game.game.agent().subscribe();
    let pending = game.block_on(session.start_turn("ask-edit")).expect("sent");
    let (_, request) = game.log.permission_asked(&id);
    let asked = events.drain().into_iter().find_map(|event| match event {
        ConversationEvent::PermissionRequested(asked) if asked.request == request => Some(asked),
        _ => None,
    });
    let asked = asked.expect("the prompt was put to the player");
    assert_eq!((asked.tool.as_str(), asked.kind.as_deref()), ("Edit notes.txt", Some("edit")));
    let [PermissionDetail::Diff { path: changed, old_text, new_text }, PermissionDetail::Location { path, line: Some(2) }] =
        asked.details.as_slice()
    else {
        panic!("the change, then the file: {:?}", asked.details);
    };
    assert!(path.ends_with("notes.txt") && changed == path, "{path} {changed}");
    assert_eq!((old_text.as_deref(), new_text.as_str()), (Some("2"), "two"));
    // As the game reads it, and as a client of the conversation's events over MCP would.
    let json = serde_json::to_value(&asked).expect("serializes");
    assert_eq!(json["details"][0]["type"], "diff", "{json}");
    assert!(game.sessions.answer_permission(request, true));
    assert_eq!(game.block_on(pending).expect("ends").final_message.as_deref(), Some("edit: allowed"));
}

#[test]
fn permission_requests_are_denied_by_default_and_the_player_can_allow_or_let_them_time_out() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let denied = game.create(agent(&dirs, &[])).expect("starts");
    let turn = game.block_on(denied.send_text("ask")).expect("the turn ends");
    assert_eq!(turn.final_message.as_deref(), Some("permission: denied"));

    // The player answers, well within the default minute to answer.
    let asking = game.create(agent(&dirs, &[]).permissions(PermissionPolicy::AskPlayer)).expect("starts");
    let id = asking.id().to_string();
    let mut events = game.game.agent().subscribe();
    let pending = game.block_on(asking.start_turn("ask")).expect("sent");
    let (line, request) = game.log.permission_asked(&id);
    assert!(line.ends_with("run rm -rf /"), "{line}");
    // Beside its title, what the action is and takes, as the agent said: the title alone may not say it.
    let asked = events.drain().into_iter().find_map(|event| match event {
        ConversationEvent::PermissionRequested(asked) if asked.request == request => Some(asked),
        _ => None,
    });
    let asked = asked.expect("the prompt was put to the player");
    assert_eq!(asked.kind.as_deref(), Some("execute"));
    assert_eq!(asked.input.as_deref(), Some(r#"{"command":"rm -rf /"}"#));
    assert!(game.sessions.answer_permission(request, true));
    assert_eq!(game.block_on(pending).expect("ends").final_message.as_deref(), Some("permission: allowed"));
    game.log.wait_for(&format!("settled {id} {request} allowed"));
    assert!(!game.sessions.answer_permission(request, false), "answered once");

    // The player never answers a session that gives them 300 ms.
    let mut config = agent(&dirs, &[]).permissions(PermissionPolicy::AskPlayer);
    config.timeouts.permission = Duration::from_millis(300);
    let ignored = game.create(config).expect("starts");
    let ignored_id = ignored.id().to_string();
    let unanswered = game.block_on(ignored.send_text("ask")).expect("the turn ends");
    assert_eq!(unanswered.final_message.as_deref(), Some("permission: denied"), "unanswered is denied");
    let (_, unanswered) = game.log.permission_asked(&ignored_id);
    game.log.wait_for(&format!("settled {ignored_id} {unanswered} timed_out"));
    let settled =
        |session: &str| game.log.lines().iter().filter(|line| line.starts_with(&format!("settled {session} "))).count();
    assert_eq!((settled(&id), settled(&ignored_id)), (1, 1), "each request settled once: {:#?}", game.log.lines());
}

#[test]
fn an_agent_that_needs_a_sign_in_says_which_methods_it_offers_and_signs_in_with_the_one_the_game_chose() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // Nobody chose a method: the start fails saying what the agent offers and how to sign in.
    let error = game.create(agent(&dirs, &["--require-auth"])).expect_err("needs a sign-in");
    assert_eq!(error.code, ErrorCode::AgentUnavailable, "{error:?}");
    assert!(error.message.contains("needs you to sign in"), "{}", error.message);
    assert!(error.message.contains("`scripted-key` (Use SCRIPTED_AGENT_KEY: Requires setting"), "{}", error.message);
    assert!(error.message.contains("`scripted-login` (Log in, in a terminal)"), "{}", error.message);
    assert!(error.message.contains("SessionConfig::auth_method"), "{}", error.message);
    assert_eq!(error.details.extra.get("auth_required"), Some(&serde_json::json!(true)));
    let methods = error.details.extra.get("auth_methods");
    assert_eq!(methods, Some(&serde_json::json!(["scripted-key", "scripted-login"])));

    // A method the game cannot use (run in a terminal) or one not offered: said so, before any session.
    for (chosen, says) in [("scripted-login", "in a terminal"), ("nope", "offers no sign-in method `nope`")] {
        let config = agent(&dirs, &["--require-auth"]).auth_method(chosen);
        let error = game.create(config).expect_err("not usable");
        assert!(error.message.contains(says), "{chosen}: {}", error.message);
    }
    // The chosen method, whose key is missing from the agent's environment: the agent's words.
    let config = agent(&dirs, &["--require-auth"]).auth_method("scripted-key");
    let error = game.create(config).expect_err("no key");
    assert!(error.message.contains("signing in to the agent with `scripted-key` failed"), "{}", error.message);
    assert!(error.message.contains("SCRIPTED_AGENT_KEY is not set"), "{}", error.message);

    // An agent that needs no sign-in is not signed in (that would replace the person's own login): the method
    // chosen is not even looked at.
    let config = agent(&dirs, &[]).auth_method("scripted-key");
    game.create(config).expect("no sign-in needed, none made");

    // With the key there, the game signs in and the session works.
    let config = agent(&dirs, &["--require-auth"]).auth_method("scripted-key").env("SCRIPTED_AGENT_KEY", "k");
    let session = game.create(config).expect("signed in, started");
    let turn = game.block_on(session.send_text("hello")).expect("a turn");
    assert_eq!(turn.final_message.as_deref(), Some("You said: hello"));

    // A turn refused for a sign-in (a login that expired): the game signs in again with the method it chose, before
    // the next text, which is taken.
    let (code, message) = code_of(game.block_on(session.send_text("needs-sign-in")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("needs you to sign in") && message.contains("signs in again with `scripted-key`"));
    assert!(message.contains("the stored login expired"), "the agent's own words: {message}");
    game.block_on(session.send_text("again")).expect("the next turn, signed in");

    // Without a method chosen, the refusal says what the agent offers and how to sign in.
    let session = game.create(agent(&dirs, &[])).expect("started");
    let (code, message) = code_of(game.block_on(session.send_text("needs-sign-in")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("the stored login expired") && message.contains("command line"), "{message}");
    assert!(!message.contains("signs in again"), "{message}");
    game.block_on(session.send_text("again")).expect("the next turn");
}

#[test]
fn a_sign_in_is_not_counted_against_the_start_timeout_and_has_its_own() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // The person takes longer to sign in (in a browser) than the whole start may take.
    let signing_in = |start: u64, sign_in: u64| {
        let timeouts = SessionTimeouts {
            start: Duration::from_secs(start),
            sign_in: Duration::from_secs(sign_in),
            ..Default::default()
        };
        agent(&dirs, &["--require-auth"])
            .auth_method("scripted-key")
            .env("SCRIPTED_AGENT_KEY", "k")
            .env("SCRIPTED_SIGN_IN_MS", "6000")
            .timeouts(timeouts)
    };
    let session = game.create(signing_in(5, 300)).expect("signed in, started");
    game.block_on(session.send_text("hello")).expect("a turn");
    // A sign-in past its own timeout fails the start, saying so.
    let error = game.create(signing_in(20, 1)).expect_err("the sign-in took too long");
    assert_eq!(error.code, ErrorCode::AgentUnavailable);
    assert!(
        error.message.contains("signing in to the agent with `scripted-key` did not finish within 1s"),
        "{error:?}"
    );
}

#[test]
fn permission_requests_for_the_games_own_tools_are_allowed_without_asking_under_any_policy() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // As Claude Code's adapter names the tool, as Gemini CLI titles it, and as Codex's adapter asks.
    for (policy, ask) in [
        (PermissionPolicy::Deny, "ask-call"),
        (PermissionPolicy::AskPlayer, "ask-call"),
        (PermissionPolicy::Deny, "ask-call-gemini"),
        (PermissionPolicy::AskPlayer, "ask-call-gemini"),
        (PermissionPolicy::Deny, "ask-call-codex"),
        (PermissionPolicy::AskPlayer, "ask-call-codex"),
        (PermissionPolicy::Deny, "ask-call-codex-1"),
        (PermissionPolicy::AskPlayer, "ask-call-codex-1"),
    ] {
        // Codex's requests are read so only from an agent that says it is Codex's adapter.
        let name: &[&str] = if ask.starts_with("ask-call-codex") { &["--name", "codex-acp"] } else { &[] };
        let session = game.create(agent(&dirs, name).permissions(policy)).expect("starts");
        let before = game.counter();
        let turn = game.block_on(session.send_text(&format!("{ask} bump {{}}"))).expect("the turn ends");
        let answer = turn.final_message.expect("the agent's last message");
        assert!(answer.starts_with("bump answered: {") && !answer.contains("error"), "{policy:?} {ask}: {answer}");
        assert_eq!(game.counter(), before + 1, "{policy:?} {ask}: the game's tool ran");
    }
    let log = game.log_after_frames();
    assert!(!log.iter().any(|line| line.starts_with("permission ")), "the player was never asked: {log:?}");
}

#[test]
fn a_permission_request_offering_only_a_standing_allow_is_refused_without_asking_the_player() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[]).permissions(PermissionPolicy::AskPlayer)).expect("starts");
    let turn = game.block_on(session.send_text("ask-standing")).expect("the turn ends");
    // Neither the player nor the game's policy gives an allow for every later request.
    assert_eq!(turn.final_message.as_deref(), Some("permission: reject"));
    let log = game.log_after_frames();
    assert!(!log.iter().any(|line| line.starts_with("permission ")), "nobody was asked: {log:#?}");
}

#[test]
fn a_request_shaped_as_codexs_approval_from_another_agent_goes_to_the_permission_policy() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // Another agent may put a model's own arguments in a request's raw input: its requests are never read as
    // Codex's, so the default policy denies this one and the game's tool does not run.
    for name in [&["--name", "claude-agent-acp"][..], &[]] {
        for ask in ["ask-call-codex", "ask-call-codex-1"] {
            let session = game.create(agent(&dirs, name)).expect("starts");
            let before = game.counter();
            let turn = game.block_on(session.send_text(&format!("{ask} bump {{}}"))).expect("the turn ends");
            assert_eq!(turn.final_message.as_deref(), Some("permission: denied"), "{name:?} {ask}");
            assert_eq!(game.counter(), before, "{name:?} {ask}: the tool did not run");
        }
    }
}

#[test]
fn an_agent_asking_permission_in_a_loop_puts_at_most_16_requests_to_the_player_and_the_rest_are_denied() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // Long enough for all 20 requests to reach the game before the first of those put to the player times out.
    let mut config = agent(&dirs, &[]).permissions(PermissionPolicy::AskPlayer);
    config.timeouts.permission = Duration::from_secs(5);
    let session = game.create(config).expect("starts");
    let id = session.id().to_string();
    let turn = game.block_on(session.send_text("ask-many 20")).expect("the turn ends");
    // Unanswered, the 16 put to the player time out (denied); the 4 past the cap were denied at once.
    assert_eq!(turn.final_message.as_deref(), Some(r#"permissions: {"denied":20}"#));
    let log = game.log_after_frames();
    let asked = log.iter().filter(|line| line.starts_with(&format!("permission {id} "))).count();
    assert_eq!(asked, 16, "only 16 prompts reached the player: {log:#?}");
}

#[test]
fn s2_cancelling_a_turn_answers_its_waiting_permission_request_cancelled_so_the_turn_ends() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // The player is given a minute to answer: only the cancel can end this turn in time.
    let config = agent(&dirs, &[]).permissions(PermissionPolicy::AskPlayer);
    assert!(config.timeouts.permission > config.timeouts.cancel_grace);
    let session = game.create(config).expect("starts");
    let id = session.id().to_string();
    let pending = game.block_on(session.start_turn("ask")).expect("sent");
    let (_, request) = game.log.permission_asked(&id);

    assert!(session.cancel());
    let turn = game.block_on(pending).expect("the agent ends the cancelled turn itself, within its grace");
    assert_eq!(turn.final_message.as_deref(), Some("permission: cancelled"), "the agent got `cancelled`");
    assert_eq!(turn.stop_reason, StopReason::Cancelled);
    assert!(!game.sessions.answer_permission(request, true), "the request is no longer waiting");
    game.log.wait_for(&format!("settled {id} {request} withdrawn"));
    assert_eq!(session.status(), ConversationStatus::Idle, "the session stays usable");
    let next = game.block_on(session.send_text("hello")).expect("the next turn runs");
    assert!(next.final_message.is_some());
}

#[test]
fn s2_cancelling_a_turn_cancels_its_tool_call_running_in_the_game_and_the_agent_reads_cancelled() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // Long enough for the agent to read its call's end; without that, only the grace would end the turn.
    let mut config = agent(&dirs, &[]);
    config.timeouts.cancel_grace = Duration::from_secs(5);
    let session = game.create(config).expect("starts");
    let pending = game.block_on(session.start_turn("call held {}")).expect("sent");
    game.block_on(game.gate.arrivals(1));
    assert_eq!(session.status(), ConversationStatus::WaitingToolResult);

    assert!(session.cancel());
    let turn = game.block_on(pending).expect("the turn ends");
    let answer = turn.final_message.expect("the agent's last message");
    assert!(answer.starts_with("held answered: error") && answer.contains("CANCELLED"), "{answer}");
    game.gate.open();
    game.block_on(game.answered.arrivals(1));
    assert_eq!(game.executions.load(Ordering::SeqCst), 0, "the cancelled call never changed the world");
    assert_eq!(session.status(), ConversationStatus::Idle);
}

/// A session whose turn `script` (`after-cancel ...`) waits for the player's cancel, cancelled: the session, its
/// id, and how the agent ended the turn (within a cancel grace of 5 s).
fn cancel_while_the_agent_waits(game: &Game, dirs: &Dirs, script: &str) -> (AgentSession, String, TurnEnd) {
    let mut config = agent(dirs, &[]);
    config.timeouts.cancel_grace = Duration::from_secs(5);
    let session = game.create(config).expect("starts");
    let id = session.id().to_string();
    let pending = game.block_on(session.start_turn(script)).expect("sent");
    // This session's line: an earlier session of the same test said it too.
    game.log.0.wait_until("the agent waits for the cancel", LIMIT, |lines| {
        lines.iter().find(|line| line.contains(id.as_str()) && line.contains("waiting for the cancel")).cloned()
    });
    assert!(session.cancel());
    let turn = game.block_on(pending).expect("the agent ends the cancelled turn, within its grace");
    (session, id, turn)
}

#[test]
fn s2_a_tool_call_the_agent_makes_after_the_players_cancel_is_refused_and_never_changes_the_world() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // The tool would run at once: only its refusal keeps the world as the player left it.
    game.gate.open();
    let (session, id, turn) = cancel_while_the_agent_waits(&game, &dirs, "after-cancel call held {}");
    let answer = turn.final_message.expect("the agent's last message");
    // (The agent's messages have no ids: what it said while waiting is part of it.)
    assert!(answer.contains("held answered: error") && answer.contains("CANCELLED"), "{answer}");
    assert!(answer.contains("the player cancelled the turn"), "says why: {answer}");
    assert_eq!(turn.stop_reason, StopReason::Cancelled);
    assert_eq!(game.executions.load(Ordering::SeqCst), 0, "the call never ran");
    let log = game.log_after_frames();
    assert!(!log.iter().any(|line| line.starts_with(&format!("call-started {id}"))), "nor started");

    // The next turn's calls run.
    let next = game.block_on(session.send_text("call held {}")).expect("the next turn runs");
    assert!(next.final_message.is_some_and(|m| m.contains("\"counter\":1")), "the next turn's call ran");
}

#[test]
fn s2_a_permission_request_that_crosses_the_players_cancel_is_answered_cancelled_without_asking() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let (session, id, turn) = cancel_while_the_agent_waits(&game, &dirs, "after-cancel ask");
    let answer = turn.final_message.expect("the agent's last message");
    assert!(answer.ends_with("permission: cancelled"), "ACP: `cancelled` after a cancel: {answer}");
    assert_eq!(turn.stop_reason, StopReason::Cancelled);
    let log = game.log_after_frames();
    assert!(!log.iter().any(|line| line.starts_with(&format!("permission {id} "))), "nobody was asked");
    assert_eq!(session.status(), ConversationStatus::Idle, "the session stays usable");

    // For one of the game's own tools too, which is allowed without asking while the turn runs; and for a request
    // offering only a standing allow, which is refused without asking while the turn runs.
    for (script, otherwise) in [("after-cancel ask-game bump", "allowed"), ("after-cancel ask-standing", "refused")] {
        let (_, _, turn) = cancel_while_the_agent_waits(&game, &dirs, script);
        let answer = turn.final_message.expect("the agent's last message");
        assert!(
            answer.ends_with("permission: cancelled"),
            "ACP: `cancelled` after a cancel, not {otherwise}: {answer}"
        );
    }
}

#[test]
fn s2_a_cancelled_turn_the_agent_never_ends_stops_the_agent_after_the_grace_and_resume_restarts_it() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let mut config = agent(&dirs, &[]);
    config.timeouts.cancel_grace = Duration::from_millis(300);
    let session = game.create(config).expect("starts");
    let pending = game.block_on(session.start_turn("hang")).expect("sent");
    assert!(session.cancel());
    // An agent that ignores a cancel could go on calling tools: it is stopped, not kept.
    let (code, message) = code_of(game.block_on(pending));
    assert_eq!(code, ErrorCode::Cancelled, "{message}");
    assert_eq!(session.status(), ConversationStatus::Error);
    dirs.wait_no_agents(LIMIT);
    game.block_on(session.resume()).expect("resumed");
    let next = game.block_on(session.send_text("hello")).expect("the next text is taken");
    assert_eq!(next.final_message.as_deref(), Some("You said: hello"), "by the restarted agent");
}

/// The permission request of `session` the events show put to the player.
fn requested(events: &[ConversationEvent], session: &ConversationId) -> u64 {
    events
        .iter()
        .find_map(|event| match event {
            ConversationEvent::PermissionRequested(asked) if &asked.session == session => Some(asked.request),
            _ => None,
        })
        .expect("the prompt was put to the player")
}

/// Where in `events` permission request `request` was settled as withdrawn.
fn withdrawn_at(events: &[ConversationEvent], request: u64) -> Option<usize> {
    events.iter().position(|event| {
        matches!(event, ConversationEvent::PermissionSettled(settled)
            if settled.request == request && settled.outcome == PermissionOutcome::Withdrawn)
    })
}

#[test]
fn a_permission_prompt_the_agent_leaves_open_when_its_turn_ends_is_withdrawn_with_the_turn() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[]).permissions(PermissionPolicy::AskPlayer)).expect("starts");
    let mut events = game.game.agent().subscribe();
    let turn = game.block_on(session.send_text("ask-and-end")).expect("the turn ends");
    assert_eq!(turn.stop_reason, StopReason::EndTurn);
    // Everything the turn published came before its outcome.
    let events = events.drain();
    let request = requested(&events, session.id());
    let withdrawn = withdrawn_at(&events, request).is_some();
    assert!(withdrawn, "the prompt is taken down with its turn: {events:#?}");
    assert!(!game.sessions.answer_permission(request, true), "nobody waits for an answer any more");
}

#[test]
fn an_agent_process_gets_no_variable_holding_the_games_own_token_but_the_rest_of_the_environment() {
    // A game that reads its MCP token from its environment: the agent, which inherits it, must reach the game with
    // its session's credential only (revoked with the session), never with the token that opens every conversation.
    // Setting a variable races other threads reading the environment (other tests start processes): the test runs
    // again in a process of its own, started with the variables.
    if std::env::var_os("AGENT_SESSIONS_GAME_TOKEN").is_none() {
        let name = "an_agent_process_gets_no_variable_holding_the_games_own_token_but_the_rest_of_the_environment";
        let run = std::process::Command::new(std::env::current_exe().expect("this test binary"))
            .args([name, "--exact", "--test-threads=1"])
            .env("AGENT_SESSIONS_GAME_TOKEN", TOKEN)
            .env("AGENT_SESSIONS_OTHER", "kept")
            .output()
            .expect("the test runs in a process of its own");
        let shown = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
        assert!(run.status.success() && shown.contains("1 passed"), "{shown}");
        return;
    }
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("starts");
    let said = |name: &str| game.block_on(session.send_text(&format!("env {name}"))).expect("a turn").final_message;
    assert_eq!(said("AGENT_SESSIONS_GAME_TOKEN").as_deref(), Some("env AGENT_SESSIONS_GAME_TOKEN="));
    assert_eq!(said("AGENT_SESSIONS_OTHER").as_deref(), Some("env AGENT_SESSIONS_OTHER=kept"));
    // Gemini CLI starts no MCP server in a folder it does not trust: told to trust the session's workspace, unless
    // the game's environment or the session's command says otherwise.
    let trust = "GEMINI_CLI_TRUST_WORKSPACE";
    if std::env::var_os(trust).is_none() {
        assert_eq!(said(trust).as_deref(), Some("env GEMINI_CLI_TRUST_WORKSPACE=true"));
    }
    game.block_on(session.end());
    let session = game.create(agent(&dirs, &[]).env(trust, "false")).expect("starts");
    let said = game.block_on(session.send_text(&format!("env {trust}"))).expect("a turn").final_message;
    assert_eq!(said.as_deref(), Some("env GEMINI_CLI_TRUST_WORKSPACE=false"), "the session's command decides");
    game.block_on(session.end());
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn a_permission_request_the_agent_withdraws_is_answered_cancelled_and_taken_down() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let mut config = agent(&dirs, &[]).permissions(PermissionPolicy::AskPlayer);
    // Nobody answers: only the agent's withdrawal can settle the prompt before the turn's own end.
    config.timeouts.permission = Duration::from_secs(600);
    config.timeouts.turn = Duration::from_secs(60);
    let session = game.create(config).expect("starts");
    let mut events = game.game.agent().subscribe();
    let turn = game.block_on(session.send_text("ask-withdrawn")).expect("the turn ends");
    assert_eq!(turn.final_message.as_deref(), Some("withdrawn permission: cancelled"), "as ACP answers it");
    let events = events.drain();
    let request = requested(&events, session.id());
    let settled = withdrawn_at(&events, request);
    let said = events.iter().position(|event| {
        matches!(event, ConversationEvent::ChatMessage(message)
        if message.text.contains("withdrawn permission"))
    });
    assert!(settled.is_some() && settled < said, "taken down before the agent heard of it: {events:#?}");
    assert!(!game.sessions.answer_permission(request, true), "nobody waits for an answer any more");
}

#[test]
fn a_permission_prompt_of_a_session_that_fails_is_settled_withdrawn_before_its_failure_is_published() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let mut config = agent(&dirs, &[]).permissions(PermissionPolicy::AskPlayer);
    config.timeouts.turn = Duration::from_secs(5);
    let session = game.create(config).expect("starts");
    let id = session.id().to_string();
    let pending = game.block_on(session.start_turn("ask")).expect("sent");
    let (_, request) = game.log.permission_asked(&id);

    // Every event from now on, in the order published; nobody answers, and the turn times out.
    let mut events = game.game.agent().subscribe();
    let (code, _) = code_of(game.block_on(pending));
    assert_eq!(code, ErrorCode::Timeout);
    let events = events.drain();
    let settled = withdrawn_at(&events, request);
    let failed =
        events.iter().position(|event| event.as_status().is_some_and(|s| s.status == ConversationStatus::Error));
    assert!(settled.is_some() && settled < failed, "the prompt is taken down, then the session fails: {events:#?}");
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn a_permission_prompt_of_a_session_that_ends_is_settled_withdrawn_before_its_end_is_published() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[]).permissions(PermissionPolicy::AskPlayer)).expect("starts");
    let id = session.id().to_string();
    let pending = game.block_on(session.start_turn("ask")).expect("sent");
    let (_, request) = game.log.permission_asked(&id);

    // Every event from now on, in the order published.
    let mut events = game.game.agent().subscribe();
    game.block_on(session.end());
    let (code, _) = code_of(game.block_on(pending));
    assert_eq!(code, ErrorCode::SessionEnded);
    let events = events.drain();
    let settled = withdrawn_at(&events, request);
    let ended =
        events.iter().position(|event| event.as_status().is_some_and(|s| s.status == ConversationStatus::Ended));
    assert!(settled.is_some() && settled < ended, "the prompt is taken down, then the session ends: {events:#?}");
    game.log.wait_for(&format!("settled {id} {request} withdrawn"));
    assert!(!game.sessions.answer_permission(request, true), "nobody waits for an answer any more");
    dirs.wait_no_agents(LIMIT);
    // The end cancels the turn (`session/cancel`): ACP has every permission request pending then answered
    // `cancelled`, not a rejection the player never made (which the agent would remember).
    let backend = session.backend_session().expect("an agent session");
    let verdict = std::fs::read_to_string(dirs.state.join(format!("{backend}.permission")));
    assert_eq!(verdict.expect("the agent wrote what it was answered"), "cancelled");
}

#[test]
fn a_chat_deleted_just_before_the_game_exits_stays_deleted() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // An agent that ignores the end of its input and SIGTERM: ending it takes the whole close ladder (seconds).
    let session = game.create(agent(&dirs, &["--stubborn"]).auto_end_on_disconnect(false)).expect("starts");
    let id = session.id().clone();
    let sessions = game.sessions.clone();
    let forgetting = game.game.agent().runtime().spawn({
        let id = id.clone();
        async move { sessions.forget(id).await }
    });
    game.log.wait_for(&format!("status {id} idle->ended"));
    // The player quits while the forget still ends the agent.
    game.game.stop();
    assert!(!dirs.data.join(id.as_str()).exists(), "the deleted chat's folder is gone once the game has exited");
    drop(forgetting);
    dirs.wait_no_agents(LIMIT);
}

/// Quits the game once `attaching` (a create or resume under way, on the game's runtime) has an agent started and
/// hanging, and its session's folder is there; then checks that the exit stopped it, saying so, and left nothing.
fn quit_while<T: std::fmt::Debug + Send + 'static>(
    dirs: &Dirs,
    game: Game,
    attaching: impl std::future::Future<Output = Result<T, ToolError>> + Send + 'static,
) {
    let attaching = game.game.agent().runtime().spawn(attaching);
    let until = Instant::now() + LIMIT;
    while dirs.agents_alive() == 0 || session_folders(dirs).is_empty() {
        assert!(Instant::now() < until, "the agent was started, and the session's folder is there");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The player quits while the agent is still starting.
    game.game.stop();
    assert!(session_folders(dirs).is_empty(), "the game has exited: {:?}", session_folders(dirs));
    let outcome = bevy::tasks::block_on(attaching).expect("it ended before the runtime stopped");
    let error = outcome.expect_err("stopped");
    assert_eq!(error.code, ErrorCode::AgentUnavailable);
    assert!(error.message.contains("the game is exiting"), "{error}");
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn a_session_being_created_when_the_game_exits_stops_leaves_nothing_and_its_caller_hears_why() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // An agent that never answers `initialize`, and a start timeout far away: only the exit ends the create.
    let (sessions, config) = (game.sessions.clone(), agent(&dirs, &["--hang-init"]));
    quit_while(&dirs, game, async move { sessions.create(config).await });
}

#[test]
fn a_session_being_resumed_when_the_game_exits_stops_and_ends_as_the_exit_ends_it() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("starts");
    assert!(game.block_on(session.send_text("crash")).is_err());
    dirs.wait_no_agents(LIMIT);
    // Its agent, started again, never answers `initialize`: only the exit ends the resume (and the exit ends the
    // session, which was not kept, once the resume let go of it).
    std::fs::create_dir_all(&dirs.state).expect("the agent's state folder");
    std::fs::write(dirs.state.join("init-hangs"), b"").expect("written");
    quit_while(&dirs, game, async move { session.resume().await });
}

#[test]
fn an_end_stops_a_resume_under_way_instead_of_waiting_for_it() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let timeouts = SessionTimeouts { start: Duration::from_secs(600), ..Default::default() };
    let session = game.create(agent(&dirs, &[]).timeouts(timeouts)).expect("starts");
    game.block_on(session.end());
    dirs.wait_no_agents(LIMIT);
    // Its agent, started again, never answers `initialize` (as one waiting for a sign-in in a browser), and the
    // start may take 10 minutes: the player's End must not wait for it.
    std::fs::create_dir_all(&dirs.state).expect("the agent's state folder");
    std::fs::write(dirs.state.join("init-hangs"), b"").expect("written");
    let resuming = game.game.agent().runtime().spawn({
        let session = session.clone();
        async move { session.resume().await }
    });
    let until = Instant::now() + LIMIT;
    while dirs.agents_alive() == 0 {
        assert!(Instant::now() < until, "the agent was started again");
        std::thread::sleep(Duration::from_millis(5));
    }
    let ending = Instant::now();
    game.block_on(session.end());
    assert!(ending.elapsed() < Duration::from_secs(20), "the end waited {:?} for the resume", ending.elapsed());
    let resumed = bevy::tasks::block_on(resuming).expect("the resume ended");
    assert_eq!(resumed.expect_err("stopped by the end").code, ErrorCode::SessionEnded);
    assert_eq!(session.status(), ConversationStatus::Ended);
    dirs.wait_no_agents(LIMIT);

    // The same through the game's messages, which carry out one session's requests in order: the end does not
    // wait behind the resume written before it.
    let ending = Instant::now();
    let id = session.id().clone();
    let [resume, end] =
        game.requests([SessionRequest::Resume { session: id.clone() }, SessionRequest::End { session: id.clone() }]);
    let resumed = game.log.answer(resume).outcome.expect_err("stopped by the end");
    assert_eq!(resumed.code, ErrorCode::SessionEnded, "{resumed:?}");
    assert!(matches!(game.log.answer(end).outcome, Ok(SessionReply::Ended)));
    assert!(ending.elapsed() < Duration::from_secs(20), "the end waited {:?} for the resume", ending.elapsed());
    dirs.wait_no_agents(LIMIT);

    // Nor must forgetting the session wait for one.
    let resuming = game.game.agent().runtime().spawn({
        let session = session.clone();
        async move { session.resume().await }
    });
    while dirs.agents_alive() == 0 {
        assert!(Instant::now() < until, "the agent was started again");
        std::thread::sleep(Duration::from_millis(5));
    }
    let forgetting = Instant::now();
    game.block_on(game.sessions.forget(session.id().clone())).expect("forgotten");
    assert!(forgetting.elapsed() < Duration::from_secs(20), "the forget waited {:?}", forgetting.elapsed());
    let resumed = bevy::tasks::block_on(resuming).expect("the resume ended");
    assert_eq!(resumed.expect_err("stopped by the forget").code, ErrorCode::SessionEnded);
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn s4_the_games_exit_stops_every_agent_even_one_that_ignores_sigterm_and_its_input() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let _polite = game.create(agent(&dirs, &[])).expect("starts");
    let _stubborn = game.create(agent(&dirs, &["--stubborn"])).expect("starts");
    assert_eq!(dirs.agents_running(), 2);
    let started = Instant::now();
    game.game.stop();
    // Bounded: the close ladder (input closed, 1 s, SIGTERM, 2 s, SIGKILL) inside the sessions' exit deadline (5 s).
    assert!(started.elapsed() < Duration::from_secs(20), "the exit waited {:?}", started.elapsed());
    // The stubborn one ignores SIGTERM and its input: were it left behind, it would never go.
    dirs.wait_no_agents(LIMIT);
    // And it went by the ladder, each step taken in turn, not only by the runtime's drop (which kills at once).
    assert!(dirs.state.join("input-closed").exists(), "its input was closed first");
    assert!(dirs.state.join("sigterm").exists(), "then it was asked to stop with SIGTERM");
}

#[test]
fn s4_the_games_exit_removes_an_ended_sessions_folder_even_when_its_agent_never_answers_session_close() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // A game that gives its agents long to close their sessions, and an agent that never does.
    let mut config = agent(&dirs, &["--silent-close"]);
    config.timeouts.close = Duration::from_secs(10);
    let session = game.create(config).expect("starts");
    let folder = dirs.data.join(session.id().as_str());
    assert!(folder.is_dir(), "the session keeps its folder while it runs");
    // The session's close timeout would take the whole of the exit's time for sessions (5 s): the folder would be
    // left for the next start's sweep.
    game.game.with_app(|app| {
        app.world_mut().write_message(AppExit::Success);
        app.update();
    });
    assert!(!folder.exists(), "the exit frame removed the ended session's folder");
    game.game.stop();
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn s4_ends_already_under_way_when_the_game_exits_get_the_exits_close_time_not_their_own() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // Agents that never answer `session/close`, in a game that gives them long to (longer than the exit's 5 s).
    let config = || {
        let mut config = agent(&dirs, &["--silent-close"]);
        config.timeouts.close = Duration::from_secs(10);
        config
    };
    let (forgotten, ended) = (game.create(config()).expect("starts"), game.create(config()).expect("starts"));
    let folder = dirs.data.join(forgotten.id().as_str());
    // The player deletes one chat and ends the other: both wait for their agent's answer when the game exits.
    let (sessions, id) = (game.sessions.clone(), forgotten.id().clone());
    let runtime = game.game.agent().runtime().clone();
    let _forgetting = runtime.spawn(async move { sessions.forget(id).await });
    let _ending = runtime.spawn(async move { ended.end().await });
    let asked = || {
        let files = std::fs::read_dir(&dirs.state).expect("the agents' state folder").filter_map(Result::ok);
        files.filter(|file| file.file_name().to_string_lossy().ends_with(".close-asked")).count()
    };
    let until = Instant::now() + LIMIT;
    while asked() < 2 {
        assert!(Instant::now() < until, "both agents were asked to close their sessions");
        std::thread::sleep(Duration::from_millis(20));
    }
    game.game.with_app(|app| {
        app.world_mut().write_message(AppExit::Success);
        app.update();
    });
    // Within the exit's time for sessions: the forget finished, and both agents stopped.
    assert!(!folder.exists(), "the forget under way finished in the exit frame");
    assert_eq!(dirs.agents_running(), 0, "the ends under way stopped their agents in the exit frame");
    game.game.stop();
    dirs.wait_no_agents(LIMIT);
}

/// POSTs `tools/list` (2026-07-28, stateless) with `token`; returns the HTTP status.
fn post_tools_list(url: &str, token: &str) -> u16 {
    use std::io::{Read, Write};
    let address = url.trim_start_matches("http://").split('/').next().expect("host:port");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}"#;
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    stream.write_all(request.as_bytes()).expect("send");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.split(' ').nth(1).and_then(|status| status.parse().ok()).unwrap_or(0)
}

#[test]
fn the_players_text_reaches_the_agent_as_one_block_word_for_word_and_the_system_prompt_goes_apart() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let text = "blocks  with   odd spacing \"quotes\" and\nnewlines ";
    let blocks = |session: &AgentSession| -> Vec<String> {
        let turn = game.block_on(session.send_text(text)).expect("the turn ends");
        serde_json::from_str(&turn.final_message.expect("a reply")).expect("a JSON array")
    };

    let native = game.create(agent(&dirs, &[]).system_prompt("Be brief.")).expect("starts");
    assert_eq!(blocks(&native), vec!["[system] Be brief.".to_string(), text.to_string()]);

    // H14: the world's observation of the moment goes in a block of its own.
    game.observations.lock().push(Some(serde_json::json!({ "standing_on": "grass" })));
    let observed = blocks(&native);
    assert_eq!(observed[..2], ["[system] Be brief.".to_string(), text.to_string()]);
    assert!(
        observed[2].starts_with("[Game context") && observed[2].contains(r#""standing_on":"grass""#),
        "{observed:?}"
    );
    assert_eq!(blocks(&native).len(), 2, "each text asks anew; no earlier observation is reused");

    let fallback = game.create(agent(&dirs, &["--no-system-prompt"]).system_prompt("Be brief.")).expect("starts");
    assert_eq!(blocks(&fallback), vec!["[Instructions from the game]\nBe brief.".to_string(), text.to_string()]);
    assert_eq!(blocks(&fallback), vec![text.to_string()], "the instructions go once, with the first turn");

    // Claude's adapter offers no `systemPrompt` capability but reads `_meta.systemPrompt.append`: the prompt goes
    // there, as a system prompt that a compaction of a long conversation keeps, not as a first turn's text.
    let claude = agent(&dirs, &["--no-system-prompt", "--name", "claude-agent-acp"]).system_prompt("Be brief.");
    let claude = game.create(claude).expect("starts");
    assert_eq!(blocks(&claude), vec!["[system] Be brief.".to_string(), text.to_string()]);
}

#[test]
fn an_agent_that_lost_the_session_fails_it_and_resume_starts_the_agent_again() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("starts");
    game.block_on(session.send_text("hello")).expect("a turn");
    // As Claude's adapter once its Claude Code process died: it still runs, but refuses every text from now on.
    let (code, message) = code_of(game.block_on(session.send_text("lose-session")));
    assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
    assert!(message.contains("lost the session") && message.contains("resume"), "{message}");
    assert_eq!(session.status(), ConversationStatus::Error, "failed, not left to refuse each text alike");
    dirs.wait_no_agents(LIMIT);
    assert_eq!(game.block_on(session.resume()).expect("resumed"), Attached::Resumed);
    let history = game.block_on(session.send_text("history")).expect("a turn");
    assert_eq!(history.final_message.as_deref(), Some("I remember 2 turns"), "the same session, re-attached");
}

#[test]
fn the_games_instructions_go_again_until_a_turn_that_carried_them_ended() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let text = "blocks please";
    let blocks = |session: &AgentSession| -> Vec<String> {
        let turn = game.block_on(session.send_text(text)).expect("the turn ends");
        serde_json::from_str(&turn.final_message.expect("a reply")).expect("a JSON array")
    };
    let instructed = vec!["[Instructions from the game]\nBe brief.".to_string(), text.to_string()];
    // The agent takes no system prompt and crashes in the first turn, which carried the instructions: the
    // re-attached session still has not had them.
    let session = game.create(agent(&dirs, &["--no-system-prompt"]).system_prompt("Be brief.")).expect("starts");
    assert!(game.block_on(session.send_text("crash")).is_err());
    assert_eq!(game.block_on(session.resume()).expect("resumed"), Attached::Resumed);
    assert_eq!(blocks(&session), instructed, "sent again: the turn that carried them never ended");
    assert_eq!(blocks(&session), vec![text.to_string()], "and then not again");
    assert!(game.block_on(session.send_text("crash")).is_err());
    assert_eq!(game.block_on(session.resume()).expect("resumed"), Attached::Resumed);
    assert_eq!(blocks(&session), vec![text.to_string()], "a re-attached session that had them is not sent them again");

    // A turn the model refused: ACP leaves its prompt out of what the agent keeps, the instructions with it.
    let refused = game.create(agent(&dirs, &["--no-system-prompt"]).system_prompt("Be brief.")).expect("starts");
    let turn = game.block_on(refused.send_text("refusal")).expect("the turn ends");
    assert_eq!(turn.stop_reason, StopReason::Refusal);
    assert_eq!(blocks(&refused), instructed, "sent again: the agent did not keep the turn that carried them");
    assert_eq!(blocks(&refused), vec![text.to_string()]);
}

#[test]
fn a_kept_session_that_had_the_games_instructions_is_not_sent_them_again_after_a_restart() {
    let dirs = Dirs::new();
    let text = "blocks please";
    let blocks = |game: &Game, session: &AgentSession| -> Vec<String> {
        let turn = game.block_on(session.send_text(text)).expect("the turn ends");
        serde_json::from_str(&turn.final_message.expect("a reply")).expect("a JSON array")
    };
    let config = agent(&dirs, &["--no-system-prompt"]).system_prompt("Be brief.").auto_end_on_disconnect(false);
    let (kept, owed) = {
        let game = Game::start(&dirs);
        let kept = game.create(config.clone()).expect("starts");
        assert_eq!(blocks(&game, &kept)[0], "[Instructions from the game]\nBe brief.");
        // Another, whose first turn never came: it still owes them after the restart.
        let owed = game.create(config).expect("starts");
        (kept.id().clone(), owed.id().clone())
    };
    dirs.wait_no_agents(LIMIT);

    let game = Game::start(&dirs);
    let kept = game.block_on(game.sessions.resume_session(kept)).expect("re-attached");
    assert_eq!(blocks(&game, &kept), vec![text.to_string()], "had them before the restart: not sent again");
    let owed = game.block_on(game.sessions.resume_session(owed)).expect("re-attached");
    assert_eq!(blocks(&game, &owed), vec!["[Instructions from the game]\nBe brief.".to_string(), text.to_string()]);
}

#[test]
fn resume_reattaches_with_session_load_where_that_is_all_the_agent_offers_and_says_so_when_it_cannot() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    // Replayed before the agent answers the load, or (as Gemini CLI does) after.
    for flags in [&["--load-only"][..], &["--load-only", "--late-replay"]] {
        let loading = game.create(agent(&dirs, flags)).expect("starts");
        let id = loading.id().to_string();
        assert!(game.block_on(loading.send_text("crash")).is_err());
        assert_eq!(game.block_on(loading.resume()).expect("resumed"), Attached::Loaded);
        if flags.contains(&"--late-replay") {
            // The resume is back once the replay that followed the load's answer went quiet: a text sent now is
            // not answered with the rest of the history.
            let session = loading.backend_session().expect("an agent session");
            assert!(dirs.state.join(format!("{session}.replayed")).exists(), "the replay was over");
        }
        let history = game.block_on(loading.send_text("history")).expect("the turn ends");
        assert_eq!(history.final_message.as_deref(), Some("I remember 2 turns"), "the same agent session, loaded");
        // Chat reaches the game in order: once the turn's end is there (its first without a crash), so is
        // anything before it.
        game.log.wait_for(&format!("status {id} running->idle"));
        assert!(
            !game.log.lines().iter().any(|line| line.contains(&id) && line.contains("(replayed history)")),
            "{flags:?}: the agent's replay of the history is not shown as new chat: {:#?}",
            game.log.lines()
        );
    }

    // A replay that never ends: the start runs out of time (it is shorter than the longest wait for a replay),
    // and says it was the replay it waited for, not an answer.
    let mut endless = agent(&dirs, &["--load-only", "--endless-replay"]);
    endless.timeouts.start = Duration::from_millis(2800);
    let endless = game.create(endless).expect("starts");
    assert!(game.block_on(endless.send_text("crash")).is_err());
    let error = game.block_on(endless.resume()).expect_err("the replay does not end");
    assert_eq!(error.code, ErrorCode::AgentUnavailable);
    assert!(
        error.message.contains("(it answered session/load, then its replay of the history did not end)"),
        "{error}"
    );

    let forgetful = game.create(agent(&dirs, &["--no-resume"])).expect("starts");
    let before = forgetful.backend_session();
    assert!(game.block_on(forgetful.send_text("crash")).is_err());
    assert_eq!(game.block_on(forgetful.resume()).expect("resumed"), Attached::Replaced, "says it is a new session");
    assert_ne!(forgetful.backend_session(), before);
    assert_eq!(forgetful.status(), ConversationStatus::Idle);
}

#[test]
fn s4_without_the_games_mcp_server_an_acp_session_is_refused_before_its_agent_starts() {
    let dirs = Dirs::new();
    let occupied = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to take");
    let taken = occupied.local_addr().expect("its address").port();
    // No McpPlugin at all; then one that could not start (its port taken, and told not to move).
    for strict_port in [None, Some(taken)] {
        let data = dirs.data.clone();
        let game = RunningGame::spawn(Duration::from_millis(2), move || {
            let tools = AgentToolsPlugin::new(TestGame::default());
            let sessions = AgentSessionsPlugin::new().data_dir(data);
            match strict_port {
                None => headless_app_with(tools, sessions),
                Some(port) => {
                    headless_app_with(tools, (McpPlugin::new().port(port).strict_port(true).token(TOKEN), sessions))
                }
            }
        });
        let sessions = game.with_app(|app| app.world().resource::<AgentSessions>().clone());
        // A program that does not exist: an attempt to start it would fail with its own error, naming it.
        let config = SessionConfig::acp("/nonexistent/acp-agent", Vec::<String>::new());
        let (code, message) = code_of(game.agent().runtime().block_on(sessions.create(config)));
        assert_eq!(code, ErrorCode::AgentUnavailable, "{message}");
        assert!(message.contains("tools over MCP"), "says the agent would have no tools: {message}");
        assert!(!message.contains("nonexistent"), "refused before the agent program was started: {message}");
        if strict_port.is_some() {
            assert!(message.contains(&taken.to_string()), "says why the server did not start: {message}");
        }
    }
    // The same program with a running MCP server: the attempt to start it is what fails, naming it.
    let game = Game::start(&dirs);
    let (code, message) = code_of(game.create(SessionConfig::acp("/nonexistent/acp-agent", Vec::<String>::new())));
    assert_eq!(code, ErrorCode::AgentUnavailable);
    assert!(message.contains("nonexistent"), "the control: a started agent's failure names it: {message}");
}

#[test]
fn acp_sessions_reach_the_mcp_server_whichever_plugin_was_added_first() {
    let dirs = Dirs::new();
    let data = dirs.data.clone();
    let game = RunningGame::spawn(Duration::from_millis(2), move || {
        let tools = AgentToolsPlugin::new(TestGame::default()).with_tool(bump_tool(
            "bump",
            ToolScope::World,
            Arc::default(),
            None,
        ));
        // Sessions first, MCP second: the server is looked up when the app is finished.
        let mut app = headless_app_with(
            tools,
            (AgentSessionsPlugin::new().data_dir(data), McpPlugin::new().port(0).token(TOKEN)),
        );
        bevy_agent_tools::testing::AgentTestAppExt::enter_world(&mut app, "alpha");
        app
    });
    let sessions = game.with_app(|app| app.world().resource::<AgentSessions>().clone());
    // Bounded by the session's own start and turn timeouts.
    let session = game.agent().runtime().block_on(sessions.create(agent(&dirs, &[]))).expect("the session starts");
    let turn = game.agent().runtime().block_on(session.send_text(r#"call bump {"by": 1}"#)).expect("the turn ends");
    let answer = turn.final_message.expect("a final message");
    assert!(answer.contains("\"counter\":1"), "the agent's call reached the game: {answer}");
    game.agent().runtime().block_on(session.end());
}

#[test]
fn a_session_created_while_the_app_is_built_waits_for_its_mcp_server() {
    let dirs = Dirs::new();
    let mut app = App::new();
    app.add_plugins(MinimalPlugins).add_plugins(AgentToolsPlugin::new(TestGame::default())).add_plugins((
        AgentSessionsPlugin::new().data_dir(&dirs.data),
        McpPlugin::new().port(0).token(TOKEN), // after the sessions' plugin, and the app not finished yet
    ));
    let sessions = app.world().resource::<AgentSessions>().clone();
    let runtime = app.world().resource::<bevy_agent_tools::AgentRuntime>().handle().clone();
    let mut creating = Box::pin(sessions.create(agent(&dirs, &[])));
    {
        let _runtime = runtime.enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        // Its first step is to find the MCP server: it waits for `finish` instead of failing.
        assert!(creating.as_mut().poll(&mut cx).is_pending(), "the session does not fail before the app is built");
    }
    app.finish();
    app.cleanup();
    let session = runtime.block_on(creating).expect("the session starts once the app is finished");
    runtime.block_on(session.end());
}

#[test]
fn the_crates_plugins_added_before_agent_tools_plugin_are_set_up_when_it_is_added() {
    let dirs = Dirs::new();
    let mut app = App::new();
    app.add_plugins(MinimalPlugins).add_plugins((
        AgentSessionsPlugin::new().data_dir(&dirs.data),
        McpPlugin::new().port(0).token(TOKEN),
        bevy_agent_tools::persist::WorldStorePlugin::new(dirs.data.join("saves")),
    ));
    assert!(!app.world().contains_resource::<McpServer>(), "nothing to start on before the host is built");
    app.add_plugins(AgentToolsPlugin::new(TestGame::default()));
    // Set up as the host is added, as they would be added after it: the game's plugins added next find them.
    assert!(app.world().contains_resource::<McpServer>());
    assert!(app.world().contains_resource::<AgentSessions>());
    assert!(app.world().contains_resource::<bevy_agent_tools::persist::WorldStore>());
    app.finish();
    app.cleanup();
    let sessions = app.world().resource::<AgentSessions>().clone();
    let runtime = app.world().resource::<bevy_agent_tools::AgentRuntime>().handle().clone();
    // An ACP agent's session starts only with the game's MCP endpoint.
    let session = runtime.block_on(sessions.create(agent(&dirs, &[]))).expect("the session finds the MCP server");
    runtime.block_on(session.end());
}

#[test]
#[should_panic(expected = "AgentSessionsPlugin needs AgentToolsPlugin, which the app does not have")]
fn a_sessions_plugin_in_an_app_without_agent_tools_plugin_is_a_set_up_mistake_found_at_finish() {
    let dirs = Dirs::new();
    let mut app = App::new();
    app.add_plugins(MinimalPlugins).add_plugins(AgentSessionsPlugin::new().data_dir(&dirs.data));
    app.finish();
}

#[test]
fn an_answered_permission_request_leaves_no_task_waiting_out_its_timeout() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[]).permissions(PermissionPolicy::AskPlayer)).expect("starts");
    let id = session.id().to_string();
    let metrics = game.game.agent().runtime().metrics();
    let before = metrics.num_alive_tasks();
    for n in 1..=20 {
        let pending = game.block_on(session.start_turn("ask")).expect("sent");
        let prefix = format!("permission {id} ");
        let request = game.log.0.wait_until("the agent's next request", LIMIT, |lines| {
            let asked: Vec<&String> = lines.iter().filter(|line| line.starts_with(&prefix)).collect();
            (asked.len() == n).then(|| asked[n - 1].split(' ').nth(2).and_then(|n| n.parse::<u64>().ok()))
        });
        assert!(game.sessions.answer_permission(request.expect("a request number"), true));
        assert_eq!(game.block_on(pending).expect("ends").final_message.as_deref(), Some("permission: allowed"));
    }
    // Each request's timeout (a minute by default) stops once it is answered.
    common::wait_tasks_back_to(&metrics, before, "20 requests", LIMIT);
}

#[test]
fn s2_a_turn_awaited_elsewhere_gets_an_outcome_when_the_game_is_dropped_without_an_exit() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[])).expect("starts");
    // The agent never answers this turn.
    let pending = game.block_on(session.start_turn("hang")).expect("sent");
    // The game panics: its app unwinds without `AppExit`, and the plugin's runtime stops with it.
    game.game.send(|_| panic!("the game panicked (on purpose)"));
    // Awaited on a runtime of the caller's own (a game thread, say), not the plugin's.
    let caller = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("a runtime");
    let outcome = caller.block_on(async { tokio::time::timeout(LIMIT, pending).await });
    let error = outcome.expect("an outcome, not a wait without end").expect_err("the game stopped");
    assert_eq!(error.code, ErrorCode::SessionEnded, "{error:?}");
    dirs.wait_no_agents(LIMIT);
}

#[test]
fn an_update_or_a_permission_request_the_agent_sends_for_another_session_is_not_this_sessions() {
    let dirs = Dirs::new();
    let game = Game::start(&dirs);
    let session = game.create(agent(&dirs, &[]).permissions(PermissionPolicy::AskPlayer)).expect("starts");
    let turn = game.block_on(session.send_text("stray")).expect("the turn ends");
    // Its permission request is refused as ACP's "resource not found" (-32002), and not put to this player.
    let mine = "mine; another session's permission: error -32002";
    assert_eq!(turn.final_message.as_deref(), Some(mine), "only this session's words");
    let log = game.log_after_frames();
    assert!(!log.iter().any(|line| line.contains("not this session's words")), "{log:#?}");
    assert!(!log.iter().any(|line| line.starts_with("permission ")), "nobody asked: {log:#?}");
}
