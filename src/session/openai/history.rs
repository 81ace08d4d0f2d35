//! The conversation's history, owned by the game: the messages of every turn in the endpoint's own JSON, kept in
//! `<data_dir>/<session id>/history.json`, replaced atomically and durably (file and directory synced) after each
//! turn, readable only by the user. Bounded: past `max_history_bytes` (or, with a known context window, two bytes a
//! token of it) the oldest whole turns are dropped when a turn is saved, and left out of each request (never
//! summarized: a summary would need another model request the player did not ask for), and the count of dropped
//! turns is kept so the model can be told.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

const FILE: &str = "history.json";

/// The turns so far, oldest first; each turn is its messages (the player's, the model's, the tools' results).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct History {
    pub turns: Vec<Vec<Value>>,
    /// How many of the oldest turns were dropped to keep the bound.
    pub dropped_turns: u64,
}

impl History {
    /// Adds a finished turn, then drops the oldest turns (never this one) while over `max_bytes`.
    pub(crate) fn push(&mut self, turn: Vec<Value>, max_bytes: usize) {
        self.turns.push(turn);
        let mut total: usize = self.turns.iter().map(|turn| size(turn)).sum();
        while total > max_bytes && self.turns.len() > 1 {
            total -= size(&self.turns.remove(0));
            self.dropped_turns = self.dropped_turns.saturating_add(1);
        }
    }

    /// What one request carries of the history: the newest whole turns whose JSON fits in `max_bytes` (maybe
    /// none), how many turns are left out in all (those dropped before and the older ones that do not fit now), and
    /// the bytes kept. Bounded here, not only by [`push`](Self::push), because a history can be over the bound when
    /// a request is built: one saved under a larger bound, or one the endpoint refused as longer than its context.
    pub(crate) fn fitting(&self, max_bytes: usize) -> Sent<'_> {
        let mut bytes = 0usize;
        let mut start = self.turns.len();
        for turn in self.turns.iter().rev() {
            let more = bytes.saturating_add(size(turn));
            if more > max_bytes {
                break;
            }
            bytes = more;
            start -= 1;
        }
        let left_out = u64::try_from(start).unwrap_or(u64::MAX);
        Sent { turns: &self.turns[start..], left_out: self.dropped_turns.saturating_add(left_out), bytes }
    }
}

/// The part of the history one request carries ([`History::fitting`]).
pub(crate) struct Sent<'a> {
    /// The newest turns, oldest first.
    pub turns: &'a [Vec<Value>],
    /// How many older turns are not sent.
    pub left_out: u64,
    /// The size of `turns`, in bytes of JSON.
    pub bytes: usize,
}

/// A turn's size, in bytes of JSON, as the bound counts it.
fn size(turn: &[Value]) -> usize {
    turn.iter().map(|message| message.to_string().len()).sum()
}

pub(crate) fn path(session_dir: &Path) -> PathBuf {
    session_dir.join(FILE)
}

/// Where an unreadable history is kept when its session starts anew (the one kept before it is replaced).
pub(crate) fn aside(path: &Path) -> PathBuf {
    path.with_extension("json.unreadable")
}

/// Reads the history; `Ok(None)` if there is none.
pub(crate) fn load(path: &Path) -> std::io::Result<Option<History>> {
    match crate::private::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(std::io::Error::other),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Replaces the history on disk atomically and durably, in the session's folder, which must exist: a write that
/// comes after the session was forgotten (its folder deleted) fails rather than making the folder again.
pub(crate) fn save(path: &Path, history: &History) -> std::io::Result<()> {
    crate::private::write(path, &serde_json::to_vec(history).map_err(std::io::Error::other)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_history_bound_drops_the_oldest_whole_turns_and_never_the_newest() {
        let mut history = History::default();
        let turn = |n: u32| vec![json!({"role": "user", "content": format!("turn {n} {}", "x".repeat(100))})];
        for n in 0..5 {
            history.push(turn(n), 350);
        }
        assert_eq!(history.turns.len(), 2, "{history:?}");
        assert_eq!(history.dropped_turns, 3);
        assert!(history.turns[1][0]["content"].as_str().is_some_and(|text| text.starts_with("turn 4")));
        history.push(vec![json!({"content": "y".repeat(1000)})], 350);
        assert_eq!(history.turns.len(), 1, "the newest turn stays even alone over the bound");
    }

    #[test]
    fn a_request_carries_only_the_newest_whole_turns_that_fit_the_bound_it_is_built_with() {
        let mut history = History { dropped_turns: 2, ..History::default() };
        let turn = |n: u32| vec![json!({"role": "user", "content": format!("turn {n} {}", "x".repeat(100))})];
        for n in 0..4 {
            history.push(turn(n), 1 << 20);
        }
        let one = size(&history.turns[0]);
        let sent = history.fitting(one * 2 + one / 2);
        assert_eq!((sent.turns, sent.left_out, sent.bytes), (&history.turns[2..], 4, one * 2));
        let sent = history.fitting(one - 1);
        assert_eq!((sent.turns.len(), sent.left_out, sent.bytes), (0, 6, 0), "even the newest, when it is too big");
        assert_eq!(history.fitting(usize::MAX).turns.len(), 4, "and the history itself is left as it is");
    }

    #[test]
    fn a_dropped_turns_count_read_from_the_file_at_its_maximum_stays_there() {
        let mut history: History =
            serde_json::from_value(json!({"turns": [[{"content": "old"}]], "dropped_turns": u64::MAX}))
                .expect("a history file");
        history.push(vec![json!({"content": "new"})], 1);
        assert_eq!((history.turns.len(), history.dropped_turns), (1, u64::MAX));
    }

    #[test]
    fn a_saved_history_loads_back_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let file = path(dir.path());
        assert_eq!(load(&file).unwrap(), None);
        let mut history = History::default();
        history.push(vec![json!({"role": "user", "content": "hello"})], 1 << 20);
        save(&file, &history).unwrap();
        assert_eq!(load(&file).unwrap(), Some(history));
    }

    #[test]
    fn a_history_written_after_its_session_was_forgotten_does_not_make_the_folder_again() {
        let dir = tempfile::tempdir().unwrap();
        let forgotten = dir.path().join("chat-0123abcd");
        let error = save(&path(&forgotten), &History::default()).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
        assert!(!forgotten.exists());
    }
}
