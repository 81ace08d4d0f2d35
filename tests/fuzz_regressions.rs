//! Replays every committed fuzz seed and crasher (`fuzz/corpus/<target>/`, `fuzz/artifacts/<target>/`) through
//! the same entry logic as the `cargo fuzz` targets (`fuzz/entry/`), under plain `cargo test`. A seed that
//! panics fails its test, naming the file; one that hangs aborts the test binary after [`SEED_LIMIT`], naming it
//! too. How to fuzz: `fuzz/README.md`.

#[path = "../fuzz/entry/game.rs"]
mod game;
#[path = "../fuzz/entry/panics.rs"]
mod panics;

#[path = "../fuzz/entry/console_line.rs"]
mod console_line;
#[path = "../fuzz/entry/mcp_body.rs"]
mod mcp_body;
#[path = "../fuzz/entry/tool_args.rs"]
mod tool_args;

// The sandbox's console module, and the modules it names with `crate::` paths, as `console_line` includes them.
#[allow(dead_code)]
#[path = "../examples/sandbox/console.rs"]
mod console;
#[allow(dead_code)]
#[path = "../examples/sandbox/output.rs"]
mod output;
#[allow(dead_code)]
#[path = "../examples/sandbox/session.rs"]
mod session;
#[allow(dead_code)]
#[path = "../examples/sandbox/terrain.rs"]
mod terrain;
#[allow(dead_code)]
#[path = "../examples/sandbox/view.rs"]
mod view;
#[allow(dead_code)]
#[path = "../examples/sandbox/world.rs"]
mod world;

use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Mutex, PoisonError};
use std::time::Duration;

/// How long one seed may run before it counts as a hang. The entries bound their own waits well below this; the
/// watchdog is for a hang they cannot see (a loop in a decoder).
const SEED_LIMIT: Duration = Duration::from_secs(60);

/// The committed inputs of `target`: its seed corpus and any crashers, sorted, so a failure reproduces in order.
fn inputs(target: &str) -> Vec<PathBuf> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut inputs: Vec<PathBuf> = ["corpus", "artifacts"]
        .iter()
        .filter_map(|folder| std::fs::read_dir(fuzz.join(folder).join(target)).ok())
        .flatten()
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.is_file())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "no committed inputs for `{target}` under {}", fuzz.display());
    inputs
}

/// One target at a time: the panic record is process-wide, so a failure is reported by the test that caused it.
static SERIAL: Mutex<()> = Mutex::new(());

/// Aborts the process if a seed runs longer than [`SEED_LIMIT`]: a hung seed cannot be unwound from outside, and
/// an abort fails the test run as surely as a panic.
struct Watchdog {
    seeds: mpsc::Sender<Option<PathBuf>>,
}

impl Watchdog {
    fn new() -> Self {
        let (seeds, running) = mpsc::channel::<Option<PathBuf>>();
        std::thread::spawn(move || {
            let mut current: Option<PathBuf> = None;
            loop {
                let next = match &current {
                    None => running.recv().ok(),
                    Some(seed) => match running.recv_timeout(SEED_LIMIT) {
                        Ok(next) => Some(next),
                        Err(mpsc::RecvTimeoutError::Disconnected) => None,
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            // Straight to the process's stderr: the test harness would swallow a captured
                            // `eprintln!` when the process aborts.
                            let _ = writeln!(
                                std::io::stderr(),
                                "hang: {} ran for more than {SEED_LIMIT:?}",
                                seed.display()
                            );
                            std::process::abort();
                        }
                    },
                };
                match next {
                    Some(next) => current = next,
                    None => return,
                }
            }
        });
        Self { seeds }
    }

    /// Runs `seed` through `run` under the watchdog; returns why it failed, if it did.
    fn run(&self, seed: &Path, run: impl FnOnce(&[u8])) -> Result<(), String> {
        let data = std::fs::read(seed).map_err(|error| format!("unreadable: {error}"))?;
        let _ = self.seeds.send(Some(seed.to_path_buf()));
        let outcome = catch_unwind(AssertUnwindSafe(|| run(&data)));
        let _ = self.seeds.send(None);
        // Whatever panicked during a failed seed belongs to it, not to the next one.
        let panicked = panics::take();
        outcome.map_err(|_| panicked.join("\n"))
    }
}

/// Runs every committed input of `target` through `run`; returns a report of each one that failed.
fn replay(target: &str, mut run: impl FnMut(&[u8])) -> Vec<String> {
    let watchdog = Watchdog::new();
    inputs(target)
        .iter()
        .filter_map(|seed| watchdog.run(seed, &mut run).err().map(|why| format!("{}:\n{why}", seed.display())))
        .collect()
}

fn assert_passed(target: &str, failures: Vec<String>) {
    assert!(failures.is_empty(), "{} input(s) of `{target}` failed:\n\n{}", failures.len(), failures.join("\n\n"));
}

#[test]
fn console_line_seeds_and_crashers() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    panics::watch();
    assert_passed("console_line", replay("console_line", console_line::run));
}

#[test]
fn tool_args_seeds_and_crashers() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut harness = tool_args::ToolArgs::new();
    assert_passed("tool_args", replay("tool_args", |data| harness.run(data)));
}

#[test]
fn mcp_body_seeds_and_crashers() {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let mut harness = mcp_body::McpBody::new();
    let failures = replay("mcp_body", |data| harness.run(data));
    harness.check_alive();
    assert_passed("mcp_body", failures);
}
