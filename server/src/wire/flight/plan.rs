//! GetFlightInfo: planning a read of a tensor or a region of it.
//!
//! Two coordinate frames meet here (biopb-protocol.md §2.4, §8.6):
//! * chunk ids carry **absolute** bounds of the grid cell in the source;
//! * `ChunkBounds` in each endpoint are **relative** to the realized region;
//! * the reply descriptor's `shape` is the realized extent and its `slice_hint`
//!   the realized region in absolute coordinates, so the client crops
//!   `[req.start − real.start, req.stop − real.start)`.
//!
//! The realized region is the request snapped outward to the chunk grid, so
//! every slice of a tensor reuses the same cached chunks. The grid is the one of the
//! plan's route ([`Route`]): the coarse grid for a loopback client that will map the
//! chunks, the fine grid for the socket.
//!
//! A scaled read (`scale_hint` with a factor above 1) is planned on that grid enlarged
//! by the scale ([`ChunkGrid::scaled`]): every cell starts at a multiple of the scale in
//! base coordinates and reduces to one whole chunk of the reduced frame, so a sliced
//! scaled read returns exactly the window of the whole tensor's reduction. The reply
//! `shape` is `ceil(realized / scale)`, `chunk_shape` the reduced cell, endpoint bounds
//! are in the reduced frame (start floored, stop ceiled), and `slice_hint` stays in base
//! coordinates, which is what the client's crop rule expects.
//!
//! One plan for every kind of source: what differs is asked of the source (how it answers
//! scaled reads, whether it keeps its own chunks, its upload status), never of its kind.
//! An upload is planned on its one grid (the cells its chunks were written as) at any
//! state, so a producer can plan its writes while it is PENDING and a poller read its
//! status (`upload_status` mask); its scaled reads are refused.

use arrow_flight::{FlightDescriptor, FlightEndpoint, FlightInfo, Ticket};
use prost::Message;
use tessera_proto::pb::{ChunkBounds, PyramidLevel, SliceHint, TensorDescriptor, TensorReadOption};

use tessera_proto::consts::{
    MASK_ENDPOINTS, MASK_IS_RESIDENT, MASK_METADATA_JSON, MASK_PYRAMID, MASK_UPLOAD_STATUS,
};

use crate::error::refusal::MAX_PLAN_ENDPOINT_BYTES;
use crate::error::{Fault, RequestError, ServiceError, ServiceResult};
use crate::grid::chunk_id::{ChunkId, ContentVersion};
use crate::grid::route::Route;
use crate::grid::scaled::pyramid::PyramidPolicy;
use crate::grid::scaled::{Method, Scale, ScaleError};
use crate::grid::{ChunkGrid, Region};
use crate::source::Scaling;
use crate::source::registry::Tensor;

/// A plan's answer, with the chunks at both ends of a full-resolution plan that lists its
/// endpoints (where a whole-region reader starts: decision 0022).
pub struct Planned {
    /// The FlightInfo GetFlightInfo answers.
    pub info: FlightInfo,
    /// The first and last chunk of the plan, in C order; `None` for a scaled plan, one
    /// without endpoints, or one of a source that keeps its own chunks (nothing to decode).
    pub ends: Option<(ChunkId, ChunkId)>,
}

/// Optional parts of the reply a request's field mask selects: the one reading of a read's
/// `fields`, for plans of served tensors and of uploads alike.
#[derive(Debug, Default)]
struct Mask {
    endpoints: bool,
    metadata_json: bool,
    pyramid: bool,
    upload_status: bool,
    is_resident: bool,
}

impl Mask {
    fn from_request(request: &TensorReadOption) -> Mask {
        match &request.fields {
            // No mask at all: a generic client; give it everything it can use, except
            // `is_resident` (a `stat` per plan), which only a client that asks gets.
            None => Mask {
                endpoints: true,
                metadata_json: true,
                pyramid: true,
                upload_status: true,
                is_resident: false,
            },
            Some(mask) => {
                let has = |p: &str| mask.paths.iter().any(|x| x == p);
                Mask {
                    endpoints: has(MASK_ENDPOINTS),
                    metadata_json: has(MASK_METADATA_JSON),
                    pyramid: has(MASK_PYRAMID),
                    upload_status: has(MASK_UPLOAD_STATUS),
                    is_resident: has(MASK_IS_RESIDENT),
                }
            }
        }
    }
}

/// Validates the request's slice against the tensor and returns the requested region.
fn requested_region(
    array_id: &str,
    shape: &[u64],
    slice: Option<&SliceHint>,
) -> ServiceResult<Option<Region>> {
    let Some(slice) = slice else {
        return Ok(None);
    };
    let rank = shape.len();
    if slice.start.len() != rank || slice.stop.len() != rank {
        return Err(RequestError::SliceRank {
            array_id: array_id.to_string(),
            starts: slice.start.len(),
            stops: slice.stop.len(),
            rank,
        }
        .into());
    }
    let mut start = Vec::with_capacity(rank);
    let mut stop = Vec::with_capacity(rank);
    for (axis, ((&a, &b), &dim)) in slice.start.iter().zip(&slice.stop).zip(shape).enumerate() {
        let valid = a >= 0 && b >= a && (b as u64) <= dim;
        if !valid {
            return Err(RequestError::SliceOutside {
                array_id: array_id.to_string(),
                axis,
                start: a,
                stop: b,
                dim,
            }
            .into());
        }
        start.push(a as u64);
        stop.push(b as u64);
    }
    Ok(Some(Region { start, stop }))
}

fn to_i64(values: &[u64]) -> Vec<i64> {
    values.iter().map(|&v| v as i64).collect()
}

/// Validates the request's `scale_hint` and `reduction_method`: `None` for a
/// full-resolution read, the scale otherwise; refusals name what was refused and why. A
/// source that serves full resolution only refuses any factor above 1 (and reads the rest
/// of the hint as full resolution).
pub fn requested_scale(
    tensor: &Tensor,
    request: &TensorReadOption,
) -> ServiceResult<Option<Scale>> {
    if let Scaling::FullOnly { what } = tensor.source.scaling() {
        if request.scale_hint.iter().any(|&f| f > 1) {
            return Err(RequestError::ScaledFullOnly {
                array_id: tensor.array_id.clone(),
                what,
            }
            .into());
        }
        return Ok(None);
    }
    let refuse = |source: ScaleError| RequestError::Scale {
        array_id: tensor.array_id.clone(),
        source,
    };
    let scale = Scale::from_request(
        tensor.shape(),
        &request.scale_hint,
        &request.reduction_method,
    )
    .map_err(refuse)?;
    if let Some(scale) = &scale {
        tensor.source.dtype().check_scale(scale).map_err(refuse)?;
    }
    Ok(scale)
}

/// A `precompute` read of a source that stores its levels: the id of the level its
/// `scale_hint` names and the request to plan on it (the slice in the level's coordinates,
/// start floored and stop ceiled by the factors; the reply keeps the tensor's array id).
/// `None`: any other read, planned on `tensor` itself; level 0 is `tensor` at full
/// resolution.
pub fn native_level(
    tensor: &Tensor,
    request: &TensorReadOption,
) -> ServiceResult<Option<(Option<String>, TensorReadOption)>> {
    let Scaling::Native { levels } = tensor.source.scaling() else {
        return Ok(None);
    };
    if !matches!(
        request.reduction_method.as_str(),
        "precompute" | "precomputed"
    ) {
        return Ok(None);
    }
    let hint: Vec<u64> = if request.scale_hint.is_empty() {
        vec![1; tensor.shape().len()]
    } else {
        request
            .scale_hint
            .iter()
            .map(|&f| f.max(0) as u64)
            .collect()
    };
    let Some(level) = levels.iter().find(|l| l.factors == hint) else {
        return Err(RequestError::NoNativeLevel {
            array_id: tensor.array_id.clone(),
            hint: request.scale_hint.clone(),
            levels: levels.iter().map(|l| l.factors.clone()).collect(),
        }
        .into());
    };
    let mut level_request = request.clone();
    level_request.scale_hint.clear();
    level_request.reduction_method.clear();
    if level.factors.iter().all(|&f| f == 1) {
        return Ok(Some((None, level_request)));
    }
    if let Some(slice) = &mut level_request.slice_hint {
        for (axis, (start, stop)) in slice.start.iter_mut().zip(&mut slice.stop).enumerate() {
            let f = level.factors.get(axis).copied().unwrap_or(1).max(1) as i64;
            let dim = level.shape.get(axis).copied().unwrap_or(0) as i64;
            *start = start.div_euclid(f).min(dim);
            *stop = (*stop + f - 1).div_euclid(f).min(dim);
        }
    }
    let id = format!("{}.{}", tensor.array_id, level.path.replace('/', "."));
    Ok(Some((
        Some(crate::source::registry::sanitize(&id)),
        level_request,
    )))
}

/// How many times the cells of the coarse grid may cover the cells of the fine grid a
/// request of a region needs before a mapped plan of it is cut on the fine grid.
const COARSE_OVERREAD: u64 = 4;

/// The grid a plan of `requested` (`None`: the whole tensor) on `route` is cut on: the
/// route's (decision 0015), except that a mapped plan of a region whose coarse cells cover
/// more than [`COARSE_OVERREAD`] times the fine cells it needs, and must be decoded (not one
/// byte range of the source), is cut on the fine grid. A viewer's window of a tiled TIFF
/// then costs its tiles, not a 64 MiB cell of 128 of them decoded for a 512² window; whole
/// reads and large slices keep the coarse grid.
fn grid_for<'t>(tensor: &'t Tensor, route: Route, requested: Option<&Region>) -> &'t ChunkGrid {
    match (route, requested) {
        (Route::Socket, _) => &tensor.grid,
        (Route::Mapped, Some(region)) if overreads(tensor, region) => &tensor.grid,
        (Route::Mapped, _) => &tensor.mapped_grid,
    }
}

/// Whether the coarse cells holding `region` cover more than [`COARSE_OVERREAD`] times the
/// elements of the fine cells holding it, and are not one byte range of the source: such a
/// range is copied inside the kernel, and on a cold disk one long read of a band costs less
/// than the row-by-row gather of the tiles in it (a `.npy` file).
fn overreads(tensor: &Tensor, region: &Region) -> bool {
    let Ok(coarse) = tensor.mapped_grid.snap(region) else {
        return false;
    };
    let covered = |grid: &ChunkGrid| grid.snap(region).ok()?.num_elements();
    let wider = match (coarse.num_elements(), covered(&tensor.grid)) {
        (Some(coarse), Some(fine)) => coarse > fine.saturating_mul(COARSE_OVERREAD),
        _ => false,
    };
    wider && !matches!(tensor.source.byte_range(&coarse), Ok(Some(_)))
}

/// Builds the FlightInfo answering `request` (whose serialized bytes are `request_bytes`),
/// cut on the grid of `route`; its descriptor carries `roi_ticket` (empty: none).
pub fn plan(
    tensor: &Tensor,
    request: &TensorReadOption,
    request_bytes: &[u8],
    route: Route,
    pyramid: &PyramidPolicy,
    roi_ticket: Vec<u8>,
) -> ServiceResult<Planned> {
    let scale = requested_scale(tensor, request)?;
    let requested = requested_region(
        &tensor.array_id,
        tensor.shape(),
        request.slice_hint.as_ref(),
    )?;
    let base = grid_for(tensor, route, requested.as_ref());
    let scaled_grid;
    let grid = match &scale {
        None => base,
        Some(scale) => {
            scaled_grid = base.scaled(scale.factors());
            &scaled_grid
        }
    };
    let mask = Mask::from_request(request);
    let whole = Region::whole(tensor.shape());
    let realized = match &requested {
        Some(region) => grid.snap(region).map_err(|source| RequestError::Slice {
            array_id: tensor.array_id.clone(),
            source,
        })?,
        None => whole,
    };
    let (realized_shape, chunk_shape) = match &scale {
        None => (realized.shape(), grid.chunk_shape().to_vec()),
        Some(scale) => (
            scale.reduced(&realized.shape()),
            scale.reduced(grid.chunk_shape()),
        ),
    };
    let slice_hint =
        (requested.is_some() || realized.start.iter().any(|&s| s > 0)).then(|| SliceHint {
            start: to_i64(&realized.start),
            stop: to_i64(&realized.stop),
        });

    let descriptor = TensorDescriptor {
        array_id: request.array_id.clone(),
        dim_labels: tensor.dim_labels.clone(),
        shape: to_i64(&realized_shape),
        chunk_shape: to_i64(&chunk_shape),
        dtype: tensor.dtype_str(),
        slice_hint,
        metadata_json: if mask.metadata_json {
            tensor.metadata_json()
        } else {
            String::new()
        },
        pyramid: if mask.pyramid {
            pyramid_levels(tensor, pyramid)
        } else {
            Vec::new()
        },
        content_version: Some(version_bytes(tensor.version)),
        physical_scale: tensor.meta.physical_scale.clone(),
        physical_unit: tensor.meta.physical_unit.clone(),
        is_resident: mask.is_resident.then(|| tensor.source.is_resident()),
        upload_status: tensor.source.upload_status().filter(|_| mask.upload_status),
        ttl_seconds: tensor.source.ttl_seconds(),
        roi_ticket,
        ..Default::default()
    };

    let mut info = plan_info(&descriptor, request_bytes)?;
    let mut ends = None;
    if mask.endpoints {
        info = info.with_endpoints(endpoints(
            &tensor.array_id,
            tensor.version,
            grid,
            &realized,
            scale.as_ref(),
        )?);
        if scale.is_none() && tensor.source.held_chunks().is_none() {
            ends = end_chunks(tensor, grid, &realized);
        }
    }
    Ok(Planned { info, ends })
}

/// The first and last cells of `grid` in `realized`, as chunk ids of `tensor`.
fn end_chunks(tensor: &Tensor, grid: &ChunkGrid, realized: &Region) -> Option<(ChunkId, ChunkId)> {
    let mut cells = grid.cells(realized).ok()?;
    let first = cells.next()?;
    let last = cells.last().unwrap_or_else(|| first.clone());
    let id = |cell| ChunkId::new(&tensor.array_id, tensor.version, cell).ok();
    Some((id(first)?, id(last)?))
}

/// The levels the descriptor advertises: level 0 (native) and the computed ones (none for
/// a source that serves full resolution only).
pub fn pyramid_levels(tensor: &Tensor, pyramid: &PyramidPolicy) -> Vec<PyramidLevel> {
    let levels = match tensor.source.scaling() {
        Scaling::Computed => pyramid.levels(tensor.shape(), &tensor.dim_labels),
        Scaling::FullOnly { .. } => vec![vec![1; tensor.shape().len()]],
        Scaling::Native { levels } => {
            return levels
                .into_iter()
                .map(|level| PyramidLevel {
                    shape: to_i64(&level.shape),
                    scale_hint: to_i64(&level.factors),
                    reduction_method: "precompute".to_string(),
                    native: true,
                })
                .collect();
        }
    };
    levels
        .into_iter()
        .map(|factors| {
            let native = factors.iter().all(|&f| f == 1);
            PyramidLevel {
                shape: factors
                    .iter()
                    .zip(tensor.shape())
                    .map(|(&f, &dim)| dim.div_ceil(f) as i64)
                    .collect(),
                scale_hint: to_i64(&factors),
                reduction_method: if native {
                    Method::Nearest.name().to_string()
                } else {
                    pyramid.method().name().to_string()
                },
                native,
            }
        })
        .collect()
}

/// One endpoint per cell of `grid` in the realized region, in C order; for a scaled
/// read (`grid` is then the scaled read grid) the bounds are in the reduced frame.
/// Refused, before any is made, when they would not fit one reply
/// ([`MAX_PLAN_ENDPOINT_BYTES`]).
pub fn endpoints(
    array_id: &str,
    version: ContentVersion,
    grid: &ChunkGrid,
    realized: &Region,
    scale: Option<&Scale>,
) -> ServiceResult<Vec<FlightEndpoint>> {
    let cells = grid
        .cells(realized)
        .map_err(|source| RequestError::Region {
            array_id: array_id.to_string(),
            source,
        })?;
    if let Some(last) = cells.last_cell() {
        // Every endpoint is at most as long as the last one: chunk ids are fixed-width and
        // the last cell has the largest bounds.
        let one = endpoint(array_id, version, last, realized, scale)?.encoded_len() as u64;
        let each = 1 + prost::length_delimiter_len(one as usize) as u64 + one;
        let count = cells.remaining();
        let bytes = count.saturating_mul(each);
        if bytes > MAX_PLAN_ENDPOINT_BYTES {
            return Err(RequestError::TooManyEndpoints {
                array_id: array_id.to_string(),
                start: realized.start.clone(),
                stop: realized.stop.clone(),
                count,
                bytes,
                fit: MAX_PLAN_ENDPOINT_BYTES / each,
            }
            .into());
        }
    }
    cells
        .map(|cell| endpoint(array_id, version, cell, realized, scale))
        .collect()
}

/// The endpoint of one cell: its chunk ticket, and its bounds relative to `realized` (in
/// the reduced frame for a scaled read).
fn endpoint(
    array_id: &str,
    version: ContentVersion,
    cell: Region,
    realized: &Region,
    scale: Option<&Scale>,
) -> ServiceResult<FlightEndpoint> {
    let factors = |a: usize| scale.map_or(1, |s| s.factors()[a]);
    let bounds = ChunkBounds {
        start: cell
            .start
            .iter()
            .zip(&realized.start)
            .enumerate()
            .map(|(a, (&c, &r))| ((c - r) / factors(a)) as i64)
            .collect(),
        stop: cell
            .stop
            .iter()
            .zip(&realized.start)
            .enumerate()
            .map(|(a, (&c, &r))| (c - r).div_ceil(factors(a)) as i64)
            .collect(),
    };
    let id = match scale {
        None => ChunkId::new(array_id, version, cell),
        Some(scale) => ChunkId::scaled(array_id, version, cell, scale.clone()),
    }
    .map_err(|e| ServiceError::from(Fault::ChunkId(e)))?;
    Ok(FlightEndpoint::new()
        .with_ticket(Ticket::new(tessera_proto::ticket::chunk_ticket(
            &id.encode(),
        )))
        .with_app_metadata(bounds.encode_to_vec()))
}

/// The content version as the descriptor reports it (informational for clients; what a
/// ROI ticket's grant is sealed over).
pub fn version_bytes(v: ContentVersion) -> Vec<u8> {
    v.descriptor_bytes().to_vec()
}

/// The FlightInfo of a plan before its endpoints: the plan schema, the descriptor and the
/// request echoed as app metadata; sizes unknown (-1), as the protocol has them.
fn plan_info(descriptor: &TensorDescriptor, request_bytes: &[u8]) -> ServiceResult<FlightInfo> {
    Ok(FlightInfo::new()
        .try_with_schema(&tessera_proto::schema::plan_schema())
        .map_err(|e| ServiceError::from(Fault::encode("the plan schema", e)))?
        .with_descriptor(FlightDescriptor::new_cmd(descriptor.encode_to_vec()))
        .with_app_metadata(request_bytes.to_vec())
        .with_total_records(-1)
        .with_total_bytes(-1))
}
