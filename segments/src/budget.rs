//! The byte budget: what the store holds on disk, the limit it evicts down to, and the
//! admission of appends against it. The store's headline invariant lives here, beside its
//! test: **the bytes on disk stay within the budget plus one segment.**
//!
//! Eviction runs on the maintenance thread, so appends can outrun it: under load (slow
//! seals, busy cores) the cache once grew to 160 % of its budget. Admission closes that gap:
//! before it writes, an append reserves the bytes it may add, and while the cache (entries
//! written plus reservations) would pass the budget by more than one segment, it waits for
//! eviction to free space. The cache therefore stays within its budget plus one segment.
//!
//! An append is always admitted when the cache is within its budget (an entry is never larger
//! than a segment), so waiting implies there is something over budget for the maintenance
//! thread to evict, and appends cannot deadlock. A wait longer than [`ADMISSION_WAIT`] (a
//! stalled disk holding up a seal) admits the append anyway and counts a budget overrun: the
//! cache is a cache, and serving beats holding a request hostage to the budget.
//!
//! The limit is the budget, or the lower ceiling of a full disk ([`crate::diskfull`]), or
//! nothing for a store that keeps everything. This file alone reads it: appends ask
//! [`Budget::admit`] and [`Budget::grow`], eviction asks [`Budget::over_limit`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::diskfull::{Ceiling, Raised};
use crate::error::StoreError;
use crate::health::Health;
use crate::types::StoreStats;

/// Longest an append waits for eviction before it is admitted over budget.
pub(crate) const ADMISSION_WAIT: Duration = Duration::from_secs(5);

/// Bytes a segment may add outside admission: its schema message when opened, the
/// end-of-stream marker and the sidecar's header and checksum when sealed. The admission
/// limit leaves this much of the one segment's slack free for them.
const SEGMENT_OVERHEAD: u64 = 16 << 10;

/// The headline invariant as a rule: whether an append of up to `bytes` may start while the
/// store holds (or has reserved) `held` bytes and evicts down to `limit`. Within the limit
/// it always may (so a wait always has something to evict); past it, only while the store
/// stays within the limit plus one segment of `segment_bytes`, less the overhead a segment
/// adds outside admission.
fn admits(held: u64, bytes: u64, limit: u64, segment_bytes: u64) -> bool {
    let most = limit.saturating_add(segment_bytes.saturating_sub(SEGMENT_OVERHEAD).max(bytes));
    held <= limit || held.saturating_add(bytes) <= most
}

/// The store's bytes on disk against its budget, and the appends in progress.
#[derive(Debug)]
pub(crate) struct Budget {
    /// The cache directory (its filesystem's free space raises the ceiling).
    dir: PathBuf,
    max_bytes: u64,
    /// Never evict ([`crate::StoreOptions::with_keep_all`]): no limit.
    keep_all: bool,
    /// The rotation threshold: the one segment of slack.
    segment_bytes: u64,
    /// Real bytes on disk: segment files plus sidecars.
    held: AtomicU64,
    /// Lowered below `max_bytes` while the filesystem is full.
    ceiling: Ceiling,
    /// Bytes reserved by appends in progress.
    reserved: Mutex<u64>,
    /// Signalled when space was freed or a reservation released.
    freed: Condvar,
    waits: AtomicU64,
    overruns: AtomicU64,
    disk_full: AtomicU64,
}

/// Bytes an admitted append may add; released when the append ends, either way (a
/// committed entry is counted in what the store holds by then).
pub(crate) struct Reservation<'a> {
    budget: &'a Budget,
    bytes: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        *self.budget.reserved.lock() -= self.bytes;
        self.budget.freed.notify_all();
    }
}

impl Budget {
    /// The budget of a store in `dir` that holds `held` bytes at open.
    pub(crate) fn new(
        dir: PathBuf,
        max_bytes: u64,
        keep_all: bool,
        segment_bytes: u64,
        held: u64,
    ) -> Budget {
        Budget {
            dir,
            max_bytes,
            keep_all,
            segment_bytes,
            held: AtomicU64::new(held),
            ceiling: Ceiling::default(),
            reserved: Mutex::new(0),
            freed: Condvar::new(),
            waits: AtomicU64::new(0),
            overruns: AtomicU64::new(0),
            disk_full: AtomicU64::new(0),
        }
    }

    /// The byte budget the operator set.
    pub(crate) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// The bytes the store evicts down to: the budget, or less while the disk is full;
    /// unlimited for a store that keeps everything.
    fn limit(&self) -> u64 {
        if self.keep_all {
            return u64::MAX;
        }
        self.max_bytes.min(self.ceiling.get())
    }

    /// Whether the store holds more than its limit (eviction's question).
    pub(crate) fn over_limit(&self) -> bool {
        self.held.load(Ordering::Relaxed) > self.limit()
    }

    /// Admits an append of up to `bytes`, waiting (and calling `wake` for eviction) while
    /// [`admits`] refuses it, at most [`ADMISSION_WAIT`]. A store that stopped taking writes
    /// is admitted at once: the append then fails where it checks `health` again.
    pub(crate) fn admit(&self, bytes: u64, health: &Health, wake: impl Fn()) -> Reservation<'_> {
        let limit = self.limit();
        let mut reserved = self.reserved.lock();
        let mut deadline: Option<Instant> = None;
        loop {
            let held = self.held.load(Ordering::Relaxed) + *reserved;
            if admits(held, bytes, limit, self.segment_bytes) || health.check_writable().is_err() {
                break;
            }
            let until = *deadline.get_or_insert_with(|| {
                self.waits.fetch_add(1, Ordering::Relaxed);
                Instant::now() + ADMISSION_WAIT
            });
            wake();
            if self.freed.wait_until(&mut reserved, until).timed_out() {
                self.overruns.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    dir = %self.dir.display(),
                    held,
                    budget = self.max_bytes,
                    "eviction did not free space within {ADMISSION_WAIT:?}; appending over the cache budget"
                );
                break;
            }
        }
        *reserved += bytes;
        Reservation {
            budget: self,
            bytes,
        }
    }

    /// Counts `bytes` more on disk; true when the store is now over its limit (time for an
    /// eviction pass).
    pub(crate) fn grow(&self, bytes: u64) -> bool {
        let now = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        now > self.limit()
    }

    /// A segment that took `before` bytes on disk now takes `after` (it was sealed).
    pub(crate) fn resize(&self, before: u64, after: u64) {
        if after >= before {
            self.held.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.held.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// `bytes` left the disk (a segment was unlinked): wakes admissions waiting for space.
    pub(crate) fn release(&self, bytes: u64) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
        // Taking the lock orders this wake after any waiter's check: no lost wake-ups.
        drop(self.reserved.lock());
        self.freed.notify_all();
    }

    /// An append failed with `err`: when the disk is full, lowers the ceiling and returns
    /// true (time for an eviction pass).
    pub(crate) fn note_append_error(&self, err: &StoreError) -> bool {
        if !err.is_disk_full() {
            return false;
        }
        let held = self.held.load(Ordering::Relaxed);
        self.disk_full.fetch_add(1, Ordering::Relaxed);
        if let Some(ceiling) = self.ceiling.lower_after_failure(held) {
            tracing::warn!(
                dir = %self.dir.display(),
                held_bytes = held,
                ceiling_bytes = ceiling,
                budget_bytes = self.max_bytes,
                "the cache's filesystem is full; evicting below the budget until it has room"
            );
        }
        true
    }

    /// Raises the ceiling to what the filesystem can take now, with room to spare (never
    /// lowers it: only failed appends do); lifts it when the whole budget fits. Called after
    /// each eviction pass.
    pub(crate) fn raise_ceiling(&self) {
        if !self.ceiling.is_set() {
            return;
        }
        let free = match rustix::fs::statvfs(&self.dir) {
            Ok(st) => st.f_bavail.saturating_mul(st.f_frsize),
            Err(e) => {
                tracing::debug!(dir = %self.dir.display(), error = %e, "statvfs of the cache failed");
                return;
            }
        };
        let held = self.held.load(Ordering::Relaxed);
        let spare = 2 * self.segment_bytes;
        if self.ceiling.raise(held, free, spare, self.max_bytes) == Raised::Lifted {
            tracing::info!(dir = %self.dir.display(), "the cache's filesystem has room for the whole budget again");
        }
    }

    /// Fills the budget's figures of `out`.
    pub(crate) fn fill_stats(&self, out: &mut StoreStats) {
        out.total_bytes = self.held.load(Ordering::Relaxed);
        out.max_bytes = self.max_bytes;
        out.budget_waits = self.waits.load(Ordering::Relaxed);
        out.budget_overruns = self.overruns.load(Ordering::Relaxed);
        out.disk_full_events = self.disk_full.load(Ordering::Relaxed);
        let ceiling = self.ceiling.get();
        out.disk_ceiling = (ceiling < self.max_bytes).then_some(ceiling);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEGMENT: u64 = 256 << 10;
    const LIMIT: u64 = 4 * SEGMENT;

    /// Entries are at most a segment (what `append` refuses otherwise); the store's own
    /// overhead per segment is at most [`SEGMENT_OVERHEAD`].
    #[test]
    fn admitted_appends_keep_the_store_within_its_budget_plus_one_segment() {
        let sizes = [
            1,
            100,
            4 << 10,
            SEGMENT / 3,
            SEGMENT - SEGMENT_OVERHEAD,
            SEGMENT,
        ];
        let mut held = 0;
        // Fill without eviction: admission alone must stop the growth.
        for round in 0..10_000u64 {
            let bytes = sizes[(round % sizes.len() as u64) as usize];
            if !admits(held, bytes, LIMIT, SEGMENT) {
                assert!(held > LIMIT, "a wait with nothing over the limit to evict");
                continue;
            }
            held += bytes;
            assert!(
                held <= LIMIT + SEGMENT,
                "admitted to {held} bytes, past the limit plus one segment"
            );
        }
        assert!(held > LIMIT, "the fill reached the limit");
    }

    #[test]
    fn past_the_limit_an_append_leaves_room_for_a_segments_overhead() {
        for held in (LIMIT + 1..LIMIT + SEGMENT).step_by(997) {
            for bytes in [1, 1000, SEGMENT / 2, SEGMENT - SEGMENT_OVERHEAD] {
                if admits(held, bytes, LIMIT, SEGMENT) {
                    assert!(held + bytes + SEGMENT_OVERHEAD <= LIMIT + SEGMENT);
                }
            }
        }
    }

    #[test]
    fn a_full_disk_lowers_the_limit_and_keep_all_lifts_it() {
        let b = Budget::new(PathBuf::from("/nonexistent"), LIMIT, false, SEGMENT, LIMIT);
        assert!(!b.over_limit());
        let full = StoreError::io("x", std::io::Error::from_raw_os_error(28));
        assert!(b.note_append_error(&full));
        assert!(b.note_append_error(&full));
        assert!(
            b.over_limit(),
            "a second failure lowers the limit below what is held"
        );
        let keep = Budget::new(PathBuf::from("/nonexistent"), 1, true, SEGMENT, LIMIT);
        assert!(!keep.over_limit());
        assert!(!keep.grow(LIMIT));
    }
}
