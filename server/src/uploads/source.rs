//! An upload as a [`Source`]: it describes itself from its record, keeps its chunks
//! encoded in its own store ([`HeldChunks`]: served as the client wrote them, a cell never
//! sent reads as zeros), and reads a region by cutting it out of those chunks.

use std::path::Path;
use std::sync::Arc;

use tessera_segments::ipc::DATA_BODY_OFFSET;

use super::{State, Upload, UploadError, zeros};
use crate::chunks::EncodedChunk;
use crate::grid::Region;
use crate::grid::chunk_id::{ChunkId, ContentVersion};
use crate::source::meta::SourceMeta;
use crate::source::npy::Dtype;
use crate::source::origin::Origin;
use crate::source::registry::Tensor;
use crate::source::{
    HeldChunk, HeldChunks, HeldLocation, Scaling, Source, SourceError, SourceErrorKind,
};

impl From<UploadError> for SourceError {
    fn from(err: UploadError) -> SourceError {
        let kind = match &err {
            // A full state directory: retry once there is room (as the upload calls say).
            UploadError::Data { source, .. } if source.is_disk_full() => SourceErrorKind::Busy,
            UploadError::Manifest(source) if source.is_disk_full() => SourceErrorKind::Busy,
            UploadError::Data { .. } | UploadError::Manifest(_) | UploadError::Io { .. } => {
                SourceErrorKind::Failed
            }
            _ => SourceErrorKind::Refused,
        };
        SourceError::new(kind, err)
    }
}

impl Upload {
    /// The upload as a served tensor: one grid for both routes (the cells its chunks were
    /// written as), its own labels, no supplied metadata; served like a configured source of
    /// the server's own state directory.
    pub fn tensor(self: &Arc<Self>) -> Tensor {
        let array_id = self.array_id();
        let source_id = array_id
            .split_once('/')
            .map_or_else(|| array_id.clone(), |(s, _)| s.to_string());
        Tensor {
            source_id,
            array_id,
            source: self.clone(),
            grid: self.grid.clone(),
            mapped_grid: self.grid.clone(),
            dim_labels: self.dim_labels(),
            version: self.version,
            origin: Origin::Configured,
            meta: SourceMeta::default(),
        }
    }

    /// The cell a ticket of this upload names, checked for `call`: this upload (not an
    /// earlier one of the same name), full resolution, a cell of its grid.
    pub(super) fn cell_of(&self, call: &'static str, id: &ChunkId) -> Result<u64, UploadError> {
        if id.version() != self.version {
            return Err(UploadError::invalid(
                call,
                format!(
                    "the ticket is of an earlier upload named '{}'; plan this one again",
                    id.array_id()
                ),
            ));
        }
        if id.scale().is_some() {
            return Err(UploadError::invalid(
                call,
                format!(
                    "scaled chunks of the upload '{}' are not served",
                    id.array_id()
                ),
            ));
        }
        self.grid.cell_index(id.region()).ok_or_else(|| {
            UploadError::invalid(
                call,
                format!(
                    "the ticket's region {:?}..{:?} is not a chunk of '{}'",
                    id.region().start,
                    id.region().stop,
                    id.array_id()
                ),
            )
        })
    }

    /// The cell a read ticket names, of a READY upload.
    pub(crate) fn readable_cell(&self, id: &ChunkId) -> Result<u64, UploadError> {
        let cell = self.cell_of("read", id)?;
        let (state, detail) = {
            let record = self.record.lock();
            (record.state, record.reason.clone())
        };
        if state != State::Ready {
            return Err(UploadError::NotReadable {
                array_id: id.array_id().to_string(),
                state,
                detail,
            });
        }
        Ok(cell)
    }

    fn missing(call: &'static str, id: &ChunkId) -> UploadError {
        UploadError::invalid(
            call,
            format!("a chunk of '{}' is missing from its store", id.array_id()),
        )
    }

    /// The chunk's IPC message (do_get): the bytes sent, or zeros built in memory for a
    /// cell never sent. Blocking.
    pub(crate) fn read_chunk(&self, id: &ChunkId) -> Result<EncodedChunk, UploadError> {
        let cell = self.readable_cell(id)?;
        let Some(key) = self.cells.lock().get(&cell).cloned() else {
            let region = id.region();
            let bytes = region
                .num_elements()
                .unwrap_or(u64::MAX)
                .saturating_mul(self.dtype.itemsize as u64);
            return zeros::zeros_message(&id.encode(), &self.meta_of(region), bytes).map_err(|e| {
                UploadError::invalid(
                    "read",
                    format!("the zero chunk of '{}': {e}", id.array_id()),
                )
            });
        };
        let entry = self
            .data()?
            .read(&key)
            .map_err(|source| UploadError::Data {
                array_id: id.array_id().to_string(),
                source,
            })?
            .ok_or_else(|| Self::missing("read", id))?;
        Ok(EncodedChunk {
            header: entry.header,
            body: entry.body,
        })
    }

    /// Where the chunk lives (chunk_locate), or that a cell never sent lives in no file (its
    /// zeros are not stored: the client reads them with do_get). Blocking.
    fn locate_chunk(&self, id: &ChunkId) -> Result<HeldLocation, UploadError> {
        let cell = self.readable_cell(id)?;
        let Some(key) = self.cells.lock().get(&cell).cloned() else {
            return Ok(HeldLocation::NeverSent);
        };
        self.data()?
            .locate(&key)
            .map(HeldLocation::Located)
            .ok_or_else(|| Self::missing("chunk_locate", id))
    }
}

impl std::fmt::Debug for Upload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upload")
            .field("array_id", &self.array_id())
            .field("version", &self.version)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl HeldChunks for Upload {
    fn read(&self, id: &ChunkId) -> Result<HeldChunk, SourceError> {
        let chunk = self.read_chunk(id)?;
        Ok(HeldChunk {
            header: chunk.header,
            body: chunk.body,
        })
    }

    fn locate(&self, id: &ChunkId) -> Result<HeldLocation, SourceError> {
        Ok(self.locate_chunk(id)?)
    }
}

impl Source for Upload {
    fn format(&self) -> &'static str {
        "upload"
    }

    fn path(&self) -> &Path {
        self.data_dir()
    }

    fn shape(&self) -> &[u64] {
        self.grid.shape()
    }

    fn dtype(&self) -> &Dtype {
        &self.dtype
    }

    fn version(&self) -> ContentVersion {
        self.version
    }

    fn dim_labels(&self) -> Option<Vec<String>> {
        Some(Upload::dim_labels(self))
    }

    /// A `zarr://` upload's `zarr_store`: the absolute path of its Zarr v2 store, for a
    /// user to open or copy (docs/decisions/0031).
    fn format_metadata(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut map = serde_json::Map::new();
        if let Some(path) = self.zarr_path() {
            map.insert(
                "zarr_store".to_string(),
                path.to_string_lossy().into_owned().into(),
            );
        }
        map
    }

    fn scaling(&self) -> Scaling {
        Scaling::FullOnly {
            what: "uploaded tensors",
        }
    }

    /// Cuts the region out of the chunks of the cells it touches (a cell never sent
    /// reads as zeros): one copy per chunk part, into `out`. A READY upload only.
    fn read_region(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), SourceError> {
        let region = Region::new(start.to_vec(), stop.to_vec());
        let itemsize = self.dtype.itemsize;
        let refuse = |reason: String| SourceError::from(UploadError::invalid("read", reason));
        let needed = region
            .num_elements()
            .and_then(|n| usize::try_from(n.saturating_mul(itemsize as u64)).ok());
        if needed != Some(out.len()) || !Region::whole(self.shape()).contains(&region) {
            return Err(refuse(format!(
                "region {start:?}..{stop:?} of '{}' does not fit it or its {} byte buffer",
                self.array_id(),
                out.len()
            )));
        }
        out.fill(0);
        let cells = self
            .grid
            .cells(&region)
            .map_err(|e| refuse(format!("region of '{}': {e}", self.array_id())))?;
        for cell in cells {
            let id = ChunkId::new(self.array_id(), self.version, cell.clone())
                .map_err(|e| refuse(e.to_string()))?;
            let chunk = self.read_chunk(&id)?;
            copy_overlap(&chunk, &cell, &region, itemsize, out)
                .ok_or_else(|| refuse(format!("a chunk of '{}' is malformed", id.array_id())))?;
        }
        Ok(())
    }

    fn held_chunks(&self) -> Option<&dyn HeldChunks> {
        Some(self)
    }

    fn upload_status(&self) -> Option<tessera_proto::pb::UploadStatus> {
        Some(self.status())
    }

    fn ttl_seconds(&self) -> Option<u32> {
        Upload::ttl_seconds(self)
    }
}

/// Copies the part of `cell` inside `region` from the chunk's values (at
/// [`DATA_BODY_OFFSET`] of its body) into `out`, the region's C-order buffer: one copy per
/// run along the last axis. `None` when the body is shorter than the cell.
fn copy_overlap(
    chunk: &EncodedChunk,
    cell: &Region,
    region: &Region,
    itemsize: usize,
    out: &mut [u8],
) -> Option<()> {
    let start = usize::try_from(DATA_BODY_OFFSET).ok()?;
    let cell_bytes = usize::try_from(cell.num_elements()?)
        .ok()?
        .checked_mul(itemsize)?;
    let values = chunk.body.get(start..start.checked_add(cell_bytes)?)?;
    let overlap = cell.intersect(region)?;
    let in_cell = overlap.relative_to(cell)?;
    let in_region = overlap.relative_to(region)?;
    let extent = overlap.shape();
    let rank = extent.len();
    let run = usize::try_from(extent[rank - 1]).ok()? * itemsize;
    let mut index = vec![0u64; rank];
    loop {
        let from = offset_of(&in_cell.start, &index, &cell.shape(), itemsize)?;
        let to = offset_of(&in_region.start, &index, &region.shape(), itemsize)?;
        out.get_mut(to..to + run)?
            .copy_from_slice(values.get(from..from + run)?);
        // The next row: the odometer over every axis but the last.
        let mut axis = rank - 1;
        loop {
            if axis == 0 {
                return Some(());
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

/// The byte offset of element `base + index` in a C-order box of `shape`.
fn offset_of(base: &[u64], index: &[u64], shape: &[u64], itemsize: usize) -> Option<usize> {
    let mut element = 0u64;
    for ((&b, &i), &dim) in base.iter().zip(index).zip(shape) {
        element = element.checked_mul(dim)?.checked_add(b + i)?;
    }
    usize::try_from(element).ok()?.checked_mul(itemsize)
}
