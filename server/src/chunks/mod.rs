//! Chunks: decoding a grid cell of a source and keeping it where the wire can serve it.
//!
//! ```text
//!  do_get / chunk_locate
//!        │ chunk id (validated against the registry)
//!        ▼
//!  ChunkService ── hit ──▶ its ChunkStore: segment files (locatable) or RAM
//!        │ miss
//!        ▼ single flight: one decode per cold chunk, however many callers
//!  contiguous range of a C-order source, under 2 MiB?
//!        │ yes                                   │ no (2 MiB or more, Fortran order, strided)
//!        ▼                                       ▼
//!  Store::append_from_file_checked          NpyFile::read_region (read or gather into a
//!  (copy_file_range: source pages →           pooled buffer: copy 1), then Store::append
//!   segment pages, ONE copy; the source        (one large vectored write: copy 2, which
//!   is never mapped; committed only if          fills the segment's page cache with 2 MiB
//!   NpyFile::check_unchanged still holds)       folios that clients map one fault each)
//!        │                                       │
//!        └──────────▶ locatable, readable zero-copy ◀┘
//! ```
//!
//! [`decode`] picks how a cold chunk reaches the store, one function per strategy: the two
//! routes drawn above (file to file, or read into a buffer), or, before either, a recut out of
//! the cached chunks of the tensor's other grid ([`recut`]: one copy, no source read).
//!
//! Why large chunks take the two-copy route (docs/decisions/0009): `copy_file_range` fills
//! the segment's page cache through a 64 KiB pipe, so its folios stay small and every
//! mapping of the chunk faults once per 64 KiB; one large write gets 2 MiB folios, mapped
//! with one fault per 2 MiB. A chunk is decoded once and read many times.
//!
//! The service never asks which store it has: [`ChunkStore`] answers reads, locates,
//! appends and stats for both ([`SegmentFiles`], [`MemoryStore`]); a store that cannot do
//! something (RAM cannot be mapped by a client, nor filled ahead of a reader) says so.
//!
//! A request that continues a walk over the grid (its neighbouring cell is cached or
//! decoding) also queues background decodes of the next cells in that direction
//! ([`readahead`]), through the same single flight and decode permits.
//!
//! Decode permits come from one of two pools ([`permits`]): as many as the cores for
//! sources read on this machine, and `upstream_fetches` (8 by default) for sources whose
//! reads wait on a network link (an upstream server's chunks), so a node-local cache keeps
//! its link busy with more fetches in flight than it has cores.
//!
//! When an append fails (disk full, I/O error) the chunk is still served over
//! `do_get` from memory, the failure is logged once, and appends pause for a doubling
//! backoff before the next try ([`writes`]); a full disk also makes the store evict below
//! its budget, so the try after the pause finds room.

mod budget;
mod buffers;
mod compressed;
mod decode;
mod decodes;
mod error;
mod label_tensors;
mod locate;
mod memory;
mod permits;
mod plans;
mod readahead;
mod recut;
pub mod reduce;
mod regrid;
mod store;
mod writes;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tessera_proto::json::CacheStats;

use crate::grid::Region;
use crate::grid::chunk_id::ChunkId;
use crate::metrics::Metrics;
use crate::source::registry::Tensor;
pub use budget::DEFAULT_MAX_SCALED_DECODE_BYTES;
use budget::{BudgetError, DecodeBudget, Reserved};
use buffers::BufferPool;
pub use compressed::{
    BodyEncoding, DEFAULT_WIRE_COMPRESSION_MEMORY, PeerLink, TensorKind, WireBodies,
    WireCompression,
};
use decodes::Decodes;
pub use error::ChunkError;
pub use label_tensors::LabelTensors;
pub use locate::{LocateOutcome, Unlocatable};
use memory::MemoryCache;
pub use memory::MemoryStore;
pub use permits::DEFAULT_UPSTREAM_FETCHES;
use permits::Permits;
use plans::RecentPlans;
pub use store::{ChunkStore, SegmentFiles};
use writes::Writes;

/// One chunk as Arrow Flight sends it: the IPC message header (flatbuffer) and body.
#[derive(Clone, Debug)]
pub struct EncodedChunk {
    /// `FlightData.data_header`.
    pub header: Bytes,
    /// `FlightData.data_body`.
    pub body: Bytes,
}

impl EncodedChunk {
    /// Total bytes held.
    pub fn len(&self) -> usize {
        self.header.len() + self.body.len()
    }

    /// Whether the chunk holds no bytes at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The result of one materialization, shared by every caller of the single flight.
#[derive(Clone)]
pub enum Materialized {
    /// Kept in the chunk store: read it back from there.
    Stored,
    /// Here are the bytes (a RAM store hands them back; a failed append kept them in the
    /// fallback).
    InMemory(EncodedChunk),
}

/// Default read-ahead budget: how many bytes of chunks a sequential reader's next
/// requests may be decoded ahead of it. Four 8 MiB chunks keep two decoders busy
/// while the reader's transfers run; more only holds cache room longer.
pub const DEFAULT_READ_AHEAD_BYTES: u64 = 32 << 20;

/// Default stability window: sources touched within the last second are waited for
/// before a chunk of them is decoded (docs/decisions/0011).
pub const DEFAULT_SETTLE_WINDOW: Duration = Duration::from_secs(1);

/// Decodes, caches and serves chunks.
pub struct ChunkService {
    store: Arc<dyn ChunkStore>,
    /// Chunks the store could not take while its appends fail, served over `do_get`.
    fallback: MemoryCache,
    decoding: Decodes<Result<Materialized, ChunkError>>,
    buffers: BufferPool,
    /// Decode permits and turns ahead: by the cores for local sources, more for sources
    /// read over a link (`permits.rs`).
    permits: Permits,
    /// How many decodes of local sources run at once (the cores).
    max_decodes: usize,
    read_ahead_bytes: u64,
    /// A source touched more recently than this is not decoded until it is older.
    settle_window: Duration,
    /// Keys queued for decoding ahead and not finished yet.
    queued_ahead: parking_lot::Mutex<HashSet<Vec<u8>>>,
    /// The regions of recent plans, which bound read-ahead (`plans.rs`).
    plans: RecentPlans,
    writes: Writes,
    pending_waits: AtomicU64,
    locates: AtomicU64,
    do_gets: AtomicU64,
    read_aheads: AtomicU64,
    /// Chunks cut out of cached chunks of the other grid (`recut`).
    recuts: AtomicU64,
    /// Where decode and write latencies are recorded.
    metrics: Metrics,
    /// What scaled decodes running together may hold.
    scaled_budget: DecodeBudget,
    /// The rule of compressed replies and the bodies it keeps (docs/decisions/0039).
    wire: Arc<WireBodies>,
}

impl ChunkService {
    /// A service keeping chunks in `store`, holding at most `fallback_bytes` of chunks in
    /// RAM while the store's appends fail, and decoding at most `max_decodes` chunks at once.
    pub fn new(store: Arc<dyn ChunkStore>, fallback_bytes: u64, max_decodes: usize) -> Self {
        Self {
            store,
            fallback: MemoryCache::new(fallback_bytes),
            decoding: Decodes::default(),
            buffers: BufferPool::new(max_decodes),
            permits: Permits::new(max_decodes, DEFAULT_UPSTREAM_FETCHES),
            max_decodes,
            read_ahead_bytes: DEFAULT_READ_AHEAD_BYTES,
            settle_window: DEFAULT_SETTLE_WINDOW,
            queued_ahead: parking_lot::Mutex::new(HashSet::new()),
            plans: RecentPlans::default(),
            writes: Writes::default(),
            pending_waits: AtomicU64::new(0),
            locates: AtomicU64::new(0),
            do_gets: AtomicU64::new(0),
            read_aheads: AtomicU64::new(0),
            recuts: AtomicU64::new(0),
            metrics: Metrics::default(),
            scaled_budget: DecodeBudget::new(DEFAULT_MAX_SCALED_DECODE_BYTES),
            wire: Arc::new(WireBodies::default()),
        }
    }

    /// Sets when `do_get` replies carry zstd-compressed buffers, the memory their kept
    /// bodies may hold (default `auto`, [`DEFAULT_WIRE_COMPRESSION_MEMORY`]) and the
    /// tensors the operator says are labels (default none).
    pub fn with_wire_compression(
        mut self,
        mode: WireCompression,
        memory: u64,
        labels: LabelTensors,
    ) -> Self {
        self.wire = Arc::new(WireBodies::new(mode, memory).with_label_tensors(labels));
        self
    }

    /// The rule of compressed replies and the bodies it keeps.
    pub fn wire_bodies(&self) -> &Arc<WireBodies> {
        &self.wire
    }

    /// Sets the memory all scaled decodes together may hold (default
    /// [`DEFAULT_MAX_SCALED_DECODE_BYTES`]): a scaled decode waits until its share is free,
    /// and one that alone needs more is refused UNAVAILABLE.
    pub fn with_scaled_decode_budget(mut self, bytes: u64) -> Self {
        self.scaled_budget = DecodeBudget::new(bytes);
        self
    }

    /// Sets how many reads of sources that wait on a network link (an upstream server's
    /// chunks, [`crate::source::Source::waits_on_link`]) run at once, apart from the decode
    /// permits of local sources (default [`DEFAULT_UPSTREAM_FETCHES`]; at least one).
    pub fn with_upstream_fetches(mut self, fetches: usize) -> Self {
        self.permits = Permits::new(self.max_decodes, fetches);
        self
    }

    /// Sets the read-ahead budget in bytes (0 turns read-ahead off). The default,
    /// [`DEFAULT_READ_AHEAD_BYTES`], lets cold sequential reads overlap decoding with
    /// sending; the window never exceeds a quarter of the file cache, and a store without
    /// room to read ahead into (RAM) does not read ahead.
    pub fn with_read_ahead(mut self, bytes: u64) -> Self {
        self.read_ahead_bytes = bytes;
        self
    }

    /// Sets the stability window: a source whose mtime or ctime is younger than this is
    /// waited for before a chunk of it is decoded, so a write still in progress is never
    /// cached (docs/decisions/0011). The default is [`DEFAULT_SETTLE_WINDOW`].
    pub fn with_settle_window(mut self, window: Duration) -> Self {
        self.settle_window = window;
        self
    }

    /// Records decode and cache-write latencies in `metrics` (by default in a handle of
    /// its own, which nobody scrapes).
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The flatbuffer header of the schema message that precedes every chunk on `do_get`.
    pub fn schema_header(&self) -> Bytes {
        self.store.schema_header()
    }

    /// The chunk's IPC message, decoding it first if it is cold.
    pub async fn encoded(
        self: &Arc<Self>,
        tensor: &Arc<Tensor>,
        id: &ChunkId,
    ) -> Result<EncodedChunk, ChunkError> {
        self.do_gets.fetch_add(1, Ordering::Relaxed);
        let key = id.segment_key();
        let chunk = match self.cached(&key)? {
            Some(chunk) => chunk,
            None => match self.materialize(tensor, id, &key).await? {
                Materialized::InMemory(chunk) => chunk,
                Materialized::Stored => {
                    self.cached(&key)?
                        .ok_or_else(|| ChunkError::StoredUnreadable {
                            array_id: id.array_id().to_string(),
                        })?
                }
            },
        };
        // After this chunk's own decode, so the request is never queued behind its read-ahead.
        self.read_ahead(tensor, id);
        Ok(chunk)
    }

    /// Counts a chunk served from elsewhere (an upload's store) in the `locates` or
    /// `do_gets` figure of `cache_stats`, which count requests by route.
    pub fn count_served(&self, located: bool) {
        let counter = if located {
            &self.locates
        } else {
            &self.do_gets
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Where the chunk lives in a segment file, decoding it first if it is cold; or why the
    /// client should read it with `do_get` instead.
    pub async fn locate(
        self: &Arc<Self>,
        tensor: &Arc<Tensor>,
        id: &ChunkId,
    ) -> Result<LocateOutcome, ChunkError> {
        let key = id.segment_key();
        let held = match self.store.locate(&key) {
            Ok(held) => held,
            Err(why) => return Ok(LocateOutcome::UseDoGet(why)),
        };
        let found = match held {
            Some(location) => Some(location),
            None => match self.materialize(tensor, id, &key).await? {
                Materialized::Stored => self.store.locate(&key).ok().flatten(),
                Materialized::InMemory(_) => {
                    return Ok(LocateOutcome::UseDoGet(Unlocatable::NotStored));
                }
            },
        };
        let Some(location) = found else {
            return Ok(LocateOutcome::UseDoGet(Unlocatable::Evicted));
        };
        self.locates.fetch_add(1, Ordering::Relaxed);
        self.read_ahead(tensor, id);
        Ok(LocateOutcome::Located(location))
    }

    /// Starts background decodes of the cold chunks a sequential reader of `tensor` will
    /// ask for after `id` (policy in [`readahead`]); returns at once. Decodes ahead share
    /// the decode permits and the single flight with requests, so a request for a chunk
    /// being decoded ahead waits for that decode instead of starting another.
    /// Nothing is read ahead while appends fail: a chunk decoded ahead would only land in
    /// the memory fallback.
    fn read_ahead(self: &Arc<Self>, tensor: &Arc<Tensor>, id: &ChunkId) {
        let Some(room) = self.room_ahead() else {
            return;
        };
        // Scaled chunks are not read ahead: a viewer asks for the few chunks of a level
        // it shows, and each one already reads `scale` times the source of a chunk.
        if id.scale().is_some() {
            return;
        }
        // Ahead on the grid the request was planned on (socket or mapped).
        let Some(grid) = tensor.grid_of(id.region()) else {
            return;
        };
        let window = readahead::window_chunks(
            self.read_ahead_bytes,
            grid.chunk_bytes(tensor.itemsize()),
            room,
        );
        let chunk_of = |region: &Region| ChunkId::new(id.array_id(), id.version(), region.clone());
        let present = |region: &Region| match chunk_of(region) {
            Ok(chunk) => self.is_present(&chunk.segment_key()),
            Err(_) => true,
        };
        // Within the plan the request came from, when it is remembered (`plans.rs`).
        let plan = self.plans.holding(id);
        let planned = |region: &Region| plan.as_ref().is_none_or(|plan| plan.contains(region));
        // Cells up to `window` away are decoded ahead; the files of the next ones are asked
        // of the disk now, so that their reads overlap the decodes before them.
        let index = grid.cell_index(id.region());
        let distance = |region: &Region| match (index, grid.cell_index(region)) {
            (Some(a), Some(b)) => a.abs_diff(b),
            _ => u64::MAX,
        };
        let mut to_prefetch = Vec::new();
        for region in readahead::cells_ahead(grid, id.region(), window * 2 + 1, present) {
            if !planned(&region) {
                continue;
            }
            if distance(&region) > window {
                to_prefetch.push(region);
            } else if let Ok(next) = chunk_of(&region) {
                self.decode_in_background(tensor, next);
            }
        }
        prefetch_in_background(tensor, to_prefetch);
    }

    /// Starts decoding the two end cells of a plan just answered, before the client asks
    /// for either (decision 0022): a whole-tensor reader starts at one end (forward readers
    /// at `first`, dask at `last`), so its first request finds its chunk decoded or being
    /// decoded while the client was still setting up, and the request's own read-ahead goes
    /// on from there. Returns at once. Nothing starts for a plan that is warm at either end
    /// (a later plan of a tensor being read), for a scaled plan, for end cells that are not
    /// byte ranges of their source (compressed or gathered: too dear to guess at), with
    /// read-ahead off (budget 0), without a file cache, or while appends fail.
    ///
    /// The plan's region is remembered either way: requests read ahead only within it.
    pub fn read_ahead_plan(self: &Arc<Self>, tensor: &Arc<Tensor>, first: ChunkId, last: ChunkId) {
        self.plans.record(&first, &last);
        if self.room_ahead().is_none() || first.scale().is_some() || last.scale().is_some() {
            return;
        }
        if self.is_present(&first.segment_key()) || self.is_present(&last.segment_key()) {
            return;
        }
        // Only cells that are byte ranges of their source (copied inside the kernel): a
        // viewer plans a whole tensor and then reads a window of it, and two end cells
        // decoded from compressed tiles (a TIFF's: 128 tiles each) would take the CPU its
        // window needs (decision 0022, amended).
        let cheap = |id: &ChunkId| matches!(tensor.source.byte_range(id.region()), Ok(Some(_)));
        if !cheap(&first) || !cheap(&last) {
            // Their files only: a disk read, no CPU taken from a viewer's window.
            let ends = if first == last {
                vec![first]
            } else {
                vec![first, last]
            };
            prefetch_in_background(tensor, ends.iter().map(|id| id.region().clone()).collect());
            return;
        }
        let same = first == last;
        self.decode_in_background(tensor, first);
        if !same {
            self.decode_in_background(tensor, last);
        }
    }

    /// The cache's room for chunks decoded before anyone asks (read-ahead, plan ends, a grid
    /// fill); `None` when nothing may be: read-ahead off (budget 0), no file cache, or
    /// appends failing (a chunk decoded ahead would only land in the memory fallback).
    fn room_ahead(&self) -> Option<u64> {
        if self.read_ahead_bytes == 0 || self.writes.failing() {
            return None;
        }
        self.store.read_ahead_room()
    }

    /// Whether the chunk under `key` is cached, being decoded, or queued for a decode.
    fn is_present(&self, key: &[u8]) -> bool {
        self.store.contains(key)
            || self.decoding.is_running(key)
            || self.queued_ahead.lock().contains(key)
    }

    /// Decodes `id` into the cache in a background task (counted as a read-ahead), unless
    /// another read-ahead queued it already. Shares the decode permits and the single
    /// flight with requests.
    fn decode_in_background(self: &Arc<Self>, tensor: &Arc<Tensor>, id: ChunkId) {
        let key = id.segment_key();
        // Two requests may pick the same cell: only the first queues it.
        if !self.queued_ahead.lock().insert(key.clone()) {
            return;
        }
        self.read_aheads.fetch_add(1, Ordering::Relaxed);
        let service = self.clone();
        let tensor = tensor.clone();
        tokio::spawn(async move {
            // The turn is waited for outside the single flight: a request for a chunk still
            // queued here decodes it at once, and this decode then finds it stored.
            let pool = service.permits.of(tensor.source.waits_on_link());
            if let Ok(_turn) = pool.ahead.acquire().await
                && let Err(err) = service.materialize(&tensor, &id, &key).await
            {
                tracing::debug!(array_id = id.array_id(), chunk = ?id.region(), error = %err, "decoding ahead failed; the chunk is decoded when requested");
            }
            service.queued_ahead.lock().remove(&key);
        });
    }

    fn cached(&self, key: &[u8]) -> Result<Option<EncodedChunk>, ChunkError> {
        match self.store.read(key)? {
            Some(chunk) => Ok(Some(chunk)),
            None => Ok(self.fallback.get(key)),
        }
    }

    async fn materialize(
        self: &Arc<Self>,
        tensor: &Arc<Tensor>,
        id: &ChunkId,
        key: &[u8],
    ) -> Result<Materialized, ChunkError> {
        let (result, waited) = self
            .decoding
            .run(key, || {
                let service = self.clone();
                let tensor = tensor.clone();
                let id = id.clone();
                async move {
                    // The caller found the chunk cold before it got here; a run that
                    // ended in between has stored it (its entry goes only after the
                    // store), so look again rather than decode it twice. (Not the
                    // memory fallback: a located chunk must reach the file cache, so one
                    // held only in memory is decoded again, to be appended once the
                    // appends' backoff allows.)
                    if service.store.contains(key) {
                        return Ok(Materialized::Stored);
                    }
                    let permit = service
                        .permits
                        .of(tensor.source.waits_on_link())
                        .work
                        .acquire()
                        .await
                        .map_err(|_| ChunkError::ShuttingDown)?;
                    // Held by the decode itself, so it is given back when the decode ends.
                    let reserved = service.reserve_scaled(&tensor, &id).await?;
                    // Set when this future is dropped: nobody waits for the chunk any more,
                    // so a scaled decode stops at its next piece.
                    let abandoned = StopOnDrop::default();
                    let stop = abandoned.flag();
                    let worker = service.clone();
                    let result = tokio::task::spawn_blocking(move || {
                        let _reserved = reserved;
                        let started = std::time::Instant::now();
                        let result = worker.decode_and_store(&tensor, &id, &stop);
                        worker.metrics.record_decode(started.elapsed());
                        result
                    })
                    .await;
                    drop(permit);
                    result.map_err(|e| ChunkError::DecodeTask {
                        source: Arc::new(e),
                    })?
                }
            })
            .await;
        if waited {
            self.pending_waits.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// For a scaled chunk, reserves what computing it may hold from the scaled-decode
    /// budget (waiting for room); `None` for a full-resolution chunk.
    async fn reserve_scaled(
        &self,
        tensor: &Tensor,
        id: &ChunkId,
    ) -> Result<Option<Reserved>, ChunkError> {
        let Some(scale) = id.scale() else {
            return Ok(None);
        };
        let out_bytes = scale
            .reduced(&id.region().shape())
            .iter()
            .fold(tensor.itemsize(), |acc, &d| acc.saturating_mul(d));
        let needed = reduce::decode_bytes(out_bytes);
        match self.scaled_budget.reserve(needed).await {
            Ok(reserved) => Ok(Some(reserved)),
            Err(BudgetError::OverBudget { needed, max }) => Err(ChunkError::OverBudget {
                array_id: id.array_id().to_string(),
                needed,
                max,
            }),
            Err(BudgetError::Closed) => Err(ChunkError::ShuttingDown),
        }
    }

    /// Whether a local client can map chunks now: the store keeps them in files and its
    /// appends are not failing (a chunk that cannot be stored cannot be located).
    pub fn mappable(&self) -> bool {
        self.store.mappable() && !self.writes.failing()
    }

    /// While file cache writes fail: what failed and when they are tried next.
    pub fn writes_paused(&self) -> Option<String> {
        self.writes.paused()
    }

    /// Counters for the `cache_stats` action: the store's, with the service's own added.
    pub fn stats(&self) -> CacheStats {
        let mut stats = self.store.stats();
        stats.pending_waits += self.pending_waits.load(Ordering::Relaxed);
        stats.locates = self.locates.load(Ordering::Relaxed);
        stats.do_gets = self.do_gets.load(Ordering::Relaxed);
        stats.read_aheads = self.read_aheads.load(Ordering::Relaxed);
        stats.recuts = self.recuts.load(Ordering::Relaxed);
        stats.write_failures = self.writes.failures();
        stats.writes_paused = self.writes.paused();
        stats
    }

    /// Seals the open segments so the next start trusts their sidecars.
    pub fn close(&self) {
        if let Err(err) = self.store.close() {
            tracing::error!(error = %err, "sealing the segment store failed");
        }
    }
}

/// A stop flag set when its holder (a decode's waiting future) is dropped.
#[derive(Default)]
struct StopOnDrop(Arc<AtomicBool>);

impl StopOnDrop {
    /// The flag the decode checks.
    fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.0)
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Asks `tensor`'s source to start reading the files of `cells` ([`Source::prefetch`]) on a
/// blocking thread (opening files and queueing their reads may wait on the disk); returns
/// at once.
///
/// [`Source::prefetch`]: crate::source::Source::prefetch
fn prefetch_in_background(tensor: &Arc<Tensor>, cells: Vec<Region>) {
    // Only stores of native chunks read files per chunk; a `.npy` region is one kernel
    // copy when it is decoded, so its reads spawn nothing here.
    if cells.is_empty() || tensor.source.native_chunk().is_none() {
        return;
    }
    let tensor = tensor.clone();
    tokio::task::spawn_blocking(move || {
        for cell in &cells {
            tensor.source.prefetch(&cell.start, &cell.stop);
        }
    });
}

#[cfg(test)]
mod tests;
