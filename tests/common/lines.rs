//! A child process's standard output as lines, read on a thread of their own as they come, with every line read so
//! far kept for failure messages: what the tests (and the window bench) that drive a program through its console
//! share. Every wait is bounded.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::ChildStdout;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The lines of one child's standard output.
pub struct Lines {
    lines: Receiver<String>,
    /// Every line read so far, in order.
    pub seen: Vec<String>,
    /// How long any one wait may take before the test fails.
    wait: Duration,
}

impl Lines {
    /// Starts reading `stdout`; each wait gives up (panics, with the lines seen) after `wait`.
    pub fn of(stdout: ChildStdout, wait: Duration) -> Self {
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        Self { lines, seen: Vec::new(), wait }
    }

    /// Reads lines until one satisfies `wanted`; returns it.
    pub fn until(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let until = Instant::now() + self.wait;
        loop {
            match self.lines.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!("no {what} within {:?}; lines: {:#?}", self.wait, self.seen),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("the output ended before {what}; lines: {:#?}", self.seen)
                }
            }
        }
    }

    /// The next line.
    pub fn next(&mut self) -> String {
        self.until("line", |_| true)
    }

    /// A line already read that satisfies `wanted`, else the next one that does (for lines whose order with
    /// others is free).
    pub fn seen_or_until(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        match self.seen.iter().find(|line| wanted(line)) {
            Some(line) => line.clone(),
            None => self.until(what, wanted),
        }
    }

    /// Reads every line until the output ends: the child closed it, which it does by exiting.
    pub fn until_closed(&mut self) {
        let until = Instant::now() + self.wait;
        loop {
            match self.lines.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(line) => self.seen.push(line),
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("the output did not end (no exit) within {:?}; lines: {:#?}", self.wait, self.seen)
                }
            }
        }
    }
}
