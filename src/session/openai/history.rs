//! The conversation's history, owned by the game: the messages of every turn in the endpoint's own JSON, kept in
//! `<data_dir>/<session id>/history.json`, replaced atomically and durably (file and directory synced) after each
//! turn, readable only by the user. Bounded: past `max_history_bytes` (or, with a known context window, two bytes a
//! token of it) the oldest whole turns are dropped when a turn is saved, and left out of each request (never
//! summarized: a summary would need another model request the player did not ask for), and the count of dropped
//! turns is kept so the model can be told.
//!
//! A history over its bound is cut well below it, to [`KEPT_PERCENT`] of it, not to just under it: local servers
//! (llama.cpp, Ollama) reuse the prompt they read last only as far as the new one starts the same, and a request's
//! history starts right after the system prompt. Dropping one old turn at every save would change that start at
//! every turn, and the server would read the whole prompt again each time (minutes on a CPU); cut this way, the
//! start (and the count of dropped turns the model is told there) changes once every few turns.

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

/// How much of its bound a history over it is cut to, in percent: the rest is room for the turns to come, which
/// then all start the same as the one before (see the module's documentation).
pub(crate) const KEPT_PERCENT: usize = 60;

impl History {
    /// Adds a finished turn; then, if the history is over `max_bytes`, drops the oldest turns (never this one)
    /// until it is within [`KEPT_PERCENT`] of it.
    pub(crate) fn push(&mut self, turn: Vec<Value>, max_bytes: usize) {
        self.turns.push(turn);
        forget_old_images(self.turns.iter_mut().flatten());
        // (`cut` may leave out every turn; the newest stays even alone over the bound.)
        let start = cut(&self.turns, max_bytes).min(self.turns.len() - 1);
        self.turns.drain(..start);
        self.dropped_turns = self.dropped_turns.saturating_add(u64::try_from(start).unwrap_or(u64::MAX));
    }

    /// What one request carries of the history: all of it if its JSON fits in `max_bytes`, else (as
    /// [`push`](Self::push) cuts it) the newest whole turns within [`KEPT_PERCENT`] of `max_bytes` (maybe none),
    /// how many turns are left out in all (those dropped before and the older ones left out now), and the bytes
    /// kept. Bounded here, not only by `push`, because a history can be over the bound when a request is built:
    /// one saved under a larger bound, or one the endpoint refused as longer than its context.
    pub(crate) fn fitting(&self, max_bytes: usize) -> Sent<'_> {
        let start = cut(&self.turns, max_bytes);
        let turns = &self.turns[start..];
        let left_out = u64::try_from(start).unwrap_or(u64::MAX);
        Sent {
            turns,
            left_out: self.dropped_turns.saturating_add(left_out),
            bytes: turns.iter().map(|t| size(t)).sum(),
        }
    }
}

/// How many of the tools' images the history keeps, the newest: an older one is replaced by [`IMAGE_GONE`], so
/// the bound (which counts an image as [`IMAGE_BYTES`]) also bounds what a request really carries.
pub(crate) const IMAGES_KEPT: usize = 4;

/// What stands in the history for an image older than the [`IMAGES_KEPT`] newest.
pub(crate) const IMAGE_GONE: &str = "[an image the game's tools returned earlier, no longer sent]";

/// Replaces every image part of `messages` (oldest first) but the [`IMAGES_KEPT`] newest with a text part saying
/// so: for the history, and for each request (a turn's own rounds can add many). Each new image changes an older
/// message of the request, so a local server reads the prompt again from there: slower with images, not wrong.
pub(crate) fn forget_old_images<'a>(messages: impl DoubleEndedIterator<Item = &'a mut Value>) {
    let mut seen = 0;
    for message in messages.rev() {
        let Some(parts) = message.get_mut("content").and_then(Value::as_array_mut) else { continue };
        for part in parts.iter_mut().rev().filter(|part| part["type"] == "image_url") {
            seen += 1;
            if seen > IMAGES_KEPT {
                *part = serde_json::json!({"type": "text", "text": IMAGE_GONE});
            }
        }
    }
}

/// Where the turns kept under `max_bytes` start: at the first if all fit, else at the first of the newest that fit
/// in [`KEPT_PERCENT`] of it (`turns.len()` if none does).
fn cut(turns: &[Vec<Value>], max_bytes: usize) -> usize {
    let total: usize = turns.iter().map(|turn| size(turn)).sum();
    if total <= max_bytes {
        return 0;
    }
    // (Not `max_bytes * KEPT_PERCENT / 100`, which overflows for a bound near `usize::MAX`.)
    let kept = max_bytes / 100 * KEPT_PERCENT + max_bytes % 100 * KEPT_PERCENT / 100;
    let mut bytes = 0usize;
    let mut start = turns.len();
    for turn in turns.iter().rev() {
        bytes = bytes.saturating_add(size(turn));
        if bytes > kept {
            break;
        }
        start -= 1;
    }
    start
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

/// What an image counts for in the bound, in place of its `data:` URL: about what a model reads it as (a thousand
/// tokens, give or take, at the four bytes a token the bound counts text at), not its base64 bytes, which would have
/// one screenshot push every older turn out of a small model's history.
pub(crate) const IMAGE_BYTES: usize = 4_000;

/// A turn's size, in bytes of JSON, as the bound counts it: each image as [`IMAGE_BYTES`].
fn size(turn: &[Value]) -> usize {
    turn.iter()
        .map(|message| {
            let parts = message["content"].as_array().into_iter().flatten();
            let urls = parts
                .filter(|part| part["type"] == "image_url")
                .map(|part| part["image_url"]["url"].as_str().map_or(0, str::len));
            let (images, url_bytes) = urls.fold((0usize, 0usize), |(n, bytes), url| (n + 1, bytes + url));
            (message.to_string().len() - url_bytes).saturating_add(images.saturating_mul(IMAGE_BYTES))
        })
        .sum()
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
        // A file that is not a history is `InvalidData` (or `UnexpectedEof`, cut short).
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(std::io::Error::from),
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
    fn the_history_bound_drops_the_oldest_whole_turns_down_to_well_below_it_and_never_the_newest() {
        let mut history = History::default();
        let turn = |n: u32| vec![json!({"role": "user", "content": format!("turn {n} {}", "x".repeat(100))})];
        let one = size(&turn(0));
        let bound = one * 3 + one / 2;
        for n in 0..4 {
            history.push(turn(n), bound);
        }
        assert_eq!((history.turns.len(), history.dropped_turns), (2, 2), "over by half a turn: {history:?}");
        let first = |history: &History| history.turns[0][0]["content"].as_str().map(|text| text[..6].to_string());
        assert_eq!(first(&history).as_deref(), Some("turn 2"));
        assert!(history.turns.iter().map(|turn| size(turn)).sum::<usize>() <= bound * KEPT_PERCENT / 100);
        history.push(turn(4), bound);
        assert_eq!((history.turns.len(), history.dropped_turns), (3, 2), "the next turn fits: nothing dropped");
        history.push(vec![json!({"content": "y".repeat(1000)})], bound);
        assert_eq!(history.turns.len(), 1, "the newest turn stays even alone over the bound");
    }

    #[test]
    fn an_image_counts_for_what_a_model_reads_of_it_not_for_its_base64_bytes() {
        // The bound of an 8,192-token context window; a screenshot of 20 KB of base64.
        let (bound, mut history) = (16_384, History::default());
        let text = |n: u32| vec![json!({"role": "user", "content": format!("turn {n} {}", "x".repeat(1000))})];
        let url = format!("data:image/png;base64,{}", "A".repeat(20_000));
        let image = vec![
            json!({"role": "tool", "tool_call_id": "a", "content": "an image"}),
            json!({"role": "user", "content": [
                {"type": "text", "text": "[images]"}, {"type": "image_url", "image_url": {"url": url}},
            ]}),
        ];
        assert!(size(&image) < IMAGE_BYTES + 200, "{}", size(&image));
        for n in 0..3 {
            history.push(text(n), bound);
        }
        history.push(image, bound);
        history.push(text(3), bound);
        assert_eq!((history.turns.len(), history.dropped_turns), (5, 0), "the screenshot pushed no turn out");
    }

    #[test]
    fn only_the_newest_images_are_kept_so_the_bound_bounds_what_a_request_carries() {
        let mut history = History::default();
        let image = |n: usize| {
            let url = format!("data:image/png;base64,{n}{}", "A".repeat(100_000));
            vec![json!({"role": "user", "content": [
                {"type": "text", "text": "[images]"}, {"type": "image_url", "image_url": {"url": url}},
            ]})]
        };
        for n in 0..10 {
            history.push(image(n), 512 * 1024);
        }
        assert_eq!(history.turns.len(), 10, "no turn dropped");
        let kept: Vec<usize> = (0..10).filter(|&n| history.turns[n][0]["content"][1]["type"] == "image_url").collect();
        assert_eq!(kept, [6, 7, 8, 9], "the newest {IMAGES_KEPT}");
        assert_eq!(history.turns[0][0]["content"][1], json!({"type": "text", "text": IMAGE_GONE}));
        let bytes: usize = history.turns.iter().flatten().map(|message| message.to_string().len()).sum();
        assert!(bytes < (IMAGES_KEPT + 1) * 100_100, "{bytes} bytes");
    }

    #[test]
    fn past_its_bound_the_history_keeps_the_same_start_for_several_turns_between_drops() {
        let mut history = History::default();
        let turn = |n: u32| vec![json!({"role": "user", "content": format!("turn {n:02} {}", "x".repeat(100))})];
        let bound = size(&turn(0)) * 10;
        let mut starts = Vec::new();
        for n in 0..60 {
            history.push(turn(n), bound);
            starts.push((history.dropped_turns, history.turns[0].clone()));
        }
        let changes = starts.windows(2).filter(|pair| pair[0] != pair[1]).count();
        let drops = starts.windows(2).filter(|pair| pair[0].0 != pair[1].0).count();
        assert_eq!(changes, drops, "the start changes only when turns are dropped");
        // 50 turns past the bound; a drop leaves room for 4 more.
        assert!((8..=11).contains(&drops), "{drops} drops in 50 turns past the bound");
    }

    #[test]
    fn a_request_carries_all_of_a_history_within_its_bound_else_the_newest_turns_within_the_kept_share_of_it() {
        let mut history = History { dropped_turns: 2, ..History::default() };
        let turn = |n: u32| vec![json!({"role": "user", "content": format!("turn {n} {}", "x".repeat(100))})];
        for n in 0..4 {
            history.push(turn(n), 1 << 20);
        }
        let one = size(&history.turns[0]);
        let sent = history.fitting(one * 4);
        assert_eq!((sent.turns.len(), sent.left_out, sent.bytes), (4, 2, one * 4), "all of it fits");
        // Over by one byte: cut as a save cuts it, to the newest turns within 60% of it (2.4 turns).
        let sent = history.fitting(one * 4 - 1);
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
