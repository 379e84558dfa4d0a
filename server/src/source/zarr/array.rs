//! One Zarr array (v2 or v3) as a [`Source`]: zarrs decodes the chunks a region touches, and
//! the files it read are checked against the store's snapshot afterwards.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use zarrs::array::{Array, ArraySubset, CodecOptions};
use zarrs::filesystem::FilesystemStore;

use super::error::ZarrError;
use super::node::{check_array, dtype_of_name};
use super::version::Snapshot;
use crate::content_version::ContentVersion;
use crate::source::abstraction::{Source, SourceError, SourceErrorKind};
use crate::source::npy::{Dtype, Limits};

impl From<ZarrError> for SourceError {
    fn from(err: ZarrError) -> SourceError {
        let kind = match &err {
            ZarrError::Changed { .. } => SourceErrorKind::Changed,
            _ => SourceErrorKind::Failed,
        };
        SourceError::new(kind, err)
    }
}

/// An opened Zarr array.
pub struct ZarrArray {
    dir: PathBuf,
    array: Array<FilesystemStore>,
    shape: Vec<u64>,
    dtype: Dtype,
    native_chunk: Vec<u64>,
    /// The Zarr format version (2 or 3), as the metadata documents said at open.
    zarr_format: u8,
    /// The snapshot of the tree the array belongs to (its own, or its image's).
    snapshot: Arc<Snapshot>,
    /// The array's directory relative to the snapshot's root (`""` or `"0/"`).
    prefix: String,
    options: CodecOptions,
}

impl std::fmt::Debug for ZarrArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZarrArray")
            .field("dir", &self.dir)
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .finish_non_exhaustive()
    }
}

/// How many chunks one read decodes at once: the machine's cores, so a cell's chunks
/// decode in parallel without more threads than cores.
fn decode_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl ZarrArray {
    /// Opens the array at `dir`, a part of the tree `snapshot` was taken of, at `prefix`.
    pub fn open(
        dir: &Path,
        snapshot: Arc<Snapshot>,
        prefix: String,
        limits: &Limits,
    ) -> Result<ZarrArray, ZarrError> {
        check_array(dir)?;
        let store = FilesystemStore::new(dir).map_err(|e| ZarrError::Io {
            path: dir.to_path_buf(),
            what: "open the store",
            source: std::io::Error::other(e.to_string()),
        })?;
        let array = Array::open(Arc::new(store), "/").map_err(|source| ZarrError::Open {
            path: dir.to_path_buf(),
            source: Box::new(source),
        })?;
        let name = array
            .data_type()
            .name(zarrs::plugin::ZarrVersion::V3)
            .map(|n| n.to_string())
            .unwrap_or_default();
        let dtype = dtype_of_name(&name)
            .and_then(|d| Dtype::parse(d).ok())
            .ok_or_else(|| ZarrError::Dtype {
                path: dir.to_path_buf(),
                dtype: name.clone(),
            })?;
        let shape = array.shape().to_vec();
        let elements = shape.iter().fold(1u64, |a, d| a.saturating_mul(*d));
        let bytes = elements.saturating_mul(dtype.itemsize as u64);
        if elements > limits.max_elements || bytes > limits.max_bytes {
            return Err(ZarrError::TooLarge {
                path: dir.to_path_buf(),
                shape,
                bytes,
                limit: limits
                    .max_bytes
                    .min(limits.max_elements.saturating_mul(dtype.itemsize as u64)),
            });
        }
        let origin = vec![0; shape.len()];
        let native_chunk = array
            .chunk_shape(&origin)
            .map(|c| c.iter().map(|n| n.get()).collect())
            .map_err(|e| ZarrError::Metadata {
                path: dir.to_path_buf(),
                why: format!("its chunk grid is not regular: {e}"),
            })?;
        Ok(ZarrArray {
            dir: dir.to_path_buf(),
            array,
            shape,
            dtype,
            native_chunk,
            zarr_format: if dir.join(".zarray").is_file() { 2 } else { 3 },
            snapshot,
            prefix,
            options: CodecOptions::default().with_concurrent_target(decode_threads()),
        })
    }

    /// The array's own axis names (v3 `dimension_names`, or the v2 `_ARRAY_DIMENSIONS`
    /// attribute xarray writes), when every axis has one.
    pub fn dimension_names(&self) -> Option<Vec<String>> {
        if let Some(names) = self.array.dimension_names() {
            let names: Option<Vec<String>> = names
                .iter()
                .map(|n| n.as_ref().map(|s| s.to_string()))
                .collect();
            if let Some(names) = names.filter(|n| n.len() == self.shape.len()) {
                return Some(names);
            }
        }
        let names: Option<Vec<String>> = self
            .array
            .attributes()
            .get("_ARRAY_DIMENSIONS")
            .and_then(Value::as_array)
            .and_then(|listed| {
                listed
                    .iter()
                    .map(|v| v.as_str().map(str::to_string))
                    .collect()
            });
        names
            .filter(|n| n.len() == self.shape.len())
            .or_else(|| self.image_axes())
    }

    /// The axis names of the OME-Zarr image this array is a dataset of, if any.
    fn image_axes(&self) -> Option<Vec<String>> {
        let parent = self.dir.parent()?;
        let Some(super::node::Node::Group { image: Some(meta) }) = super::node::node_at(parent)
        else {
            return None;
        };
        super::image::axis_names(&meta.multiscales).filter(|n| n.len() == self.shape.len())
    }

    /// The array's user attributes.
    pub fn attributes(&self) -> &Map<String, Value> {
        self.array.attributes()
    }

    /// The files a read of `subset` touches, relative to the snapshot's root: the metadata
    /// documents and the chunk (or shard) files, as zarrs' own chunk grid enumerates them.
    fn touched(&self, subset: &ArraySubset) -> Vec<String> {
        let mut keys: Vec<String> = [".zarray", ".zattrs", "zarr.json"]
            .iter()
            .map(|doc| format!("{}{doc}", self.prefix))
            .collect();
        if let Ok(Some(chunks)) = self.array.chunks_in_array_subset(subset) {
            for indices in &chunks.indices() {
                keys.push(format!("{}{}", self.prefix, self.array.chunk_key(&indices)));
            }
        }
        keys
    }

    /// Asks the kernel to read the files at `keys` now, all at once: zarrs then finds them
    /// in the page cache instead of reading them one by one as it decodes (a cold cell of
    /// many chunk files waited on each in turn). Files that are not there are passed over.
    fn prefetch(&self, keys: &[String]) {
        for key in keys {
            if let Ok(file) = std::fs::File::open(self.snapshot.path_of(key)) {
                let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::WillNeed);
            }
        }
    }

    /// Starts reading the chunk files a read of `start..stop` touches.
    fn prefetch_region(&self, start: &[u64], stop: &[u64]) {
        let ranges: Vec<std::ops::Range<u64>> =
            start.iter().zip(stop).map(|(a, b)| *a..*b).collect();
        self.prefetch(&self.touched(&ArraySubset::new_with_ranges(&ranges)));
    }

    /// The keys of `metadata_json` this array adds.
    pub fn metadata(&self) -> Map<String, Value> {
        let mut map = Map::new();
        map.insert("zarr_format".into(), json!(self.zarr_format));
        map.insert("zarr_chunks".into(), json!(self.native_chunk));
        if !self.array.attributes().is_empty() {
            map.insert(
                "attributes".into(),
                Value::Object(self.attributes().clone()),
            );
        }
        map
    }

    /// Reads `start..stop` into `out` (C order), then checks the files it touched.
    pub fn read_into(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), ZarrError> {
        let ranges: Vec<std::ops::Range<u64>> =
            start.iter().zip(stop).map(|(a, b)| *a..*b).collect();
        let subset = ArraySubset::new_with_ranges(&ranges);
        let failed = |source| ZarrError::Read {
            path: self.dir.clone(),
            start: start.to_vec(),
            stop: stop.to_vec(),
            source: Box::new(source),
        };
        let touched = self.touched(&subset);
        self.prefetch(&touched);
        let shape: Vec<u64> = start.iter().zip(stop).map(|(a, b)| b - a).collect();
        let mut target =
            crate::sys::decode_target(out, self.dtype.itemsize, &shape).ok_or_else(|| {
                ZarrError::Decoded {
                    path: self.dir.clone(),
                    why: format!("the buffer for the region {start:?}..{stop:?} is not its size"),
                }
            })?;
        self.array
            .retrieve_array_subset_into_opt(&subset, (&mut target).into(), &self.options)
            .map_err(failed)?;
        self.snapshot.check(touched.iter().map(String::as_str))
    }

    /// Refuses with [`ZarrError::Changed`] when a read found a file of the store changed
    /// or a metadata document differs now (the chunk files are compared by reads and by the
    /// watcher's rescan, not here: this runs on every request).
    pub fn check_current(&self) -> Result<(), ZarrError> {
        if self.snapshot.found_changed() {
            return Err(ZarrError::Changed {
                path: self.dir.clone(),
                file: "a chunk file".to_string(),
            });
        }
        let docs = [".zarray", ".zattrs", "zarr.json"].map(|d| format!("{}{d}", self.prefix));
        self.snapshot.check(docs.iter().map(String::as_str))
    }
}

impl super::image::Dataset for ZarrArray {
    fn shape(&self) -> &[u64] {
        &self.shape
    }

    fn dtype(&self) -> &Dtype {
        &self.dtype
    }

    fn native_chunk(&self) -> &[u64] {
        &self.native_chunk
    }

    fn metadata(&self) -> Map<String, Value> {
        ZarrArray::metadata(self)
    }

    fn read(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), SourceError> {
        Ok(self.read_into(start, stop, out)?)
    }

    fn prefetch(&self, start: &[u64], stop: &[u64]) {
        self.prefetch_region(start, stop);
    }

    fn image_version(&self) -> ContentVersion {
        ContentVersion::File(self.snapshot.version())
    }

    fn is_resident(&self) -> bool {
        self.snapshot.path_of("").is_dir()
    }

    /// The array is current, and so are the image group's own documents (the snapshot's
    /// root is the image's).
    fn check_image(&self) -> Result<(), SourceError> {
        self.check_current()?;
        Ok(self.snapshot.check([".zattrs", ".zgroup", "zarr.json"])?)
    }
}

impl Source for ZarrArray {
    fn format(&self) -> &'static str {
        "zarr"
    }

    fn path(&self) -> &Path {
        &self.dir
    }

    fn shape(&self) -> &[u64] {
        &self.shape
    }

    fn dtype(&self) -> &Dtype {
        &self.dtype
    }

    fn native_chunk(&self) -> Option<Vec<u64>> {
        Some(self.native_chunk.clone())
    }

    fn version(&self) -> ContentVersion {
        ContentVersion::File(self.snapshot.version())
    }

    fn dim_labels(&self) -> Option<Vec<String>> {
        self.dimension_names()
    }

    fn format_metadata(&self) -> Map<String, Value> {
        self.metadata()
    }

    fn is_resident(&self) -> bool {
        self.dir.is_dir()
    }

    fn read_region(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), SourceError> {
        Ok(self.read_into(start, stop, out)?)
    }

    fn prefetch(&self, start: &[u64], stop: &[u64]) {
        self.prefetch_region(start, stop);
    }

    fn check_unchanged(&self) -> Result<(), SourceError> {
        Ok(self.check_current()?)
    }
}
