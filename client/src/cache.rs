//! The two-tier chunk cache, keyed by chunk ticket bytes.
//!
//! * Tier 1, weak: every view handed out, held by `Weak`. A mapped view costs
//!   nothing extra here and leaves the cache by itself when its last user
//!   drops it (which also unmaps its segment).
//! * Tier 2, strong: copies (DoGet results and over-budget copies out of a
//!   mapping) in a least-recently-used list bounded by bytes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::chunk::{ChunkOrigin, ChunkView};

#[derive(Default)]
struct Tiers {
    weak: HashMap<Vec<u8>, Weak<ChunkView>>,
    /// Weak-map size after the last sweep of dead entries.
    swept_len: usize,
    strong: HashMap<Vec<u8>, (Arc<ChunkView>, u64)>,
    /// Use tick → key, oldest first.
    order: BTreeMap<u64, Vec<u8>>,
    strong_bytes: u64,
    tick: u64,
}

/// Both tiers behind one lock.
pub(crate) struct ChunkCache {
    budget: u64,
    tiers: Mutex<Tiers>,
}

impl ChunkCache {
    /// A cache whose strong tier holds at most `budget` bytes (0: no strong tier).
    pub fn new(budget: u64) -> ChunkCache {
        ChunkCache {
            budget,
            tiers: Mutex::new(Tiers::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tiers> {
        self.tiers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached view of `ticket`, from either tier.
    pub fn get(&self, ticket: &[u8]) -> Option<Arc<ChunkView>> {
        let mut tiers = self.lock();
        if let Some(view) = tiers.weak.get(ticket).and_then(Weak::upgrade) {
            touch(&mut tiers, ticket);
            return Some(view);
        }
        let tiers = &mut *tiers;
        let (view, _) = tiers.strong.get(ticket)?;
        let view = Arc::clone(view);
        touch(tiers, ticket);
        Some(view)
    }

    /// Records `view` for `ticket`: always in the weak tier, and in the strong
    /// tier too when it is a copy that fits the budget.
    pub fn insert(&self, ticket: &[u8], view: &Arc<ChunkView>) {
        let mut tiers = self.lock();
        tiers.weak.insert(ticket.to_vec(), Arc::downgrade(view));
        if tiers.weak.len() > 2 * tiers.swept_len + 64 {
            tiers.weak.retain(|_, w| w.strong_count() > 0);
            tiers.swept_len = tiers.weak.len();
        }
        let size = view.bytes().len() as u64;
        if view.origin() == ChunkOrigin::Mapped || size > self.budget {
            return;
        }
        tiers.tick += 1;
        let tick = tiers.tick;
        if let Some((old, old_tick)) = tiers
            .strong
            .insert(ticket.to_vec(), (Arc::clone(view), tick))
        {
            tiers.order.remove(&old_tick);
            tiers.strong_bytes -= old.bytes().len() as u64;
        }
        tiers.order.insert(tick, ticket.to_vec());
        tiers.strong_bytes += size;
        while tiers.strong_bytes > self.budget {
            let Some((_, oldest)) = tiers.order.pop_first() else {
                break;
            };
            if let Some((evicted, _)) = tiers.strong.remove(&oldest) {
                tiers.strong_bytes -= evicted.bytes().len() as u64;
            }
        }
    }

    /// Views alive in the weak tier, copies and their bytes in the strong tier.
    pub fn counts(&self) -> (usize, usize, u64) {
        let tiers = self.lock();
        let live = tiers.weak.values().filter(|w| w.strong_count() > 0).count();
        (live, tiers.strong.len(), tiers.strong_bytes)
    }
}

/// Marks `ticket` as just used in the strong tier, if it is there.
fn touch(tiers: &mut Tiers, ticket: &[u8]) {
    let Some(entry) = tiers.strong.get_mut(ticket) else {
        return;
    };
    tiers.tick += 1;
    let old = std::mem::replace(&mut entry.1, tiers.tick);
    if let Some(key) = tiers.order.remove(&old) {
        tiers.order.insert(tiers.tick, key);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::chunk::tests::chunk_batch;
    use crate::chunk::view_from_batch;

    fn view(len: usize, origin: ChunkOrigin) -> Arc<ChunkView> {
        let batch = chunk_batch(&vec![3u8; len], &[len as i64], "|u1");
        Arc::new(view_from_batch(&batch, origin).unwrap())
    }

    #[test]
    fn copies_are_kept_up_to_the_budget_least_recent_first_out() {
        let cache = ChunkCache::new(250);
        cache.insert(b"a", &view(100, ChunkOrigin::Socket));
        cache.insert(b"b", &view(100, ChunkOrigin::Socket));
        assert!(cache.get(b"a").is_some(), "a is now the most recent");
        cache.insert(b"c", &view(100, ChunkOrigin::MappedCopy));
        assert_eq!(cache.counts(), (2, 2, 200));
        assert!(cache.get(b"b").is_none(), "b was least recently used");
        assert!(cache.get(b"a").is_some());
        assert!(cache.get(b"c").is_some());
        cache.insert(b"huge", &view(300, ChunkOrigin::Socket));
        assert!(cache.get(b"huge").is_none(), "bigger than the budget");
    }

    #[test]
    fn mapped_views_live_only_while_held() {
        let cache = ChunkCache::new(1 << 20);
        let held = view(10, ChunkOrigin::Mapped);
        cache.insert(b"m", &held);
        let again = cache.get(b"m").unwrap();
        assert!(Arc::ptr_eq(&held, &again));
        assert_eq!(cache.counts(), (1, 0, 0));
        drop((held, again));
        assert!(cache.get(b"m").is_none());
    }

    #[test]
    fn zero_budget_disables_the_strong_tier() {
        let cache = ChunkCache::new(0);
        cache.insert(b"a", &view(10, ChunkOrigin::Socket));
        assert!(cache.get(b"a").is_none());
    }
}
