//! The append path: deduplication of concurrent appends, shard choice, rotation, the one
//! vectored write per entry, and sealing on write failure.
//!
//! Two ways in: [`Writer::append`] writes data held in memory with one vectored write, and
//! [`Writer::append_from_file`] copies it from a byte range of another file inside the kernel
//! ([`crate::copy`]). Both share the claim, the rotation, the failure rule and the commit.
//!
//! [`Writer`] owns the open segments (one per shard), the segment-id high-water mark and the
//! keys being written. It asks the budget for admission, hands rotated segments to the
//! maintenance and seals a segment whose write failed through it; neither calls back here.

use std::collections::HashSet;
use std::io::IoSlice;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::budget::Reservation;
use crate::copy::{self, CopyFailure};
use crate::error::StoreError;
use crate::evict::Maintenance;
use crate::index::IndexEntry;
use crate::ipc::EntryBody;
use crate::layout::{self, DurableError};
use crate::map;
use crate::segment::{self, Active};
use crate::shared::Shared;
use crate::sidecar::{self, SidecarEntry};
use crate::types::{EntryMeta, FileRange, Location, StoreStats};

/// Most padding [`EntryBody::message`] may add for alignment.
const MAX_ALIGN_PAD: u64 = 64;

/// Removes a key from the in-flight set when its append ends (either way).
struct InFlight<'a> {
    writer: &'a Writer,
    key: &'a [u8],
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.writer.inflight.lock().remove(self.key);
        self.writer.inflight_done.notify_all();
    }
}

enum Claim<'a> {
    /// The key got stored (by someone else) meanwhile.
    Stored(Location),
    /// This caller writes it.
    Mine(InFlight<'a>),
}

/// What an append found before writing anything.
enum Start<'a> {
    /// The key is already stored here.
    Stored(Location),
    /// This caller writes the entry: its claim, body layout and an upper bound of its length.
    Write(InFlight<'a>, EntryBody, u64),
}

/// The entry being written: its offset, encapsulated message header and total length.
struct Placed {
    offset: u64,
    message: Vec<u8>,
    total: u64,
}

/// The append path of one store.
#[derive(Debug)]
pub(crate) struct Writer {
    shared: Arc<Shared>,
    maintenance: Arc<Maintenance>,
    /// Rotation threshold: a segment takes no entry past it.
    segment_bytes: u64,
    /// The open segment of each shard (`None` until the first append, or after a seal).
    shards: Box<[Mutex<Option<Active>>]>,
    next_shard: AtomicUsize,
    /// The next segment id (its high-water mark is persisted before use).
    next_id: Mutex<u64>,
    /// Keys being written now; a second append of one waits for the first.
    inflight: Mutex<HashSet<Box<[u8]>>>,
    inflight_done: Condvar,
    /// Appends that waited for a concurrent append of the same key.
    pending_waits: AtomicU64,
    /// Appends refused as larger than a segment may hold.
    oversized: AtomicU64,
}

impl Writer {
    /// The writer of `shared` with `open_segments` shards, rotating at `segment_bytes`, the
    /// next segment id being `next_id`.
    pub(crate) fn new(
        shared: Arc<Shared>,
        maintenance: Arc<Maintenance>,
        segment_bytes: u64,
        open_segments: usize,
        next_id: u64,
    ) -> Writer {
        Writer {
            shared,
            maintenance,
            segment_bytes,
            shards: (0..open_segments.max(1))
                .map(|_| Mutex::new(None))
                .collect(),
            next_shard: AtomicUsize::new(0),
            next_id: Mutex::new(next_id),
            inflight: Mutex::new(HashSet::new()),
            inflight_done: Condvar::new(),
            pending_waits: AtomicU64::new(0),
            oversized: AtomicU64::new(0),
        }
    }

    /// Takes every shard's open segment, for sealing at close.
    pub(crate) fn take_open(&self) -> Vec<Active> {
        self.shards.iter().filter_map(|s| s.lock().take()).collect()
    }

    /// Fills the writer's figures of `out`.
    pub(crate) fn fill_stats(&self, out: &mut StoreStats) {
        out.pending_waits = self.pending_waits.load(Ordering::Relaxed);
        out.oversized_skips = self.oversized.load(Ordering::Relaxed);
    }

    /// A failed append: a full disk lowers the budget's ceiling and asks for eviction.
    fn note_error<T>(&self, appended: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(err) = &appended
            && self.shared.budget.note_append_error(err)
        {
            self.maintenance.wake();
        }
        appended
    }

    /// Appends an entry whose data, in pieces, is held in memory (see [`crate::Store::append`]).
    pub(crate) fn append(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        data: &[&[u8]],
    ) -> Result<Location, StoreError> {
        self.note_error(self.append_slices(key, meta, data))
    }

    /// Appends an entry whose data is `src`'s byte range (see [`Writer::append_copied`]).
    pub(crate) fn append_from_file<E>(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        src: FileRange<'_>,
        check: impl FnOnce() -> Result<(), E>,
    ) -> Result<Result<Location, E>, StoreError> {
        self.note_error(self.append_copied(key, meta, src, check))
    }

    fn append_slices(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        data: &[&[u8]],
    ) -> Result<Location, StoreError> {
        let data_len: u64 = data.iter().map(|d| d.len() as u64).sum();
        let (_claim, body, bound) = match self.start(key, meta, data_len)? {
            Start::Stored(loc) => return Ok(loc),
            Start::Write(claim, body, bound) => (claim, body, bound),
        };
        let crc = body.crc32c(data);
        let _room = self.admit(bound + sidecar::entry_len(key));
        let mut shard = self.lock_shard();
        let (active, placed) = self.place(&mut shard, &body, bound, Some(crc))?;
        let mut slices = Vec::with_capacity(data.len() + 3);
        slices.push(IoSlice::new(&placed.message));
        slices.push(IoSlice::new(body.prefix()));
        slices.extend(
            data.iter()
                .filter(|d| !d.is_empty())
                .map(|d| IoSlice::new(d)),
        );
        if !body.suffix().is_empty() {
            slices.push(IoSlice::new(body.suffix()));
        }
        let fault = self.shared.fault().map(|f| (f, active.seg.id));
        if let Err(failure) =
            segment::write_vectored_at(&active.file, &mut slices, placed.offset, fault)
        {
            return Err(self.fail(&mut shard, &placed, failure.written, failure.error));
        }
        Ok(self.commit(active, key, &placed, crc))
    }

    /// Appends an entry whose data is `src`'s byte range, copied file to file inside the
    /// kernel. Order of writes: body prefix, data, suffix; the crc32c is computed over the
    /// body as it now lies in the segment; then `check` runs; only when it passes is the
    /// message header (which carries the crc) written and the entry indexed. Any failure
    /// (short source, I/O error, refused check) seals the segment at its last good entry, so
    /// no entry is ever locatable over torn or refused bytes, and no later boot walk can
    /// find a complete message there either (its header was never written).
    fn append_copied<E>(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        src: FileRange<'_>,
        check: impl FnOnce() -> Result<(), E>,
    ) -> Result<Result<Location, E>, StoreError> {
        let (_claim, body, bound) = match self.start(key, meta, src.len)? {
            Start::Stored(loc) => return Ok(Ok(loc)),
            Start::Write(claim, body, bound) => (claim, body, bound),
        };
        let _room = self.admit(bound + sidecar::entry_len(key));
        let mut shard = self.lock_shard();
        // The crc is fixed-width hex in the header, so a placeholder sizes it exactly.
        let (active, mut placed) = self.place(&mut shard, &body, bound, Some(0))?;
        let body_at = placed.offset + placed.message.len() as u64;
        let fault = self.shared.fault().map(|f| (f, active.seg.id));
        if let Some(f) = fault.and_then(|(f, id)| f.on_entry_write(id, placed.offset, placed.total))
        {
            return Err(self.fail(&mut shard, &placed, 0, f.error));
        }
        match copy::write_body(&active.file, &body, body_at, src) {
            Ok(()) => {}
            Err(CopyFailure::SourceShort { copied }) => {
                let short = std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the source ended before the range did",
                );
                let _sealed = self.fail(&mut shard, &placed, copied, short);
                return Err(StoreError::SourceShort {
                    offset: src.offset,
                    expected: src.len,
                    copied,
                });
            }
            Err(CopyFailure::Io { copied, error }) => {
                return Err(self.fail(&mut shard, &placed, copied, error));
            }
        }
        let crc = match map::with_range(&active.file, body_at, body.len(), crc32c::crc32c) {
            Ok(crc) => crc,
            Err(error) => return Err(self.fail(&mut shard, &placed, 0, error)),
        };
        if let Err(refused) = check() {
            let _sealed = self.fail(
                &mut shard,
                &placed,
                0,
                std::io::Error::other("the caller's check refused the source bytes"),
            );
            return Ok(Err(refused));
        }
        let message = match body.message(placed.offset, Some(crc)) {
            Ok(m) if m.len() == placed.message.len() => m,
            Ok(m) => {
                let reason = format!(
                    "the entry header changed length with its checksum ({} vs {} bytes)",
                    m.len(),
                    placed.message.len()
                );
                let _sealed = self.fail(
                    &mut shard,
                    &placed,
                    0,
                    std::io::Error::other(reason.clone()),
                );
                return Err(StoreError::InvalidEntry { reason });
            }
            Err(e) => {
                let _sealed =
                    self.fail(&mut shard, &placed, 0, std::io::Error::other(e.to_string()));
                return Err(e.into());
            }
        };
        placed.message = message;
        if let Err(error) = active.file.write_all_at(&placed.message, placed.offset) {
            return Err(self.fail(&mut shard, &placed, 0, error));
        }
        Ok(Ok(self.commit(active, key, &placed, crc)))
    }

    /// Admits an append of up to `bytes` to the budget (waiting for eviction if need be).
    fn admit(&self, bytes: u64) -> Reservation<'_> {
        let wake = || self.maintenance.wake();
        self.shared.budget.admit(bytes, &self.shared.health, wake)
    }

    /// Refuses what cannot be written, answers an already stored key, or claims the key.
    fn start<'a>(
        &'a self,
        key: &'a [u8],
        meta: &EntryMeta,
        data_len: u64,
    ) -> Result<Start<'a>, StoreError> {
        self.shared.health.check_writable()?;
        if let Some(e) = self.shared.catalog.get(key) {
            self.shared.catalog.touch(&e.seg);
            return Ok(Start::Stored(e.location()));
        }
        let body =
            EntryBody::new(key, &meta.shape, &meta.dtype, data_len).map_err(StoreError::from)?;
        let bound = body.message(0, Some(0)).map_err(StoreError::from)?.len() as u64
            + MAX_ALIGN_PAD
            + body.len();
        let limit = self.max_entry_len();
        if bound > limit {
            self.oversized.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::EntryTooLarge {
                len: bound,
                reason: format!(
                    "a segment of {} holds entries of at most {limit} bytes",
                    self.shared.dir.display()
                ),
            });
        }
        Ok(match self.claim(key) {
            Claim::Stored(loc) => Start::Stored(loc),
            Claim::Mine(claim) => Start::Write(claim, body, bound),
        })
    }

    /// Largest encoded entry a segment accepts (a segment must hold at least one).
    fn max_entry_len(&self) -> u64 {
        self.segment_bytes.saturating_sub(
            self.shared.schema.len() as u64 + crate::ipc::END_OF_STREAM.len() as u64,
        )
    }

    /// Registers `key` as being written, or waits for a concurrent writer of it.
    fn claim<'a>(&'a self, key: &'a [u8]) -> Claim<'a> {
        let mut set = self.inflight.lock();
        loop {
            if let Some(e) = self.shared.catalog.get(key) {
                self.shared.catalog.touch(&e.seg);
                return Claim::Stored(e.location());
            }
            if !set.contains(key) {
                set.insert(key.into());
                return Claim::Mine(InFlight { writer: self, key });
            }
            self.pending_waits.fetch_add(1, Ordering::Relaxed);
            self.inflight_done.wait(&mut set);
        }
    }

    /// Locks a shard, preferring one no other appender holds.
    fn lock_shard(&self) -> MutexGuard<'_, Option<Active>> {
        let n = self.shards.len();
        let start = self.next_shard.fetch_add(1, Ordering::Relaxed) % n;
        (0..n)
            .find_map(|i| self.shards[(start + i) % n].try_lock())
            .unwrap_or_else(|| self.shards[start].lock())
    }

    /// Makes sure the shard has an active segment with room for `bound` bytes (rotating a
    /// full one) and encodes the entry's message header for the offset it will take.
    fn place<'s>(
        &self,
        shard: &'s mut Option<Active>,
        body: &EntryBody,
        bound: u64,
        crc: Option<u32>,
    ) -> Result<(&'s mut Active, Placed), StoreError> {
        self.shared.health.check_writable()?;
        let current = match shard.take() {
            Some(a) if !a.entries.is_empty() && a.end + bound > self.segment_bytes => {
                self.maintenance.queue_seal(a);
                self.open_segment()?
            }
            Some(a) => a,
            None => self.open_segment()?,
        };
        let active = shard.insert(current);
        let offset = active.end;
        let message = body.message(offset, crc).map_err(StoreError::from)?;
        let total = message.len() as u64 + body.len();
        Ok((
            active,
            Placed {
                offset,
                message,
                total,
            },
        ))
    }

    /// A failed entry write: seals the shard's segment at its last good entry (the
    /// end-of-stream marker goes over whatever part of the entry reached the file) and
    /// describes the failure. The next append opens a new segment.
    fn fail(
        &self,
        shard: &mut Option<Active>,
        placed: &Placed,
        written: u64,
        error: std::io::Error,
    ) -> StoreError {
        let path = shard
            .as_ref()
            .map(|a| a.seg.path.clone())
            .unwrap_or_default();
        if let Some(broken) = shard.take() {
            self.maintenance.seal_now(broken);
        }
        StoreError::io(
            format!(
                "cannot append an entry of {} bytes to {} at offset {} ({written} bytes \
                 written); the segment is sealed at its last good entry and the next append \
                 starts a new segment",
                placed.total,
                path.display(),
                placed.offset,
            ),
            error,
        )
    }

    /// Records a completely written entry: advances the segment and indexes the entry.
    /// Called with the shard still locked, so the segment cannot be sealed and evicted
    /// before its entry is in the index.
    /// The entry's sidecar record is counted now, not at the seal, so that the budget sees
    /// every byte an admitted append adds.
    fn commit(&self, active: &mut Active, key: &[u8], placed: &Placed, crc: u32) -> Location {
        let meta_len = (placed.message.len() - 8) as u32;
        let added = placed.total + sidecar::entry_len(key);
        active.end += placed.total;
        active.seg.readable_end.store(active.end, Ordering::Release);
        active.seg.disk_bytes.fetch_add(added, Ordering::Relaxed);
        active.entries.push(SidecarEntry {
            offset: placed.offset,
            length: placed.total,
            meta_len,
            crc,
            key: key.into(),
        });
        let entry = IndexEntry {
            seg: Arc::clone(&active.seg),
            offset: placed.offset,
            length: placed.total,
            meta_len,
            crc,
        };
        let catalog = &self.shared.catalog;
        catalog.touch(&entry.seg);
        let location = entry.location();
        catalog.insert(key.into(), entry);
        if self.shared.budget.grow(added) {
            self.maintenance.wake();
        }
        location
    }

    /// Creates the next segment: persists the high-water mark first, then the file.
    fn open_segment(&self) -> Result<Active, StoreError> {
        let shared = &self.shared;
        let id = {
            let mut next = self.next_id.lock();
            let id = *next;
            match layout::persist_next_id(&shared.dir, id + 1, shared.mode, shared.fault()) {
                Ok(()) => {}
                Err(DurableError::Sync(e)) => {
                    let reason = format!(
                        "fsync of the segment id high-water mark in {} failed: {e}",
                        shared.dir.display()
                    );
                    shared.health.poison(reason.clone());
                    return Err(StoreError::Poisoned {
                        dir: shared.dir.clone(),
                        reason,
                    });
                }
                Err(DurableError::Write(e)) => {
                    return Err(StoreError::io(
                        format!(
                            "cannot persist the segment id high-water mark in {}",
                            shared.dir.display()
                        ),
                        e,
                    ));
                }
            }
            *next = id + 1;
            id
        };
        let path = layout::segment_path(&shared.dir, id);
        let now = shared.catalog.tick();
        let active = segment::create(&path, id, &shared.schema, shared.mode, now)
            .map_err(|e| StoreError::io(format!("cannot create segment {}", path.display()), e))?;
        shared.budget.grow(shared.schema.len() as u64);
        shared.catalog.add_segment(Arc::clone(&active.seg));
        Ok(active)
    }
}
