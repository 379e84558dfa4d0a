//! Checks of the protocol's [`Region`] boxes against an array, and the numpy-like text form
//! the CLI accepts (`0:10,:,100:`).

pub use tessera_proto::region::Region;

use crate::error::ClientError;

/// A numpy-like selection: the box to read and the axes an integer index drops from the
/// result, as `array[5, :]` has one axis fewer than `array`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// The box read from the array (an integer index is a length-1 range here).
    pub region: Region,
    /// Axes selected by a single integer index, ascending.
    pub dropped: Vec<usize>,
}

impl Selection {
    /// The shape numpy gives the result: the box's shape without the dropped axes.
    pub fn shape(&self) -> Vec<u64> {
        self.region
            .shape()
            .into_iter()
            .enumerate()
            .filter(|(axis, _)| !self.dropped.contains(axis))
            .map(|(_, len)| len)
            .collect()
    }

    /// Whether the selection holds no element (some axis is empty, as `10:5` gives).
    pub fn is_empty(&self) -> bool {
        self.region.shape().contains(&0)
    }
}

/// The box of [`parse_selection`], for callers that keep every axis.
pub fn parse_region(text: &str, shape: &[u64]) -> Result<Region, ClientError> {
    parse_selection(text, shape).map(|selection| selection.region)
}

/// Parses a numpy-like selection for an array of `shape`: one comma-separated
/// item per axis, each `a:b`, `a:`, `:b`, `:` or a single index `i` (which drops
/// the axis from the result, as in numpy). Negative numbers count from the end; slice
/// bounds are clamped to the axis like Python's, and a slice whose stop is before its
/// start is an empty axis; missing trailing axes are whole; an empty text is the whole
/// array. Steps and `...` are refused.
pub fn parse_selection(text: &str, shape: &[u64]) -> Result<Selection, ClientError> {
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
    let mut dropped = Vec::new();
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
                dropped.push(axis);
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
    Ok(Selection { region, dropped })
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
        let s = parse_selection("10:5,:", &[20, 3]).unwrap();
        assert!(s.is_empty());
        assert_eq!(s.shape(), vec![0, 3]);
    }

    #[test]
    fn integer_indices_drop_their_axis_like_numpy() {
        let s = parse_selection("5,:", &[10, 3000]).unwrap();
        assert_eq!(s.region, Region::new(vec![5, 0], vec![6, 3000]));
        assert_eq!(s.dropped, vec![0]);
        assert_eq!(s.shape(), vec![3000]);
        let s = parse_selection(":,-1,2", &[4, 5, 6]).unwrap();
        assert_eq!(s.shape(), vec![4]);
        assert!(!s.is_empty());
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
}
