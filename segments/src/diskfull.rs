//! A full disk: the store shrinks to what the filesystem can hold, and grows back as room
//! returns.
//!
//! The byte budget is what the operator allows; the filesystem may hold less (other files
//! grew, a small volume). When an append fails for lack of space (ENOSPC, EDQUOT) the store
//! stops growing: a ceiling at what it holds now. Nothing is evicted for that first failure,
//! so what was cached stays. When an append fails again under the ceiling (the disk is still
//! full when appends are tried again), the ceiling drops a quarter below what the store holds
//! and eviction frees that room, so the next append fits. Each eviction pass looks at the
//! free space (`statvfs`) and raises the ceiling to what the disk could take with some room
//! to spare (two segments, or a quarter of what it could hold, whichever is less), lifting
//! it once the whole budget fits.

use std::sync::atomic::Ordering;

use crate::error::StoreError;
use crate::store::Inner;

/// No ceiling: the budget alone limits the store.
pub(crate) const NO_CEILING: u64 = u64::MAX;

impl StoreError {
    /// Whether the filesystem refused the write for lack of space or quota.
    pub fn is_disk_full(&self) -> bool {
        let StoreError::Io { source, .. } = self else {
            return false;
        };
        matches!(
            rustix::io::Errno::from_io_error(source),
            Some(rustix::io::Errno::NOSPC | rustix::io::Errno::DQUOT)
        )
    }
}

impl Inner {
    /// The bytes the store evicts down to: the budget, or less while the disk is full;
    /// unlimited for a store that keeps everything.
    pub(crate) fn limit(&self) -> u64 {
        if self.keep_all {
            return u64::MAX;
        }
        self.max_bytes.min(self.ceiling.load(Ordering::Relaxed))
    }

    /// An append failed with `err`: when the disk is full, lowers the ceiling and asks for an
    /// eviction pass.
    pub(crate) fn note_append_error(&self, err: &StoreError) {
        if !err.is_disk_full() {
            return;
        }
        let held = self.total_bytes.load(Ordering::Relaxed);
        let current = self.ceiling.load(Ordering::Relaxed);
        // First failure: stop growing. Failing again under the ceiling: make room.
        let ceiling = if current > held {
            held
        } else {
            held - held / 4
        };
        let before = self.ceiling.fetch_min(ceiling, Ordering::Relaxed);
        self.counters.disk_full.fetch_add(1, Ordering::Relaxed);
        if ceiling < before {
            tracing::warn!(
                dir = %self.dir.display(),
                held_bytes = held,
                ceiling_bytes = ceiling,
                budget_bytes = self.max_bytes,
                "the cache's filesystem is full; evicting below the budget until it has room"
            );
        }
        self.maintenance.wake();
    }

    /// Raises the ceiling to what the filesystem can take now, with room to spare (never
    /// lowers it: only failed appends do); lifts it when the whole budget fits. Called after
    /// each eviction pass.
    pub(crate) fn raise_ceiling(&self) {
        let ceiling = self.ceiling.load(Ordering::Relaxed);
        if ceiling == NO_CEILING {
            return;
        }
        let free = match rustix::fs::statvfs(&self.dir) {
            Ok(st) => st.f_bavail.saturating_mul(st.f_frsize),
            Err(e) => {
                tracing::debug!(dir = %self.dir.display(), error = %e, "statvfs of the cache failed");
                return;
            }
        };
        let held = self.total_bytes.load(Ordering::Relaxed);
        let room = held.saturating_add(free);
        let fits = room - (2 * self.segment_bytes).min(room / 4);
        if fits >= self.max_bytes {
            self.ceiling.store(NO_CEILING, Ordering::Relaxed);
            tracing::info!(dir = %self.dir.display(), "the cache's filesystem has room for the whole budget again");
        } else if fits > ceiling {
            self.ceiling.store(fits, Ordering::Relaxed);
        }
    }

    /// The ceiling below the budget, if the disk filled up and has not recovered.
    pub(crate) fn ceiling(&self) -> Option<u64> {
        let ceiling = self.ceiling.load(Ordering::Relaxed);
        (ceiling < self.max_bytes).then_some(ceiling)
    }
}
