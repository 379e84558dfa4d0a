//! Encoding and decoding of tickets and GetFlightInfo commands.

use prost::Message;

use crate::error::ProtoError;
use crate::pb::{
    CatalogQuery, FlightRequest, RoiRead, TensorReadOption, TensorTicket, flight_request,
    tensor_ticket,
};

/// What a Flight ticket (or `chunk_locate` body) asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TicketPayload {
    /// Read one chunk: the opaque, non-empty chunk id the server minted.
    ChunkId(Vec<u8>),
    /// Run this SQL over the catalog and stream the result.
    CatalogQuery(String),
    /// Read a tensor's annotations (all its client-owned sets, or one), by bearer token or
    /// under the sealed grant it carries.
    RoiRead(RoiRead),
    /// A valid ticket of a kind Tessera does not serve; names the arm
    /// (`"chunk_ref"`) so the refusal can say which.
    Other(&'static str),
}

/// Encodes `TensorTicket{chunk_id}`: the bytes of a chunk endpoint's ticket
/// and of a `chunk_locate` action body.
pub fn chunk_ticket(chunk_id: &[u8]) -> Vec<u8> {
    TensorTicket {
        payload: Some(tensor_ticket::Payload::ChunkId(chunk_id.to_vec())),
    }
    .encode_to_vec()
}

/// Encodes `TensorTicket{catalog_query{sql}}`: the ticket of a catalog query.
pub fn catalog_ticket(sql: &str) -> Vec<u8> {
    TensorTicket {
        payload: Some(tensor_ticket::Payload::CatalogQuery(CatalogQuery {
            sql: sql.to_owned(),
        })),
    }
    .encode_to_vec()
}

/// Decodes a `TensorTicket`, refusing bytes that are not one, a ticket with
/// no payload and a zero-length chunk id.
pub fn decode_ticket(bytes: &[u8]) -> Result<TicketPayload, ProtoError> {
    let ticket = TensorTicket::decode(bytes).map_err(|source| ProtoError::Decode {
        what: "TensorTicket",
        source,
    })?;
    match ticket.payload {
        None => Err(ProtoError::EmptyTicket),
        Some(tensor_ticket::Payload::ChunkId(id)) if id.is_empty() => Err(ProtoError::EmptyChunkId),
        Some(tensor_ticket::Payload::ChunkId(id)) => Ok(TicketPayload::ChunkId(id)),
        Some(tensor_ticket::Payload::CatalogQuery(query)) => {
            Ok(TicketPayload::CatalogQuery(query.sql))
        }
        Some(tensor_ticket::Payload::RoiRead(read)) => Ok(TicketPayload::RoiRead(read)),
        Some(tensor_ticket::Payload::ChunkRef(_)) => Ok(TicketPayload::Other("chunk_ref")),
    }
}

/// Encodes `FlightRequest{tensor_read}`: a GetFlightInfo command.
pub fn flight_request(read: TensorReadOption) -> Vec<u8> {
    FlightRequest {
        request: Some(flight_request::Request::TensorRead(read)),
    }
    .encode_to_vec()
}

/// Decodes a GetFlightInfo command (`FlightRequest`) and returns its
/// `tensor_read`. A command without that arm, such as the older `FlightCmd`
/// envelope, is refused.
pub fn decode_flight_request(cmd: &[u8]) -> Result<TensorReadOption, ProtoError> {
    let request = FlightRequest::decode(cmd).map_err(|source| ProtoError::Decode {
        what: "FlightRequest",
        source,
    })?;
    match request.request {
        Some(flight_request::Request::TensorRead(read)) => Ok(read),
        None => Err(ProtoError::MissingTensorRead),
    }
}
