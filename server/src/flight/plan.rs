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

use arrow_flight::{FlightDescriptor, FlightEndpoint, FlightInfo, Ticket};
use prost::Message;
use tessera_proto::pb::{ChunkBounds, PyramidLevel, SliceHint, TensorDescriptor, TensorReadOption};

use tessera_proto::consts::MASK_IS_RESIDENT;

use crate::chunk_id::ChunkId;
use crate::error::{ServiceError, ServiceResult};
use crate::grid::{ChunkGrid, Region};
use crate::route::Route;
use crate::source::registry::Tensor;

/// Optional parts of the reply a request's field mask selects.
#[derive(Debug, Default)]
struct Mask {
    endpoints: bool,
    metadata_json: bool,
    pyramid: bool,
    is_resident: bool,
}

impl Mask {
    fn from_request(request: &TensorReadOption) -> Mask {
        match &request.fields {
            // No mask at all: a generic client; give it everything it can use.
            None => Mask {
                endpoints: true,
                metadata_json: true,
                pyramid: true,
                is_resident: false,
            },
            Some(mask) => {
                let has = |p: &str| mask.paths.iter().any(|x| x == p);
                Mask {
                    endpoints: has("endpoints"),
                    metadata_json: has("metadata_json"),
                    pyramid: has("pyramid"),
                    is_resident: has(MASK_IS_RESIDENT),
                }
            }
        }
    }
}

/// Validates the request's slice against the tensor and returns the requested region.
fn requested_region(tensor: &Tensor, slice: Option<&SliceHint>) -> ServiceResult<Option<Region>> {
    let Some(slice) = slice else {
        return Ok(None);
    };
    let shape = tensor.shape();
    let rank = shape.len();
    if slice.start.len() != rank || slice.stop.len() != rank {
        return Err(ServiceError::InvalidArgument(format!(
            "slice_hint of '{}' has {} start and {} stop values, but the tensor has {rank} axes",
            tensor.array_id,
            slice.start.len(),
            slice.stop.len()
        )));
    }
    let mut start = Vec::with_capacity(rank);
    let mut stop = Vec::with_capacity(rank);
    for (axis, ((&a, &b), &dim)) in slice.start.iter().zip(&slice.stop).zip(shape).enumerate() {
        let valid = a >= 0 && b >= a && (b as u64) <= dim;
        if !valid {
            return Err(ServiceError::InvalidArgument(format!(
                "slice_hint of '{}' on axis {axis} is [{a}, {b}), outside [0, {dim}]",
                tensor.array_id
            )));
        }
        start.push(a as u64);
        stop.push(b as u64);
    }
    Ok(Some(Region { start, stop }))
}

fn to_i64(values: &[u64]) -> Vec<i64> {
    values.iter().map(|&v| v as i64).collect()
}

/// Refuses a downsampling request: there are no pyramids yet, and ignoring the
/// hint would hand back an array of the wrong shape.
fn check_scale(tensor: &Tensor, request: &TensorReadOption) -> ServiceResult<()> {
    if request.scale_hint.iter().all(|&s| s == 1) {
        return Ok(());
    }
    Err(ServiceError::InvalidArgument(format!(
        "scale_hint {:?} for '{}' is not supported: Tessera serves full resolution only (no pyramid levels)",
        request.scale_hint, tensor.array_id
    )))
}

/// The grid a plan on `route` is cut on.
fn grid_for(tensor: &Tensor, route: Route) -> &ChunkGrid {
    match route {
        Route::Mapped => &tensor.mapped_grid,
        Route::Socket => &tensor.grid,
    }
}

/// Builds the FlightInfo answering `request` (whose serialized bytes are `request_bytes`),
/// cut on the grid of `route`.
pub fn plan(
    tensor: &Tensor,
    request: &TensorReadOption,
    request_bytes: &[u8],
    route: Route,
) -> ServiceResult<FlightInfo> {
    check_scale(tensor, request)?;
    let grid = grid_for(tensor, route);
    let mask = Mask::from_request(request);
    let requested = requested_region(tensor, request.slice_hint.as_ref())?;
    let whole = Region::whole(tensor.shape());
    let realized = match &requested {
        Some(region) => grid.snap(region).map_err(|e| {
            ServiceError::InvalidArgument(format!("slice of '{}': {e}", tensor.array_id))
        })?,
        None => whole,
    };
    let realized_shape = realized.shape();
    let slice_hint =
        (requested.is_some() || realized.start.iter().any(|&s| s > 0)).then(|| SliceHint {
            start: to_i64(&realized.start),
            stop: to_i64(&realized.stop),
        });

    let descriptor = TensorDescriptor {
        array_id: request.array_id.clone(),
        dim_labels: tensor.dim_labels.clone(),
        shape: to_i64(&realized_shape),
        chunk_shape: to_i64(grid.chunk_shape()),
        dtype: tensor.dtype_str(),
        slice_hint,
        metadata_json: if mask.metadata_json {
            tensor.metadata_json()
        } else {
            String::new()
        },
        pyramid: if mask.pyramid {
            vec![PyramidLevel {
                scale_hint: vec![1; tensor.shape().len()],
                reduction_method: "nearest".to_string(),
                shape: to_i64(tensor.shape()),
                native: true,
            }]
        } else {
            Vec::new()
        },
        content_version: Some(version_bytes(tensor)),
        physical_scale: tensor.meta.physical_scale.clone(),
        physical_unit: tensor.meta.physical_unit.clone(),
        is_resident: mask.is_resident.then(|| is_resident(tensor)),
        ..Default::default()
    };

    let mut info = FlightInfo::new()
        .try_with_schema(&tessera_proto::schema::plan_schema())
        .map_err(|e| ServiceError::Internal(format!("encoding the plan schema: {e}")))?
        .with_descriptor(FlightDescriptor::new_cmd(descriptor.encode_to_vec()))
        .with_app_metadata(request_bytes.to_vec())
        .with_total_records(-1)
        .with_total_bytes(-1);
    if mask.endpoints {
        info = info.with_endpoints(endpoints(tensor, grid, &realized)?);
    }
    Ok(info)
}

/// One endpoint per cell of `grid` in the realized region, in C order.
pub fn endpoints(
    tensor: &Tensor,
    grid: &ChunkGrid,
    realized: &Region,
) -> ServiceResult<Vec<FlightEndpoint>> {
    let cells = grid.cells(realized).map_err(|e| {
        ServiceError::InvalidArgument(format!("region of '{}': {e}", tensor.array_id))
    })?;
    cells
        .map(|cell| {
            let bounds = ChunkBounds {
                start: cell
                    .start
                    .iter()
                    .zip(&realized.start)
                    .map(|(&c, &r)| (c - r) as i64)
                    .collect(),
                stop: cell
                    .stop
                    .iter()
                    .zip(&realized.start)
                    .map(|(&c, &r)| (c - r) as i64)
                    .collect(),
            };
            let id = ChunkId::new(tensor.array_id.clone(), tensor.version, cell)
                .map_err(|e| ServiceError::Internal(format!("minting a chunk id: {e}")))?;
            Ok(FlightEndpoint::new()
                .with_ticket(Ticket::new(tessera_proto::ticket::chunk_ticket(
                    &id.encode(),
                )))
                .with_app_metadata(bounds.encode_to_vec()))
        })
        .collect()
}

/// Whether the source's bytes are on this machine now: its file is a local file, so yes
/// while it is there. One `stat`, never a read of the file.
fn is_resident(tensor: &Tensor) -> bool {
    std::fs::metadata(tensor.file.path()).is_ok_and(|m| m.is_file())
}

/// The content version as the descriptor reports it (informational for clients).
fn version_bytes(tensor: &Tensor) -> Vec<u8> {
    let v = tensor.version;
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(&v.dev.to_be_bytes());
    out.extend_from_slice(&v.ino.to_be_bytes());
    out.extend_from_slice(&v.size.to_be_bytes());
    out.extend_from_slice(&v.mtime_ns.to_be_bytes());
    out
}
