//! Enumeration of the grid cells that cover a region.

use super::Region;

/// The grid cells covering a region, in C order (last axis fastest), each with
/// absolute bounds clipped to the tensor's shape. Made by
/// [`ChunkGrid::cells`](super::ChunkGrid::cells).
#[derive(Clone, Debug)]
pub struct Cells<'a> {
    shape: &'a [u64],
    chunk: &'a [u64],
    /// First cell index on each axis.
    lo: Vec<u64>,
    /// One past the last cell index on each axis.
    hi: Vec<u64>,
    /// The next cell index to yield; meaningful while `remaining > 0`.
    next: Vec<u64>,
    remaining: u64,
}

impl<'a> Cells<'a> {
    /// Cells with indices in `[lo, hi)` per axis; every `lo < hi`.
    pub(super) fn new(shape: &'a [u64], chunk: &'a [u64], lo: Vec<u64>, hi: Vec<u64>) -> Self {
        let remaining = lo
            .iter()
            .zip(&hi)
            .fold(1u64, |acc, (l, h)| acc.saturating_mul(h - l));
        Cells {
            shape,
            chunk,
            next: lo.clone(),
            lo,
            hi,
            remaining,
        }
    }
}

impl Cells<'_> {
    /// How many cells are left to yield.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// The last cell the enumeration yields (the one with the largest bounds), `None` when
    /// it is done.
    pub fn last_cell(&self) -> Option<Region> {
        if self.remaining == 0 {
            return None;
        }
        let last: Vec<u64> = self.hi.iter().map(|h| h - 1).collect();
        Some(cell_bounds(self.shape, self.chunk, &last))
    }
}

/// The bounds of the cell with grid indices `index`, clipped to `shape`.
pub(super) fn cell_bounds(shape: &[u64], chunk: &[u64], index: &[u64]) -> Region {
    let mut start = Vec::with_capacity(index.len());
    let mut stop = Vec::with_capacity(index.len());
    for ((&i, &c), &dim) in index.iter().zip(chunk).zip(shape) {
        let s = i.saturating_mul(c);
        start.push(s);
        stop.push(s.saturating_add(c).min(dim));
    }
    Region { start, stop }
}

impl Iterator for Cells<'_> {
    type Item = Region;

    fn next(&mut self) -> Option<Region> {
        if self.remaining == 0 {
            return None;
        }
        let region = cell_bounds(self.shape, self.chunk, &self.next);
        self.remaining -= 1;
        // Odometer step: bump the last axis, carrying into slower ones.
        for a in (0..self.next.len()).rev() {
            self.next[a] += 1;
            if self.next[a] < self.hi[a] {
                break;
            }
            self.next[a] = self.lo[a];
        }
        Some(region)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match usize::try_from(self.remaining) {
            Ok(n) => (n, Some(n)),
            Err(_) => (usize::MAX, None),
        }
    }
}
