//! The chunk of a cell never sent: zeros, answered from memory and never stored, so readers
//! of a sparse upload cannot fill the state directory (its stores are never evicted).

use bytes::Bytes;
use tessera_segments::EntryMeta;
use tessera_segments::ipc::{EncodeError, EntryBody};

use crate::chunks::EncodedChunk;

/// The IPC message of a chunk of `data_len` zero bytes under `key`. The body is allocated
/// zeroed and only its framing is written, so a large one is untouched zero pages until it
/// is sent.
pub fn zeros_message(
    key: &[u8],
    meta: &EntryMeta,
    data_len: u64,
) -> Result<EncodedChunk, EncodeError> {
    let layout = EntryBody::new(key, &meta.shape, &meta.dtype, data_len)?;
    let mut header = layout.message(0, None)?;
    // Flight's `data_header` is the flatbuffer without the continuation marker and length.
    header.drain(..header.len().min(8));
    let total = usize::try_from(layout.len()).map_err(|_| EncodeError::TooLong {
        what: "zero chunk",
        len: layout.len(),
        max: usize::MAX as u64,
    })?;
    let mut body = vec![0u8; total];
    let prefix = layout.prefix();
    body[..prefix.len()].copy_from_slice(prefix);
    let suffix = layout.suffix();
    body[total - suffix.len()..].copy_from_slice(suffix);
    Ok(EncodedChunk {
        header: Bytes::from(header),
        body: Bytes::from(body),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_zero_chunk_decodes_as_zeros_of_its_shape() {
        let meta = EntryMeta {
            shape: vec![3, 5],
            dtype: "<u2".to_string(),
        };
        let chunk = zeros_message(b"key", &meta, 30).unwrap();
        let schema = tessera_segments::ipc::schema();
        let batch = arrow_flight::utils::flight_data_to_arrow_batch(
            &arrow_flight::FlightData::new()
                .with_data_header(chunk.header)
                .with_data_body(chunk.body),
            std::sync::Arc::new(schema),
            &Default::default(),
        )
        .unwrap();
        let data = batch
            .column_by_name("data")
            .unwrap()
            .as_any()
            .downcast_ref::<arrow_array::BinaryArray>()
            .unwrap();
        assert_eq!(data.value(0), &[0u8; 30][..]);
        let dtype = batch
            .column_by_name("dtype")
            .unwrap()
            .as_any()
            .downcast_ref::<arrow_array::StringArray>()
            .unwrap();
        assert_eq!(dtype.value(0), "<u2");
    }
}
