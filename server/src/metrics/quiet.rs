//! Rate-limited log lines: a request may cause a log line (a refusal, a deprecated
//! option), so a client repeating it could fill the log. [`admit`] lets one line of each
//! kind through per [`WINDOW`] at its own level and says how many were held back since;
//! the rest are logged at debug.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// One line of a kind per this window at its own level.
pub const WINDOW: Duration = Duration::from_secs(10);

/// Most kinds remembered; kinds are a bounded set (call method × status code, named
/// warnings), this only guards against a caller that makes new ones.
const MAX_KINDS: usize = 1024;

/// When each kind was last let through, and how many lines were held back since.
pub struct LogLimit {
    window: Duration,
    kinds: Mutex<HashMap<String, (Instant, u64)>>,
}

impl LogLimit {
    /// A limit of one line per kind per `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            kinds: Mutex::new(HashMap::new()),
        }
    }

    /// `Some(held_back)` when a line of `kind` may be logged at its own level now (with the
    /// number of lines of the kind held back since the last one); `None`: log it at debug.
    pub fn admit(&self, kind: &str, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock();
        match kinds.get_mut(kind) {
            Some((last, held)) if now.duration_since(*last) < self.window => {
                *held += 1;
                None
            }
            Some((last, held)) => {
                *last = now;
                Some(std::mem::take(held))
            }
            None => {
                if kinds.len() >= MAX_KINDS {
                    kinds.clear();
                }
                kinds.insert(kind.to_string(), (now, 0));
                Some(0)
            }
        }
    }
}

/// [`LogLimit::admit`] on the process's one limit, now.
pub fn admit(kind: &str) -> Option<u64> {
    static LIMIT: OnceLock<LogLimit> = OnceLock::new();
    LIMIT
        .get_or_init(|| LogLimit::new(WINDOW))
        .admit(kind, Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_kind_per_window_and_the_held_back_are_counted() {
        let limit = LogLimit::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(limit.admit("a", t0), Some(0));
        assert_eq!(limit.admit("a", t0 + Duration::from_secs(1)), None);
        assert_eq!(limit.admit("a", t0 + Duration::from_secs(2)), None);
        assert_eq!(limit.admit("b", t0 + Duration::from_secs(2)), Some(0));
        assert_eq!(limit.admit("a", t0 + Duration::from_secs(11)), Some(2));
        assert_eq!(limit.admit("a", t0 + Duration::from_secs(12)), None);
    }
}
