//! Region arithmetic: validation, the contiguous runs of a C-order layout, strided gathers.
//!
//! A region is a start and an exclusive stop per axis. In a C-order layout it is a set of
//! equal-length byte runs: the innermost axes the region covers fully, plus the extent of the
//! next axis out, form one run; every outer axis with an extent above 1 multiplies the count.

use std::path::Path;

use super::error::NpyError;
use super::header::Header;

/// Whether the region `start..stop` of a C-order array of `shape` is one contiguous byte range.
///
/// Empty regions count as contiguous. A region that does not fit the shape (ranks differ, or
/// `start <= stop <= shape` fails on some axis) is not contiguous.
pub fn region_is_contiguous(shape: &[u64], start: &[u64], stop: &[u64]) -> bool {
    region_fault(shape, start, stop).is_none() && Runs::new(shape, 1, start, stop).len() <= 1
}

/// Which rule the region breaks, if any.
fn region_fault(shape: &[u64], start: &[u64], stop: &[u64]) -> Option<&'static str> {
    if start.len() != shape.len() || stop.len() != shape.len() {
        return Some("its rank differs from the array's");
    }
    let axes = shape.iter().zip(start).zip(stop);
    if axes.clone().any(|((_, a), b)| a > b) {
        return Some("a start exceeds its stop");
    }
    if axes.clone().any(|((d, _), b)| b > d) {
        return Some("a stop exceeds its axis");
    }
    None
}

/// Checks that a region fits the header's shape; returns its byte size.
pub(crate) fn check_region(
    header: &Header,
    start: &[u64],
    stop: &[u64],
    file: Option<&Path>,
) -> Result<u64, NpyError> {
    if let Some(reason) = region_fault(&header.shape, start, stop) {
        return Err(NpyError::InvalidRegion {
            file: file.map(Path::to_path_buf),
            start: start.to_vec(),
            stop: stop.to_vec(),
            shape: header.shape.clone(),
            reason,
        });
    }
    // Each extent is at most its axis, so the product is at most `data_len`.
    Ok(start
        .iter()
        .zip(stop)
        .fold(header.dtype.itemsize as u64, |acc, (a, b)| acc * (b - a)))
}

/// Checks that an output buffer of `len` bytes is exactly a region of `needed` bytes.
pub(crate) fn check_output(needed: u64, len: usize, file: Option<&Path>) -> Result<(), NpyError> {
    if needed == len as u64 {
        Ok(())
    } else {
        Err(NpyError::OutputSize {
            file: file.map(Path::to_path_buf),
            len,
            needed,
        })
    }
}

/// The runs of a region in the payload as stored: for Fortran order, the C-order runs of the
/// transposed array (reversed shape and region).
pub(crate) fn stored_runs(header: &Header, start: &[u64], stop: &[u64]) -> Runs {
    let itemsize = header.dtype.itemsize as u64;
    if header.is_c_layout() {
        Runs::new(&header.shape, itemsize, start, stop)
    } else {
        let rev = |v: &[u64]| v.iter().rev().copied().collect::<Vec<u64>>();
        Runs::new(&rev(&header.shape), itemsize, &rev(start), &rev(stop))
    }
}

/// The byte offsets of a region's runs in a C-order layout, in output order.
///
/// Built only for regions that fit their shape; offsets and lengths are then at most the
/// payload length.
#[derive(Clone, Debug)]
pub(crate) struct Runs {
    /// Byte length of every run.
    run_len: u64,
    /// Extents and byte strides of the outer axes whose extent exceeds 1.
    outer: Vec<(u64, u64)>,
    /// Odometer over `outer`.
    index: Vec<u64>,
    /// Offset of the next run.
    next: u64,
    /// Runs not yet yielded.
    remaining: u64,
}

impl Runs {
    pub(crate) fn new(shape: &[u64], itemsize: u64, start: &[u64], stop: &[u64]) -> Runs {
        let rank = shape.len();
        // Zero-length axes count as 1: strides only matter for non-empty regions, and the
        // header check keeps this product within u64.
        let mut strides = vec![itemsize; rank];
        for axis in (0..rank.saturating_sub(1)).rev() {
            strides[axis] = strides[axis + 1].saturating_mul(shape[axis + 1].max(1));
        }
        let extent = |axis: usize| stop[axis] - start[axis];
        let full = |axis: usize| start[axis] == 0 && stop[axis] == shape[axis];
        let mut inner = rank.saturating_sub(1);
        while inner > 0 && full(inner) {
            inner -= 1;
        }
        let empty = (0..rank).any(|axis| extent(axis) == 0);
        let run_len = match rank {
            0 => itemsize,
            _ => extent(inner).saturating_mul(strides[inner]),
        };
        let outer: Vec<(u64, u64)> = (0..inner)
            .filter(|&axis| extent(axis) > 1)
            .map(|axis| (extent(axis), strides[axis]))
            .collect();
        let next = (0..rank.min(inner + 1))
            .map(|axis| start[axis].saturating_mul(strides[axis]))
            .fold(0u64, u64::saturating_add);
        let remaining = if empty {
            0
        } else {
            outer
                .iter()
                .fold(1u64, |acc, &(ext, _)| acc.saturating_mul(ext))
        };
        Runs {
            run_len,
            index: vec![0; outer.len()],
            outer,
            next,
            remaining,
        }
    }

    /// Byte length of every run.
    pub(crate) fn run_len(&self) -> u64 {
        self.run_len
    }

    /// Runs not yet yielded.
    pub(crate) fn len(&self) -> u64 {
        self.remaining
    }
}

impl Iterator for Runs {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let offset = self.next;
        for (axis, &(extent, stride)) in self.outer.iter().enumerate().rev() {
            self.index[axis] += 1;
            if self.index[axis] < extent {
                self.next += stride;
                break;
            }
            self.index[axis] = 0;
            self.next -= (extent - 1) * stride;
        }
        Some(offset)
    }
}

/// Byte strides of a Fortran-order layout of `dims` (zero-length axes counted as 1).
pub(crate) fn fortran_strides(dims: &[usize], itemsize: usize) -> Vec<usize> {
    let mut strides = Vec::with_capacity(dims.len());
    let mut acc = itemsize;
    for &dim in dims {
        strides.push(acc);
        acc = acc.saturating_mul(dim.max(1));
    }
    strides
}

/// Copies the elements of a strided block of `src` into `out` in C order.
///
/// The block has extents `extent`; `strides[a]` is the byte distance between neighbours
/// along axis `a` and `base` the byte offset of its first element. `out` holds exactly the
/// block. The caller guarantees that the block lies inside `src`.
pub(crate) fn gather(
    src: &[u8],
    base: usize,
    strides: &[usize],
    extent: &[usize],
    itemsize: usize,
    out: &mut [u8],
) {
    let Some((&row_extent, outer_extent)) = extent.split_last() else {
        out.copy_from_slice(&src[base..base + itemsize]);
        return;
    };
    let row_bytes = row_extent * itemsize;
    if row_bytes == 0 || out.is_empty() {
        return;
    }
    let row_stride = strides[strides.len() - 1];
    let outer_strides = &strides[..strides.len() - 1];
    let mut index = vec![0usize; outer_extent.len()];
    let mut offset = base;
    for row in out.chunks_exact_mut(row_bytes) {
        if row_stride == itemsize {
            row.copy_from_slice(&src[offset..offset + row_bytes]);
        } else {
            copy_strided(src, offset, row_stride, itemsize, row);
        }
        for axis in (0..outer_extent.len()).rev() {
            index[axis] += 1;
            if index[axis] < outer_extent[axis] {
                offset += outer_strides[axis];
                break;
            }
            index[axis] = 0;
            offset -= (outer_extent[axis] - 1) * outer_strides[axis];
        }
    }
}

/// Copies `row.len() / itemsize` elements, `stride` bytes apart from `offset`, into `row`.
fn copy_strided(src: &[u8], offset: usize, stride: usize, itemsize: usize, row: &mut [u8]) {
    match itemsize {
        1 => copy_fixed::<1>(src, offset, stride, row),
        2 => copy_fixed::<2>(src, offset, stride, row),
        4 => copy_fixed::<4>(src, offset, stride, row),
        8 => copy_fixed::<8>(src, offset, stride, row),
        16 => copy_fixed::<16>(src, offset, stride, row),
        _ => {
            for (i, dst) in row.chunks_exact_mut(itemsize).enumerate() {
                let at = offset + i * stride;
                dst.copy_from_slice(&src[at..at + itemsize]);
            }
        }
    }
}

/// [`copy_strided`] for a compile-time item size, so each copy is a fixed-size move.
fn copy_fixed<const N: usize>(src: &[u8], offset: usize, stride: usize, row: &mut [u8]) {
    for (i, dst) in row.chunks_exact_mut(N).enumerate() {
        let at = offset + i * stride;
        dst.copy_from_slice(&src[at..at + N]);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn runs(shape: &[u64], start: &[u64], stop: &[u64]) -> (u64, Vec<u64>) {
        let r = Runs::new(shape, 1, start, stop);
        (r.run_len(), r.collect())
    }

    #[test]
    fn runs_are_maximal() {
        // Whole array: one run.
        assert_eq!(runs(&[4, 5, 6], &[0, 0, 0], &[4, 5, 6]), (120, vec![0]));
        // Full inner axes plus a partial outer one: one run.
        assert_eq!(runs(&[4, 5, 6], &[1, 0, 0], &[3, 5, 6]), (60, vec![30]));
        // Extent-1 outer axes do not break contiguity.
        assert_eq!(runs(&[4, 5, 6], &[2, 1, 0], &[3, 4, 6]), (18, vec![66]));
        // A partial innermost axis: one run per row.
        assert_eq!(runs(&[4, 5, 6], &[1, 1, 2], &[2, 3, 5]), (3, vec![38, 44]));
        assert_eq!(
            runs(&[3, 2, 2], &[0, 0, 1], &[2, 2, 2]),
            (1, vec![1, 3, 5, 7])
        );
        // Empty regions have no runs.
        assert_eq!(runs(&[4, 5], &[1, 2], &[1, 5]).1, Vec::<u64>::new());
        assert_eq!(runs(&[0, 5], &[0, 0], &[0, 5]).1, Vec::<u64>::new());
    }

    #[test]
    fn contiguity() {
        assert!(region_is_contiguous(&[4, 5], &[1, 0], &[3, 5]));
        assert!(region_is_contiguous(&[4, 5], &[1, 1], &[2, 4]));
        assert!(!region_is_contiguous(&[4, 5], &[1, 1], &[3, 4]));
        assert!(region_is_contiguous(&[4, 5], &[1, 1], &[1, 4]));
        assert!(!region_is_contiguous(&[4, 5], &[1, 1], &[5, 4]));
        assert!(!region_is_contiguous(&[4, 5], &[1], &[2]));
        assert!(!region_is_contiguous(&[4, 5], &[2, 0], &[1, 5]));
    }

    #[test]
    fn gather_transposes() {
        // A 2x3 array stored in Fortran order: column by column.
        let stored = [0u8, 3, 1, 4, 2, 5];
        let mut out = [0u8; 6];
        gather(
            &stored,
            0,
            &fortran_strides(&[2, 3], 1),
            &[2, 3],
            1,
            &mut out,
        );
        assert_eq!(out, [0, 1, 2, 3, 4, 5]);
        // Its region rows 0..2, columns 1..3, with 2-byte items.
        let stored: Vec<u8> = (0..12).collect();
        let mut out = [0u8; 8];
        gather(
            &stored,
            4,
            &fortran_strides(&[2, 3], 2),
            &[2, 2],
            2,
            &mut out,
        );
        assert_eq!(out, [4, 5, 8, 9, 6, 7, 10, 11]);
    }
}
