//! The sandbox's standard output: each line is handed to a thread of its own, which writes and flushes it, so that
//! a program that stops reading it (a full pipe) never holds up a frame, a tool or an in-game agent. At most
//! [`BACKLOG`] lines wait; past that a line is dropped and counted, and `output-dropped lines=N` is printed once
//! there is room again. A closed pipe is not the game's problem: it is ignored.

use std::fmt::Display;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use crossbeam_channel::{Sender, TrySendError};

/// The most lines waiting for a reader.
const BACKLOG: usize = 4_096;

enum Out {
    Line(String),
    /// Every line before it is written: answered.
    Written(Sender<()>),
}

struct Output {
    lines: Sender<Out>,
    dropped: AtomicU64,
}

fn output() -> &'static Output {
    static OUTPUT: OnceLock<Output> = OnceLock::new();
    OUTPUT.get_or_init(|| {
        let (lines, queue) = crossbeam_channel::bounded(BACKLOG);
        // Without its thread (none could be started), `say` writes on the caller's.
        let _ = std::thread::Builder::new().name("sandbox-output".into()).spawn(move || {
            for out in queue {
                match out {
                    Out::Line(line) => write_line(&line),
                    Out::Written(done) => drop(done.send(())),
                }
            }
        });
        Output { lines, dropped: AtomicU64::new(0) }
    })
}

fn write_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// Prints one line to standard output (flushed at once, so a program reading through a pipe sees it).
pub fn say(line: impl Display) {
    let output = output();
    let dropped = output.dropped.load(Ordering::SeqCst);
    if dropped > 0 && output.lines.try_send(Out::Line(format!("output-dropped lines={dropped}"))).is_ok() {
        output.dropped.fetch_sub(dropped, Ordering::SeqCst);
    }
    match output.lines.try_send(Out::Line(line.to_string())) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => drop(output.dropped.fetch_add(1, Ordering::SeqCst)),
        Err(TrySendError::Disconnected(Out::Line(line))) => write_line(&line),
        Err(TrySendError::Disconnected(Out::Written(_))) => {}
    }
}

/// Waits, at most `within`, until every line said so far is written: before the process exits.
pub fn written(within: Duration) {
    let (done, answered) = crossbeam_channel::bounded(1);
    if output().lines.send_timeout(Out::Written(done), within).is_ok() {
        let _ = answered.recv_timeout(within);
    }
}
