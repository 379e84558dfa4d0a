//! Decoding one cold chunk into the store: [`Strategy`] says how its bytes get there, one
//! small function ([`ChunkService::choose`]) picks it, and one function per strategy does it
//! (the recut in [`super::recut`], the file copy and the read here).
//!
//! ```text
//!  appends paused? ── yes ──────────────────────────────────▶ Read, kept in memory
//!        │ no
//!  every overlapping chunk of the other grid cached? ── yes ─▶ Recut (1 copy, no source read)
//!        │ no
//!  unscaled, under 2 MiB, one C-order run of the source? ─ yes ─▶ CopyFile (1 copy, in-kernel)
//!        │ no
//!        ▼
//!  Read, appended (2 copies: source → pooled buffer → segment)
//! ```
//!
//! A strategy whose append fails falls back to the read, kept in memory (the failure pauses
//! appends, [`super::writes`]); a file copy the store cannot do falls back to the read,
//! appended. Every source strategy settles the source first and checks it unchanged before
//! the chunk is kept, so only bytes of one complete version are ever cached.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use bytes::Bytes;
use tessera_segments::{EntryMeta, FileRange, StoreError};

use super::reduce::{self, ReduceError};
use super::store::FileAppend;
use super::{ChunkError, ChunkService, Materialized, memory};
use crate::grid::chunk_id::ChunkId;
use crate::source::registry::Tensor;
use crate::source::{ByteRange, SourceError};

/// Chunks of at least this many bytes are read into a pooled buffer and written with one
/// large write instead of `copy_file_range` (one copy more), so that the segment's page
/// cache holds 2 MiB folios (see the module docs of [`super`]). Below it a chunk cannot fill
/// such a folio.
const SPLICE_BELOW_BYTES: usize = 2 << 20;

/// How a cold chunk's bytes reach the store.
enum Strategy {
    /// Cut out of the other grid's cached chunks, these slices of their mappings in order.
    Recut(Vec<Bytes>),
    /// Copied file to file from this byte range of the source.
    CopyFile(ByteRange),
    /// Read (or, scaled, computed) from the source into a pooled buffer.
    Read(Keep),
}

/// Where a chunk read into a buffer is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Keep {
    /// Appended to the store (kept in memory if the append fails).
    Store,
    /// Kept in memory only: appends are paused, or one just failed.
    Memory,
}

/// What every strategy needs of the chunk being decoded.
pub(super) struct ColdChunk {
    /// Its segment key.
    pub(super) key: Vec<u8>,
    /// Its shape and dtype, as the store records them.
    pub(super) meta: EntryMeta,
    /// Its raw C-order bytes.
    pub(super) nbytes: usize,
}

impl ColdChunk {
    /// The chunk `id` of `tensor` (its shape reduced, for a scaled chunk).
    fn new(tensor: &Tensor, id: &ChunkId) -> Result<Self, ChunkError> {
        let shape = match id.scale() {
            None => id.region().shape(),
            Some(scale) => scale.reduced(&id.region().shape()),
        };
        let nbytes = shape
            .iter()
            .try_fold(tensor.itemsize(), |acc, &d| acc.checked_mul(d))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or(ChunkError::SizeOverflow)?;
        let meta = EntryMeta {
            shape: shape.iter().map(|&d| d as i64).collect(),
            dtype: tensor.dtype_str(),
        };
        Ok(Self {
            key: id.segment_key(),
            meta,
            nbytes,
        })
    }
}

impl ChunkService {
    /// Blocking: brings the chunk `id` into the store (or, while appends fail, into memory)
    /// by the strategy [`ChunkService::choose`] picks. A scaled chunk's computation stops
    /// once `stop` is set.
    pub(super) fn decode_and_store(
        &self,
        tensor: &Tensor,
        id: &ChunkId,
        stop: &AtomicBool,
    ) -> Result<Materialized, ChunkError> {
        let chunk = ColdChunk::new(tensor, id)?;
        match self.choose(tensor, id, &chunk) {
            Strategy::Recut(parts) => self.store_recut(tensor, id, &chunk, &parts, stop),
            Strategy::CopyFile(range) => self.store_copy(tensor, id, &chunk, range, stop),
            Strategy::Read(keep) => self.store_read(tensor, id, &chunk, keep, stop),
        }
    }

    /// The cheapest strategy open to the chunk: no append while appends are paused; a
    /// recut when the other grid holds its bytes; a file copy for a small contiguous run.
    fn choose(&self, tensor: &Tensor, id: &ChunkId, chunk: &ColdChunk) -> Strategy {
        if !self.writes.should_try() {
            return Strategy::Read(Keep::Memory);
        }
        if let Some(parts) = self.cut_from_other_grid(tensor, id) {
            return Strategy::Recut(parts);
        }
        if id.scale().is_none()
            && chunk.nbytes < SPLICE_BELOW_BYTES
            && let Ok(Some(range)) = tensor.source.byte_range(id.region())
        {
            return Strategy::CopyFile(range);
        }
        Strategy::Read(Keep::Store)
    }

    /// The file-copy strategy: source pages to segment pages inside the kernel, one copy.
    /// The source is checked unchanged after the copy and before the entry is committed, so
    /// bytes of a file modified during the copy are never served under the old id. A store
    /// that cannot copy from files, or a source file that cannot be opened, reads instead.
    fn store_copy(
        &self,
        tensor: &Tensor,
        id: &ChunkId,
        chunk: &ColdChunk,
        range: ByteRange,
        stop: &AtomicBool,
    ) -> Result<Materialized, ChunkError> {
        self.settle(tensor)?;
        let src = FileRange {
            file: &range.file,
            offset: range.offset,
            len: range.len,
        };
        let started = std::time::Instant::now();
        let check = || unchanged_and_unwritten(tensor);
        let Some(appended) = self
            .store
            .append_from_file(&chunk.key, &chunk.meta, src, &check)
        else {
            return self.read_settled(tensor, id, chunk, Keep::Store, stop);
        };
        self.metrics.record_write(started.elapsed());
        match appended {
            FileAppend::Stored => {
                self.writes.succeeded();
                Ok(Materialized::Stored)
            }
            FileAppend::CheckRefused(err) => Err(ChunkError::of_source(&tensor.source_id, err)),
            FileAppend::Failed(short @ StoreError::SourceShort { .. }) => {
                tensor
                    .source
                    .check_unchanged()
                    .map_err(|e| ChunkError::of_source(&tensor.source_id, e))?;
                Err(ChunkError::SourceShort {
                    source_id: tensor.source_id.clone(),
                    source: Arc::new(short),
                })
            }
            FileAppend::Failed(err) => {
                self.writes.failed(&err);
                self.read_settled(tensor, id, chunk, Keep::Memory, stop)
            }
        }
    }

    /// The read strategy: settles the source, then reads it (see
    /// [`ChunkService::read_settled`]).
    pub(super) fn store_read(
        &self,
        tensor: &Tensor,
        id: &ChunkId,
        chunk: &ColdChunk,
        keep: Keep,
        stop: &AtomicBool,
    ) -> Result<Materialized, ChunkError> {
        self.settle(tensor)?;
        self.read_settled(tensor, id, chunk, keep, stop)
    }

    /// Reads (or computes) the chunk from the settled source into a pooled buffer (copy 1),
    /// checks the source unchanged, then appends the buffer (copy 2, one large vectored
    /// write) or encodes it into a message kept in memory (copy 2).
    fn read_settled(
        &self,
        tensor: &Tensor,
        id: &ChunkId,
        chunk: &ColdChunk,
        keep: Keep,
        stop: &AtomicBool,
    ) -> Result<Materialized, ChunkError> {
        let mut buffer = self.buffers.take(chunk.nbytes);
        read_source(tensor, id, buffer.as_mut_slice(), stop)?;
        unchanged_and_unwritten(tensor).map_err(|e| ChunkError::of_source(&tensor.source_id, e))?;
        if keep == Keep::Store {
            let started = std::time::Instant::now();
            let appended = self
                .store
                .append(&chunk.key, &chunk.meta, &[buffer.as_slice()]);
            self.metrics.record_write(started.elapsed());
            match appended {
                Ok(kept) => {
                    self.writes.succeeded();
                    return Ok(kept);
                }
                Err(err) => self.writes.failed(&err),
            }
        }
        let encoded = memory::encode_in_memory(&chunk.key, &chunk.meta, buffer.as_slice())
            .map_err(|source| ChunkError::Encode { source })?;
        self.fallback.insert(&chunk.key, encoded.clone());
        Ok(Materialized::InMemory(encoded))
    }

    /// Waits until the source is a complete version: no writer, nothing touched within the
    /// settle window, header and identity as planned (docs/decisions/0011).
    fn settle(&self, tensor: &Tensor) -> Result<(), ChunkError> {
        tensor
            .source
            .settle(self.settle_window)
            .map_err(|e| ChunkError::of_source(&tensor.source_id, e))
    }
}

/// The check after a chunk's bytes are read or copied: the source is the version planned
/// and nobody writes it.
fn unchanged_and_unwritten(tensor: &Tensor) -> Result<(), SourceError> {
    tensor.source.check_unchanged()?;
    tensor.source.check_no_writer()
}

/// Reads the chunk `id` of `tensor` into `out` in C order, reducing it for a scaled chunk
/// (which stops once `stop` is set). The read checks the file unchanged after reading: a
/// write that raced the read is refused, never cached under the old version's id.
fn read_source(
    tensor: &Tensor,
    id: &ChunkId,
    out: &mut [u8],
    stop: &AtomicBool,
) -> Result<(), ChunkError> {
    let Some(scale) = id.scale() else {
        return tensor
            .source
            .read_region(&id.region().start, &id.region().stop, out)
            .map_err(|e| ChunkError::of_source(&tensor.source_id, e));
    };
    reduce::reduce_chunk(&*tensor.source, tensor.shape(), id.region(), scale, out, stop).map_err(
        |e| match e {
            ReduceError::Source(e) => ChunkError::of_source(&tensor.source_id, e),
            ReduceError::Cancelled => {
                tracing::debug!(array_id = id.array_id(), chunk = ?id.region(), "scaled decode stopped: nobody waits for it");
                ChunkError::Abandoned {
                    array_id: id.array_id().to_string(),
                }
            }
            other => ChunkError::Reduce {
                source_id: tensor.source_id.clone(),
                source: Arc::new(other),
            },
        },
    )
}
