//! Every panic in the process, on any thread, recorded: tokio catches a panicking task and hyper answers with a
//! dropped connection, so a panic in the server or the game would otherwise go unseen by the code that sent the
//! input. The hook chains to the one installed before it: under libFuzzer that one aborts the process (the crash
//! the fuzzer saves); under `cargo test` it prints the panic, and [`assert_none`] fails the test.

use std::sync::{Mutex, Once, PoisonError};

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static WATCH: Once = Once::new();

/// Installs the recording hook (once per process).
pub fn watch() {
    WATCH.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
            PANICS.lock().unwrap_or_else(PoisonError::into_inner).push(format!("thread `{thread}`: {info}"));
            previous(info);
        }));
    });
}

/// The panics recorded since the last call, forgotten.
pub fn take() -> Vec<String> {
    std::mem::take(&mut *PANICS.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Fails, listing them, if anything panicked since the last call.
pub fn assert_none(input: &str) {
    let panics = take();
    assert!(panics.is_empty(), "{input} made something panic:\n{}", panics.join("\n"));
}
