//! The open upload stores: at most a configured number at once, least recently used closed
//! first (each open store holds two descriptors: its directory lock and its open segment),
//! and one maintenance worker for all of them instead of a thread per store.
//!
//! A store is opened on demand when a chunk is written or read and closed again when more
//! than the cap are open and it is the least recently used one nobody is using; closing
//! seals its segment, and the next use reopens it from its sidecars. Bytes already handed
//! out stay valid: they are mappings, not descriptors.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::data::{ChunkData, DataError};

/// The store of one upload, open or not.
pub struct DataSlot {
    uid: u64,
    data: Mutex<Option<Arc<ChunkData>>>,
    last_used: AtomicU64,
}

impl DataSlot {
    /// The slot of upload `uid` (closed).
    pub fn new(uid: u64) -> Arc<DataSlot> {
        Arc::new(DataSlot {
            uid,
            data: Mutex::new(None),
            last_used: AtomicU64::new(0),
        })
    }
}

/// Every open upload store, and the maintenance worker's mailbox.
pub struct OpenStores {
    cap: usize,
    open: Mutex<HashMap<u64, Arc<DataSlot>>>,
    clock: AtomicU64,
    /// Uploads whose store asked for maintenance.
    pending: Mutex<HashSet<u64>>,
    work: Condvar,
}

impl OpenStores {
    /// At most `cap` stores open at once (at least one).
    pub fn new(cap: usize) -> Arc<OpenStores> {
        Arc::new(OpenStores {
            cap: cap.max(1),
            open: Mutex::new(HashMap::new()),
            clock: AtomicU64::new(1),
            pending: Mutex::new(HashSet::new()),
            work: Condvar::new(),
        })
    }

    /// The slot's store, opened from `dir` when closed; then closes the least recently
    /// used idle stores over the cap.
    pub fn get(
        self: &Arc<Self>,
        slot: &Arc<DataSlot>,
        dir: &Path,
    ) -> Result<Arc<ChunkData>, DataError> {
        slot.last_used.store(
            self.clock.fetch_add(1, Ordering::Relaxed),
            Ordering::Relaxed,
        );
        let data = {
            let mut guard = slot.data.lock();
            match guard.as_ref() {
                Some(data) => return Ok(data.clone()),
                None => {
                    let data = Arc::new(ChunkData::open(dir, self.waker(slot.uid))?);
                    *guard = Some(data.clone());
                    self.open.lock().insert(slot.uid, slot.clone());
                    data
                }
            }
        };
        self.trim(slot.uid);
        Ok(data)
    }

    /// Closes the slot's store (if open) and runs `then` before anyone can open it again.
    pub fn close_then<T>(&self, slot: &DataSlot, then: impl FnOnce() -> T) -> T {
        let mut guard = slot.data.lock();
        if let Some(data) = guard.take() {
            data.close();
        }
        self.open.lock().remove(&slot.uid);
        self.pending.lock().remove(&slot.uid);
        then()
    }

    /// Closes every open store (sealing their segments, releasing their locks).
    pub fn close_all(&self) {
        let slots: Vec<Arc<DataSlot>> = self.open.lock().values().cloned().collect();
        for slot in slots {
            self.close_then(&slot, || ());
        }
    }

    /// What a store calls when it has maintenance work: the worker's mailbox.
    fn waker(self: &Arc<Self>, uid: u64) -> Arc<dyn Fn() + Send + Sync> {
        let stores: Weak<OpenStores> = Arc::downgrade(self);
        Arc::new(move || {
            if let Some(stores) = stores.upgrade() {
                stores.pending.lock().insert(uid);
                stores.work.notify_one();
            }
        })
    }

    /// Closes the least recently used stores nobody is using (but not `keep`) until at most
    /// the cap are open. Stores in use stay open: the cap is then passed by as many stores as
    /// are being used at once.
    fn trim(&self, keep: u64) {
        let mut victims: Vec<Arc<DataSlot>> = {
            let open = self.open.lock();
            if open.len() <= self.cap {
                return;
            }
            open.values().filter(|s| s.uid != keep).cloned().collect()
        };
        victims.sort_by_key(|s| s.last_used.load(Ordering::Relaxed));
        for victim in victims {
            if self.open.lock().len() <= self.cap {
                return;
            }
            let mut guard = victim.data.lock();
            let idle = guard.as_ref().is_some_and(|d| Arc::strong_count(d) == 1);
            if idle && let Some(data) = guard.take() {
                data.close();
                self.open.lock().remove(&victim.uid);
                tracing::debug!(
                    uid = victim.uid,
                    "closed an idle upload store (open store cap)"
                );
            }
        }
    }

    /// Waits up to `timeout` for stores asking for maintenance and does it. The one worker
    /// for every upload store.
    pub fn maintain(&self, timeout: Duration) {
        let uids: Vec<u64> = {
            let mut pending = self.pending.lock();
            if pending.is_empty() {
                self.work.wait_for(&mut pending, timeout);
            }
            pending.drain().collect()
        };
        for uid in uids {
            let slot = self.open.lock().get(&uid).cloned();
            let data = slot.and_then(|s| s.data.lock().clone());
            if let Some(data) = data {
                data.maintain();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tessera_segments::EntryMeta;

    #[test]
    fn at_most_the_cap_is_open_and_a_store_in_use_stays_open() {
        let tmp = tempfile::tempdir().unwrap();
        let stores = OpenStores::new(2);
        let slots: Vec<Arc<DataSlot>> = (0..5).map(DataSlot::new).collect();
        let dir = |i: usize| tmp.path().join(i.to_string());
        let meta = EntryMeta {
            shape: vec![4],
            dtype: "|u1".to_string(),
        };
        let held = stores.get(&slots[0], &dir(0)).unwrap();
        for (i, slot) in slots.iter().enumerate() {
            let data = stores.get(slot, &dir(i)).unwrap();
            data.append_durable(b"k", &meta, &[&[i as u8; 4]]).unwrap();
            drop(data);
            assert!(stores.open.lock().len() <= 2, "after store {i}");
        }
        assert!(
            slots[0].data.lock().is_some(),
            "the store in use stayed open"
        );
        drop(held);
        // Closed stores reopen on demand with what they held.
        for (i, slot) in slots.iter().enumerate() {
            let entry = stores
                .get(slot, &dir(i))
                .unwrap()
                .read(b"k")
                .unwrap()
                .unwrap();
            assert!(entry.body.windows(4).any(|w| w == [i as u8; 4]));
            assert!(stores.open.lock().len() <= 2);
        }
        stores.close_all();
        assert!(stores.open.lock().is_empty());
    }
}
