//! Whether a full scan of the sources is running and when the last one finished, for
//! `health` and the metrics.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Whether a full scan is running and when the last one finished, for `health`.
#[derive(Debug, Default)]
pub struct ScanStatus {
    in_progress: AtomicBool,
    /// Unix time in milliseconds; 0 means no scan has finished yet.
    last_finished_ms: AtomicU64,
}

impl ScanStatus {
    /// Marks a scan as started.
    pub fn begin(&self) {
        self.in_progress.store(true, Ordering::Relaxed);
    }

    /// Marks the scan as finished now.
    pub fn finish(&self) {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.last_finished_ms
            .store(now_ms.max(1), Ordering::Relaxed);
        self.in_progress.store(false, Ordering::Relaxed);
    }

    /// Whether a scan is running now.
    pub fn in_progress(&self) -> bool {
        self.in_progress.load(Ordering::Relaxed)
    }

    /// Unix time (seconds) the last scan finished, if one has.
    pub fn last_finished_at(&self) -> Option<f64> {
        match self.last_finished_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(ms as f64 / 1000.0),
        }
    }
}
