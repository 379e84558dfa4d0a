//! Regions: axis-aligned boxes `[start, stop)` of a tensor.

use std::ops::Range;

/// An axis-aligned box of a tensor: `start` inclusive, `stop` exclusive, one
/// entry per axis, in element coordinates.
///
/// A `Region` by itself is not validated; [`ChunkGrid`](super::ChunkGrid)
/// checks a region against its tensor before using it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// First element index on each axis (inclusive).
    pub start: Vec<u64>,
    /// One past the last element index on each axis (exclusive).
    pub stop: Vec<u64>,
}

impl Region {
    /// A region from its bounds (not validated).
    pub fn new(start: Vec<u64>, stop: Vec<u64>) -> Self {
        Region { start, stop }
    }

    /// The whole of a tensor of this shape: `[0, shape)`.
    pub fn whole(shape: &[u64]) -> Self {
        Region {
            start: vec![0; shape.len()],
            stop: shape.to_vec(),
        }
    }

    /// The number of axes (the length of `start`).
    pub fn rank(&self) -> usize {
        self.start.len()
    }

    /// The extent `stop - start` on each axis (0 where `stop <= start`).
    pub fn shape(&self) -> Vec<u64> {
        self.start
            .iter()
            .zip(&self.stop)
            .map(|(a, b)| b.saturating_sub(*a))
            .collect()
    }

    /// The number of elements inside, or `None` if it does not fit in `u64`.
    pub fn num_elements(&self) -> Option<u64> {
        let extents = self.shape();
        if extents.contains(&0) {
            return Some(0);
        }
        extents.iter().try_fold(1u64, |acc, e| acc.checked_mul(*e))
    }

    /// True when the region holds no element (some axis has `stop <= start`).
    pub fn is_empty(&self) -> bool {
        self.start.iter().zip(&self.stop).any(|(a, b)| b <= a)
    }

    /// True when `other` has the same rank and lies inside `self`.
    pub fn contains(&self, other: &Region) -> bool {
        let rank = self.rank();
        self.stop.len() == rank
            && other.start.len() == rank
            && other.stop.len() == rank
            && (0..rank).all(|a| {
                self.start[a] <= other.start[a]
                    && other.start[a] <= other.stop[a]
                    && other.stop[a] <= self.stop[a]
            })
    }

    /// This region in the coordinates of `origin` (both bounds minus
    /// `origin.start`), or `None` unless `origin` contains it.
    ///
    /// This turns a chunk's absolute bounds into the bounds relative to a
    /// realized region that a plan reports.
    pub fn relative_to(&self, origin: &Region) -> Option<Region> {
        if !origin.contains(self) {
            return None;
        }
        let shift =
            |v: &[u64]| -> Vec<u64> { v.iter().zip(&origin.start).map(|(x, o)| x - o).collect() };
        Some(Region {
            start: shift(&self.start),
            stop: shift(&self.stop),
        })
    }

    /// The element indices this region occupies in a tensor of `shape`, when
    /// they form one contiguous run in the given memory order.
    ///
    /// Returns `None` when the region is not one contiguous run, does not lie
    /// inside `[0, shape)` at the same rank, or the arithmetic overflows. An
    /// empty region yields an empty range starting at its start offset.
    /// Multiply by the itemsize to get the byte range in the source.
    pub fn element_range(&self, shape: &[u64], fortran_order: bool) -> Option<Range<u64>> {
        if !Region::whole(shape).contains(self) {
            return None;
        }
        // Work in C order: for Fortran order the fastest axis is axis 0, so
        // reversing every axis list turns it into the C-order question.
        let order: Vec<usize> = if fortran_order {
            (0..shape.len()).rev().collect()
        } else {
            (0..shape.len()).collect()
        };
        let mut offset = 0u64;
        for &a in &order {
            offset = offset.checked_mul(shape[a])?.checked_add(self.start[a])?;
        }
        let count = self.num_elements()?;
        if count > 0 {
            // After the first axis taken with an extent above 1, every faster
            // axis must be whole.
            let first_wide = order.iter().position(|&a| self.stop[a] - self.start[a] > 1);
            if let Some(p) = first_wide {
                let all_whole = order[p + 1..]
                    .iter()
                    .all(|&a| self.start[a] == 0 && self.stop[a] == shape[a]);
                if !all_whole {
                    return None;
                }
            }
        }
        Some(offset..offset.checked_add(count)?)
    }
}
