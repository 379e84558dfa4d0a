//! Decoding chunk batches without copying their bytes: in place from a mapped
//! Arrow IPC stream segment (the schema message at offset 0, then the record
//! batch message at the offset `chunk_locate` named, every buffer a slice of
//! the mapping), and from the messages of a DoGet stream (every buffer a slice
//! of the received body; arrow-flight's own decoder copies any body that is
//! not 64-byte aligned, which a gRPC message body practically never is).

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::reader::read_record_batch;
use arrow_schema::SchemaRef;
use bytes::Bytes;

use crate::pins::{MappedSegment, SegmentOwner};

const CONTINUATION: [u8; 4] = [0xFF; 4];

/// The flatbuffer metadata of the encapsulated message at `offset`, and the
/// offset of its body. Accepts the legacy framing without the continuation
/// marker.
fn message_at(bytes: &[u8], offset: usize) -> Result<(&[u8], usize), String> {
    let word = |at: usize| -> Result<[u8; 4], String> {
        bytes
            .get(at..at + 4)
            .and_then(|w| w.try_into().ok())
            .ok_or_else(|| {
                format!(
                    "message at offset {offset} runs past the end ({} bytes)",
                    bytes.len()
                )
            })
    };
    let (len_at, first) = match word(offset)? {
        CONTINUATION => (offset + 4, false),
        _ => (offset, true),
    };
    let len = i32::from_le_bytes(if first { word(offset)? } else { word(len_at)? });
    let len =
        usize::try_from(len).map_err(|_| format!("message at offset {offset} has length {len}"))?;
    if len == 0 {
        return Err(format!(
            "offset {offset} holds the end-of-stream marker, not a message"
        ));
    }
    let meta_start = len_at + 4;
    let metadata = bytes.get(meta_start..meta_start + len).ok_or_else(|| {
        format!("message metadata at offset {offset} ({len} bytes) runs past the end")
    })?;
    Ok((metadata, meta_start + len))
}

/// The stream schema at offset 0 of the segment (parsed once per mapping).
fn schema_of(segment: &MappedSegment) -> Result<SchemaRef, String> {
    if let Some(schema) = segment.schema.get() {
        return Ok(Arc::clone(schema));
    }
    let (metadata, _) = message_at(segment.bytes(), 0)?;
    let message = arrow_ipc::root_as_message(metadata)
        .map_err(|e| format!("the message at offset 0 is not an IPC message: {e}"))?;
    let schema = message
        .header_as_schema()
        .ok_or_else(|| "the segment does not start with an IPC stream schema".to_string())?;
    let schema = Arc::new(arrow_ipc::convert::fb_to_schema(schema));
    Ok(Arc::clone(segment.schema.get_or_init(|| schema)))
}

/// Decodes the record batch of `message` from `body` (every buffer a slice of it; a
/// buffer whose type needs more alignment than the body gives, such as the few bytes
/// of an offsets buffer, is copied on its own, the chunk's Binary values never are).
fn record_batch(
    message: &arrow_ipc::Message<'_>,
    body: &Buffer,
    schema: SchemaRef,
    what: &str,
) -> Result<RecordBatch, String> {
    let batch = message
        .header_as_record_batch()
        .ok_or_else(|| format!("{what} is not a record batch"))?;
    read_record_batch(
        body,
        batch,
        schema,
        &HashMap::new(),
        None,
        &message.version(),
    )
    .map_err(|e| format!("the record batch of {what} does not decode: {e}"))
}

/// One message of a DoGet stream, decoded.
pub(crate) enum StreamMessage {
    /// The stream's schema.
    Schema(SchemaRef),
    /// A record batch whose buffers are slices of the message body.
    Batch(RecordBatch),
    /// A message without an IPC header (application metadata only).
    Empty,
}

/// Decodes one DoGet FlightData message from its flatbuffer `header` and its `body`;
/// a record batch needs the `schema` of the message before it.
pub(crate) fn stream_message(
    header: &[u8],
    body: Bytes,
    schema: Option<&SchemaRef>,
) -> Result<StreamMessage, String> {
    if header.is_empty() {
        return Ok(StreamMessage::Empty);
    }
    let message = arrow_ipc::root_as_message(header)
        .map_err(|e| format!("a DoGet message header is not an IPC message: {e}"))?;
    match message.header_type() {
        arrow_ipc::MessageHeader::Schema => {
            let schema = message
                .header_as_schema()
                .ok_or_else(|| "a DoGet schema message has no schema".to_string())?;
            Ok(StreamMessage::Schema(Arc::new(
                arrow_ipc::convert::fb_to_schema(schema),
            )))
        }
        arrow_ipc::MessageHeader::RecordBatch => {
            let schema = schema.ok_or_else(|| {
                "the DoGet stream sent a record batch before its schema".to_string()
            })?;
            let body_len = usize::try_from(message.bodyLength())
                .map_err(|_| "a DoGet record batch has a negative body length".to_string())?;
            if body.len() < body_len {
                return Err(format!(
                    "a DoGet record batch announces a {body_len}-byte body but carries {} bytes",
                    body.len()
                ));
            }
            let body = Buffer::from(body);
            record_batch(&message, &body, Arc::clone(schema), "a DoGet message")
                .map(StreamMessage::Batch)
        }
        arrow_ipc::MessageHeader::NONE => Ok(StreamMessage::Empty),
        other => Err(format!(
            "a DoGet message is a {other:?}, which chunk streams do not use"
        )),
    }
}

/// Decodes the record batch message at `offset` of `segment` without copying
/// its body: the batch's buffers are slices of the mapping and keep it alive.
pub(crate) fn batch_at(segment: &Arc<MappedSegment>, offset: u64) -> Result<RecordBatch, String> {
    let schema = schema_of(segment)?;
    let bytes = segment.bytes();
    let offset = usize::try_from(offset).map_err(|_| format!("offset {offset} is too large"))?;
    if offset == 0 {
        return Err("offset 0 is the schema, not a chunk".to_string());
    }
    let (metadata, body_start) = message_at(bytes, offset)?;
    let message = arrow_ipc::root_as_message(metadata)
        .map_err(|e| format!("the message at offset {offset} is not an IPC message: {e}"))?;
    let body_len = usize::try_from(message.bodyLength())
        .map_err(|_| format!("message at offset {offset} has a negative body length"))?;
    if body_start
        .checked_add(body_len)
        .is_none_or(|end| end > bytes.len())
    {
        return Err(format!(
            "message body at offset {body_start} ({body_len} bytes) runs past the {}-byte mapping",
            bytes.len()
        ));
    }
    let whole = Buffer::from(Bytes::from_owner(SegmentOwner(Arc::clone(segment))));
    let body = whole.slice_with_length(body_start, body_len);
    record_batch(
        &message,
        &body,
        schema,
        &format!("the message at offset {offset}"),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::chunk::tests::chunk_batch;
    use crate::chunk::{ChunkOrigin, view_from_batch};
    use crate::pins::{InodeKey, PinLedger};
    use arrow_ipc::writer::StreamWriter;
    use std::io::Seek;
    use std::os::unix::fs::MetadataExt;

    /// Writes a stream segment of `chunks` and returns the batch offsets.
    fn write_segment(path: &std::path::Path, chunks: &[Vec<u8>]) -> Vec<u64> {
        let mut file = std::fs::File::create(path).unwrap();
        let mut writer = StreamWriter::try_new(&mut file, &tessera_proto::chunk_schema()).unwrap();
        writer.flush().unwrap();
        let mut offsets = Vec::new();
        for data in chunks {
            offsets.push(writer.get_mut().stream_position().unwrap());
            writer
                .write(&chunk_batch(data, &[data.len() as i64], "|u1"))
                .unwrap();
            writer.flush().unwrap();
        }
        offsets
    }

    #[test]
    fn batches_decode_in_place_from_the_mapping() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg_0001.arrow");
        let chunks: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i * 10; 1000 + i as usize]).collect();
        let offsets = write_segment(&path, &chunks);
        let file = std::fs::File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        let key = InodeKey {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        let ledger = PinLedger::new(None);
        let segment = ledger.acquire(&file, key, meta.size(), 0).unwrap();
        let range = segment.bytes().as_ptr_range();
        for (data, offset) in chunks.iter().zip(&offsets) {
            let batch = batch_at(&segment, *offset).unwrap();
            let view = view_from_batch(&batch, ChunkOrigin::Mapped).unwrap();
            assert_eq!(view.bytes(), data.as_slice());
            assert!(
                range.contains(&view.bytes().as_ptr()),
                "the view points into the mapping (zero copy)"
            );
        }
        // The views keep the mapping (and its pin) alive after the segment handle goes.
        let batch = batch_at(&segment, offsets[1]).unwrap();
        drop(segment);
        assert_eq!(ledger.pinned_bytes(), meta.size());
        let view = view_from_batch(&batch, ChunkOrigin::Mapped).unwrap();
        drop(batch);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(view.bytes(), chunks[1].as_slice());
        drop(view);
        assert_eq!(ledger.pinned_bytes(), 0);
    }

    /// The two FlightData messages of a DoGet reply, encoded by arrow-flight.
    fn doget_messages(data: &[u8]) -> (arrow_flight::FlightData, arrow_flight::FlightData) {
        let batch = chunk_batch(data, &[data.len() as i64], "|u1");
        let mut messages = arrow_flight::utils::batches_to_flight_data(
            &tessera_proto::chunk_schema(),
            vec![batch],
        )
        .unwrap()
        .into_iter();
        (messages.next().unwrap(), messages.next().unwrap())
    }

    #[test]
    fn doget_bodies_decode_without_a_copy_at_any_alignment() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let (schema_msg, batch_msg) = doget_messages(&data);
        let StreamMessage::Schema(schema) =
            stream_message(&schema_msg.data_header, schema_msg.data_body, None).unwrap()
        else {
            panic!("the first message is the schema");
        };
        for shift in [0usize, 1, 3, 8, 63] {
            // The body at an arbitrary address, as a gRPC receive buffer holds it.
            let mut holder = vec![0u8; shift];
            holder.extend_from_slice(&batch_msg.data_body);
            let body = Bytes::from(holder).slice(shift..);
            let range = body.as_ptr_range();
            let decoded = stream_message(&batch_msg.data_header, body, Some(&schema)).unwrap();
            let StreamMessage::Batch(batch) = decoded else {
                panic!("the second message is the batch");
            };
            let view = view_from_batch(&batch, ChunkOrigin::Socket).unwrap();
            assert_eq!(view.bytes(), data.as_slice(), "shift {shift}");
            assert!(
                range.contains(&view.bytes().as_ptr()),
                "shift {shift}: the view points into the received body (zero copy)"
            );
        }
    }

    #[test]
    fn doget_bodies_with_zstd_buffers_decode() {
        // A server may compress a reply's buffers (docs/decisions/0039): runs shrink to a
        // zstd frame, noise is stored raw with the length -1; both decode exactly.
        let runs: Vec<u8> = (0..200_000u32).map(|i| (i / 4096) as u8).collect();
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let noise: Vec<u8> = (0..50_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let (schema_msg, _) = doget_messages(&runs);
        let StreamMessage::Schema(schema) =
            stream_message(&schema_msg.data_header, schema_msg.data_body, None).unwrap()
        else {
            panic!("the first message is the schema");
        };
        let options = arrow_ipc::writer::IpcWriteOptions::default()
            .try_with_compression(Some(arrow_ipc::CompressionType::ZSTD))
            .unwrap();
        for data in [&runs, &noise] {
            let batch = chunk_batch(data, &[data.len() as i64], "|u1");
            let (_, encoded) = arrow_ipc::writer::IpcDataGenerator::default()
                .encode(
                    &batch,
                    &mut arrow_ipc::writer::DictionaryTracker::new(false),
                    &options,
                    &mut arrow_ipc::writer::IpcWriteContext::default(),
                )
                .unwrap();
            let body = Bytes::from(encoded.arrow_data);
            let StreamMessage::Batch(decoded) =
                stream_message(&encoded.ipc_message, body, Some(&schema)).unwrap()
            else {
                panic!("the second message is the batch");
            };
            let view = view_from_batch(&decoded, ChunkOrigin::Socket).unwrap();
            assert!(view.bytes() == data.as_slice());
        }
    }

    #[test]
    fn malformed_doget_messages_are_refused() {
        let (schema_msg, batch_msg) = doget_messages(&[7u8; 64]);
        let err = stream_message(&batch_msg.data_header, batch_msg.data_body.clone(), None)
            .err()
            .unwrap();
        assert!(err.contains("before its schema"), "{err}");
        let StreamMessage::Schema(schema) =
            stream_message(&schema_msg.data_header, Bytes::new(), None).unwrap()
        else {
            panic!("the first message is the schema");
        };
        let short = batch_msg.data_body.slice(..batch_msg.data_body.len() - 1);
        let err = stream_message(&batch_msg.data_header, short, Some(&schema))
            .err()
            .unwrap();
        assert!(err.contains("carries"), "{err}");
        let err = stream_message(b"not a flatbuffer", Bytes::new(), Some(&schema))
            .err()
            .unwrap();
        assert!(err.contains("not an IPC message"), "{err}");
        assert!(matches!(
            stream_message(&[], Bytes::new(), Some(&schema)).unwrap(),
            StreamMessage::Empty
        ));
    }

    #[test]
    fn bad_offsets_are_refused_not_misread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg.arrow");
        let offsets = write_segment(&path, &[vec![1u8; 64]]);
        let file = std::fs::File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        let key = InodeKey {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        let segment = PinLedger::new(None)
            .acquire(&file, key, meta.size(), 0)
            .unwrap();
        assert!(batch_at(&segment, 0).unwrap_err().contains("schema"));
        assert!(batch_at(&segment, offsets[0] + 3).is_err());
        assert!(
            batch_at(&segment, meta.size() + 100)
                .unwrap_err()
                .contains("past the end")
        );
    }
}
