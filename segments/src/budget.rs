//! Admission of appends to the byte budget.
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

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::store::Inner;

/// Longest an append waits for eviction before it is admitted over budget.
pub(crate) const ADMISSION_WAIT: Duration = Duration::from_secs(5);

/// Bytes a segment may add outside admission: its schema message when opened, the
/// end-of-stream marker and the sidecar's header and checksum when sealed. The admission
/// limit leaves this much of the one segment's slack free for them.
const SEGMENT_OVERHEAD: u64 = 16 << 10;

/// Bytes reserved by appends in progress, and the signal that space was freed.
#[derive(Debug, Default)]
pub(crate) struct Budget {
    reserved: Mutex<u64>,
    freed: Condvar,
}

impl Budget {
    /// Wakes admissions waiting for space (after an eviction or a released reservation).
    pub(crate) fn notify_freed(&self) {
        // Taking the lock orders this wake after any waiter's check: no lost wake-ups.
        drop(self.reserved.lock());
        self.freed.notify_all();
    }
}

/// Bytes an admitted append may add; released when the append ends, either way (a
/// committed entry is counted in the store's total by then).
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

impl Inner {
    /// Admits an append of up to `bytes`, waiting while the cache would pass its budget by
    /// more than one segment (see the module docs).
    pub(crate) fn admit(&self, bytes: u64) -> Reservation<'_> {
        let budget = self.limit();
        let limit = budget.saturating_add(
            self.segment_bytes
                .saturating_sub(SEGMENT_OVERHEAD)
                .max(bytes),
        );
        let mut reserved = self.budget.reserved.lock();
        let mut deadline: Option<Instant> = None;
        loop {
            let held = self.total_bytes.load(Ordering::Relaxed) + *reserved;
            if held <= budget || held + bytes <= limit || self.check_writable().is_err() {
                break;
            }
            let until = *deadline.get_or_insert_with(|| {
                self.counters.budget_waits.fetch_add(1, Ordering::Relaxed);
                Instant::now() + ADMISSION_WAIT
            });
            self.maintenance.wake();
            if self
                .budget
                .freed
                .wait_until(&mut reserved, until)
                .timed_out()
            {
                self.counters
                    .budget_overruns
                    .fetch_add(1, Ordering::Relaxed);
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
            budget: &self.budget,
            bytes,
        }
    }
}
