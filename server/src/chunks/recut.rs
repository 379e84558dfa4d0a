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
//! Each overlap of the cell with a chunk is cut in runs contiguous in both: one run when both
//! grids are cut contiguity first, one per row of a tile when a socket grid's tile is cut
//! from a coarse band or a band from tiles (docs/decisions/0003). A cell that would take
//! more than [`MAX_RUNS`] runs is read from the source instead. Both chunks name the same
//! content version, so their bytes are the same bytes (a chunk id names its bytes forever).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use tessera_segments::ipc::DATA_BODY_OFFSET;

use super::decode::{ColdChunk, Keep};
use super::{ChunkError, ChunkService, Materialized};
use crate::grid::chunk_id::ChunkId;
use crate::grid::{ChunkGrid, Region};
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
    /// that way (a chunk not cached, too many runs, a scaled chunk).
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
        let cut = cut(cell, other)?;
        // Every chunk must be cached before any is read: a partial cut is no use.
        let keys: Vec<Vec<u8>> = cut
            .chunks
            .iter()
            .map(|chunk| {
                ChunkId::new(id.array_id(), id.version(), chunk.clone())
                    .ok()
                    .map(|chunk| chunk.segment_key())
            })
            .collect::<Option<_>>()?;
        if !keys.iter().all(|key| self.store.contains(key)) {
            return None;
        }
        let item = tensor.itemsize();
        let data_start = usize::try_from(DATA_BODY_OFFSET).ok()?;
        let mut bodies = Vec::with_capacity(keys.len());
        for (chunk, key) in cut.chunks.iter().zip(&keys) {
            // Evicted since the check: the source is read instead.
            let body = self.store.read(key).ok()??.body;
            let len = chunk.num_elements()?.checked_mul(item)?;
            let data_end = data_start.checked_add(usize::try_from(len).ok()?)?;
            if body.len() < data_end {
                return None;
            }
            bodies.push(body);
        }
        cut.runs
            .iter()
            .map(|run| {
                let start = data_start + usize::try_from(run.elements.start * item).ok()?;
                let end = data_start + usize::try_from(run.elements.end * item).ok()?;
                Some(bodies.get(run.chunk)?.slice(start..end))
            })
            .collect()
    }
}

/// At most this many runs cut one cell: past it, one read of the source costs less than
/// so many short copies.
const MAX_RUNS: u64 = 1 << 16;

/// How a cell is cut from the other grid's chunks.
#[derive(Debug, PartialEq)]
struct Cut {
    /// The other grid's cells the bytes come from.
    chunks: Vec<Region>,
    /// The cell's elements in its C order: runs of one of `chunks` each.
    runs: Vec<Run>,
}

/// Elements contiguous in both the cell and the chunk they come from.
#[derive(Debug, PartialEq)]
struct Run {
    /// Which of [`Cut::chunks`].
    chunk: usize,
    /// The elements, in that chunk's C order.
    elements: Range<u64>,
}

/// The cut of `cell` from the cells of `other`: every overlap in runs contiguous in both,
/// in `cell`'s C order, adjacent runs of one chunk joined; `None` when `cell` is itself a
/// cell of `other`, the runs do not cover it or would be more than [`MAX_RUNS`].
fn cut(cell: &Region, other: &ChunkGrid) -> Option<Cut> {
    let shape = cell.shape();
    let mut chunks = Vec::new();
    let mut runs: Vec<(u64, Run)> = Vec::new();
    for chunk in other.cells(cell).ok()? {
        if &chunk == cell {
            // A cell of both grids is the same chunk: nothing to cut it from.
            return None;
        }
        let overlap = cell.intersect(&chunk)?;
        let in_cell = overlap.relative_to(cell)?;
        let in_chunk = overlap.relative_to(&chunk)?;
        let index = chunks.len();
        let rows = overlap_runs(&in_cell, &shape, &in_chunk, &chunk.shape())?;
        if runs.len() as u64 + rows.count > MAX_RUNS {
            return None;
        }
        rows.for_each(|at_cell, at_chunk| {
            let elements = at_chunk..at_chunk + rows.len;
            runs.push((
                at_cell,
                Run {
                    chunk: index,
                    elements,
                },
            ));
        });
        chunks.push(chunk);
    }
    runs.sort_by_key(|(at_cell, _)| *at_cell);
    let mut joined: Vec<Run> = Vec::with_capacity(runs.len());
    let mut next = 0;
    for (at_cell, run) in runs {
        if at_cell != next {
            return None;
        }
        next += run.elements.end - run.elements.start;
        match joined.last_mut() {
            Some(last) if last.chunk == run.chunk && last.elements.end == run.elements.start => {
                last.elements.end = run.elements.end;
            }
            _ => joined.push(run),
        }
    }
    (next == cell.num_elements()?).then_some(Cut {
        chunks,
        runs: joined,
    })
}

/// The runs of one overlap: `count` runs of `len` elements, contiguous in both of the two
/// C-order blocks it lies in (the cell and the chunk).
struct OverlapRuns {
    /// The axes enumerated run by run: those slower than the run's outermost axis.
    outer: Vec<u64>,
    /// The overlap's first element in the cell and in the chunk.
    first: (u64, u64),
    /// Elements per index step of each outer axis, in the cell and in the chunk.
    strides: Vec<(u64, u64)>,
    count: u64,
    len: u64,
}

/// The runs of the overlap `in_cell` (relative to a cell of `cell_shape`) = `in_chunk`
/// (relative to a chunk of `chunk_shape`). A run spans the fastest axes the overlap covers
/// whole in both blocks and the next axis out. `None` on overflow.
fn overlap_runs(
    in_cell: &Region,
    cell_shape: &[u64],
    in_chunk: &Region,
    chunk_shape: &[u64],
) -> Option<OverlapRuns> {
    let extent = in_cell.shape();
    let rank = extent.len();
    let mut axis = rank.checked_sub(1)?;
    while axis > 0 && extent[axis] == cell_shape[axis] && extent[axis] == chunk_shape[axis] {
        axis -= 1;
    }
    let strides_of = |shape: &[u64]| -> Option<Vec<u64>> {
        let mut strides = vec![1u64; rank];
        for a in (0..rank.saturating_sub(1)).rev() {
            strides[a] = strides[a + 1].checked_mul(shape[a + 1])?;
        }
        Some(strides)
    };
    let (cell_strides, chunk_strides) = (strides_of(cell_shape)?, strides_of(chunk_shape)?);
    let offset = |start: &[u64], strides: &[u64]| -> Option<u64> {
        start
            .iter()
            .zip(strides)
            .try_fold(0u64, |acc, (s, st)| acc.checked_add(s.checked_mul(*st)?))
    };
    let len = extent[axis..]
        .iter()
        .try_fold(1u64, |acc, e| acc.checked_mul(*e))?;
    let outer = extent[..axis].to_vec();
    let count = outer.iter().try_fold(1u64, |acc, e| acc.checked_mul(*e))?;
    Some(OverlapRuns {
        first: (
            offset(&in_cell.start, &cell_strides)?,
            offset(&in_chunk.start, &chunk_strides)?,
        ),
        strides: cell_strides[..axis]
            .iter()
            .copied()
            .zip(chunk_strides[..axis].iter().copied())
            .collect(),
        outer,
        count,
        len,
    })
}

impl OverlapRuns {
    /// Calls `f(at_cell, at_chunk)` with each run's first element, in C order.
    fn for_each(&self, mut f: impl FnMut(u64, u64)) {
        let mut index = vec![0u64; self.outer.len()];
        for _ in 0..self.count {
            let (mut at_cell, mut at_chunk) = self.first;
            for (i, (cell_stride, chunk_stride)) in index.iter().zip(&self.strides) {
                at_cell += i * cell_stride;
                at_chunk += i * chunk_stride;
            }
            f(at_cell, at_chunk);
            for axis in (0..index.len()).rev() {
                index[axis] += 1;
                if index[axis] < self.outer[axis] {
                    break;
                }
                index[axis] = 0;
            }
        }
    }
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

    fn run(chunk: usize, elements: Range<u64>) -> Run {
        Run { chunk, elements }
    }

    #[test]
    fn a_fine_slab_is_one_run_of_the_coarse_slab_holding_it() {
        // Planes of 64 KiB: 16 KiB fine cells are quarter planes, 64 KiB coarse ones planes.
        let coarse = grid(&[10, 64, 1024], 64 << 10);
        let fine_cell = region(&[3, 16, 0], &[4, 32, 1024]);
        let got = cut(&fine_cell, &coarse).unwrap();
        assert_eq!(got.chunks, [region(&[3, 0, 0], &[4, 64, 1024])]);
        assert_eq!(got.runs, [run(0, 16 * 1024..32 * 1024)]);
    }

    #[test]
    fn a_coarse_slab_is_the_fine_slabs_in_order() {
        let fine = grid(&[10, 64, 1024], 16 << 10);
        let coarse_cell = region(&[3, 0, 0], &[4, 64, 1024]);
        let got = cut(&coarse_cell, &fine).unwrap();
        assert_eq!(got.chunks.len(), 4);
        for (i, chunk) in got.chunks.iter().enumerate() {
            let rows = i as u64 * 16;
            assert_eq!(chunk, &region(&[3, rows, 0], &[4, rows + 16, 1024]));
            assert_eq!(got.runs[i], run(i, 0..16 * 1024));
        }
    }

    #[test]
    fn cells_straddling_the_other_grid_are_cut_in_parts() {
        // 800-byte rows: fine cells of 3 rows, coarse cells of 5; fine rows 3..6 lie in
        // coarse cells 0..5 (rows 3, 4) and 5..10 (row 5).
        let coarse = grid(&[20, 800], 4000);
        let got = cut(&region(&[3, 0], &[6, 800]), &coarse).unwrap();
        assert_eq!(
            got.chunks,
            [region(&[0, 0], &[5, 800]), region(&[5, 0], &[10, 800])]
        );
        assert_eq!(got.runs, [run(0, 3 * 800..5 * 800), run(1, 0..800)]);
    }

    #[test]
    fn a_tile_is_cut_from_a_band_row_by_row() {
        // Bands of 4 rows of a 8x8 plane; the tile rows 2..6, columns 4..8 lies in two bands.
        let bands = ChunkGrid::with_chunk_shape(&[8, 8], 1, &[4, 8]).unwrap();
        let got = cut(&region(&[2, 4], &[6, 8]), &bands).unwrap();
        assert_eq!(
            got.chunks,
            [region(&[0, 0], &[4, 8]), region(&[4, 0], &[8, 8])]
        );
        assert_eq!(
            got.runs,
            [run(0, 20..24), run(0, 28..32), run(1, 4..8), run(1, 12..16)]
        );
    }

    #[test]
    fn a_band_is_cut_from_tiles_row_by_row_in_order() {
        // Tiles of 2x4: a band of rows 0..2 takes row 0 of both tiles, then row 1 of both.
        let tiles = ChunkGrid::with_chunk_shape(&[4, 8], 1, &[2, 4]).unwrap();
        let got = cut(&region(&[0, 0], &[2, 8]), &tiles).unwrap();
        assert_eq!(
            got.chunks,
            [region(&[0, 0], &[2, 4]), region(&[0, 4], &[2, 8])]
        );
        assert_eq!(
            got.runs,
            [run(0, 0..4), run(1, 0..4), run(0, 4..8), run(1, 4..8)]
        );
    }

    #[test]
    fn cells_needing_too_many_runs_and_cells_of_both_grids_are_refused() {
        // One-element rows: a cell of MAX_RUNS + 1 rows cut from columns of one element.
        let rows = MAX_RUNS + 1;
        let columns = ChunkGrid::with_chunk_shape(&[rows, 2], 1, &[rows, 1]).unwrap();
        assert!(cut(&region(&[0, 0], &[rows, 2]), &columns).is_none());
        // The same cell on both grids has nothing to be cut from.
        let same = ChunkGrid::with_chunk_shape(&[4, 100], 1, &[1, 100]).unwrap();
        assert!(cut(&region(&[0, 0], &[1, 100]), &same).is_none());
    }
}
