//! The sidecar index `seg_{id}.idx`, written when a segment is sealed.
//!
//! Little-endian binary:
//! ```text
//! magic "TSIDX\0\0\x01" | format u32 | segment_size u64 | entry_count u64
//! entry_count × ( offset u64 | length u64 | meta_len u32 | crc32c u32 | key_len u32 | key )
//! crc32c u32 of everything before it
//! ```
//! Boot trusts a sidecar only when its own checksum holds and `segment_size` equals the
//! segment file's size.

use crate::layout::FORMAT_VERSION;

const MAGIC: &[u8; 8] = b"TSIDX\0\0\x01";

/// One entry of a segment, as recorded at write time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SidecarEntry {
    /// Offset of the continuation marker.
    pub offset: u64,
    /// Length from the marker to the end of the body.
    pub length: u64,
    /// Metadata length (flatbuffer plus padding).
    pub meta_len: u32,
    /// crc32c of the body.
    pub crc: u32,
    /// The entry's key.
    pub key: Box<[u8]>,
}

/// Bytes one entry with key `key` takes in a sidecar.
pub(crate) fn entry_len(key: &[u8]) -> u64 {
    ENTRY_FIXED + key.len() as u64
}

/// Bytes of an entry record besides its key: offset, length, meta_len, crc32c, key_len.
const ENTRY_FIXED: u64 = 8 + 8 + 4 + 4 + 4;

/// Encodes a sidecar for a segment of `segment_size` bytes.
pub(crate) fn encode(segment_size: u64, entries: &[SidecarEntry]) -> Vec<u8> {
    let keys: usize = entries.iter().map(|e| e.key.len()).sum();
    let mut out = Vec::with_capacity(32 + entries.len() * ENTRY_FIXED as usize + keys);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&segment_size.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for e in entries {
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.length.to_le_bytes());
        out.extend_from_slice(&e.meta_len.to_le_bytes());
        out.extend_from_slice(&e.crc.to_le_bytes());
        out.extend_from_slice(&(e.key.len() as u32).to_le_bytes());
        out.extend_from_slice(&e.key);
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)?.try_into().ok().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8)?.try_into().ok().map(u64::from_le_bytes)
    }
}

/// Decodes a sidecar; `None` when it is damaged or does not describe a segment of
/// `segment_size` bytes.
pub(crate) fn decode(bytes: &[u8], segment_size: u64) -> Option<Vec<SidecarEntry>> {
    let (content, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
    if crc32c::crc32c(content) != u32::from_le_bytes(crc.try_into().ok()?) {
        return None;
    }
    let mut c = Cursor(content);
    if c.take(8)? != MAGIC || c.u32()? != FORMAT_VERSION || c.u64()? != segment_size {
        return None;
    }
    let count = c.u64()?;
    let mut entries = Vec::with_capacity(usize::try_from(count).ok()?.min(content.len() / 28));
    for _ in 0..count {
        let offset = c.u64()?;
        let length = c.u64()?;
        let meta_len = c.u32()?;
        let crc = c.u32()?;
        let key_len = c.u32()?;
        let key = c.take(key_len as usize)?.into();
        if offset.checked_add(length)? > segment_size {
            return None;
        }
        entries.push(SidecarEntry {
            offset,
            length,
            meta_len,
            crc,
            key,
        });
    }
    c.0.is_empty().then_some(entries)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn sample() -> Vec<SidecarEntry> {
        vec![
            SidecarEntry {
                offset: 256,
                length: 1024,
                meta_len: 312,
                crc: 0xDEAD_BEEF,
                key: b"a".as_slice().into(),
            },
            SidecarEntry {
                offset: 1280,
                length: 64,
                meta_len: 8,
                crc: 1,
                key: b"second key".as_slice().into(),
            },
        ]
    }

    #[test]
    fn round_trip() {
        let bytes = encode(4096, &sample());
        assert_eq!(decode(&bytes, 4096).unwrap(), sample());
    }

    #[test]
    fn size_mismatch_or_any_flipped_byte_is_rejected() {
        let bytes = encode(4096, &sample());
        assert!(decode(&bytes, 4097).is_none());
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad, 4096).is_none(), "flip at {i} accepted");
        }
        assert!(decode(&bytes[..bytes.len() - 1], 4096).is_none());
    }
}
