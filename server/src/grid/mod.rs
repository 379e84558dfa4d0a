//! The chunk grid: how a tensor is cut into the chunks that travel on the wire
//! and live in the segment store.
//!
//! # Policy
//!
//! A grid is regular: one chunk extent per axis, anchored at the origin,
//! enumerated in C order, the last chunk along an axis clipped at the far edge.
//! [`ChunkGrid::plan`] chooses the chunk extent from the shape, the itemsize and
//! a target chunk size (default [`DEFAULT_TARGET_CHUNK_BYTES`], 8 MiB). The
//! target is clamped to at most [`MAX_CHUNK_BYTES`] (64 MiB; a chunk of exactly
//! 64 MiB is allowed) and at least one element. No chunk ever exceeds the cap.
//!
//! **Contiguity first.** For a C-order source every chunk has the form
//! `(1, …, 1, k, full, …, full)`: slow axes taken one index at a time, one axis
//! `i` partially taken, every faster axis whole. Such a chunk is one contiguous
//! byte range of the source, so it is served from the mapped file with a single
//! copy. Axis `i` is the slowest axis whose *step* (the bytes of one index along
//! it, `itemsize × prod(shape[i+1..])`) fits the target. Along it:
//!
//! * `per = target / step` (floor, ≥ 1) indices fit in one chunk;
//! * `n = ceil(shape[i] / per)` chunks are needed;
//! * `k = ceil(shape[i] / n)`: the extent is balanced over the `n` chunks,
//!   and `k ≤ per` keeps every chunk within the target. Every `k` between
//!   `ceil(shape[i] / n)` and `per` gives the same, smallest possible number
//!   of chunks; the smallest such `k` makes the clipped last chunk as long as
//!   a regular grid with that many chunks allows. On the examples of
//!   chunk-cache.md §1 the reference's 1-column and 4-element slivers become
//!   near-equal pieces.
//!
//! When the whole tensor fits the target it is one chunk. Consequences: slow
//! (non-spatial) axes are split first; the Y-X plane (the last two axes) stays
//! whole whenever one plane fits the target; a larger plane is split into bands
//! of whole rows, never into columns. Only when a single row (the last axis)
//! exceeds the target is the last axis itself split, which is still contiguous
//! because every slower axis has extent 1. Axis labels do not change the policy:
//! contiguity decides (see [`default_dim_labels`] for the labels we report).
//!
//! **Fortran order** mirrors the rule: the fastest axis is axis 0, so a chunk is
//! `(full, …, full, k, 1, …, 1)` and again one contiguous byte range of the
//! file. Clients still receive every chunk in C order (the decoder transposes).
//!
//! **Tiles for the socket.** [`ChunkGrid::socket`] cuts the grid socket readers are planned
//! on (the fine grid, docs/decisions/0015) by the same rule, with one exception: a plane
//! (the two fastest axes) larger than the target and longer than a tile on both axes is cut
//! into square tiles of [`SOCKET_TILE_EDGE`] elements, anchored at the origin, instead of
//! full-width bands. A viewer's window of a large plane then costs about the window over the socket, not
//! a band as wide as the plane (docs/decisions/0003, amended by issue 33). Such a tile is
//! `edge` runs of the source, gathered once when it is decoded; the coarse grid local clients
//! map keeps contiguity.
//!
//! **Empty tensors** (some axis of length 0) have exactly one chunk, whose
//! extent is the whole shape (zero included), bounds `[0, shape)`.
//!
//! # Requests
//!
//! [`ChunkGrid::snap`] widens a requested region outward to the grid: start
//! floored to a multiple of the chunk extent, stop ceiled and clamped to the
//! shape. [`ChunkGrid::cells`] lists the grid cells of that realized region.
//! [`ChunkGrid::is_cell`] checks that a decoded chunk id names exactly one cell.
//!
//! # Beside the grid
//!
//! [`chunk_id`] names one cell's bytes forever; [`route`] picks which of a tensor's two grids
//! a plan is cut on; [`scaled`] validates downsampled reads and plans the pyramid (their
//! cells are reduced in `chunks::reduce`).

mod cells;
pub mod chunk_id;
mod labels;
mod region;
pub mod route;
pub mod scaled;

pub use cells::Cells;
pub use labels::{AxisRole, default_dim_labels, normalize_label};
pub use region::{Region, element_range};

/// The hard cap on the bytes of one chunk: 64 MiB. Exactly 64 MiB is allowed.
pub const MAX_CHUNK_BYTES: u64 = 67_108_864;

/// The default target chunk size: 8 MiB.
pub const DEFAULT_TARGET_CHUNK_BYTES: u64 = 8 << 20;

/// Default target of the grid a local client maps: the cap, so a read is a few mappings
/// and a few dask tasks instead of one per 8 MiB (docs/decisions/0015). While loopback plans
/// are learned, at most [`route::LEARN_CELL_CAP`] of it is used (docs/decisions/0041).
pub const DEFAULT_MAPPED_CHUNK_BYTES: u64 = MAX_CHUNK_BYTES;

/// A plane (the two fastest axes) at least this large is not merged with its neighbours
/// along slower axes on the coarse grid: a viewer reading one plane at a time would decode
/// every plane of the cell on each jump (docs/decisions/0015, amended by issue 37).
pub const LARGE_PLANE_BYTES: u64 = 4 << 20;

/// The target of a tensor's coarse (mapped) grid: `mapped_target`, except that a tensor of
/// three or more axes whose plane (its two fastest axes: the last two in C order, the first
/// two in Fortran order) holds at least [`LARGE_PLANE_BYTES`] gets cells no larger than
/// one plane or the fine grid's `fine_target`, whichever is larger. Such a cell spans one
/// index of the slow axes (or as many as the fine grid's), so a plane-wise reader decodes
/// about one plane per plane it asks for; a plane larger than that stays cut into bands as
/// large as `mapped_target` allows. Tensors of one or two axes, and stacks of smaller
/// planes, are planned on `mapped_target` unchanged.
pub fn mapped_target(
    shape: &[u64],
    itemsize: u64,
    fortran_order: bool,
    fine_target: u64,
    mapped_target: u64,
) -> u64 {
    if shape.len() < 3 {
        return mapped_target;
    }
    let plane = if fortran_order {
        &shape[..2]
    } else {
        &shape[shape.len() - 2..]
    };
    let plane_bytes = plane.iter().fold(itemsize, |acc, d| acc.saturating_mul(*d));
    if plane_bytes < LARGE_PLANE_BYTES {
        return mapped_target;
    }
    mapped_target.min(plane_bytes.max(fine_target))
}

/// The edge, in elements, of the square tiles [`ChunkGrid::socket`] cuts a large plane into:
/// a power of two, so a viewer's 256- or 512-aligned window lies in one tile. Halved while
/// one tile exceeds the target, down to [`MIN_TILE_EDGE`].
pub const SOCKET_TILE_EDGE: u64 = 1024;

/// The smallest tile edge: a target too small for a tile this large keeps full-width bands.
const MIN_TILE_EDGE: u64 = 256;

/// The largest number of axes a grid (and a chunk id) supports.
pub const MAX_RANK: usize = 32;

/// Why a grid could not be built or a region was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GridError {
    /// The tensor has no axes.
    #[error("a tensor with 0 axes (a scalar) is not supported: at least 1 axis is needed")]
    RankZero,
    /// The tensor has more axes than [`MAX_RANK`].
    #[error("a tensor with {rank} axes is not supported: at most {MAX_RANK} axes")]
    RankTooLarge {
        /// The tensor's rank.
        rank: usize,
    },
    /// The itemsize is zero.
    #[error("itemsize 0 is not valid: an element needs at least 1 byte")]
    ItemsizeZero,
    /// One element is bigger than a chunk may be.
    #[error("itemsize {itemsize} exceeds the chunk cap of {MAX_CHUNK_BYTES} bytes (64 MiB)")]
    ItemsizeOverCap {
        /// The itemsize in bytes.
        itemsize: u64,
    },
    /// The tensor's byte size does not fit in 64 bits.
    #[error("a tensor of shape {shape:?} with itemsize {itemsize} is larger than 2^64 bytes")]
    TooLarge {
        /// The tensor's shape.
        shape: Vec<u64>,
        /// The itemsize in bytes.
        itemsize: u64,
    },
    /// An explicit chunk shape has the wrong number of axes.
    #[error("chunk shape {chunk:?} has {} axes but the tensor has {rank}", chunk.len())]
    ChunkRank {
        /// The chunk shape given.
        chunk: Vec<u64>,
        /// The tensor's rank.
        rank: usize,
    },
    /// An explicit chunk shape has a zero extent.
    #[error("chunk shape {chunk:?} has extent 0 on axis {axis}: every extent must be at least 1")]
    ChunkZero {
        /// The chunk shape given.
        chunk: Vec<u64>,
        /// The offending axis.
        axis: usize,
    },
    /// An explicit chunk shape is over the cap.
    #[error(
        "chunk shape {chunk:?} is {bytes} bytes, over the chunk cap of {MAX_CHUNK_BYTES} bytes (64 MiB)"
    )]
    ChunkOverCap {
        /// The chunk shape (clamped to the tensor's shape).
        chunk: Vec<u64>,
        /// Its size in bytes (saturated at `u64::MAX`).
        bytes: u64,
    },
    /// A region's rank does not match the tensor's.
    #[error("region {region:?} has {} axes but the tensor has {rank}", region.start.len().max(region.stop.len()))]
    RegionRank {
        /// The region given.
        region: Region,
        /// The tensor's rank.
        rank: usize,
    },
    /// A region has start after stop on an axis.
    #[error("region start {start} > stop {stop} on axis {axis}")]
    RegionReversed {
        /// The offending axis.
        axis: usize,
        /// The start on that axis.
        start: u64,
        /// The stop on that axis.
        stop: u64,
    },
    /// A region reaches past the tensor's end on an axis.
    #[error("region stop {stop} exceeds the length {dim} of axis {axis}")]
    RegionOutOfBounds {
        /// The offending axis.
        axis: usize,
        /// The stop on that axis.
        stop: u64,
        /// The axis length.
        dim: u64,
    },
    /// A region selects nothing on an axis that is not itself empty.
    #[error(
        "region selects no element on axis {axis} (start == stop == {at}); zero-extent \
         slices are refused unless the axis itself has length 0"
    )]
    RegionEmpty {
        /// The offending axis.
        axis: usize,
        /// The start (= stop) on that axis.
        at: u64,
    },
}

/// A regular chunk grid over a tensor: its shape and one chunk extent per axis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkGrid {
    shape: Vec<u64>,
    chunk: Vec<u64>,
}

impl ChunkGrid {
    /// Plans the grid of a tensor by the policy in the module docs.
    ///
    /// `target_bytes` is clamped to `[itemsize, MAX_CHUNK_BYTES]`. Fails for
    /// rank 0 or above [`MAX_RANK`], itemsize 0 or above the cap, and tensors
    /// whose byte size overflows `u64`.
    pub fn plan(
        shape: &[u64],
        itemsize: u64,
        fortran_order: bool,
        target_bytes: u64,
    ) -> Result<ChunkGrid, GridError> {
        check_tensor(shape, itemsize)?;
        if shape.contains(&0) {
            return Ok(ChunkGrid::empty(shape));
        }
        let target = target_bytes.clamp(itemsize, MAX_CHUNK_BYTES);
        let chunk = if fortran_order {
            let reversed: Vec<u64> = shape.iter().rev().copied().collect();
            let mut chunk = contiguous_chunk(&reversed, itemsize, target);
            chunk.reverse();
            chunk
        } else {
            contiguous_chunk(shape, itemsize, target)
        };
        Ok(ChunkGrid {
            shape: shape.to_vec(),
            chunk,
        })
    }

    /// Plans the grid reads that travel the socket are cut on: [`ChunkGrid::plan`]'s (with
    /// `native` chunks, [`ChunkGrid::fitted`]'s), except that a plane (the last two axes;
    /// the first two in Fortran order) larger than the target and longer than a tile on
    /// both axes is cut into square tiles of [`SOCKET_TILE_EDGE`] elements (see the module
    /// docs). With native chunks a cell keeps whole native chunks: its plane extents are the
    /// largest multiple of the native extent within the tile edge (at least one native
    /// chunk), unless such a cell would pass the target (native chunks of many planes keep
    /// the fitted cut). Fails like [`ChunkGrid::plan`].
    pub fn socket(
        shape: &[u64],
        itemsize: u64,
        fortran_order: bool,
        native: Option<&[u64]>,
        target_bytes: u64,
    ) -> Result<ChunkGrid, GridError> {
        let grid = match native {
            Some(native) => ChunkGrid::fitted(shape, itemsize, native, target_bytes)?,
            None => ChunkGrid::plan(shape, itemsize, fortran_order, target_bytes)?,
        };
        let target = target_bytes.clamp(itemsize, MAX_CHUNK_BYTES);
        let Some(tile) = tile_chunk(shape, itemsize, fortran_order, target) else {
            return Ok(grid);
        };
        let chunk = match native {
            Some(native) if native.len() == shape.len() && !native.contains(&0) => {
                let cell: Vec<u64> = grid
                    .chunk
                    .iter()
                    .zip(native.iter().zip(shape))
                    .zip(&tile)
                    .map(|((cell, (native, dim)), tile)| {
                        let native = (*native).min(*dim);
                        match *tile {
                            1 => *cell,
                            edge => ((edge / native).max(1) * native).min(*dim),
                        }
                    })
                    .collect();
                let bytes = cell.iter().fold(itemsize, |acc, c| acc.saturating_mul(*c));
                // Deep native chunks (many planes each) keep the fitted cut.
                if bytes > target.max(grid.chunk_bytes(itemsize)) {
                    return Ok(grid);
                }
                cell
            }
            _ => tile,
        };
        Ok(ChunkGrid {
            shape: shape.to_vec(),
            chunk,
        })
    }

    /// Plans the grid of a tensor stored in native chunks of `native` elements per axis (a
    /// Zarr store's chunks or shards): every cell is a whole number of native chunks, so no
    /// native chunk is decoded twice for one cell, chosen by the contiguity-first policy over
    /// the grid of native chunks. A native chunk over the target (but within the cap) is one
    /// cell; one over the cap is cut by [`ChunkGrid::plan`]'s policy within it (each such
    /// native chunk is then decoded once per cell it spans: the cap leaves no other way).
    /// A `native` of the wrong rank or with a zero extent is ignored (the plain policy).
    pub fn fitted(
        shape: &[u64],
        itemsize: u64,
        native: &[u64],
        target_bytes: u64,
    ) -> Result<ChunkGrid, GridError> {
        check_tensor(shape, itemsize)?;
        if shape.contains(&0) || native.len() != shape.len() || native.contains(&0) {
            return ChunkGrid::plan(shape, itemsize, false, target_bytes);
        }
        let native: Vec<u64> = native.iter().zip(shape).map(|(n, d)| *n.min(d)).collect();
        let native_bytes = native
            .iter()
            .fold(itemsize, |acc, n| acc.saturating_mul(*n));
        let target = target_bytes.clamp(itemsize, MAX_CHUNK_BYTES);
        let chunk = if native_bytes > MAX_CHUNK_BYTES {
            contiguous_chunk(&native, itemsize, target)
        } else if native_bytes >= target {
            native
        } else {
            let blocks: Vec<u64> = shape
                .iter()
                .zip(&native)
                .map(|(d, n)| d.div_ceil(*n))
                .collect();
            contiguous_chunk(&blocks, native_bytes, target)
                .iter()
                .zip(&native)
                .zip(shape)
                .map(|((b, n), d)| b.saturating_mul(*n).min(*d))
                .collect()
        };
        Ok(ChunkGrid {
            shape: shape.to_vec(),
            chunk,
        })
    }

    /// A grid with an explicit chunk extent per axis (each at least 1; extents
    /// beyond the axis length are clamped to it). Fails like [`ChunkGrid::plan`]
    /// and when the chunk's rank differs or it exceeds [`MAX_CHUNK_BYTES`].
    /// An empty tensor still gets its single whole-tensor chunk.
    pub fn with_chunk_shape(
        shape: &[u64],
        itemsize: u64,
        chunk: &[u64],
    ) -> Result<ChunkGrid, GridError> {
        check_tensor(shape, itemsize)?;
        if chunk.len() != shape.len() {
            return Err(GridError::ChunkRank {
                chunk: chunk.to_vec(),
                rank: shape.len(),
            });
        }
        if let Some(axis) = chunk.iter().position(|&c| c == 0) {
            return Err(GridError::ChunkZero {
                chunk: chunk.to_vec(),
                axis,
            });
        }
        if shape.contains(&0) {
            return Ok(ChunkGrid::empty(shape));
        }
        let clamped: Vec<u64> = chunk.iter().zip(shape).map(|(c, d)| *c.min(d)).collect();
        let bytes = clamped
            .iter()
            .fold(itemsize, |acc, c| acc.saturating_mul(*c));
        if bytes > MAX_CHUNK_BYTES {
            return Err(GridError::ChunkOverCap {
                chunk: clamped,
                bytes,
            });
        }
        Ok(ChunkGrid {
            shape: shape.to_vec(),
            chunk: clamped,
        })
    }

    /// The read grid of a scaled read: each chunk extent multiplied by the axis's scale
    /// factor and clamped to the axis length, so every cell reduces to at most one chunk
    /// of this grid and starts at a multiple of its scale (only the last cell of an axis,
    /// clipped at the far edge, may end off a multiple). Its cells may exceed
    /// [`MAX_CHUNK_BYTES`]: they are read tile by tile, never whole. `scale` has the
    /// tensor's rank and every factor is at least 1.
    pub fn scaled(&self, scale: &[u64]) -> ChunkGrid {
        let chunk = self
            .chunk
            .iter()
            .zip(scale)
            .zip(&self.shape)
            .map(|((&c, &s), &dim)| c.saturating_mul(s.max(1)).min(dim))
            .collect();
        ChunkGrid {
            shape: self.shape.clone(),
            chunk,
        }
    }

    /// The single-chunk grid of an empty tensor.
    fn empty(shape: &[u64]) -> ChunkGrid {
        ChunkGrid {
            shape: shape.to_vec(),
            chunk: shape.to_vec(),
        }
    }

    /// The tensor's shape.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// The chunk extent per axis (the shape of every chunk not clipped at the
    /// far edge).
    pub fn chunk_shape(&self) -> &[u64] {
        &self.chunk
    }

    /// The bytes of one full (unclipped) chunk for this itemsize.
    pub fn chunk_bytes(&self, itemsize: u64) -> u64 {
        self.chunk
            .iter()
            .fold(itemsize, |acc, c| acc.saturating_mul(*c))
    }

    /// The number of chunks along each axis (1 on a zero-length axis).
    pub fn grid_dims(&self) -> Vec<u64> {
        self.shape
            .iter()
            .zip(&self.chunk)
            .map(|(&d, &c)| if d == 0 { 1 } else { d.div_ceil(c) })
            .collect()
    }

    /// The total number of chunks.
    pub fn num_chunks(&self) -> u64 {
        self.grid_dims()
            .iter()
            .fold(1u64, |acc, n| acc.saturating_mul(*n))
    }

    /// The realized region of a request: `start` floored to the grid, `stop`
    /// ceiled to the grid and clamped to the shape.
    ///
    /// The request must have the tensor's rank and `start <= stop <= shape`
    /// on every axis, and select at least one index on every axis whose
    /// length is not 0.
    pub fn snap(&self, region: &Region) -> Result<Region, GridError> {
        self.check_region(region)?;
        let mut start = Vec::with_capacity(self.shape.len());
        let mut stop = Vec::with_capacity(self.shape.len());
        for a in 0..self.shape.len() {
            let (dim, c) = (self.shape[a], self.chunk[a]);
            if dim == 0 {
                start.push(0);
                stop.push(0);
                continue;
            }
            start.push(region.start[a] / c * c);
            stop.push(region.stop[a].div_ceil(c).saturating_mul(c).min(dim));
        }
        Ok(Region { start, stop })
    }

    /// The grid cells covering `region` (equivalently, tiling its snapped
    /// region), in C order, with absolute bounds clipped to the shape.
    /// The region is validated as in [`ChunkGrid::snap`].
    pub fn cells(&self, region: &Region) -> Result<Cells<'_>, GridError> {
        self.check_region(region)?;
        let mut lo = Vec::with_capacity(self.shape.len());
        let mut hi = Vec::with_capacity(self.shape.len());
        for a in 0..self.shape.len() {
            if self.shape[a] == 0 {
                lo.push(0);
                hi.push(1);
            } else {
                let c = self.chunk[a];
                lo.push(region.start[a] / c);
                hi.push(region.stop[a].div_ceil(c));
            }
        }
        Ok(Cells::new(&self.shape, &self.chunk, lo, hi))
    }

    /// True when `cell` is exactly one grid cell: same rank, start on the grid
    /// inside the tensor, stop = `min(start + chunk, shape)` on every axis.
    pub fn is_cell(&self, cell: &Region) -> bool {
        let rank = self.shape.len();
        if cell.start.len() != rank || cell.stop.len() != rank {
            return false;
        }
        (0..rank).all(|a| {
            let (dim, c) = (self.shape[a], self.chunk[a]);
            let (s, e) = (cell.start[a], cell.stop[a]);
            if dim == 0 {
                s == 0 && e == 0
            } else {
                s < dim && s.is_multiple_of(c) && e == s.saturating_add(c).min(dim)
            }
        })
    }

    /// The position of a grid cell in the C order of all cells (`None` when `cell`
    /// is not a cell of this grid). The inverse of [`ChunkGrid::cell_at`].
    pub fn cell_index(&self, cell: &Region) -> Option<u64> {
        if !self.is_cell(cell) {
            return None;
        }
        let mut index = 0u64;
        for (((&dim, &chunk), &start), cells) in self
            .shape
            .iter()
            .zip(&self.chunk)
            .zip(&cell.start)
            .zip(self.grid_dims())
        {
            let i = if dim == 0 { 0 } else { start / chunk };
            index = index.checked_mul(cells)?.checked_add(i)?;
        }
        Some(index)
    }

    /// The grid cell at position `index` of the C order of all cells, with
    /// bounds clipped to the shape (`None` past the last cell).
    pub fn cell_at(&self, index: u64) -> Option<Region> {
        if index >= self.num_chunks() {
            return None;
        }
        let dims = self.grid_dims();
        let mut coords = vec![0; dims.len()];
        let mut rest = index;
        for (coord, &n) in coords.iter_mut().zip(&dims).rev() {
            *coord = rest % n;
            rest /= n;
        }
        Some(cells::cell_bounds(&self.shape, &self.chunk, &coords))
    }

    /// Validates a request region against the tensor.
    fn check_region(&self, region: &Region) -> Result<(), GridError> {
        let rank = self.shape.len();
        if region.start.len() != rank || region.stop.len() != rank {
            return Err(GridError::RegionRank {
                region: region.clone(),
                rank,
            });
        }
        for (axis, &dim) in self.shape.iter().enumerate() {
            let (start, stop) = (region.start[axis], region.stop[axis]);
            if start > stop {
                return Err(GridError::RegionReversed { axis, start, stop });
            }
            if stop > dim {
                return Err(GridError::RegionOutOfBounds { axis, stop, dim });
            }
            if start == stop && dim != 0 {
                return Err(GridError::RegionEmpty { axis, at: start });
            }
        }
        Ok(())
    }
}

/// Checks rank, itemsize and total byte size of a tensor.
fn check_tensor(shape: &[u64], itemsize: u64) -> Result<(), GridError> {
    if shape.is_empty() {
        return Err(GridError::RankZero);
    }
    if shape.len() > MAX_RANK {
        return Err(GridError::RankTooLarge { rank: shape.len() });
    }
    if itemsize == 0 {
        return Err(GridError::ItemsizeZero);
    }
    if itemsize > MAX_CHUNK_BYTES {
        return Err(GridError::ItemsizeOverCap { itemsize });
    }
    if !shape.contains(&0)
        && shape
            .iter()
            .try_fold(itemsize, |acc, d| acc.checked_mul(*d))
            .is_none()
    {
        return Err(GridError::TooLarge {
            shape: shape.to_vec(),
            itemsize,
        });
    }
    Ok(())
}

/// The tile of a valid, non-empty tensor whose plane exceeds `target` (already clamped) and
/// is longer than one tile on both axes; `None` when its plane keeps the contiguity-first
/// cut.
fn tile_chunk(shape: &[u64], itemsize: u64, fortran_order: bool, target: u64) -> Option<Vec<u64>> {
    let rank = shape.len();
    if rank < 2 || shape.contains(&0) {
        return None;
    }
    // (rows, columns): the columns axis is the fastest.
    let (rows, columns) = if fortran_order {
        (1, 0)
    } else {
        (rank - 2, rank - 1)
    };
    let plane = shape[rows]
        .saturating_mul(shape[columns])
        .saturating_mul(itemsize);
    let tile_bytes = |edge: u64| edge.saturating_mul(edge).saturating_mul(itemsize);
    let mut edge = SOCKET_TILE_EDGE;
    while edge > MIN_TILE_EDGE && tile_bytes(edge) > target {
        edge /= 2;
    }
    if plane <= target || tile_bytes(edge) > target || shape[rows].min(shape[columns]) <= edge {
        return None;
    }
    let mut chunk = vec![1; rank];
    chunk[rows] = edge;
    chunk[columns] = edge;
    Some(chunk)
}

/// The C-order contiguous chunk of a non-empty tensor for a target already
/// clamped to `[itemsize, MAX_CHUNK_BYTES]` (see the module docs).
fn contiguous_chunk(shape: &[u64], itemsize: u64, target: u64) -> Vec<u64> {
    let last = shape.len() - 1;
    // Walk from the fastest axis to the slowest while one index step fits.
    let (mut axis, mut axis_step) = (last, itemsize);
    let mut step = itemsize;
    for a in (0..shape.len()).rev() {
        if step > target {
            break;
        }
        axis = a;
        axis_step = step;
        step = step.saturating_mul(shape[a]);
    }
    let per = target / axis_step;
    let pieces = shape[axis].div_ceil(per);
    let k = shape[axis].div_ceil(pieces);
    let mut chunk = vec![1; shape.len()];
    chunk[axis] = k;
    chunk[axis + 1..].copy_from_slice(&shape[axis + 1..]);
    chunk
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn coarse_cells_keep_large_planes_apart() {
        let coarse = |shape: &[u64], itemsize, fortran| {
            let target = mapped_target(shape, itemsize, fortran, 8 << 20, 64 << 20);
            ChunkGrid::plan(shape, itemsize, fortran, target)
                .unwrap()
                .chunk_shape()
                .to_vec()
        };
        // napari's volume: 8 MiB planes were merged 8 at a time; now one plane a cell.
        assert_eq!(coarse(&[40, 2048, 2048], 2, false), [1, 2048, 2048]);
        assert_eq!(coarse(&[8, 4, 2048, 2048], 2, false), [1, 1, 2048, 2048]);
        // At the threshold (4 MiB planes) cells are the fine grid's: two planes of 8 MiB.
        assert_eq!(coarse(&[40, 1024, 2048], 2, false), [2, 1024, 2048]);
        // Smaller planes still merge up to the coarse target.
        assert_eq!(coarse(&[256, 1024, 1024], 2, false), [32, 1024, 1024]);
        // A plane over the coarse target is still cut in bands as large as it allows.
        assert_eq!(coarse(&[4, 8192, 8192], 2, false), [1, 4096, 8192]);
        // Fortran order: the plane is the first two axes.
        assert_eq!(coarse(&[2048, 2048, 40], 2, true), [2048, 2048, 1]);
        // One or two axes: unchanged.
        assert_eq!(coarse(&[4096, 4096], 4, false), [4096, 4096]);
    }

    #[test]
    fn socket_cells_of_large_planes_are_tiles() {
        let socket = |shape: &[u64], itemsize, fortran, target| {
            ChunkGrid::socket(shape, itemsize, fortran, None, target)
                .unwrap()
                .chunk_shape()
                .to_vec()
        };
        // A 16000² u16 plane: 1024² tiles (2 MiB) instead of [259, 16000] bands.
        assert_eq!(socket(&[16000, 16000], 2, false, 8 << 20), [1024, 1024]);
        assert_eq!(
            socket(&[3, 16000, 16000], 2, false, 8 << 20),
            [1, 1024, 1024]
        );
        // Tiles shrink to fit the target: c16 elements make 512² tiles of 4 MiB.
        assert_eq!(socket(&[8192, 8192], 16, false, 8 << 20), [512, 512]);
        // Planes within the target, narrow planes, one axis and tiny targets: the plain cut.
        let plain = |shape: &[u64], itemsize, target| {
            let want = ChunkGrid::plan(shape, itemsize, false, target).unwrap();
            assert_eq!(socket(shape, itemsize, false, target), want.chunk_shape());
        };
        plain(&[8, 2048, 2048], 2, 8 << 20);
        plain(&[1 << 20, 1000], 4, 8 << 20);
        plain(&[4096, 4096], 1, 4096);
        plain(&[64, 1 << 20], 1, 8 << 20);
        plain(&[100_000_000], 8, 8 << 20);
        // Fortran order: the plane is the first two axes, the first one fastest.
        assert_eq!(
            socket(&[16000, 16000, 3], 2, true, 8 << 20),
            [1024, 1024, 1]
        );
        // Every tile is within the target; the last ones clip at the shape.
        let g = ChunkGrid::socket(&[5000, 3000], 2, false, None, 8 << 20).unwrap();
        assert!(g.chunk_bytes(2) <= 8 << 20);
        assert_eq!(g.grid_dims(), [5, 3]);
    }

    #[test]
    fn socket_cells_of_natively_tiled_planes_are_whole_tiles_within_the_edge() {
        let socket = |shape: &[u64], native: &[u64]| {
            ChunkGrid::socket(shape, 2, false, Some(native), 8 << 20)
                .unwrap()
                .chunk_shape()
                .to_vec()
        };
        // A TIFF's 512² tiles: fitted bands of 16 tiles become cells of 2 × 2 tiles.
        assert_eq!(socket(&[8, 8192, 8192], &[1, 512, 512]), [1, 1024, 1024]);
        // Tiles that do not divide the edge: as many whole ones as fit (3 × 300 = 900).
        assert_eq!(socket(&[8192, 8192], &[300, 300]), [900, 900]);
        // Native chunks larger than the edge stay whole; small planes keep the fitted cut.
        assert_eq!(socket(&[4, 8192, 8192], &[1, 2048, 2048]), [1, 2048, 2048]);
        let fitted = ChunkGrid::fitted(&[100, 1000, 1000], 2, &[1, 100, 100], 8 << 20).unwrap();
        assert_eq!(
            socket(&[100, 1000, 1000], &[1, 100, 100]),
            fitted.chunk_shape()
        );
    }

    #[test]
    fn fitted_cells_are_whole_native_chunks_within_the_cap() {
        // 2 B elements, native chunks of 64x256x256 (8 MiB): one per cell at an 8 MiB target.
        let g = ChunkGrid::fitted(&[300, 1024, 1024], 2, &[64, 256, 256], 8 << 20).unwrap();
        assert_eq!(g.chunk_shape(), &[64, 256, 256]);
        // Small native chunks merge: whole rows of them first, then planes.
        let g = ChunkGrid::fitted(&[100, 1000, 1000], 2, &[1, 100, 100], 8 << 20).unwrap();
        assert_eq!(g.chunk_shape(), &[4, 1000, 1000]);
        for (axis, extent) in g.chunk_shape().iter().enumerate() {
            assert!(extent % [1, 100, 100][axis] == 0 || *extent == g.shape()[axis]);
        }
        // A native chunk over the cap is cut contiguously within itself.
        let g = ChunkGrid::fitted(&[4, 8192, 8192], 2, &[4, 8192, 8192], 64 << 20).unwrap();
        assert!(g.chunk_bytes(2) <= MAX_CHUNK_BYTES);
        assert_eq!(g.chunk_shape(), &[1, 4096, 8192]);
        // Edge chunks clip at the shape.
        let g = ChunkGrid::fitted(&[10, 10], 1, &[4, 4], 1 << 20).unwrap();
        assert_eq!(g.chunk_shape(), &[10, 10]);
    }
}
