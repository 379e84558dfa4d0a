//! The one error type of the Flight service and its exhaustive mapping to gRPC status.
//!
//! Python clients turn gRPC codes into exception classes (see
//! `docs/reference/biopb-protocol.md` §6): only UNKNOWN, UNAVAILABLE,
//! UNAUTHENTICATED and INTERNAL become `flight.FlightError` subclasses that the
//! biopb client's recovery paths catch. So NOT_FOUND and INVALID_ARGUMENT never
//! travel as bare codes: they ride inside Arrow's `x-arrow-status*` trailers as
//! the `extra_info` JSON `{"code": …, "reason": …}` of an UNKNOWN status, which
//! the biopb client turns into `ValueError`. Two variants are sent otherwise because the
//! client expects them so: [`ServiceError::UploadClosed`] as CANCELLED (`UploadRefused`)
//! and [`ServiceError::Value`] as a bare INVALID_ARGUMENT (`ArrowInvalid`).

use bytes::Bytes;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

use crate::chunks::ChunkError;

/// Everything a Flight call can fail with.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ServiceError {
    /// The call carried no token or the wrong one.
    #[error("{0}")]
    Unauthenticated(String),
    /// The requested array id names no source.
    #[error("unknown array id '{0}': no such source")]
    UnknownSource(String),
    /// The source exists but the field after `/` does not.
    #[error("unknown array id '{array_id}': source '{source_id}' has no tensor '{field}'")]
    UnknownField {
        /// The id as requested.
        array_id: String,
        /// The source part of the id.
        source_id: String,
        /// The field part of the id.
        field: String,
    },
    /// The request was malformed or asked for something impossible (bad slice, bad ticket).
    #[error("{0}")]
    InvalidArgument(String),
    /// A chunk ticket that was valid once, but its source changed since the plan.
    #[error("{0}")]
    Stale(String),
    /// An action name this server does not know. The text must contain
    /// `Unknown action` so clients stop probing.
    #[error("Unknown action: {0}")]
    UnknownAction(String),
    /// A well-formed request for something this server does not offer.
    #[error("{0}")]
    Unsupported(String),
    /// A catalog SQL query failed or was refused.
    #[error("Catalog query failed: {0}")]
    Catalog(String),
    /// The server cannot answer now (shutting down, overloaded, source deleted).
    #[error("{0}")]
    Unavailable(String),
    /// A server-side failure: I/O error, broken cache, bug.
    #[error("{0}")]
    Internal(String),
    /// A write to an upload that takes no more chunks (sealed by READY, or DISCARDED).
    /// Travels as CANCELLED with the `extra_info` JSON `{reason, state, source_id, detail}`
    /// (`reason` is `upload_sealed` or `upload_discarded`), which the biopb client raises as
    /// `UploadRefused`.
    #[error("{message}")]
    UploadClosed {
        /// The whole message.
        message: String,
        /// The upload.
        array_id: String,
        /// `READY` or `DISCARDED` (`PENDING` too for a refused transition).
        state: &'static str,
        /// The `extra_info` reason: `upload_sealed`, `upload_discarded`, or
        /// `upload_refused` for a transition refused for its arguments (a reason over its
        /// limit).
        code: &'static str,
        /// The discard's reason; empty for a sealed upload.
        detail: String,
    },
    /// An addressing or argument refusal of a call whose client code converts no Flight
    /// error (the `resolve` action: `resolve_source`), which users must still meet as
    /// `ValueError`, as on reads: sent as a bare INVALID_ARGUMENT (no Arrow trailers, no
    /// details), which pyarrow raises as `ArrowInvalid`, a `ValueError` (docs/decisions/0016).
    #[error("{0}")]
    Value(Box<ServiceError>),
}

/// What the biopb client puts in `extra_info` to classify an addressing error.
fn extra_info(code: &str, reason: &str) -> Bytes {
    Bytes::from(serde_json::json!({ "code": code, "reason": reason }).to_string())
}

impl ServiceError {
    /// The gRPC code, the Arrow Flight detail name and the optional `extra_info` JSON.
    fn classify(&self) -> (Code, &'static str, Option<Bytes>) {
        match self {
            Self::Value(inner) => (Code::InvalidArgument, "Invalid", inner.classify().2),
            Self::Unauthenticated(_) => (Code::Unauthenticated, "Unauthenticated", None),
            Self::UnknownSource(_) => (
                Code::Unknown,
                "Failed",
                Some(extra_info("NOT_FOUND", "unknown_source")),
            ),
            Self::UnknownField { .. } => (
                Code::Unknown,
                "Failed",
                Some(extra_info("NOT_FOUND", "unknown_field")),
            ),
            Self::InvalidArgument(_) => (
                Code::Unknown,
                "Failed",
                Some(extra_info("INVALID_ARGUMENT", "bad_request")),
            ),
            Self::Stale(_) => (
                Code::Unknown,
                "Failed",
                Some(extra_info("NOT_FOUND", "stale_chunk")),
            ),
            Self::UnknownAction(_) | Self::Unsupported(_) | Self::Catalog(_) => {
                (Code::Unknown, "Failed", None)
            }
            Self::UploadClosed {
                array_id,
                state,
                code,
                detail,
                ..
            } => (
                Code::Cancelled,
                "Cancelled",
                Some(Bytes::from(
                    serde_json::json!({
                        "reason": code,
                        "state": state,
                        "source_id": array_id,
                        "detail": detail,
                    })
                    .to_string(),
                )),
            ),
            Self::Unavailable(_) => (Code::Unavailable, "Unavailable", None),
            Self::Internal(_) => (Code::Internal, "Internal", None),
        }
    }

    /// Whether the failure is the server's fault (logged at error level) or the caller's.
    fn is_server_fault(&self) -> bool {
        match self {
            Self::Value(inner) => inner.is_server_fault(),
            other => matches!(other, Self::Internal(_)),
        }
    }

    /// This refusal as one the client raises as `ValueError` (see [`ServiceError::Value`]);
    /// server faults and unavailability keep their own class.
    pub fn as_value_error(self) -> ServiceError {
        match self {
            Self::UnknownSource(_)
            | Self::UnknownField { .. }
            | Self::InvalidArgument(_)
            | Self::Stale(_) => Self::Value(Box::new(self)),
            other => other,
        }
    }
}

impl From<ServiceError> for Status {
    fn from(err: ServiceError) -> Status {
        let message = bounded(err.to_string());
        // The one log line per failed call (with its method) is written by
        // `metrics::Metered`, which sees every status, the token check's included.
        tracing::debug!(error = %message, server_fault = err.is_server_fault(), "call failed");
        let (code, detail, info) = err.classify();
        if let ServiceError::Value(_) = err {
            // No Arrow trailers and no details: pyarrow then raises the bare code's
            // class, `ArrowInvalid` (a `ValueError`) for INVALID_ARGUMENT.
            return Status::new(code, message);
        }
        let mut metadata = MetadataMap::new();
        // Arrow's own trailers: with them pyarrow keeps `extra_info` and the exact
        // exception class; without them it drops grpc-status-details-bin.
        // "5" is arrow::StatusCode::IOError, the code Flight statuses travel under.
        metadata.insert("x-arrow-status", MetadataValue::from_static("5"));
        metadata.insert_bin(
            "x-arrow-status-message-bin",
            MetadataValue::from_bytes(message.as_bytes()),
        );
        metadata.insert_bin(
            "x-arrow-status-detail-bin",
            MetadataValue::from_bytes(detail.as_bytes()),
        );
        let text = format!("{message}. Detail: {detail}");
        match info {
            Some(details) => Status::with_details_and_metadata(code, text, details, metadata),
            None => Status::with_metadata(code, text, metadata),
        }
    }
}

/// Longest error text sent back. Messages quote what the client sent (an array id, SQL);
/// a huge request must not become a huge status, which travels twice in HTTP/2 headers
/// (`grpc-message`, percent-encoded: up to 3 bytes per byte, and the base64
/// `x-arrow-status-message-bin`: 4 per 3) and which clients refuse beyond their header-list
/// limit (16 KiB for tonic/hyper: the call then fails as INTERNAL "h2 protocol error").
/// 2 KiB keeps the worst case near 9 KiB; 4 KiB of `%` or non-ASCII text exceeded 16 KiB.
const MAX_MESSAGE_BYTES: usize = 2 << 10;

/// `message`, cut to [`MAX_MESSAGE_BYTES`] on a character boundary, saying how much was cut.
fn bounded(mut message: String) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    let total = message.len();
    let mut cut = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    message.truncate(cut);
    message.push_str(&format!("… ({} more bytes cut)", total - cut));
    message
}

/// Shorthand for results of the service.
pub type ServiceResult<T> = Result<T, ServiceError>;

/// The chunk layer's failures on the wire: the source's state and the server's limits are
/// the caller's to act on (plan again, retry), the rest are the server's faults.
impl From<ChunkError> for ServiceError {
    fn from(err: ChunkError) -> Self {
        let message = err.to_string();
        match err {
            ChunkError::SizeOverflow => Self::InvalidArgument(message),
            ChunkError::SourceChanged { .. } => Self::Stale(message),
            ChunkError::SourceBusy { .. }
            | ChunkError::Abandoned { .. }
            | ChunkError::OverBudget { .. }
            | ChunkError::ShuttingDown => Self::Unavailable(message),
            ChunkError::SourceRead { .. }
            | ChunkError::SourceShort { .. }
            | ChunkError::Reduce { .. }
            | ChunkError::DecodeTask { .. }
            | ChunkError::StoredUnreadable { .. }
            | ChunkError::Encode { .. }
            | ChunkError::Schema { .. }
            | ChunkError::StoreRead { .. } => Self::Internal(message),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Bytes of the status's headers as HTTP/2 counts them against a peer's header-list
    /// limit (name + value + 32 per field).
    fn header_list_size(status: &Status) -> usize {
        let mut headers = tonic::codegen::http::HeaderMap::new();
        status.add_header(&mut headers).unwrap();
        headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 32)
            .sum()
    }

    #[test]
    fn value_refusals_are_bare_invalid_argument_with_the_message() {
        let status = Status::from(ServiceError::UnknownSource("nope".to_string()).as_value_error());
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("'nope'"), "{}", status.message());
        assert!(status.metadata().get("x-arrow-status").is_none());
        assert!(status.details().is_empty());
        // Server faults keep their own class.
        let internal = ServiceError::Internal("disk".to_string()).as_value_error();
        assert_eq!(Status::from(internal).code(), Code::Internal);
    }

    #[test]
    fn the_worst_case_status_fits_a_16_kib_header_list() {
        for text in [
            "%".repeat(1 << 20),
            "\u{e9}".repeat(1 << 19),
            "y".repeat(1 << 20),
        ] {
            let status = Status::from(ServiceError::Catalog(text));
            let size = header_list_size(&status);
            assert!(size < 12 << 10, "{size} bytes of headers");
        }
    }
}
