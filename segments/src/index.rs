//! The in-memory index: key → entry location, sharded so lookups rarely contend.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::segment::Segment;
use crate::types::Location;

const SHARDS: usize = 32;

/// Where one entry lives.
#[derive(Debug, Clone)]
pub(crate) struct IndexEntry {
    pub seg: Arc<Segment>,
    pub offset: u64,
    pub length: u64,
    pub meta_len: u32,
    pub crc: u32,
}

impl IndexEntry {
    /// The location this entry answers.
    #[inline]
    pub(crate) fn location(&self) -> Location {
        Location {
            segment_path: self.seg.path.clone(),
            byte_offset: self.offset,
            byte_length: self.length,
            generation_id: self.seg.inode,
        }
    }
}

/// One shard of the index.
type Shard = RwLock<HashMap<Box<[u8]>, IndexEntry>>;

/// A sharded concurrent map from key to [`IndexEntry`].
#[derive(Debug)]
pub(crate) struct Index {
    hasher: RandomState,
    shards: Box<[Shard]>,
}

impl Index {
    pub(crate) fn new() -> Self {
        Index {
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, key: &[u8]) -> &Shard {
        let slot = (self.hasher.hash_one(key) as usize) % SHARDS;
        &self.shards[slot]
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<IndexEntry> {
        self.shard(key).read().get(key).cloned()
    }

    /// Inserts or replaces the entry for `key`.
    pub(crate) fn insert(&self, key: Box<[u8]>, entry: IndexEntry) {
        self.shard(&key).write().insert(key, entry);
    }

    /// Removes `key` if it still points into segment `segment_id`; true when removed.
    pub(crate) fn remove_in_segment(&self, key: &[u8], segment_id: u64) -> bool {
        let mut shard = self.shard(key).write();
        if shard.get(key).is_some_and(|e| e.seg.id == segment_id) {
            shard.remove(key);
            true
        } else {
            false
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.shards.iter().map(|s| s.read().len() as u64).sum()
    }
}
