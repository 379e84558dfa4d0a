//! Writes: the biopb upload calls (`add_tensor`, one DoPut per chunk, `set_upload_status`)
//! on [`Client`], for `tessera put`.

use std::sync::Arc;

use arrow_array::{ArrayRef, BooleanArray, RecordBatch};
use arrow_buffer::Buffer;
use arrow_flight::FlightDescriptor;
use arrow_schema::{DataType, Field, Schema};
use prost::Message;
use tessera_proto::consts::{ACTION_ADD_TENSOR, ACTION_SET_UPLOAD_STATUS};
use tessera_proto::pb::{PutCommand, SetUploadStatus, TensorDescriptor, UploadStatus, put_command};

use crate::client::Client;
use crate::error::ClientError;

/// The Arrow type chunks of the little-endian (or one-byte) numpy `dtype` travel as.
pub fn upload_arrow_type(dtype: &str) -> Result<DataType, ClientError> {
    let refused = |reason: &str| ClientError::Dtype {
        dtype: dtype.to_string(),
        reason: reason.to_string(),
    };
    let (order, code) = dtype.split_at(dtype.len().min(1));
    if order == ">" {
        return Err(refused(
            "big-endian values must be swapped to '<' before an upload",
        ));
    }
    Ok(match code {
        "b1" => DataType::Boolean,
        "i1" => DataType::Int8,
        "i2" => DataType::Int16,
        "i4" => DataType::Int32,
        "i8" => DataType::Int64,
        "u1" => DataType::UInt8,
        "u2" => DataType::UInt16,
        "u4" => DataType::UInt32,
        "u8" => DataType::UInt64,
        "f2" => DataType::Float16,
        "f4" => DataType::Float32,
        "f8" => DataType::Float64,
        _ => return Err(refused("chunks of this dtype have no Arrow primitive type")),
    })
}

/// The chunk batch of `bytes` (C-order little-endian values of `dtype`): one column `data`.
/// `bytes` should be aligned to the element size (a [`arrow_buffer::MutableBuffer`] is);
/// a misaligned one is copied once.
fn chunk_batch(dtype: &str, bytes: Buffer) -> Result<RecordBatch, ClientError> {
    use arrow_array::PrimitiveArray;
    use arrow_array::types::*;
    let data_type = upload_arrow_type(dtype)?;
    let width = data_type.primitive_width().unwrap_or(1);
    let bytes = if bytes.as_ptr().align_offset(width) == 0 {
        bytes
    } else {
        Buffer::from(arrow_buffer::MutableBuffer::from(bytes.to_vec()))
    };
    let len = bytes.len() / width;
    macro_rules! primitive {
        ($t:ty) => {
            Arc::new(PrimitiveArray::<$t>::new(
                arrow_buffer::ScalarBuffer::new(bytes, 0, len),
                None,
            )) as ArrayRef
        };
    }
    let column: ArrayRef = match data_type {
        DataType::Boolean => Arc::new(BooleanArray::from(
            bytes.iter().map(|&b| b != 0).collect::<Vec<bool>>(),
        )),
        DataType::Int8 => primitive!(Int8Type),
        DataType::Int16 => primitive!(Int16Type),
        DataType::Int32 => primitive!(Int32Type),
        DataType::Int64 => primitive!(Int64Type),
        DataType::UInt8 => primitive!(UInt8Type),
        DataType::UInt16 => primitive!(UInt16Type),
        DataType::UInt32 => primitive!(UInt32Type),
        DataType::UInt64 => primitive!(UInt64Type),
        DataType::Float16 => primitive!(Float16Type),
        DataType::Float32 => primitive!(Float32Type),
        _ => primitive!(Float64Type),
    };
    let schema = Arc::new(Schema::new(vec![Field::new("data", data_type, false)]));
    RecordBatch::try_new(schema, vec![column]).map_err(|e| ClientError::Dtype {
        dtype: dtype.to_string(),
        reason: e.to_string(),
    })
}

impl Client {
    /// `add_tensor`: declares `request` (`array_id` `cache://<source>/@fields/<name>`,
    /// shape, dtype, optionally chunk shape, labels and lifetime) and returns the server's
    /// descriptor (its grid, the granted lifetime, the answered array id).
    pub async fn add_tensor(
        &self,
        request: &TensorDescriptor,
    ) -> Result<TensorDescriptor, ClientError> {
        let body = self
            .action(ACTION_ADD_TENSOR, request.encode_to_vec())
            .await
            .map_err(|s| ClientError::rpc(format!("add_tensor of '{}'", request.array_id), s))?
            .ok_or_else(|| ClientError::ActionReply {
                action: ACTION_ADD_TENSOR.to_string(),
                reason: "the reply stream was empty".to_string(),
            })?;
        TensorDescriptor::decode(body).map_err(|e| ClientError::ActionReply {
            action: ACTION_ADD_TENSOR.to_string(),
            reason: e.to_string(),
        })
    }

    /// One DoPut: the chunk `ticket` (of the upload's plan) with `bytes`, its C-order
    /// little-endian values of `dtype`. Returns once the server acknowledged it (durable).
    pub async fn put_chunk(
        &self,
        ticket: &[u8],
        dtype: &str,
        bytes: Buffer,
    ) -> Result<(), ClientError> {
        let batch = chunk_batch(dtype, bytes)?;
        let mut messages =
            arrow_flight::utils::batches_to_flight_data(batch.schema().as_ref(), vec![batch])
                .map_err(|e| ClientError::Dtype {
                    dtype: dtype.to_string(),
                    reason: e.to_string(),
                })?;
        let command = PutCommand {
            command: Some(put_command::Command::ChunkTicket(ticket.to_vec())),
        };
        if let Some(first) = messages.first_mut() {
            first.flight_descriptor = Some(FlightDescriptor::new_cmd(command.encode_to_vec()));
        }
        let mut replies = self
            .flight()
            .do_put(self.request(futures::stream::iter(messages)))
            .await
            .map_err(|s| ClientError::rpc("DoPut of an upload chunk", s))?
            .into_inner();
        while replies
            .message()
            .await
            .map_err(|s| ClientError::rpc("DoPut of an upload chunk", s))?
            .is_some()
        {}
        Ok(())
    }

    /// `set_upload_status`: moves `array_id` to `state` (the wire enum: 2 READY,
    /// 3 DISCARDED) and returns its status.
    pub async fn set_upload_status(
        &self,
        array_id: &str,
        state: i32,
        reason: &str,
    ) -> Result<UploadStatus, ClientError> {
        let request = SetUploadStatus {
            array_id: array_id.to_string(),
            state,
            reason: reason.to_string(),
        };
        let body = self
            .action(ACTION_SET_UPLOAD_STATUS, request.encode_to_vec())
            .await
            .map_err(|s| ClientError::rpc(format!("set_upload_status of '{array_id}'"), s))?
            .ok_or_else(|| ClientError::ActionReply {
                action: ACTION_SET_UPLOAD_STATUS.to_string(),
                reason: "the reply stream was empty".to_string(),
            })?;
        UploadStatus::decode(body).map_err(|e| ClientError::ActionReply {
            action: ACTION_SET_UPLOAD_STATUS.to_string(),
            reason: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn chunk_batches_carry_the_values_as_arrow_types() {
        let batch = chunk_batch("<u2", Buffer::from_vec(vec![1u8, 0, 2, 0])).unwrap();
        assert_eq!(batch.column(0).data_type(), &DataType::UInt16);
        assert_eq!(batch.num_rows(), 2);
        let bools = chunk_batch("|b1", Buffer::from_vec(vec![1u8, 0, 1])).unwrap();
        assert_eq!(bools.num_rows(), 3);
        assert!(upload_arrow_type(">u2").is_err());
        assert!(upload_arrow_type("<c8").is_err());
    }
}
