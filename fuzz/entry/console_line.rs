//! `console_line`: an input is what the player types into the sandbox's console, possibly several lines. It is
//! split into lines as the console's reader thread does (at each `\n`, each line read as UTF-8 where it can be,
//! its line break taken off), and each line goes through the console's decoder, [`Command::parse`].
//!
//! Besides not panicking, a decoded command must be one the console can act on (an `enter` names a valid world),
//! and an error must fit the console's one-line output protocol: a program reading the sandbox's standard output
//! line by line must see exactly one `error: ...` line per refused command.

use crate::console::{check_world_name, Command};

/// Decodes every line of `data` and checks the outcome of each.
pub fn run(data: &[u8]) {
    for line in data.split_inclusive(|byte| *byte == b'\n') {
        let line = String::from_utf8_lossy(line).trim_end_matches(['\n', '\r']).to_string();
        match Command::parse(&line) {
            Ok(None) => assert!(line.split_whitespace().next().is_none(), "{line:?} was ignored but is not blank"),
            Ok(Some(Command::Enter(world))) => {
                assert!(check_world_name(&world).is_ok(), "{line:?} enters the invalid world name {world:?}")
            }
            Ok(Some(_)) => {}
            Err(error) => {
                assert!(!error.is_empty(), "{line:?} was refused without a reason");
                assert!(!error.contains(['\n', '\r']), "{line:?} was refused on more than one line: {error:?}");
            }
        }
    }
}
