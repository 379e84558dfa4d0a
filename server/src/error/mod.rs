//! The one error type of the Flight service and its mapping to gRPC status, written once.
//!
//! Every layer refuses or fails with an error of its own, keeping its cause
//! (`#[source]`): the wire's own refusals ([`RequestError`], [`NotServed`]), the token
//! check ([`TokenError`]), the wire's server faults ([`Fault`]), the catalog
//! ([`CatalogError`]), annotations ([`RoiError`]), uploads ([`UploadError`]), runtime
//! sources ([`RuntimeError`]), the chunk layer ([`ChunkError`]), a source's held chunks
//! ([`SourceError`]) and what the server cannot do now ([`Unavailable`]). [`ServiceError`]
//! wraps them, and [`ServiceError::classify`]
//! is the one exhaustive `match` that gives each its gRPC code, Arrow detail and
//! `extra_info`; the message is the wrapped error's own text.
//!
//! Python clients turn gRPC codes into exception classes (see
//! `docs/reference/biopb-protocol.md` §6): only UNKNOWN, UNAVAILABLE,
//! UNAUTHENTICATED and INTERNAL become `flight.FlightError` subclasses that the
//! biopb client's recovery paths catch. So NOT_FOUND and INVALID_ARGUMENT never
//! travel as bare codes: they ride inside Arrow's `x-arrow-status*` trailers as
//! the `extra_info` JSON `{"code": …, "reason": …}` of an UNKNOWN status, which
//! the biopb client turns into `ValueError`. Two kinds are sent otherwise because the
//! client expects them so: a write to a closed upload ([`UploadError::Closed`], and
//! [`UploadError::ReasonTooLong`]) as CANCELLED (`UploadRefused`), and
//! [`ServiceError::Value`] as a bare INVALID_ARGUMENT (`ArrowInvalid`).
//!
//! Sources that are not `Clone` are held in an `Arc`: one decode's failure is shared by
//! every request waiting on it.

pub mod refusal;
mod token;
mod unavailable;

pub use refusal::{NotServed, RequestError};
pub use token::TokenError;
pub use unavailable::{NoAnnotations, Unavailable};

use std::sync::Arc;

use arrow_flight::error::FlightError;
use arrow_schema::ArrowError;
use bytes::Bytes;
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

use crate::catalog::CatalogError;
use crate::chunks::ChunkError;
use crate::grid::chunk_id::ChunkIdError;
use crate::rois::RoiError;
use crate::rois::db::RoiDbError;
use crate::source::runtime::RuntimeError;
use crate::source::sources::LookupError;
use crate::source::{SourceError, SourceErrorKind};
use crate::uploads::{State, UploadError};

/// Everything a Flight call can fail with.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ServiceError {
    /// The call carried no token or the wrong one.
    #[error(transparent)]
    Unauthenticated(#[from] TokenError),
    /// The array id did not resolve to a served tensor (no such source or field, or a source
    /// refused or unreadable now).
    #[error(transparent)]
    Lookup(#[from] LookupError),
    /// The wire refused the request for its arguments (bad body, slice, ticket, size).
    #[error(transparent)]
    Request(#[from] RequestError),
    /// A well-formed request for something this server does not offer (an action, a ticket
    /// kind, DoExchange).
    #[error(transparent)]
    NotServed(#[from] NotServed),
    /// A catalog SQL query failed or was refused.
    #[error("Catalog query failed: {0}")]
    Catalog(#[source] Arc<CatalogError>),
    /// An annotation call failed or was refused.
    #[error("{}", roi_message(.0))]
    Roi(#[source] Arc<RoiError>),
    /// An upload call failed or was refused.
    #[error("{}", upload_message(.0))]
    Upload(#[source] Arc<UploadError>),
    /// `add_source` or `remove_source` was refused as a whole.
    #[error(transparent)]
    Runtime(Arc<RuntimeError>),
    /// A failure of the wire itself: encoding a reply, a task that died.
    #[error(transparent)]
    Fault(#[from] Fault),
    /// A chunk could not be made or read (its class depends on why: see
    /// [`ServiceError::classify`]).
    #[error(transparent)]
    Chunk(#[from] ChunkError),
    /// A source that holds its chunks (an upload) could not locate or read one.
    #[error(transparent)]
    Source(Arc<SourceError>),
    /// The server cannot answer now for a reason of its own (no state directory, no
    /// annotation store).
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// An addressing or argument refusal of a call whose client code converts no Flight
    /// error (the `resolve` action: `resolve_source`), which users must still meet as
    /// `ValueError`, as on reads: sent as a bare INVALID_ARGUMENT (no Arrow trailers, no
    /// details), which pyarrow raises as `ArrowInvalid`, a `ValueError` (docs/decisions/0016).
    #[error("{0}")]
    Value(Box<ServiceError>),
}

/// A server-side failure of the wire itself; the call fails as INTERNAL.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Fault {
    /// A reply could not be encoded as Arrow.
    #[error("encoding {what}: {source}")]
    Encode {
        /// What was being encoded (`the plan schema`, `a catalog row`, …).
        what: String,
        /// Arrow's error.
        #[source]
        source: Arc<ArrowError>,
    },
    /// A reply stream could not be encoded as Flight data.
    #[error("encoding {what}: {source}")]
    EncodeStream {
        /// What was being encoded (`a catalog answer`, `annotations`).
        what: &'static str,
        /// The encoder's error.
        #[source]
        source: Arc<FlightError>,
    },
    /// A JSON action reply could not be encoded.
    #[error("encoding JSON reply: {0}")]
    Json(#[source] Arc<serde_json::Error>),
    /// A blocking task ended without its answer (it panicked or was cancelled).
    #[error("{what}: {source}")]
    Task {
        /// What the task was doing (`annotation task failed`, `storing an upload chunk`).
        what: &'static str,
        /// Why it ended.
        #[source]
        source: Arc<tokio::task::JoinError>,
    },
    /// A plan's chunk id could not be built.
    #[error("minting a chunk id: {0}")]
    ChunkId(#[source] ChunkIdError),
    /// A source that held its chunks (an upload) holds them no longer.
    #[error("the source of '{array_id}' no longer holds its chunks")]
    HeldChunksGone {
        /// The tensor.
        array_id: String,
    },
    /// The `sources` row of a source could not be built.
    #[error("building the row of '{source_id}': {source}")]
    SourceRow {
        /// The source.
        source_id: String,
        /// Arrow's error.
        #[source]
        source: Arc<ArrowError>,
    },
    /// A DoGet reached the Flight service without passing the chunk route.
    #[error("DoGet reached the Flight service without the chunk route that decodes its ticket")]
    NoChunkRoute,
}

impl Fault {
    /// `source` met while encoding `what` as Arrow.
    pub fn encode(what: impl Into<String>, source: ArrowError) -> Fault {
        Fault::Encode {
            what: what.into(),
            source: Arc::new(source),
        }
    }

    /// `source` met while encoding `what` as a Flight stream.
    pub fn encode_stream(what: &'static str, source: FlightError) -> Fault {
        Fault::EncodeStream {
            what,
            source: Arc::new(source),
        }
    }

    /// A task doing `what` that ended without its answer.
    pub fn task(what: &'static str, source: tokio::task::JoinError) -> Fault {
        Fault::Task {
            what,
            source: Arc::new(source),
        }
    }
}

impl From<SourceError> for ServiceError {
    fn from(err: SourceError) -> Self {
        ServiceError::Source(Arc::new(err))
    }
}

impl From<CatalogError> for ServiceError {
    fn from(err: CatalogError) -> Self {
        ServiceError::Catalog(Arc::new(err))
    }
}

impl From<RoiError> for ServiceError {
    fn from(err: RoiError) -> Self {
        ServiceError::Roi(Arc::new(err))
    }
}

impl From<UploadError> for ServiceError {
    fn from(err: UploadError) -> Self {
        ServiceError::Upload(Arc::new(err))
    }
}

impl From<RuntimeError> for ServiceError {
    fn from(err: RuntimeError) -> Self {
        ServiceError::Runtime(Arc::new(err))
    }
}

/// The text of an annotation failure: a full disk says what to do.
fn roi_message(err: &RoiError) -> String {
    match err {
        RoiError::Db(e) if e.is_disk_full() => format!(
            "{e}: the state directory's filesystem is full; nothing was changed, try again once \
             there is room"
        ),
        other => other.to_string(),
    }
}

/// The text of an upload failure: a full disk says what to do.
fn upload_message(err: &UploadError) -> String {
    match err {
        UploadError::Manifest(source) if source.is_disk_full() => format!(
            "{err}: the state directory's filesystem is full; nothing was recorded, try again \
             once there is room"
        ),
        UploadError::Data { source, .. } if source.is_disk_full() => format!(
            "{err}: the state directory's filesystem is full; nothing was stored, send the chunk \
             again once there is room"
        ),
        other => other.to_string(),
    }
}

/// How one error travels: the gRPC code, the Arrow Flight detail name, and the optional
/// `extra_info` JSON.
type Class = (Code, &'static str, Option<Bytes>);

/// What the biopb client puts in `extra_info` to classify an addressing error.
fn extra_info(code: &str, reason: &str) -> Bytes {
    Bytes::from(serde_json::json!({ "code": code, "reason": reason }).to_string())
}

/// A refusal for the request's arguments: UNKNOWN with `extra_info` `INVALID_ARGUMENT`,
/// which the biopb client raises as `ValueError`.
fn bad_request() -> Class {
    (
        Code::Unknown,
        "Failed",
        Some(extra_info("INVALID_ARGUMENT", "bad_request")),
    )
}

/// Something not there: UNKNOWN with `extra_info` `NOT_FOUND` and `reason`.
fn not_found(reason: &str) -> Class {
    (
        Code::Unknown,
        "Failed",
        Some(extra_info("NOT_FOUND", reason)),
    )
}

/// A write to an upload that takes no more: CANCELLED with the `extra_info` JSON
/// `{reason, state, source_id, detail}`, which the biopb client raises as `UploadRefused`.
fn upload_refused(reason: &str, state: State, array_id: &str, detail: &str) -> Class {
    let info = serde_json::json!({
        "reason": reason,
        "state": state.name(),
        "source_id": array_id,
        "detail": detail,
    });
    (
        Code::Cancelled,
        "Cancelled",
        Some(Bytes::from(info.to_string())),
    )
}

const FAILED: Class = (Code::Unknown, "Failed", None);
const UNAUTHENTICATED: Class = (Code::Unauthenticated, "Unauthenticated", None);
const UNAVAILABLE: Class = (Code::Unavailable, "Unavailable", None);
const INTERNAL: Class = (Code::Internal, "Internal", None);

impl ServiceError {
    /// How this error travels: the one mapping of every failure to its gRPC status.
    fn classify(&self) -> Class {
        match self {
            Self::Value(inner) => (Code::InvalidArgument, "Invalid", inner.classify().2),
            Self::Unauthenticated(_) => UNAUTHENTICATED,
            Self::Lookup(err) => match err {
                LookupError::UnknownSource(_) => not_found("unknown_source"),
                LookupError::UnknownField { .. } => not_found("unknown_field"),
                LookupError::NoTensorsYet(_) => not_found("no_tensors"),
                LookupError::Refused(_) => bad_request(),
                LookupError::Unavailable(_) => UNAVAILABLE,
            },
            Self::Request(RequestError::TicketStale { .. }) => not_found("stale_chunk"),
            Self::Request(_) => bad_request(),
            Self::NotServed(_) | Self::Catalog(_) => FAILED,
            Self::Chunk(err) => match err {
                ChunkError::SizeOverflow => bad_request(),
                ChunkError::SourceChanged { .. } => not_found("stale_chunk"),
                ChunkError::SourceBusy { .. }
                | ChunkError::SourceUnreachable { .. }
                | ChunkError::Abandoned { .. }
                | ChunkError::OverBudget { .. }
                | ChunkError::ShuttingDown => UNAVAILABLE,
                ChunkError::SourceRead { .. }
                | ChunkError::SourceShort { .. }
                | ChunkError::Reduce { .. }
                | ChunkError::DecodeTask { .. }
                | ChunkError::StoredUnreadable { .. }
                | ChunkError::Encode { .. }
                | ChunkError::Schema { .. }
                | ChunkError::StoreRead { .. } => INTERNAL,
            },
            Self::Source(err) => match err.kind() {
                SourceErrorKind::Changed => not_found("stale_chunk"),
                SourceErrorKind::Busy | SourceErrorKind::Unreachable => UNAVAILABLE,
                SourceErrorKind::Refused => bad_request(),
                SourceErrorKind::Failed => INTERNAL,
            },
            Self::Runtime(err) => match &**err {
                RuntimeError::Disabled => FAILED,
                _ => bad_request(),
            },
            Self::Roi(err) => match &**err {
                RoiError::Refused(_) | RoiError::Db(RoiDbError::Cap { .. }) => bad_request(),
                RoiError::Grant(_) => UNAUTHENTICATED,
                RoiError::Db(e) if e.is_disk_full() => UNAVAILABLE,
                RoiError::Db(_) | RoiError::Key(_) => INTERNAL,
            },
            Self::Upload(err) => match &**err {
                UploadError::Closed {
                    array_id,
                    state,
                    detail,
                    ..
                } => {
                    let reason = if *state == State::Ready {
                        "upload_sealed"
                    } else {
                        "upload_discarded"
                    };
                    upload_refused(reason, *state, array_id, UploadError::clip_reason(detail))
                }
                UploadError::ReasonTooLong {
                    array_id, state, ..
                } => upload_refused("upload_refused", *state, array_id, &err.to_string()),
                UploadError::Invalid { .. }
                | UploadError::Taken { .. }
                | UploadError::NoSource { .. }
                | UploadError::NotAnUpload { .. }
                | UploadError::Backwards { .. }
                | UploadError::NotReadable { .. }
                | UploadError::OverLimit { .. }
                | UploadError::TooManyCells { .. }
                | UploadError::TooMany { .. }
                | UploadError::InFlight { waited: None, .. } => bad_request(),
                UploadError::InFlight { .. } => UNAVAILABLE,
                UploadError::Manifest(source) if source.is_disk_full() => UNAVAILABLE,
                UploadError::Data { source, .. } if source.is_disk_full() => UNAVAILABLE,
                UploadError::Manifest(_) | UploadError::Data { .. } | UploadError::Io { .. } => {
                    INTERNAL
                }
            },
            Self::Unavailable(_) => UNAVAILABLE,
            Self::Fault(_) => INTERNAL,
        }
    }

    /// Whether the failure is the server's fault (logged at error level) or the caller's.
    fn is_server_fault(&self) -> bool {
        self.classify().0 == Code::Internal
    }

    /// This refusal as one the client raises as `ValueError` (see [`ServiceError::Value`]);
    /// server faults and unavailability keep their own class.
    pub fn into_value_error(self) -> ServiceError {
        match self {
            Self::Lookup(
                LookupError::UnknownSource(_)
                | LookupError::UnknownField { .. }
                | LookupError::NoTensorsYet(_)
                | LookupError::Refused(_),
            )
            | Self::Request(_)
            | Self::Chunk(ChunkError::SizeOverflow | ChunkError::SourceChanged { .. }) => {
                Self::Value(Box::new(self))
            }
            Self::Source(ref err)
                if matches!(
                    err.kind(),
                    SourceErrorKind::Changed | SourceErrorKind::Refused
                ) =>
            {
                Self::Value(Box::new(self))
            }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use datafusion::common::DataFusionError;

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
        let status = Status::from(
            ServiceError::from(LookupError::UnknownSource("nope".to_string())).into_value_error(),
        );
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("'nope'"), "{}", status.message());
        assert!(status.metadata().get("x-arrow-status").is_none());
        assert!(status.details().is_empty());
        // Server faults keep their own class.
        let internal = ServiceError::from(Fault::NoChunkRoute).into_value_error();
        assert_eq!(Status::from(internal).code(), Code::Internal);
    }

    #[test]
    fn lower_errors_keep_their_text_and_travel_with_their_class() {
        let status = Status::from(ServiceError::from(RequestError::PathLength { len: 2 }));
        assert_eq!(status.code(), Code::Unknown);
        assert!(
            status.message().starts_with(
                "a path descriptor must hold exactly one array id, this one holds 2. Detail: Failed"
            ),
            "{}",
            status.message()
        );
        assert!(String::from_utf8_lossy(status.details()).contains("bad_request"));

        let sealed = ServiceError::from(UploadError::Closed {
            call: "DoPut",
            array_id: "s/@fields/x".to_string(),
            state: State::Ready,
            detail: String::new(),
        });
        let status = Status::from(sealed);
        assert_eq!(status.code(), Code::Cancelled);
        assert!(String::from_utf8_lossy(status.details()).contains("upload_sealed"));

        let off = Status::from(ServiceError::from(RuntimeError::Disabled));
        assert_eq!(off.code(), Code::Unknown);
        assert!(off.details().is_empty());
        assert!(
            off.message().contains("add_source_roots"),
            "{}",
            off.message()
        );
    }

    #[test]
    fn typed_causes_keep_their_text_and_their_class() {
        let stale = Status::from(ServiceError::from(RequestError::TicketStale {
            array_id: "a".to_string(),
        }));
        assert_eq!(stale.code(), Code::Unknown);
        assert!(String::from_utf8_lossy(stale.details()).contains("stale_chunk"));
        assert!(
            stale.message().starts_with(
                "chunk of 'a' was planned against another version of the source; plan the read again"
            ),
            "{}",
            stale.message()
        );

        let closing = Status::from(ServiceError::from(ChunkError::ShuttingDown));
        assert_eq!(closing.code(), Code::Unavailable);
        let overflow = ServiceError::from(ChunkError::SizeOverflow).into_value_error();
        assert_eq!(Status::from(overflow).code(), Code::InvalidArgument);

        let held = ServiceError::from(SourceError::new(SourceErrorKind::Busy, "being written"));
        assert_eq!(Status::from(held).code(), Code::Unavailable);

        let read_only = Status::from(ServiceError::from(NotServed::ReadOnly {
            call: "add_tensor".to_string(),
        }));
        assert_eq!(read_only.code(), Code::Unknown);
        assert!(read_only.details().is_empty());
        assert!(
            read_only.message().contains("--writable"),
            "{}",
            read_only.message()
        );

        let none = ServiceError::from(Unavailable::Annotations(Arc::new(
            NoAnnotations::NoStateDir,
        )));
        assert!(std::error::Error::source(&none).is_some());
        let none = Status::from(none);
        assert_eq!(none.code(), Code::Unavailable);
        assert!(
            none.message()
                .starts_with("ROI annotations are unavailable: this server has no state directory"),
            "{}",
            none.message()
        );
    }

    #[test]
    fn the_worst_case_status_fits_a_16_kib_header_list() {
        for text in [
            "%".repeat(1 << 20),
            "\u{e9}".repeat(1 << 19),
            "y".repeat(1 << 20),
        ] {
            let refused = DataFusionError::Plan(text);
            let status = Status::from(ServiceError::from(CatalogError::from(refused)));
            let size = header_list_size(&status);
            assert!(size < 12 << 10, "{size} bytes of headers");
        }
    }
}
