//! Public value types of the store API.

use std::path::PathBuf;

/// What the store records about a chunk besides its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryMeta {
    /// The chunk's shape (C order).
    pub shape: Vec<i64>,
    /// The numpy dtype string, e.g. `"<u2"`, `"|u1"`, `">i2"`.
    pub dtype: String,
}

/// A byte range of a file (a source) that an entry's data is copied from with
/// [`crate::Store::append_from_file`]. The store only reads it with system calls and never
/// maps it, so a file that shrinks under the copy is an error, never `SIGBUS`.
#[derive(Clone, Copy, Debug)]
pub struct FileRange<'a> {
    /// The open source file.
    pub file: &'a std::fs::File,
    /// Offset of the first byte.
    pub offset: u64,
    /// Number of bytes.
    pub len: u64,
}

/// Where an entry lives: what `chunk_locate` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// Absolute path of the segment file.
    pub segment_path: PathBuf,
    /// Offset of the entry's continuation marker (never 0: the schema comes first).
    pub byte_offset: u64,
    /// Length from the continuation marker to the end of the message body.
    pub byte_length: u64,
    /// The segment file's inode (`st_ino`), which clients compare with `stat`.
    pub generation_id: u64,
}

/// An entry's message, as zero-copy slices of a mapping of its segment.
#[derive(Clone, Debug)]
pub struct EntryBytes {
    /// Where the entry lives.
    pub location: Location,
    /// The flatbuffer `Message` metadata, padding included (Flight `data_header`).
    pub header: bytes::Bytes,
    /// The message body (Flight `data_body`).
    pub body: bytes::Bytes,
}

/// Counters and sizes of a store (the `cache_stats` figures).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Entries in the index.
    pub total_entries: u64,
    /// Real bytes on disk: segment files plus sidecars.
    pub total_bytes: u64,
    /// Entry cap; always 0 (unbounded: the budget is in bytes).
    pub max_entries: u64,
    /// The byte budget.
    pub max_bytes: u64,
    /// `locate`/`read` calls that found their key.
    pub hits: u64,
    /// `locate`/`read` calls that did not.
    pub misses: u64,
    /// Entries removed by eviction.
    pub evictions: u64,
    /// Appends that waited for a concurrent append of the same key.
    pub pending_waits: u64,
    /// Eviction passes that stayed over budget because only open (unsealed) segments
    /// were left to remove.
    pub ref_held_evictions_skipped: u64,
    /// Appends refused because the entry is larger than a segment may be.
    pub oversized_skips: u64,
    /// Appends that waited for eviction because the cache was more than one segment over
    /// its budget.
    pub budget_waits: u64,
    /// Appends admitted over budget because eviction freed nothing within the admission
    /// wait (a stalled disk).
    pub budget_overruns: u64,
    /// Bytes of segments unlinked since open; clients may still map them (an upper bound).
    pub unlinked_bytes: u64,
    /// Segment files in the directory (open and sealed).
    pub segments: u64,
    /// Appends that failed because the filesystem was full (ENOSPC or EDQUOT).
    pub disk_full_events: u64,
    /// While the filesystem is full: the bytes the store evicts down to instead of its
    /// budget. `None` when the whole budget fits.
    pub disk_ceiling: Option<u64>,
}
