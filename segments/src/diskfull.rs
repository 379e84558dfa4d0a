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
//!
//! [`Ceiling`] is the value; the budget ([`crate::budget`]) owns it and applies it.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::StoreError;

/// No ceiling: the budget alone limits the store.
const NO_CEILING: u64 = u64::MAX;

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

/// What a full disk lets the store hold, below its budget (none while the budget fits).
#[derive(Debug)]
pub(crate) struct Ceiling(AtomicU64);

/// How [`Ceiling::raise`] changed the ceiling.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Raised {
    /// Unchanged (no ceiling, or no more room than before).
    No,
    /// Raised, still below the budget.
    To(u64),
    /// Lifted: the whole budget fits again.
    Lifted,
}

impl Default for Ceiling {
    fn default() -> Self {
        Ceiling(AtomicU64::new(NO_CEILING))
    }
}

impl Ceiling {
    /// The ceiling in bytes (`u64::MAX` when there is none).
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    /// An append failed for lack of space while the store held `held` bytes: the first
    /// failure stops growth at `held`, a failure under the ceiling lowers it a quarter
    /// below `held`. Returns the new ceiling when it went down.
    pub(crate) fn lower_after_failure(&self, held: u64) -> Option<u64> {
        let current = self.get();
        let ceiling = if current > held {
            held
        } else {
            held - held / 4
        };
        let before = self.0.fetch_min(ceiling, Ordering::Relaxed);
        (ceiling < before).then_some(ceiling)
    }

    /// The filesystem has `free` bytes while the store holds `held`: raises the ceiling to
    /// what fits with room to spare (`spare`: two segments, at most a quarter of the room),
    /// lifting it when `max_bytes` fits. Never lowers it.
    pub(crate) fn raise(&self, held: u64, free: u64, spare: u64, max_bytes: u64) -> Raised {
        let ceiling = self.get();
        if ceiling == NO_CEILING {
            return Raised::No;
        }
        let room = held.saturating_add(free);
        let fits = room - spare.min(room / 4);
        if fits >= max_bytes {
            self.0.store(NO_CEILING, Ordering::Relaxed);
            Raised::Lifted
        } else if fits > ceiling {
            self.0.store(fits, Ordering::Relaxed);
            Raised::To(fits)
        } else {
            Raised::No
        }
    }

    /// Whether a ceiling is set.
    pub(crate) fn is_set(&self) -> bool {
        self.get() != NO_CEILING
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_failure_stops_growth_and_a_second_makes_room() {
        let c = Ceiling::default();
        assert_eq!(c.lower_after_failure(1000), Some(1000));
        assert_eq!(c.lower_after_failure(1000), Some(750));
        assert_eq!(c.raise(750, 10, 0, 2000), Raised::To(760));
        assert_eq!(c.raise(750, 5000, 100, 2000), Raised::Lifted);
        assert!(!c.is_set());
    }
}
