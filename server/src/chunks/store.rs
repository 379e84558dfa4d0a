//! Where decoded chunks are kept: the [`ChunkStore`] trait and its file implementation,
//! the segment store. The RAM implementation is [`super::memory::MemoryStore`].
//!
//! The chunk service asks a store the same questions whichever it is (is the chunk held,
//! where does it live, keep this one, how full are you) and never matches on the kind; a
//! store that cannot answer a question (RAM cannot be located by a client) says why.

use std::sync::Arc;

use bytes::Bytes;
use tessera_proto::json::{CacheBackend, CacheStats};
use tessera_segments::{EntryMeta, FileRange, Location, Store, StoreError, StoreStats};

use super::{ChunkError, EncodedChunk, Materialized, Unlocatable};
use crate::source::SourceError;

/// The outcome of [`ChunkStore::append_from_file`].
#[derive(Debug)]
pub enum FileAppend {
    /// The chunk is kept, the caller's check passed after the copy.
    Stored,
    /// The caller's check refused after the copy (the source changed or is being written):
    /// nothing is kept.
    CheckRefused(SourceError),
    /// The store failed (a full disk, an I/O error, a source shorter than its range).
    Failed(StoreError),
}

/// A place that keeps encoded chunks under their segment keys.
pub trait ChunkStore: Send + Sync {
    /// The flatbuffer header of the schema message that precedes every chunk on `do_get`.
    fn schema_header(&self) -> Bytes;

    /// The chunk under `key`, if held.
    fn read(&self, key: &[u8]) -> Result<Option<EncodedChunk>, ChunkError>;

    /// Whether `key` is held, without counting a hit or a miss (read-ahead asks this).
    fn contains(&self, key: &[u8]) -> bool;

    /// Whether clients on this machine can map what the store keeps.
    fn mappable(&self) -> bool;

    /// Where the chunk under `key` lives in a segment file (`Ok(None)` when not held);
    /// `Err` when this store keeps nothing a client could map, saying why.
    fn locate(&self, key: &[u8]) -> Result<Option<Location>, Unlocatable>;

    /// How many bytes the store can hold, when chunks may be decoded into it ahead of a
    /// sequential reader; `None` turns read-ahead off.
    fn read_ahead_room(&self) -> Option<u64>;

    /// Keeps the chunk whose raw C-order bytes are the concatenation of `parts`.
    fn append(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        parts: &[&[u8]],
    ) -> Result<Materialized, StoreError>;

    /// Keeps the chunk whose raw bytes are `src`'s byte range, copying file to file, with
    /// `check` run after the copy and before the chunk becomes visible. `None`: this store
    /// cannot copy from files, so the caller reads the bytes and calls [`ChunkStore::append`].
    fn append_from_file(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        src: FileRange<'_>,
        check: &dyn Fn() -> Result<(), SourceError>,
    ) -> Option<FileAppend>;

    /// The store's part of the `cache_stats` reply (the service adds its own counters).
    fn stats(&self) -> CacheStats;

    /// Makes what is held trustworthy for the next start.
    fn close(&self) -> Result<(), StoreError>;
}

/// The segment store as a chunk store: chunks are locatable for mmap clients and served
/// as slices of the segment's mapping.
pub struct SegmentFiles {
    store: Store,
}

impl SegmentFiles {
    /// Chunks kept in `store`.
    pub fn new(store: Store) -> Self {
        Self { store }
    }
}

impl ChunkStore for SegmentFiles {
    fn schema_header(&self) -> Bytes {
        self.store.schema_message()
    }

    fn read(&self, key: &[u8]) -> Result<Option<EncodedChunk>, ChunkError> {
        let found = self.store.read(key).map_err(|e| ChunkError::StoreRead {
            source: Arc::new(e),
        })?;
        Ok(found.map(|entry| EncodedChunk {
            header: entry.header,
            body: entry.body,
        }))
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.store.contains(key)
    }

    fn mappable(&self) -> bool {
        true
    }

    fn locate(&self, key: &[u8]) -> Result<Option<Location>, Unlocatable> {
        Ok(self.store.locate(key))
    }

    fn read_ahead_room(&self) -> Option<u64> {
        Some(self.store.max_bytes())
    }

    fn append(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        parts: &[&[u8]],
    ) -> Result<Materialized, StoreError> {
        self.store.append(key, meta, parts)?;
        Ok(Materialized::Stored)
    }

    fn append_from_file(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        src: FileRange<'_>,
        check: &dyn Fn() -> Result<(), SourceError>,
    ) -> Option<FileAppend> {
        Some(
            match self.store.append_from_file_checked(key, meta, src, check) {
                Ok(Ok(_)) => FileAppend::Stored,
                Ok(Err(refused)) => FileAppend::CheckRefused(refused),
                Err(failed) => FileAppend::Failed(failed),
            },
        )
    }

    fn stats(&self) -> CacheStats {
        cache_stats(CacheBackend::File, self.store.stats())
    }

    fn close(&self) -> Result<(), StoreError> {
        self.store.close()
    }
}

/// A store's part of the `cache_stats` reply, from its counters; the figures only the
/// service or the wire know (requests by route, read-aheads, recuts, write failures,
/// unread replies) start at zero for them to fill.
pub(super) fn cache_stats(backend: CacheBackend, s: StoreStats) -> CacheStats {
    CacheStats {
        backend,
        total_entries: s.total_entries,
        total_bytes: s.total_bytes,
        max_entries: s.max_entries,
        max_bytes: s.max_bytes,
        hits: s.hits,
        misses: s.misses,
        evictions: s.evictions,
        pending_waits: s.pending_waits,
        ref_held_evictions_skipped: s.ref_held_evictions_skipped,
        oversized_skips: s.oversized_skips,
        unlinked_bytes: s.unlinked_bytes,
        segments: s.segments,
        locates: 0,
        do_gets: 0,
        budget_waits: s.budget_waits,
        budget_overruns: s.budget_overruns,
        read_aheads: 0,
        recuts: 0,
        pinned_bytes: 0,
        stalled_connections_closed: 0,
        write_failures: 0,
        disk_full_events: s.disk_full_events,
        disk_ceiling_bytes: s.disk_ceiling,
        writes_paused: None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::chunks::memory::MemoryStore;
    use tessera_segments::StoreOptions;

    fn meta(n: i64) -> EntryMeta {
        EntryMeta {
            shape: vec![n],
            dtype: "<u1".to_string(),
        }
    }

    /// Both stores give back the bytes they were given, under the same schema; only the
    /// segment files can say where a chunk lives.
    #[test]
    fn both_stores_keep_and_return_the_same_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(StoreOptions::new(dir.path().to_path_buf())).unwrap();
        let files = SegmentFiles::new(store);
        let memory = MemoryStore::new(1 << 20, "configured".to_string()).unwrap();
        let data: Vec<u8> = (0..=255).collect();
        let stores: [&dyn ChunkStore; 2] = [&files, &memory];
        let mut bodies = Vec::new();
        for store in stores {
            assert!(!store.contains(b"k"));
            let kept = store.append(b"k", &meta(256), &[&data]).unwrap();
            let chunk = match kept {
                Materialized::Stored => store.read(b"k").unwrap().unwrap(),
                Materialized::InMemory(chunk) => chunk,
            };
            assert!(store.contains(b"k"));
            let read = store.read(b"k").unwrap().unwrap();
            assert_eq!(read.body, chunk.body);
            assert!(
                read.body.windows(data.len()).any(|w| w == data.as_slice()),
                "the body holds the chunk's bytes"
            );
            bodies.push((store.schema_header(), read.body.len()));
        }
        assert_eq!(bodies[0], bodies[1], "same schema and body size");
        assert!(files.locate(b"k").unwrap().is_some());
        assert_eq!(memory.locate(b"k").unwrap_err().to_string(), "configured");
        assert!(files.mappable() && !memory.mappable());
        assert!(files.read_ahead_room().is_some());
        assert!(memory.read_ahead_room().is_none());
        assert_eq!(files.stats().total_entries, 1);
        assert_eq!(memory.stats().total_entries, 1);
    }
}
