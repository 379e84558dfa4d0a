//! Scattering chunk bytes into one C-order output buffer.

use std::sync::OnceLock;

use crate::region::Region;

/// C-order strides, in elements, of an array of `shape`.
fn strides(shape: &[u64]) -> Vec<u64> {
    let mut out = vec![1u64; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        out[axis] = out[axis + 1] * shape[axis + 1];
    }
    out
}

/// Copies the part of a chunk that falls inside `out_region` into `out`.
///
/// `out` holds the C-order array of `out_region` (plan frame); `chunk_bytes`
/// holds the C-order chunk whose box is `chunk_region` (same frame). Runs of
/// whole trailing axes are copied as one block.
pub(crate) fn scatter(
    out: &mut [u8],
    out_region: &Region,
    chunk_region: &Region,
    chunk_bytes: &[u8],
    itemsize: usize,
) {
    let rank = out_region.rank();
    if rank == 0 {
        out[..itemsize].copy_from_slice(&chunk_bytes[..itemsize]);
        return;
    }
    let Some(part) = out_region.intersect(chunk_region) else {
        return;
    };
    let extent = part.shape();
    let chunk_shape = chunk_region.shape();
    let out_shape = out_region.shape();
    let chunk_strides = strides(&chunk_shape);
    let out_strides = strides(&out_shape);
    // The contiguous run covers axes `inner..rank`: every axis after `inner`
    // is whole in the part, the chunk and the output alike.
    let mut inner = rank - 1;
    while inner > 0 && extent[inner] == chunk_shape[inner] && extent[inner] == out_shape[inner] {
        inner -= 1;
    }
    let run = (extent[inner] * chunk_strides[inner]) as usize * itemsize;
    let mut index = vec![0u64; inner];
    loop {
        let mut src = 0u64;
        let mut dst = 0u64;
        for axis in 0..=inner {
            let step = if axis < inner { index[axis] } else { 0 };
            src += (part.start[axis] - chunk_region.start[axis] + step) * chunk_strides[axis];
            dst += (part.start[axis] - out_region.start[axis] + step) * out_strides[axis];
        }
        let (src, dst) = (src as usize * itemsize, dst as usize * itemsize);
        copy_run(&mut out[dst..dst + run], &chunk_bytes[src..src + run]);
        // Odometer over the outer axes.
        let mut axis = inner;
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            index[axis] += 1;
            if index[axis] < extent[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
}

/// Runs at least this long are copied by several threads: the copy of a large chunk into
/// fresh output pages (their first-touch faults included) is the read's largest cost over
/// mmap, and one core alone does not reach the memory's bandwidth.
const PARALLEL_COPY_BYTES: usize = 8 << 20;

/// The threads a large run is copied by: up to four of the machine's cores, asked of the
/// system once. (`available_parallelism` reads the process's cgroup files on every call;
/// asked per run, it cost a fine-grid read of 1 GiB 17 s of system time in 2 KiB runs.)
fn copy_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get().min(4)))
}

/// Copies `src` into `dst` (same length): large runs split across up to four of the
/// machine's cores, in pieces a multiple of 2 MiB long (whole huge pages of an aligned
/// output), the first one on the calling thread.
fn copy_run(dst: &mut [u8], src: &[u8]) {
    if dst.len() < PARALLEL_COPY_BYTES {
        dst.copy_from_slice(src);
        return;
    }
    let threads = copy_threads();
    if threads < 2 {
        dst.copy_from_slice(src);
        return;
    }
    let piece = dst.len().div_ceil(threads).next_multiple_of(2 << 20);
    std::thread::scope(|scope| {
        let mut pieces = dst.chunks_mut(piece).zip(src.chunks(piece));
        let first = pieces.next();
        for (d, s) in pieces {
            scope.spawn(move || d.copy_from_slice(s));
        }
        if let Some((d, s)) = first {
            d.copy_from_slice(s);
        }
    });
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// The C-order bytes of `region` of a C-order array of `shape`, one
    /// element at a time (the slow, obviously right way).
    fn gather(data: &[u8], shape: &[u64], region: &Region, itemsize: usize) -> Vec<u8> {
        let st = strides(shape);
        let ext = region.shape();
        let count: u64 = ext.iter().product();
        let mut out = Vec::new();
        for linear in 0..count {
            let mut rest = linear;
            let mut offset = 0;
            for axis in (0..shape.len()).rev() {
                offset += (rest % ext[axis] + region.start[axis]) * st[axis];
                rest /= ext[axis];
            }
            let at = offset as usize * itemsize;
            out.extend_from_slice(&data[at..at + itemsize]);
        }
        out
    }

    #[test]
    fn large_runs_copied_in_parallel_pieces_are_exact() {
        for len in [
            PARALLEL_COPY_BYTES - 1,
            PARALLEL_COPY_BYTES,
            PARALLEL_COPY_BYTES + 12_345,
            3 * PARALLEL_COPY_BYTES + 7,
        ] {
            let src: Vec<u8> = (0..len).map(|i| (i * 31 + i / 4096) as u8).collect();
            let mut dst = vec![0u8; len];
            copy_run(&mut dst, &src);
            assert!(dst == src, "copy of {len} bytes differs");
        }
    }

    #[test]
    fn chunks_scatter_into_a_cropped_output() {
        let shape = [7u64, 9, 5];
        let itemsize = 2;
        let total = shape.iter().product::<u64>() as usize * itemsize;
        let data: Vec<u8> = (0..total).map(|i| (i * 7 % 251) as u8).collect();
        for crop in [
            Region::whole(&shape),
            Region::new(vec![1, 2, 0], vec![6, 9, 5]),
            Region::new(vec![0, 3, 1], vec![7, 4, 4]),
            Region::new(vec![2, 0, 0], vec![3, 9, 5]),
        ] {
            let mut out = vec![0u8; crop.num_elements().unwrap() as usize * itemsize];
            for z in (0..7).step_by(3) {
                for y in (0..9).step_by(4) {
                    let chunk = Region::new(vec![z, y, 0], vec![(z + 3).min(7), (y + 4).min(9), 5]);
                    let bytes = gather(&data, &shape, &chunk, itemsize);
                    scatter(&mut out, &crop, &chunk, &bytes, itemsize);
                }
            }
            assert_eq!(out, gather(&data, &shape, &crop, itemsize), "crop {crop}");
        }
    }

    #[test]
    fn one_dimensional_and_whole_chunk_copies() {
        let data: Vec<u8> = (0..10).collect();
        let crop = Region::new(vec![2], vec![9]);
        let mut out = vec![0u8; 7];
        scatter(
            &mut out,
            &crop,
            &Region::new(vec![0], vec![5]),
            &data[..5],
            1,
        );
        scatter(
            &mut out,
            &crop,
            &Region::new(vec![5], vec![10]),
            &data[5..],
            1,
        );
        assert_eq!(out, (2..9).collect::<Vec<u8>>());
    }
}
