//! [`StoreOptions`]: the store's configuration builder.

use std::path::PathBuf;
use std::sync::Arc;

use crate::fault::FaultInjector;

/// Called when a store without a maintenance thread of its own has work for its owner's
/// worker (see [`StoreOptions::with_shared_maintenance`]).
#[derive(Clone)]
pub(crate) struct MaintenanceWaker(pub(crate) Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for MaintenanceWaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MaintenanceWaker")
    }
}

/// Default budget of real bytes on disk: 10 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 10 << 30;
/// Default rotation threshold: 256 MiB.
///
/// Large enough that a 64 MiB chunk (the protocol's ceiling) never fills more than a quarter
/// of a segment, so rotation (one `fsync` and one sidecar, done off the request path) is
/// rare; small enough that evicting one whole segment frees a modest slice of a multi-GiB
/// budget, and that a client mapping one segment pins little.
pub const DEFAULT_SEGMENT_BYTES: u64 = 256 << 20;
/// Default number of concurrently open segments (write shards).
pub const DEFAULT_OPEN_SEGMENTS: usize = 2;
/// Default permission bits of segment and sidecar files: owner read/write only.
pub const DEFAULT_FILE_MODE: u32 = 0o600;

/// Configuration of a [`crate::Store`].
#[derive(Clone, Debug)]
pub struct StoreOptions {
    pub(crate) dir: PathBuf,
    pub(crate) max_bytes: u64,
    pub(crate) segment_bytes: u64,
    pub(crate) open_segments: usize,
    pub(crate) allow_network_fs: bool,
    pub(crate) verify_on_read: bool,
    pub(crate) keep_all: bool,
    pub(crate) file_mode: u32,
    pub(crate) fault: Option<Arc<dyn FaultInjector>>,
    pub(crate) shared_maintenance: Option<MaintenanceWaker>,
}

impl StoreOptions {
    /// Options for a store in `dir` (created if missing), with every default.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        StoreOptions {
            dir: dir.into(),
            max_bytes: DEFAULT_MAX_BYTES,
            segment_bytes: DEFAULT_SEGMENT_BYTES,
            open_segments: DEFAULT_OPEN_SEGMENTS,
            allow_network_fs: false,
            verify_on_read: false,
            keep_all: false,
            file_mode: DEFAULT_FILE_MODE,
            fault: None,
            shared_maintenance: None,
        }
    }

    /// Budget of real bytes on disk (segment files plus sidecars); default 10 GiB.
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Size at which a segment is rotated; default 256 MiB (see [`DEFAULT_SEGMENT_BYTES`]).
    ///
    /// The store lowers it at open so that the open segments together use at most half the
    /// budget, otherwise the budget could not be kept (open segments cannot be evicted).
    pub fn with_segment_bytes(mut self, segment_bytes: u64) -> Self {
        self.segment_bytes = segment_bytes;
        self
    }

    /// Number of segments open for appends at once (appends to different ones run in
    /// parallel); default 2, at least 1.
    pub fn with_open_segments(mut self, open_segments: usize) -> Self {
        self.open_segments = open_segments.max(1);
        self
    }

    /// Accept a network or unknown FUSE filesystem; default false.
    pub fn with_allow_network_fs(mut self, allow: bool) -> Self {
        self.allow_network_fs = allow;
        self
    }

    /// Verify each entry's crc32c in [`crate::Store::read`]; default false.
    pub fn with_verify_on_read(mut self, verify: bool) -> Self {
        self.verify_on_read = verify;
        self
    }

    /// Never evict (default false): for a store of users' data rather than a cache. The
    /// budget and a full disk then limit nothing: an append the filesystem cannot take
    /// fails, and nothing stored is ever removed by the store.
    pub fn with_keep_all(mut self, keep_all: bool) -> Self {
        self.keep_all = keep_all;
        self
    }

    /// Permission bits of new segment and sidecar files; default `0o600`, e.g. `0o640` to let
    /// a group of client users map them (the process umask still applies at creation).
    pub fn with_file_mode(mut self, mode: u32) -> Self {
        self.file_mode = mode & 0o777;
        self
    }

    /// Runs the store without a maintenance thread of its own, for owners of many stores
    /// that run one worker for all of them. Whenever the store has maintenance work (a
    /// rotated segment to seal, an eviction pass) it calls `wake`, from whichever thread
    /// queued the work and possibly with the store's locks held: `wake` must only signal
    /// the owner's worker, which then calls [`crate::Store::maintain`]. Until it does, a
    /// rotated segment stays open and appends over the budget wait (at most 5 s) as they
    /// would for a slow maintenance thread; [`crate::Store::close`] does what is left.
    pub fn with_shared_maintenance(mut self, wake: Arc<dyn Fn() + Send + Sync>) -> Self {
        self.shared_maintenance = Some(MaintenanceWaker(wake));
        self
    }

    /// Installs a fault injector (tests only).
    #[doc(hidden)]
    pub fn with_fault_injector(mut self, fault: Arc<dyn FaultInjector>) -> Self {
        self.fault = Some(fault);
        self
    }
}
