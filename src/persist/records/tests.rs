//! Tests of record documents: the bytes, the threads, the failures.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use serde::Deserialize;

use super::*;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Block {
    x: i32,
    kind: String,
    tags: Vec<u8>,
    note: Option<String>,
}

fn blocks(n: usize) -> Vec<Block> {
    (0..n)
        .map(|i| Block {
            x: i as i32 - 5_000,
            kind: ["stone", "oak_log", "\"quoted\"\n"][i % 3].to_string(),
            tags: vec![i as u8; i % 4],
            note: (i % 5 == 0).then(|| format!("n{i}")),
        })
        .collect()
}

/// What `save` writes for the same `Vec`.
fn whole<T: Serialize>(codec: Codec, records: &[T]) -> Vec<u8> {
    let mut bytes = Vec::new();
    codec.encode(records, &mut bytes).unwrap();
    bytes
}

fn in_runs<T: Serialize + Sync>(codec: Codec, records: &[T], threads: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode(codec, records, threads, &mut bytes).unwrap();
    bytes
}

#[test]
fn records_encoded_in_parallel_runs_are_exactly_the_whole_vecs_bytes() {
    for codec in [Codec::Json, Codec::Postcard] {
        for n in [0, 1, 2, 7, 100, 4_096, 30_001] {
            let records = blocks(n);
            for threads in [1, 2, 3, 4] {
                let bytes = in_runs(codec, &records, threads);
                assert!(bytes == whole(codec, &records), "{codec}, {n} records, {threads} threads");
                assert_eq!(codec.decode::<Vec<Block>>(&bytes).unwrap(), records, "{codec}, {n}, {threads}");
            }
        }
    }
}

#[test]
fn without_encoding_threads_the_runs_are_encoded_in_turn_into_the_same_bytes() {
    for codec in [Codec::Json, Codec::Postcard] {
        let records = blocks(1_000);
        let runs: Vec<&[Block]> = records.chunks(77).collect();
        let mut bytes = Vec::new();
        open(codec, records.len(), &mut bytes).unwrap();
        assert!(encode_in_turn(codec, &runs, &mut bytes).is_ok());
        close(codec, &mut bytes).unwrap();
        assert!(bytes == whole(codec, &records), "{codec}");
    }
}

#[test]
fn a_large_document_uses_a_thread_per_core_and_a_small_one_only_one() {
    assert_eq!(threads_for(0), 1);
    assert_eq!(threads_for(MIN_RECORDS_PER_THREAD * 2 - 1), 1);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert_eq!(threads_for(1_000_000), cores.clamp(1, MAX_THREADS));
}

proptest! {
    #[test]
    fn any_records_in_any_runs_encode_as_the_whole_vec(
        records in prop::collection::vec((any::<i64>(), ".{0,12}", any::<Option<u16>>()), 0..300),
        threads in 1usize..5,
    ) {
        for codec in [Codec::Json, Codec::Postcard] {
            prop_assert_eq!(in_runs(codec, &records, threads), whole(codec, &records));
        }
    }
}

/// Encodes as a number, except the record `fails_at`, which refuses to encode.
struct Refuses {
    value: u32,
    fails_at: u32,
}

impl Serialize for Refuses {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if self.value == self.fails_at {
            return Err(serde::ser::Error::custom(format!("record {} cannot be encoded", self.value)));
        }
        serializer.serialize_u32(self.value)
    }
}

#[test]
fn a_record_that_fails_in_a_later_run_fails_the_encoding_with_its_own_message() {
    for codec in [Codec::Json, Codec::Postcard] {
        let records: Vec<Refuses> = (0..50_000).map(|value| Refuses { value, fails_at: 41_234 }).collect();
        let mut out = Vec::new();
        let Err(EncodeError::Codec(whole_message)) = codec.encode(&records, &mut Vec::new()) else {
            panic!("{codec}: `save` fails too")
        };
        let (outcome, out) = within(move || (encode(codec, &records, 4, &mut out), out));
        match outcome {
            Err(EncodeError::Codec(message)) => assert_eq!(message, whole_message, "{codec}: `save`'s error"),
            Err(EncodeError::Io(error)) => panic!("{codec}: {error}"),
            Ok(()) => panic!("{codec}: the failing record was encoded"),
        }
        if codec == Codec::Json {
            assert!(whole_message.contains("record 41234 cannot be encoded"), "{whole_message}");
        }
        // What was written is the start of the document, in order, and ends before the failing record.
        let fine: Vec<Refuses> = (0..50_000).map(|value| Refuses { value, fails_at: u32::MAX }).collect();
        assert!(whole(codec, &fine).starts_with(&out), "{codec}: runs are written in order");
        // (Both lengths are 3-byte varints in postcard; JSON's `]` is the one byte more.)
        let before_the_failing_one = whole(codec, &fine[..41_234]).len();
        assert!(out.len() <= before_the_failing_one, "{codec}: nothing from the failing record on was written");
    }
}

/// Takes `room` bytes, then fails every write.
struct Full {
    room: usize,
    written: Vec<u8>,
}

impl Write for Full {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.written.len() + buf.len() > self.room {
            return Err(io::Error::new(io::ErrorKind::StorageFull, "no space left"));
        }
        self.written.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_failed_write_is_the_writers_own_error_and_only_whole_runs_in_order_were_written() {
    for codec in [Codec::Json, Codec::Postcard] {
        let records = blocks(60_000);
        let mut out = Full { room: 64 * 1024, written: Vec::new() };
        let (outcome, records, out) = within(move || (encode(codec, &records, 4, &mut out), records, out));
        match outcome {
            Err(EncodeError::Io(error)) => assert_eq!(error.kind(), io::ErrorKind::StorageFull, "{codec}"),
            other => panic!("{codec}: {other:?}"),
        }
        assert!(whole(codec, &records).starts_with(&out.written), "{codec}: only whole runs, in order");
    }
}

/// Runs `work` on its own thread: a hang fails the test instead of stopping it.
fn within<R: Send + 'static>(work: impl FnOnce() -> R + Send + 'static) -> R {
    let (done, outcome) = crossbeam_channel::bounded(1);
    std::thread::spawn(move || {
        let _ = done.send(work());
    });
    outcome.recv_timeout(std::time::Duration::from_secs(20)).expect("the encoding hung")
}

/// Encodes as a number, counting how many were encoded; `fails_at` returns an error, `panics_at` panics.
struct Counted {
    value: u32,
    fails_at: u32,
    panics_at: u32,
    count: Arc<AtomicUsize>,
}

impl Serialize for Counted {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.count.fetch_add(1, Ordering::Relaxed);
        assert_ne!(self.value, self.panics_at, "record {} panics", self.value);
        if self.value == self.fails_at {
            return Err(serde::ser::Error::custom(format!("record {} cannot be encoded", self.value)));
        }
        serializer.serialize_u32(self.value)
    }
}

fn counted(n: u32, fails_at: u32, panics_at: u32) -> (Vec<Counted>, Arc<AtomicUsize>) {
    let count = Arc::default();
    let records = (0..n).map(|value| Counted { value, fails_at, panics_at, count: Arc::clone(&count) }).collect();
    (records, count)
}

#[test]
fn a_record_that_panics_fails_the_encoding_with_its_own_panic_once_the_threads_stop() {
    let outcome = within(|| {
        let (records, _) = counted(60_000, u32::MAX, 41_234);
        std::panic::catch_unwind(AssertUnwindSafe(|| encode(Codec::Postcard, &records, 4, &mut Vec::new())))
    });
    let payload = outcome.expect_err("the record's panic reaches the caller");
    let message = payload.downcast_ref::<String>().map(String::as_str).unwrap_or_default();
    assert!(message.contains("record 41234 panics"), "the record's own panic: {message:?}");
}

#[test]
fn the_first_failure_in_the_documents_order_is_the_outcome_every_time() {
    for round in 0..20 {
        // An error early, a panic late: the error is what `save` would report.
        let outcome = within(|| {
            let (records, _) = counted(60_000, 100, 50_000);
            std::panic::catch_unwind(AssertUnwindSafe(|| encode(Codec::Json, &records, 4, &mut Vec::new())))
        });
        match outcome {
            Ok(Err(EncodeError::Codec(message))) => assert!(message.contains("record 100"), "{round}: {message}"),
            Ok(other) => panic!("{round}: {other:?}"),
            Err(_) => panic!("{round}: the later record's panic was reported instead of the earlier error"),
        }
    }
}

#[test]
fn a_run_is_claimed_only_within_reach_of_the_last_one_written() {
    let claims = Claims::new(10, 3);
    let claim = || claims.try_claim(&mut claims.state.lock());
    assert_eq!([claim(), claim(), claim()], [Claim::Run(0), Claim::Run(1), Claim::Run(2)]);
    assert_eq!(claim(), Claim::Wait, "three runs ahead of the writer, none written");
    claims.written(2);
    assert_eq!([claim(), claim(), claim()], [Claim::Run(3), Claim::Run(4), Claim::Wait]);
    claims.stop();
    assert_eq!(claim(), Claim::Done);
    let claims = Claims::new(2, 3);
    assert_eq!([claims.claim(), claims.claim(), claims.claim()], [Some(0), Some(1), None]);
}

#[test]
fn encoding_stays_within_reach_of_the_writer_and_stops_when_it_fails() {
    // 2 threads: 16 runs of 12,500 records; at most 2 × AHEAD_PER_THREAD runs beyond the last one written.
    let (count, written) = within(|| {
        let (records, count) = counted(200_000, u32::MAX, u32::MAX);
        // Room for the length before the records, not for the first run.
        let mut out = Full { room: 8, written: Vec::new() };
        let outcome = encode(Codec::Postcard, &records, 2, &mut out);
        assert!(matches!(outcome, Err(EncodeError::Io(_))), "{outcome:?}");
        (count.load(Ordering::Relaxed), out.written.len())
    });
    assert_eq!(written, 3, "the length (200,000 is a 3-byte varint), and no run");
    assert!(count >= 12_500, "the first run was encoded: {count}");
    let reach = 2 * AHEAD_PER_THREAD * 12_500;
    assert!(count <= reach, "{count} records encoded with nothing written; at most {reach} may be");
}
