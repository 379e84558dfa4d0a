//! Why a chunk could not be decoded, kept or read back: the chunk layer's refusals and
//! failures, each keeping its cause. The wire turns them into statuses in one place
//! (`From<ChunkError> for ServiceError`, `crate::error`).

use std::sync::Arc;

use tessera_segments::StoreError;
use tessera_segments::ipc::EncodeError;
use tokio::task::JoinError;

use super::reduce::ReduceError;
use crate::source::{SourceError, SourceErrorKind};

/// Everything the chunk service can fail with.
///
/// One decode's failure is handed to every caller of its single flight, so the error is
/// cloned: causes that cannot be cloned are shared behind an `Arc`.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ChunkError {
    /// The chunk's byte count does not fit the machine's address range.
    #[error("chunk size overflows")]
    SizeOverflow,
    /// The source is no longer the content version the chunk was planned on.
    #[error(
        "source '{source_id}' changed on disk since this chunk was planned ({source}); plan the read again"
    )]
    SourceChanged {
        /// The source read.
        source_id: String,
        /// What changed.
        #[source]
        source: Arc<SourceError>,
    },
    /// The source is being written (a writer holds it, or it was touched within the settle
    /// window too long).
    #[error(
        "source '{source_id}' is being written, so its chunks are not served until the write is done ({source}); retry"
    )]
    SourceBusy {
        /// The source read.
        source_id: String,
        /// Who writes it, or how long it kept changing.
        #[source]
        source: Arc<SourceError>,
    },
    /// The source's bytes live on a server that cannot be reached now (an upstream).
    #[error(
        "source '{source_id}' cannot be read now: {source}; chunks already cached are still served"
    )]
    SourceUnreachable {
        /// The source read.
        source_id: String,
        /// Which server, and what the call got.
        #[source]
        source: Arc<SourceError>,
    },
    /// Reading the source failed otherwise (I/O error, bad region).
    #[error("reading source '{source_id}': {source}")]
    SourceRead {
        /// The source read.
        source_id: String,
        /// The read's failure.
        #[source]
        source: Arc<SourceError>,
    },
    /// The source ended inside the chunk's byte range during a file-to-file copy, while
    /// its size still looks as planned.
    #[error("source '{source_id}' ended before the chunk's bytes while its size looks unchanged")]
    SourceShort {
        /// The source copied from.
        source_id: String,
        /// The store's account of the short copy.
        #[source]
        source: Arc<StoreError>,
    },
    /// Computing a scaled chunk failed (a method that cannot reduce the dtype, a bug).
    #[error("reducing a chunk of '{source_id}': {source}")]
    Reduce {
        /// The source reduced.
        source_id: String,
        /// The reduction's failure.
        #[source]
        source: Arc<ReduceError>,
    },
    /// A scaled chunk's computation stopped because nobody waits for it any more.
    #[error("the scaled chunk of '{array_id}' was abandoned: its callers are gone")]
    Abandoned {
        /// The tensor of the chunk.
        array_id: String,
    },
    /// A scaled chunk alone needs more memory than all scaled decodes together may hold.
    #[error(
        "a scaled chunk of '{array_id}' needs {} MiB of server memory to compute, more than the \
         server's whole scaled-decode budget of {} MiB (--max-scaled-decode-memory, \
         TESSERA_MAX_SCALED_DECODE_MEMORY, max_scaled_decode_memory); raise it, or \
         read with a smaller chunk target",
        .needed.div_ceil(1 << 20),
        .max >> 20
    )]
    OverBudget {
        /// The tensor of the chunk.
        array_id: String,
        /// Bytes its computation may hold.
        needed: u64,
        /// The scaled-decode budget in bytes.
        max: u64,
    },
    /// The decode permits or the scaled-decode budget were closed: the server is stopping.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The blocking task that decodes a chunk panicked or was cancelled.
    #[error("chunk decode task failed: {source}")]
    DecodeTask {
        /// How the task ended.
        #[source]
        source: Arc<JoinError>,
    },
    /// The store took the chunk but does not hold it when it is read back.
    #[error("chunk of '{array_id}' was stored but cannot be read back")]
    StoredUnreadable {
        /// The tensor of the chunk.
        array_id: String,
    },
    /// A chunk kept in memory could not be encoded as an IPC message.
    #[error("encoding chunk message: {source}")]
    Encode {
        /// The encoder's refusal.
        #[source]
        source: EncodeError,
    },
    /// The schema message that precedes every chunk could not be encoded.
    #[error("encoding the chunk schema: {source}")]
    Schema {
        /// The encoder's refusal.
        #[source]
        source: EncodeError,
    },
    /// Reading a chunk from the segment store failed.
    #[error("segment store read failed: {source}")]
    StoreRead {
        /// The store's failure.
        #[source]
        source: Arc<StoreError>,
    },
}

impl ChunkError {
    /// A failure of `source_id` while its bytes were read or checked, classed by what the
    /// source said: changed, being written, or failed otherwise.
    pub(crate) fn of_source(source_id: &str, err: SourceError) -> Self {
        let source_id = source_id.to_string();
        let source = Arc::new(err);
        match source.kind() {
            SourceErrorKind::Changed => Self::SourceChanged { source_id, source },
            SourceErrorKind::Busy => Self::SourceBusy { source_id, source },
            SourceErrorKind::Unreachable => Self::SourceUnreachable { source_id, source },
            SourceErrorKind::Refused | SourceErrorKind::Failed => {
                Self::SourceRead { source_id, source }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refusal_names_the_sizes_in_mib_and_the_setting() {
        let err = ChunkError::OverBudget {
            array_id: "a".to_string(),
            needed: (3 << 20) + 1,
            max: 2 << 20,
        };
        assert_eq!(
            err.to_string(),
            "a scaled chunk of 'a' needs 4 MiB of server memory to compute, more than the \
             server's whole scaled-decode budget of 2 MiB (--max-scaled-decode-memory, \
             TESSERA_MAX_SCALED_DECODE_MEMORY, max_scaled_decode_memory); raise it, or read \
             with a smaller chunk target"
        );
    }
}
