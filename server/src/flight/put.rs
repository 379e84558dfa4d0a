//! DoPut: the first message's descriptor carries a `PutCommand` (biopb-protocol.md): a chunk
//! of an upload (`chunk_ticket`), or a batch of annotations to put or delete (`roi_put`,
//! `roi_delete`). This module decodes the command and hands the stream to the part that
//! owns it; it holds wire code only.

use arrow_flight::{FlightData, PutResult};
use prost::Message;
use tessera_proto::pb::PutCommand;
use tessera_proto::pb::put_command::Command;
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
        Command::ChunkTicket(_) => Err(ServiceError::Unsupported(
            "DoPut of an upload chunk is not supported yet".into(),
        )),
        Command::RoiPut(cmd) => super::roi::put(state, cmd, first, stream).await,
        Command::RoiDelete(cmd) => super::roi::delete(state, cmd, first, stream).await,
    }
}
