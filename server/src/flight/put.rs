//! DoPut: the first message's descriptor carries a `PutCommand` (biopb-protocol.md): a chunk
//! of an upload (`chunk_ticket`), or a batch of annotations to put or delete (`roi_put`,
//! `roi_delete`). This module decodes the command and hands the stream to the part that
//! owns it; it holds wire code only.

use arrow_flight::{FlightData, PutResult};
use prost::Message;
use tessera_proto::pb::PutCommand;
use tessera_proto::pb::put_command::Command;
use tessera_proto::ticket::{TicketPayload, decode_ticket};
use tonic::Streaming;

use crate::error::ServiceError;
use crate::state::ServiceState;

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
        .map_err(|e| ServiceError::InvalidArgument(format!("DoPut stream failed: {e}")))?
        .ok_or_else(|| {
            ServiceError::InvalidArgument("DoPut stream ended before its first message".into())
        })?;
    let descriptor = first.flight_descriptor.as_ref().ok_or_else(|| {
        ServiceError::InvalidArgument(
            "DoPut's first message has no flight descriptor: it must carry a PutCommand".into(),
        )
    })?;
    let command = PutCommand::decode(descriptor.cmd.as_ref())
        .map_err(|e| {
            ServiceError::InvalidArgument(format!(
                "DoPut descriptor command is not a PutCommand: {e}"
            ))
        })?
        .command
        .ok_or_else(|| {
            ServiceError::InvalidArgument(
                "DoPut descriptor's PutCommand names no command (chunk_ticket, roi_put or roi_delete)"
                    .into(),
            )
        })?;
    match command {
        Command::ChunkTicket(ticket) => put_chunk(state, &ticket, first, stream).await,
        Command::RoiPut(cmd) => super::roi::put(state, cmd, first, stream).await,
        Command::RoiDelete(cmd) => super::roi::delete(state, cmd, first, stream).await,
    }
}

/// Bytes a chunk's messages may carry beyond its cell's values (IPC metadata and padding).
const FRAMING_SLACK: u64 = 1 << 20;

/// One chunk of an upload: the ticket is checked first (so a refused one reads nothing
/// more), then the stream's schema and record batches are decoded, bounded by the cell's
/// size, and stored; the one `PutResult` is sent once the chunk is durable.
async fn put_chunk(
    state: &ServiceState,
    ticket: &[u8],
    first: FlightData,
    mut stream: Streaming<FlightData>,
) -> Result<PutStream, ServiceError> {
    let uploads = state.uploads_for_write("DoPut")?.clone();
    let chunk_id = match decode_ticket(ticket)
        .map_err(|e| ServiceError::InvalidArgument(format!("DoPut chunk_ticket: {e}")))?
    {
        TicketPayload::ChunkId(id) => id,
        _ => {
            return Err(ServiceError::InvalidArgument(
                "DoPut chunk_ticket must be a chunk ticket (TensorTicket{chunk_id}) of the upload's plan"
                    .into(),
            ));
        }
    };
    let target = uploads.put_target(&chunk_id)?;
    let region = target.id.region();
    let cell_bytes = region
        .start
        .iter()
        .zip(&region.stop)
        .map(|(a, b)| b - a)
        .product::<u64>()
        .saturating_mul(8);
    let limit = cell_bytes + FRAMING_SLACK;
    let mut messages = vec![first];
    let mut total: u64 = messages[0].data_body.len() as u64;
    while let Some(message) = stream
        .message()
        .await
        .map_err(|e| ServiceError::InvalidArgument(format!("DoPut stream failed: {e}")))?
    {
        total += (message.data_body.len() + message.data_header.len()) as u64;
        if total > limit {
            return Err(ServiceError::InvalidArgument(format!(
                "DoPut: the chunk of '{}' is over {limit} bytes, more than its cell can hold",
                target.id.array_id()
            )));
        }
        if !message.data_header.is_empty() {
            messages.push(message);
        }
    }
    let batches = arrow_flight::utils::flight_data_to_batches(&messages).map_err(|e| {
        ServiceError::InvalidArgument(format!(
            "DoPut: the chunk of '{}' is not a schema and record batches: {e}",
            target.id.array_id()
        ))
    })?;
    tokio::task::spawn_blocking(move || uploads.put(&target, &batches))
        .await
        .map_err(|e| ServiceError::Internal(format!("storing an upload chunk: {e}")))??;
    Ok(super::once(vec![PutResult::default()]))
}
