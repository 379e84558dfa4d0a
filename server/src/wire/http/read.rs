//! A region of a tensor for the HTTP API, read through the request path the Flight service
//! uses: the tensor resolved by [`ReadPath::tensor`](crate::read_path::ReadPath), a scale
//! checked by the plan's own rules ([`plan::requested_scale`], [`plan::native_level`]), and
//! the cells of the socket grid named by the same chunk ids a Flight plan hands out, so
//! their bytes come from the one chunk cache (decoded once, whoever asked first). The
//! chunks' bytes are cut into one C-order buffer here instead of being sent as Flight
//! messages; nothing travels over gRPC.

use std::sync::Arc;

use futures::StreamExt;
use tessera_proto::pb::{SliceHint, TensorReadOption};
use tessera_segments::ipc::DATA_BODY_OFFSET;

use super::HttpError;
use crate::error::{Fault, RequestError, ServiceError};
use crate::grid::Region;
use crate::grid::chunk_id::ChunkId;
use crate::source::registry::Tensor;
use crate::state::ServiceState;
use crate::wire::flight::plan;

/// Most bytes one HTTP read answers (a tile is far less; a slice beyond it is refused
/// before anything is allocated).
pub const MAX_READ_BYTES: u64 = 256 << 20;

/// Chunks fetched at once for one read.
const CHUNKS_AT_ONCE: usize = 8;

/// What to read: a box of the tensor in full-resolution coordinates, at a scale.
#[derive(Clone, Debug)]
pub struct Ask {
    /// The box's first element per axis.
    pub start: Vec<u64>,
    /// One past its last element per axis.
    pub stop: Vec<u64>,
    /// The factor per axis (empty or all ones: full resolution).
    pub scale_hint: Vec<i64>,
    /// `nearest`, `area` or `precompute` (empty: the server's default).
    pub method: String,
}

/// A read's answer: C-order bytes of `shape`, in the tensor's dtype made little-endian.
#[derive(Debug)]
pub struct Answer {
    /// The bytes.
    pub bytes: Vec<u8>,
    /// Their shape.
    pub shape: Vec<u64>,
}

/// Reads `ask` of `tensor` (already resolved through the request path).
pub async fn read(
    state: &ServiceState,
    tensor: Arc<Tensor>,
    ask: &Ask,
) -> Result<Answer, HttpError> {
    let read_path = state.read_path();
    let request = TensorReadOption {
        array_id: tensor.array_id.clone(),
        slice_hint: Some(SliceHint {
            start: ask.start.iter().map(|&v| v as i64).collect(),
            stop: ask.stop.iter().map(|&v| v as i64).collect(),
        }),
        scale_hint: ask.scale_hint.clone(),
        reduction_method: ask.method.clone(),
        ..Default::default()
    };
    check_box(&tensor, &ask.start, &ask.stop)?;
    let (tensor, request) = match plan::native_level(&tensor, &request)? {
        Some((Some(level), level_request)) => (read_path.tensor(&level)?, level_request),
        Some((None, level_request)) => (tensor, level_request),
        None => (tensor, request),
    };
    let scale = plan::requested_scale(&tensor, &request)?;
    let (start, stop) = match &request.slice_hint {
        Some(slice) => (
            slice
                .start
                .iter()
                .map(|&v| v.max(0) as u64)
                .collect::<Vec<_>>(),
            slice
                .stop
                .iter()
                .map(|&v| v.max(0) as u64)
                .collect::<Vec<_>>(),
        ),
        None => (vec![0; tensor.shape().len()], tensor.shape().to_vec()),
    };
    let factors: Vec<u64> = match &scale {
        Some(scale) => scale.factors().to_vec(),
        None => vec![1; start.len()],
    };
    let grid = match &scale {
        Some(scale) => tensor.grid.scaled(scale.factors()),
        None => tensor.grid.clone(),
    };
    let region = Region {
        start: start.clone(),
        stop: stop.clone(),
    };
    let realized = grid
        .snap(&region)
        .map_err(|source| RequestError::Slice {
            array_id: tensor.array_id.clone(),
            source,
        })
        .map_err(ServiceError::from)?;
    // The answer's box in the reduced frame (a cell of a scaled grid starts at a multiple
    // of the scale, so the box floors its start and ceils its stop, as a Flight client's
    // crop does).
    let lo: Vec<u64> = start.iter().zip(&factors).map(|(&s, &f)| s / f).collect();
    let hi: Vec<u64> = stop
        .iter()
        .zip(&factors)
        .map(|(&s, &f)| s.div_ceil(f))
        .collect();
    let shape: Vec<u64> = lo.iter().zip(&hi).map(|(&a, &b)| b - a).collect();
    let item = tensor.source.dtype().itemsize;
    let total = shape
        .iter()
        .try_fold(item as u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= MAX_READ_BYTES)
        .ok_or_else(|| HttpError::TooLarge {
            what: format!("a read of shape {shape:?} of '{}'", tensor.array_id),
            max: MAX_READ_BYTES,
        })?;
    let cells: Vec<Region> = grid
        .cells(&realized)
        .map_err(|source| RequestError::Region {
            array_id: tensor.array_id.clone(),
            source,
        })
        .map_err(ServiceError::from)?
        .collect();
    let ids = cells
        .iter()
        .map(|cell| {
            match &scale {
                None => ChunkId::new(&tensor.array_id, tensor.version, cell.clone()),
                Some(scale) => ChunkId::scaled(
                    &tensor.array_id,
                    tensor.version,
                    cell.clone(),
                    scale.clone(),
                ),
            }
            .map(|id| id.encode())
            .map_err(|e| HttpError::from(ServiceError::from(Fault::ChunkId(e))))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut out = vec![0u8; total as usize];
    let mut chunks = futures::stream::iter(
        ids.into_iter()
            .map(move |id| async move { state.read_path().encoded_chunk(&id, false).await }),
    )
    .buffered(CHUNKS_AT_ONCE)
    .enumerate();
    while let Some((at, chunk)) = chunks.next().await {
        let chunk = chunk?;
        let cell = &cells[at];
        let cell_lo: Vec<u64> = cell
            .start
            .iter()
            .zip(&factors)
            .map(|(&s, &f)| s / f)
            .collect();
        let cell_hi: Vec<u64> = cell
            .stop
            .iter()
            .zip(&factors)
            .map(|(&s, &f)| s.div_ceil(f))
            .collect();
        let cell_shape: Vec<u64> = cell_lo.iter().zip(&cell_hi).map(|(&a, &b)| b - a).collect();
        let data = chunk_data(&chunk.body, &cell_shape, item, &tensor.array_id)?;
        let from: Vec<u64> = cell_lo.iter().zip(&lo).map(|(&c, &l)| c.max(l)).collect();
        let to: Vec<u64> = cell_hi.iter().zip(&hi).map(|(&c, &h)| c.min(h)).collect();
        if from.iter().zip(&to).any(|(a, b)| a >= b) {
            continue;
        }
        let extent: Vec<u64> = from.iter().zip(&to).map(|(&a, &b)| b - a).collect();
        let src_at: Vec<u64> = from.iter().zip(&cell_lo).map(|(&a, &c)| a - c).collect();
        let dst_at: Vec<u64> = from.iter().zip(&lo).map(|(&a, &l)| a - l).collect();
        copy_box(
            Side {
                bytes: data,
                shape: &cell_shape,
                at: &src_at,
            },
            &mut out,
            (&shape, &dst_at),
            &extent,
            item,
        );
    }
    drop(chunks);
    let dtype = tensor.source.dtype();
    if dtype.order == crate::source::npy::ByteOrder::Big {
        to_little_endian(&mut out, dtype);
    }
    Ok(Answer { bytes: out, shape })
}

/// Refuses a box that does not fit the tensor, naming the axis.
fn check_box(tensor: &Tensor, start: &[u64], stop: &[u64]) -> Result<(), HttpError> {
    let shape = tensor.shape();
    if start.len() != shape.len() || stop.len() != shape.len() {
        return Err(HttpError::Invalid(format!(
            "'{}' has {} axes; the read gave {} starts and {} stops",
            tensor.array_id,
            shape.len(),
            start.len(),
            stop.len()
        )));
    }
    for (axis, ((&a, &b), &dim)) in start.iter().zip(stop).zip(shape).enumerate() {
        if a >= b || b > dim {
            return Err(HttpError::Invalid(format!(
                "axis {axis} of '{}' is {dim} long; the read asked [{a}, {b})",
                tensor.array_id
            )));
        }
    }
    Ok(())
}

/// The raw bytes of a chunk's IPC body: the `data` column's values, whose length its
/// offsets buffer (`[0, n]`, the body's first 8 bytes) gives, checked against the cell.
fn chunk_data<'a>(
    body: &'a [u8],
    shape: &[u64],
    item: usize,
    array_id: &str,
) -> Result<&'a [u8], HttpError> {
    let expected = shape.iter().product::<u64>() * item as u64;
    let start = DATA_BODY_OFFSET as usize;
    let len = body
        .get(4..8)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as u64);
    match (len, body.get(start..start + expected as usize)) {
        (Some(len), Some(data)) if len == expected => Ok(data),
        _ => Err(HttpError::Internal(format!(
            "a chunk of '{array_id}' does not hold the {expected} bytes of its cell {shape:?}"
        ))),
    }
}

/// One side of a box copy: a C-order array and the box's first element in it.
struct Side<'a> {
    bytes: &'a [u8],
    shape: &'a [u64],
    at: &'a [u64],
}

/// C-order strides in elements.
fn strides(shape: &[u64]) -> Vec<u64> {
    let mut out = vec![1u64; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        out[axis] = out[axis + 1] * shape[axis + 1];
    }
    out
}

/// Copies a box of `extent` from `src` into `dst` (shape, box start), one run of the last
/// axis at a time.
fn copy_box(
    src: Side<'_>,
    dst: &mut [u8],
    (dst_shape, dst_at): (&[u64], &[u64]),
    extent: &[u64],
    item: usize,
) {
    let rank = extent.len();
    if rank == 0 {
        dst[..item].copy_from_slice(&src.bytes[..item]);
        return;
    }
    let (ss, ds) = (strides(src.shape), strides(dst_shape));
    let run = (extent[rank - 1] as usize) * item;
    let mut index = vec![0u64; rank - 1];
    loop {
        let (mut so, mut d) = (src.at[rank - 1], dst_at[rank - 1]);
        for axis in 0..rank - 1 {
            so += (src.at[axis] + index[axis]) * ss[axis];
            d += (dst_at[axis] + index[axis]) * ds[axis];
        }
        let (so, d) = (so as usize * item, d as usize * item);
        dst[d..d + run].copy_from_slice(&src.bytes[so..so + run]);
        // The next index of the outer axes, last fastest.
        let mut axis = rank - 1;
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

/// Every `step`-th element along each axis of a C-order array of `shape` (a nearest
/// decimation done here, for tensors whose source serves full resolution only).
pub fn subsample(bytes: &[u8], shape: &[u64], step: &[u64], item: usize) -> (Vec<u8>, Vec<u64>) {
    let out_shape: Vec<u64> = shape
        .iter()
        .zip(step)
        .map(|(&d, &s)| d.div_ceil(s.max(1)))
        .collect();
    let count = out_shape.iter().product::<u64>() as usize;
    let mut out = Vec::with_capacity(count * item);
    let st = strides(shape);
    let mut index = vec![0u64; shape.len()];
    for _ in 0..count {
        let offset: u64 = index
            .iter()
            .zip(step)
            .zip(&st)
            .map(|((&i, &s), &t)| i * s.max(1) * t)
            .sum();
        let at = offset as usize * item;
        out.extend_from_slice(&bytes[at..at + item]);
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            if index[axis] < out_shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    (out, out_shape)
}

/// Swaps big-endian elements to little-endian in place (a complex element is two floats).
fn to_little_endian(bytes: &mut [u8], dtype: &crate::source::npy::Dtype) {
    let unit = if dtype.kind == crate::source::npy::Kind::Complex {
        dtype.itemsize / 2
    } else {
        dtype.itemsize
    };
    if unit > 1 {
        for element in bytes.chunks_exact_mut(unit) {
            element.reverse();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_box_is_copied_between_arrays_of_different_shapes() {
        // src 3x4 of 0..12; copy its [1..3, 1..3] box to dst 2x3 at (0, 1).
        let src: Vec<u8> = (0..12).collect();
        let mut dst = vec![0u8; 6];
        copy_box(
            Side {
                bytes: &src,
                shape: &[3, 4],
                at: &[1, 1],
            },
            &mut dst,
            (&[2, 3], &[0, 1]),
            &[2, 2],
            1,
        );
        assert_eq!(dst, vec![0, 5, 6, 0, 9, 10]);
    }

    #[test]
    fn subsampling_keeps_every_step_th_element_and_ceils_the_shape() {
        let src: Vec<u8> = (0..15).collect();
        let (out, shape) = subsample(&src, &[3, 5], &[2, 2], 1);
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(out, vec![0, 2, 4, 10, 12, 14]);
    }
}
