//! The envelope around every document: one header line with the payload's length, CRC-32 and [codec](Codec),
//! then the payload. A torn or corrupted file fails the check instead of loading half a world. The numbers are
//! zero-padded to a fixed width, so the payload can be streamed to the file before its header is known.
//!
//! ```text
//! bevy-agent-tools-document v1 len=00000000000000001234 crc32=89abcdef codec=json hcrc=01234567
//! {"...": "..."}
//! ```
//!
//! `crc32` covers the payload; `hcrc` the header's text before it, so a damaged codec name is damage (the previous
//! save is loaded) and not a codec from a newer build (which is refused). A header without `codec=` was written
//! before codecs existed: JSON; one without `hcrc=` before the header was checked: its fields are taken as they
//! are. Older readers skip fields they do not know, so a JSON save written now still loads in a build from before
//! codecs.

use std::io::{self, Write};

use super::codec::Codec;

const MAGIC: &str = "bevy-agent-tools-document v1";
/// The header's last field's name: its value is the CRC-32 of the header's text before the name (the space before it
/// included). One damaged byte fails the check, or (in the name itself) hides the field but leaves every field it
/// covers as written.
const HEADER_CRC: &str = "hcrc=";

/// The header's size in bytes for a payload in `codec`. Fixed (zero-padded numbers) so a writer can reserve it,
/// stream the payload after it, then fill it in; the reader accepts any width.
pub(crate) fn header_len(codec: Codec) -> usize {
    MAGIC.len()
        + " len=".len()
        + 20
        + " crc32=".len()
        + 8
        + " codec=".len()
        + codec.name().len()
        + 1
        + HEADER_CRC.len()
        + 8
        + 1
}

/// The header line for a payload of `len` bytes with CRC-32 `crc` in `codec`, newline included:
/// [`header_len`] bytes.
pub(crate) fn header(len: u64, crc: u32, codec: Codec) -> Vec<u8> {
    let fields = format!("{MAGIC} len={len:020} crc32={crc:08x} codec={codec} ");
    let checked = crc32fast::hash(fields.as_bytes());
    format!("{fields}{HEADER_CRC}{checked:08x}\n").into_bytes()
}

/// Passes a payload through to `W`, counting it and computing its CRC-32 on the way: the header of a streamed
/// payload, without a second pass over it.
///
/// A write that fails fails every later one and [`finish`](Self::finish): a `Serialize` that ignores an error (a
/// disk full midway) and goes on would otherwise leave a gap in the payload that the header, counting what was
/// written, calls intact, and the save would report success and never load.
pub(crate) struct PayloadWriter<W> {
    inner: W,
    codec: Codec,
    len: u64,
    crc: crc32fast::Hasher,
    /// The first write's failure, if one failed.
    failed: Option<(io::ErrorKind, String)>,
}

impl<W: Write> PayloadWriter<W> {
    pub(crate) fn new(inner: W, codec: Codec) -> Self {
        Self { inner, codec, len: 0, crc: crc32fast::Hasher::new(), failed: None }
    }

    /// Flushes what is buffered and returns the payload's header.
    pub(crate) fn finish(mut self) -> io::Result<Vec<u8>> {
        self.check()?;
        self.inner.flush()?;
        Ok(header(self.len, self.crc.finalize(), self.codec))
    }

    /// The first failure again, if a write failed.
    fn check(&self) -> io::Result<()> {
        match &self.failed {
            Some((kind, message)) => Err(io::Error::new(*kind, format!("an earlier write failed: {message}"))),
            None => Ok(()),
        }
    }
}

impl<W: Write> Write for PayloadWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.check()?;
        let written = match self.inner.write(buf) {
            Ok(written) => written,
            // Tried again by `write_all`: nothing was lost.
            Err(error) if error.kind() == io::ErrorKind::Interrupted => return Err(error),
            Err(error) => {
                self.failed = Some((error.kind(), error.to_string()));
                return Err(error);
            }
        };
        self.crc.update(&buf[..written]);
        self.len += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// An intact file's content.
#[derive(Debug, PartialEq)]
pub(crate) struct Opened<'a> {
    /// The codec the header names (`json` if it names none); checked by the reader, not here: a codec this build
    /// does not know is not damage.
    pub codec: &'a str,
    pub payload: &'a [u8],
}

/// The content of an intact file, or what is wrong with it.
pub(crate) fn open(file: &[u8]) -> Result<Opened<'_>, String> {
    let Some(newline) = file.iter().position(|&b| b == b'\n') else {
        return Err(if file.is_empty() { "the file is empty".into() } else { "the header is incomplete".into() });
    };
    let header = std::str::from_utf8(&file[..newline]).map_err(|_| "the header is not text".to_string())?;
    let payload = &file[newline + 1..];
    if let Some((checked, stated)) = header.rsplit_once(HEADER_CRC) {
        let stated = u32::from_str_radix(stated, 16).map_err(|_| format!("malformed header {header:?}"))?;
        if crc32fast::hash(checked.as_bytes()) != stated {
            return Err("header checksum mismatch".into());
        }
    }
    let fields = header.strip_prefix(MAGIC).ok_or_else(|| format!("unknown header {header:?}"))?;
    let mut len = None;
    let mut crc = None;
    let mut codec = Codec::Json.name();
    for field in fields.split_whitespace() {
        if let Some(value) = field.strip_prefix("len=") {
            len = value.parse::<usize>().ok();
        } else if let Some(value) = field.strip_prefix("crc32=") {
            crc = u32::from_str_radix(value, 16).ok();
        } else if let Some(value) = field.strip_prefix("codec=") {
            codec = value;
        }
    }
    let (Some(len), Some(crc)) = (len, crc) else { return Err(format!("malformed header {header:?}")) };
    if payload.len() != len {
        return Err(format!("torn: {} of {len} payload bytes", payload.len()));
    }
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch".into());
    }
    Ok(Opened { codec, payload })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_error_a_careless_serialize_ignores_fails_the_payload_in_either_codec() {
        struct Careless;
        impl serde::Serialize for Careless {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeTuple;
                let mut tuple = serializer.serialize_tuple(2)?;
                let _ = tuple.serialize_element(&"x".repeat(1 << 20)); // drops the write's error
                tuple.serialize_element(&1u8)?;
                tuple.end()
            }
        }
        /// Refuses its first write only: later bytes would land after a gap.
        struct FailsOnce(bool);
        impl Write for FailsOnce {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                match std::mem::replace(&mut self.0, true) {
                    false => Err(io::Error::new(io::ErrorKind::StorageFull, "no space left")),
                    true => Ok(buf.len()),
                }
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        for codec in [Codec::Json, Codec::Postcard] {
            let mut writer = PayloadWriter::new(FailsOnce(false), codec);
            let _ = codec.encode(&Careless, &mut writer);
            let finished = writer.finish();
            assert_eq!(finished.map_err(|error| error.kind()), Err(io::ErrorKind::StorageFull), "{codec}");
        }
    }

    fn wrap(payload: &[u8], codec: Codec) -> Vec<u8> {
        let mut writer = PayloadWriter::new(Vec::new(), codec);
        writer.write_all(payload).expect("writing to a Vec");
        let mut file = writer.finish().expect("flushing a Vec");
        assert_eq!(file.len(), header_len(codec));
        file.extend_from_slice(payload);
        file
    }

    fn json(payload: &[u8]) -> Result<Opened<'_>, String> {
        Ok(Opened { codec: "json", payload })
    }

    #[test]
    fn headers_written_before_the_fixed_width_still_open_as_json() {
        let payload = br#"{"counter":7}"#;
        let mut file = format!("{MAGIC} len={} crc32={:08x}\n", payload.len(), crc32fast::hash(payload)).into_bytes();
        file.extend_from_slice(payload);
        assert_eq!(open(&file), json(payload));
    }

    #[test]
    fn headers_written_before_codecs_still_open_as_json() {
        // Byte for byte what the store wrote before codecs existed (fixed width, no `codec=`).
        let file = b"bevy-agent-tools-document v1 len=00000000000000000013 crc32=6eb4282d\n{\"counter\":7}";
        assert_eq!(crc32fast::hash(br#"{"counter":7}"#), 0x6eb4282d);
        assert_eq!(open(file), json(br#"{"counter":7}"#));
    }

    #[test]
    fn the_header_names_the_codec_and_an_unknown_one_is_not_damage() {
        let file = wrap(&[1, 2, 0xff, b'\n'], Codec::Postcard);
        assert!(file.starts_with(b"bevy-agent-tools-document v1 len=00000000000000000004 crc32="));
        let header = std::str::from_utf8(&file[..header_len(Codec::Postcard)]).unwrap();
        assert!(header.contains(" codec=postcard hcrc=") && header.ends_with('\n'), "{header}");
        assert_eq!(open(&file), Ok(Opened { codec: "postcard", payload: &[1, 2, 0xff, b'\n'] }));

        let payload = b"future";
        let mut file = format!("{MAGIC} len=6 crc32={:08x} codec=cbor\n", crc32fast::hash(payload)).into_bytes();
        file.extend_from_slice(payload);
        assert_eq!(open(&file), Ok(Opened { codec: "cbor", payload }));
    }

    #[test]
    fn every_damaged_header_byte_is_detected_or_changes_nothing_read() {
        for codec in [Codec::Json, Codec::Postcard] {
            let payload = br#"{"counter":7}"#;
            let file = wrap(payload, codec);
            let intact = Ok(Opened { codec: codec.name(), payload: &payload[..] });
            for at in 0..header_len(codec) {
                for bit in 0..8 {
                    let mut damaged = file.clone();
                    damaged[at] ^= 1 << bit;
                    let opened = open(&damaged);
                    // Damage the header's own checksum field's name can hide leaves the fields it covers as written.
                    assert!(opened.is_err() || opened == intact, "byte {at} bit {bit}: {opened:?}");
                }
            }
        }
    }

    #[test]
    fn an_intact_file_opens_and_any_damage_is_detected() {
        for codec in [Codec::Json, Codec::Postcard] {
            let file = wrap(br#"{"counter":7}"#, codec);
            assert_eq!(open(&file), Ok(Opened { codec: codec.name(), payload: &br#"{"counter":7}"#[..] }));
            assert!(open(&file[..file.len() - 1]).unwrap_err().starts_with("torn"));
            let mut flipped = file.clone();
            let last = flipped.len() - 2;
            flipped[last] ^= 1;
            assert_eq!(open(&flipped), Err("checksum mismatch".to_string()));
            assert!(open(b"").is_err());
            assert!(open(&file[..10]).is_err());
        }
    }
}
