//! Computing one scaled chunk from the source, tile by tile.
//!
//! A scaled chunk names a block of the source (absolute base coordinates, starting at a
//! multiple of the scale) and a [`Scale`]; its bytes are the block reduced to
//! `ceil(extent / scale)` per axis, in the source's dtype and byte order, C order.
//!
//! * `nearest` reads only the rows it picks (`a[::s0, ::s1, …]`), one output row at a
//!   time, a row in segments of at most [`TILE_BYTES`] of source; the picked elements are
//!   copied, never converted, so every dtype is bit-exact.
//! * `area` cuts the block into tiles of whole reduction blocks, each at most
//!   [`TILE_BYTES`] of source (unless one block along the last axis alone is larger), reads
//!   one tile at a time and reduces it with the staged means of the reference: blocks
//!   edge-replicated at the far end, averaged one axis at a time from the last, axes of
//!   scale 1 skipped ([`super::kernel`] holds the arithmetic). Every output element
//!   depends on one block only, so the tiles compose to exactly the reduction of the
//!   whole block, which is in turn the window of the whole tensor's reduction.
//!
//! Peak memory is one tile, the output chunk and one row of working values per axis.

use std::ops::Range;

use crate::grid::Region;
use crate::scaled::kernel::{self, Elem, IntElem, Work};
use crate::scaled::{Method, Scale};
use crate::source::npy::{ByteOrder, Dtype, Kind, NpyError, NpyFile};

/// The most source bytes read into memory at once (one tile).
pub const TILE_BYTES: u64 = 4 << 20;

/// Why a scaled chunk could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum ReduceError {
    /// Reading the source failed (or it changed while being read).
    #[error(transparent)]
    Source(#[from] NpyError),
    /// The method cannot reduce this dtype.
    #[error("reduction_method '{method}' cannot reduce dtype '{dtype}'")]
    Unsupported {
        /// The method.
        method: Method,
        /// The dtype.
        dtype: String,
    },
    /// The output buffer has the wrong length.
    #[error("scaled chunk needs {needed} bytes of output, got {got}")]
    OutputLength {
        /// Bytes the reduction writes.
        needed: u64,
        /// Bytes given.
        got: usize,
    },
}

/// The bytes of the scaled chunk `region` of a tensor of `shape`, reduced by `scale`,
/// into `out` (exactly `prod(ceil(extent / scale)) × itemsize` bytes).
pub fn reduce_chunk(
    file: &NpyFile,
    shape: &[u64],
    region: &Region,
    scale: &Scale,
    out: &mut [u8],
) -> Result<(), ReduceError> {
    reduce_in_tiles(file, shape, region, scale, out, TILE_BYTES)
}

/// [`reduce_chunk`] with tiles of at most `tile_bytes` of source.
fn reduce_in_tiles(
    file: &NpyFile,
    shape: &[u64],
    region: &Region,
    scale: &Scale,
    out: &mut [u8],
    tile_bytes: u64,
) -> Result<(), ReduceError> {
    let dtype = file.header().dtype;
    let mut job = Job::new(file, shape, region, scale, dtype.itemsize as u64);
    job.tile_bytes = tile_bytes;
    let needed = job
        .out_shape
        .iter()
        .fold(job.itemsize, |acc, &d| acc.saturating_mul(d));
    if needed != out.len() as u64 {
        return Err(ReduceError::OutputLength {
            needed,
            got: out.len(),
        });
    }
    if needed == 0 {
        return Ok(());
    }
    match scale.method() {
        Method::Nearest => job.nearest(out),
        Method::Area => area_by_dtype(&job, dtype, out),
    }
}

/// Picks the element type and runs `area` with it.
fn area_by_dtype(job: &Job<'_>, dtype: Dtype, out: &mut [u8]) -> Result<(), ReduceError> {
    let big = dtype.order == ByteOrder::Big;
    match (dtype.kind, dtype.itemsize) {
        (Kind::UInt, 1) => job.area_int::<kernel::U8>(big, out),
        (Kind::UInt, 2) => job.area_int::<kernel::U16>(big, out),
        (Kind::UInt, 4) => job.area_int::<kernel::U32>(big, out),
        (Kind::UInt, 8) => job.area_int::<kernel::U64>(big, out),
        (Kind::Int, 1) => job.area_int::<kernel::I8>(big, out),
        (Kind::Int, 2) => job.area_int::<kernel::I16>(big, out),
        (Kind::Int, 4) => job.area_int::<kernel::I32>(big, out),
        (Kind::Int, 8) => job.area_int::<kernel::I64>(big, out),
        (Kind::Float, 2) => job.area::<kernel::F16>(big, out),
        (Kind::Float, 4) => job.area::<kernel::F32>(big, out),
        (Kind::Float, 8) => job.area::<kernel::F64>(big, out),
        (Kind::Complex, 8) => job.area::<kernel::C64>(big, out),
        (Kind::Complex, 16) => job.area::<kernel::C128>(big, out),
        _ => Err(ReduceError::Unsupported {
            method: Method::Area,
            dtype: dtype.numpy_str(),
        }),
    }
}

/// One scaled chunk to compute.
struct Job<'a> {
    file: &'a NpyFile,
    /// The block's absolute start in the tensor.
    origin: &'a [u64],
    /// The block's extent per axis.
    extent: Vec<u64>,
    /// The scale factor per axis.
    factors: &'a [u64],
    /// `ceil(extent / scale)`: the chunk's shape.
    out_shape: Vec<u64>,
    /// Per axis: whether the reduction along it is over the innermost axis of the array
    /// numpy reduces (every later axis of the whole tensor's reduction has length 1), so
    /// its blocks are summed pairwise rather than term by term.
    innermost: Vec<bool>,
    itemsize: u64,
    /// The most source bytes one read brings into memory.
    tile_bytes: u64,
}

impl<'a> Job<'a> {
    fn new(
        file: &'a NpyFile,
        shape: &[u64],
        region: &'a Region,
        scale: &'a Scale,
        itemsize: u64,
    ) -> Self {
        let factors = scale.factors();
        let extent = region.shape();
        let out_shape = scale.reduced(&extent);
        let whole = scale.reduced(shape);
        let rank = shape.len();
        let innermost = (0..rank)
            .map(|a| whole[a + 1..].iter().all(|&d| d == 1))
            .collect();
        Job {
            file,
            origin: &region.start,
            extent,
            factors,
            out_shape,
            innermost,
            itemsize,
            tile_bytes: TILE_BYTES,
        }
    }

    fn rank(&self) -> usize {
        self.extent.len()
    }

    /// Reads the box `[start, stop)` (relative to the block) into `buf`, in C order.
    fn read_box(&self, start: &[u64], stop: &[u64], buf: &mut Vec<u8>) -> Result<(), NpyError> {
        let abs_start: Vec<u64> = start.iter().zip(self.origin).map(|(s, o)| s + o).collect();
        let abs_stop: Vec<u64> = stop.iter().zip(self.origin).map(|(s, o)| s + o).collect();
        let elements: u64 = start.iter().zip(stop).map(|(a, b)| b - a).product();
        buf.clear();
        buf.resize((elements * self.itemsize) as usize, 0);
        self.file.read_region(&abs_start, &abs_stop, buf)
    }

    /// `a[::s0, ::s1, …]`: one output row at a time, the last axis in segments.
    fn nearest(&self, out: &mut [u8]) -> Result<(), ReduceError> {
        let rank = self.rank();
        let last = rank - 1;
        let item = self.itemsize as usize;
        let step = self.factors[last];
        let width = self.out_shape[last];
        // Output elements per segment: their source span fits the tile.
        let per_segment = (self.tile_bytes / step.saturating_mul(self.itemsize)).clamp(1, width);
        let mut buf = Vec::new();
        let mut row_index = vec![0u64; last];
        let mut out_offset = 0usize;
        loop {
            let mut start: Vec<u64> = row_index
                .iter()
                .zip(self.factors)
                .map(|(&o, &s)| o * s)
                .collect();
            let mut stop: Vec<u64> = start.iter().map(|&s| s + 1).collect();
            start.push(0);
            stop.push(0);
            let mut first = 0;
            while first < width {
                let end = (first + per_segment).min(width);
                start[last] = first * step;
                stop[last] = (end - 1) * step + 1;
                self.read_box(&start, &stop, &mut buf)?;
                for j in 0..(end - first) as usize {
                    let src = j * step as usize * item;
                    out[out_offset..out_offset + item].copy_from_slice(&buf[src..src + item]);
                    out_offset += item;
                }
                first = end;
            }
            if !odometer(&mut row_index, &self.out_shape[..last]) {
                return Ok(());
            }
        }
    }

    /// The staged means, tile by tile (see the module docs).
    fn area<E: Elem>(&self, big_endian: bool, out: &mut [u8]) -> Result<(), ReduceError> {
        let mut rows = Rows::<E>::new(self.rank());
        self.tiles(out, |tile, lo, hi, out| {
            self.area_tile::<E>(tile, lo, hi, big_endian, &mut rows, out)
        })
    }

    /// Whether `area` of integers of `max_abs` may take the block-sum path: every factor a
    /// power of two and every block sum below 2^53, so the sum is exact, the one division
    /// by a power of two is exact, and the result equals the staged means bit for bit.
    fn integer_sums_exact(&self, max_abs: u64) -> bool {
        let block = self
            .factors
            .iter()
            .try_fold(1u64, |acc, &f| acc.checked_mul(f));
        self.factors.iter().all(|f| f.is_power_of_two())
            && block
                .and_then(|b| b.checked_mul(max_abs))
                .is_some_and(|bound| bound <= 1 << 53)
    }

    /// `area` of integers as exact block sums divided once (see
    /// [`Job::integer_sums_exact`]); the staged path otherwise.
    fn area_int<E: IntElem>(&self, big_endian: bool, out: &mut [u8]) -> Result<(), ReduceError> {
        if !self.integer_sums_exact(E::MAX_ABS) {
            return self.area::<E>(big_endian, out);
        }
        let mut sums = Vec::new();
        self.tiles(out, |tile, lo, hi, out| {
            self.sum_tile::<E>(tile, lo, hi, big_endian, &mut sums, out)
        })
    }

    /// Cuts the block into tiles of whole reduction blocks, reads each and hands it to
    /// `each` with the outputs `[lo, hi)` it determines.
    fn tiles(
        &self,
        out: &mut [u8],
        mut each: impl FnMut(&Tile<'_>, &[u64], &[u64], &mut [u8]),
    ) -> Result<(), ReduceError> {
        let rank = self.rank();
        // Rows of one output block along each axis (clipped at the block's end).
        let block = |a: usize| self.factors[a].min(self.extent[a]);
        // The tiled axis: the slowest one at which one output block of it, with every
        // faster axis whole, fits the tile.
        let slab = |d: usize| {
            self.extent[d + 1..]
                .iter()
                .fold(block(d).saturating_mul(self.itemsize), |acc, &e| {
                    acc.saturating_mul(e)
                })
        };
        let depth = (0..rank)
            .find(|&d| slab(d) <= self.tile_bytes)
            .unwrap_or(rank - 1);
        let per_tile = (self.tile_bytes / slab(depth).max(1)).clamp(1, self.out_shape[depth]);

        let mut buf = Vec::new();
        let mut prefix = vec![0u64; depth];
        loop {
            let mut first = 0;
            while first < self.out_shape[depth] {
                let end = (first + per_tile).min(self.out_shape[depth]);
                let mut start = vec![0u64; rank];
                let mut stop = self.extent.clone();
                for a in 0..depth {
                    start[a] = prefix[a] * self.factors[a];
                    stop[a] = (start[a] + self.factors[a]).min(self.extent[a]);
                }
                start[depth] = first * self.factors[depth];
                stop[depth] = (end * self.factors[depth]).min(self.extent[depth]);
                self.read_box(&start, &stop, &mut buf)?;
                let tile = Tile {
                    data: &buf,
                    start: &start,
                    strides: c_strides(&start, &stop),
                    last_len: (stop[rank - 1] - start[rank - 1]) as usize,
                };
                // Every output row of the tile.
                let mut lo: Vec<u64> = prefix.clone();
                lo.push(first);
                lo.resize(rank, 0);
                let mut hi: Vec<u64> = prefix.iter().map(|p| p + 1).collect();
                hi.push(end);
                hi.extend_from_slice(&self.out_shape[depth + 1..]);
                each(&tile, &lo, &hi, out);
                first = end;
            }
            if !odometer(&mut prefix, &self.out_shape[..depth]) {
                return Ok(());
            }
        }
    }

    /// Writes the outputs `[lo, hi)` of one tile, one output row (last axis) at a time.
    fn area_tile<E: Elem>(
        &self,
        tile: &Tile<'_>,
        lo: &[u64],
        hi: &[u64],
        big_endian: bool,
        rows: &mut Rows<E>,
        out: &mut [u8],
    ) {
        let rank = self.rank();
        let last = rank - 1;
        let item = self.itemsize as usize;
        let out_strides = c_strides(&vec![0; rank], &self.out_shape);
        let mut index: Vec<u64> = lo[..last].to_vec();
        let columns = lo[last]..hi[last];
        loop {
            self.stage::<E>(tile, &index, columns.clone(), 0, 0, big_endian, rows);
            let base = row_offset(&index, &out_strides, columns.start);
            for (j, &value) in rows.row[0].iter().enumerate() {
                let at = (base + j) * item;
                E::store(value, &mut out[at..at + item], big_endian);
            }
            if !odometer_in(&mut index, &lo[..last], &hi[..last]) {
                return;
            }
        }
    }

    /// Writes the outputs `[lo, hi)` of one tile as exact block sums divided once.
    fn sum_tile<E: IntElem>(
        &self,
        tile: &Tile<'_>,
        lo: &[u64],
        hi: &[u64],
        big_endian: bool,
        sums: &mut Vec<i64>,
        out: &mut [u8],
    ) {
        let rank = self.rank();
        let last = rank - 1;
        let item = self.itemsize as usize;
        let block: u64 = self.factors.iter().product();
        let out_strides = c_strides(&vec![0; rank], &self.out_shape);
        let s_last = self.factors[last];
        let columns = lo[last]..hi[last];
        let mut index: Vec<u64> = lo[..last].to_vec();
        let mut terms = vec![0u64; last];
        loop {
            sums.clear();
            sums.resize((columns.end - columns.start) as usize, 0);
            // Every source row of the output row's blocks (edge-replicated past the end).
            terms.iter_mut().for_each(|t| *t = 0);
            loop {
                let row: usize = (0..last)
                    .map(|a| {
                        let src = (index[a] * self.factors[a] + terms[a]).min(self.extent[a] - 1);
                        (src - tile.start[a]) as usize * tile.strides[a]
                    })
                    .sum();
                // The tile's part of this source row along the last axis.
                let width = tile.last_len;
                let data = &tile.data[row * item..(row + width) * item];
                for (sum, j) in sums.iter_mut().zip(columns.clone()) {
                    let first = (j * s_last - tile.start[last]) as usize;
                    let whole = (s_last as usize).min(width - first);
                    let run = &data[first * item..(first + whole) * item];
                    *sum += run
                        .chunks_exact(item)
                        .map(|b| E::load_i64(b, big_endian))
                        .sum::<i64>();
                    // Past the far edge the last element repeats.
                    if whole < s_last as usize {
                        let edge = &data[(width - 1) * item..width * item];
                        *sum += E::load_i64(edge, big_endian) * (s_last as usize - whole) as i64;
                    }
                }
                if !odometer(&mut terms, &self.factors[..last]) {
                    break;
                }
            }
            let base = row_offset(&index, &out_strides, columns.start);
            for (j, &sum) in sums.iter().enumerate() {
                let at = (base + j) * item;
                E::store(
                    sum as f64 / block as f64,
                    &mut out[at..at + item],
                    big_endian,
                );
            }
            if !odometer_in(&mut index, &lo[..last], &hi[..last]) {
                return;
            }
        }
    }

    /// The staged mean over axes `axis..` of the output row `index` (its last-axis outputs
    /// `columns`) into `rows.row[axis]`; `offset` is the element offset in the tile of the
    /// source indices already fixed on the slower axes.
    #[allow(clippy::too_many_arguments)]
    fn stage<E: Elem>(
        &self,
        tile: &Tile<'_>,
        index: &[u64],
        columns: Range<u64>,
        axis: usize,
        offset: usize,
        big_endian: bool,
        rows: &mut Rows<E>,
    ) {
        let rank = self.rank();
        let s = self.factors[axis];
        let e = self.extent[axis];
        // The source rows of output block `o` along this axis, edge-replicated past the end,
        // as positions in the tile.
        let source = |o: u64, t: u64| ((o * s + t).min(e - 1) - tile.start[axis]) as usize;
        let width = (columns.end - columns.start) as usize;
        let item = self.itemsize as usize;
        if axis == rank - 1 {
            let mut row = std::mem::take(&mut rows.row[axis]);
            row.clear();
            let block = &mut rows.block;
            for o in columns {
                block.clear();
                for t in 0..s {
                    let at = (offset + source(o, t) * tile.strides[axis]) * item;
                    block.push(E::load(&tile.data[at..at + item], big_endian));
                }
                row.push(if s == 1 {
                    block[0]
                } else {
                    E::W::divide(E::W::ZERO.add(E::W::pairwise(block)), s)
                });
            }
            rows.row[axis] = row;
            return;
        }
        let o = index[axis];
        let step = tile.strides[axis];
        if s == 1 {
            self.stage::<E>(
                tile,
                index,
                columns,
                axis + 1,
                offset + source(o, 0) * step,
                big_endian,
                rows,
            );
            rows.row.swap(axis, axis + 1);
            return;
        }
        let mut acc = std::mem::take(&mut rows.row[axis]);
        acc.clear();
        if self.innermost[axis] {
            // numpy sums this block as one contiguous run: gather its terms, pairwise.
            let mut terms = std::mem::take(&mut rows.terms[axis]);
            terms.clear();
            for t in 0..s {
                self.stage::<E>(
                    tile,
                    index,
                    columns.clone(),
                    axis + 1,
                    offset + source(o, t) * step,
                    big_endian,
                    rows,
                );
                terms.extend_from_slice(&rows.row[axis + 1]);
            }
            let mut column = Vec::with_capacity(s as usize);
            for j in 0..width {
                column.clear();
                column.extend((0..s as usize).map(|t| terms[t * width + j]));
                acc.push(E::W::divide(E::W::ZERO.add(E::W::pairwise(&column)), s));
            }
            rows.terms[axis] = terms;
        } else {
            acc.resize(width, E::W::ZERO);
            for t in 0..s {
                self.stage::<E>(
                    tile,
                    index,
                    columns.clone(),
                    axis + 1,
                    offset + source(o, t) * step,
                    big_endian,
                    rows,
                );
                for (a, &v) in acc.iter_mut().zip(&rows.row[axis + 1]) {
                    *a = a.add(v);
                }
            }
            for a in acc.iter_mut() {
                *a = E::W::divide(*a, s);
            }
        }
        rows.row[axis] = acc;
    }
}

/// One tile of source in memory: its bytes in C order, its start (relative to the block),
/// its strides in elements and its extent along the last axis.
struct Tile<'a> {
    data: &'a [u8],
    start: &'a [u64],
    strides: Vec<usize>,
    /// The tile's extent along the last axis.
    last_len: usize,
}

/// Reused rows of working values: one result row per axis, the terms of a pairwise
/// block per axis, and the block of the last axis.
struct Rows<E: Elem> {
    row: Vec<Vec<E::W>>,
    terms: Vec<Vec<E::W>>,
    block: Vec<E::W>,
}

impl<E: Elem> Rows<E> {
    fn new(rank: usize) -> Self {
        Self {
            row: vec![Vec::new(); rank],
            terms: vec![Vec::new(); rank],
            block: Vec::new(),
        }
    }
}

/// The element offset in the output chunk of output row `index` (every axis but the
/// last), at column `first`.
fn row_offset(index: &[u64], out_strides: &[usize], first: u64) -> usize {
    index
        .iter()
        .zip(out_strides)
        .map(|(&i, &s)| i as usize * s)
        .sum::<usize>()
        + first as usize
}

/// C-order strides (in elements) of a box `[start, stop)`.
fn c_strides(start: &[u64], stop: &[u64]) -> Vec<usize> {
    let mut strides = vec![1usize; start.len()];
    for a in (0..start.len().saturating_sub(1)).rev() {
        strides[a] = strides[a + 1] * (stop[a + 1] - start[a + 1]) as usize;
    }
    strides
}

/// Advances `index` within `[0, bounds)` in C order; false once it wraps around.
fn odometer(index: &mut [u64], bounds: &[u64]) -> bool {
    for a in (0..index.len()).rev() {
        index[a] += 1;
        if index[a] < bounds[a] {
            return true;
        }
        index[a] = 0;
    }
    false
}

/// Advances `index` to the next position of the box `[lo, hi)` in C order (last axis
/// fastest); false, with `index` back at `lo`, once it has passed the last one.
fn odometer_in(index: &mut [u64], lo: &[u64], hi: &[u64]) -> bool {
    for a in (0..index.len()).rev() {
        index[a] += 1;
        if index[a] < hi[a] {
            return true;
        }
        index[a] = lo[a];
    }
    false
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::source::npy::Limits;
    use tessera_test_support::data::{pattern, write_npy};

    /// Every scaled chunk of a few tensors, computed with tiny tiles (many reads, blocks
    /// split across tiles on the slow axes) and with the default tile, is the same bytes.
    #[test]
    fn tiles_compose_to_the_whole_reduction() {
        let dir = tempfile::tempdir().unwrap();
        let cases: [(&str, &[u64], &[u64]); 7] = [
            ("<u2", &[5, 37, 41], &[2, 3, 4]),
            ("<u2", &[5, 37, 41], &[1, 4, 8]),
            (">i4", &[50, 9], &[8, 2]),
            ("<f4", &[4, 6, 33, 20], &[1, 3, 8, 20]),
            (">i2", &[50, 9], &[7, 2]),
            ("<f2", &[3, 40, 17], &[3, 16, 1]),
            ("<c8", &[12, 18], &[5, 4]),
        ];
        for (n, (descr, shape, factors)) in cases.into_iter().enumerate() {
            let itemsize: u64 = descr[2..].parse().unwrap();
            let elements: u64 = shape.iter().product();
            let mut bytes = pattern((elements * itemsize) as usize, n as u64);
            if descr.contains('f') || descr.contains('c') {
                // Keep floats finite: clear the top exponent bit of every float.
                let width = if descr.contains('c') {
                    4
                } else {
                    itemsize as usize
                };
                let top = if descr.starts_with('>') { 0 } else { width - 1 };
                for w in bytes.chunks_exact_mut(width) {
                    w[top] &= 0x3f;
                }
            }
            let path = dir.path().join(format!("a{n}.npy"));
            write_npy(&path, descr, shape, &bytes);
            let file = NpyFile::open(&path, &Limits::default()).unwrap();
            for method in [Method::Nearest, Method::Area] {
                let scale = Scale::new(factors.to_vec(), method).unwrap();
                let region = Region::whole(shape);
                let out_len = (scale.reduced(shape).iter().product::<u64>() * itemsize) as usize;
                let mut whole = vec![0u8; out_len];
                reduce_chunk(&file, shape, &region, &scale, &mut whole).unwrap();
                for tile in [1, 64, 300] {
                    let mut tiled = vec![0u8; out_len];
                    reduce_in_tiles(&file, shape, &region, &scale, &mut tiled, tile).unwrap();
                    assert_eq!(
                        tiled, whole,
                        "{descr} {shape:?} {factors:?} {method} tile {tile}"
                    );
                }
            }
        }
    }

    #[test]
    fn nearest_picks_the_first_element_of_every_block() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("n.npy");
        let data: Vec<u8> = (0..60).collect();
        write_npy(&path, "|u1", &[6, 10], &data);
        let file = NpyFile::open(&path, &Limits::default()).unwrap();
        let scale = Scale::new(vec![4, 3], Method::Nearest).unwrap();
        // The block [4, 6) x [3, 10) of the tensor, reduced.
        let region = Region::new(vec![4, 3], vec![6, 10]);
        let mut out = vec![0u8; 3];
        reduce_chunk(&file, &[6, 10], &region, &scale, &mut out).unwrap();
        assert_eq!(out, vec![43, 46, 49]);
    }

    #[test]
    fn area_replicates_the_far_edge_and_rounds_half_to_even() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npy");
        write_npy(&path, "|u1", &[1, 5], &[1, 2, 3, 4, 10]);
        let file = NpyFile::open(&path, &Limits::default()).unwrap();
        let scale = Scale::new(vec![1, 2], Method::Area).unwrap();
        let mut out = vec![0u8; 3];
        reduce_chunk(&file, &[1, 5], &Region::whole(&[1, 5]), &scale, &mut out).unwrap();
        // (1+2)/2 = 1.5 -> 2, (3+4)/2 = 3.5 -> 4, (10+10)/2 = 10.
        assert_eq!(out, vec![2, 4, 10]);
    }
}
