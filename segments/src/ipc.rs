//! The Arrow IPC encoding of segment entries, built by hand so the payload is never copied.
//!
//! A segment is an Arrow IPC *stream*: the schema message ([`schema_message`]) and then one
//! single-row record batch message per entry. Each message is *encapsulated*: the
//! continuation marker `0xFFFFFFFF`, an `i32` little-endian metadata length (a multiple of
//! 8, padding included), the flatbuffer `Message`, zero padding, then the body.
//!
//! The body of an entry message is laid out as
//! `prefix | data | suffix` ([`EntryBody`]):
//! * `prefix`: the `data` column's offsets buffer `[0, n]` (8 bytes);
//! * `data`: the chunk's raw bytes, which is the `data` column's values buffer, at body
//!   offset [`DATA_BODY_OFFSET`];
//! * `suffix`: padding to 8 bytes, then the `shape`, `dtype` and `key` columns' buffers, each
//!   8-byte aligned, and padding so the body length is a multiple of 8.
//!
//! The metadata is padded ([`EntryBody::message`]) so that the data starts
//! [`DATA_ALIGNMENT`]-byte aligned relative to the start of the stream. Buffers appear in the
//! body in the same order as in the flatbuffer's buffer list (monotonic offsets).

use arrow_ipc::{
    Buffer, FieldNode, KeyValue, KeyValueArgs, MessageBuilder, MessageHeader, MetadataVersion,
    RecordBatchBuilder,
};
use arrow_schema::{DataType, Field, Schema};
use flatbuffers::FlatBufferBuilder;
use std::sync::Arc;

/// The continuation marker that starts every encapsulated message.
pub const CONTINUATION: [u8; 4] = [0xFF; 4];
/// The end-of-stream marker written when a segment is sealed.
pub const END_OF_STREAM: [u8; 8] = [0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0];
/// Alignment of the data payload relative to the start of the stream (the file).
pub const DATA_ALIGNMENT: u64 = 64;
/// Offset of the data payload inside an entry's body.
pub const DATA_BODY_OFFSET: u64 = 8;
/// `custom_metadata` key of an entry message holding the hex crc32c of its body.
pub const CHECKSUM_KEY: &str = "tessera:crc32c";
/// Number of buffers in an entry's record batch (data 3, shape 2 + item 2, dtype 3, key 3).
const BUFFER_COUNT: usize = 13;
/// Longest accepted dtype string.
const MAX_DTYPE_LEN: usize = 64;

/// Why an entry (or the schema) cannot be encoded.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum EncodeError {
    /// A length exceeds what an Arrow `Binary`/`Utf8`/`List` (32-bit offsets) can hold.
    #[error("{what} of {len} bytes exceeds the 32-bit offsets of the Arrow column (max {max})")]
    TooLong {
        /// Which value.
        what: &'static str,
        /// Its length.
        len: u64,
        /// The largest accepted length.
        max: u64,
    },
    /// A value is not acceptable.
    #[error("{0}")]
    Invalid(String),
}

/// The schema of every segment: `data: Binary`, `shape: List<Int64>`, `dtype: Utf8`,
/// `key: Binary`, all non-nullable (the list item field is the usual nullable `item`).
pub fn schema() -> Schema {
    Schema::new(vec![
        Field::new("data", DataType::Binary, false),
        Field::new(
            "shape",
            DataType::List(Arc::new(Field::new("item", DataType::Int64, true))),
            false,
        ),
        Field::new("dtype", DataType::Utf8, false),
        Field::new("key", DataType::Binary, false),
    ])
}

/// The encapsulated schema message exactly as it starts every segment file
/// (continuation marker, length, flatbuffer, padding; a multiple of 8 bytes long).
pub fn schema_message() -> Result<Vec<u8>, EncodeError> {
    let writer = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &schema())
        .map_err(|e| EncodeError::Invalid(format!("cannot encode the segment schema: {e}")))?;
    let bytes = writer.get_ref().clone();
    if !bytes.len().is_multiple_of(8) || bytes.len() < 8 {
        return Err(EncodeError::Invalid(format!(
            "the encoded schema message is {} bytes, not a positive multiple of 8",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// The body layout of one entry message, without its data.
#[derive(Clone)]
pub struct EntryBody {
    prefix: Vec<u8>,
    data_len: u64,
    suffix: Vec<u8>,
    nodes: Vec<FieldNode>,
    buffers: Vec<Buffer>,
}

impl std::fmt::Debug for EntryBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryBody")
            .field("prefix_len", &self.prefix.len())
            .field("data_len", &self.data_len)
            .field("suffix_len", &self.suffix.len())
            .finish()
    }
}

/// Appends 8-byte-aligned buffers to a byte vector whose first byte sits at body offset `base`.
struct BodyPart<'a> {
    base: u64,
    bytes: Vec<u8>,
    buffers: &'a mut Vec<Buffer>,
}

impl BodyPart<'_> {
    fn position(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }

    fn pad_to_8(&mut self) {
        let pad = self.position().next_multiple_of(8) - self.position();
        self.bytes.resize(self.bytes.len() + pad as usize, 0);
    }

    fn push(&mut self, data: &[u8]) {
        self.pad_to_8();
        self.buffers
            .push(Buffer::new(self.position() as i64, data.len() as i64));
        self.bytes.extend_from_slice(data);
    }

    fn push_empty(&mut self) {
        self.pad_to_8();
        self.buffers.push(Buffer::new(self.position() as i64, 0));
    }

    fn push_offsets(&mut self, len: i32) {
        let mut offsets = [0u8; 8];
        offsets[4..].copy_from_slice(&len.to_le_bytes());
        self.push(&offsets);
    }
}

fn offset_len(what: &'static str, len: u64) -> Result<i32, EncodeError> {
    i32::try_from(len).map_err(|_| EncodeError::TooLong {
        what,
        len,
        max: i32::MAX as u64,
    })
}

impl EntryBody {
    /// Lays out the body of one entry: `key` (the cache key), the chunk's `shape` and numpy
    /// `dtype` string, and `data_len`, the length of the chunk's raw bytes.
    pub fn new(key: &[u8], shape: &[i64], dtype: &str, data_len: u64) -> Result<Self, EncodeError> {
        let data_off = offset_len("data", data_len)?;
        let key_off = offset_len("key", key.len() as u64)?;
        let ndim = offset_len("shape", shape.len() as u64)?;
        if let Some(d) = shape.iter().find(|d| **d < 0) {
            return Err(EncodeError::Invalid(format!(
                "shape {shape:?} has a negative dimension {d}"
            )));
        }
        if dtype.is_empty() || dtype.len() > MAX_DTYPE_LEN || !dtype.is_ascii() {
            return Err(EncodeError::Invalid(format!(
                "dtype {dtype:?} is not a short ASCII numpy dtype string"
            )));
        }
        let mut buffers = Vec::with_capacity(BUFFER_COUNT);
        let mut prefix = BodyPart {
            base: 0,
            bytes: Vec::with_capacity(8),
            buffers: &mut buffers,
        };
        prefix.push_empty();
        prefix.push_offsets(data_off);
        let prefix = prefix.bytes;
        debug_assert_eq!(prefix.len() as u64, DATA_BODY_OFFSET);
        buffers.push(Buffer::new(DATA_BODY_OFFSET as i64, data_len as i64));

        let mut suffix = BodyPart {
            base: DATA_BODY_OFFSET + data_len,
            bytes: Vec::with_capacity(64 + 8 * shape.len() + dtype.len() + key.len()),
            buffers: &mut buffers,
        };
        // shape: List<Int64>, then its Int64 child.
        suffix.push_empty();
        suffix.push_offsets(ndim);
        suffix.push_empty();
        let dims: Vec<u8> = shape.iter().flat_map(|d| d.to_le_bytes()).collect();
        suffix.push(&dims);
        // dtype: Utf8.
        suffix.push_empty();
        suffix.push_offsets(dtype.len() as i32);
        suffix.push(dtype.as_bytes());
        // key: Binary.
        suffix.push_empty();
        suffix.push_offsets(key_off);
        suffix.push(key);
        suffix.pad_to_8();
        let suffix = suffix.bytes;

        let nodes = vec![
            FieldNode::new(1, 0),
            FieldNode::new(1, 0),
            FieldNode::new(shape.len() as i64, 0),
            FieldNode::new(1, 0),
            FieldNode::new(1, 0),
        ];
        Ok(EntryBody {
            prefix,
            data_len,
            suffix,
            nodes,
            buffers,
        })
    }

    /// Bytes written before the data.
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// Length of the data (the chunk's raw bytes).
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    /// Bytes written after the data.
    pub fn suffix(&self) -> &[u8] {
        &self.suffix
    }

    /// Total body length (a multiple of 8).
    pub fn len(&self) -> u64 {
        self.prefix.len() as u64 + self.data_len + self.suffix.len() as u64
    }

    /// Always false: a body holds at least the data offsets buffer.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// crc32c of the whole body, given the data as pieces whose concatenation is the data.
    pub fn crc32c(&self, data: &[&[u8]]) -> u32 {
        let mut crc = crc32c::crc32c(&self.prefix);
        for piece in data {
            crc = crc32c::crc32c_append(crc, piece);
        }
        crc32c::crc32c_append(crc, &self.suffix)
    }

    /// The encapsulated message header for this body: continuation marker, metadata length,
    /// the flatbuffer `Message` and zero padding. The padding places the data
    /// [`DATA_ALIGNMENT`]-aligned when the message starts at `stream_offset` (a multiple of 8;
    /// pass 0 when the position does not matter). With `crc`, the message carries it in
    /// `custom_metadata` under [`CHECKSUM_KEY`].
    pub fn message(&self, stream_offset: u64, crc: Option<u32>) -> Result<Vec<u8>, EncodeError> {
        if !stream_offset.is_multiple_of(8) {
            return Err(EncodeError::Invalid(format!(
                "a message cannot start at stream offset {stream_offset}: not a multiple of 8"
            )));
        }
        let mut fbb = FlatBufferBuilder::with_capacity(512);
        let nodes = fbb.create_vector(&self.nodes);
        let buffers = fbb.create_vector(&self.buffers);
        let batch = {
            let mut b = RecordBatchBuilder::new(&mut fbb);
            b.add_length(1);
            b.add_nodes(nodes);
            b.add_buffers(buffers);
            b.finish()
        };
        let custom = crc.map(|crc| {
            let key = fbb.create_string(CHECKSUM_KEY);
            let value = fbb.create_string(&format!("{crc:08x}"));
            let kv = KeyValue::create(
                &mut fbb,
                &KeyValueArgs {
                    key: Some(key),
                    value: Some(value),
                },
            );
            fbb.create_vector(&[kv])
        });
        let mut m = MessageBuilder::new(&mut fbb);
        m.add_version(MetadataVersion::V5);
        m.add_header_type(MessageHeader::RecordBatch);
        m.add_header(batch.as_union_value());
        m.add_bodyLength(self.len() as i64);
        if let Some(custom) = custom {
            m.add_custom_metadata(custom);
        }
        let root = m.finish();
        fbb.finish(root, None);
        let flatbuffer = fbb.finished_data();

        let unpadded_data_start = stream_offset + 8 + flatbuffer.len() as u64 + DATA_BODY_OFFSET;
        let meta_len = unpadded_data_start.next_multiple_of(DATA_ALIGNMENT)
            - stream_offset
            - 8
            - DATA_BODY_OFFSET;
        let meta_len_i32 = offset_len("metadata", meta_len)?;
        let mut out = Vec::with_capacity(8 + meta_len as usize);
        out.extend_from_slice(&CONTINUATION);
        out.extend_from_slice(&meta_len_i32.to_le_bytes());
        out.extend_from_slice(flatbuffer);
        out.resize(8 + meta_len as usize, 0);
        Ok(out)
    }
}

/// What lies at a position of a segment stream.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// An end-of-stream marker.
    EndOfStream,
    /// Fewer bytes than the message declares: a torn tail.
    Truncated,
    /// Bytes that are not an entry message of this format.
    Invalid(String),
    /// A complete entry message (its body is present; its checksum is not verified here).
    Entry(ParsedEntry),
}

/// The framing of one entry message found in a segment.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ParsedEntry {
    /// Metadata length (flatbuffer plus padding), excluding the 8-byte prefix.
    pub meta_len: u32,
    /// Total length: 8 + metadata + body.
    pub total_len: u64,
    /// Checksum recorded in the message.
    pub crc: u32,
    /// The key, copied out of the body.
    pub key: Vec<u8>,
}

/// Parses the message starting at `buf[0]` (`buf` runs to the end of the file).
pub(crate) fn parse_message(buf: &[u8]) -> Parsed {
    let Some(prefix) = buf.get(..8) else {
        return Parsed::Truncated;
    };
    if prefix[..4] != CONTINUATION {
        return Parsed::Invalid("no continuation marker".to_string());
    }
    let meta_len = i32::from_le_bytes([prefix[4], prefix[5], prefix[6], prefix[7]]);
    if meta_len == 0 {
        return Parsed::EndOfStream;
    }
    let Ok(meta_len) = u32::try_from(meta_len) else {
        return Parsed::Invalid(format!("negative metadata length {meta_len}"));
    };
    let Some(meta) = buf.get(8..8 + meta_len as usize) else {
        return Parsed::Truncated;
    };
    let message = match arrow_ipc::root_as_message(meta) {
        Ok(m) => m,
        Err(e) => return Parsed::Invalid(format!("unreadable message flatbuffer: {e}")),
    };
    let Some(batch) = message.header_as_record_batch() else {
        return Parsed::Invalid("message is not a record batch".to_string());
    };
    let Ok(body_len) = u64::try_from(message.bodyLength()) else {
        return Parsed::Invalid("negative body length".to_string());
    };
    let crc = message.custom_metadata().and_then(|kvs| {
        kvs.iter()
            .find(|kv| kv.key() == Some(CHECKSUM_KEY))
            .and_then(|kv| kv.value())
            .and_then(|v| u32::from_str_radix(v, 16).ok())
    });
    let Some(crc) = crc else {
        return Parsed::Invalid(format!("message has no {CHECKSUM_KEY} checksum"));
    };
    let key_buffer = match batch.buffers() {
        Some(b) if b.len() == BUFFER_COUNT => b.get(BUFFER_COUNT - 1),
        _ => return Parsed::Invalid("unexpected buffer count".to_string()),
    };
    let body_start = 8 + meta_len as u64;
    let total_len = body_start + body_len;
    if (buf.len() as u64) < total_len {
        return Parsed::Truncated;
    }
    let key_start = u64::try_from(key_buffer.offset()).unwrap_or(u64::MAX);
    let key_len = u64::try_from(key_buffer.length()).unwrap_or(u64::MAX);
    let key_end = key_start.saturating_add(key_len);
    if key_end > body_len {
        return Parsed::Invalid("key buffer outside the body".to_string());
    }
    let key = buf[(body_start + key_start) as usize..(body_start + key_end) as usize].to_vec();
    Parsed::Entry(ParsedEntry {
        meta_len,
        total_len,
        crc,
        key,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn entry(offset: u64, key: &[u8], shape: &[i64], dtype: &str, data: &[u8]) -> Vec<u8> {
        let body = EntryBody::new(key, shape, dtype, data.len() as u64).unwrap();
        let crc = body.crc32c(&[data]);
        let mut out = body.message(offset, Some(crc)).unwrap();
        out.extend_from_slice(body.prefix());
        out.extend_from_slice(data);
        out.extend_from_slice(body.suffix());
        out
    }

    #[test]
    fn data_lands_64_byte_aligned_for_any_8_aligned_offset() {
        for offset in (0..256).step_by(8) {
            let body = EntryBody::new(b"k", &[3, 5], "<u2", 30).unwrap();
            let msg = body.message(offset, Some(7)).unwrap();
            assert_eq!(msg.len() % 8, 0);
            let data_pos = offset + msg.len() as u64 + DATA_BODY_OFFSET;
            assert_eq!(data_pos % DATA_ALIGNMENT, 0, "offset {offset}");
            assert_eq!(body.len() % 8, 0);
        }
    }

    #[test]
    fn unaligned_offset_is_refused() {
        let body = EntryBody::new(b"k", &[1], "|u1", 1).unwrap();
        assert!(body.message(4, None).is_err());
    }

    #[test]
    fn parse_round_trips_key_crc_and_length() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let bytes = entry(40, b"chunk-key", &[10, 100], "|u1", &data);
        match parse_message(&bytes) {
            Parsed::Entry(e) => {
                assert_eq!(e.key, b"chunk-key");
                assert_eq!(e.total_len, bytes.len() as u64);
                let body = &bytes[8 + e.meta_len as usize..];
                assert_eq!(crc32c::crc32c(body), e.crc);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(parse_message(&bytes[..bytes.len() - 1]), Parsed::Truncated);
        assert_eq!(parse_message(&bytes[..6]), Parsed::Truncated);
        assert_eq!(parse_message(&END_OF_STREAM), Parsed::EndOfStream);
    }

    #[test]
    fn bad_values_are_refused_with_reasons() {
        let e = EntryBody::new(b"k", &[-1], "<u2", 0).unwrap_err();
        assert!(e.to_string().contains("negative"), "{e}");
        let e = EntryBody::new(b"k", &[1], "", 0).unwrap_err();
        assert!(e.to_string().contains("dtype"), "{e}");
        let e = EntryBody::new(b"k", &[1], "<u2", 1 << 31).unwrap_err();
        assert!(e.to_string().contains("data"), "{e}");
    }

    #[test]
    fn schema_message_is_framed() {
        let s = schema_message().unwrap();
        assert_eq!(s[..4], CONTINUATION);
        let m = arrow_ipc::root_as_message(&s[8..]).unwrap();
        assert!(m.header_as_schema().is_some());
    }
}
