//! Cutting a cell out of the cached chunks of the tensor's other grid (docs/decisions/0024).
//!
//! A tensor's two grids (decision 0015) cut the same bytes differently. When every chunk of
//! the other grid that overlaps a cell is in the file cache, the cell's bytes are already in
//! segment pages on this machine: the cell is appended from those chunks' mappings, one
//! copy and no read of the source, instead of being read from the source into a buffer and
//! written from there (two copies, and a disk read when the source's pages are gone). That
//! is a fine cell for a socket reader of a tensor a mapping client warmed (decision 0023
//! fills the fine grid this way), and a coarse cell for a mapping client after socket
//! readers.
//!
//! Only when each overlap is one contiguous run of both the cell and the chunk it comes
//! from, which the contiguity-first rule both grids are cut by makes the usual case;
//! otherwise the source is read as before. Both chunks name the same content version, so
//! their bytes are the same bytes (a chunk id names its bytes forever).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use tessera_segments::ipc::DATA_BODY_OFFSET;

use super::decode::{ColdChunk, Keep};
use super::{ChunkError, ChunkService, Materialized};
use crate::grid::chunk_id::ChunkId;
use crate::grid::{ChunkGrid, Region, element_range};
use crate::source::registry::Tensor;

impl ChunkService {
    /// The recut strategy: appends the cell `id` from `parts`, the other grid's cached bytes
    /// of it in order (one copy, from their mappings into the segment). After a failed
    /// append the cell is read from the source and kept in memory instead.
    pub(super) fn store_recut(
        &self,
        tensor: &Tensor,
        id: &ChunkId,
        chunk: &ColdChunk,
        parts: &[Bytes],
        stop: &AtomicBool,
    ) -> Result<Materialized, ChunkError> {
        let parts: Vec<&[u8]> = parts.iter().map(|part| part.as_ref()).collect();
        let started = std::time::Instant::now();
        let appended = self.store.append(&chunk.key, &chunk.meta, &parts);
        self.metrics.record_write(started.elapsed());
        match appended {
            Ok(kept) => {
                self.writes.succeeded();
                self.recuts.fetch_add(1, Ordering::Relaxed);
                Ok(kept)
            }
            Err(err) => {
                self.writes.failed(&err);
                self.store_read(tensor, id, chunk, Keep::Memory, stop)
            }
        }
    }

    /// The C-order bytes of the unscaled cell `id`, as slices of the mappings of cached
    /// chunks of the tensor's other grid, in order; `None` when they cannot all be cut
    /// that way (a chunk not cached, an overlap that is not one run, a scaled chunk).
    pub(super) fn cut_from_other_grid(&self, tensor: &Tensor, id: &ChunkId) -> Option<Vec<Bytes>> {
        if id.scale().is_some() || tensor.grid == tensor.mapped_grid {
            return None;
        }
        let cell = id.region();
        let other = if tensor.grid.is_cell(cell) {
            &tensor.mapped_grid
        } else {
            &tensor.grid
        };
        let pieces = pieces(cell, other)?;
        // Every piece's chunk must be cached before any is read: a partial cut is no use.
        let keys: Vec<Vec<u8>> = pieces
            .iter()
            .map(|piece| {
                ChunkId::new(id.array_id(), id.version(), piece.chunk.clone())
                    .ok()
                    .map(|chunk| chunk.segment_key())
            })
            .collect::<Option<_>>()?;
        if !keys.iter().all(|key| self.store.contains(key)) {
            return None;
        }
        let item = tensor.itemsize();
        let mut parts = Vec::with_capacity(pieces.len());
        for (piece, key) in pieces.iter().zip(&keys) {
            // Evicted since the check: the source is read instead.
            let chunk = self.store.read(key).ok()??;
            let len = piece.chunk.num_elements()?.checked_mul(item)?;
            let data_start = usize::try_from(DATA_BODY_OFFSET).ok()?;
            let data_end = data_start.checked_add(usize::try_from(len).ok()?)?;
            let start = data_start + usize::try_from(piece.elements.start * item).ok()?;
            let end = data_start + usize::try_from(piece.elements.end * item).ok()?;
            if chunk.body.len() < data_end {
                return None;
            }
            parts.push(chunk.body.slice(start..end));
        }
        Some(parts)
    }
}

/// One overlap of a cell with a chunk of the other grid.
#[derive(Debug, PartialEq)]
struct Piece {
    /// The other grid's cell the bytes come from.
    chunk: Region,
    /// The overlap's elements in that chunk's C order.
    elements: Range<u64>,
}

/// The overlaps of `cell` with the cells of `other` in `cell`'s C order, when each one is a
/// contiguous run of both and together they cover `cell` in order.
fn pieces(cell: &Region, other: &ChunkGrid) -> Option<Vec<Piece>> {
    let shape = cell.shape();
    let mut runs: Vec<(Range<u64>, Piece)> = Vec::new();
    for chunk in other.cells(cell).ok()? {
        if &chunk == cell {
            // A cell of both grids is the same chunk: nothing to cut it from.
            return None;
        }
        let overlap = cell.intersect(&chunk)?;
        let in_cell = element_range(&overlap.relative_to(cell)?, &shape, false)?;
        let elements = element_range(&overlap.relative_to(&chunk)?, &chunk.shape(), false)?;
        runs.push((in_cell, Piece { chunk, elements }));
    }
    runs.sort_by_key(|(in_cell, _)| in_cell.start);
    let mut next = 0;
    for (in_cell, _) in &runs {
        if in_cell.start != next {
            return None;
        }
        next = in_cell.end;
    }
    (next == cell.num_elements()?).then(|| runs.into_iter().map(|(_, piece)| piece).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn grid(shape: &[u64], target: u64) -> ChunkGrid {
        ChunkGrid::plan(shape, 1, false, target).unwrap()
    }

    fn region(start: &[u64], stop: &[u64]) -> Region {
        Region::new(start.to_vec(), stop.to_vec())
    }

    #[test]
    fn a_fine_slab_is_one_run_of_the_coarse_slab_holding_it() {
        // Planes of 64 KiB: 16 KiB fine cells are quarter planes, 64 KiB coarse ones planes.
        let coarse = grid(&[10, 64, 1024], 64 << 10);
        let fine_cell = region(&[3, 16, 0], &[4, 32, 1024]);
        let got = pieces(&fine_cell, &coarse).unwrap();
        assert_eq!(
            got,
            [Piece {
                chunk: region(&[3, 0, 0], &[4, 64, 1024]),
                elements: 16 * 1024..32 * 1024,
            }]
        );
    }

    #[test]
    fn a_coarse_slab_is_the_fine_slabs_in_order() {
        let fine = grid(&[10, 64, 1024], 16 << 10);
        let coarse_cell = region(&[3, 0, 0], &[4, 64, 1024]);
        let got = pieces(&coarse_cell, &fine).unwrap();
        assert_eq!(got.len(), 4);
        for (i, piece) in got.iter().enumerate() {
            let rows = i as u64 * 16;
            assert_eq!(piece.chunk, region(&[3, rows, 0], &[4, rows + 16, 1024]));
            assert_eq!(piece.elements, 0..16 * 1024);
        }
    }

    #[test]
    fn cells_straddling_the_other_grid_are_cut_in_parts() {
        // 800-byte rows: fine cells of 3 rows, coarse cells of 5; fine rows 3..6 lie in
        // coarse cells 0..5 (rows 3, 4) and 5..10 (row 5).
        let coarse = grid(&[20, 800], 4000);
        let got = pieces(&region(&[3, 0], &[6, 800]), &coarse).unwrap();
        assert_eq!(
            got,
            [
                Piece {
                    chunk: region(&[0, 0], &[5, 800]),
                    elements: 3 * 800..5 * 800,
                },
                Piece {
                    chunk: region(&[5, 0], &[10, 800]),
                    elements: 0..800,
                },
            ]
        );
    }

    #[test]
    fn overlaps_that_are_not_runs_are_refused() {
        // Coarse cells split the last axis: a two-row fine cell's halves are strided in it
        // (one row is two runs, which is fine).
        let coarse = ChunkGrid::with_chunk_shape(&[4, 100], 1, &[4, 50]).unwrap();
        assert!(pieces(&region(&[0, 0], &[2, 100]), &coarse).is_none());
        assert_eq!(
            pieces(&region(&[0, 0], &[1, 100]), &coarse).unwrap().len(),
            2
        );
        // The same cell on both grids has nothing to be cut from.
        let same = ChunkGrid::with_chunk_shape(&[4, 100], 1, &[1, 100]).unwrap();
        assert!(pieces(&region(&[0, 0], &[1, 100]), &same).is_none());
    }
}
