//! Off-request-path work: sealing rotated segments, eviction to the byte budget, and
//! persisting recency. One background thread per store, woken by appends, or the owner's
//! worker shared by many stores ([`crate::StoreOptions::with_shared_maintenance`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::{Condvar, Mutex};

use crate::layout;
use crate::options::MaintenanceWaker;
use crate::recency;
use crate::segment::{self, Active, Segment};
use crate::store::Inner;

#[derive(Debug, Default)]
struct State {
    seal_queue: Vec<Active>,
    wake: bool,
    stop: bool,
}

/// The maintenance thread's mailbox.
#[derive(Debug, Default)]
pub(crate) struct Maintenance {
    state: Mutex<State>,
    cv: Condvar,
    /// The owner's worker to signal instead of a thread of the store's own.
    shared: Option<MaintenanceWaker>,
}

impl Maintenance {
    /// A mailbox whose work is signalled to the owner's worker (`None`: the store's thread).
    pub(crate) fn new(shared: Option<MaintenanceWaker>) -> Maintenance {
        Maintenance {
            shared,
            ..Maintenance::default()
        }
    }

    /// Whether a worker of the owner does the work (no thread of the store's own).
    pub(crate) fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    fn signal(&self) {
        self.cv.notify_one();
        if let Some(wake) = &self.shared {
            (wake.0)();
        }
    }

    /// Hands a rotated segment over for sealing.
    pub(crate) fn queue_seal(&self, active: Active) {
        active.seg.retired.store(true, Ordering::Release);
        self.state.lock().seal_queue.push(active);
        self.signal();
    }

    /// Asks for an eviction pass.
    pub(crate) fn wake(&self) {
        self.state.lock().wake = true;
        self.signal();
    }

    /// Asks the thread to finish queued work and exit.
    pub(crate) fn stop(&self) {
        self.state.lock().stop = true;
        self.cv.notify_one();
    }

    /// The work queued now, without waiting (`None`: nothing to do).
    fn take(&self) -> Option<Vec<Active>> {
        let mut st = self.state.lock();
        if st.seal_queue.is_empty() && !st.wake {
            return None;
        }
        st.wake = false;
        Some(std::mem::take(&mut st.seal_queue))
    }

    /// Waits for work; `None` when stopped with nothing left to do.
    fn next(&self) -> Option<Vec<Active>> {
        let mut st = self.state.lock();
        loop {
            if !st.seal_queue.is_empty() || st.wake {
                st.wake = false;
                return Some(std::mem::take(&mut st.seal_queue));
            }
            if st.stop {
                return None;
            }
            self.cv.wait(&mut st);
        }
    }
}

impl Inner {
    /// The maintenance thread's body.
    pub(crate) fn maintenance_loop(self: Arc<Self>) {
        while let Some(jobs) = self.maintenance.next() {
            self.run_jobs(jobs);
        }
    }

    /// Does the work queued now, if any, on the calling thread (the shared worker's pass).
    pub(crate) fn maintain_now(&self) {
        if let Some(jobs) = self.maintenance.take() {
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
        self.raise_ceiling();
        if evicted > 0 || sealed {
            self.save_recency();
        }
    }

    /// Seals (or, when it holds no entry, removes) a segment that no shard writes any more.
    pub(crate) fn seal_now(&self, active: Active) {
        let seg = Arc::clone(&active.seg);
        seg.retired.store(true, Ordering::Release);
        let before = seg.disk_bytes.load(Ordering::Relaxed);
        if active.entries.is_empty() {
            drop(active);
            self.unlink_segment(&seg);
            return;
        }
        let sealed = segment::seal(active, &self.segdir, self.mode, self.fault());
        if let Some(reason) = sealed.dir_sync_failed {
            self.poison(reason);
        }
        if sealed.disk_bytes >= before {
            self.total_bytes
                .fetch_add(sealed.disk_bytes - before, Ordering::Relaxed);
        } else {
            self.total_bytes
                .fetch_sub(before - sealed.disk_bytes, Ordering::Relaxed);
        }
    }

    /// Evicts least recently used sealed segments until within budget (or the lower ceiling
    /// of a full disk); returns how many.
    ///
    /// The victim is the least recently used *retired* segment. When that one is still
    /// waiting in the seal queue the pass stops: the pass after its seal goes on. Skipping
    /// to a sealed but newer segment would evict recent data ahead of old data just because
    /// the old data's seal was slower (seen under load: the newest entry evicted first).
    pub(crate) fn evict_to_budget(&self) -> u64 {
        let mut evicted = 0;
        while self.total_bytes.load(Ordering::Relaxed) > self.limit() {
            let oldest = self
                .segments
                .lock()
                .values()
                .filter(|s| s.retired.load(Ordering::Acquire) || s.sealed.load(Ordering::Acquire))
                .min_by_key(|s| (s.last_use.load(Ordering::Relaxed), s.id))
                .cloned();
            let Some(victim) = oldest.filter(|s| s.sealed.load(Ordering::Acquire)) else {
                self.counters
                    .evictions_blocked
                    .fetch_add(1, Ordering::Relaxed);
                break;
            };
            let keys = std::mem::take(&mut *victim.keys.lock());
            let removed = keys
                .iter()
                .filter(|k| self.index.remove_in_segment(k, victim.id))
                .count() as u64;
            self.counters
                .evictions
                .fetch_add(removed, Ordering::Relaxed);
            self.unlink_segment(&victim);
            evicted += 1;
        }
        evicted
    }

    /// Forgets a segment and unlinks its files (the index no longer points into it).
    fn unlink_segment(&self, seg: &Segment) {
        self.segments.lock().remove(&seg.id);
        seg.forget_map();
        let file_len = std::fs::metadata(&seg.path).map_or(0, |m| m.len());
        for path in [seg.path.clone(), layout::sidecar_path(&self.dir, seg.id)] {
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(file = %path.display(), error = %e, "cannot unlink evicted segment file");
            }
        }
        self.counters
            .unlinked_bytes
            .fetch_add(file_len, Ordering::Relaxed);
        self.total_bytes
            .fetch_sub(seg.disk_bytes.load(Ordering::Relaxed), Ordering::Relaxed);
        self.budget.notify_freed();
    }

    /// Saves every segment's last-use counter (advisory: a failure is logged).
    pub(crate) fn save_recency(&self) {
        let pairs: Vec<(u64, u64)> = self
            .segments
            .lock()
            .values()
            .map(|s| (s.id, s.last_use.load(Ordering::Relaxed)))
            .collect();
        if let Err(e) = recency::save(&self.dir, &pairs, self.mode) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot save segment recency");
        }
    }
}
