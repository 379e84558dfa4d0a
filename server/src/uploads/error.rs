//! Why an upload call was refused or failed (`crate::error` gives each reason its gRPC
//! status).

use super::data::DataError;
use super::manifest::ManifestError;
use super::record::State;

/// An upload call's failure.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// The request is malformed or asks for something this server does not do.
    #[error("{call}: {reason}")]
    Invalid {
        /// The call (`add_tensor`, `DoPut`, `set_upload_status`, read).
        call: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// `add_tensor` of a name already taken (at any state, a discarded one until it frees).
    #[error(
        "add_tensor: '{array_id}' is already taken (it already exists as a {} upload); choose \
         another name, or discard it and wait for its name to free",
        state.name()
    )]
    Taken {
        /// The name.
        array_id: String,
        /// Its state.
        state: State,
    },
    /// The source an upload is added to is not served.
    #[error(
        "add_tensor: '{array_id}' names no served source '{source_id}'; a tensor is added to a \
         source the server serves, or to 'scratch' for a result that belongs to none"
    )]
    NoSource {
        /// The requested id.
        array_id: String,
        /// The source it names.
        source_id: String,
    },
    /// A transition or chunk for an id that is not an upload.
    #[error("{call}: '{array_id}' is not an upload in progress")]
    NotAnUpload {
        /// The call.
        call: &'static str,
        /// The id.
        array_id: String,
    },
    /// A write to an upload that takes no more chunks.
    #[error(
        "{call}: upload '{array_id}' is {} and takes no more chunks{}",
        state.name(),
        if detail.is_empty() { String::new() } else { format!(": {detail}") }
    )]
    Closed {
        /// The call.
        call: &'static str,
        /// The upload.
        array_id: String,
        /// READY (sealed) or DISCARDED.
        state: State,
        /// The discard's reason.
        detail: String,
    },
    /// A move down the ladder.
    #[error(
        "set_upload_status: '{array_id}' is {} and cannot move back to {}{}",
        from.name(),
        to.name(),
        if *to == State::Pending {
            " (PENDING is not a state an upload is moved to: every upload starts there)"
        } else {
            ""
        }
    )]
    Backwards {
        /// The upload.
        array_id: String,
        /// Its state.
        from: State,
        /// The refused target.
        to: State,
    },
    /// A read of an upload that is not readable.
    #[error(
        "upload '{array_id}' is {} and not readable{}",
        state.name(),
        if *state == State::Pending {
            " yet: set it READY with set_upload_status first".to_string()
        } else if detail.is_empty() {
            String::new()
        } else {
            format!(": {}", clip(detail))
        }
    )]
    NotReadable {
        /// The upload.
        array_id: String,
        /// Its state.
        state: State,
        /// Why it was discarded (`expired: …` when its lifetime ran out).
        detail: String,
    },
    /// The upload has used up its bytes.
    #[error(
        "DoPut: upload '{array_id}' holds {stored} bytes and this chunk of {chunk} would pass its \
         limit of {limit} bytes (twice its size): too many chunks sent again"
    )]
    OverLimit {
        /// The upload.
        array_id: String,
        /// Bytes stored.
        stored: u64,
        /// The chunk's bytes.
        chunk: u64,
        /// The limit.
        limit: u64,
    },
    /// `add_tensor` of a grid with more cells than an upload may have.
    #[error(
        "add_tensor: the grid of '{array_id}' (shape {shape:?} in chunks of {chunk_shape:?}) \
         has {cells} cells, over the limit of {limit} cells per upload: declare a larger \
         chunk_shape, or raise the limit (--max-upload-cells, TESSERA_MAX_UPLOAD_CELLS, \
         max_upload_cells)"
    )]
    TooManyCells {
        /// The requested id.
        array_id: String,
        /// The declared shape.
        shape: Vec<u64>,
        /// The grid's chunk shape.
        chunk_shape: Vec<u64>,
        /// Its cells.
        cells: u64,
        /// The limit.
        limit: u64,
    },
    /// A chunk DoPut found no room among the bytes of chunks in flight.
    #[error(
        "DoPut: a chunk of '{array_id}' of up to {chunk} bytes {}: {scope} holds at most {limit} \
         bytes of chunks being received at once ({setting})",
        match waited {
            Some(wait) => format!("found no room within {} s; send it again later", wait.as_secs()),
            None => "can never fit".to_string(),
        }
    )]
    InFlight {
        /// The upload.
        array_id: String,
        /// The bytes the chunk may take.
        chunk: u64,
        /// Whose limit (`the server`, `one upload`).
        scope: &'static str,
        /// The limit.
        limit: u64,
        /// The setting that changes it.
        setting: &'static str,
        /// How long the DoPut waited for room; `None`: the chunk is over the whole limit.
        waited: Option<std::time::Duration>,
    },
    /// `add_tensor` with the server already holding its limit of uploads.
    #[error(
        "add_tensor: the server holds {held} uploads, its limit (upload_max_count, \
         --upload-max-count, TESSERA_UPLOAD_MAX_COUNT); discard uploads no longer needed (a \
         discarded one counts until its name frees, at most an hour) or raise the limit"
    )]
    TooMany {
        /// Uploads held.
        held: usize,
        /// The limit.
        limit: usize,
    },
    /// A discard reason over [`super::MAX_REASON_BYTES`].
    #[error(
        "set_upload_status: the reason is {len} bytes, over the limit of {} bytes a discard \
         reason may have; '{array_id}' is unchanged",
        super::MAX_REASON_BYTES
    )]
    ReasonTooLong {
        /// The upload.
        array_id: String,
        /// Its state (unchanged).
        state: State,
        /// The reason's length.
        len: usize,
    },
    /// The manifest failed.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The bytes could not be stored or read.
    #[error("upload '{array_id}': {source}")]
    Data {
        /// The upload.
        array_id: String,
        /// The cause.
        #[source]
        source: DataError,
    },
    /// A filesystem call on the uploads directory failed.
    #[error("uploads directory: cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// To what.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// `text` cut to at most [`super::MAX_REASON_BYTES`] (at a character boundary): a discard
/// reason stored before the limit existed still fits a refusal's metadata.
fn clip(text: &str) -> &str {
    let mut end = text.len().min(super::MAX_REASON_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl UploadError {
    /// A discard reason as a refusal carries it: cut to at most
    /// [`super::MAX_REASON_BYTES`], at a character boundary.
    pub(crate) fn clip_reason(detail: &str) -> &str {
        clip(detail)
    }

    pub(crate) fn invalid(call: &'static str, reason: impl Into<String>) -> UploadError {
        UploadError::Invalid {
            call,
            reason: reason.into(),
        }
    }
}
