//! Boxes `[start, stop)` of an N-dimensional tensor: the bounds every plan, endpoint and
//! chunk id of the protocol carries, and the geometry server and client both do on them.

/// An axis-aligned box of a tensor: `start` inclusive, `stop` exclusive, one entry per axis,
/// in element coordinates.
///
/// A `Region` by itself is not validated: the server's chunk grid checks one against its
/// tensor before using it, the client checks what a server sent against the plan.
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

    /// The intersection with `other` (same rank), or `None` when it is empty.
    pub fn intersect(&self, other: &Region) -> Option<Region> {
        let start: Vec<u64> = self
            .start
            .iter()
            .zip(&other.start)
            .map(|(a, b)| *a.max(b))
            .collect();
        let stop: Vec<u64> = self
            .stop
            .iter()
            .zip(&other.stop)
            .map(|(a, b)| *a.min(b))
            .collect();
        start
            .iter()
            .zip(&stop)
            .all(|(a, b)| a < b)
            .then_some(Region { start, stop })
    }

    /// This region in the coordinates of `origin` (both bounds minus `origin.start`), or
    /// `None` unless `origin` contains it: a chunk's absolute bounds turned into the bounds
    /// relative to the realized region a plan reports.
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
}

impl std::fmt::Display for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}..{:?}", self.start, self.stop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: &[u64], stop: &[u64]) -> Region {
        Region::new(start.to_vec(), stop.to_vec())
    }

    #[test]
    fn intersection_is_the_common_box_or_none() {
        let a = r(&[0, 0], &[10, 10]);
        assert_eq!(
            a.intersect(&r(&[5, 8], &[20, 9])),
            Some(r(&[5, 8], &[10, 9]))
        );
        assert_eq!(a.intersect(&r(&[10, 0], &[11, 1])), None);
    }

    #[test]
    fn elements_and_containment() {
        assert_eq!(r(&[1, 2], &[4, 8]).num_elements(), Some(18));
        assert_eq!(r(&[0, 0], &[u64::MAX, 3]).num_elements(), None);
        assert!(r(&[2, 3], &[2, 9]).is_empty());
        assert!(r(&[0, 0], &[4, 4]).contains(&r(&[1, 1], &[4, 2])));
        assert!(!r(&[0, 0], &[4, 4]).contains(&r(&[1], &[2])));
        assert_eq!(r(&[1, 1], &[4, 2]).to_string(), "[1, 1]..[4, 2]");
    }
}
