//! Which grid a plan is cut on (docs/decisions/0015).
//!
//! A read a local client maps costs it one `chunk_locate`, one mapping and one dask task
//! per chunk, so it wants few, large chunks; a read that travels the socket wants chunks
//! small enough to pipeline. The server plans by what it knows at GetFlightInfo:
//!
//! ```text
//!  peer on loopback ── and the file cache can be mapped (file store, appends healthy)
//!        │                 └─ and no loopback client read a mapped-grid chunk by DoGet
//!        │                    within the last LEARN_WINDOW (it forces the socket), or
//!        │                    a `chunk_locate` came after that read (a client maps again)
//!        ▼ yes                                               ▼ otherwise
//!  Route::Mapped: the coarse grid                      Route::Socket: the fine grid
//! ```
//!
//! `loopback_plans = "mapped"` or `"socket"` pins the loopback route instead of learning it.
//! While learning, the coarse grid's cells are at most [`LEARN_CELL_CAP`]: a client's first
//! plan is cut on it before the server can know whether the client maps (docs/decisions/0041).
//! For one tensor, a loopback peer routed to the socket reads the coarse grid while only
//! that one is cached (`ServiceState::route_for`, `chunks/regrid.rs`, docs/decisions/0023).
//!
//! Both grids are cut by the same contiguity-first rule and their cells are different
//! chunks (ids name absolute bounds), so a chunk id still names the same bytes forever;
//! the segment store evicts by use, so the grid nobody reads ages out of the cache.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Deserialize;

/// How long one loopback DoGet of a mapped-grid chunk keeps loopback plans on the fine
/// grid, unless a `chunk_locate` comes after it: a client that forces the socket plans
/// again within seconds, while a mapping client moves plans back with its next locate.
pub const LEARN_WINDOW: Duration = Duration::from_secs(60);

/// The grid a plan is cut on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The client will map the chunks: the coarse grid (`Tensor::mapped_grid`).
    Mapped,
    /// The chunks travel the socket: the fine grid (`Tensor::grid`).
    Socket,
}

/// How plans for loopback peers (with a mappable cache) pick their grid
/// (`loopback_plans`, `--loopback-plans`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LoopbackPlans {
    /// The coarse grid, until a loopback client is seen reading it over DoGet only.
    #[default]
    Learn,
    /// Always the coarse grid: every local client maps.
    Mapped,
    /// Always the fine grid: local clients read over the socket.
    Socket,
}

/// The largest cell of the coarse grid under `learn` (docs/decisions/0041): a loopback
/// client's first plan lands on that grid before anything tells whether the client maps, and
/// a client that reads it over DoGet (pyarrow, the biopb client with
/// `BIOPB_CACHEFILE_TRANSFER_DISABLED=1`, a proxy) gathers each reply into one contiguous
/// allocation. glibc serves an allocation of 32 MiB or more (its largest mmap threshold) with
/// a fresh mapping every time, so each such reply faults in and zeroes new pages; cells of at
/// most 24 MiB keep a reply and its framing under that line, where the client's allocator
/// reuses memory.
pub const LEARN_CELL_CAP: u64 = 24 << 20;

// A capped reply and its framing (under 1 MiB) stay below glibc's 32 MiB threshold.
const _: () = assert!(LEARN_CELL_CAP + (1 << 20) < 32 << 20);

impl LoopbackPlans {
    /// The target of the coarse grid under this policy, given `--mapped-chunk-target`: under
    /// `learn` at most [`LEARN_CELL_CAP`], since the first plan of a client that never maps
    /// is cut on it; `mapped` (every local client maps) and `socket` take it as it is.
    pub fn coarse_target(self, mapped_target: u64) -> u64 {
        match self {
            Self::Learn => mapped_target.min(LEARN_CELL_CAP),
            Self::Mapped | Self::Socket => mapped_target,
        }
    }
}

/// Picks the route of each plan and learns from loopback readers that do not map.
#[derive(Debug)]
pub struct RoutePlanner {
    window: Duration,
    policy: LoopbackPlans,
    /// What loopback clients did last: when one read a mapped-grid chunk over DoGet,
    /// and whether a `chunk_locate` came after it.
    learned: Mutex<Learned>,
}

#[derive(Debug, Default)]
struct Learned {
    last_local_socket_read: Option<Instant>,
    located_since: bool,
}

impl Default for RoutePlanner {
    fn default() -> Self {
        Self::new(LEARN_WINDOW)
    }
}

impl RoutePlanner {
    /// A planner that remembers a loopback socket reader for `window`.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            policy: LoopbackPlans::Learn,
            learned: Mutex::new(Learned::default()),
        }
    }

    /// Plans loopback reads by `policy` instead of learning.
    pub fn with_policy(mut self, policy: LoopbackPlans) -> Self {
        self.policy = policy;
        self
    }

    /// The route of a plan for a peer that is (or is not) on loopback, with a file cache
    /// that can (or cannot) be mapped now.
    pub fn route(&self, loopback: bool, mappable: bool) -> Route {
        if !(loopback && mappable) {
            return Route::Socket;
        }
        match self.policy {
            LoopbackPlans::Mapped => return Route::Mapped,
            LoopbackPlans::Socket => return Route::Socket,
            LoopbackPlans::Learn => {}
        }
        let learned = self.learned.lock();
        let socket_reader = !learned.located_since
            && learned
                .last_local_socket_read
                .is_some_and(|at| at.elapsed() < self.window);
        if socket_reader {
            Route::Socket
        } else {
            Route::Mapped
        }
    }

    /// A loopback client fetched a chunk of the mapped grid over DoGet: it does not map.
    pub fn note_local_socket_read(&self) {
        let mut learned = self.learned.lock();
        learned.last_local_socket_read = Some(Instant::now());
        learned.located_since = false;
    }

    /// A client asked where a chunk lives: it maps.
    pub fn note_locate(&self) {
        let mut learned = self.learned.lock();
        if learned.last_local_socket_read.is_some() {
            learned.located_since = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_peers_with_a_mappable_cache_get_the_mapped_grid() {
        let planner = RoutePlanner::default();
        assert_eq!(planner.route(true, true), Route::Mapped);
        assert_eq!(planner.route(false, true), Route::Socket);
        assert_eq!(planner.route(true, false), Route::Socket);
    }

    #[test]
    fn a_loopback_socket_reader_moves_loopback_plans_to_the_fine_grid_for_a_while() {
        let planner = RoutePlanner::new(Duration::from_millis(100));
        planner.note_local_socket_read();
        assert_eq!(planner.route(true, true), Route::Socket);
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(planner.route(true, true), Route::Mapped);
    }

    #[test]
    fn learning_caps_the_coarse_cells_a_first_plan_may_hand_out() {
        let big = 64 << 20;
        assert_eq!(LoopbackPlans::Learn.coarse_target(big), LEARN_CELL_CAP);
        assert_eq!(LoopbackPlans::Learn.coarse_target(16 << 20), 16 << 20);
        assert_eq!(
            LoopbackPlans::Learn.coarse_target(0),
            0,
            "0 still means one grid"
        );
        assert_eq!(LoopbackPlans::Mapped.coarse_target(big), big);
        assert_eq!(LoopbackPlans::Socket.coarse_target(big), big);
    }

    #[test]
    fn a_pinned_policy_ignores_what_clients_do() {
        let mapped = RoutePlanner::default().with_policy(LoopbackPlans::Mapped);
        mapped.note_local_socket_read();
        assert_eq!(mapped.route(true, true), Route::Mapped);
        assert_eq!(mapped.route(false, true), Route::Socket);
        assert_eq!(mapped.route(true, false), Route::Socket);
        let socket = RoutePlanner::default().with_policy(LoopbackPlans::Socket);
        socket.note_locate();
        assert_eq!(socket.route(true, true), Route::Socket);
    }

    #[test]
    fn a_locate_after_the_socket_read_moves_plans_back_at_once() {
        let planner = RoutePlanner::default();
        planner.note_local_socket_read();
        assert_eq!(planner.route(true, true), Route::Socket);
        planner.note_locate();
        assert_eq!(planner.route(true, true), Route::Mapped);
        planner.note_local_socket_read();
        assert_eq!(
            planner.route(true, true),
            Route::Socket,
            "the last behaviour wins"
        );
    }
}
