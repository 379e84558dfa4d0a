//! Chunks in RAM: a byte-bounded LRU of encoded chunks ([`MemoryCache`]) and the chunk
//! store built on it ([`MemoryStore`]).
//!
//! The store is used when the file cache is off or was refused (network filesystem,
//! broken directory); its chunks travel only over `do_get`. A bare cache holds what the
//! file cache could not take while its appends fail.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use tessera_proto::json::{CacheBackend, CacheStats};
use tessera_segments::{EntryMeta, FileRange, Location, StoreError, StoreStats};

use super::store::{self, ChunkStore, FileAppend};
use super::{ChunkError, EncodedChunk, Materialized, Unlocatable};
use crate::source::SourceError;

/// Counters the memory cache reports in `cache_stats`.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemoryStats {
    /// Chunks held.
    pub entries: u64,
    /// Bytes held (message headers and bodies).
    pub bytes: u64,
    /// Chunks dropped to stay within the budget.
    pub evictions: u64,
    /// Chunks larger than the whole budget, never kept.
    pub oversized_skips: u64,
}

struct Entry {
    chunk: EncodedChunk,
    tick: u64,
}

struct Inner {
    map: HashMap<Vec<u8>, Entry>,
    order: BTreeMap<u64, Vec<u8>>,
    tick: u64,
    stats: MemoryStats,
}

/// A byte-bounded LRU map from chunk key to encoded chunk.
pub struct MemoryCache {
    inner: Mutex<Inner>,
    max_bytes: u64,
}

impl MemoryCache {
    /// An empty cache holding at most `max_bytes`.
    pub fn new(max_bytes: u64) -> Self {
        Self {
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                order: BTreeMap::new(),
                tick: 0,
                stats: MemoryStats::default(),
            }),
            max_bytes,
        }
    }

    /// The chunk under `key`, marking it recently used.
    pub fn get(&self, key: &[u8]) -> Option<EncodedChunk> {
        let mut inner = self.inner.lock();
        inner.tick += 1;
        let tick = inner.tick;
        let entry = inner.map.get_mut(key)?;
        let old = std::mem::replace(&mut entry.tick, tick);
        let chunk = entry.chunk.clone();
        inner.order.remove(&old);
        inner.order.insert(tick, key.to_vec());
        Some(chunk)
    }

    /// Whether `key` is held (its recency is left alone).
    pub fn contains(&self, key: &[u8]) -> bool {
        self.inner.lock().map.contains_key(key)
    }

    /// Stores `chunk` under `key`, evicting the least recently used to fit.
    pub fn insert(&self, key: &[u8], chunk: EncodedChunk) {
        let size = chunk.len() as u64;
        let mut inner = self.inner.lock();
        if size > self.max_bytes {
            inner.stats.oversized_skips += 1;
            return;
        }
        if inner.map.contains_key(key) {
            return;
        }
        while inner.stats.bytes + size > self.max_bytes {
            let Some((_, victim)) = inner.order.pop_first() else {
                break;
            };
            if let Some(old) = inner.map.remove(&victim) {
                inner.stats.bytes -= old.chunk.len() as u64;
                inner.stats.entries -= 1;
                inner.stats.evictions += 1;
            }
        }
        inner.tick += 1;
        let tick = inner.tick;
        inner.order.insert(tick, key.to_vec());
        inner.map.insert(key.to_vec(), Entry { chunk, tick });
        inner.stats.bytes += size;
        inner.stats.entries += 1;
    }

    /// Current counters.
    pub fn stats(&self) -> MemoryStats {
        self.inner.lock().stats
    }

    /// The byte budget.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }
}

/// The memory cache as a chunk store: nothing in it can be located by a client.
pub struct MemoryStore {
    cache: MemoryCache,
    /// Why the file cache is not in use, what `chunk_locate` answers.
    reason: Arc<str>,
    schema_header: Bytes,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl MemoryStore {
    /// A store of at most `max_bytes` of chunks; `reason` says why chunks are kept in RAM.
    pub fn new(max_bytes: u64, reason: String) -> Result<Self, ChunkError> {
        let message = tessera_segments::ipc::schema_message()
            .map_err(|source| ChunkError::Schema { source })?;
        Ok(Self {
            cache: MemoryCache::new(max_bytes),
            reason: reason.into(),
            schema_header: Bytes::from(strip_prefix(message)),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }
}

impl ChunkStore for MemoryStore {
    fn schema_header(&self) -> Bytes {
        self.schema_header.clone()
    }

    fn read(&self, key: &[u8]) -> Result<Option<EncodedChunk>, ChunkError> {
        let hit = self.cache.get(key);
        let counter = if hit.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(hit)
    }

    fn contains(&self, key: &[u8]) -> bool {
        self.cache.contains(key)
    }

    fn mappable(&self) -> bool {
        false
    }

    fn locate(&self, _key: &[u8]) -> Result<Option<Location>, Unlocatable> {
        Err(Unlocatable::MemoryStore(Arc::clone(&self.reason)))
    }

    /// RAM the reader may never claim is not filled ahead of it.
    fn read_ahead_room(&self) -> Option<u64> {
        None
    }

    /// Hands the encoded chunk back as well as keeping it, so the caller never depends on
    /// it surviving a concurrent eviction.
    fn append(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        parts: &[&[u8]],
    ) -> Result<Materialized, StoreError> {
        let joined;
        let data = match parts {
            [one] => *one,
            many => {
                joined = many.concat();
                joined.as_slice()
            }
        };
        let chunk = encode_in_memory(key, meta, data).map_err(StoreError::from)?;
        self.cache.insert(key, chunk.clone());
        Ok(Materialized::InMemory(chunk))
    }

    /// RAM has no file to copy into: the caller reads the bytes.
    fn append_from_file(
        &self,
        _key: &[u8],
        _meta: &EntryMeta,
        _src: FileRange<'_>,
        _check: &dyn Fn() -> Result<(), SourceError>,
    ) -> Option<FileAppend> {
        None
    }

    fn stats(&self) -> CacheStats {
        let mem = self.cache.stats();
        let counters = StoreStats {
            total_entries: mem.entries,
            total_bytes: mem.bytes,
            max_bytes: self.cache.max_bytes(),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: mem.evictions,
            oversized_skips: mem.oversized_skips,
            ..StoreStats::default()
        };
        store::cache_stats(CacheBackend::Memory, counters)
    }

    /// Nothing in RAM outlives the process.
    fn close(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Drops the continuation marker and length in front of an encapsulated IPC
/// message, leaving the flatbuffer metadata Flight puts in `data_header`.
fn strip_prefix(mut message: Vec<u8>) -> Vec<u8> {
    message.drain(..message.len().min(8));
    message
}

/// Builds the chunk's IPC message in memory: one copy of the data into a fresh body.
pub(super) fn encode_in_memory(
    key: &[u8],
    meta: &EntryMeta,
    data: &[u8],
) -> Result<EncodedChunk, tessera_segments::ipc::EncodeError> {
    let layout =
        tessera_segments::ipc::EntryBody::new(key, &meta.shape, &meta.dtype, data.len() as u64)?;
    let header = layout.message(0, None)?;
    let mut body = Vec::with_capacity(layout.len() as usize);
    body.extend_from_slice(layout.prefix());
    body.extend_from_slice(data);
    body.extend_from_slice(layout.suffix());
    Ok(EncodedChunk {
        header: Bytes::from(strip_prefix(header)),
        body: Bytes::from(body),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(n: usize) -> EncodedChunk {
        EncodedChunk {
            header: Bytes::new(),
            body: Bytes::from(vec![0u8; n]),
        }
    }

    #[test]
    fn least_recently_used_is_evicted_first() {
        let cache = MemoryCache::new(300);
        cache.insert(b"a", chunk(100));
        cache.insert(b"b", chunk(100));
        cache.insert(b"c", chunk(100));
        assert!(cache.get(b"a").is_some());
        cache.insert(b"d", chunk(100));
        assert!(cache.get(b"b").is_none());
        assert!(cache.get(b"a").is_some());
        assert_eq!(cache.stats().evictions, 1);
        assert_eq!(cache.stats().bytes, 300);
    }

    #[test]
    fn oversized_chunks_are_skipped() {
        let cache = MemoryCache::new(10);
        cache.insert(b"a", chunk(11));
        assert!(cache.get(b"a").is_none());
        assert_eq!(cache.stats().oversized_skips, 1);
    }
}
