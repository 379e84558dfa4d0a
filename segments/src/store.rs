//! [`Store`]: opening a cache directory, lookups, reads, stats and close.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;

use bytes::Bytes;
use parking_lot::Mutex;

use crate::append::Writer;
use crate::boot;
use crate::budget::Budget;
use crate::catalog::Catalog;
use crate::error::StoreError;
use crate::evict::Maintenance;
use crate::fsgate::{self, FsClass};
use crate::ipc;
use crate::layout;
use crate::lockfile;
use crate::map::SharedMap;
use crate::options::StoreOptions;
use crate::recency;
use crate::shared::Shared;
use crate::types::{EntryBytes, EntryMeta, FileRange, Location, StoreStats};

/// Smallest rotation threshold the store uses, whatever the budget.
const MIN_SEGMENT_BYTES: u64 = 64 << 10;

/// An append-only Arrow IPC segment store in one cache directory. `Send + Sync`; share it
/// behind an `Arc`.
///
/// The handle composes the owners: the writer (append path), the maintenance (seal, evict,
/// recency) and, under both, the shared state (catalog, health, budget). Lookups and reads
/// go to the catalog directly.
pub struct Store {
    shared: Arc<Shared>,
    writer: Writer,
    maintenance: Arc<Maintenance>,
    /// Verify each entry's crc32c in [`Store::read`].
    verify_on_read: bool,
    /// The flatbuffer metadata of the schema message (Flight `data_header`).
    schema_meta: Bytes,
    /// The `flock` on `DIR/lock`: held from open until [`Store::close`], which releases it
    /// so another store may open the directory while this one's last readers finish.
    lock: Mutex<Option<File>>,
    maintenance_thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.shared.dir)
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

        let open_segments = opts.open_segments.max(1);
        let segment_bytes = opts
            .segment_bytes
            .min(opts.max_bytes / (2 * open_segments as u64))
            .max(MIN_SEGMENT_BYTES);
        let (catalog, held) = Catalog::restored(booted.segments, booted.clock);
        let budget = Budget::new(
            dir.clone(),
            opts.max_bytes,
            opts.keep_all,
            segment_bytes,
            held,
        );
        let schema_meta = Bytes::copy_from_slice(&schema[8..]);
        let shared = Arc::new(Shared::new(
            dir,
            opts.file_mode,
            schema,
            opts.fault,
            catalog,
            budget,
        ));
        if let Some(reason) = booted.dir_sync_failed {
            shared.health.poison(reason);
        }
        let maintenance = Arc::new(Maintenance::new(
            Arc::clone(&shared),
            opts.shared_maintenance,
        ));
        if maintenance.evict_to_budget() > 0 {
            maintenance.save_recency();
        }
        let handle = if maintenance.is_shared() {
            None
        } else {
            let worker = Arc::clone(&maintenance);
            let handle = std::thread::Builder::new()
                .name("tessera-segments".to_string())
                .spawn(move || worker.run())
                .map_err(|e| StoreError::io("cannot start the segment maintenance thread", e))?;
            Some(handle)
        };
        let writer = Writer::new(
            Arc::clone(&shared),
            Arc::clone(&maintenance),
            segment_bytes,
            open_segments,
            next_id,
        );
        Ok(Store {
            shared,
            writer,
            maintenance,
            verify_on_read: opts.verify_on_read,
            schema_meta,
            lock: Mutex::new(Some(lock)),
            maintenance_thread: Mutex::new(handle),
        })
    }

    /// Does the maintenance work queued now (seals rotated segments, evicts to the budget,
    /// saves recency), on the calling thread: the pass of the owner's worker for a store
    /// opened [`StoreOptions::with_shared_maintenance`]. Cheap when there is nothing to do.
    pub fn maintain(&self) {
        self.maintenance.maintain_now();
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
        self.writer.append(key, meta, data)
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
        self.writer.append_from_file(key, meta, src, check)
    }

    /// Whether `key` is stored. Unlike [`Store::locate`] it counts nothing and leaves the
    /// segment's recency alone: for callers deciding whether to fill a key, not readers.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.shared.catalog.get(key).is_some()
    }

    /// Where `key` lives, if stored: one map lookup (counts a hit or a miss and refreshes the
    /// segment's recency).
    pub fn locate(&self, key: &[u8]) -> Option<Location> {
        self.shared.catalog.lookup(key).map(|e| e.location())
    }

    /// The message of `key` as zero-copy slices of a mapping of its segment (`None` when not
    /// stored, or evicted meanwhile). With verify-on-read, the body's crc32c is checked.
    pub fn read(&self, key: &[u8]) -> Result<Option<EntryBytes>, StoreError> {
        let Some(e) = self.shared.catalog.lookup(key) else {
            return Ok(None);
        };
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
        if self.verify_on_read {
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
            location: e.location(),
            header,
            body,
        }))
    }

    /// The flatbuffer metadata of the segments' schema message (Flight `data_header` of the
    /// first `FlightData` of a `do_get` stream).
    pub fn schema_message(&self) -> Bytes {
        self.schema_meta.clone()
    }

    /// Current counters and sizes (a ceiling left by a full disk is raised first, if the disk
    /// has room again).
    pub fn stats(&self) -> StoreStats {
        let shared = &self.shared;
        shared.budget.raise_ceiling();
        let (hits, misses) = shared.catalog.hits_and_misses();
        let mut stats = StoreStats {
            total_entries: shared.catalog.entries(),
            max_entries: 0,
            hits,
            misses,
            segments: shared.catalog.segment_count(),
            ..StoreStats::default()
        };
        shared.budget.fill_stats(&mut stats);
        self.writer.fill_stats(&mut stats);
        self.maintenance.fill_stats(&mut stats);
        stats
    }

    /// The byte budget the store evicts down to (less while its filesystem is full: see
    /// [`StoreStats::disk_ceiling`]).
    pub fn max_bytes(&self) -> u64 {
        self.shared.budget.max_bytes()
    }

    /// The cache directory (canonical).
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Records `note` (one line, e.g. where the owning server listens) beside the pid in
    /// the lock file, so an open refused by the lock names it ([`StoreError::Locked`]).
    pub fn note_holder(&self, note: &str) -> Result<(), StoreError> {
        match self.lock.lock().as_ref() {
            Some(lock) => lockfile::write_note(lock, &self.shared.dir, note),
            None => Err(StoreError::Closed {
                dir: self.shared.dir.clone(),
            }),
        }
    }

    /// Seals every open segment (end-of-stream marker, fsync, sidecar), stops the maintenance
    /// thread, saves recency and releases the directory lock: another store may open the
    /// directory once this returns, even while handles to this one still read. Idempotent;
    /// later appends fail with [`StoreError::Closed`], lookups and reads keep working. Also
    /// run, best effort, on drop.
    pub fn close(&self) -> Result<(), StoreError> {
        if !self.shared.health.close() {
            return Ok(());
        }
        for active in self.writer.take_open() {
            self.maintenance.seal_now(active);
        }
        self.maintenance.stop();
        if let Some(handle) = self.maintenance_thread.lock().take()
            && handle.join().is_err()
        {
            tracing::error!(dir = %self.shared.dir.display(), "segment maintenance thread panicked");
        }
        // Without a thread of its own, what the owner's worker has not done yet.
        self.maintenance.maintain_now();
        self.maintenance.evict_to_budget();
        self.maintenance.save_recency();
        // Nothing of this store writes to the directory any more: appends are refused and
        // the maintenance thread has stopped.
        drop(self.lock.lock().take());
        self.shared.health.check_not_poisoned()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, "closing the segment store on drop");
        }
    }
}
