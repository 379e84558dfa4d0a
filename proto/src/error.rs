//! The one error type of this crate.

/// Why bytes or JSON received from the wire were refused.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// The bytes are not a valid protobuf encoding of the expected message.
    #[error("{what} bytes are not a valid protobuf message: {source}")]
    Decode {
        /// The message that was expected, e.g. `"TensorTicket"`.
        what: &'static str,
        /// What prost found wrong.
        #[source]
        source: prost::DecodeError,
    },
    /// A ticket decoded, but carries none of the `TensorTicket` payload arms.
    #[error(
        "ticket has no payload: a TensorTicket needs one of chunk_id, catalog_query, roi_read or chunk_ref"
    )]
    EmptyTicket,
    /// A ticket names a chunk with a zero-length id, which is never minted.
    #[error("ticket chunk_id is empty")]
    EmptyChunkId,
    /// A GetFlightInfo command without `FlightRequest.tensor_read`.
    #[error(
        "GetFlightInfo command has no tensor_read (FlightRequest field 11); \
         the older FlightCmd envelope (source_id = 1, tensor_read = 2) is not supported"
    )]
    MissingTensorRead,
    /// A `chunk_locate` reply says `available: true` but lacks a key.
    #[error("chunk_locate reply says available but has no '{0}' key")]
    IncompleteChunkLocation(&'static str),
    /// An action body could not be written or read as the expected JSON.
    #[error("{action} action body is not the expected JSON: {source}")]
    Json {
        /// The action whose body it is, e.g. `"health"`.
        action: &'static str,
        /// What serde_json found wrong.
        #[source]
        source: serde_json::Error,
    },
}
