//! Who may decode now: two pools of permits, one sized by the cores for sources read on this
//! machine, one larger for sources whose reads wait on a network link
//! ([`crate::source::Source::waits_on_link`]: an upstream server's chunks). A fetch over a
//! link holds its permit while the bytes cross it, not while a core works, so sizing its
//! pool by the cores would leave the link idle between fetches (docs/decisions/0036).
//!
//! Each pool also has turns for decodes ahead of a reader (read-ahead, a plan's ends): one
//! fewer than its permits, so a request always finds a permit no guess holds.

use tokio::sync::Semaphore;

/// Default of `upstream_fetches`: fetches over a link in flight at once. Eight 8 MiB chunks
/// in flight keep a 1 Gbit/s link busy while each fetch waits its turn on it.
pub const DEFAULT_UPSTREAM_FETCHES: usize = 8;

/// One pool: the permits of decodes running, and the turns of decodes ahead.
pub(super) struct Pool {
    /// Held by a decode while it runs.
    pub(super) work: Semaphore,
    /// Waited for, outside the single flight, by a decode ahead before it asks for `work`.
    pub(super) ahead: Semaphore,
}

impl Pool {
    /// A pool of `size` permits (at least one) and one turn fewer ahead (at least one).
    fn new(size: usize) -> Self {
        Self {
            work: Semaphore::new(size.max(1)),
            ahead: Semaphore::new(size.saturating_sub(1).max(1)),
        }
    }
}

/// The two pools.
pub(super) struct Permits {
    /// Sources read on this machine: as many as the decoders (the cores).
    local: Pool,
    /// Sources read over a link.
    link: Pool,
}

impl Permits {
    /// `decodes` permits for local sources, `fetches` for sources read over a link.
    pub(super) fn new(decodes: usize, fetches: usize) -> Self {
        Self {
            local: Pool::new(decodes),
            link: Pool::new(fetches),
        }
    }

    /// The pool a read of a source takes its permit from.
    pub(super) fn of(&self, waits_on_link: bool) -> &Pool {
        if waits_on_link {
            &self.link
        } else {
            &self.local
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_reads_have_their_own_larger_pool() {
        let permits = Permits::new(2, 8);
        assert_eq!(permits.of(false).work.available_permits(), 2);
        assert_eq!(permits.of(false).ahead.available_permits(), 1);
        assert_eq!(permits.of(true).work.available_permits(), 8);
        assert_eq!(permits.of(true).ahead.available_permits(), 7);
        // One pool's permits held leave the other's untouched.
        let _held = permits.of(false).work.try_acquire_many(2);
        assert_eq!(permits.of(true).work.available_permits(), 8);
    }

    #[test]
    fn a_pool_of_one_still_reads_ahead_and_zero_is_one() {
        let permits = Permits::new(1, 0);
        assert_eq!(permits.of(false).ahead.available_permits(), 1);
        assert_eq!(permits.of(true).work.available_permits(), 1);
    }
}
