//! Arbitrary JSON as the arguments of calls of every tool of the fuzz game: see `entry/tool_args.rs`.
#![no_main]

#[path = "../entry/game.rs"]
mod game;
#[path = "../entry/panics.rs"]
mod panics;
#[path = "../entry/tool_args.rs"]
mod tool_args;

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use tool_args::ToolArgs;

thread_local! {
    /// One headless game for the whole fuzzing process (a Bevy `App` stays on the thread that runs its frames,
    /// which is the thread libFuzzer calls us on).
    static HARNESS: RefCell<Option<ToolArgs>> = const { RefCell::new(None) };
}

fuzz_target!(|data: &[u8]| {
    HARNESS.with_borrow_mut(|harness| harness.get_or_insert_with(ToolArgs::new).run(data));
});
