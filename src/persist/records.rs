//! A record document: a sequence saved with [`WorldStore::save_records`](super::WorldStore::save_records), encoded
//! in runs on several threads and written in order while later runs are still being encoded.
//!
//! The bytes are exactly what the codec writes for the whole `Vec` (postcard: the length, then each element;
//! JSON: `[`, the elements separated by `,`, `]`), so the document loads as a `Vec<T>` like any other and a game
//! can move between `save` and `save_records` freely.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use serde::ser::SerializeTuple;
use serde::{Serialize, Serializer};

use super::codec::{Codec, EncodeError};

/// Records per encoding thread below which a document is encoded on the calling thread alone: starting threads
/// would cost more than they save.
const MIN_RECORDS_PER_THREAD: usize = 4096;
/// Runs per encoding thread: enough that the first runs are written while the others are encoded, few enough
/// that each is worth a hand-off.
const RUNS_PER_THREAD: usize = 8;
/// At most this many threads encode one document: a save shares the machine with a running game.
pub(crate) const MAX_THREADS: usize = 4;

/// How many threads encode a document of `records` records (with one, the calling thread does).
pub(crate) fn threads_for(records: usize) -> usize {
    let available = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_THREADS);
    available.min(records / MIN_RECORDS_PER_THREAD).max(1)
}

/// Encodes `records` in `codec` into `out`. With one thread, the calling thread encodes them straight into `out`.
/// With more, `threads` threads claim runs of records in turn and encode each into memory, and the calling thread
/// writes each run to `out` as soon as every run before it is written: it only writes (and checksums), since a
/// write can wait for the disk, and encoding there would stall with it. The first error (a record that does not
/// encode, a failed write) stops the encoding threads before their next run.
pub(crate) fn encode<T: Serialize + Sync>(
    codec: Codec,
    records: &[T],
    threads: usize,
    out: &mut impl Write,
) -> Result<(), EncodeError> {
    if threads <= 1 || records.len() < 2 {
        return codec.encode(records, out);
    }
    open(codec, records.len(), out)?;
    let per_run = records.len().div_ceil(threads * RUNS_PER_THREAD);
    let runs: Vec<&[T]> = records.chunks(per_run).collect();
    let claims = Claims { next: AtomicUsize::new(0), stop: AtomicBool::new(false), runs: runs.len() };
    let (encoded, finished) = crossbeam_channel::unbounded::<(usize, Result<Vec<u8>, EncodeError>)>();
    let written = std::thread::scope(|scope| {
        let started = (0..threads)
            .filter(|_| {
                let (encoded, claims, runs) = (encoded.clone(), &claims, &runs);
                // Named like the runtime's threads they start from (whose priority they inherit).
                let thread = std::thread::Builder::new().name("agent-tools-save".to_string());
                let spawned = thread.spawn_scoped(scope, move || {
                    while let Some(run) = claims.claim() {
                        if encoded.send((run, encode_run(codec, runs[run]))).is_err() {
                            return;
                        }
                    }
                });
                spawned.is_ok()
            })
            .count();
        drop(encoded);
        let written = match started {
            // No thread could be started (the process is out of them): this one encodes the runs in turn.
            0 => encode_in_turn(codec, &runs, out),
            _ => write_in_order(codec, runs.len(), &finished, out),
        };
        // On an error, the encoding threads stop before their next run; the scope waits for their current one.
        claims.stop.store(true, Ordering::Relaxed);
        written
    });
    written?;
    close(codec, out)
}

/// The calling thread's part: write every run in order as the encoding threads finish them.
fn write_in_order(
    codec: Codec,
    runs: usize,
    finished: &crossbeam_channel::Receiver<(usize, Result<Vec<u8>, EncodeError>)>,
    out: &mut impl Write,
) -> Result<(), EncodeError> {
    let mut ready: Vec<Option<Result<Vec<u8>, EncodeError>>> = (0..runs).map(|_| None).collect();
    let mut next = 0;
    while next < runs {
        // Every sender is an encoding thread, which sends each run it claims: none left means one panicked.
        let (run, bytes) = finished
            .recv()
            .map_err(|_| EncodeError::Codec("a thread encoding the records stopped before its run".to_string()))?;
        ready[run] = Some(bytes);
        while let Some(bytes) = ready.get_mut(next).and_then(Option::take) {
            write_run(codec, next, bytes, out)?;
            next += 1;
        }
    }
    Ok(())
}

/// Encodes and writes every run on the calling thread, in order.
fn encode_in_turn<T: Serialize>(codec: Codec, runs: &[&[T]], out: &mut impl Write) -> Result<(), EncodeError> {
    runs.iter().enumerate().try_for_each(|(index, run)| write_run(codec, index, encode_run(codec, run), out))
}

/// Writes run number `index`, after the separator that precedes it.
fn write_run(
    codec: Codec,
    index: usize,
    bytes: Result<Vec<u8>, EncodeError>,
    out: &mut impl Write,
) -> Result<(), EncodeError> {
    if index > 0 && codec == Codec::Json {
        out.write_all(b",").map_err(EncodeError::Io)?;
    }
    out.write_all(&bytes?).map_err(EncodeError::Io)
}

/// Which run is next to encode, and whether to stop.
struct Claims {
    next: AtomicUsize,
    stop: AtomicBool,
    runs: usize,
}

impl Claims {
    fn claim(&self) -> Option<usize> {
        if self.stop.load(Ordering::Relaxed) {
            return None;
        }
        let run = self.next.fetch_add(1, Ordering::Relaxed);
        (run < self.runs).then_some(run)
    }
}

/// What the codec writes for a sequence before its elements.
fn open(codec: Codec, len: usize, out: &mut impl Write) -> Result<(), EncodeError> {
    match codec {
        Codec::Json => out.write_all(b"[").map_err(EncodeError::Io),
        // A sequence's length is a varint of the `usize`, the same bytes as a `usize` value.
        Codec::Postcard => codec.encode(&len, out),
    }
}

/// What the codec writes for a sequence after its elements.
fn close(codec: Codec, out: &mut impl Write) -> Result<(), EncodeError> {
    match codec {
        Codec::Json => out.write_all(b"]").map_err(EncodeError::Io),
        Codec::Postcard => Ok(()),
    }
}

/// One run's elements as the codec writes them inside a sequence: postcard puts nothing between elements (and a
/// tuple has no length), JSON a comma.
fn encode_run<T: Serialize>(codec: Codec, run: &[T]) -> Result<Vec<u8>, EncodeError> {
    let mut bytes = Vec::new();
    match codec {
        Codec::Json => {
            for (i, record) in run.iter().enumerate() {
                if i > 0 {
                    bytes.push(b',');
                }
                serde_json::to_writer(&mut bytes, record).map_err(|error| EncodeError::Codec(error.to_string()))?;
            }
        }
        Codec::Postcard => codec.encode(&Elements(run), &mut bytes)?,
    }
    Ok(bytes)
}

/// A run's elements one after another, with no length before them (a tuple, in postcard).
struct Elements<'a, T>(&'a [T]);

impl<T: Serialize> Serialize for Elements<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut tuple = serializer.serialize_tuple(self.0.len())?;
        for record in self.0 {
            tuple.serialize_element(record)?;
        }
        tuple.end()
    }
}

#[cfg(test)]
mod tests {
    use std::io;

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
            encode_in_turn(codec, &runs, &mut bytes).unwrap();
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
            match encode(codec, &records, 4, &mut out) {
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
            match encode(codec, &records, 4, &mut out) {
                Err(EncodeError::Io(error)) => assert_eq!(error.kind(), io::ErrorKind::StorageFull, "{codec}"),
                other => panic!("{codec}: {other:?}"),
            }
            assert!(whole(codec, &records).starts_with(&out.written), "{codec}: only whole runs, in order");
        }
    }
}
