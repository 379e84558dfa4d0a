//! The box of whole native chunks last read, for a source that decodes whole chunks (a Zarr
//! store): the reduction's pieces and picked rows are cut from it, so a native chunk is
//! decoded once per box instead of once per piece or per picked row.
//!
//! Without it, `nearest` at a factor of 4 on a store of 1024² chunks decodes every chunk
//! 256 times (once per picked row it holds). The box is the request widened outward to
//! native chunk boundaries; it is kept until a request falls outside it. A box over
//! [`MAX_BAND_BYTES`] is not held: the request is read as it is.

use std::cell::RefCell;

use crate::source::npy::gather;
use crate::source::{Source, SourceError};

/// The largest box of native chunks held.
pub const MAX_BAND_BYTES: u64 = 256 << 20;

/// The last box read, with the native chunk extent it is aligned to.
pub(super) struct Band {
    native: Vec<u64>,
    shape: Vec<u64>,
    itemsize: u64,
    held: RefCell<Option<Held>>,
}

/// One box of a tensor, in C order.
struct Held {
    start: Vec<u64>,
    stop: Vec<u64>,
    bytes: Vec<u8>,
}

impl Held {
    fn covers(&self, start: &[u64], stop: &[u64]) -> bool {
        self.start.iter().zip(start).all(|(h, s)| h <= s)
            && self.stop.iter().zip(stop).all(|(h, s)| s <= h)
    }
}

impl Band {
    /// A band for `source` of `shape`, or `None` when it reads any region alike.
    pub(super) fn of(source: &dyn Source, shape: &[u64], itemsize: u64) -> Option<Band> {
        let native = source.native_chunk()?;
        if native.len() != shape.len() || native.contains(&0) {
            return None;
        }
        Some(Band {
            native,
            shape: shape.to_vec(),
            itemsize,
            held: RefCell::new(None),
        })
    }

    /// Reads `start..stop` (absolute) of `source` into `out`, from the box held when it
    /// covers the request, else from a new box of whole native chunks.
    pub(super) fn read(
        &self,
        source: &dyn Source,
        start: &[u64],
        stop: &[u64],
        out: &mut [u8],
    ) -> Result<(), SourceError> {
        let mut held = self.held.borrow_mut();
        if let Some(box_) = held.as_ref().filter(|h| h.covers(start, stop)) {
            copy_box(box_, start, stop, self.itemsize, out);
            return Ok(());
        }
        let lo: Vec<u64> = start
            .iter()
            .zip(&self.native)
            .map(|(s, n)| s / n * n)
            .collect();
        let hi: Vec<u64> = stop
            .iter()
            .zip(&self.native)
            .zip(&self.shape)
            .map(|((s, n), d)| s.div_ceil(*n).saturating_mul(*n).min(*d))
            .collect();
        let bytes = lo
            .iter()
            .zip(&hi)
            .fold(self.itemsize, |acc, (a, b)| acc.saturating_mul(b - a));
        if bytes > MAX_BAND_BYTES {
            return source.read_region(start, stop, out);
        }
        let mut buf = held.take().map(|h| h.bytes).unwrap_or_default();
        buf.clear();
        buf.resize(bytes as usize, 0);
        source.read_region(&lo, &hi, &mut buf)?;
        let box_ = Held {
            start: lo,
            stop: hi,
            bytes: buf,
        };
        copy_box(&box_, start, stop, self.itemsize, out);
        *held = Some(box_);
        Ok(())
    }
}

/// Copies the box `start..stop` out of `held` (which covers it) into `out`, in C order.
fn copy_box(held: &Held, start: &[u64], stop: &[u64], itemsize: u64, out: &mut [u8]) {
    let rank = start.len();
    let mut strides = vec![itemsize as usize; rank];
    for a in (0..rank.saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * (held.stop[a + 1] - held.start[a + 1]) as usize;
    }
    let base = (0..rank).fold(0, |acc, a| {
        acc + (start[a] - held.start[a]) as usize * strides[a]
    });
    let extent: Vec<usize> = start
        .iter()
        .zip(stop)
        .map(|(a, b)| (b - a) as usize)
        .collect();
    gather(&held.bytes, base, &strides, &extent, itemsize as usize, out);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_box_is_cut_out_of_the_held_box_in_c_order() {
        // A 4x6 held box at (2, 3) of u8 values r*10 + c.
        let held = Held {
            start: vec![2, 3],
            stop: vec![6, 9],
            bytes: (0..4u8)
                .flat_map(|r| (0..6u8).map(move |c| (r + 2) * 10 + c + 3))
                .collect(),
        };
        let mut out = vec![0u8; 6];
        copy_box(&held, &[3, 5], &[5, 8], 1, &mut out);
        assert_eq!(out, vec![35, 36, 37, 45, 46, 47]);
        assert!(held.covers(&[2, 3], &[6, 9]) && !held.covers(&[1, 3], &[6, 9]));
    }
}
