//! The memory cache: encoded chunks kept in RAM, bounded by bytes, least recently used out first.
//!
//! Used when the file cache is off or was refused (network filesystem, broken
//! directory). Its chunks travel only over `do_get`.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;

use super::EncodedChunk;

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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

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
