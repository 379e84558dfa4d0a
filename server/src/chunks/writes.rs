//! Whether chunks go to the file cache now: after a failed append (a full disk, an I/O
//! error) appends pause for a bounded, doubling backoff while chunks are served from memory,
//! then the next decode tries the file cache again (issue 14: after ENOSPC the server used
//! to stay on memory for good).
//!
//! ```text
//!  append ok ─────────▶ writing (log "resumed" if it was paused)
//!  append failed ─────▶ paused until now + backoff (250 ms, doubling, at most 30 s)
//!  decode while paused ─▶ memory, no append tried; after the pause: one try
//! ```

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// First pause after a failed append.
const BACKOFF_START: Duration = Duration::from_millis(250);
/// Longest pause between tries.
const BACKOFF_CAP: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct Failing {
    /// When the current run of failures started; `None` while appends succeed.
    since: Option<Instant>,
    /// No append is tried before this instant.
    retry_at: Option<Instant>,
    backoff: Duration,
    last_error: String,
    failures: u64,
}

/// The append state of the file cache.
#[derive(Debug, Default)]
pub(crate) struct Writes {
    state: Mutex<Failing>,
}

impl Writes {
    /// Whether the next decode should try the file cache.
    pub(crate) fn should_try(&self) -> bool {
        self.state
            .lock()
            .retry_at
            .is_none_or(|at| Instant::now() >= at)
    }

    /// Whether appends are failing (read-ahead pauses meanwhile).
    pub(crate) fn failing(&self) -> bool {
        self.state.lock().since.is_some()
    }

    /// An append succeeded.
    pub(crate) fn succeeded(&self) {
        let mut st = self.state.lock();
        if let Some(since) = st.since.take() {
            tracing::info!(
                after = ?since.elapsed(),
                failures = st.failures,
                "segment store accepts writes again; chunk caching resumed"
            );
            st.retry_at = None;
            st.backoff = Duration::ZERO;
        }
    }

    /// An append failed with `error`: pauses appends for the next backoff.
    pub(crate) fn failed(&self, error: &dyn std::fmt::Display) {
        let mut st = self.state.lock();
        st.failures += 1;
        st.last_error = error.to_string();
        st.backoff = if st.since.is_none() {
            BACKOFF_START
        } else {
            (st.backoff * 2).clamp(BACKOFF_START, BACKOFF_CAP)
        };
        let now = Instant::now();
        st.retry_at = Some(now + st.backoff);
        if st.since.is_none() {
            st.since = Some(now);
            tracing::error!(error = %error, "segment store write failed; serving chunks from memory over do_get and retrying with backoff");
        } else {
            tracing::debug!(error = %error, retry_in = ?st.backoff, "segment store write failed again");
        }
    }

    /// Appends that failed since start.
    pub(crate) fn failures(&self) -> u64 {
        self.state.lock().failures
    }

    /// While appends fail: what failed, since when, and when the next try is.
    pub(crate) fn paused(&self) -> Option<String> {
        let st = self.state.lock();
        let since = st.since?;
        let retry_in = st.retry_at.map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(Instant::now())
        });
        Some(format!(
            "file cache writes failing for {:.1}s ({}); chunks are served from memory; next try in {:.1}s",
            since.elapsed().as_secs_f64(),
            st.last_error,
            retry_in.as_secs_f64()
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_failure_pauses_then_allows_one_try_and_success_resumes() {
        let writes = Writes::default();
        assert!(writes.should_try());
        writes.failed(&"No space left on device");
        assert!(!writes.should_try(), "paused right after a failure");
        assert!(writes.paused().unwrap().contains("No space left"));
        std::thread::sleep(BACKOFF_START + Duration::from_millis(20));
        assert!(writes.should_try(), "one try after the backoff");
        writes.failed(&"No space left on device");
        assert_eq!(writes.state.lock().backoff, BACKOFF_START * 2);
        writes.succeeded();
        assert!(writes.should_try());
        assert!(writes.paused().is_none());
        assert!(!writes.failing());
        assert_eq!(writes.failures(), 2);
    }

    #[test]
    fn the_backoff_is_capped() {
        let writes = Writes::default();
        for _ in 0..20 {
            writes.failed(&"EIO");
        }
        assert_eq!(writes.state.lock().backoff, BACKOFF_CAP);
    }
}
