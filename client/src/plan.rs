//! Read plans: decoding a GetFlightInfo reply, checking that its endpoints
//! tile the realized region, and working out the crop to the requested region.

use std::collections::{BTreeSet, HashMap};

use arrow_flight::FlightInfo;
use prost::Message;
use tessera_proto::consts::{CHUNK_WIRE_PROTOCOL_KEY, CHUNK_WIRE_PROTOCOL_VERSION_STR};
use tessera_proto::pb::{ChunkBounds, TensorDescriptor};

use crate::dtype::itemsize;
use crate::error::ClientError;
use crate::region::Region;

/// One chunk of a plan: the ticket to fetch it with and where it sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedChunk {
    /// The endpoint's ticket bytes (`TensorTicket{chunk_id}`), also the
    /// `chunk_locate` body and the client's cache key.
    pub ticket: Vec<u8>,
    /// The chunk's box in the plan frame (relative to the realized region).
    pub bounds: Region,
}

/// A planned read: what the server realized, its chunks, and the crop that
/// turns the realized region into the requested one.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The array id that was requested.
    pub array_id: String,
    /// The reply `TensorDescriptor` as the server sent it.
    pub descriptor: TensorDescriptor,
    /// Shape of the realized region (the plan frame).
    pub shape: Vec<u64>,
    /// The numpy dtype string of every chunk.
    pub dtype: String,
    /// Bytes per element of `dtype`.
    pub itemsize: usize,
    /// The chunks, tiling `[0, shape)` exactly once, in C order of their starts.
    pub chunks: Vec<PlannedChunk>,
    /// The requested region in the plan frame; the read returns exactly this.
    pub crop: Region,
}

impl Plan {
    /// Shape of the array a read of this plan returns.
    pub fn output_shape(&self) -> Vec<u64> {
        self.crop.shape()
    }

    /// The chunks that overlap the crop (the only ones a read fetches).
    pub fn needed_chunks(&self) -> impl Iterator<Item = &PlannedChunk> {
        self.chunks
            .iter()
            .filter(|c| c.bounds.intersect(&self.crop).is_some())
    }
}

fn to_u64(values: &[i64], what: &str, array_id: &str) -> Result<Vec<u64>, ClientError> {
    values
        .iter()
        .map(|&v| {
            u64::try_from(v).map_err(|_| ClientError::BadPlan {
                array_id: array_id.to_string(),
                reason: format!("{what} has a negative value {v} in {values:?}"),
            })
        })
        .collect()
}

/// The `chunk_wire_protocol` stamp of a plan schema; refuses anything but `"2"`.
pub fn check_wire_protocol(info: &FlightInfo, array_id: &str) -> Result<(), ClientError> {
    let schema = tessera_schema(info, array_id)?;
    match schema.metadata().get(CHUNK_WIRE_PROTOCOL_KEY) {
        Some(v) if v == CHUNK_WIRE_PROTOCOL_VERSION_STR => Ok(()),
        Some(v) => Err(ClientError::WireProtocol {
            array_id: array_id.to_string(),
            found: format!("\"{v}\""),
        }),
        None => Err(ClientError::WireProtocol {
            array_id: array_id.to_string(),
            found: format!("1 (schema metadata has no '{CHUNK_WIRE_PROTOCOL_KEY}' key)"),
        }),
    }
}

/// True when a ListFlights entry is a tensor (its schema carries the chunk wire protocol
/// stamp) rather than another flight such as a catalog table.
pub(crate) fn is_tensor_info(info: &FlightInfo) -> bool {
    arrow_ipc::convert::try_schema_from_ipc_buffer(&info.schema)
        .is_ok_and(|s| s.metadata().contains_key(CHUNK_WIRE_PROTOCOL_KEY))
}

fn tessera_schema(info: &FlightInfo, array_id: &str) -> Result<arrow_schema::Schema, ClientError> {
    if info.schema.is_empty() {
        return Err(ClientError::WireProtocol {
            array_id: array_id.to_string(),
            found: "1 (the reply has no schema)".to_string(),
        });
    }
    arrow_ipc::convert::try_schema_from_ipc_buffer(&info.schema).map_err(|e| ClientError::BadPlan {
        array_id: array_id.to_string(),
        reason: format!("the schema is not IPC-encoded Arrow: {e}"),
    })
}

/// Decodes the reply `TensorDescriptor` carried in the FlightInfo's CMD descriptor.
pub fn reply_descriptor(
    info: &FlightInfo,
    array_id: &str,
) -> Result<TensorDescriptor, ClientError> {
    let bad = |reason: String| ClientError::BadPlan {
        array_id: array_id.to_string(),
        reason,
    };
    let descriptor = info
        .flight_descriptor
        .as_ref()
        .ok_or_else(|| bad("the reply has no flight_descriptor".to_string()))?;
    if descriptor.cmd.is_empty() {
        return Err(bad(
            "the reply descriptor has no cmd (expected a TensorDescriptor)".to_string(),
        ));
    }
    TensorDescriptor::decode(descriptor.cmd.clone()).map_err(|e| {
        bad(format!(
            "the reply descriptor cmd is not a TensorDescriptor: {e}"
        ))
    })
}

/// Builds a [`Plan`] from a GetFlightInfo reply to a read of `array_id`,
/// `requested` being the region asked for (`None`: the whole tensor).
///
/// Cropping follows biopb (§2.4): with a requested region and a reply
/// `slice_hint`, the crop is `requested − slice_hint.start`. A reply without
/// `slice_hint` realized a region starting at 0, so the crop is `requested`.
/// For a scaled read (`scale` non-empty, one factor per axis) the requested region and
/// `slice_hint` are in base coordinates and the reply in the reduced frame: the crop is
/// `[(start − real) // s, ceil((stop − real) / s))`.
pub fn plan_from_info(
    info: &FlightInfo,
    array_id: &str,
    requested: Option<&Region>,
    scale: &[u64],
) -> Result<Plan, ClientError> {
    check_wire_protocol(info, array_id)?;
    let descriptor = reply_descriptor(info, array_id)?;
    let bad = |reason: String| ClientError::BadPlan {
        array_id: array_id.to_string(),
        reason,
    };
    let shape = to_u64(&descriptor.shape, "reply shape", array_id)?;
    let itemsize = itemsize(&descriptor.dtype)?;
    let crop = match requested {
        None => Region::whole(&shape),
        Some(req) => {
            let realized_start = match &descriptor.slice_hint {
                Some(hint) => to_u64(&hint.start, "reply slice_hint start", array_id)?,
                None => vec![0; shape.len()],
            };
            if req.rank() != shape.len() || realized_start.len() != shape.len() {
                return Err(bad(format!(
                    "requested region {req} has {} axes, reply shape {shape:?} and slice_hint start {realized_start:?}",
                    req.rank()
                )));
            }
            let mut start = Vec::with_capacity(shape.len());
            let mut stop = Vec::with_capacity(shape.len());
            for axis in 0..shape.len() {
                let (a, b, r) = (req.start[axis], req.stop[axis], realized_start[axis]);
                let s = scale.get(axis).copied().unwrap_or(1).max(1);
                if a < r || (b - r.min(b)).div_ceil(s) > shape[axis] {
                    return Err(bad(format!(
                        "axis {axis}: realized [{r}, …) of reduced length {} at scale {s} does not contain the requested [{a}, {b})",
                        shape[axis]
                    )));
                }
                start.push((a - r) / s);
                stop.push((b - r).div_ceil(s));
            }
            Region { start, stop }
        }
    };
    let mut chunks = Vec::with_capacity(info.endpoint.len());
    for (index, endpoint) in info.endpoint.iter().enumerate() {
        let ticket = endpoint
            .ticket
            .as_ref()
            .map(|t| t.ticket.to_vec())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| bad(format!("endpoint {index} has no ticket")))?;
        let bounds = ChunkBounds::decode(endpoint.app_metadata.clone()).map_err(|e| {
            bad(format!(
                "endpoint {index} app_metadata is not ChunkBounds: {e}"
            ))
        })?;
        let bounds = Region {
            start: to_u64(&bounds.start, "ChunkBounds start", array_id)?,
            stop: to_u64(&bounds.stop, "ChunkBounds stop", array_id)?,
        };
        chunks.push(PlannedChunk { ticket, bounds });
    }
    chunks.sort_by(|a, b| a.bounds.start.cmp(&b.bounds.start));
    check_tiling(&shape, &chunks).map_err(|reason| ClientError::Tiling {
        array_id: array_id.to_string(),
        reason,
    })?;
    Ok(Plan {
        array_id: array_id.to_string(),
        dtype: descriptor.dtype.clone(),
        descriptor,
        shape,
        itemsize,
        chunks,
        crop,
    })
}

/// Checks that `chunks` tile `[0, shape)` as a Cartesian grid, each grid
/// cell exactly once. The grid's edges per axis are all chunk starts and
/// stops; every chunk must be one cell, and every cell must have one chunk.
/// An empty array (some axis 0) needs no chunks and ignores any it gets.
pub fn check_tiling(shape: &[u64], chunks: &[PlannedChunk]) -> Result<(), String> {
    if shape.contains(&0) {
        return Ok(());
    }
    let rank = shape.len();
    for chunk in chunks {
        let b = &chunk.bounds;
        if b.start.len() != rank || b.stop.len() != rank {
            return Err(format!(
                "chunk {b} has a different rank than the shape {shape:?}"
            ));
        }
        for axis in 0..rank {
            if b.start[axis] >= b.stop[axis] || b.stop[axis] > shape[axis] {
                return Err(format!(
                    "chunk {b} is empty or outside [0, {shape:?}) on axis {axis}"
                ));
            }
        }
    }
    // Edges per axis; each must start at 0 and end at the axis length.
    let mut edges: Vec<Vec<u64>> = Vec::with_capacity(rank);
    for (axis, &dim) in shape.iter().enumerate() {
        let mut set: BTreeSet<u64> = BTreeSet::new();
        for chunk in chunks {
            set.insert(chunk.bounds.start[axis]);
            set.insert(chunk.bounds.stop[axis]);
        }
        let axis_edges: Vec<u64> = set.into_iter().collect();
        if axis_edges.first() != Some(&0) {
            return Err(format!(
                "gap on axis {axis}: no chunk starts at 0 (first edge {:?})",
                axis_edges.first()
            ));
        }
        if axis_edges.last() != Some(&dim) {
            return Err(format!(
                "gap on axis {axis}: no chunk reaches the end {dim} (last edge {:?})",
                axis_edges.last()
            ));
        }
        edges.push(axis_edges);
    }
    let cells: u128 = edges
        .iter()
        .map(|e| (e.len() as u128).saturating_sub(1))
        .product();
    let mut seen: HashMap<Vec<usize>, &Region> = HashMap::with_capacity(chunks.len());
    for chunk in chunks {
        let b = &chunk.bounds;
        let mut cell = Vec::with_capacity(rank);
        for (axis, axis_edges) in edges.iter().enumerate() {
            let at = axis_edges.partition_point(|&e| e < b.start[axis]);
            if axis_edges.get(at + 1) != Some(&b.stop[axis]) {
                return Err(format!(
                    "chunk {b} spans several grid cells on axis {axis}: it overlaps other chunks \
                     or the chunks do not form a Cartesian grid"
                ));
            }
            cell.push(at);
        }
        if let Some(other) = seen.insert(cell, b) {
            return Err(format!("chunks {other} and {b} overlap"));
        }
    }
    if seen.len() as u128 != cells {
        return Err(format!(
            "gap: {} chunks cover {} of the {cells} grid cells",
            chunks.len(),
            seen.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn chunk(start: &[u64], stop: &[u64]) -> PlannedChunk {
        PlannedChunk {
            ticket: vec![1],
            bounds: Region::new(start.to_vec(), stop.to_vec()),
        }
    }

    fn grid(shape: &[u64], step: &[u64]) -> Vec<PlannedChunk> {
        let mut out = Vec::new();
        let mut y = 0;
        while y < shape[0] {
            let mut x = 0;
            while x < shape[1] {
                out.push(chunk(
                    &[y, x],
                    &[(y + step[0]).min(shape[0]), (x + step[1]).min(shape[1])],
                ));
                x += step[1];
            }
            y += step[0];
        }
        out
    }

    #[test]
    fn regular_and_ragged_grids_tile() {
        check_tiling(&[48, 64], &grid(&[48, 64], &[16, 16])).unwrap();
        check_tiling(&[50, 70], &grid(&[50, 70], &[16, 32])).unwrap();
        check_tiling(&[5], &[chunk(&[0], &[5])]).unwrap();
        check_tiling(&[0, 4], &[]).unwrap();
    }

    #[test]
    fn gaps_are_refused() {
        let mut chunks = grid(&[32, 32], &[16, 16]);
        chunks.remove(3);
        let err = check_tiling(&[32, 32], &chunks).unwrap_err();
        assert!(err.contains("gap: 3 chunks cover 3 of the 4"), "{err}");
        let err = check_tiling(&[32, 40], &grid(&[32, 32], &[16, 16])).unwrap_err();
        assert!(err.contains("no chunk reaches the end 40"), "{err}");
        let err = check_tiling(&[4], &[chunk(&[1], &[4])]).unwrap_err();
        assert!(err.contains("no chunk starts at 0"), "{err}");
        let err = check_tiling(&[4], &[]).unwrap_err();
        assert!(err.contains("gap on axis 0"), "{err}");
    }

    #[test]
    fn overlaps_are_refused() {
        let mut chunks = grid(&[32, 32], &[16, 16]);
        chunks.push(chunk(&[0, 0], &[16, 16]));
        let err = check_tiling(&[32, 32], &chunks).unwrap_err();
        assert!(err.contains("overlap"), "{err}");
        let chunks = vec![chunk(&[0], &[10]), chunk(&[5], &[20])];
        let err = check_tiling(&[20], &chunks).unwrap_err();
        assert!(err.contains("spans several grid cells"), "{err}");
    }

    fn info(
        shape: &[i64],
        slice_hint: Option<(&[i64], &[i64])>,
        chunks: &[PlannedChunk],
        schema: arrow_schema::Schema,
    ) -> FlightInfo {
        use arrow_flight::{FlightDescriptor, FlightEndpoint, Ticket};
        let descriptor = TensorDescriptor {
            array_id: "img".to_string(),
            shape: shape.to_vec(),
            dtype: "|u1".to_string(),
            slice_hint: slice_hint.map(|(start, stop)| tessera_proto::pb::SliceHint {
                start: start.to_vec(),
                stop: stop.to_vec(),
            }),
            ..Default::default()
        };
        let mut info = FlightInfo::new()
            .try_with_schema(&schema)
            .unwrap()
            .with_descriptor(FlightDescriptor::new_cmd(descriptor.encode_to_vec()));
        for c in chunks.iter().rev() {
            let bounds = ChunkBounds {
                start: c.bounds.start.iter().map(|&v| v as i64).collect(),
                stop: c.bounds.stop.iter().map(|&v| v as i64).collect(),
            };
            info = info.with_endpoint(
                FlightEndpoint::new()
                    .with_ticket(Ticket::new(c.ticket.clone()))
                    .with_app_metadata(bounds.encode_to_vec()),
            );
        }
        info
    }

    #[test]
    fn snapped_reply_is_cropped_back_to_the_request() {
        // biopb's worked example: 64x64, 16x16 grid, request [3,5]..[40,50].
        let chunks = grid(&[48, 64], &[16, 16]);
        let reply = info(
            &[48, 64],
            Some((&[0, 0], &[48, 64])),
            &chunks,
            tessera_proto::plan_schema(),
        );
        let requested = Region::new(vec![3, 5], vec![40, 50]);
        let plan = plan_from_info(&reply, "img", Some(&requested), &[]).unwrap();
        assert_eq!(plan.shape, vec![48, 64]);
        assert_eq!(plan.crop, requested);
        assert_eq!(plan.output_shape(), vec![37, 45]);
        assert_eq!(plan.chunks.len(), 12);
        assert_eq!(plan.chunks[0].bounds.start, vec![0, 0]);
        assert_eq!(plan.needed_chunks().count(), 12);

        // A realized start past 0 shifts the crop.
        let chunks = grid(&[32, 64], &[16, 16]);
        let reply = info(
            &[32, 64],
            Some((&[16, 0], &[48, 64])),
            &chunks,
            tessera_proto::plan_schema(),
        );
        let requested = Region::new(vec![20, 5], vec![33, 50]);
        let plan = plan_from_info(&reply, "img", Some(&requested), &[]).unwrap();
        assert_eq!(plan.crop, Region::new(vec![4, 5], vec![17, 50]));
        assert_eq!(plan.needed_chunks().count(), 8);
    }

    #[test]
    fn reply_not_containing_the_request_is_refused() {
        let chunks = grid(&[16, 16], &[16, 16]);
        let reply = info(
            &[16, 16],
            Some((&[16, 0], &[32, 16])),
            &chunks,
            tessera_proto::plan_schema(),
        );
        let requested = Region::new(vec![3, 0], vec![20, 16]);
        let err = plan_from_info(&reply, "img", Some(&requested), &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("does not contain the requested [3, 20)"),
            "{err}"
        );
    }

    #[test]
    fn wire_protocol_stamp_is_required() {
        let chunks = grid(&[16, 16], &[16, 16]);
        let bare = info(&[16, 16], None, &chunks, tessera_proto::chunk_schema());
        let err = plan_from_info(&bare, "img", None, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no 'chunk_wire_protocol' key"), "{err}");
        let stamped = tessera_proto::chunk_schema()
            .with_metadata([(CHUNK_WIRE_PROTOCOL_KEY.to_string(), "7".to_string())].into());
        let wrong = info(&[16, 16], None, &chunks, stamped);
        let err = plan_from_info(&wrong, "img", None, &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("wire protocol \"7\""), "{err}");
    }

    #[test]
    fn out_of_range_and_empty_chunks_are_refused() {
        let err = check_tiling(&[8], &[chunk(&[0], &[9])]).unwrap_err();
        assert!(err.contains("outside"), "{err}");
        let err = check_tiling(&[8], &[chunk(&[0], &[8]), chunk(&[3], &[3])]).unwrap_err();
        assert!(err.contains("empty"), "{err}");
        let err = check_tiling(&[8, 8], &[chunk(&[0], &[8])]).unwrap_err();
        assert!(err.contains("rank"), "{err}");
    }
}
