//! A record document: a sequence saved with [`WorldStore::save_records`](super::WorldStore::save_records), encoded
//! in runs on several threads and written in order while later runs are still being encoded.
//!
//! The bytes are exactly what the codec writes for the whole `Vec` (postcard: the length, then each element;
//! JSON: `[`, the elements separated by `,`, `]`), so the document loads as a `Vec<T>` like any other and a game
//! can move between `save` and `save_records` freely.

use std::io::Write;
use std::panic::AssertUnwindSafe;

use parking_lot::{Condvar, Mutex};

use serde::ser::SerializeTuple;
use serde::{Serialize, Serializer};

use super::codec::{Codec, EncodeError};
use crate::runtime::WorkerPriority;

/// Records per encoding thread below which a document is encoded on the calling thread alone: starting threads
/// would cost more than they save.
const MIN_RECORDS_PER_THREAD: usize = 4096;
/// Runs per encoding thread: enough that the first runs are written while the others are encoded, few enough
/// that each is worth a hand-off.
const RUNS_PER_THREAD: usize = 8;
/// Runs per encoding thread that may be encoded beyond the last one written.
const AHEAD_PER_THREAD: usize = 2;
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
/// write can wait for the disk, and encoding there would stall with it. At most [`AHEAD_PER_THREAD`] runs per
/// thread are encoded beyond the last one written, so a slow disk holds memory for a few runs, not the document.
///
/// The first failure in the document's order is the outcome, as with `save`: a record's encoding error, a failed
/// write, or a record's panic (resumed here once the threads have stopped). Any failure stops the encoding threads
/// before their next run.
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
    let claims = Claims::new(runs.len(), threads * AHEAD_PER_THREAD);
    let priority = WorkerPriority::of_this_thread();
    let (encoded, finished) = crossbeam_channel::unbounded::<(usize, Encoded)>();
    let written = std::thread::scope(|scope| {
        // Stops the encoding threads however this closure ends (the scope waits for them).
        let _stop = StopOnDrop(&claims);
        let started = (0..threads)
            .filter(|_| {
                let (encoded, claims, runs) = (encoded.clone(), &claims, &runs);
                let thread = std::thread::Builder::new().name("agent-tools-save".to_string());
                let spawned = thread.spawn_scoped(scope, move || {
                    // Threads start at the creator's priority on Linux only: set it everywhere.
                    priority.apply_to_this_thread();
                    // Runs are alike: each is given room for about as much as the one before.
                    let mut room = 0;
                    while let Some(run) = claims.claim() {
                        let bytes = encode_caught(codec, runs[run], run * per_run, room);
                        match &bytes {
                            Ok(bytes) => room = bytes.len() + bytes.len() / 8,
                            Err(_) => claims.stop(),
                        }
                        // The receiver outlives this scope: a send cannot fail.
                        let _ = encoded.send((run, bytes));
                    }
                });
                spawned.is_ok()
            })
            .count();
        drop(encoded);
        match started {
            // No thread could be started (the process is out of them): this one encodes the runs in turn.
            0 => encode_in_turn(codec, &runs, out),
            _ => write_in_order(codec, &claims, &finished, out),
        }
    });
    match written {
        Ok(()) => close(codec, out),
        Err(Failed::Encode(error)) => Err(error),
        Err(Failed::Panic(payload)) => std::panic::resume_unwind(payload),
    }
}

/// A run's bytes, or why it has none.
type Encoded = Result<Vec<u8>, Failed>;

/// Why a run has no bytes: the codec's error, or a record's `Serialize` panicked (with its payload).
enum Failed {
    Encode(EncodeError),
    Panic(Box<dyn std::any::Any + Send>),
}

/// Encodes a run (whose first record is record `first`) into a buffer with room for `room` bytes, catching a
/// panic of a record's `Serialize` so that it fails the run, not the encoding thread.
fn encode_caught<T: Serialize>(codec: Codec, run: &[T], first: usize, room: usize) -> Encoded {
    match std::panic::catch_unwind(AssertUnwindSafe(|| encode_run(codec, run, first, room))) {
        Ok(bytes) => bytes.map_err(Failed::Encode),
        Err(payload) => Err(Failed::Panic(payload)),
    }
}

/// The calling thread's part: write every run in order as the encoding threads finish them.
fn write_in_order(
    codec: Codec,
    claims: &Claims,
    finished: &crossbeam_channel::Receiver<(usize, Encoded)>,
    out: &mut impl Write,
) -> Result<(), Failed> {
    let mut ready: Vec<Option<Encoded>> = (0..claims.runs).map(|_| None).collect();
    let mut next = 0;
    while next < claims.runs {
        // Each encoding thread sends every run it claims, and claims go in order, so the run to write next comes.
        let Ok((run, bytes)) = finished.recv() else {
            let stopped = "a thread encoding the records stopped before its run";
            return Err(Failed::Encode(EncodeError::Codec(stopped.to_string())));
        };
        ready[run] = Some(bytes);
        while let Some(bytes) = ready.get_mut(next).and_then(Option::take) {
            write_run(codec, next, bytes?, out).map_err(Failed::Encode)?;
            next += 1;
            claims.written(next);
        }
    }
    Ok(())
}

/// Encodes and writes every run on the calling thread, in order.
fn encode_in_turn<T: Serialize>(codec: Codec, runs: &[&[T]], out: &mut impl Write) -> Result<(), Failed> {
    runs.iter().enumerate().try_for_each(|(index, run)| {
        let bytes = encode_run(codec, run, index * runs[0].len(), 0).map_err(Failed::Encode)?;
        write_run(codec, index, bytes, out).map_err(Failed::Encode)
    })
}

/// Writes run number `index`, after the separator that precedes it.
fn write_run(codec: Codec, index: usize, bytes: Vec<u8>, out: &mut impl Write) -> Result<(), EncodeError> {
    if index > 0 && codec == Codec::Json {
        out.write_all(b",").map_err(EncodeError::Io)?;
    }
    out.write_all(&bytes).map_err(EncodeError::Io)
}

/// Which run is next to encode, how many are written, and whether to stop. A run may be claimed only within
/// `ahead` runs of the last one written: the encoding threads wait for the writer there.
struct Claims {
    runs: usize,
    ahead: usize,
    state: Mutex<ClaimState>,
    changed: Condvar,
}

#[derive(Debug, PartialEq)]
enum Claim {
    Run(usize),
    /// Every run within reach of the writer is claimed.
    Wait,
    Done,
}

struct ClaimState {
    next: usize,
    written: usize,
    stopped: bool,
}

impl Claims {
    fn new(runs: usize, ahead: usize) -> Self {
        let state = Mutex::new(ClaimState { next: 0, written: 0, stopped: false });
        Self { runs, ahead: ahead.max(1), state, changed: Condvar::new() }
    }

    /// The next run to encode, once it is within reach of the writer; `None` when there is none or on a stop.
    fn claim(&self) -> Option<usize> {
        let mut state = self.state.lock();
        loop {
            match self.try_claim(&mut state) {
                Claim::Run(run) => return Some(run),
                Claim::Wait => self.changed.wait(&mut state),
                Claim::Done => return None,
            }
        }
    }

    fn try_claim(&self, state: &mut ClaimState) -> Claim {
        if state.stopped || state.next >= self.runs {
            Claim::Done
        } else if state.next < state.written + self.ahead {
            state.next += 1;
            Claim::Run(state.next - 1)
        } else {
            Claim::Wait
        }
    }

    /// `count` runs are written.
    fn written(&self, count: usize) {
        self.state.lock().written = count;
        self.changed.notify_all();
    }

    fn stop(&self) {
        self.state.lock().stopped = true;
        self.changed.notify_all();
    }
}

/// Stops the claims when dropped.
struct StopOnDrop<'a>(&'a Claims);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop();
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
/// tuple has no length), JSON a comma. `first` is the run's first record (a JSON error names the field by its path
/// in the whole document). `room`: the bytes to allocate up front.
fn encode_run<T: Serialize>(codec: Codec, run: &[T], first: usize, room: usize) -> Result<Vec<u8>, EncodeError> {
    match codec {
        Codec::Json => {
            let mut bytes = Vec::with_capacity(room);
            for (i, record) in run.iter().enumerate() {
                if i > 0 {
                    bytes.push(b',');
                }
                super::finite::element_to_writer(&mut bytes, record, first + i)
                    .map_err(|error| EncodeError::Codec(error.to_string()))?;
            }
            Ok(bytes)
        }
        Codec::Postcard => super::codec::postcard_to_vec(&Elements(run), room),
    }
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
mod tests;
