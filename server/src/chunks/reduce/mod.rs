//! Computing one scaled chunk from the source, piece by piece, in bounded memory.
//!
//! A scaled chunk names a block of the source (absolute base coordinates, starting at a
//! multiple of the scale) and a [`Scale`]; its bytes are the block reduced to
//! `ceil(extent / scale)` per axis, in the source's dtype and byte order, C order.
//!
//! * `nearest` reads only the rows it picks (`a[::s0, ::s1, …]`), one output row at a
//!   time, a row in segments of at most [`TILE_BYTES`] of source; the picked elements are
//!   copied, never converted, so every dtype is bit-exact.
//! * `area` computes the staged means of the reference: blocks edge-replicated at the far
//!   end, averaged one axis at a time from the last, axes of scale 1 skipped
//!   ([`super::kernel`] holds the arithmetic). The outputs are taken a tile at a time: one
//!   output on each axis before the tiled axis (the *slow* axes), a run of outputs along
//!   it, every output after it. A tile's source is read in *pieces* of at most
//!   [`TILE_BYTES`]: runs of its slow-axis rows in C order (and, when one block along the
//!   last axis alone is larger, segments of that block). What a piece adds to a slow
//!   axis's means is carried to the next piece as partial sums, added in exactly the
//!   order the whole-block formula adds them, so any cut gives the same bits: term by
//!   term sums keep one running sum per output, numpy's pairwise sums a
//!   [`super::kernel::Pairwise`] stream of bounded size.
//!
//! Peak memory is one piece ([`TILE_BYTES`]), the output chunk, and at most
//! [`WORK_BYTES`] of running sums and rows of working values, whatever the factors
//! ([`decode_bytes`]); for a source that decodes whole native chunks (Zarr), also the box
//! of native chunks the pieces are cut from (`band.rs`, at most 256 MiB). A computation checks its stop flag before every piece and gives up
//! with [`ReduceError::Cancelled`] once it is set (its caller is gone).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::grid::Region;
mod band;
mod kernel;

use crate::grid::scaled::{Method, Scale};
use crate::source::npy::{ByteOrder, Dtype, Kind};
use crate::source::{Source, SourceError};
use band::Band;
use kernel::{Elem, IntElem, Pairwise, Work};

/// The most source bytes read into memory at once (one piece).
pub const TILE_BYTES: u64 = 4 << 20;

/// The most bytes of running sums and rows of working values one computation holds.
pub const WORK_BYTES: u64 = 4 << 20;

/// Index vectors, stream stacks and other small state, over the tile and working values.
const SMALL_BYTES: u64 = 1 << 20;

/// The most memory computing a scaled chunk of `out_len` bytes holds: the chunk, one
/// piece of source and the working values.
pub fn decode_bytes(out_len: u64) -> u64 {
    out_len
        .saturating_add(TILE_BYTES)
        .saturating_add(WORK_BYTES)
        .saturating_add(SMALL_BYTES)
}

/// Why a scaled chunk could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum ReduceError {
    /// Reading the source failed (or it changed while being read).
    #[error(transparent)]
    Source(#[from] SourceError),
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
    /// The stop flag was set: nobody waits for the chunk any more.
    #[error("the scaled chunk was abandoned: no caller waits for it any more")]
    Cancelled,
}

/// The bytes of the scaled chunk `region` of a tensor of `shape`, reduced by `scale`,
/// into `out` (exactly `prod(ceil(extent / scale)) × itemsize` bytes). Gives up with
/// [`ReduceError::Cancelled`] at the next piece once `stop` is set.
pub fn reduce_chunk(
    file: &dyn Source,
    shape: &[u64],
    region: &Region,
    scale: &Scale,
    out: &mut [u8],
    stop: &AtomicBool,
) -> Result<(), ReduceError> {
    let bounds = Bounds {
        tile: TILE_BYTES,
        work: WORK_BYTES,
    };
    reduce_within(file, shape, region, scale, out, stop, bounds)
}

/// The memory bounds of one computation.
#[derive(Clone, Copy, Debug)]
struct Bounds {
    /// Most source bytes read at once.
    tile: u64,
    /// Most bytes of running sums and working rows.
    work: u64,
}

/// [`reduce_chunk`] within `bounds`.
fn reduce_within(
    file: &dyn Source,
    shape: &[u64],
    region: &Region,
    scale: &Scale,
    out: &mut [u8],
    stop: &AtomicBool,
    bounds: Bounds,
) -> Result<(), ReduceError> {
    let dtype = *file.dtype();
    let job = Job::new(
        file,
        shape,
        region,
        scale,
        dtype.itemsize as u64,
        bounds,
        stop,
    );
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
    file: &'a dyn Source,
    /// For a source that decodes whole native chunks: the box of them last read.
    band: Option<Band>,
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
    bounds: Bounds,
    /// Set once nobody waits for the chunk.
    stop: &'a AtomicBool,
}

/// How a block is cut into tiles and pieces (see the module docs).
#[derive(Clone, Copy, Debug)]
struct Cut {
    /// The tiled axis: one output per tile on every axis before it.
    depth: usize,
    /// Outputs per tile along the tiled axis.
    per_tile: u64,
    /// When one block along the last axis alone is over the tile (the tiled axis is then
    /// the last, a tile one output): the source elements of it read at once.
    segment: Option<u64>,
}

/// The outputs of one tile, `[lo, hi)` per axis, and the source it reduces, relative to
/// the block: `[slow_lo, slow_hi)` on the axes before the tiled one, `[fast_lo, fast_hi)`
/// from it on.
struct TileBox {
    lo: Vec<u64>,
    hi: Vec<u64>,
    slow_lo: Vec<u64>,
    slow_hi: Vec<u64>,
    fast_lo: Vec<u64>,
    fast_hi: Vec<u64>,
}

impl TileBox {
    /// Output rows of the tile (every axis but the last) times outputs per row.
    fn outputs(&self) -> usize {
        self.lo
            .iter()
            .zip(&self.hi)
            .map(|(l, h)| (h - l) as usize)
            .product()
    }

    /// Outputs per output row (along the last axis).
    fn width(&self) -> usize {
        let last = self.lo.len() - 1;
        (self.hi[last] - self.lo[last]) as usize
    }
}

/// What a tile's source rows are folded into: the staged means or the exact sums.
trait Fold {
    /// Starts the tile `tile`.
    fn begin(&mut self, tile: &TileBox);
    /// Folds one row of the slow axes, `row` (relative to the block), whose source is at
    /// element `offset` of `piece`.
    fn row(&mut self, tile: &TileBox, piece: &Tile<'_>, row: &[u64], offset: usize, out: &mut [u8]);
    /// Writes what is still held once every row of the tile was folded.
    fn finish(&mut self, tile: &TileBox, out: &mut [u8]);
}

impl<'a> Job<'a> {
    fn new(
        file: &'a dyn Source,
        shape: &[u64],
        region: &'a Region,
        scale: &'a Scale,
        itemsize: u64,
        bounds: Bounds,
        stop: &'a AtomicBool,
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
            band: Band::of(file, shape, itemsize),
            origin: &region.start,
            extent,
            factors,
            out_shape,
            innermost,
            itemsize,
            bounds,
            stop,
        }
    }

    fn rank(&self) -> usize {
        self.extent.len()
    }

    /// Fails once the stop flag is set.
    fn check_stop(&self) -> Result<(), ReduceError> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(ReduceError::Cancelled);
        }
        Ok(())
    }

    /// Reads the box `[start, stop)` (relative to the block) into `buf`, in C order.
    fn read_box(&self, start: &[u64], stop: &[u64], buf: &mut Vec<u8>) -> Result<(), SourceError> {
        let abs_start: Vec<u64> = start.iter().zip(self.origin).map(|(s, o)| s + o).collect();
        let abs_stop: Vec<u64> = stop.iter().zip(self.origin).map(|(s, o)| s + o).collect();
        let elements: u64 = start.iter().zip(stop).map(|(a, b)| b - a).product();
        buf.clear();
        buf.resize((elements * self.itemsize) as usize, 0);
        match &self.band {
            Some(band) => band.read(self.file, &abs_start, &abs_stop, buf),
            None => self.file.read_region(&abs_start, &abs_stop, buf),
        }
    }

    /// `a[::s0, ::s1, …]`: one output row at a time, the last axis in segments.
    fn nearest(&self, out: &mut [u8]) -> Result<(), ReduceError> {
        let rank = self.rank();
        let last = rank - 1;
        let item = self.itemsize as usize;
        let step = self.factors[last];
        let width = self.out_shape[last];
        // Output elements per segment: their source span fits the tile.
        let per_segment = (self.bounds.tile / step.saturating_mul(self.itemsize)).clamp(1, width);
        let mut buf = Vec::new();
        let mut row_index = vec![0u64; last];
        let mut out_offset = 0usize;
        loop {
            self.check_stop()?;
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

    /// The staged means, tile by tile and piece by piece (see the module docs).
    fn area<E: Elem>(&self, big_endian: bool, out: &mut [u8]) -> Result<(), ReduceError> {
        let value = std::mem::size_of::<E::W>() as u64;
        let slow_levels = |d: usize| self.factors[..d].iter().filter(|&&f| f > 1).count() as u64;
        let cut = self.cut(|d| value * slow_levels(d), value * (self.rank() as u64 + 1));
        let mut fold = Staged {
            job: self,
            depth: cut.depth,
            big_endian,
            levels: Vec::new(),
            rows: Rows::<E>::new(self.rank()),
        };
        self.tiles(cut, out, &mut fold)
    }

    /// `area` of integers as exact block sums divided once (see
    /// [`Job::integer_sums_exact`]); the staged path otherwise.
    fn area_int<E: IntElem>(&self, big_endian: bool, out: &mut [u8]) -> Result<(), ReduceError> {
        if !self.integer_sums_exact(E::MAX_ABS) {
            return self.area::<E>(big_endian, out);
        }
        let cut = self.cut(|_| 8, 0);
        let mut fold = Sums::<E> {
            job: self,
            big_endian,
            sums: Vec::new(),
            element: std::marker::PhantomData,
        };
        self.tiles(cut, out, &mut fold)
    }

    /// Rows of one block along axis `a` (clipped at the block's end).
    fn block(&self, a: usize) -> u64 {
        self.factors[a].min(self.extent[a])
    }

    /// Source bytes of one output along axis `d` with every faster axis whole, for one row
    /// of each slower axis.
    fn slab(&self, d: usize) -> u64 {
        self.extent[d + 1..]
            .iter()
            .fold(self.block(d).saturating_mul(self.itemsize), |acc, &e| {
                acc.saturating_mul(e)
            })
    }

    /// Picks the tiled axis and the tile size: the slowest axis whose slab fits a piece
    /// and whose outputs' working values fit [`Bounds::work`] (running sums of
    /// `held(d)` bytes per output of the tile, and when tiling the last axis `per_column`
    /// bytes of rows per output; before the last axis a whole output row of them).
    fn cut(&self, held: impl Fn(usize) -> u64, per_column: u64) -> Cut {
        let rank = self.rank();
        let last = rank - 1;
        let after = |d: usize| {
            self.out_shape[d + 1..]
                .iter()
                .fold(1u64, |acc, &o| acc.saturating_mul(o))
        };
        // Working bytes fixed by the tiled axis (rows of whole output rows) and per output.
        let fixed = |d: usize| {
            if d < last {
                self.out_shape[last].saturating_mul(per_column)
            } else {
                0
            }
        };
        let per_output = |d: usize| {
            let own = if d == last { per_column } else { 0 };
            after(d).saturating_mul(held(d).saturating_add(own))
        };
        let fits = |d: usize| {
            self.slab(d) <= self.bounds.tile
                && fixed(d).saturating_add(per_output(d)) <= self.bounds.work
        };
        let depth = (0..rank).find(|&d| fits(d)).unwrap_or(last);
        let slab = self.slab(depth);
        if slab > self.bounds.tile {
            return Cut {
                depth,
                per_tile: 1,
                segment: Some((self.bounds.tile / self.itemsize).max(1)),
            };
        }
        // The slow rows of a tile in one piece when they fit, else one slow row per piece.
        let slow_rows = (0..depth).fold(1u64, |acc, a| acc.saturating_mul(self.block(a)));
        let by_tile = match self.bounds.tile / slab.max(1) {
            n if n / slow_rows >= 1 => n / slow_rows,
            n => n,
        };
        let by_work = match per_output(depth) {
            0 => u64::MAX,
            per => self.bounds.work.saturating_sub(fixed(depth)) / per,
        };
        Cut {
            depth,
            per_tile: by_tile.min(by_work).clamp(1, self.out_shape[depth]),
            segment: None,
        }
    }

    /// The running sums the slow axes of a tile of `outputs` need: none for a factor 1, a
    /// pairwise stream per output for an innermost axis, a sum per output otherwise.
    fn levels<E: Elem>(&self, depth: usize, outputs: usize) -> Vec<Level<E::W>> {
        (0..depth)
            .map(|a| match (self.factors[a], self.innermost[a]) {
                (1, _) => Level::Pass,
                (_, true) => Level::Pairwise((0..outputs).map(|_| Pairwise::new()).collect()),
                (_, false) => Level::Sum(vec![E::W::ZERO; outputs]),
            })
            .collect()
    }

    /// Cuts the block into tiles (`cut`), reads each tile's source piece by piece and
    /// folds every slow row of it into `fold`.
    fn tiles(&self, cut: Cut, out: &mut [u8], fold: &mut impl Fold) -> Result<(), ReduceError> {
        let depth = cut.depth;
        let mut buf = Vec::new();
        let mut prefix = vec![0u64; depth];
        loop {
            let mut first = 0;
            while first < self.out_shape[depth] {
                let end = (first + cut.per_tile).min(self.out_shape[depth]);
                let tile = self.tile_box(&prefix, first..end);
                fold.begin(&tile);
                match cut.segment {
                    None => self.pieces(&tile, &mut buf, fold, out)?,
                    Some(segment) => self.segments(&tile, segment, &mut buf, fold, out)?,
                }
                fold.finish(&tile, out);
                first = end;
            }
            if !odometer(&mut prefix, &self.out_shape[..depth]) {
                return Ok(());
            }
        }
    }

    /// The tile of outputs `prefix` (one per slow axis), `run` along the tiled axis and
    /// every output after it, with the source it reduces.
    fn tile_box(&self, prefix: &[u64], run: Range<u64>) -> TileBox {
        let rank = self.rank();
        let depth = prefix.len();
        let mut lo = prefix.to_vec();
        lo.push(run.start);
        lo.resize(rank, 0);
        let mut hi: Vec<u64> = prefix.iter().map(|p| p + 1).collect();
        hi.push(run.end);
        hi.extend_from_slice(&self.out_shape[depth + 1..]);
        let slow_lo: Vec<u64> = (0..depth).map(|a| prefix[a] * self.factors[a]).collect();
        let slow_hi = (0..depth)
            .map(|a| (slow_lo[a] + self.factors[a]).min(self.extent[a]))
            .collect();
        let mut fast_lo = vec![0u64; rank - depth];
        let mut fast_hi = self.extent[depth..].to_vec();
        fast_lo[0] = run.start * self.factors[depth];
        fast_hi[0] = (run.end * self.factors[depth]).min(self.extent[depth]);
        TileBox {
            lo,
            hi,
            slow_lo,
            slow_hi,
            fast_lo,
            fast_hi,
        }
    }

    /// Reads a tile's source as runs of its slow rows in C order, each at most a tile of
    /// bytes, and folds every slow row.
    fn pieces(
        &self,
        tile: &TileBox,
        buf: &mut Vec<u8>,
        fold: &mut impl Fold,
        out: &mut [u8],
    ) -> Result<(), ReduceError> {
        let depth = tile.slow_lo.len();
        let fast_bytes = tile
            .fast_lo
            .iter()
            .zip(&tile.fast_hi)
            .fold(self.itemsize, |acc, (l, h)| acc.saturating_mul(h - l));
        let lens: Vec<u64> = (0..depth)
            .map(|a| tile.slow_hi[a] - tile.slow_lo[a])
            .collect();
        // The slowest axis whose later rows, whole, fit a piece; the rows of it per piece.
        let inner = |k: usize| {
            lens[k + 1..]
                .iter()
                .fold(fast_bytes, |acc, &l| acc.saturating_mul(l))
        };
        let split = (0..depth).find(|&k| inner(k) <= self.bounds.tile);
        let per_piece = split.map_or(1, |k| (self.bounds.tile / inner(k)).clamp(1, lens[k]));
        let split = split.unwrap_or(depth);
        let mut at = tile.slow_lo.clone();
        loop {
            self.check_stop()?;
            let mut stop: Vec<u64> = at.iter().map(|a| a + 1).collect();
            if split < depth {
                stop[split] = (at[split] + per_piece).min(tile.slow_hi[split]);
                stop[split + 1..].copy_from_slice(&tile.slow_hi[split + 1..]);
            }
            let start = [&at[..], &tile.fast_lo[..]].concat();
            let end = [&stop[..], &tile.fast_hi[..]].concat();
            self.read_box(&start, &end, buf)?;
            let piece = Tile::new(buf, &start, &end);
            let mut row = at.clone();
            loop {
                let offset = (0..depth)
                    .map(|a| (row[a] - at[a]) as usize * piece.strides[a])
                    .sum();
                fold.row(tile, &piece, &row, offset, out);
                if !odometer_in(&mut row, &at, &stop) {
                    break;
                }
            }
            // The next piece: on along the split axis, then on along the axes before it.
            let axes = split.min(depth.saturating_sub(1));
            if split < depth && stop[split] < tile.slow_hi[split] {
                at[split] = stop[split];
                continue;
            }
            if split < depth {
                at[split] = tile.slow_lo[split];
            }
            if depth == 0
                || !odometer_in(
                    &mut at[..axes],
                    &tile.slow_lo[..axes],
                    &tile.slow_hi[..axes],
                )
            {
                return Ok(());
            }
        }
    }

    /// Reads a one-output tile whose block along the last axis is over the tile: every
    /// slow row in C order, its block in segments of `segment` elements.
    fn segments(
        &self,
        tile: &TileBox,
        segment: u64,
        buf: &mut Vec<u8>,
        fold: &mut impl Fold,
        out: &mut [u8],
    ) -> Result<(), ReduceError> {
        let depth = tile.slow_lo.len();
        let mut row = tile.slow_lo.clone();
        loop {
            let mut first = tile.fast_lo[0];
            while first < tile.fast_hi[0] {
                self.check_stop()?;
                let stop = (first + segment).min(tile.fast_hi[0]);
                let start = [&row[..], &[first]].concat();
                let end: Vec<u64> = row.iter().map(|r| r + 1).chain([stop]).collect();
                self.read_box(&start, &end, buf)?;
                fold.row(tile, &Tile::new(buf, &start, &end), &row, 0, out);
                first = stop;
            }
            if depth == 0 || !odometer_in(&mut row, &tile.slow_lo, &tile.slow_hi) {
                return Ok(());
            }
        }
    }
}

/// The running sums of one slow axis across a tile's pieces.
enum Level<W> {
    /// Factor 1: a row's value passes through.
    Pass,
    /// Term by term from `+0`, one sum per output of the tile.
    Sum(Vec<W>),
    /// numpy's pairwise order (an innermost axis), one stream per output of the tile.
    Pairwise(Vec<Pairwise<W>>),
}

/// The staged means, a tile at a time.
struct Staged<'j, E: Elem> {
    job: &'j Job<'j>,
    /// The tiled axis.
    depth: usize,
    big_endian: bool,
    /// The running sums of the tile's slow axes, one per slow axis.
    levels: Vec<Level<E::W>>,
    rows: Rows<E>,
}

impl<E: Elem> Fold for Staged<'_, E> {
    fn begin(&mut self, tile: &TileBox) {
        self.levels = self.job.levels::<E>(self.depth, tile.outputs());
    }

    fn row(
        &mut self,
        tile: &TileBox,
        piece: &Tile<'_>,
        row: &[u64],
        offset: usize,
        out: &mut [u8],
    ) {
        let job = self.job;
        let rank = job.rank();
        let last = rank - 1;
        let depth = row.len();
        let width = tile.width();
        let columns = tile.lo[last]..tile.hi[last];
        if depth == last && piece.last_len < (tile.fast_hi[0] - tile.fast_lo[0]) as usize {
            // A segment of one output's block along the last axis.
            self.segment(tile, piece, row, out);
            return;
        }
        let out_strides = c_strides(&vec![0; rank], &job.out_shape);
        let mut index: Vec<u64> = tile.lo[..last].to_vec();
        let mut slot = 0;
        loop {
            job.stage::<E>(
                piece,
                &index,
                columns.clone(),
                depth,
                offset,
                self.big_endian,
                &mut self.rows,
            );
            let mut values = std::mem::take(&mut self.rows.row[depth]);
            if fold_levels(job, &mut self.levels, tile, row, slot, &mut values) {
                write_row::<E>(
                    &values,
                    &index,
                    &out_strides,
                    columns.start,
                    self.big_endian,
                    out,
                );
            }
            self.rows.row[depth] = values;
            slot += width;
            if !odometer_in(&mut index, &tile.lo[..last], &tile.hi[..last]) {
                return;
            }
        }
    }

    /// Every output was written when its last slow row was folded.
    fn finish(&mut self, _tile: &TileBox, _out: &mut [u8]) {}
}

impl<E: Elem> Staged<'_, E> {
    /// Adds one segment of the block along the last axis to the block's pairwise stream;
    /// at the block's end, its mean goes on to the slow axes.
    fn segment(&mut self, tile: &TileBox, piece: &Tile<'_>, row: &[u64], out: &mut [u8]) {
        let job = self.job;
        let last = job.rank() - 1;
        let item = job.itemsize as usize;
        let s = job.factors[last];
        let stream = &mut self.rows.run;
        if piece.start[last] == tile.fast_lo[0] {
            stream.start(s as usize);
        }
        let mut edge = E::W::ZERO;
        for bytes in piece.data.chunks_exact(item) {
            edge = E::load(bytes, self.big_endian);
            stream.push(edge);
        }
        let end = piece.start[last] + piece.last_len as u64;
        if end < tile.fast_hi[0] {
            return;
        }
        // Past the far edge the last element repeats.
        let real = tile.fast_hi[0] - tile.fast_lo[0];
        for _ in real..s {
            stream.push(edge);
        }
        let mean = if s == 1 {
            edge
        } else {
            E::W::divide(E::W::ZERO.add(stream.finish()), s)
        };
        let mut values = vec![mean];
        if fold_levels(job, &mut self.levels, tile, row, 0, &mut values) {
            let rank = job.rank();
            let out_strides = c_strides(&vec![0; rank], &job.out_shape);
            write_row::<E>(
                &values,
                &tile.lo[..last],
                &out_strides,
                tile.lo[last],
                self.big_endian,
                out,
            );
        }
    }
}

/// Folds the values of one output row (`values`, from output `slot` of the tile) of slow
/// row `row` into the slow axes' running sums, innermost first. True when `values` now
/// holds the finished means (the row completed every slow axis's block).
fn fold_levels<W: Work>(
    job: &Job<'_>,
    levels: &mut [Level<W>],
    tile: &TileBox,
    row: &[u64],
    slot: usize,
    values: &mut [W],
) -> bool {
    for a in (0..levels.len()).rev() {
        let f = job.factors[a];
        let real = tile.slow_hi[a] - tile.slow_lo[a];
        let last = row[a] + 1 == tile.slow_hi[a];
        // Past the far edge the last row repeats: its value is added again.
        let times = if last { 1 + f - real } else { 1 };
        match &mut levels[a] {
            Level::Pass => {}
            Level::Sum(sums) => {
                let sums = &mut sums[slot..slot + values.len()];
                for (sum, &v) in sums.iter_mut().zip(values.iter()) {
                    for _ in 0..times {
                        *sum = sum.add(v);
                    }
                }
                if !last {
                    return false;
                }
                for (sum, v) in sums.iter_mut().zip(values.iter_mut()) {
                    *v = W::divide(*sum, f);
                    *sum = W::ZERO;
                }
            }
            Level::Pairwise(streams) => {
                let streams = &mut streams[slot..slot + values.len()];
                for (stream, &v) in streams.iter_mut().zip(values.iter()) {
                    if row[a] == tile.slow_lo[a] {
                        stream.start(f as usize);
                    }
                    for _ in 0..times {
                        stream.push(v);
                    }
                }
                if !last {
                    return false;
                }
                for (stream, v) in streams.iter_mut().zip(values.iter_mut()) {
                    *v = W::divide(W::ZERO.add(stream.finish()), f);
                }
            }
        }
    }
    true
}

/// Stores one output row's means at output row `index`, from column `first`.
fn write_row<E: Elem>(
    values: &[E::W],
    index: &[u64],
    out_strides: &[usize],
    first: u64,
    big_endian: bool,
    out: &mut [u8],
) {
    let item = E::SIZE;
    let base = row_offset(index, out_strides, first);
    for (j, &value) in values.iter().enumerate() {
        let at = (base + j) * item;
        E::store(value, &mut out[at..at + item], big_endian);
    }
}

/// The exact block sums, a tile at a time.
struct Sums<'j, E: IntElem> {
    job: &'j Job<'j>,
    big_endian: bool,
    /// One per output of the tile.
    sums: Vec<i64>,
    element: std::marker::PhantomData<E>,
}

impl<E: IntElem> Fold for Sums<'_, E> {
    fn begin(&mut self, tile: &TileBox) {
        self.sums.clear();
        self.sums.resize(tile.outputs(), 0);
    }

    fn row(
        &mut self,
        tile: &TileBox,
        piece: &Tile<'_>,
        row: &[u64],
        offset: usize,
        _out: &mut [u8],
    ) {
        let job = self.job;
        let rank = job.rank();
        let last = rank - 1;
        let depth = row.len();
        let item = job.itemsize as usize;
        let s_last = job.factors[last];
        let e_last = job.extent[last];
        // The slow row counts once more for every repeat of it past the far edge.
        let weight: i64 = (0..depth)
            .map(|a| match row[a] + 1 == tile.slow_hi[a] {
                true => (1 + job.factors[a] - (tile.slow_hi[a] - tile.slow_lo[a])) as i64,
                false => 1,
            })
            .product();
        let width = tile.width();
        let columns = tile.lo[last]..tile.hi[last];
        // The part of the last axis this piece holds.
        let (held_lo, held_hi) = (piece.start[last], piece.start[last] + piece.last_len as u64);
        let mut index: Vec<u64> = tile.lo[..last].to_vec();
        let mut terms = vec![0u64; last - depth.min(last)];
        let mut slot = 0;
        loop {
            // Every source row of the output row's blocks on the fast axes (edge-replicated).
            terms.iter_mut().for_each(|t| *t = 0);
            loop {
                let at: usize = offset
                    + (depth..last)
                        .map(|a| {
                            let src = (index[a] * job.factors[a] + terms[a - depth])
                                .min(job.extent[a] - 1);
                            (src - piece.start[a]) as usize * piece.strides[a]
                        })
                        .sum::<usize>();
                let data = &piece.data[at * item..(at + piece.last_len) * item];
                for (sum, j) in self.sums[slot..slot + width]
                    .iter_mut()
                    .zip(columns.clone())
                {
                    let block_lo = j * s_last;
                    let real_hi = (block_lo + s_last).min(e_last);
                    let lo = block_lo.max(held_lo);
                    let hi = real_hi.min(held_hi);
                    let mut part: i64 = 0;
                    if lo < hi {
                        let run =
                            &data[(lo - held_lo) as usize * item..(hi - held_lo) as usize * item];
                        part = run
                            .chunks_exact(item)
                            .map(|b| E::load_i64(b, self.big_endian))
                            .sum::<i64>();
                    }
                    // Past the far edge the last element repeats.
                    if real_hi > held_lo && real_hi <= held_hi {
                        let e = (real_hi - 1 - held_lo) as usize * item;
                        part += E::load_i64(&data[e..e + item], self.big_endian)
                            * (s_last - (real_hi - block_lo)) as i64;
                    }
                    *sum += weight * part;
                }
                if !odometer(&mut terms, &job.factors[depth..last]) {
                    break;
                }
            }
            slot += width;
            if !odometer_in(&mut index, &tile.lo[..last], &tile.hi[..last]) {
                return;
            }
        }
    }

    fn finish(&mut self, tile: &TileBox, out: &mut [u8]) {
        let job = self.job;
        let rank = job.rank();
        let last = rank - 1;
        let item = job.itemsize as usize;
        let block: u64 = job.factors.iter().product();
        let out_strides = c_strides(&vec![0; rank], &job.out_shape);
        let width = tile.width();
        let mut index: Vec<u64> = tile.lo[..last].to_vec();
        let mut slot = 0;
        loop {
            let base = row_offset(&index, &out_strides, tile.lo[last]);
            for (j, &sum) in self.sums[slot..slot + width].iter().enumerate() {
                let at = (base + j) * item;
                E::store(
                    sum as f64 / block as f64,
                    &mut out[at..at + item],
                    self.big_endian,
                );
            }
            slot += width;
            if !odometer_in(&mut index, &tile.lo[..last], &tile.hi[..last]) {
                return;
            }
        }
    }
}

impl Job<'_> {
    /// The staged mean over axes `axis..` of the output row `index` (its last-axis outputs
    /// `columns`) into `rows.row[axis]`; `offset` is the element offset in the piece of the
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
            let block = &mut rows.run;
            for o in columns {
                let load = |t: u64| {
                    let at = (offset + source(o, t) * tile.strides[axis]) * item;
                    E::load(&tile.data[at..at + item], big_endian)
                };
                row.push(if s == 1 {
                    load(0)
                } else {
                    block.start(s as usize);
                    (0..s).for_each(|t| block.push(load(t)));
                    E::W::divide(E::W::ZERO.add(block.finish()), s)
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
            // numpy sums this block as one contiguous run: pairwise, one stream per column.
            let mut streams = std::mem::take(&mut rows.streams[axis]);
            streams.resize_with(width, Pairwise::new);
            streams.iter_mut().for_each(|p| p.start(s as usize));
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
                for (stream, &v) in streams.iter_mut().zip(&rows.row[axis + 1]) {
                    stream.push(v);
                }
            }
            for stream in streams.iter_mut().take(width) {
                acc.push(E::W::divide(E::W::ZERO.add(stream.finish()), s));
            }
            rows.streams[axis] = streams;
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

/// One piece of source in memory: its bytes in C order, its start (relative to the
/// block), its strides in elements and its extent along the last axis.
struct Tile<'a> {
    data: &'a [u8],
    start: &'a [u64],
    strides: Vec<usize>,
    /// The piece's extent along the last axis.
    last_len: usize,
}

impl<'a> Tile<'a> {
    /// The box `[start, stop)` read into `data`.
    fn new(data: &'a [u8], start: &'a [u64], stop: &[u64]) -> Self {
        let last = start.len() - 1;
        Tile {
            data,
            start,
            strides: c_strides(start, stop),
            last_len: (stop[last] - start[last]) as usize,
        }
    }
}

/// Reused rows of working values: one result row per axis, the pairwise streams of an
/// innermost axis per column, and the stream of a block along the last axis.
struct Rows<E: Elem> {
    row: Vec<Vec<E::W>>,
    streams: Vec<Vec<Pairwise<E::W>>>,
    run: Pairwise<E::W>,
}

impl<E: Elem> Rows<E> {
    fn new(rank: usize) -> Self {
        Self {
            row: vec![Vec::new(); rank],
            streams: (0..rank).map(|_| Vec::new()).collect(),
            run: Pairwise::new(),
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
    use crate::source::npy::{Limits, NpyFile};
    use tessera_test_support::data::{pattern, write_npy};

    /// Every scaled chunk of a few tensors, computed with tiny pieces and little room for
    /// working values (many reads, blocks split across pieces on the slow axes and along
    /// the last axis, partial sums carried between them) and with the default bounds, is
    /// the same bytes.
    #[test]
    fn pieces_compose_to_the_whole_reduction() {
        let dir = tempfile::tempdir().unwrap();
        let cases: [(&str, &[u64], &[u64]); 11] = [
            ("<u2", &[5, 37, 41], &[2, 3, 4]),
            ("<u2", &[5, 37, 41], &[1, 4, 8]),
            (">i4", &[50, 9], &[8, 2]),
            ("<f4", &[4, 6, 33, 20], &[1, 3, 8, 20]),
            (">i2", &[50, 9], &[7, 2]),
            ("<f2", &[3, 40, 17], &[3, 16, 1]),
            ("<c8", &[12, 18], &[5, 4]),
            ("<f4", &[300, 7], &[300, 7]),
            ("<f8", &[37, 5, 300], &[30, 1, 300]),
            ("|u1", &[40, 3, 50], &[32, 2, 1]),
            ("<f4", &[9, 260, 3], &[9, 200, 1]),
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
            let go = AtomicBool::new(false);
            for method in [Method::Nearest, Method::Area] {
                let scale = Scale::new(factors.to_vec(), method).unwrap();
                let region = Region::whole(shape);
                let out_len = (scale.reduced(shape).iter().product::<u64>() * itemsize) as usize;
                let mut whole = vec![0u8; out_len];
                reduce_chunk(&file, shape, &region, &scale, &mut whole, &go).unwrap();
                for (tile, work) in [(1, 1), (64, 64), (300, 1 << 20), (4096, 100), (1 << 20, 1)] {
                    let mut cut = vec![0u8; out_len];
                    let bounds = Bounds { tile, work };
                    reduce_within(&file, shape, &region, &scale, &mut cut, &go, bounds).unwrap();
                    assert_eq!(
                        cut, whole,
                        "{descr} {shape:?} {factors:?} {method} tile {tile} work {work}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_set_stop_flag_stops_the_computation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.npy");
        write_npy(&path, "|u1", &[64, 64], &pattern(64 * 64, 1));
        let file = NpyFile::open(&path, &Limits::default()).unwrap();
        let stop = AtomicBool::new(true);
        for method in [Method::Nearest, Method::Area] {
            let scale = Scale::new(vec![8, 8], method).unwrap();
            let mut out = vec![0u8; 64];
            let err = reduce_chunk(
                &file,
                &[64, 64],
                &Region::whole(&[64, 64]),
                &scale,
                &mut out,
                &stop,
            )
            .unwrap_err();
            assert!(matches!(err, ReduceError::Cancelled), "{err}");
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
        reduce_chunk(
            &file,
            &[6, 10],
            &region,
            &scale,
            &mut out,
            &AtomicBool::new(false),
        )
        .unwrap();
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
        reduce_chunk(
            &file,
            &[1, 5],
            &Region::whole(&[1, 5]),
            &scale,
            &mut out,
            &AtomicBool::new(false),
        )
        .unwrap();
        // (1+2)/2 = 1.5 -> 2, (3+4)/2 = 3.5 -> 4, (10+10)/2 = 10.
        assert_eq!(out, vec![2, 4, 10]);
    }
}
