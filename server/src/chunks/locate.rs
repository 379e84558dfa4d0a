//! What `chunk_locate` answers for one chunk: where it lives in a segment file, or why the
//! client reads it over `do_get` instead.

use std::sync::Arc;

use tessera_segments::Location;

/// The answer to locating a chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocateOutcome {
    /// The chunk's entry in a segment file, for the client to map.
    Located(Location),
    /// No file holds the chunk for the client to map: it reads the chunk with `do_get`.
    UseDoGet(Unlocatable),
}

impl LocateOutcome {
    /// Whether the chunk was located (counted as a `locates` request of `cache_stats`).
    pub fn is_located(&self) -> bool {
        matches!(self, Self::Located(_))
    }
}

/// Why a chunk cannot be located; its text is the `reason` the client is sent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unlocatable {
    /// The server keeps chunks in RAM, which no client can map; the text says why (the
    /// configured cache, or why the file cache was refused).
    #[error("{0}")]
    MemoryStore(Arc<str>),
    /// The file cache could not take the chunk (its appends fail); it was kept in memory.
    #[error("the file cache could not store this chunk (see server log)")]
    NotStored,
    /// The chunk was stored, then evicted before its location was taken.
    #[error("the chunk was evicted before it could be located")]
    Evicted,
    /// An upload's cell that was never sent: it reads as zeros, which no file holds.
    #[error(
        "this chunk of '{array_id}' was never sent: it reads as zeros, which are not stored; \
         fetch it with do_get"
    )]
    NeverSent {
        /// The upload.
        array_id: String,
    },
}
