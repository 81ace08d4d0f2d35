//! The TASK_OPERATION replay table (rule H12): calls with the same (tool, task, scope, operation id) share one
//! execution, and its outcome is retained for later duplicates.
//!
//! Modelled on idempotency keys (the outcome of the first request is kept whether it succeeded or failed, the
//! same key with other parameters is an error, keys expire), and stricter: duplicates that arrive while the first
//! runs join it, and a retained timeout says its effect is unknown.
//!
//! One table per visit; it ends with its visit. Retention is bounded by count, bytes and age; in-flight entries
//! are never evicted, and the newest outcome is kept even if it alone is over the byte budget. This is not durable
//! exactly-once execution across reconnections or visits: after a `TIMEOUT` (effect unknown), inspect the game's
//! state before deliberately starting a new operation id.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::ids::{LocationRevision, OperationId, TaskId};
use crate::tool::input::normalize_numbers;

/// What makes two calls the same operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReplayKey {
    /// The tool.
    pub tool: String,
    /// The task (the conversation unless the agent named one).
    pub task: TaskId,
    /// `None` for `World` scope; the admitted revision for `Location` scope, so the same operation id at another
    /// location is another operation.
    pub location: Option<LocationRevision>,
    /// The agent's operation id.
    pub operation: OperationId,
}

/// How long and how many outcomes a visit's table keeps.
///
/// ```
/// # use std::time::Duration;
/// # use bevy_agent_tools::ReplayRetention;
/// // Keep outcomes for an hour, in at most 16 MiB.
/// let retention = ReplayRetention {
///     max_age: Duration::from_secs(3600),
///     max_bytes: 16 << 20,
///     ..ReplayRetention::default()
/// };
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayRetention {
    /// At most this many entries (completed ones are evicted oldest first; in-flight ones never, so this also
    /// bounds the keyed operations running in a visit at once: past it, a keyed call is refused `BUSY`). At least 1.
    pub max_entries: usize,
    /// Completed entries older than this are dropped.
    pub max_age: Duration,
    /// At most about this many bytes of keys, arguments and outcomes (an outcome at its size in memory: its JSON
    /// text and the size of each value and key in it, so that a list of small numbers, ten times its text once
    /// read, counts as that): completed entries are evicted oldest first to stay under it, except the newest
    /// outcome, which is kept even if it alone is larger.
    pub max_bytes: usize,
}

impl Default for ReplayRetention {
    /// 10,000 entries, 64 MiB, 10 minutes.
    fn default() -> Self {
        Self { max_entries: 10_000, max_age: Duration::from_secs(600), max_bytes: 64 << 20 }
    }
}

/// What a value takes in memory as a `serde_json::Value`, about: the size an outcome is counted at in
/// [`ReplayRetention::max_bytes`]. Its JSON text, and a `Value`'s own size for each value and key in it (counted
/// from the text's separators and openings outside strings).
pub(crate) fn retained_bytes(value: &impl Serialize) -> usize {
    /// What each value or key takes besides its text: a `Value`, and a map entry's share of its tree's node.
    const PER_VALUE: usize = size_of::<serde_json::Value>() + 16;
    #[derive(Default)]
    struct Count {
        bytes: usize,
        values: usize,
        in_string: bool,
        escaped: bool,
    }
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.bytes += bytes.len();
            for &byte in bytes {
                match (self.in_string, self.escaped, byte) {
                    (true, true, _) => self.escaped = false,
                    (true, false, b'\\') => self.escaped = true,
                    (_, false, b'"') => self.in_string = !self.in_string,
                    (false, _, b',' | b':' | b'[' | b'{') => self.values += 1,
                    _ => {}
                }
            }
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count::default();
    // Serializing an outcome cannot fail (string keys only); a count cut short is still a count.
    let _ = serde_json::to_writer(&mut count, value);
    count.bytes + (count.values + 1) * PER_VALUE
}

enum State<T, O> {
    InFlight(T),
    Done(O),
}

struct Entry<T, O> {
    /// The arguments in canonical form.
    arguments: Arc<str>,
    state: State<T, O>,
    generation: u64,
    /// What it is counted at against [`ReplayRetention::max_bytes`].
    bytes: usize,
}

impl ReplayKey {
    /// What the key is counted at (its text, and the bookkeeping that holds it twice).
    fn bytes(&self) -> usize {
        self.tool.len() + self.task.as_str().len() + 2 * self.operation.as_str().len() + 2 * size_of::<Self>()
    }
}

/// What admission should do with a keyed call.
#[allow(missing_debug_implementations)] // internals, for the benches
pub enum Begin<T, O> {
    /// First of its key: run it, then [`ReplayTable::start`] it.
    Fresh,
    /// Same key, same arguments, still running: share that execution.
    Join(T),
    /// Same key, same arguments, finished: this is its outcome.
    Retained(O),
    /// Same key, other arguments.
    Conflict,
    /// The table is full of in-flight operations.
    Full,
}

/// One visit's table: keyed executions in flight (`T`) and retained outcomes (`O`).
#[allow(missing_debug_implementations)] // internals, for the benches
pub struct ReplayTable<T, O> {
    retention: ReplayRetention,
    entries: HashMap<ReplayKey, Entry<T, O>>,
    /// Completed entries in completion order: (key, generation, completed at).
    completed: VecDeque<(ReplayKey, u64, Instant)>,
    next_generation: u64,
    /// What the entries are counted at, in all.
    bytes: usize,
}

impl<T: Clone, O: Clone> ReplayTable<T, O> {
    /// An empty table.
    pub fn new(retention: ReplayRetention) -> Self {
        Self { retention, entries: HashMap::new(), completed: VecDeque::new(), next_generation: 0, bytes: 0 }
    }

    /// What the entries are counted at, in all.
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Looks `key` up for a call with `arguments` (canonical form).
    pub fn begin(&mut self, key: &ReplayKey, arguments: &str, now: Instant) -> Begin<T, O> {
        self.expire(now);
        match self.entries.get(key) {
            Some(entry) if &*entry.arguments != arguments => Begin::Conflict,
            Some(Entry { state: State::InFlight(running), .. }) => Begin::Join(running.clone()),
            Some(Entry { state: State::Done(outcome), .. }) => Begin::Retained(outcome.clone()),
            None => {
                // Nothing is evicted yet: only `start` makes room, once the call is really admitted (a call
                // refused after this lookup, say `BUSY`, never costs another operation its retained outcome).
                self.drop_stale_completions();
                if self.entries.len() >= self.retention.max_entries && self.completed.is_empty() {
                    Begin::Full
                } else {
                    Begin::Fresh
                }
            }
        }
    }

    /// Records the execution of a fresh key, evicting the oldest retained outcomes if the table is full (by
    /// count, or by bytes with this entry's key and arguments).
    pub fn start(&mut self, key: ReplayKey, arguments: &str, running: T) {
        if self.entries.len() >= self.retention.max_entries {
            self.evict_oldest(None);
        }
        let bytes = key.bytes() + arguments.len() + size_of::<Entry<T, O>>();
        while self.bytes + bytes > self.retention.max_bytes && self.evict_oldest(None) {}
        self.next_generation += 1;
        let entry = Entry {
            arguments: Arc::from(arguments),
            state: State::InFlight(running),
            generation: self.next_generation,
            bytes,
        };
        self.bytes += bytes;
        if let Some(replaced) = self.entries.insert(key, entry) {
            self.bytes -= replaced.bytes;
        }
    }

    /// Retains the outcome of a finished execution, counted at `outcome_bytes` ([`retained_bytes`]); older
    /// outcomes are evicted while the table is over its byte budget, never this one, and those past their age go
    /// (not only at the next keyed call's lookup).
    pub fn complete(&mut self, key: &ReplayKey, outcome: O, outcome_bytes: usize, now: Instant) {
        self.expire(now);
        let Some(entry) = self.entries.get_mut(key) else { return };
        if !matches!(entry.state, State::InFlight(_)) {
            return;
        }
        entry.state = State::Done(outcome);
        entry.bytes += outcome_bytes;
        let generation = entry.generation;
        self.bytes += outcome_bytes;
        self.completed.push_back((key.clone(), generation, now));
        while self.bytes > self.retention.max_bytes && self.evict_oldest(Some(generation)) {}
    }

    /// [`complete`](Self::complete)s the key's entry only if it is still the execution `is_it` says: once an
    /// ended execution's entry was settled ([`settle_ended`](Self::settle_ended)) and evicted, a retry may hold the
    /// key with an execution of its own, which the first one's late completion must not end.
    pub fn complete_own(
        &mut self,
        key: &ReplayKey,
        is_it: impl FnOnce(&T) -> bool,
        outcome: O,
        outcome_bytes: usize,
        now: Instant,
    ) {
        if matches!(self.entries.get(key), Some(Entry { state: State::InFlight(running), .. }) if is_it(running)) {
            self.complete(key, outcome, outcome_bytes, now);
        }
    }

    /// Settles the in-flight entries whose execution already ended, whose caller may already hold the outcome while
    /// the entry waits to be completed a moment later (so a sequential agent's next keyed call is not refused
    /// `BUSY` in between). `ended` says, of an execution: still running (`None`), ended with an outcome to retain
    /// and its size (`Some(Some(..))`), or ended without one (`Some(None)`: forgotten). Looks at every entry: for
    /// a table that [`begin`](Self::begin) found full. Returns whether any was settled.
    pub fn settle_ended(&mut self, ended: impl Fn(&T) -> Option<Option<(O, usize)>>, now: Instant) -> bool {
        let settled: Vec<(ReplayKey, Option<(O, usize)>)> = self
            .entries
            .iter()
            .filter_map(|(key, entry)| match &entry.state {
                State::InFlight(running) => ended(running).map(|outcome| (key.clone(), outcome)),
                State::Done(_) => None,
            })
            .collect();
        let any = !settled.is_empty();
        for (key, outcome) in settled {
            match outcome {
                Some((outcome, bytes)) => self.complete(&key, outcome, bytes, now),
                None => self.remove(&key),
            }
        }
        any
    }

    /// Forgets an execution that never started its handler, so a retry can run: the key's in-flight entry, if
    /// `is_it` says the entry is that execution's (a retry may already hold the key with an execution of its own).
    pub fn forget(&mut self, key: &ReplayKey, is_it: impl FnOnce(&T) -> bool) {
        if matches!(self.entries.get(key), Some(Entry { state: State::InFlight(running), .. }) if is_it(running)) {
            self.remove(key);
        }
    }

    fn remove(&mut self, key: &ReplayKey) {
        if let Some(entry) = self.entries.remove(key) {
            self.bytes -= entry.bytes;
        }
    }

    fn expire(&mut self, now: Instant) {
        self.drop_stale_completions();
        while let Some((_, _, completed_at)) = self.completed.front() {
            if now.saturating_duration_since(*completed_at) < self.retention.max_age {
                break;
            }
            self.evict_oldest(None);
        }
    }

    /// Drops the completions at the front whose entry was replaced or forgotten since.
    fn drop_stale_completions(&mut self) {
        while let Some((key, generation, _)) = self.completed.front() {
            if self.entries.get(key).is_some_and(|entry| entry.generation == *generation) {
                break;
            }
            self.completed.pop_front();
        }
    }

    /// Evicts the oldest completed entry, unless it is generation `keep`; false if there is none to evict.
    fn evict_oldest(&mut self, keep: Option<u64>) -> bool {
        self.drop_stale_completions();
        match self.completed.front() {
            Some((_, generation, _)) if Some(*generation) != keep => {
                if let Some((key, _, _)) = self.completed.pop_front() {
                    self.remove(&key);
                }
                // So that the front is a live completion, whose age `expire` reads.
                self.drop_stale_completions();
                true
            }
            _ => false,
        }
    }
}

/// The arguments in a form where object key order and number spelling do not matter: keys sorted, integral
/// numbers written as integers.
pub fn canonical_arguments(arguments: &Value) -> String {
    let mut arguments = arguments.clone();
    normalize_numbers(&mut arguments);
    let mut out = String::new();
    write_canonical(&arguments, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn key(n: usize) -> ReplayKey {
        ReplayKey { tool: "t".into(), task: "task".into(), location: None, operation: OperationId::new(n.to_string()) }
    }

    #[test]
    fn canonical_form_ignores_key_order_and_number_spelling() {
        let a: Value = serde_json::from_str(r#"{"b": 1.0, "a": {"y": [1e2, 2], "x": null}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a": {"x": null, "y": [100, 2.0]}, "b": 1}"#).unwrap();
        assert_eq!(canonical_arguments(&a), canonical_arguments(&b));
        assert_ne!(canonical_arguments(&json!({"a": 1})), canonical_arguments(&json!({"a": 1.5})));
        assert_ne!(canonical_arguments(&json!({"a": "1"})), canonical_arguments(&json!({"a": 1})));
    }

    #[test]
    fn h12_a_full_table_makes_room_from_executions_that_ended_before_their_entries_were_completed() {
        let mut table: ReplayTable<u32, &str> =
            ReplayTable::new(ReplayRetention { max_entries: 2, ..Default::default() });
        let now = Instant::now();
        // Two executions in flight: 1 has ended with an outcome (its caller has it; its entry is completed a
        // moment later), 2 still runs.
        for n in [1, 2] {
            table.start(key(n), "{}", n as u32);
        }
        assert!(matches!(table.begin(&key(3), "{}", now), Begin::Full));
        let ended = |running: &u32| (*running == 1).then_some(Some(("one", 3)));
        assert!(table.settle_ended(ended, now), "1 settled");
        assert!(matches!(table.begin(&key(1), "{}", now), Begin::Retained("one")), "its outcome retained");
        assert!(matches!(table.begin(&key(3), "{}", now), Begin::Fresh), "room for a new key");
        table.start(key(3), "{}", 3);
        assert!(matches!(table.begin(&key(1), "{}", now), Begin::Full), "1's outcome evicted for 3; the rest run");
        assert!(matches!(table.begin(&key(2), "{}", now), Begin::Join(2)), "2 still runs, never evicted");
        // One that ended before its handler started leaves no trace: forgotten.
        assert!(table.settle_ended(|running: &u32| (*running == 3).then_some(None), now));
        assert!(matches!(table.begin(&key(3), "{}", now), Begin::Fresh));
        assert!(!table.settle_ended(|_: &u32| None, now), "nothing ended: nothing settled");
    }

    #[test]
    fn h12_a_settled_executions_late_completion_never_ends_a_retry_that_runs_under_its_key() {
        let mut table: ReplayTable<u32, &str> =
            ReplayTable::new(ReplayRetention { max_entries: 2, ..Default::default() });
        let now = Instant::now();
        table.start(key(1), "{}", 1);
        table.start(key(2), "{}", 2);
        // 1 ended: settled, then evicted for 3; 2 completes; a retry of 1's key runs as 4.
        assert!(table.settle_ended(|running: &u32| (*running == 1).then_some(Some(("one", 3))), now));
        table.start(key(3), "{}", 3);
        table.complete_own(&key(2), |running| *running == 2, "two", 3, now);
        assert!(matches!(table.begin(&key(1), "{}", now), Begin::Fresh), "1's outcome was evicted");
        table.start(key(1), "{}", 4);
        // 1's own completion, coming late, leaves 4 running.
        table.complete_own(&key(1), |running| *running == 1, "one", 3, now);
        assert!(matches!(table.begin(&key(1), "{}", now), Begin::Join(4)), "4 still runs");
        table.complete_own(&key(1), |running| *running == 4, "four", 3, now);
        assert!(matches!(table.begin(&key(1), "{}", now), Begin::Retained("four")));
    }

    #[test]
    fn h12_retention_a_million_unique_keys_never_exceed_the_cap() {
        let cap = 10_000;
        let mut table: ReplayTable<(), u32> = ReplayTable::new(ReplayRetention {
            max_entries: cap,
            max_age: Duration::from_secs(3600),
            ..Default::default()
        });
        let now = Instant::now();
        for n in 0..1_000_000 {
            let key = key(n);
            assert!(matches!(table.begin(&key, "{}", now), Begin::Fresh));
            table.start(key.clone(), "{}", ());
            table.complete(&key, 0, 0, now);
            assert!(table.len() <= cap, "{} entries after {n} keys", table.len());
        }
        assert_eq!(table.len(), cap);
        assert!(table.completed.len() <= cap, "the completion order does not grow either");
    }

    #[test]
    fn h12_retention_oldest_completed_go_first_and_in_flight_is_never_evicted() {
        let mut table: ReplayTable<&str, u32> = ReplayTable::new(ReplayRetention {
            max_entries: 2,
            max_age: Duration::from_secs(3600),
            ..Default::default()
        });
        let now = Instant::now();
        table.start(key(0), "{}", "running");
        table.start(key(1), "{}", "first");
        table.complete(&key(1), 1, 0, now);
        assert!(matches!(table.begin(&key(2), "{}", now), Begin::Fresh), "the completed entry made room");
        table.start(key(2), "{}", "running too");
        assert!(matches!(table.begin(&key(0), "{}", now), Begin::Join("running")), "in flight survived");
        assert!(matches!(table.begin(&key(3), "{}", now), Begin::Full), "only in-flight entries left");
    }

    #[test]
    fn h12_a_lookup_that_is_not_followed_by_an_execution_evicts_nothing() {
        let mut table: ReplayTable<&str, u32> = ReplayTable::new(ReplayRetention {
            max_entries: 1,
            max_age: Duration::from_secs(3600),
            ..Default::default()
        });
        let now = Instant::now();
        table.start(key(0), "{}", "done");
        table.complete(&key(0), 7, 0, now);
        // A new key's call is looked up, then refused (say BUSY): the retained outcome stays.
        assert!(matches!(table.begin(&key(1), "{}", now), Begin::Fresh));
        assert!(matches!(table.begin(&key(0), "{}", now), Begin::Retained(7)));
        table.start(key(1), "{}", "running");
        let after = table.begin(&key(0), "{}", now);
        assert!(!matches!(after, Begin::Retained(_)), "evicted once a new execution needed room");
    }

    #[test]
    fn h12_retention_entries_expire_by_age() {
        let mut table: ReplayTable<(), u32> = ReplayTable::new(ReplayRetention {
            max_entries: 100,
            max_age: Duration::from_secs(60),
            ..Default::default()
        });
        let start = Instant::now();
        table.start(key(0), "{}", ());
        table.complete(&key(0), 7, 0, start);
        assert!(matches!(table.begin(&key(0), "{}", start + Duration::from_secs(59)), Begin::Retained(7)));
        assert!(matches!(table.begin(&key(0), "{}", start + Duration::from_secs(61)), Begin::Fresh));
        assert_eq!(table.len(), 0);
    }

    #[test]
    fn h12_retention_bytes_oldest_outcomes_go_first_and_the_newest_stays_even_if_alone_over() {
        // Three outcomes of 1,000 bytes (and their keys' few hundred) do not fit; two do.
        let budget = 3_000;
        let mut table: ReplayTable<(), u32> =
            ReplayTable::new(ReplayRetention { max_bytes: budget, ..Default::default() });
        let now = Instant::now();
        for n in 0..3 {
            table.start(key(n), "{}", ());
            table.complete(&key(n), n as u32, 1_000, now);
        }
        assert!(table.bytes() <= budget, "{} bytes", table.bytes());
        assert!(matches!(table.begin(&key(0), "{}", now), Begin::Fresh), "the oldest went to stay under the budget");
        assert!(matches!(table.begin(&key(1), "{}", now), Begin::Retained(1)), "the next oldest fits");
        assert!(matches!(table.begin(&key(2), "{}", now), Begin::Retained(2)), "the newest stayed");
        // One outcome over the whole budget: everything older goes, it stays (its replay still runs nothing).
        table.start(key(3), "{}", ());
        table.complete(&key(3), 3, 2 * budget, now);
        assert!(matches!(table.begin(&key(3), "{}", now), Begin::Retained(3)));
        assert!(matches!(table.begin(&key(2), "{}", now), Begin::Fresh));
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn h12_retention_bytes_in_flight_arguments_are_counted_and_never_evicted() {
        let mut table: ReplayTable<&str, u32> =
            ReplayTable::new(ReplayRetention { max_bytes: 1_000, ..Default::default() });
        let now = Instant::now();
        table.start(key(0), "{}", "done");
        table.complete(&key(0), 7, 100, now);
        let large = format!("{{\"text\":\"{}\"}}", "x".repeat(2_000));
        table.start(key(1), &large, "running");
        assert!(matches!(table.begin(&key(0), "{}", now), Begin::Fresh), "the retained outcome made room");
        assert!(matches!(table.begin(&key(1), &large, now), Begin::Join("running")), "in flight is kept");
        table.forget(&key(1), |_| true);
        assert_eq!(table.bytes(), 0, "every byte counted in is counted out");
    }

    #[test]
    fn h12_retention_an_outcome_is_counted_at_its_size_in_memory_not_only_its_text() {
        let text = |value: &serde_json::Value| serde_json::to_string(value).unwrap().len();
        // A long string: about its text.
        let note = json!({"note": "x".repeat(100_000)});
        assert!(retained_bytes(&note) < text(&note) + 1000, "{}", retained_bytes(&note));
        // A list of small numbers: each a `Value` once read, several times its two bytes of text.
        let numbers = json!((0..10_000).map(|n| n % 10).collect::<Vec<_>>());
        assert!(retained_bytes(&numbers) >= 10_000 * size_of::<serde_json::Value>(), "{}", retained_bytes(&numbers));
        // Separators inside strings are text, not values.
        let quoted = json!({"a": "[{,:\\\"]}"});
        assert_eq!(retained_bytes(&quoted), text(&quoted) + 3 * (size_of::<serde_json::Value>() + 16));
    }

    #[test]
    fn h12_retention_outcomes_past_their_age_go_when_another_completes() {
        let retention = ReplayRetention { max_age: Duration::from_secs(60), ..ReplayRetention::default() };
        let mut table: ReplayTable<&str, &str> = ReplayTable::new(retention);
        let now = Instant::now();
        table.start(key(0), "{}", "running");
        table.complete(&key(0), "done", 10, now);
        table.start(key(1), "{}", "running");
        table.complete(&key(1), "done", 10, now + Duration::from_secs(120));
        assert_eq!(table.len(), 1, "the first, past its age, went without a lookup");
    }
}
