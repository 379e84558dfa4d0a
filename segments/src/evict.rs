//! Off-request-path work: sealing rotated segments, eviction to the byte budget, and
//! persisting recency. One background thread per store, woken by appends, or the owner's
//! worker shared by many stores ([`crate::StoreOptions::with_shared_maintenance`]).
//!
//! [`Maintenance`] owns the work and its counters; it reads the shared state through its
//! owners ([`crate::shared`]) and never calls the append path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::layout;
use crate::mailbox::Mailbox;
use crate::options::MaintenanceWaker;
use crate::recency;
use crate::segment::{self, Active, Segment};
use crate::shared::Shared;
use crate::types::StoreStats;

/// Seals, evicts and saves recency for one store.
#[derive(Debug)]
pub(crate) struct Maintenance {
    shared: Arc<Shared>,
    mailbox: Mailbox,
    /// Entries removed by eviction.
    evictions: AtomicU64,
    /// Eviction passes stopped by a least recently used segment not sealed yet.
    evictions_blocked: AtomicU64,
    /// Bytes of segment files unlinked.
    unlinked_bytes: AtomicU64,
}

impl Maintenance {
    /// The maintenance of `shared`, signalled to the owner's worker when `shared_worker` is
    /// given (otherwise to a thread of the store's own, see [`Maintenance::run`]).
    pub(crate) fn new(shared: Arc<Shared>, shared_worker: Option<MaintenanceWaker>) -> Self {
        Maintenance {
            shared,
            mailbox: Mailbox::new(shared_worker),
            evictions: AtomicU64::new(0),
            evictions_blocked: AtomicU64::new(0),
            unlinked_bytes: AtomicU64::new(0),
        }
    }

    /// Whether a worker of the owner does the work (no thread of the store's own).
    pub(crate) fn is_shared(&self) -> bool {
        self.mailbox.is_shared()
    }

    /// Hands a rotated segment over for sealing.
    pub(crate) fn queue_seal(&self, active: Active) {
        self.mailbox.queue_seal(active);
    }

    /// Asks for an eviction pass.
    pub(crate) fn wake(&self) {
        self.mailbox.wake();
    }

    /// Asks the store's thread to finish queued work and exit.
    pub(crate) fn stop(&self) {
        self.mailbox.stop();
    }

    /// The maintenance thread's body.
    pub(crate) fn run(self: Arc<Self>) {
        while let Some(jobs) = self.mailbox.next() {
            self.run_jobs(jobs);
        }
    }

    /// Does the work queued now, if any, on the calling thread (the shared worker's pass).
    pub(crate) fn maintain_now(&self) {
        if let Some(jobs) = self.mailbox.take() {
            self.run_jobs(jobs);
        }
    }

    /// Seals the rotated segments, evicts to the budget and saves recency when it changed.
    fn run_jobs(&self, jobs: Vec<Active>) {
        let sealed = !jobs.is_empty();
        for active in jobs {
            self.seal_now(active);
        }
        let evicted = self.evict_to_budget();
        self.shared.budget.raise_ceiling();
        if evicted > 0 || sealed {
            self.save_recency();
        }
    }

    /// Seals (or, when it holds no entry, removes) a segment that no shard writes any more.
    pub(crate) fn seal_now(&self, active: Active) {
        let shared = &self.shared;
        let seg = Arc::clone(&active.seg);
        seg.retired.store(true, Ordering::Release);
        let before = seg.disk_bytes.load(Ordering::Relaxed);
        if active.entries.is_empty() {
            drop(active);
            self.unlink_segment(&seg);
            return;
        }
        let sealed = segment::seal(active, &shared.segdir, shared.mode, shared.fault());
        if let Some(reason) = sealed.dir_sync_failed {
            shared.health.poison(reason);
        }
        shared.budget.resize(before, sealed.disk_bytes);
    }

    /// Evicts least recently used sealed segments until within budget (or the lower ceiling
    /// of a full disk); returns how many.
    ///
    /// The victim is the least recently used *retired* segment. When that one is still
    /// waiting in the seal queue the pass stops: the pass after its seal goes on. Skipping
    /// to a sealed but newer segment would evict recent data ahead of old data just because
    /// the old data's seal was slower (seen under load: the newest entry evicted first).
    pub(crate) fn evict_to_budget(&self) -> u64 {
        let shared = &self.shared;
        let mut evicted = 0;
        while shared.budget.over_limit() {
            let oldest = shared.catalog.least_recent_retired();
            let Some(victim) = oldest.filter(|s| s.sealed.load(Ordering::Acquire)) else {
                self.evictions_blocked.fetch_add(1, Ordering::Relaxed);
                break;
            };
            let removed = shared.catalog.remove_entries_of(&victim);
            self.evictions.fetch_add(removed, Ordering::Relaxed);
            self.unlink_segment(&victim);
            evicted += 1;
        }
        evicted
    }

    /// Forgets a segment and unlinks its files (the index no longer points into it).
    fn unlink_segment(&self, seg: &Segment) {
        let shared = &self.shared;
        shared.catalog.forget_segment(seg.id);
        seg.forget_map();
        let file_len = std::fs::metadata(&seg.path).map_or(0, |m| m.len());
        for path in [seg.path.clone(), layout::sidecar_path(&shared.dir, seg.id)] {
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(file = %path.display(), error = %e, "cannot unlink evicted segment file");
            }
        }
        self.unlinked_bytes.fetch_add(file_len, Ordering::Relaxed);
        shared
            .budget
            .release(seg.disk_bytes.load(Ordering::Relaxed));
    }

    /// Saves every segment's last-use counter (advisory: a failure is logged).
    pub(crate) fn save_recency(&self) {
        let shared = &self.shared;
        let pairs = shared.catalog.recency();
        if let Err(e) = recency::save(&shared.dir, &pairs, shared.mode) {
            tracing::warn!(dir = %shared.dir.display(), error = %e, "cannot save segment recency");
        }
    }

    /// Fills the maintenance's figures of `out`.
    pub(crate) fn fill_stats(&self, out: &mut StoreStats) {
        out.evictions = self.evictions.load(Ordering::Relaxed);
        out.ref_held_evictions_skipped = self.evictions_blocked.load(Ordering::Relaxed);
        out.unlinked_bytes = self.unlinked_bytes.load(Ordering::Relaxed);
    }
}
