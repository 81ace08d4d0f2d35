//! The sandbox's in-game agent chat end to end: the compiled sandbox with `--agent` running the scripted ACP agent
//! (tests/fixtures), driven through its console as a player would, its lines read as another program would.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use common::lines::Lines;

const WAIT: Duration = Duration::from_secs(30);
const TOKEN: &str = "chat-test-token-0123456789";

struct Sandbox {
    child: Child,
    stdin: Option<ChildStdin>,
    out: Lines,
}

impl Sandbox {
    fn start(data_dir: &Path, extra: &[String]) -> Self {
        let mut child = Command::new(common::example("sandbox"))
            .args(["--data-dir".as_ref(), data_dir.as_os_str()])
            .args(["--tps", "120", "--port", "0", "--token", TOKEN, "--world", "alpha"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the sandbox starts");
        let out = Lines::of(child.stdout.take().expect("stdout"), WAIT);
        let stdin = child.stdin.take();
        Self { child, stdin, out }
    }

    fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        writeln!(stdin, "{command}").and_then(|()| stdin.flush()).expect("the sandbox reads its input");
    }

    /// Reads lines until one satisfies `wanted`; returns it.
    fn until(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        self.out.until(what, wanted)
    }

    /// A line seen already, or the next one, starting with `prefix` (for lines whose order with others is free).
    fn seen_or_next(&mut self, prefix: &str) -> String {
        self.out.seen_or_until(prefix, |line| line.starts_with(prefix))
    }

    fn line_starting(&mut self, prefix: &str) -> String {
        self.until(prefix, |line| line.starts_with(prefix))
    }

    /// The chat-status lines seen so far for `session`, as `previous->status`.
    fn statuses(&self, session: &str) -> Vec<String> {
        let prefix = format!("chat-status session={session} ");
        self.out
            .seen
            .iter()
            .filter_map(|line| line.strip_prefix(&prefix))
            .map(|rest| {
                let status = rest.split(' ').find_map(|w| w.strip_prefix("status=")).unwrap_or_default();
                let previous = rest.split(' ').find_map(|w| w.strip_prefix("previous=")).unwrap_or_default();
                format!("{previous}->{status}")
            })
            .collect()
    }

    fn quit(mut self) -> std::process::ExitStatus {
        self.send("quit");
        self.out.until_closed();
        self.child.wait().expect("waiting works")
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `--agent` for the scripted agent remembering in `state` (a path with a space: quotes are honoured, as they are
/// around the agent's own path, which has one when the repository's does).
fn agent_flag(state: &Path, more: &str) -> Vec<String> {
    let agent = common::example("scripted_acp_agent");
    vec!["--agent".into(), format!("'{}' --state '{}' {more}", agent.display(), state.display())]
}

fn agents_alive(state: &Path) -> usize {
    let needle = state.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|entry| {
                    std::fs::read(entry.path().join("cmdline")).is_ok_and(|cmdline| {
                        let cmdline = String::from_utf8_lossy(&cmdline);
                        // The agent itself, not the sandbox whose `--agent` names the same path.
                        cmdline.split('\0').next().is_some_and(|program| program.ends_with("scripted_acp_agent"))
                            && cmdline.contains(&needle)
                    })
                })
                .count()
        })
        .unwrap_or(0)
}

fn session_of(line: &str) -> String {
    line.split(' ').find_map(|w| w.strip_prefix("session=")).expect("a session id").to_string()
}

#[test]
fn the_player_chats_with_an_agent_that_builds_through_the_game_and_quit_leaves_no_agent_behind() {
    let root = tempfile::tempdir().expect("temp dir");
    let state = root.path().join("agent state");
    let mut game = Sandbox::start(&root.path().join("data"), &agent_flag(&state, "--no-system-prompt"));
    // Said before the agent has started: commands typed now wait for it.
    game.line_starting("chat-starting");
    let created = game.line_starting("chat-status ");
    let id = session_of(&created);
    assert!(created.ends_with("status=idle previous=none"), "{created}");
    game.seen_or_next("visit-opened world=alpha");

    game.send(r#"say call place_block {"x": 3, "y": 60, "z": 3, "block": "gold"}"#);
    assert_eq!(game.line_starting("ok ").as_str(), "ok sent");
    let answered = game.line_starting(&format!("chat session={id}: place_block answered:"));
    assert!(answered.contains(r#""changed":true"#), "{answered}");
    game.until("the turn's end", |line| line.ends_with("status=idle previous=running"));
    let expected = [
        "none->idle",
        "idle->running",
        "running->waiting_tool_result",
        "waiting_tool_result->running",
        "running->idle",
    ];
    assert_eq!(game.statuses(&id), expected, "every transition once, in order");

    game.send("say wait");
    assert_eq!(game.line_starting("ok ").as_str(), "ok sent");
    game.send("say are you there");
    let busy = game.line_starting("error: ");
    assert!(busy.starts_with("error: SESSION_BUSY "), "{busy}");
    game.send("chat-cancel");
    assert_eq!(game.line_starting("ok ").as_str(), "ok cancelling the turn");
    game.until("the cancelled turn's end", |line| line.ends_with("status=idle previous=running"));

    // A turn cut short says why (its reply would just stop).
    game.send("say refusal");
    assert_eq!(game.line_starting("ok ").as_str(), "ok sent");
    assert_eq!(game.line_starting("chat-turn-ended "), format!("chat-turn-ended session={id} stop=refusal"));
    game.until("the refused turn's end", |line| line.ends_with("status=idle previous=running"));

    game.send("say crash");
    let failed = game.line_starting(&format!("chat-error session={id} "));
    assert!(
        failed.contains("scope=session code=AGENT_UNAVAILABLE") && failed.contains("crashing on purpose"),
        "{failed}"
    );
    game.until("the error status", |line| line.ends_with("status=error previous=running"));
    game.send("say hello");
    assert!(game.line_starting("error: ").starts_with("error: AGENT_UNAVAILABLE "));
    game.send("chat-resume");
    assert_eq!(game.line_starting("ok "), format!("ok resumed session={id}"));
    game.send("say history");
    game.line_starting("ok sent");
    // place, wait, refusal, crash, history: the texts the game refused never reached the agent.
    game.line_starting(&format!("chat session={id}: I remember 5 turns"));

    game.send("status");
    let status = game.line_starting("ok world=");
    assert!(status.contains(&format!("chat={id} chat-status=")) && status.contains("usage=500/200000"), "{status}");
    assert_eq!(agents_alive(&state), 1);
    assert!(game.quit().success());
    assert_eq!(agents_alive(&state), 0, "quit stopped the agent");
}

#[test]
fn an_agent_that_failed_to_start_is_started_again_by_chat_resume_once_what_stopped_it_is_fixed() {
    let root = tempfile::tempdir().expect("temp dir");
    let state = root.path().join("agent-state");
    std::fs::create_dir_all(&state).expect("the agent's state folder");
    std::fs::write(state.join("start-fails"), b"").expect("the agent fails at start");
    let mut game = Sandbox::start(&root.path().join("data"), &agent_flag(&state, ""));
    let failed = game.line_starting("chat-error session=none ");
    assert!(failed.contains("code=AGENT_UNAVAILABLE") && failed.contains("no API key"), "{failed}");
    game.send("say hello");
    let refused = game.line_starting("error: ");
    assert!(refused.contains("chat-resume starts one"), "{refused}");

    std::fs::remove_file(state.join("start-fails")).expect("fixed");
    game.send("chat-resume");
    let started = game.line_starting("ok ");
    assert!(started.starts_with("ok started session="), "{started}");
    game.send("say hello");
    game.line_starting("ok sent");
    game.line_starting(&format!("chat session={}: You said: hello", started.trim_start_matches("ok started session=")));
    assert!(game.quit().success());
}

#[test]
fn a_kept_session_whose_agent_fails_to_start_is_tried_again_by_chat_resume_not_replaced() {
    let root = tempfile::tempdir().expect("temp dir");
    let (data, state) = (root.path().join("data"), root.path().join("state"));
    let mut flags = agent_flag(&state, "");
    flags.push("--agent-keep".to_string());
    let mut first = Sandbox::start(&data, &flags);
    let kept = session_of(&first.line_starting("chat-status "));
    assert!(first.quit().success());

    // The agent cannot start now (its key expired, say): the kept session is not replaced by a new one.
    std::fs::write(state.join("start-fails"), b"").expect("written");
    let mut second = Sandbox::start(&data, &flags);
    let failed = second.line_starting("chat-error ");
    assert!(failed.contains("code=AGENT_UNAVAILABLE"), "{failed}");
    std::fs::remove_file(state.join("start-fails")).expect("removed");
    second.send("chat-resume");
    assert_eq!(second.line_starting("ok "), format!("ok attached session={kept} status=idle"), "the kept one, again");
    assert!(second.quit().success());
}

#[test]
fn a_kept_session_is_reattached_at_the_next_start_or_by_id_and_permissions_go_to_the_player() {
    let root = tempfile::tempdir().expect("temp dir");
    let (data, state) = (root.path().join("data"), root.path().join("state"));
    let keep = |more: &str| {
        let mut flags = agent_flag(&state, more);
        flags.extend(["--agent-keep".to_string(), "--ask-permissions".to_string()]);
        flags
    };
    let mut first = Sandbox::start(&data, &keep(""));
    let kept = session_of(&first.line_starting("chat-status "));
    first.send("say ask");
    let asked = first.line_starting(&format!("chat-permission session={kept} "));
    let shown = r#"kind=execute input="{\"command\":\"rm -rf /\"}" tool=run rm -rf /"#;
    assert!(asked.ends_with(shown), "the command the player allows is shown with the title: {asked}");
    let request = asked.split(' ').find_map(|w| w.strip_prefix("request=")).expect("a request number").to_string();
    first.send(&format!("chat-allow {request}"));
    assert_eq!(first.line_starting("ok allowed"), format!("ok allowed request={request}"));
    first.line_starting(&format!("chat session={kept}: permission: allowed"));
    let settled = format!("chat-permission-settled session={kept} request={request} outcome=allowed");
    assert_eq!(first.seen_or_next(&settled), settled, "the prompt is settled");
    // An edit's prompt shows the file and the change, beside the arguments.
    first.send("say ask-edit");
    let asked = first.line_starting(&format!("chat-permission session={kept} "));
    let details = asked.split(" details=").nth(1).and_then(|rest| rest.split(" tool=").next()).expect("details");
    let details: Vec<serde_json::Value> =
        serde_json::from_str(&serde_json::from_str::<String>(details).expect("a JSON string")).expect("JSON");
    assert_eq!((details[0]["old_text"].as_str(), details[0]["new_text"].as_str()), (Some("2"), Some("two")));
    assert_eq!((details[1]["type"].as_str(), details[1]["line"].as_u64()), (Some("location"), Some(2)), "{asked}");
    assert!(asked.ends_with(" tool=Edit notes.txt"), "{asked}");
    let request = asked.split(' ').find_map(|w| w.strip_prefix("request=")).expect("a request number").to_string();
    first.send(&format!("chat-deny {request}"));
    first.line_starting(&format!("chat session={kept}: edit: not allowed"));
    assert_eq!(agents_alive(&state), 1, "the control: the agent is found while it runs");
    assert!(first.quit().success());
    assert_eq!(agents_alive(&state), 0, "quit stopped the agent, keeping its session");

    // The next start with the same flags re-attaches it: the same agent session, its first two turns remembered.
    let mut second = Sandbox::start(&data, &keep(""));
    assert_eq!(session_of(&second.line_starting("chat-status ")), kept, "re-attached, not a new one");
    second.send("say history");
    second.line_starting(&format!("chat session={kept}: I remember 3 turns"));
    assert!(second.quit().success());

    // Other agent flags: a new session (kept in its place); the old one can still be re-attached by its id.
    let mut second = Sandbox::start(&data, &keep("--no-system-prompt"));
    let fresh = session_of(&second.line_starting("chat-status "));
    assert_ne!(fresh, kept);
    second.send("chat-resume chat-00000000deadbeef");
    assert!(second.line_starting("error: ").starts_with("error: SESSION_NOT_FOUND "));
    second.send(&format!("chat-resume {kept}"));
    let attached = format!("ok attached session={kept} status=idle ended={fresh}");
    assert_eq!(second.line_starting("ok attached"), attached, "the session it replaced ended");
    assert_eq!(agents_alive(&state), 1, "only the attached session's agent runs");
    second.send("say history");
    second.line_starting(&format!("chat session={kept}: I remember 4 turns"));
    // The fresh session of this run, never used again: deleted for good.
    second.send(&format!("chat-forget {fresh}"));
    assert_eq!(second.line_starting("ok forgot"), format!("ok forgot session={fresh}"));
    assert!(!data.join("agent-sessions").join(&fresh).exists(), "its folder is gone");
    // The current session forgotten: `status` no longer names it.
    second.send("status");
    assert!(second.line_starting("ok world=").contains(&format!("chat={kept} ")), "the control");
    second.send(&format!("chat-forget {kept}"));
    assert_eq!(second.line_starting("ok forgot"), format!("ok forgot session={kept}"));
    second.send("status");
    let status = second.line_starting("ok world=");
    assert!(!status.contains("chat="), "{status}");
    assert!(second.quit().success());

    let mut plain = Sandbox::start(&data, &[]);
    plain.seen_or_next("visit-opened");
    plain.send("say hello");
    assert!(plain.line_starting("error: ").starts_with("error: no agent configured (start with --agent"));
    assert!(plain.quit().success());
}
