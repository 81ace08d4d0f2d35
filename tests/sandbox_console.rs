//! The sandbox example as a program: its console on standard input, its lines on standard output, its saves on
//! disk across a restart. The test builds the example with cargo (a no-op when `cargo test` already did) and runs
//! it as a child process.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::lines::Lines;

const WAIT: Duration = Duration::from_secs(30);
const TOKEN: &str = "test-token-0123456789";

/// The sandbox, built once per run.
fn sandbox_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| common::example("sandbox"))
}

/// A running sandbox and the lines it printed.
struct Sandbox {
    child: Stopped,
    stdin: Option<ChildStdin>,
    out: Lines,
    /// The MCP endpoint it printed.
    url: String,
}

impl Sandbox {
    fn start(data_dir: &Path) -> Self {
        Self::start_at(data_dir, 30)
    }

    /// The sandbox at `tps` frames a second.
    fn start_at(data_dir: &Path, tps: u32) -> Self {
        let mut child = Command::new(sandbox_binary())
            .args(["--data-dir".as_ref(), data_dir.as_os_str()])
            // The token from the environment (`--token-env`), not the command line.
            .args(["--tps", &tps.to_string(), "--port", "0", "--token-env", "SANDBOX_TEST_TOKEN"])
            .env("SANDBOX_TEST_TOKEN", TOKEN)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the sandbox starts");
        let out = Lines::of(child.stdout.take().expect("stdout"), WAIT);
        let stdin = child.stdin.take();
        let mut sandbox = Self { child: Stopped(child), stdin, out, url: String::new() };
        let mcp = sandbox.next_line();
        assert!(mcp.starts_with("mcp: http://127.0.0.1:") && mcp.ends_with("/mcp"), "{mcp}");
        sandbox.url = mcp.trim_start_matches("mcp: ").to_string();
        assert_eq!(
            sandbox.next_line(),
            "token: as given with --token or --token-env",
            "a token of the player's own is not printed"
        );
        sandbox
    }

    /// The next line, skipping the `conversation ...` status lines agents cause (they interleave with the
    /// player's; `conversation_lines` checks them).
    fn next_line(&mut self) -> String {
        self.out.until("line but a conversation's", |line| !line.starts_with("conversation "))
    }

    /// Sends a command and returns its answer (the next line).
    fn command(&mut self, command: &str) -> String {
        self.command_bytes(command.as_bytes())
    }

    /// A line of raw bytes (not necessarily UTF-8), and the answer.
    fn command_bytes(&mut self, command: &[u8]) -> String {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin
            .write_all(command)
            .and_then(|()| stdin.write_all(b"\n"))
            .and_then(|()| stdin.flush())
            .expect("the sandbox reads its input");
        self.next_line()
    }

    fn expect(&mut self, line: &str) {
        assert_eq!(self.next_line(), line);
    }

    /// `status` until the save has loaded (the world loads in the background).
    fn loaded_status(&mut self) -> String {
        let started = Instant::now();
        loop {
            let status = self.command("status");
            assert!(status.starts_with("ok world="), "{status}");
            if !status.contains("player=loading") {
                return status;
            }
            assert!(started.elapsed() < WAIT, "the world did not load: {status}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `enter alpha` as the first visit of the run; its `status` once the save has loaded.
    fn enter_alpha(&mut self) -> String {
        assert_eq!(self.command("enter alpha"), "ok entering alpha");
        self.expect("visit-opened world=alpha visit=1");
        self.loaded_status()
    }

    /// Sends the sandbox `signal` (`-TERM`, ...) with `kill`.
    fn signal(&self, signal: &str) {
        let signalled = Command::new("kill").args([signal, &self.child.id().to_string()]).status().expect("kill runs");
        assert!(signalled.success());
    }

    fn wait_exit(mut self) -> ExitStatus {
        self.out.until_closed();
        self.child.wait().expect("waiting works")
    }
}

/// A child process stopped however the test that started it ends: a test that failed midway leaves no sandbox or
/// agent running (an agent would wait minutes for its reads, holding the test's output open; a sandbox blocked on
/// its output would never end).
struct Stopped(Child);

impl std::ops::Deref for Stopped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Stopped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// One run of tests/e2e/sandbox_agent.py, read line by line.
struct Agent {
    child: Stopped,
    out: Lines,
}

impl Agent {
    fn start(url: &str, step: &str) -> Self {
        let mut child = Command::new(common::python_mcp_client())
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/sandbox_agent.py"))
            .args([url, TOKEN, step])
            .stdout(Stdio::piped())
            .spawn()
            .expect("the Python agent starts");
        let out = Lines::of(child.stdout.take().expect("stdout"), WAIT);
        Self { child: Stopped(child), out }
    }

    /// The next event the agent printed, as JSON.
    fn event(&mut self) -> serde_json::Value {
        let line = self.out.until("event from the agent", |_| true);
        serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"))
    }

    fn finish(mut self) {
        let status = self.child.wait().expect("the agent exits");
        assert!(status.success(), "the Python agent failed");
    }
}

/// The value of `key=` in a status line.
fn field<'a>(status: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    status.split(' ').find_map(|word| word.strip_prefix(prefix.as_str())).unwrap_or_else(|| panic!("{key} in {status}"))
}

#[test]
fn enter_travel_exit_quit_then_the_world_is_still_there_after_a_restart() {
    let data = tempfile::tempdir().expect("temp dir");
    let mut game = Sandbox::start(data.path());
    assert_eq!(game.command("status"), "ok no world open");
    let status = game.enter_alpha();
    assert_eq!(
        (field(&status, "visit"), field(&status, "dimension"), field(&status, "revision")),
        ("1", "overworld", "0")
    );
    let overworld_player = field(&status, "player").to_string();

    assert_eq!(game.command("travel nether"), "ok traveling to the nether");
    game.expect("relocated visit=1 dimension=nether revision=1");
    let status = game.loaded_status();
    assert_eq!(field(&status, "dimension"), "nether");
    let nether_player = field(&status, "player").to_string();

    assert_eq!(game.command("exit"), "ok leaving alpha");
    game.expect("visit-closed world=alpha visit=1");
    game.expect("saved world=alpha visit=1");
    assert!(data.path().join("alpha").join("sandbox.json").is_file(), "the save is a real file");
    assert_eq!(game.command("quit"), "ok quitting");
    assert_eq!(game.wait_exit().code(), Some(0));

    let mut game = Sandbox::start(data.path());
    let status = game.enter_alpha();
    assert_eq!(field(&status, "player"), overworld_player);
    assert_eq!(field(&status, "notes"), "0");
    game.command("travel nether");
    game.expect("relocated visit=1 dimension=nether revision=1");
    assert_eq!(field(&game.loaded_status(), "player"), nether_player, "each dimension keeps its position");
    assert_eq!(game.command("quit"), "ok quitting");
    game.expect("visit-closed world=alpha visit=1");
    game.expect("saved world=alpha visit=1");
    assert_eq!(game.wait_exit().code(), Some(0));
}

#[test]
fn ctrl_c_quits_like_quit_the_visit_closes_and_its_save_completes() {
    quits_saving_on("-INT");
}

/// A closed terminal (`SIGHUP`), `kill` or a service manager (`SIGTERM`) end the sandbox as Ctrl+C does.
#[test]
fn sigterm_and_sighup_quit_like_ctrl_c_saving_the_visit() {
    quits_saving_on("-TERM");
    quits_saving_on("-HUP");
}

fn quits_saving_on(signal: &str) {
    let data = tempfile::tempdir().expect("temp dir");
    let mut game = Sandbox::start(data.path());
    game.enter_alpha();
    game.signal(signal);
    game.expect("visit-closed world=alpha visit=1");
    game.expect("saved world=alpha visit=1");
    assert!(data.path().join("alpha").join("sandbox.json").is_file(), "the save is on disk ({signal})");
    assert_eq!(game.wait_exit().code(), Some(130), "Ctrl+C's exit code, after the save ({signal})");
}

/// `--no-console`: run without a terminal (standard input at its end at once), the sandbox serves until a signal;
/// its output, which a service's logs keep, names its token's file, not the token.
#[test]
fn without_a_console_the_sandbox_serves_until_a_signal_and_then_saves() {
    let data = tempfile::tempdir().expect("temp dir");
    let mut child = Command::new(sandbox_binary())
        .args(["--data-dir".as_ref(), data.path().as_os_str()])
        .args(["--port", "0", "--world", "alpha", "--no-console"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the sandbox starts");
    let mut out = Lines::of(child.stdout.take().expect("stdout"), WAIT);
    let url = out.until("its address", |line| line.starts_with("mcp: "));
    let address: std::net::SocketAddr =
        url.trim_start_matches("mcp: http://").trim_end_matches("/mcp").parse().expect("an address");
    let file = out.until("where its token is", |line| line.starts_with("token: "));
    let token = std::fs::read_to_string(file.trim_start_matches("token: in ")).expect("the token file");
    assert!(!file.contains(&token) && token.len() >= 16, "{file}");
    out.until("the visit", |line| line == "visit-opened world=alpha visit=1");
    // Its input ended at once: the world is still open to agents, many frames later.
    let session = common::raw_mcp::open_session(address, &token);
    let in_session = [("Mcp-Session-Id", session.as_str()), ("MCP-Protocol-Version", "2025-11-25")];
    let info = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"world_info","arguments":{}}}"#;
    let (status, answer) = common::raw_mcp::send(address, &token, &in_session, info);
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains(r#"\"world\":\"alpha\""#) && !answer.contains("isError\":true"), "{answer}");
    let signalled = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill runs");
    assert!(signalled.success());
    out.until("the save", |line| line == "saved world=alpha visit=1");
    out.until_closed();
    assert_eq!(child.wait().expect("waiting works").code(), Some(130), "ended by the signal, not by its input's end");
    assert!(!out.seen.iter().any(|line| line.contains(&token)), "the token was printed: {:#?}", out.seen);
}

/// A signal ends the sandbox with 130, unless a save failed: then 1, as after `quit`.
#[test]
fn a_signal_after_which_the_save_failed_exits_1() {
    a_failed_save_exits_1_after(|game| game.signal("-TERM"));
}

#[test]
fn quit_waits_for_the_save_and_a_failed_save_exits_1() {
    a_failed_save_exits_1_after(|game| assert_eq!(game.command("quit"), "ok quitting"));
}

/// In `alpha`, the world's folder becomes a file (the save cannot be written, whoever runs the test); `end` ends
/// the sandbox: the save fails, it says so, and it exits 1.
fn a_failed_save_exits_1_after(end: impl FnOnce(&mut Sandbox)) {
    let data = tempfile::tempdir().expect("temp dir");
    let mut game = Sandbox::start(data.path());
    game.enter_alpha();
    let folder = data.path().join("alpha");
    std::fs::remove_dir_all(&folder).expect("the world's folder");
    std::fs::write(&folder, "in the way").expect("a file in its place");
    end(&mut game);
    game.expect("visit-closed world=alpha visit=1");
    let failed = game.next_line();
    assert!(failed.starts_with("save-failed world=alpha visit=1 error="), "{failed}");
    assert_eq!(game.wait_exit().code(), Some(1), "a lost save is not a clean stop");
}

#[test]
fn bad_commands_get_one_error_line_each_and_end_of_input_quits_after_saving() {
    let data = tempfile::tempdir().expect("temp dir");
    let mut game = Sandbox::start(data.path());
    for (command, error) in [
        ("enter Alpha", "error: invalid world name \"Alpha\""),
        (&format!("enter {}", "x".repeat(65)), "error: invalid world name"),
        ("travel nether", "error: no world is open"),
        ("exit", "error: no world is open"),
        ("dance", "error: unknown command \"dance\""),
        ("enter", "error: wrong arguments for `enter`"),
        // Without an agent; a bare `say`, or one with only blanks, asks what to say; a tab after it is a blank.
        ("say\thi", "error: no agent configured"),
        ("say", "error: say what?"),
        ("say   ", "error: say what?"),
        ("help", "ok commands: help, enter WORLD"),
    ] {
        let answer = game.command(command);
        assert!(answer.starts_with(error), "{command:?} answered {answer:?}");
    }
    // A line that is not UTF-8 (a Latin-1 terminal) is a bad command, not the end of input.
    let answer = game.command_bytes(b"caf\xe9");
    assert!(answer.starts_with("error: unknown command"), "{answer}");
    // Blanks before a command are only blanks.
    assert_eq!(game.command("   status"), "ok no world open");
    // The longest world name the store takes: 64 characters (a lower-case UUID fits).
    let beta = "b".repeat(64);
    assert_eq!(game.command(&format!("enter {beta}")), format!("ok entering {beta}"));
    game.expect(&format!("visit-opened world={beta} visit=1"));
    let answer = game.command("travel moon");
    assert!(answer.starts_with("error: unknown dimension \"moon\""), "{answer}");
    assert_eq!(game.command("enter gamma"), format!("ok leaving {beta}, entering gamma"));
    game.expect(&format!("visit-closed world={beta} visit=1"));
    let mut next = [game.next_line(), game.next_line()];
    next.sort();
    let expected = [format!("saved world={beta} visit=1"), "visit-opened world=gamma visit=2".to_string()];
    assert_eq!(next, expected, "the save may finish later");
    game.loaded_status();
    drop(game.stdin.take());
    game.expect("visit-closed world=gamma visit=2");
    game.expect("saved world=gamma visit=2");
    assert_eq!(game.wait_exit().code(), Some(0));
}

#[test]
fn an_unknown_flag_is_named_as_unknown_even_last() {
    for args in [&["--windwo"][..], &["--verbose"], &["--world", "alpha", "--verbose"], &["--verbose", "x"]] {
        let out = Command::new(sandbox_binary()).args(args).stdin(Stdio::null()).output().expect("the sandbox runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("unknown option") && !said.contains("needs a value"), "{args:?}: {said}");
    }
}

#[test]
fn a_token_variable_that_is_unset_or_empty_is_refused_saying_which() {
    for value in [None, Some("")] {
        let mut sandbox = Command::new(sandbox_binary());
        sandbox.args(["--token-env", "SANDBOX_NO_SUCH_TOKEN"]).env_remove("SANDBOX_NO_SUCH_TOKEN");
        if let Some(value) = value {
            sandbox.env("SANDBOX_NO_SUCH_TOKEN", value);
        }
        let out = sandbox.stdin(Stdio::null()).output().expect("the sandbox runs");
        assert_eq!(out.status.code(), Some(2), "{value:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("--token-env: SANDBOX_NO_SUCH_TOKEN"), "{value:?}: {said}");
    }
}

#[test]
fn a_switch_given_a_value_is_refused_rather_than_turned_on() {
    for flag in ["--ask-permissions=false", "--agent-keep=no", "--window=0"] {
        let out = Command::new(sandbox_binary()).arg(flag).stdin(Stdio::null()).output().expect("the sandbox runs");
        assert_eq!(out.status.code(), Some(2), "{flag}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("takes no value"), "{flag}");
    }
}

#[test]
fn a_flag_that_would_change_nothing_with_the_others_given_is_refused_rather_than_dropped() {
    let refused: [(&[&str], &str); 10] = [
        (&["--no-console"], "--no-console"),
        (&["--world", "alpha", "--no-console", "--agent", "some-agent --acp"], "--no-console"),
        (&["--agent-keep"], "--agent-keep"),
        (&["--agent-auth", "openai-api-key"], "--agent-auth"),
        (&["--agent-openai", "http://127.0.0.1:9/v1", "--model", "m", "--agent-auth", "k"], "--agent-auth"),
        (&["--ask-permissions"], "--ask-permissions"),
        (&["--api-key-env", "OPENAI_API_KEY"], "--api-key-env"),
        (&["--context-window", "4096"], "--context-window"),
        (&["--agent", "some-agent --acp", "--context-window", "4096"], "--context-window"),
        (&["--agent-openai", "http://127.0.0.1:9/v1", "--model", "m", "--ask-permissions"], "--ask-permissions"),
    ];
    for (flags, named) in refused {
        let out = Command::new(sandbox_binary()).args(flags).stdin(Stdio::null()).output().expect("the sandbox runs");
        assert_eq!(out.status.code(), Some(2), "{flags:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("{named} is for")), "{flags:?}: {stderr}");
    }
}

#[test]
fn a_world_whose_saves_are_both_damaged_says_it_failed_to_load_and_is_not_reported_saved() {
    let data = tempfile::tempdir().expect("temp dir");
    let alpha = data.path().join("alpha");
    std::fs::create_dir(&alpha).expect("a world folder");
    for file in ["sandbox.json", "sandbox.json.prev"] {
        std::fs::write(alpha.join(file), b"not a save").expect("a damaged save");
    }
    let mut game = Sandbox::start(data.path());
    assert_eq!(game.command("enter alpha"), "ok entering alpha");
    game.expect("visit-opened world=alpha visit=1");
    let failed = game.next_line();
    assert!(failed.starts_with("load-failed world=alpha visit=1 error="), "{failed}");
    assert_eq!(game.command("exit"), "ok leaving alpha");
    game.expect("visit-closed world=alpha visit=1");
    let closed = game.next_line();
    assert!(closed.starts_with("save-failed world=alpha visit=1") && closed.contains("nothing was saved"), "{closed}");
    assert_eq!(std::fs::read(alpha.join("sandbox.json")).expect("still there"), b"not a save", "left as it was");
    game.command("quit");
    game.wait_exit();
}

#[test]
fn an_mcp_agent_places_replays_conflicts_survives_travel_and_exit_and_finds_its_block_after_a_restart() {
    let data = tempfile::tempdir().expect("temp dir");
    // 10 frames a second: a 64-block tower takes six seconds, time enough for a travel or an exit sent after its
    // first block to reach the game before it is done on a loaded machine.
    let mut game = Sandbox::start_at(data.path(), 10);
    game.enter_alpha();

    let mut agent = Agent::start(&game.url, "place");
    let placed = agent.event();
    agent.finish();
    assert_eq!(placed["first"]["ok"]["version"], 1, "{placed}");
    assert_eq!(placed["again"], placed["first"], "a replay with the same operation id gets the same outcome");
    assert_eq!(placed["after"]["ok"]["version"], 1, "and the block changed once: {placed}");
    assert_eq!(placed["conflict"]["error"], "OPERATION_CONFLICT", "{placed}");

    // Travel during build_tower: it stops with LOCATION_CHANGED and says how many blocks it placed.
    let mut tower = Agent::start(&game.url, "tower");
    assert_eq!(tower.event()["event"], "tower-started");
    assert_eq!(game.command("travel nether"), "ok traveling to the nether");
    game.expect("relocated visit=1 dimension=nether revision=1");
    let ended = tower.event();
    tower.finish();
    assert_eq!(ended["error"], "LOCATION_CHANGED", "{ended}");
    assert!(ended["details"]["placed"].as_u64().is_some_and(|placed| placed >= 1), "{ended}");

    // Exit during a call: the call ends, the world is saved.
    let mut tower = Agent::start(&game.url, "tower");
    assert_eq!(tower.event()["event"], "tower-started");
    assert_eq!(game.command("exit"), "ok leaving alpha");
    let ended = tower.event();
    tower.finish();
    assert_eq!(ended["error"], "VISIT_ENDED", "{ended}");
    game.expect("visit-closed world=alpha visit=1");
    game.expect("saved world=alpha visit=1");

    // Re-enter: the block is there.
    assert_eq!(game.command("enter alpha"), "ok entering alpha");
    game.expect("visit-opened world=alpha visit=2");
    game.loaded_status();
    let mut agent = Agent::start(&game.url, "get");
    let block = agent.event();
    agent.finish();
    assert_eq!((block["ok"]["block"].as_str(), block["ok"]["version"].as_u64()), (Some("gold"), Some(1)), "{block}");
    assert_eq!(game.command("quit"), "ok quitting");
    game.expect("visit-closed world=alpha visit=2");
    game.expect("saved world=alpha visit=2");
    assert_eq!(game.wait_exit().code(), Some(0));

    // Restart: still there.
    let mut game = Sandbox::start(data.path());
    game.enter_alpha();
    let mut agent = Agent::start(&game.url, "get");
    let block = agent.event();
    agent.finish();
    assert_eq!(block["ok"]["block"], "gold", "{block}");
    assert_eq!(game.command("quit"), "ok quitting");
    let conversation_lines: Vec<&String> = game.out.seen.iter().filter(|l| l.starts_with("conversation ")).collect();
    assert!(
        conversation_lines.iter().any(|l| l.contains("status=waiting_tool_result")),
        "the console shows what the agent is doing: {conversation_lines:#?}"
    );
    assert_eq!(game.wait_exit().code(), Some(0));
}

#[cfg(unix)]
#[test]
fn a_program_that_stops_reading_the_sandboxs_output_never_stops_its_game() {
    use std::io::{BufRead, Read};
    let data = tempfile::tempdir().expect("temp dir");
    let sandbox = Command::new(sandbox_binary())
        .args(["--port", "0", "--token-env", "SANDBOX_TEST_TOKEN", "--world", "alpha", "--no-console", "--data-dir"])
        .arg(data.path())
        .env("SANDBOX_TEST_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the sandbox starts");
    let mut sandbox = Stopped(sandbox);
    let mut output = std::io::BufReader::new(sandbox.stdout.take().expect("its output"));
    let mut first = String::new();
    output.read_line(&mut first).expect("its first line");
    let address = first.trim().trim_start_matches("mcp: http://").trim_end_matches("/mcp");
    let address: std::net::SocketAddr = address.parse().unwrap_or_else(|e| panic!("{first}: {e}"));
    // From here nobody reads. Each call here is a conversation of its own, whose status lines fill the pipe's
    // 64 KiB within a few hundred calls: a game writing them on its main thread would stop there, and its calls with
    // it (each reads the world in a frame).
    let meta = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;
    let call = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"world_info","arguments":{{}},{meta}}}}}"#
    );
    let headers = [("MCP-Protocol-Version", "2026-07-28"), ("Mcp-Method", "tools/call"), ("Mcp-Name", "world_info")];
    let read_alpha = || {
        let (status, response) = common::raw_mcp::send(address, TOKEN, &headers, &call);
        // Its output, not an error (a call that timed out names the world too).
        let read =
            status == 200 && response.contains(r#""structuredContent""#) && !response.contains(r#""isError":true"#);
        (read && response.contains("alpha"), response)
    };
    let entered = Instant::now();
    while !read_alpha().0 {
        assert!(entered.elapsed() < Duration::from_secs(30), "alpha never opened");
    }
    // Past the pipe and the lines that may wait (4,096): three lines a call.
    for n in 0..2_000 {
        let (read, response) = read_alpha();
        assert!(read, "call {n}: {response}");
    }
    // Read again: what could not wait is said to have been dropped, and the game saves and ends as asked.
    // SAFETY: `kill` with the child's own pid and a signal number has no memory effects.
    unsafe { libc::kill(sandbox.id() as i32, libc::SIGTERM) };
    let mut rest = String::new();
    output.read_to_string(&mut rest).expect("the rest of its output");
    assert!(rest.contains("output-dropped lines="), "{}", &rest[rest.len().saturating_sub(2_000)..]);
    assert!(rest.contains("saved world=alpha"), "{}", &rest[rest.len().saturating_sub(2_000)..]);
    assert!(sandbox.wait().expect("it ends").code().is_some(), "it exits, not killed");
}
