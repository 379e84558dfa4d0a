//! Boxes `[start, stop)` of an N-dimensional array, and the numpy-like text
//! form the CLI accepts (`0:10,:,100:`).

use crate::error::ClientError;

/// A box `[start, stop)` per axis, in element coordinates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// Inclusive start per axis.
    pub start: Vec<u64>,
    /// Exclusive stop per axis.
    pub stop: Vec<u64>,
}

impl Region {
    /// A region from its corners.
    pub fn new(start: Vec<u64>, stop: Vec<u64>) -> Region {
        Region { start, stop }
    }

    /// The whole of an array of `shape`.
    pub fn whole(shape: &[u64]) -> Region {
        Region {
            start: vec![0; shape.len()],
            stop: shape.to_vec(),
        }
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.start.len()
    }

    /// Extent per axis (`stop - start`, 0 where stop ≤ start).
    pub fn shape(&self) -> Vec<u64> {
        self.start
            .iter()
            .zip(&self.stop)
            .map(|(a, b)| b.saturating_sub(*a))
            .collect()
    }

    /// Number of elements in the box.
    pub fn volume(&self) -> u128 {
        self.shape().iter().map(|&d| u128::from(d)).product()
    }

    /// Checks that the region has `shape`'s rank and lies inside `[0, shape)`.
    pub fn check_within(&self, shape: &[u64]) -> Result<(), ClientError> {
        if self.start.len() != shape.len() || self.stop.len() != shape.len() {
            return Err(ClientError::Region {
                reason: format!(
                    "region has {} start and {} stop values, but the array has {} axes",
                    self.start.len(),
                    self.stop.len(),
                    shape.len()
                ),
            });
        }
        for (axis, ((&a, &b), &dim)) in self.start.iter().zip(&self.stop).zip(shape).enumerate() {
            if a > b || b > dim {
                return Err(ClientError::Region {
                    reason: format!("axis {axis} is [{a}, {b}), outside [0, {dim}] or reversed"),
                });
            }
        }
        Ok(())
    }

    /// The intersection with `other`, or `None` when it is empty.
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
}

impl std::fmt::Display for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}..{:?}", self.start, self.stop)
    }
}

/// Parses a numpy-like region for an array of `shape`: one comma-separated
/// item per axis, each `a:b`, `a:`, `:b`, `:` or a single index `i` (kept as
/// a length-1 axis, not dropped). Negative numbers count from the end; slice
/// bounds are clamped to the axis like Python's; missing trailing axes are
/// whole; an empty text is the whole array. Steps and `...` are refused.
pub fn parse_region(text: &str, shape: &[u64]) -> Result<Region, ClientError> {
    let refuse = |reason: String| ClientError::Region {
        reason: format!("'{text}': {reason}"),
    };
    let items: Vec<&str> = if text.trim().is_empty() {
        Vec::new()
    } else {
        text.split(',').map(str::trim).collect()
    };
    if items.len() > shape.len() {
        return Err(refuse(format!(
            "{} items for an array of {} axes (shape {shape:?})",
            items.len(),
            shape.len()
        )));
    }
    let mut region = Region::whole(shape);
    for (axis, item) in items.iter().enumerate() {
        let dim = shape[axis];
        let number = |s: &str| -> Result<i128, ClientError> {
            s.trim()
                .parse::<i128>()
                .map_err(|_| refuse(format!("axis {axis}: '{s}' is not an integer")))
        };
        if item.contains("...") {
            return Err(refuse(
                "'...' is not supported; write ':' for each axis".into(),
            ));
        }
        let parts: Vec<&str> = item.split(':').collect();
        let (start, stop) = match parts.as_slice() {
            [index] => {
                if index.is_empty() {
                    return Err(refuse(format!(
                        "axis {axis} is empty; write ':' for all of it"
                    )));
                }
                let i = number(index)?;
                let resolved = if i < 0 { i + i128::from(dim) } else { i };
                if resolved < 0 || resolved >= i128::from(dim) {
                    return Err(refuse(format!(
                        "axis {axis}: index {i} is out of range for length {dim}"
                    )));
                }
                (resolved as u64, resolved as u64 + 1)
            }
            [a, b] => {
                let clamp = |v: i128| -> u64 {
                    let v = if v < 0 { v + i128::from(dim) } else { v };
                    v.clamp(0, i128::from(dim)) as u64
                };
                let start = if a.trim().is_empty() {
                    0
                } else {
                    clamp(number(a)?)
                };
                let stop = if b.trim().is_empty() {
                    dim
                } else {
                    clamp(number(b)?)
                };
                (start, stop.max(start))
            }
            _ => {
                return Err(refuse(format!(
                    "axis {axis}: '{item}' has a step; steps are not supported"
                )));
            }
        };
        region.start[axis] = start;
        region.stop[axis] = stop;
    }
    Ok(region)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn numpy_like_items_resolve() {
        let shape = [20, 30, 400];
        let r = parse_region("0:10,:,100:", &shape).unwrap();
        assert_eq!(r, Region::new(vec![0, 0, 100], vec![10, 30, 400]));
        let r = parse_region(" 5 , -10: ", &shape).unwrap();
        assert_eq!(r, Region::new(vec![5, 20, 0], vec![6, 30, 400]));
        let r = parse_region("", &shape).unwrap();
        assert_eq!(r, Region::whole(&shape));
        let r = parse_region("-1,:-5,:1000", &shape).unwrap();
        assert_eq!(r, Region::new(vec![19, 0, 0], vec![20, 25, 400]));
    }

    #[test]
    fn reversed_slices_are_empty_like_numpy() {
        let r = parse_region("8:3", &[10]).unwrap();
        assert_eq!(r.shape(), vec![0]);
    }

    #[test]
    fn bad_items_are_refused_naming_them() {
        let shape = [10, 10];
        for (text, needle) in [
            ("1,2,3", "3 items"),
            ("0:5:2", "step"),
            ("x:3", "'x' is not an integer"),
            ("10", "out of range"),
            ("-11", "out of range"),
            ("...", "'...'"),
            (",3", "axis 0 is empty"),
        ] {
            let err = parse_region(text, &shape).unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn intersection_and_bounds() {
        let a = Region::new(vec![0, 0], vec![10, 10]);
        let b = Region::new(vec![5, 8], vec![20, 9]);
        assert_eq!(a.intersect(&b), Some(Region::new(vec![5, 8], vec![10, 9])));
        assert_eq!(a.intersect(&Region::new(vec![10, 0], vec![11, 1])), None);
        assert!(b.check_within(&[20, 9]).is_ok());
        let err = b.check_within(&[19, 9]).unwrap_err().to_string();
        assert!(err.contains("axis 0"), "{err}");
        assert!(b.check_within(&[20]).is_err());
    }
}
