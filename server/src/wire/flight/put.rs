//! DoPut: the first message's descriptor carries a `PutCommand` (biopb-protocol.md): a chunk
//! of an upload (`chunk_ticket`), or a batch of annotations to put or delete (`roi_put`,
//! `roi_delete`). This module decodes the command and hands the stream to the part that
//! owns it; it holds wire code only.

use std::sync::Arc;

use arrow_flight::{FlightData, PutResult};
use prost::Message;
use tessera_proto::pb::PutCommand;
use tessera_proto::pb::put_command::Command;
use tessera_proto::ticket::{TicketPayload, decode_ticket};
use tonic::Streaming;

use crate::error::{Fault, RequestError, ServiceError};
use crate::state::ServiceState;
use crate::uploads::{ChunkTarget, PUT_FRAMING_SLACK};

/// The reply stream of a DoPut.
pub type PutStream = super::BoxStream<PutResult>;

/// Reads the command from the first message and runs it over the rest of the stream.
pub async fn run(
    state: &ServiceState,
    mut stream: Streaming<FlightData>,
) -> Result<PutStream, ServiceError> {
    let first = stream
        .message()
        .await
        .map_err(|source| RequestError::PutStream { source })?
        .ok_or(RequestError::PutEmpty)?;
    let descriptor = first
        .flight_descriptor
        .as_ref()
        .ok_or(RequestError::PutNoDescriptor)?;
    let command = PutCommand::decode(descriptor.cmd.as_ref())
        .map_err(|source| RequestError::PutNotCommand { source })?
        .command
        .ok_or(RequestError::PutNoCommand)?;
    match command {
        Command::ChunkTicket(ticket) => put_chunk(state, &ticket, first, stream).await,
        Command::RoiPut(cmd) => super::roi::put(state, cmd, first, stream).await,
        Command::RoiDelete(cmd) => super::roi::delete(state, cmd, first, stream).await,
    }
}

/// One chunk of an upload: the ticket is checked first (so a refused one reads nothing
/// more), then room for the chunk's largest size (its cell's bytes for the tensor's dtype,
/// plus framing) is reserved among the bytes in flight of the upload and of the server,
/// waiting for it if need be; then the stream's schema and record batches are received,
/// bounded by that size, decoded and stored; the one `PutResult` is sent once the chunk is
/// durable. The reservation is held until the bytes are stored or dropped: a client that
/// goes away mid-chunk drops the stream, its buffers and its reservation with it.
async fn put_chunk(
    state: &ServiceState,
    ticket: &[u8],
    first: FlightData,
    mut stream: Streaming<FlightData>,
) -> Result<PutStream, ServiceError> {
    let uploads = state.uploads_for_write("DoPut")?.clone();
    let chunk_id = match decode_ticket(ticket).map_err(|e| RequestError::PutTicket {
        source: Arc::new(e),
    })? {
        TicketPayload::ChunkId(id) => id,
        _ => return Err(RequestError::PutNotChunkTicket.into()),
    };
    let target = uploads.put_target(&chunk_id)?;
    let first_bytes = first.encoded_len() as u64;
    if first_bytes > PUT_FRAMING_SLACK {
        return Err(RequestError::PutFirstTooLarge {
            array_id: target.id.array_id().to_string(),
            bytes: first_bytes,
        }
        .into());
    }
    let limit = target.put_bytes();
    let permit = uploads.reserve_put(&target, limit).await?;
    let messages = receive(&target, first, &mut stream, limit).await?;
    let batches = arrow_flight::utils::flight_data_to_batches(&messages).map_err(|e| {
        RequestError::PutNotBatches {
            array_id: target.id.array_id().to_string(),
            source: Arc::new(e),
        }
    })?;
    drop(messages);
    tokio::task::spawn_blocking(move || {
        let stored = uploads.put(&target, &batches);
        drop(batches);
        drop(permit);
        stored
    })
    .await
    .map_err(|e| Fault::task("storing an upload chunk", e))??;
    Ok(super::once(vec![PutResult::default()]))
}

/// The messages of one chunk DoPut, `first` included, refused once they pass `limit` bytes.
async fn receive(
    target: &ChunkTarget,
    first: FlightData,
    stream: &mut Streaming<FlightData>,
    limit: u64,
) -> Result<Vec<FlightData>, ServiceError> {
    let mut total = (first.data_header.len() + first.data_body.len()) as u64;
    let mut messages = vec![first];
    while let Some(message) = stream
        .message()
        .await
        .map_err(|source| RequestError::PutStream { source })?
    {
        total += (message.data_body.len() + message.data_header.len()) as u64;
        if total > limit {
            return Err(RequestError::PutChunkTooLarge {
                array_id: target.id.array_id().to_string(),
                limit,
                elements: target.elements(),
                dtype: target.upload.dtype_str(),
            }
            .into());
        }
        if !message.data_header.is_empty() {
            messages.push(message);
        }
    }
    Ok(messages)
}
