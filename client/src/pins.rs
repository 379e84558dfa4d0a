//! Mapped segments and the pin budget.
//!
//! A segment stays mapped while any chunk view of it lives. The ledger counts
//! the on-disk size of the distinct segments (by device and inode) this
//! process keeps mapped; a mapping that would push the total over the pin
//! limit is made *transient*: the caller copies its chunk out and drops it.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use arrow_schema::SchemaRef;
use memmap2::Mmap;

use crate::mapping::map_segment;

/// Identity of a segment file: device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct InodeKey {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`, which the server sends as `generation_id`.
    pub ino: u64,
}

/// A read-only mapping of a segment file and its parsed stream schema.
pub(crate) struct MappedSegment {
    mmap: Mmap,
    /// The ledger that counts this mapping; `None` for a transient mapping.
    ledger: Option<(Arc<PinLedger>, InodeKey)>,
    /// The IPC stream schema at offset 0, parsed on first use.
    pub schema: OnceLock<SchemaRef>,
}

impl MappedSegment {
    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    /// Whether this mapping counts against the pin budget (it is kept).
    pub fn is_pinned(&self) -> bool {
        self.ledger.is_some()
    }
}

impl Drop for MappedSegment {
    fn drop(&mut self) {
        if let Some((ledger, key)) = &self.ledger {
            ledger.release(*key);
        }
    }
}

/// Hands `Arc<MappedSegment>` to `bytes::Bytes::from_owner`.
pub(crate) struct SegmentOwner(pub Arc<MappedSegment>);

impl AsRef<[u8]> for SegmentOwner {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

struct Entry {
    /// Live pinned mappings of this inode.
    live: usize,
    /// Bytes this inode adds to the total (largest size mapped).
    counted: u64,
    /// The newest pinned mapping, for reuse.
    latest: Weak<MappedSegment>,
}

/// Counts pinned segment bytes against an optional limit.
pub(crate) struct PinLedger {
    limit: Option<u64>,
    total: AtomicU64,
    entries: Mutex<HashMap<InodeKey, Entry>>,
}

impl PinLedger {
    /// A ledger with `limit` (`None`: no cap).
    pub fn new(limit: Option<u64>) -> Arc<PinLedger> {
        Arc::new(PinLedger {
            limit,
            total: AtomicU64::new(0),
            entries: Mutex::new(HashMap::new()),
        })
    }

    /// Summed on-disk size of the distinct segments mapped now.
    pub fn pinned_bytes(&self) -> u64 {
        self.total.load(Ordering::Acquire)
    }

    /// Number of distinct segments mapped now.
    pub fn pinned_segments(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<InodeKey, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether pinning `extra` more bytes would pass the limit: one atomic
    /// load and a compare.
    fn over_budget(&self, extra: u64) -> bool {
        self.limit
            .is_some_and(|limit| self.pinned_bytes().saturating_add(extra) > limit)
    }

    /// A mapping of `file` (identified by `key`, `size` bytes long) that is
    /// at least `needed` bytes long: an already pinned one when it is long
    /// enough, a new pinned one when the budget allows, else a transient one.
    pub fn acquire(
        self: &Arc<Self>,
        file: &File,
        key: InodeKey,
        size: u64,
        needed: u64,
    ) -> std::io::Result<Arc<MappedSegment>> {
        if self.limit == Some(0) {
            return transient(file);
        }
        let mut entries = self.lock();
        let counted = entries.get(&key).map_or(0, |e| e.counted);
        if let Some(existing) = entries.get(&key).and_then(|e| e.latest.upgrade())
            && existing.bytes().len() as u64 >= needed
        {
            return Ok(existing);
        }
        let extra = size.saturating_sub(counted);
        if self.over_budget(extra) {
            drop(entries);
            return transient(file);
        }
        let segment = Arc::new(MappedSegment {
            mmap: map_segment(file)?,
            ledger: Some((Arc::clone(self), key)),
            schema: OnceLock::new(),
        });
        let entry = entries.entry(key).or_insert(Entry {
            live: 0,
            counted: 0,
            latest: Weak::new(),
        });
        entry.live += 1;
        entry.counted = entry.counted.max(size);
        entry.latest = Arc::downgrade(&segment);
        self.total.fetch_add(extra, Ordering::AcqRel);
        Ok(segment)
    }

    fn release(&self, key: InodeKey) {
        let mut entries = self.lock();
        if let Some(entry) = entries.get_mut(&key) {
            entry.live = entry.live.saturating_sub(1);
            if entry.live == 0 {
                self.total.fetch_sub(entry.counted, Ordering::AcqRel);
                entries.remove(&key);
            }
        }
    }
}

/// A mapping that is not counted and not kept: the caller copies out of it.
fn transient(file: &File) -> std::io::Result<Arc<MappedSegment>> {
    Ok(Arc::new(MappedSegment {
        mmap: map_segment(file)?,
        ledger: None,
        schema: OnceLock::new(),
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    fn segment_file(dir: &std::path::Path, name: &str, len: usize) -> (File, InodeKey, u64) {
        let path = dir.join(name);
        let mut file = File::create(&path).unwrap();
        file.write_all(&vec![7u8; len]).unwrap();
        let file = File::open(&path).unwrap();
        let meta = file.metadata().unwrap();
        let key = InodeKey {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        (file, key, meta.size())
    }

    #[test]
    fn distinct_inodes_are_counted_once_and_released_at_last_drop() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = PinLedger::new(None);
        let (a, ka, sa) = segment_file(dir.path(), "a", 1000);
        let (b, kb, sb) = segment_file(dir.path(), "b", 3000);
        let first = ledger.acquire(&a, ka, sa, 10).unwrap();
        let again = ledger.acquire(&a, ka, sa, 10).unwrap();
        assert!(Arc::ptr_eq(&first, &again), "a live mapping is reused");
        let other = ledger.acquire(&b, kb, sb, 10).unwrap();
        assert!(first.is_pinned() && other.is_pinned());
        assert_eq!(ledger.pinned_bytes(), 4000);
        assert_eq!(ledger.pinned_segments(), 2);
        drop(first);
        assert_eq!(ledger.pinned_bytes(), 4000, "one view of 'a' still lives");
        drop(again);
        assert_eq!(ledger.pinned_bytes(), 3000);
        drop(other);
        assert_eq!(ledger.pinned_bytes(), 0);
        assert_eq!(ledger.pinned_segments(), 0);
    }

    #[test]
    fn over_the_limit_mappings_are_transient() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = PinLedger::new(Some(2500));
        let (a, ka, sa) = segment_file(dir.path(), "a", 2000);
        let (b, kb, sb) = segment_file(dir.path(), "b", 1000);
        let pinned = ledger.acquire(&a, ka, sa, 10).unwrap();
        assert!(pinned.is_pinned());
        let copy = ledger.acquire(&b, kb, sb, 10).unwrap();
        assert!(!copy.is_pinned(), "2000 + 1000 > 2500");
        assert_eq!(copy.bytes().len(), 1000);
        assert_eq!(ledger.pinned_bytes(), 2000);
        // The pinned inode itself is still served from its mapping.
        assert!(ledger.acquire(&a, ka, sa, 10).unwrap().is_pinned());
        drop(pinned);
        assert!(ledger.acquire(&b, kb, sb, 10).unwrap().is_pinned());

        let never = PinLedger::new(Some(0));
        assert!(!never.acquire(&a, ka, sa, 10).unwrap().is_pinned());
        assert_eq!(never.pinned_bytes(), 0);
    }

    #[test]
    fn a_grown_segment_is_remapped_and_counted_at_its_new_size() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = PinLedger::new(None);
        let (a, ka, sa) = segment_file(dir.path(), "a", 100);
        let short = ledger.acquire(&a, ka, sa, 50).unwrap();
        let mut append = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("a"))
            .unwrap();
        append.write_all(&[9u8; 100]).unwrap();
        let long = ledger.acquire(&a, ka, 200, 150).unwrap();
        assert!(!Arc::ptr_eq(&short, &long));
        assert_eq!(long.bytes().len(), 200);
        assert_eq!(ledger.pinned_bytes(), 200);
        assert_eq!(ledger.pinned_segments(), 1);
        drop(short);
        assert_eq!(ledger.pinned_bytes(), 200);
        drop(long);
        assert_eq!(ledger.pinned_bytes(), 0);
    }
}
