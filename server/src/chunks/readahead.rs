//! Read-ahead: which chunks to decode before a sequential reader asks for them.
//!
//! A client reading a tensor whole asks for its chunks in grid order, a few at a time:
//! forward (C order) like the Rust client and `tessera warm`, or backward like dask, which
//! schedules the blocks of an array from the last one. Without read-ahead every cold chunk
//! is decoded only when its request arrives, so the reader waits for the decode and then
//! for the transfer, chunk after chunk. With it, a request for cell `i` whose neighbour
//! on one side is already cached or being decoded (the reader is walking the grid from
//! there) starts background decodes of the cells on the other side, up to the window, so
//! decoding the next chunks overlaps sending this one. The first and the last cell count
//! as walked into (whole-tensor reads start there). Random access triggers nothing.
//!
//! ```text
//!  request cell i ──▶ cell i-1 cached or decoding (or i first)? ── yes ──▶ i+1 ..= i+window
//!                 └─▶ cell i+1 cached or decoding (or i last)?  ── yes ──▶ i-1 ..= i-window
//!                                     each of those not cached and not decoding ──▶ decode
//!                                                                        in the background
//! ```

use crate::grid::{ChunkGrid, Region};

/// Most chunks decoded ahead of one request. Clients keep a handful of requests in flight;
/// a deeper window of small chunks would only queue decodes far ahead of the reader.
pub(crate) const MAX_WINDOW_CHUNKS: u64 = 16;

/// The window, in chunks, for a read-ahead budget in bytes: at least one chunk when the
/// budget is not 0, at most [`MAX_WINDOW_CHUNKS`], and never more than a quarter of the
/// cache so that chunks decoded ahead are not evicted before the reader gets to them.
pub(crate) fn window_chunks(budget_bytes: u64, chunk_bytes: u64, cache_bytes: u64) -> u64 {
    if budget_bytes == 0 || chunk_bytes == 0 {
        return 0;
    }
    let wanted = (budget_bytes / chunk_bytes).clamp(1, MAX_WINDOW_CHUNKS);
    let room = cache_bytes / 4 / chunk_bytes;
    wanted.min(room)
}

/// The cells to decode ahead of a request for `cell`, nearest first, given whether a
/// cell is already cached or being decoded. Empty when the request does not look
/// sequential, when `cell` is not a cell of `grid`, or when `window` is 0.
pub(crate) fn cells_ahead(
    grid: &ChunkGrid,
    cell: &Region,
    window: u64,
    present: impl Fn(&Region) -> bool,
) -> Vec<Region> {
    let Some(index) = grid.cell_index(cell) else {
        return Vec::new();
    };
    let last = grid.num_chunks().saturating_sub(1);
    let walked_from = |neighbour: Option<u64>| match neighbour {
        None => true,
        Some(n) => grid.cell_at(n).is_some_and(|r| present(&r)),
    };
    let forward = walked_from(index.checked_sub(1));
    let backward = walked_from((index < last).then(|| index + 1));
    let mut ahead = Vec::new();
    for k in 1..=window {
        let next = [
            forward.then(|| index.checked_add(k)).flatten(),
            backward.then(|| index.checked_sub(k)).flatten(),
        ];
        for i in next.into_iter().flatten() {
            if let Some(region) = grid.cell_at(i)
                && !present(&region)
            {
                ahead.push(region);
            }
        }
    }
    ahead
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn grid() -> ChunkGrid {
        // 10 cells along axis 0, one along axis 1.
        ChunkGrid::with_chunk_shape(&[10, 4], 1, &[1, 4]).unwrap()
    }

    fn cell(i: u64) -> Region {
        grid().cell_at(i).unwrap()
    }

    #[test]
    fn window_is_the_budget_in_chunks_capped_by_a_quarter_of_the_cache() {
        assert_eq!(window_chunks(32 << 20, 8 << 20, 10 << 30), 4);
        assert_eq!(window_chunks(32 << 20, 64 << 20, 10 << 30), 1);
        assert_eq!(window_chunks(0, 8 << 20, 10 << 30), 0);
        // A small cache: at most a quarter of it ahead, possibly nothing.
        assert_eq!(window_chunks(32 << 20, 8 << 20, 64 << 20), 2);
        assert_eq!(window_chunks(32 << 20, 8 << 20, 16 << 20), 0);
        assert_eq!(window_chunks(32 << 20, 0, 10 << 30), 0);
        // Small chunks: the chunk cap, not the byte budget.
        assert_eq!(
            window_chunks(32 << 20, 64 << 10, 10 << 30),
            MAX_WINDOW_CHUNKS
        );
    }

    #[test]
    fn the_first_cell_reads_ahead_forward() {
        let ahead = cells_ahead(&grid(), &cell(0), 3, |_| false);
        assert_eq!(ahead, [cell(1), cell(2), cell(3)]);
    }

    #[test]
    fn the_last_cell_reads_ahead_backward() {
        let ahead = cells_ahead(&grid(), &cell(9), 3, |_| false);
        assert_eq!(ahead, [cell(8), cell(7), cell(6)]);
    }

    #[test]
    fn a_cell_before_a_present_one_reads_ahead_backward() {
        let ahead = cells_ahead(&grid(), &cell(5), 2, |r: &Region| *r == cell(6));
        assert_eq!(ahead, [cell(4), cell(3)]);
    }

    #[test]
    fn a_cell_between_present_ones_reads_ahead_both_ways_skipping_present_cells() {
        let present = |r: &Region| [cell(4), cell(6)].contains(r);
        let ahead = cells_ahead(&grid(), &cell(5), 3, present);
        assert_eq!(ahead, [cell(7), cell(3), cell(8), cell(2)]);
    }

    #[test]
    fn random_access_reads_nothing_ahead() {
        assert!(cells_ahead(&grid(), &cell(5), 3, |_| false).is_empty());
    }

    #[test]
    fn the_window_stops_at_either_end() {
        let ahead = cells_ahead(&grid(), &cell(8), 4, |r: &Region| *r == cell(7));
        assert_eq!(ahead, [cell(9)]);
        let ahead = cells_ahead(&grid(), &cell(1), 4, |r: &Region| *r == cell(2));
        assert_eq!(ahead, [cell(0)]);
    }

    #[test]
    fn a_single_cell_grid_reads_nothing_ahead() {
        let one = ChunkGrid::with_chunk_shape(&[4], 1, &[4]).unwrap();
        let whole = one.cell_at(0).unwrap();
        assert!(cells_ahead(&one, &whole, 3, |_| false).is_empty());
    }

    #[test]
    fn a_region_that_is_not_a_cell_reads_nothing_ahead() {
        let not_a_cell = Region::new(vec![0, 0], vec![2, 4]);
        assert!(cells_ahead(&grid(), &not_a_cell, 3, |_| true).is_empty());
        assert!(cells_ahead(&grid(), &cell(0), 0, |_| false).is_empty());
    }
}
