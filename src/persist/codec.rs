//! [`Codec`]: how a document's payload is encoded inside its envelope, chosen per store handle and recorded in
//! every file it writes.

use std::io::{self, Write};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// How a [`WorldStore`](super::WorldStore) encodes the documents it saves. Chosen with
/// [`WorldStore::with_codec`](super::WorldStore::with_codec) or
/// [`WorldStorePlugin::codec`](super::WorldStorePlugin::codec); [`Json`](Codec::Json) unless you choose.
///
/// The choice applies to **writing** only. Every file's envelope names the codec that wrote it, and a load always
/// decodes with that one, so switching a game from JSON to postcard keeps every existing save loadable: each
/// document is read as JSON until its next save rewrites it as postcard (and its previous save, kept for a damaged
/// primary to fall back to, may be in either). Switching back works the same way. Saves written before codecs
/// existed have no codec in their header and are JSON. The checksum, the atomic replace and the fallback to the
/// previous save are the same for both.
///
/// | | [`Json`](Codec::Json) (default) | [`Postcard`](Codec::Postcard) |
/// | --- | --- | --- |
/// | saves | readable and diffable (an edit by hand breaks the header's checksum: the save then counts as damaged and the previous one loads) | binary: a quarter of JSON's size for the bench's records |
/// | speed | ~36 ms to encode 190,000 small records (BENCHMARKS.md) | ~5 ms for the same, and fewer bytes to write |
/// | serde | everything `serde_json` supports; a float that is NaN or infinite is refused (the save fails with `StoreError::Encode` naming its field, and the previous save stays; JSON would hold it only as `null`, which loads back into no float): keep saved floats finite, or save them with postcard | no self-describing features (below); floats as they are, NaN included |
/// | schema changes | fields can be added with `#[serde(default)]` | any change to the field list or order breaks old saves |
///
/// # What postcard cannot do
///
/// Postcard is not self-describing: a file holds values in declaration order with no field names or type tags,
/// and the reader must know the exact type. So, for a document saved with postcard:
///
/// - `#[serde(untagged)]`, `#[serde(flatten)]`, internally tagged enums (`#[serde(tag = "...")]`),
///   `serde_json::Value` and anything else that calls `deserialize_any` **fail to load** (they save without
///   complaint: the error only shows on the load, as [`StoreError::Decode`](super::StoreError::Decode));
/// - `#[serde(skip_serializing_if = ...)]` shifts every later field: the load fails or, worse, misreads;
/// - a sequence must know its length up front (`serialize_seq(None)` fails the save with
///   [`StoreError::Encode`](super::StoreError::Encode));
/// - adding, removing or reordering fields of a saved type makes older saves of that type undecodable (no
///   `#[serde(default)]` rescue): version your document (for example an enum with one variant per version, or a
///   new document name) when its type changes;
/// - its errors are terse (`"Hit the end of buffer, expected more data"`), without the serializer's own message;
/// - a load stops at 256 levels of nesting (a struct, a tuple, a sequence, a map, an enum, a `Some` and a newtype
///   are a level each; JSON's reader stops at 128 arrays or objects, so a recursive type through
///   `Option<Box<_>>` nests about 128 deep in either): deeper, it fails with
///   [`StoreError::Decode`](super::StoreError::Decode) ("nests deeper than 256 levels") rather than overflowing
///   the loading thread's stack, which would abort the game every time the world is entered (a recursive type, a
///   tree of nodes, from a save someone crafted). A JSON save refuses a document deeper than JSON loads back
///   ([`StoreError::Encode`](super::StoreError::Encode), and the previous save stays the one that loads); a
///   postcard save does not check: keep a recursive saved type's depth under the limit;
///
/// Round-trip a document type through the store in a test before you switch it.
///
/// # Bulk state
///
/// With either codec, a save's time on a fast disk is mostly the encoder walking every field of every record
/// (postcard ~25 ns per small record: 190,000 records take ~5 ms, where writing their 2.6 MB takes ~3 ms). Two ways
/// to spend less, both with the same envelope, checksum and fallback:
///
/// - Save the records as a sequence of their own with [`WorldStore::save_records`](super::WorldStore::save_records):
///   runs of them are encoded on every core (up to four) and written in order as they finish. The same bytes as
///   `save` of the `Vec`, so nothing else changes; on two cores a 190,000-record save took 18–43% less time with
///   JSON, while with postcard (already fast to encode) the gain was within the machine's noise (BENCHMARKS.md,
///   `records`).
/// - Keep or write the records in the game's own fixed-size layout and serialize that as one byte string
///   (`serialize_bytes`, e.g. with `#[serde(serialize_with)]` or `serde_bytes`): postcard then copies the bytes
///   behind a length, and the save costs about the write (BENCHMARKS.md, `packed`). The layout is the game's to
///   version.
///
/// Why postcard: it is maintained, serde-based (the same `Serialize`/`Deserialize` derives as JSON, so switching
/// is one line), compact (varints, no names) and has a stable, documented wire format (1.0 spec). MessagePack
/// with field names (`rmp-serde`) keeps some schema tolerance but measured ~2.6× postcard's encoding time here;
/// bincode's maintenance has stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Codec {
    /// JSON (`serde_json`): readable saves, any serde type. The default, and what every save written before
    /// codecs existed is.
    #[default]
    Json,
    /// [postcard](https://docs.rs/postcard) 1.x: compact binary, much faster to encode; not self-describing (see
    /// the type's docs for what that rules out).
    Postcard,
}

impl Codec {
    /// The name written in the envelope's header (`codec=NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Codec::Json => "json",
            Codec::Postcard => "postcard",
        }
    }

    /// The codec an envelope names, if this build knows it.
    pub(crate) fn from_name(name: &str) -> Option<Codec> {
        [Codec::Json, Codec::Postcard].into_iter().find(|codec| codec.name() == name)
    }

    /// Encodes `value` into `out` as it goes (no whole-document buffer).
    pub(crate) fn encode<T: Serialize + ?Sized>(self, value: &T, out: impl Write) -> Result<(), EncodeError> {
        match self {
            Codec::Json => super::finite::to_writer(out, value).map_err(|error| match error.io_error_kind() {
                // `From` hands back the writer's own error.
                Some(_) => EncodeError::Io(io::Error::from(error)),
                None => EncodeError::Codec(error.to_string()),
            }),
            Codec::Postcard => {
                // postcard reports any write failure as "buffer full": keep the writer's own error instead.
                let mut failed = None;
                let chunks = Chunks { out, chunk: vec![0; CHUNK].into_boxed_slice(), len: 0, failed: &mut failed };
                let encoded = postcard::serialize_with_flavor(value, chunks);
                // A failed write fails the save even if a hand-written `Serialize` ignored the error it got.
                if let Some(io) = failed {
                    return Err(EncodeError::Io(io));
                }
                encoded.map_err(|error| EncodeError::Codec(format!("postcard: {error}")))
            }
        }
    }

    /// Decodes a whole payload: trailing bytes are an error, not ignored.
    pub(crate) fn decode<T: DeserializeOwned>(self, payload: &[u8]) -> Result<T, String> {
        match self {
            Codec::Json => serde_json::from_slice(payload).map_err(|error| error.to_string()),
            Codec::Postcard => {
                // postcard has no nesting limit of its own (serde_json stops at 128 levels).
                let mut deserializer = postcard::Deserializer::from_bytes(payload);
                let value =
                    super::depth::deserialize(&mut deserializer).map_err(|error| format!("postcard: {error}"))?;
                match deserializer.finalize() {
                    Ok([]) => Ok(value),
                    Ok(rest) => Err(format!("postcard: {} bytes left over after the document", rest.len())),
                    Err(error) => Err(format!("postcard: {error}")),
                }
            }
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why encoding a document failed: the file (reported as I/O) or the snapshot itself (reported as `Encode`).
#[derive(Debug)]
pub(crate) enum EncodeError {
    Io(io::Error),
    Codec(String),
}

/// Bytes postcard gathers before each write: the store's own buffer passes a write this size straight through.
const CHUNK: usize = 256 * 1024;

/// postcard's output, gathered into chunks for `out`. postcard hands its output a few bytes at a time (each
/// varint, each field), and through `postcard::to_io` every piece is a `write_all` and a `memcpy` call: about a
/// quarter of the encoding time for small records (BENCHMARKS.md). Short pieces are copied here byte by byte.
/// The first write error is kept in `failed` (postcard itself only says "buffer full").
struct Chunks<'a, W: Write> {
    out: W,
    chunk: Box<[u8]>,
    len: usize,
    failed: &'a mut Option<io::Error>,
}

impl<W: Write> Chunks<'_, W> {
    #[cold]
    fn write_out(&mut self, bytes: Option<&[u8]>) -> postcard::Result<()> {
        if self.failed.is_some() {
            // Nothing more after a failed write: the file would have a gap.
            self.len = 0;
            return Err(postcard::Error::SerializeBufferFull);
        }
        let written = self.out.write_all(&self.chunk[..self.len]).and_then(|()| match bytes {
            Some(bytes) => self.out.write_all(bytes),
            None => Ok(()),
        });
        self.len = 0;
        written.map_err(|error| {
            self.failed.get_or_insert(error);
            postcard::Error::SerializeBufferFull
        })
    }
}

impl<W: Write> postcard::ser_flavors::Flavor for Chunks<'_, W> {
    type Output = ();

    #[inline]
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        if self.len == self.chunk.len() {
            self.write_out(None)?;
        }
        self.chunk[self.len] = byte;
        self.len += 1;
        Ok(())
    }

    #[inline]
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        let end = self.len + bytes.len();
        if end > self.chunk.len() {
            return self.write_out(Some(bytes));
        }
        let room = &mut self.chunk[self.len..end];
        if bytes.len() <= 16 {
            // A varint or a short name: a loop the compiler unrolls beats a `memcpy` call.
            for (to, from) in room.iter_mut().zip(bytes) {
                *to = *from;
            }
        } else {
            room.copy_from_slice(bytes);
        }
        self.len = end;
        Ok(())
    }

    fn finalize(mut self) -> postcard::Result<()> {
        self.write_out(None)?;
        // `write_out` refuses after a failure, so this flush only follows complete writes.
        self.out.flush().map_err(|error| {
            self.failed.get_or_insert(error);
            postcard::Error::SerializeBufferFull
        })
    }
}

/// `value` in postcard, in memory (a run of [`save_records`](super::WorldStore::save_records)), in a buffer
/// allocated with `room` bytes: straight into it, as postcard's output is a few bytes at a time, and gathering them
/// in a chunk first, as [`Codec::encode`] does for a file, would copy every byte once more.
pub(crate) fn postcard_to_vec<T: Serialize + ?Sized>(value: &T, room: usize) -> Result<Vec<u8>, EncodeError> {
    postcard::serialize_with_flavor(value, InMemory(Vec::with_capacity(room)))
        .map_err(|error| EncodeError::Codec(format!("postcard: {error}")))
}

/// postcard's output appended to a vector (`postcard::ser_flavors::StdVec` makes every piece an
/// `extend_from_slice`, a `memcpy` call for a byte or two).
struct InMemory(Vec<u8>);

impl postcard::ser_flavors::Flavor for InMemory {
    type Output = Vec<u8>;

    #[inline]
    fn try_push(&mut self, byte: u8) -> postcard::Result<()> {
        self.0.push(byte);
        Ok(())
    }

    #[inline]
    fn try_extend(&mut self, bytes: &[u8]) -> postcard::Result<()> {
        if bytes.len() <= 16 && self.0.capacity() - self.0.len() >= bytes.len() {
            // A varint or a short name: a loop the compiler unrolls beats a `memcpy` call.
            for byte in bytes {
                self.0.push(*byte);
            }
        } else {
            self.0.extend_from_slice(bytes);
        }
        Ok(())
    }

    fn finalize(self) -> postcard::Result<Vec<u8>> {
        Ok(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Cell {
        x: i32,
        block: String,
        tags: Vec<u8>,
    }

    #[test]
    fn both_codecs_round_trip_and_name_themselves() {
        let cell = Cell { x: -5, block: "stone".into(), tags: vec![1, 2] };
        for codec in [Codec::Json, Codec::Postcard] {
            let mut bytes = Vec::new();
            codec.encode(&cell, &mut bytes).unwrap();
            assert_eq!(codec.decode::<Cell>(&bytes).unwrap(), cell, "{codec}");
            assert_eq!(Codec::from_name(codec.name()), Some(codec));
        }
        assert_eq!(Codec::from_name("cbor"), None);
        assert_eq!(Codec::default(), Codec::Json);
    }

    #[test]
    fn postcard_through_chunks_writes_exactly_postcards_own_bytes() {
        // Many small pieces across several chunk boundaries, and pieces longer than a chunk and than 16 bytes.
        let cells: Vec<Cell> = (0..60_000)
            .map(|i| Cell { x: i - 30_000, block: ["stone", "oak_log"][i as usize % 2].into(), tags: vec![i as u8; 3] })
            .collect();
        let long = "x".repeat(CHUNK + 17);
        let document = (cells, long, "a name longer than sixteen bytes".to_string());
        let mut bytes = Vec::new();
        Codec::Postcard.encode(&document, &mut bytes).unwrap();
        assert!(bytes.len() > 3 * CHUNK, "crosses chunks: {}", bytes.len());
        assert_eq!(bytes, postcard::to_stdvec(&document).unwrap(), "the same bytes as postcard's reference encoder");
        for room in [0, 16, bytes.len()] {
            assert_eq!(postcard_to_vec(&document, room).unwrap(), bytes, "the same bytes in memory");
        }
    }

    #[test]
    fn a_write_error_a_careless_serialize_ignores_still_fails_the_save() {
        struct Careless;
        impl Serialize for Careless {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeTuple;
                let mut tuple = serializer.serialize_tuple(2)?;
                let _ = tuple.serialize_element(&"x".repeat(CHUNK + 1)); // drops the write's error
                tuple.serialize_element(&1u8)?;
                tuple.end()
            }
        }
        /// Refuses its first write only: later bytes would land after a gap.
        struct FailsOnce(bool, Vec<u8>);
        impl Write for FailsOnce {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                if !std::mem::replace(&mut self.0, true) {
                    return Err(io::Error::new(io::ErrorKind::StorageFull, "no space left"));
                }
                self.1.extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut out = FailsOnce(false, Vec::new());
        match Codec::Postcard.encode(&Careless, &mut out) {
            Err(EncodeError::Io(error)) => assert_eq!(error.kind(), io::ErrorKind::StorageFull),
            other => panic!("{other:?}"),
        }
        assert!(out.1.is_empty(), "nothing written after the failed write: {} bytes", out.1.len());
    }

    /// A recursive saved type: one byte per level in postcard.
    #[derive(Serialize, Deserialize, Debug)]
    struct Node {
        next: Option<Box<Node>>,
    }

    #[test]
    fn postcard_refuses_a_document_nested_past_128_levels_instead_of_overflowing_the_stack() {
        // A megabyte: a million levels, which overflow any loading thread's stack without the limit (an abort, not an
        // error: the test binary would die).
        let mut deep = vec![1u8; 1_000_000];
        deep.push(0);
        let error = Codec::Postcard.decode::<Node>(&deep).unwrap_err();
        assert!(error.contains("nests deeper than 256 levels"), "{error}");
        // A linked list of 127 nodes reads in both codecs (JSON's reader stops at its 128th object).
        let chain = (0..126).fold(Node { next: None }, |inner, _| Node { next: Some(Box::new(inner)) });
        let mut bytes = Vec::new();
        Codec::Postcard.encode(&chain, &mut bytes).unwrap();
        assert!(Codec::Postcard.decode::<Node>(&bytes).is_ok());
        let json = serde_json::to_vec(&chain).unwrap();
        assert!(Codec::Json.decode::<Node>(&json).is_ok());
        // JSON refuses the same shape by its own limit.
        let json = format!("{}null{}", r#"{"next":"#.repeat(200), "}".repeat(200));
        assert!(Codec::Json.decode::<Node>(json.as_bytes()).is_err());
    }

    #[test]
    fn postcard_rejects_truncated_and_trailing_bytes() {
        let mut bytes = Vec::new();
        Codec::Postcard.encode(&Cell { x: 1, block: "glass".into(), tags: vec![] }, &mut bytes).unwrap();
        assert!(Codec::Postcard.decode::<Cell>(&bytes[..bytes.len() - 2]).is_err());
        bytes.push(0);
        assert!(Codec::Postcard.decode::<Cell>(&bytes).unwrap_err().contains("left over"));
    }

    #[test]
    fn a_write_error_under_postcard_is_the_writers_own() {
        struct Full;
        impl Write for Full {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::Error::new(io::ErrorKind::StorageFull, "no space left"))
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        for codec in [Codec::Json, Codec::Postcard] {
            match codec.encode(&Cell { x: 1, block: "glass".into(), tags: vec![] }, Full) {
                Err(EncodeError::Io(error)) => assert_eq!(error.kind(), io::ErrorKind::StorageFull, "{codec}"),
                other => panic!("{codec}: {other:?}"),
            }
        }
    }
}
