//! The envelope around every document: one header line with the payload's length and CRC-32, then the payload
//! (JSON). A torn or corrupted file fails the check instead of loading half a world.
//!
//! ```text
//! bevy-agent-tools-document v1 len=1234 crc32=89abcdef
//! {"...": "..."}
//! ```

const MAGIC: &str = "bevy-agent-tools-document v1";

/// The header line for `payload`, newline included.
pub(crate) fn header(payload: &[u8]) -> Vec<u8> {
    format!("{MAGIC} len={} crc32={:08x}\n", payload.len(), crc32fast::hash(payload)).into_bytes()
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
        let mut file = header(payload);
        file.extend_from_slice(payload);
        file
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
