//! What the store holds: the index of entries, the set of segment files, and the logical
//! clock of their last use (the eviction order).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::boot::Restored;
use crate::index::{Index, IndexEntry};
use crate::segment::Segment;

/// The entries and segments of a store. Every entry of the index points into a segment of
/// the set; eviction removes a segment's entries before it forgets the segment.
#[derive(Debug)]
pub(crate) struct Catalog {
    index: Index,
    segments: Mutex<BTreeMap<u64, Arc<Segment>>>,
    /// Logical time: advanced by every append, locate and read.
    clock: AtomicU64,
    /// Lookups that found their key.
    hits: AtomicU64,
    /// Lookups that did not.
    misses: AtomicU64,
}

impl Catalog {
    /// An empty catalog whose clock starts at `clock`.
    fn new(clock: u64) -> Catalog {
        Catalog {
            index: Index::new(),
            segments: Mutex::new(BTreeMap::new()),
            clock: AtomicU64::new(clock),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// The catalog of the segments boot restored, and the bytes they take on disk.
    pub(crate) fn restored(segments: Vec<Restored>, clock: u64) -> (Catalog, u64) {
        let catalog = Catalog::new(clock);
        let mut held = 0;
        for restored in segments {
            let seg = restored.seg;
            held += seg.disk_bytes.load(Ordering::Relaxed);
            for e in restored.entries {
                let entry = IndexEntry {
                    seg: Arc::clone(&seg),
                    offset: e.offset,
                    length: e.length,
                    meta_len: e.meta_len,
                    crc: e.crc,
                };
                catalog.index.insert(e.key, entry);
            }
            catalog.add_segment(seg);
        }
        (catalog, held)
    }

    /// The next tick of the clock.
    pub(crate) fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// Marks `seg` used now.
    #[inline]
    pub(crate) fn touch(&self, seg: &Segment) {
        let now = self.tick();
        seg.last_use.fetch_max(now, Ordering::Relaxed);
    }

    /// The entry of `key`, without counting or touching anything.
    #[inline]
    pub(crate) fn get(&self, key: &[u8]) -> Option<IndexEntry> {
        self.index.get(key)
    }

    /// The entry of `key` for a reader: counts a hit or a miss and refreshes the segment's
    /// recency.
    #[inline]
    pub(crate) fn lookup(&self, key: &[u8]) -> Option<IndexEntry> {
        match self.index.get(key) {
            Some(e) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.touch(&e.seg);
                Some(e)
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Indexes an entry (its segment must be in the set).
    pub(crate) fn insert(&self, key: Box<[u8]>, entry: IndexEntry) {
        self.index.insert(key, entry);
    }

    /// Adds a segment to the set.
    pub(crate) fn add_segment(&self, seg: Arc<Segment>) {
        self.segments.lock().insert(seg.id, seg);
    }

    /// Removes from the index every key of `seg` that still points into it; returns how
    /// many. The segment stays in the set until [`Catalog::forget_segment`].
    pub(crate) fn remove_entries_of(&self, seg: &Segment) -> u64 {
        let keys = std::mem::take(&mut *seg.keys.lock());
        keys.iter()
            .filter(|k| self.index.remove_in_segment(k, seg.id))
            .count() as u64
    }

    /// Removes a segment from the set.
    pub(crate) fn forget_segment(&self, id: u64) {
        self.segments.lock().remove(&id);
    }

    /// The least recently used segment that no shard writes any more (sealed, or retired
    /// and waiting for its seal).
    pub(crate) fn least_recent_retired(&self) -> Option<Arc<Segment>> {
        self.segments
            .lock()
            .values()
            .filter(|s| s.retired.load(Ordering::Acquire) || s.sealed.load(Ordering::Acquire))
            .min_by_key(|s| (s.last_use.load(Ordering::Relaxed), s.id))
            .cloned()
    }

    /// Every segment's `(id, last use)`, for `DIR/recency`.
    pub(crate) fn recency(&self) -> Vec<(u64, u64)> {
        self.segments
            .lock()
            .values()
            .map(|s| (s.id, s.last_use.load(Ordering::Relaxed)))
            .collect()
    }

    /// Entries in the index.
    pub(crate) fn entries(&self) -> u64 {
        self.index.len()
    }

    /// Segments in the set (open and sealed).
    pub(crate) fn segment_count(&self) -> u64 {
        self.segments.lock().len() as u64
    }

    /// Lookups that found their key, and those that did not.
    pub(crate) fn hits_and_misses(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }
}
