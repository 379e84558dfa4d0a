//! The append path: deduplication of concurrent appends, shard choice, rotation, the one
//! vectored write per entry, and sealing on write failure.

use std::io::IoSlice;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;

use crate::error::StoreError;
use crate::index::IndexEntry;
use crate::ipc::{EncodeError, EntryBody};
use crate::layout::{self, DurableError};
use crate::segment::{self, Active};
use crate::sidecar::SidecarEntry;
use crate::store::{Inner, location};
use crate::types::{EntryMeta, Location};

/// Most padding [`EntryBody::message`] may add for alignment.
const MAX_ALIGN_PAD: u64 = 64;

/// Removes a key from the in-flight set when its append ends (either way).
struct InFlight<'a> {
    inner: &'a Inner,
    key: &'a [u8],
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.inner.inflight.lock().remove(self.key);
        self.inner.inflight_done.notify_all();
    }
}

enum Claim<'a> {
    /// The key got stored (by someone else) meanwhile.
    Stored(Location),
    /// This caller writes it.
    Mine(InFlight<'a>),
}

fn encode_err(e: EncodeError) -> StoreError {
    match e {
        EncodeError::TooLong { len, .. } => StoreError::EntryTooLarge {
            len,
            reason: e.to_string(),
        },
        EncodeError::Invalid(reason) => StoreError::InvalidEntry { reason },
    }
}

impl Inner {
    pub(crate) fn append(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        data: &[&[u8]],
    ) -> Result<Location, StoreError> {
        self.check_writable()?;
        if let Some(e) = self.index.get(key) {
            self.touch(&e.seg);
            return Ok(location(&e));
        }
        let data_len: u64 = data.iter().map(|d| d.len() as u64).sum();
        let body = EntryBody::new(key, &meta.shape, &meta.dtype, data_len).map_err(encode_err)?;
        let bound =
            body.message(0, Some(0)).map_err(encode_err)?.len() as u64 + MAX_ALIGN_PAD + body.len();
        let limit = self.max_entry_len();
        if bound > limit {
            self.counters.oversized.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::EntryTooLarge {
                len: bound,
                reason: format!(
                    "a segment of {} holds entries of at most {limit} bytes",
                    self.dir.display()
                ),
            });
        }
        let _claim = match self.claim(key) {
            Claim::Stored(loc) => return Ok(loc),
            Claim::Mine(claim) => claim,
        };
        let crc = body.crc32c(data);
        self.write_entry(key, &body, crc, data, bound)
    }

    /// Largest encoded entry a segment accepts (a segment must hold at least one).
    fn max_entry_len(&self) -> u64 {
        self.segment_bytes
            .saturating_sub(self.schema.len() as u64 + crate::ipc::END_OF_STREAM.len() as u64)
    }

    /// Registers `key` as being written, or waits for a concurrent writer of it.
    fn claim<'a>(&'a self, key: &'a [u8]) -> Claim<'a> {
        let mut set = self.inflight.lock();
        loop {
            if let Some(e) = self.index.get(key) {
                self.touch(&e.seg);
                return Claim::Stored(location(&e));
            }
            if !set.contains(key) {
                set.insert(key.into());
                return Claim::Mine(InFlight { inner: self, key });
            }
            self.counters.pending_waits.fetch_add(1, Ordering::Relaxed);
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

    fn write_entry(
        &self,
        key: &[u8],
        body: &EntryBody,
        crc: u32,
        data: &[&[u8]],
        bound: u64,
    ) -> Result<Location, StoreError> {
        let mut shard = self.lock_shard();
        self.check_writable()?;
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
        let message = body.message(offset, Some(crc)).map_err(encode_err)?;
        let total = message.len() as u64 + body.len();
        let mut slices = Vec::with_capacity(data.len() + 3);
        slices.push(IoSlice::new(&message));
        slices.push(IoSlice::new(body.prefix()));
        slices.extend(
            data.iter()
                .filter(|d| !d.is_empty())
                .map(|d| IoSlice::new(d)),
        );
        if !body.suffix().is_empty() {
            slices.push(IoSlice::new(body.suffix()));
        }
        let fault = self.fault().map(|f| (f, active.seg.id));
        if let Err(failure) = segment::write_vectored_at(&active.file, &mut slices, offset, fault) {
            let path = active.seg.path.clone();
            if let Some(broken) = shard.take() {
                self.seal_now(broken);
            }
            return Err(StoreError::io(
                format!(
                    "cannot append an entry of {total} bytes to {} at offset {offset} ({} bytes \
                     written); the segment is sealed at its last good entry and the next append \
                     starts a new segment",
                    path.display(),
                    failure.written
                ),
                failure.error,
            ));
        }
        let meta_len = (message.len() - 8) as u32;
        active.end += total;
        active.seg.readable_end.store(active.end, Ordering::Release);
        active.seg.disk_bytes.fetch_add(total, Ordering::Relaxed);
        active.entries.push(SidecarEntry {
            offset,
            length: total,
            meta_len,
            crc,
            key: key.into(),
        });
        let entry = IndexEntry {
            seg: Arc::clone(&active.seg),
            offset,
            length: total,
            meta_len,
            crc,
        };
        self.touch(&active.seg);
        // Inserted while the shard is held, so the segment cannot be sealed and evicted
        // before its entry is in the index.
        self.index.insert(key.into(), entry.clone());
        drop(shard);
        let now = self.total_bytes.fetch_add(total, Ordering::Relaxed) + total;
        if now > self.max_bytes {
            self.maintenance.wake();
        }
        Ok(location(&entry))
    }

    /// Creates the next segment: persists the high-water mark first, then the file.
    fn open_segment(&self) -> Result<Active, StoreError> {
        let id = {
            let mut next = self.next_id.lock();
            let id = *next;
            match layout::persist_next_id(&self.dir, id + 1, self.mode, self.fault()) {
                Ok(()) => {}
                Err(DurableError::Sync(e)) => {
                    let reason = format!(
                        "fsync of the segment id high-water mark in {} failed: {e}",
                        self.dir.display()
                    );
                    self.poison(reason.clone());
                    return Err(StoreError::Poisoned {
                        dir: self.dir.clone(),
                        reason,
                    });
                }
                Err(DurableError::Write(e)) => {
                    return Err(StoreError::io(
                        format!(
                            "cannot persist the segment id high-water mark in {}",
                            self.dir.display()
                        ),
                        e,
                    ));
                }
            }
            *next = id + 1;
            id
        };
        let path = layout::segment_path(&self.dir, id);
        let now = self.clock.fetch_add(1, Ordering::Relaxed);
        let active = segment::create(&path, id, &self.schema, self.mode, now)
            .map_err(|e| StoreError::io(format!("cannot create segment {}", path.display()), e))?;
        self.total_bytes
            .fetch_add(self.schema.len() as u64, Ordering::Relaxed);
        self.segments.lock().insert(id, Arc::clone(&active.seg));
        Ok(active)
    }
}
