//! The envelope around every document: one header line with the payload's length and CRC-32, then the payload
//! (JSON). A torn or corrupted file fails the check instead of loading half a world. The numbers are zero-padded
//! to a fixed width, so the payload can be streamed to the file before its header is known.
//!
//! ```text
//! bevy-agent-tools-document v1 len=00000000000000001234 crc32=89abcdef
//! {"...": "..."}
//! ```

use std::io::{self, Write};

const MAGIC: &str = "bevy-agent-tools-document v1";

/// The header's size in bytes. Fixed (zero-padded numbers) so a writer can reserve it, stream the payload after
/// it, then fill it in; the reader accepts any width.
pub(crate) const HEADER_LEN: usize = MAGIC.len() + " len=".len() + 20 + " crc32=".len() + 8 + 1;

/// The header line for a payload of `len` bytes with CRC-32 `crc`, newline included: [`HEADER_LEN`] bytes.
pub(crate) fn header(len: u64, crc: u32) -> Vec<u8> {
    format!("{MAGIC} len={len:020} crc32={crc:08x}\n").into_bytes()
}

/// Passes a payload through to `W`, counting it and computing its CRC-32 on the way: the header of a streamed
/// payload, without a second pass over it.
pub(crate) struct PayloadWriter<W> {
    inner: W,
    len: u64,
    crc: crc32fast::Hasher,
}

impl<W: Write> PayloadWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        Self { inner, len: 0, crc: crc32fast::Hasher::new() }
    }

    /// Flushes what is buffered and returns the payload's header.
    pub(crate) fn finish(mut self) -> io::Result<Vec<u8>> {
        self.inner.flush()?;
        Ok(header(self.len, self.crc.finalize()))
    }
}

impl<W: Write> Write for PayloadWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.crc.update(&buf[..written]);
        self.len += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The payload of an intact file, or what is wrong with it.
pub(crate) fn open(file: &[u8]) -> Result<&[u8], String> {
    let Some(newline) = file.iter().position(|&b| b == b'\n') else {
        return Err(if file.is_empty() { "the file is empty".into() } else { "the header is incomplete".into() });
    };
    let header = std::str::from_utf8(&file[..newline]).map_err(|_| "the header is not text".to_string())?;
    let payload = &file[newline + 1..];
    let fields = header.strip_prefix(MAGIC).ok_or_else(|| format!("unknown header {header:?}"))?;
    let mut len = None;
    let mut crc = None;
    for field in fields.split_whitespace() {
        if let Some(value) = field.strip_prefix("len=") {
            len = value.parse::<usize>().ok();
        } else if let Some(value) = field.strip_prefix("crc32=") {
            crc = u32::from_str_radix(value, 16).ok();
        }
    }
    let (Some(len), Some(crc)) = (len, crc) else { return Err(format!("malformed header {header:?}")) };
    if payload.len() != len {
        return Err(format!("torn: {} of {len} payload bytes", payload.len()));
    }
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch".into());
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wrap(payload: &[u8]) -> Vec<u8> {
        let mut writer = PayloadWriter::new(Vec::new());
        writer.write_all(payload).expect("writing to a Vec");
        let mut file = writer.finish().expect("flushing a Vec");
        assert_eq!(file.len(), HEADER_LEN);
        file.extend_from_slice(payload);
        file
    }

    #[test]
    fn headers_written_before_the_fixed_width_still_open() {
        let payload = br#"{"counter":7}"#;
        let mut file = format!("{MAGIC} len={} crc32={:08x}\n", payload.len(), crc32fast::hash(payload)).into_bytes();
        file.extend_from_slice(payload);
        assert_eq!(open(&file), Ok(&payload[..]));
    }

    #[test]
    fn an_intact_file_opens_and_any_damage_is_detected() {
        let file = wrap(br#"{"counter":7}"#);
        assert_eq!(open(&file), Ok(&br#"{"counter":7}"#[..]));
        assert!(open(&file[..file.len() - 1]).unwrap_err().starts_with("torn"));
        let mut flipped = file.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 1;
        assert_eq!(open(&flipped), Err("checksum mismatch".to_string()));
        assert!(open(b"").is_err());
        assert!(open(&file[..10]).is_err());
    }
}
