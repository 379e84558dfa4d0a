//! Reading what `chunk_locate` points at, the way an mmap client does: the segment's schema
//! message (at offset 0) followed by the located message form a one-batch IPC stream.

use std::io::Cursor;

use arrow_array::RecordBatch;
use arrow_ipc::reader::StreamReader;

/// One `chunk_locate` answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    /// Absolute segment path.
    pub path: String,
    /// Offset of the message's continuation marker.
    pub offset: u64,
    /// Length of the whole encapsulated message.
    pub length: u64,
    /// The segment's inode.
    pub generation_id: u64,
}

impl Located {
    /// Parses an `available: true` answer; `None` for `available: false`.
    pub fn from_json(v: &serde_json::Value) -> Option<Located> {
        if v["available"] != true {
            return None;
        }
        Some(Located {
            path: v["segment_path"].as_str()?.to_string(),
            offset: v["byte_offset"].as_u64()?,
            length: v["byte_length"].as_u64()?,
            generation_id: v["generation_id"].as_u64()?,
        })
    }

    /// The located range of `segment` (the whole file, or a mapping of it).
    pub fn range<'a>(&self, segment: &'a [u8]) -> &'a [u8] {
        &segment[self.offset as usize..(self.offset + self.length) as usize]
    }
}

/// Decodes the located message of `segment` (file bytes or a mapping) into its batch.
pub fn decode_located(segment: &[u8], located: &Located) -> RecordBatch {
    let schema_len = 8 + u32::from_le_bytes(segment[4..8].try_into().unwrap()) as usize;
    let mut stream = segment[..schema_len].to_vec();
    stream.extend_from_slice(located.range(segment));
    StreamReader::try_new(Cursor::new(stream), None)
        .unwrap()
        .next()
        .expect("one batch")
        .unwrap()
}
