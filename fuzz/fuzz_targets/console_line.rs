//! Arbitrary bytes as what the player types into the sandbox's console: see `entry/console_line.rs`.
#![no_main]

// The sandbox's console module, and the modules it names with `crate::` paths, exactly as the example builds
// them; only its decoder is used here.
#[allow(dead_code)]
#[path = "../../examples/sandbox/console.rs"]
mod console;
#[allow(dead_code)]
#[path = "../../examples/sandbox/output.rs"]
mod output;
#[allow(dead_code)]
#[path = "../../examples/sandbox/session.rs"]
mod session;
#[allow(dead_code)]
#[path = "../../examples/sandbox/terrain.rs"]
mod terrain;
#[allow(dead_code)]
#[path = "../../examples/sandbox/view.rs"]
mod view;
#[allow(dead_code)]
#[path = "../../examples/sandbox/world.rs"]
mod world;

#[path = "../entry/console_line.rs"]
mod console_line;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| console_line::run(data));
