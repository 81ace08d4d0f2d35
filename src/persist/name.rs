//! Names that become paths: a world is a directory, a document a file in it. Only `a-z 0-9 _ -` are allowed,
//! so no name can escape the data directory (`..`, `/`), collide on case-insensitive file systems, or clash with
//! the store's own files (which contain a `.`). Windows' device names (`con`, `nul`, `com1`, ...) are refused
//! everywhere: there they name devices, not files, and saves should move between systems.

use super::error::{NameKind, StoreError};

pub(crate) fn max_len(kind: NameKind) -> usize {
    match kind {
        NameKind::World => 64,
        NameKind::Document => 64,
    }
}

/// Checks `name` against the rules for `kind`.
pub(crate) fn check(kind: NameKind, name: &str) -> Result<(), StoreError> {
    let invalid = |reason: String| Err(StoreError::InvalidName { kind, name: name.to_string(), reason });
    let len = name.chars().count();
    if len == 0 || len > max_len(kind) {
        return invalid(format!("it has {len} characters"));
    }
    if let Some(bad) = name.chars().find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '_' | '-')) {
        return invalid(format!("it contains {bad:?}"));
    }
    if is_windows_device(name) {
        return invalid("it is a device name on Windows".to_string());
    }
    Ok(())
}

/// `con`, `prn`, `aux`, `nul`, `com0`-`com9`, `lpt0`-`lpt9` (names here have no extension and are lower case).
fn is_windows_device(name: &str) -> bool {
    match name.as_bytes() {
        b"con" | b"prn" | b"aux" | b"nul" => true,
        [b'c', b'o', b'm', digit] | [b'l', b'p', b't', digit] => digit.is_ascii_digit(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_escape_the_data_directory_are_refused() {
        for bad in ["", "..", "a/b", "A", "a.b", "über", &"x".repeat(65), "con", "nul", "aux", "com1", "lpt9"] {
            assert!(check(NameKind::World, bad).is_err(), "{bad:?} must be refused");
        }
        for good in ["alpha", "world-2", "save_1", &"x".repeat(64), "console", "com10", "null"] {
            assert!(check(NameKind::World, good).is_ok(), "{good:?} must be accepted");
        }
        let message = check(NameKind::World, "../etc").unwrap_err().to_string();
        assert!(message.contains("a-z, 0-9, _ and -"), "{message}");
    }
}
