//! The windowed sandbox as a child process on an X server of its own (Xvfb, software Vulkan): what
//! tests/sandbox_window.rs and benches/window_frames.rs share. Plain std: it drives the program through its
//! console and reads its lines.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::Duration;

use super::lines::Lines;

/// Software rendering on two busy cores is slow: generous, but bounded.
pub const WAIT: Duration = Duration::from_secs(120);

/// An X server of the caller's own, stopped when dropped.
pub struct Xvfb {
    child: Child,
    /// `:N`
    pub display: String,
}

impl Xvfb {
    pub fn start() -> Self {
        // `-displayfd 1`: Xvfb picks a free display and writes its number to standard output once it accepts
        // connections, which is the signal to wait for.
        let mut child = Command::new("Xvfb")
            .args(["-displayfd", "1", "-screen", "0", "1280x720x24", "-nolisten", "tcp"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("Xvfb starts (install xvfb and mesa-vulkan-drivers: tests/e2e/setup-window.sh)");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("Xvfb names its display");
        let number: u32 = line.trim().parse().unwrap_or_else(|_| panic!("Xvfb printed {line:?}, not a display number"));
        Self { child, display: format!(":{number}") }
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sandbox with `--window`, its lines, and its X server.
pub struct WindowedSandbox {
    child: Child,
    stdin: Option<ChildStdin>,
    /// What it printed.
    pub out: Lines,
    /// The MCP endpoint it printed.
    pub url: String,
    pub xvfb: Xvfb,
}

impl WindowedSandbox {
    /// Starts `binary --window` in world `world`, and waits for the world to open.
    pub fn start(binary: &Path, data_dir: &Path, token: &str, world: &str, extra: &[String]) -> Self {
        let xvfb = Xvfb::start();
        let mut child = Command::new(binary)
            .args(["--window", "--port", "0", "--token", token, "--world", world, "--data-dir"])
            .arg(data_dir)
            .args(extra)
            .env("DISPLAY", &xvfb.display)
            .env_remove("WAYLAND_DISPLAY")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the sandbox starts");
        let out = Lines::of(child.stdout.take().expect("stdout"), WAIT);
        let stdin = child.stdin.take();
        let mut sandbox = Self { child, stdin, out, url: String::new(), xvfb };
        let mcp = sandbox.until("the MCP address", |line| line.starts_with("mcp: "));
        sandbox.url = mcp.trim_start_matches("mcp: ").to_string();
        sandbox.until("the world open", |line| line.starts_with(&format!("visit-opened world={world}")));
        sandbox
    }

    pub fn send(&mut self, command: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        writeln!(stdin, "{command}").and_then(|()| stdin.flush()).expect("the sandbox reads its input");
    }

    /// Reads lines until one satisfies `wanted`; returns it.
    pub fn until(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        self.out.until(what, wanted)
    }

    /// A line already read that satisfies `wanted`, else the next one that does.
    pub fn seen_or_until(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        self.out.seen_or_until(what, wanted)
    }

    /// Sends a command and returns its answer: the next `ok`/`error:` line.
    pub fn command(&mut self, command: &str) -> String {
        self.send(command);
        self.until(&format!("an answer to `{command}`"), |line| line.starts_with("ok") || line.starts_with("error:"))
    }

    /// Lets the window render at least `frames` frames (each `frames` answer counts those since the last one).
    pub fn render_frames(&mut self, frames: usize) {
        let mut rendered = 0;
        while rendered < frames {
            let answer = self.command("frames");
            rendered += field(&answer, "n").parse::<usize>().unwrap_or_else(|_| panic!("frames: {answer}"));
        }
    }

    /// Where the player stands, from `status`.
    pub fn player(&mut self) -> (i32, i32, i32) {
        let status = self.command("status");
        let at: Vec<i32> = field(&status, "player").split(',').filter_map(|n| n.parse().ok()).collect();
        match at.as_slice() {
            [x, y, z] => (*x, *y, *z),
            _ => panic!("no player position in {status}"),
        }
    }

    /// Waits for the process to exit, reading its lines meanwhile.
    pub fn wait_exit(&mut self) -> ExitStatus {
        self.out.until_closed();
        self.child.wait().expect("waiting works")
    }
}

impl Drop for WindowedSandbox {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The value of `name=VALUE` in the words of a line (the first such word), or "".
pub fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let key = format!("{name}=");
    line.split(' ').find_map(|word| word.strip_prefix(key.as_str())).unwrap_or("")
}
