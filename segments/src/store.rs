//! [`Store`]: opening a cache directory, lookups, reads, stats and close.

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

use crate::boot;
use crate::budget::Budget;
use crate::error::StoreError;
use crate::evict::Maintenance;
use crate::fault::FaultInjector;
use crate::fsgate::{self, FsClass};
use crate::index::{Index, IndexEntry};
use crate::ipc;
use crate::layout;
use crate::lockfile;
use crate::map::SharedMap;
use crate::options::StoreOptions;
use crate::recency;
use crate::segment::{Active, Segment};
use crate::types::{EntryBytes, EntryMeta, FileRange, Location, StoreStats};

/// Smallest rotation threshold the store uses, whatever the budget.
const MIN_SEGMENT_BYTES: u64 = 64 << 10;

/// Event counters behind [`StoreStats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    pub pending_waits: AtomicU64,
    pub evictions_blocked: AtomicU64,
    pub budget_waits: AtomicU64,
    pub budget_overruns: AtomicU64,
    pub oversized: AtomicU64,
    pub unlinked_bytes: AtomicU64,
    pub disk_full: AtomicU64,
}

/// State shared by the store handle and its maintenance thread.
pub(crate) struct Inner {
    pub dir: PathBuf,
    pub segdir: PathBuf,
    pub max_bytes: u64,
    /// Lowered below `max_bytes` while the filesystem is full ([`crate::diskfull`]).
    pub ceiling: AtomicU64,
    pub segment_bytes: u64,
    pub mode: u32,
    pub verify_on_read: bool,
    /// Never evict ([`StoreOptions::with_keep_all`]).
    pub keep_all: bool,
    pub fault: Option<Arc<dyn FaultInjector>>,
    /// The `flock` on `DIR/lock`: held from open until [`Store::close`], which releases it
    /// so another store may open the directory while this one's last readers finish.
    pub lock: Mutex<Option<File>>,
    /// The encapsulated schema message that starts every segment.
    pub schema: Vec<u8>,
    schema_meta: Bytes,
    pub index: Index,
    pub segments: Mutex<BTreeMap<u64, Arc<Segment>>>,
    pub shards: Box<[Mutex<Option<Active>>]>,
    pub next_shard: AtomicUsize,
    pub next_id: Mutex<u64>,
    pub inflight: Mutex<HashSet<Box<[u8]>>>,
    pub inflight_done: Condvar,
    pub clock: AtomicU64,
    pub total_bytes: AtomicU64,
    pub counters: Counters,
    pub poisoned: Mutex<Option<String>>,
    pub closed: AtomicBool,
    pub maintenance: Maintenance,
    /// Admission of appends to the byte budget.
    pub budget: Budget,
}

impl Inner {
    pub(crate) fn fault(&self) -> Option<&dyn FaultInjector> {
        self.fault.as_deref()
    }

    /// Marks `seg` used now.
    pub(crate) fn touch(&self, seg: &Segment) {
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        seg.last_use.fetch_max(now, Ordering::Relaxed);
    }

    /// Refuses all further writes, keeping the first reason.
    pub(crate) fn poison(&self, reason: String) {
        let mut slot = self.poisoned.lock();
        if slot.is_none() {
            tracing::error!(dir = %self.dir.display(), %reason, "segment store refuses further writes");
            *slot = Some(reason);
        }
    }

    /// Errors when the store cannot take writes.
    pub(crate) fn check_writable(&self) -> Result<(), StoreError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed {
                dir: self.dir.clone(),
            });
        }
        match self.poisoned.lock().as_ref() {
            Some(reason) => Err(StoreError::Poisoned {
                dir: self.dir.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }
}

/// The location an index entry answers.
pub(crate) fn location(e: &IndexEntry) -> Location {
    Location {
        segment_path: e.seg.path.clone(),
        byte_offset: e.offset,
        byte_length: e.length,
        generation_id: e.seg.inode,
    }
}

/// An append-only Arrow IPC segment store in one cache directory. `Send + Sync`; share it
/// behind an `Arc`.
pub struct Store {
    inner: Arc<Inner>,
    maintenance_thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::io(format!("cannot {what} {}", path.display()), e)
}

impl Store {
    /// Opens (creating if needed) the store in `opts`' directory: refuses a network
    /// filesystem (unless allowed), takes the directory lock, checks the format version,
    /// restores the index from sidecars or by walking segments, and enforces the budget.
    pub fn open(opts: StoreOptions) -> Result<Store, StoreError> {
        layout::create_private_dir(&opts.dir, opts.file_mode)
            .map_err(|e| io_err("create", &opts.dir, e))?;
        let dir = opts
            .dir
            .canonicalize()
            .map_err(|e| io_err("resolve", &opts.dir, e))?;
        if !opts.allow_network_fs
            && let FsClass::Network(fstype) =
                fsgate::classify_dir(&dir).map_err(|e| io_err("statfs", &dir, e))?
        {
            return Err(StoreError::NetworkFilesystem { dir, fstype });
        }
        let lock = lockfile::acquire(&dir)?;
        layout::check_or_init_format(&dir, opts.file_mode)?;
        let schema = ipc::schema_message().map_err(|e| StoreError::InvalidEntry {
            reason: e.to_string(),
        })?;
        let recency = recency::load(&dir);
        let booted = boot::boot(
            &dir,
            &schema,
            opts.file_mode,
            &recency,
            opts.fault.as_deref(),
        )?;
        let persisted = layout::read_next_id(&dir)?;
        let next_id = persisted.max(booted.max_id.map_or(0, |m| m + 1));

        let open_segments = opts.open_segments.max(1) as u64;
        let segment_bytes = opts
            .segment_bytes
            .min(opts.max_bytes / (2 * open_segments))
            .max(MIN_SEGMENT_BYTES);
        let index = Index::new();
        let mut segments = BTreeMap::new();
        let mut total_bytes = 0;
        for restored in booted.segments {
            let seg = restored.seg;
            total_bytes += seg.disk_bytes.load(Ordering::Relaxed);
            for e in restored.entries {
                let entry = IndexEntry {
                    seg: Arc::clone(&seg),
                    offset: e.offset,
                    length: e.length,
                    meta_len: e.meta_len,
                    crc: e.crc,
                };
                index.insert(e.key, entry);
            }
            segments.insert(seg.id, seg);
        }
        let schema_meta = Bytes::copy_from_slice(&schema[8..]);
        let inner = Arc::new(Inner {
            segdir: layout::segments_dir(&dir),
            dir,
            max_bytes: opts.max_bytes,
            ceiling: AtomicU64::new(crate::diskfull::NO_CEILING),
            segment_bytes,
            mode: opts.file_mode,
            verify_on_read: opts.verify_on_read,
            keep_all: opts.keep_all,
            fault: opts.fault,
            lock: Mutex::new(Some(lock)),
            schema,
            schema_meta,
            index,
            segments: Mutex::new(segments),
            shards: (0..open_segments).map(|_| Mutex::new(None)).collect(),
            next_shard: AtomicUsize::new(0),
            next_id: Mutex::new(next_id),
            inflight: Mutex::new(HashSet::new()),
            inflight_done: Condvar::new(),
            clock: AtomicU64::new(booted.clock),
            total_bytes: AtomicU64::new(total_bytes),
            counters: Counters::default(),
            poisoned: Mutex::new(None),
            closed: AtomicBool::new(false),
            maintenance: Maintenance::new(opts.shared_maintenance),
            budget: Budget::default(),
        });
        if let Some(reason) = booted.dir_sync_failed {
            inner.poison(reason);
        }
        if inner.evict_to_budget() > 0 {
            inner.save_recency();
        }
        let handle = if inner.maintenance.is_shared() {
            None
        } else {
            let worker = Arc::clone(&inner);
            let handle = std::thread::Builder::new()
                .name("tessera-segments".to_string())
                .spawn(move || worker.maintenance_loop())
                .map_err(|e| StoreError::io("cannot start the segment maintenance thread", e))?;
            Some(handle)
        };
        Ok(Store {
            inner,
            maintenance_thread: Mutex::new(handle),
        })
    }

    /// Does the maintenance work queued now (seals rotated segments, evicts to the budget,
    /// saves recency), on the calling thread: the pass of the owner's worker for a store
    /// opened [`StoreOptions::with_shared_maintenance`]. Cheap when there is nothing to do.
    pub fn maintain(&self) {
        self.inner.maintain_now();
    }

    /// Appends a chunk under `key` and returns where it lives. `data`'s pieces, concatenated,
    /// are the chunk's raw C-order bytes; they go to the file in one vectored write. When
    /// `key` is already stored (or being stored by another thread, which is waited for), the
    /// existing location is returned and nothing is written.
    pub fn append(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        data: &[&[u8]],
    ) -> Result<Location, StoreError> {
        let appended = self.inner.append(key, meta, data);
        if let Err(err) = &appended {
            self.inner.note_append_error(err);
        }
        appended
    }

    /// Appends a chunk under `key` whose raw C-order bytes are `src`'s byte range, copied
    /// file to file inside the kernel (`copy_file_range(2)`; a read/write loop where the
    /// kernel cannot): one copy, and the source is never mapped. The crc32c is computed from
    /// the bytes as they lie in the segment. Deduplicated like [`Store::append`].
    ///
    /// A source that shrank under the copy is [`StoreError::SourceShort`]; like a write
    /// error it seals the segment at its last good entry and leaves the store usable.
    pub fn append_from_file(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        src: FileRange<'_>,
    ) -> Result<Location, StoreError> {
        match self
            .append_from_file_checked(key, meta, src, || Ok::<(), std::convert::Infallible>(()))?
        {
            Ok(location) => Ok(location),
            Err(never) => match never {},
        }
    }

    /// [`Store::append_from_file`] with a caller check that runs after the bytes are in the
    /// segment and before the entry is committed (its header written, its key indexed): the
    /// place to re-check that the source did not change during the copy. When `check`
    /// refuses, nothing is stored (the segment is sealed at its last good entry, as after a
    /// write error) and its error comes back as the inner `Err`; the outer `Err` is the
    /// store's own failure. An already stored key is answered without running `check`.
    pub fn append_from_file_checked<E>(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        src: FileRange<'_>,
        check: impl FnOnce() -> Result<(), E>,
    ) -> Result<Result<Location, E>, StoreError> {
        let appended = self.inner.append_from_file(key, meta, src, check);
        if let Err(err) = &appended {
            self.inner.note_append_error(err);
        }
        appended
    }

    /// Whether `key` is stored. Unlike [`Store::locate`] it counts nothing and leaves the
    /// segment's recency alone: for callers deciding whether to fill a key, not readers.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.inner.index.get(key).is_some()
    }

    /// Where `key` lives, if stored: one map lookup (counts a hit or a miss and refreshes the
    /// segment's recency).
    pub fn locate(&self, key: &[u8]) -> Option<Location> {
        let inner = &self.inner;
        match inner.index.get(key) {
            Some(e) => {
                inner.counters.hits.fetch_add(1, Ordering::Relaxed);
                inner.touch(&e.seg);
                Some(location(&e))
            }
            None => {
                inner.counters.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// The message of `key` as zero-copy slices of a mapping of its segment (`None` when not
    /// stored, or evicted meanwhile). With verify-on-read, the body's crc32c is checked.
    pub fn read(&self, key: &[u8]) -> Result<Option<EntryBytes>, StoreError> {
        let inner = &self.inner;
        let Some(e) = inner.index.get(key) else {
            inner.counters.misses.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        inner.counters.hits.fetch_add(1, Ordering::Relaxed);
        inner.touch(&e.seg);
        let end = e.offset + e.length;
        let map = match e.seg.map_covering(end) {
            Ok(map) => map,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(io_err("map", &e.seg.path, err)),
        };
        let all = Bytes::from_owner(SharedMap(map));
        let body_start = (e.offset + 8 + u64::from(e.meta_len)) as usize;
        let header = all.slice((e.offset + 8) as usize..body_start);
        let body = all.slice(body_start..end as usize);
        if inner.verify_on_read {
            let found = crc32c::crc32c(&body);
            if found != e.crc {
                return Err(StoreError::ChecksumMismatch {
                    path: e.seg.path.clone(),
                    offset: e.offset,
                    expected: e.crc,
                    found,
                });
            }
        }
        Ok(Some(EntryBytes {
            location: location(&e),
            header,
            body,
        }))
    }

    /// The flatbuffer metadata of the segments' schema message (Flight `data_header` of the
    /// first `FlightData` of a `do_get` stream).
    pub fn schema_message(&self) -> Bytes {
        self.inner.schema_meta.clone()
    }

    /// Current counters and sizes (a ceiling left by a full disk is raised first, if the disk
    /// has room again).
    pub fn stats(&self) -> StoreStats {
        let inner = &self.inner;
        inner.raise_ceiling();
        let c = &inner.counters;
        StoreStats {
            total_entries: inner.index.len(),
            total_bytes: inner.total_bytes.load(Ordering::Relaxed),
            max_entries: 0,
            max_bytes: inner.max_bytes,
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            evictions: c.evictions.load(Ordering::Relaxed),
            pending_waits: c.pending_waits.load(Ordering::Relaxed),
            ref_held_evictions_skipped: c.evictions_blocked.load(Ordering::Relaxed),
            oversized_skips: c.oversized.load(Ordering::Relaxed),
            budget_waits: c.budget_waits.load(Ordering::Relaxed),
            budget_overruns: c.budget_overruns.load(Ordering::Relaxed),
            unlinked_bytes: c.unlinked_bytes.load(Ordering::Relaxed),
            segments: inner.segments.lock().len() as u64,
            disk_full_events: c.disk_full.load(Ordering::Relaxed),
            disk_ceiling: inner.ceiling(),
        }
    }

    /// The byte budget the store evicts down to (less while its filesystem is full: see
    /// [`StoreStats::disk_ceiling`]).
    pub fn max_bytes(&self) -> u64 {
        self.inner.max_bytes
    }

    /// The cache directory (canonical).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Records `note` (one line, e.g. where the owning server listens) beside the pid in
    /// the lock file, so an open refused by the lock names it ([`StoreError::Locked`]).
    pub fn note_holder(&self, note: &str) -> Result<(), StoreError> {
        match self.inner.lock.lock().as_ref() {
            Some(lock) => lockfile::write_note(lock, &self.inner.dir, note),
            None => Err(StoreError::Closed {
                dir: self.inner.dir.clone(),
            }),
        }
    }

    /// Seals every open segment (end-of-stream marker, fsync, sidecar), stops the maintenance
    /// thread, saves recency and releases the directory lock: another store may open the
    /// directory once this returns, even while handles to this one still read. Idempotent;
    /// later appends fail with [`StoreError::Closed`], lookups and reads keep working. Also
    /// run, best effort, on drop.
    pub fn close(&self) -> Result<(), StoreError> {
        let inner = &self.inner;
        if inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        for shard in inner.shards.iter() {
            let active = shard.lock().take();
            if let Some(active) = active {
                inner.seal_now(active);
            }
        }
        inner.maintenance.stop();
        if let Some(handle) = self.maintenance_thread.lock().take()
            && handle.join().is_err()
        {
            tracing::error!(dir = %inner.dir.display(), "segment maintenance thread panicked");
        }
        // Without a thread of its own, what the owner's worker has not done yet.
        inner.maintain_now();
        inner.evict_to_budget();
        inner.save_recency();
        // Nothing of this store writes to the directory any more: appends are refused and
        // the maintenance thread has stopped.
        drop(inner.lock.lock().take());
        match inner.poisoned.lock().as_ref() {
            Some(reason) => Err(StoreError::Poisoned {
                dir: inner.dir.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, "closing the segment store on drop");
        }
    }
}
