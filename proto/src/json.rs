//! JSON bodies of the `health`, `chunk_locate` and `cache_stats` action replies.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::consts::{
    ACTION_CACHE_STATS, ACTION_CHUNK_LOCATE, ACTION_HEALTH, CHUNK_LOCATE_FORMAT_VERSION,
};
use crate::error::ProtoError;

/// A JSON action reply: knows its action name and converts to and from the
/// `Result.body` bytes, naming the action in any error.
pub trait ActionBody: Serialize + DeserializeOwned {
    /// The DoAction type this body answers.
    const ACTION: &'static str;

    /// Serializes the reply into `Result.body` bytes.
    fn to_body(&self) -> Result<Vec<u8>, ProtoError> {
        serde_json::to_vec(self).map_err(|source| ProtoError::Json {
            action: Self::ACTION,
            source,
        })
    }

    /// Parses a `Result.body` received from a server.
    fn from_body(body: &[u8]) -> Result<Self, ProtoError> {
        serde_json::from_slice(body).map_err(|source| ProtoError::Json {
            action: Self::ACTION,
            source,
        })
    }
}

/// Reply of the `health` action. The client requires `protocol` to be 2 or 3.
///
/// There is deliberately no `ticket_stubs` key: advertising it would make the
/// client ask for stub plans, which Tessera does not implement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// `"SERVING"`, or `"STARTING"` while the catalog is being scanned.
    pub status: String,
    /// Flight protocol version, [`crate::FLIGHT_PROTOCOL_VERSION`].
    pub protocol: u32,
    /// Number of registered sources.
    pub source_count: u64,
    /// Seconds since the server started.
    pub uptime_seconds: f64,
    /// Whether uploads are accepted.
    pub writable: bool,
    /// Whether the server offers a catalog (it answers `catalog_query`).
    pub metadata_db_enabled: bool,
    /// Whether ROI annotations are kept, durably (the server holds its state directory).
    #[serde(default)]
    pub annotations_persisted: bool,
    /// Whether a full catalog scan is running now.
    pub full_scan_in_progress: bool,
    /// Unix time the last full scan finished, `null` if none has.
    pub last_full_scan_finished_at: Option<f64>,
    /// Sources found and not yet registered; 0 when the catalog is whole.
    #[serde(default)]
    pub registration_pending: u64,
    /// Names the catalog's content: it changes when a source or a READY upload is added,
    /// removed or changed, and never repeats across restarts. Clients re-list when it moves.
    #[serde(default)]
    pub catalog_generation: Option<String>,
    /// Server implementation name, [`crate::SERVER_NAME`].
    pub server: String,
    /// Server version.
    pub version: String,
    /// Address the server says it is reachable at; omitted when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_location: Option<String>,
    /// Why the file cache is degraded (writes failing, served from memory); omitted while
    /// it works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_degraded: Option<String>,
}

impl ActionBody for Health {
    const ACTION: &'static str = ACTION_HEALTH;
}

/// Where a chunk's encapsulated IPC message sits in a segment file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkLocation {
    /// Segment layout version, [`CHUNK_LOCATE_FORMAT_VERSION`].
    pub format_version: u32,
    /// Absolute path of the segment file (an Arrow IPC stream).
    pub segment_path: String,
    /// File offset of the message's `0xFFFFFFFF` continuation marker.
    pub byte_offset: u64,
    /// Length of the whole encapsulated message (the client ignores it).
    pub byte_length: u64,
    /// The segment's inode number; the client compares it with `st_ino`.
    pub generation_id: u64,
}

/// Reply of the `chunk_locate` action.
///
/// On the wire it is `{"available": true, "format_version", "segment_path",
/// "byte_offset", "byte_length", "generation_id"}` or
/// `{"available": false}` with an optional `"reason"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "ChunkLocateWire", try_from = "ChunkLocateWire")]
pub enum ChunkLocateReply {
    /// The chunk can be mapped from a segment file.
    Located(ChunkLocation),
    /// The client must fetch this chunk with DoGet.
    Unavailable {
        /// Why the chunk cannot be located, when the server says.
        reason: Option<String>,
    },
}

impl ChunkLocateReply {
    /// A reply pointing the client at a message inside a segment file.
    pub fn located(
        segment_path: impl Into<String>,
        byte_offset: u64,
        byte_length: u64,
        generation_id: u64,
    ) -> Self {
        Self::Located(ChunkLocation {
            format_version: CHUNK_LOCATE_FORMAT_VERSION,
            segment_path: segment_path.into(),
            byte_offset,
            byte_length,
            generation_id,
        })
    }

    /// A reply sending the client to DoGet, saying why.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self::Unavailable {
            reason: Some(reason.into()),
        }
    }
}

impl ActionBody for ChunkLocateReply {
    const ACTION: &'static str = ACTION_CHUNK_LOCATE;
}

/// The flat JSON object both [`ChunkLocateReply`] variants travel as.
#[derive(Clone, Serialize, Deserialize)]
struct ChunkLocateWire {
    available: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    format_version: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    segment_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    byte_offset: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    byte_length: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    generation_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

impl From<ChunkLocateReply> for ChunkLocateWire {
    fn from(reply: ChunkLocateReply) -> Self {
        match reply {
            ChunkLocateReply::Located(location) => Self {
                available: true,
                format_version: Some(location.format_version),
                segment_path: Some(location.segment_path),
                byte_offset: Some(location.byte_offset),
                byte_length: Some(location.byte_length),
                generation_id: Some(location.generation_id),
                reason: None,
            },
            ChunkLocateReply::Unavailable { reason } => Self {
                available: false,
                format_version: None,
                segment_path: None,
                byte_offset: None,
                byte_length: None,
                generation_id: None,
                reason,
            },
        }
    }
}

impl TryFrom<ChunkLocateWire> for ChunkLocateReply {
    type Error = ProtoError;

    fn try_from(wire: ChunkLocateWire) -> Result<Self, ProtoError> {
        if !wire.available {
            return Ok(Self::Unavailable {
                reason: wire.reason,
            });
        }
        let missing = ProtoError::IncompleteChunkLocation;
        Ok(Self::Located(ChunkLocation {
            // Servers that predate the key only ever had layout 1.
            format_version: wire.format_version.unwrap_or(CHUNK_LOCATE_FORMAT_VERSION),
            segment_path: wire.segment_path.ok_or(missing("segment_path"))?,
            byte_offset: wire.byte_offset.ok_or(missing("byte_offset"))?,
            byte_length: wire.byte_length.ok_or(missing("byte_length"))?,
            generation_id: wire.generation_id.ok_or(missing("generation_id"))?,
        }))
    }
}

/// Which storage holds the chunk cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheBackend {
    /// Segment files on disk; `chunk_locate` can answer.
    File,
    /// Memory only; `chunk_locate` always answers unavailable.
    Memory,
}

/// Reply of the `cache_stats` action: the reference server's keys plus Tessera's
/// `unlinked_bytes`, `segments`, `locates`, `do_gets`, `budget_waits`, `budget_overruns`,
/// `read_aheads`, `recuts` and `backend`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Chunks held in the cache.
    pub total_entries: u64,
    /// Bytes the cache occupies.
    pub total_bytes: u64,
    /// Entry budget.
    pub max_entries: u64,
    /// Byte budget.
    pub max_bytes: u64,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that had to read the source.
    pub misses: u64,
    /// Entries evicted.
    pub evictions: u64,
    /// Requests that waited for another request decoding the same chunk, plus appends that
    /// waited for a concurrent append of the same key.
    pub pending_waits: u64,
    /// Eviction passes that stayed over budget because only open (still written) segments
    /// were left to remove; the reference server's name (a mapped segment is never held:
    /// eviction unlinks it and the mapping stays valid).
    pub ref_held_evictions_skipped: u64,
    /// Chunks not cached because they exceed the per-entry limit.
    pub oversized_skips: u64,
    /// Bytes of unlinked segment files that clients may still have mapped.
    pub unlinked_bytes: u64,
    /// Segment files currently in the cache directory.
    pub segments: u64,
    /// `chunk_locate` calls answered with a location (chunks read by mmap).
    pub locates: u64,
    /// Chunks sent over the socket by `do_get`.
    pub do_gets: u64,
    /// Appends that waited for eviction because the cache was more than one segment over
    /// its byte budget. Absent (0) from servers older than the admission gate.
    #[serde(default)]
    pub budget_waits: u64,
    /// Appends admitted over the budget because eviction freed nothing in time.
    #[serde(default)]
    pub budget_overruns: u64,
    /// Chunks queued for decoding ahead of a sequential reader (read-ahead). Absent (0)
    /// from servers without read-ahead.
    #[serde(default)]
    pub read_aheads: u64,
    /// Chunks written from cached chunks of the tensor's other grid instead of read from
    /// the source. Absent (0) from servers with one grid.
    #[serde(default)]
    pub recuts: u64,
    /// Bytes of chunk replies the peers have not read yet (evicted segments and memory-cache
    /// chunks they still hold included). Absent (0) from servers without the ledger.
    #[serde(default)]
    pub pinned_bytes: u64,
    /// Connections closed because their unread replies stalled past a cap or the stream idle
    /// timeout.
    #[serde(default)]
    pub stalled_connections_closed: u64,
    /// File cache appends that failed (each chunk is then served from memory).
    #[serde(default)]
    pub write_failures: u64,
    /// Appends that failed because the cache's filesystem was full.
    #[serde(default)]
    pub disk_full_events: u64,
    /// While the filesystem is full: the bytes the cache evicts down to instead of
    /// `max_bytes`; absent when the whole budget fits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_ceiling_bytes: Option<u64>,
    /// While file cache writes are paused after failures: why, and when the next try is;
    /// absent while writes succeed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub writes_paused: Option<String>,
    /// Storage holding the cache.
    pub backend: CacheBackend,
}

impl ActionBody for CacheStats {
    const ACTION: &'static str = ACTION_CACHE_STATS;
}
