//! A Zarr array (v2 or v3) in an object store as a [`Source`], read through zarrs on
//! zarrs_object_store's adapter: the array's objects under its root, each chunk (or shard
//! part) a request. The same codec and dtype checks as a store on disk refuse what is not
//! served, by name.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use serde_json::{Map, Value, json};
use zarrs::array::{Array, ArraySubset, CodecOptions};
use zarrs::storage::WritableStorageTraits;
use zarrs::storage::storage_adapter::async_to_sync::{
    AsyncToSyncBlockOn, AsyncToSyncStorageAdapter,
};
use zarrs::storage::store::MemoryStore;
use zarrs_object_store::AsyncObjectStore;

use crate::content_version::{ContentVersion, FileVersion};
use crate::objstore::client::Client;
use crate::objstore::error::ObjectStoreError;
use crate::source::npy::{Dtype, Limits};
use crate::source::zarr::{Dataset, check_metadata, dtype_of_name};
use crate::source::{Source, SourceError, SourceErrorKind};

/// How zarrs' synchronous API waits for the adapter's requests: on the client's runtime.
#[derive(Debug)]
pub struct BlockOn(Client);

impl AsyncToSyncBlockOn for BlockOn {
    fn block_on<F: core::future::Future>(&self, future: F) -> F::Output {
        self.0.block_on(future)
    }
}

/// The storage zarrs reads an object-store array through.
type Storage =
    AsyncToSyncStorageAdapter<AsyncObjectStore<PrefixStore<Arc<dyn ObjectStore>>>, BlockOn>;

/// One Zarr array in an object store.
pub struct ZarrObject {
    client: Client,
    /// The key prefix of its objects (`""`: the bucket's root).
    root: String,
    url: PathBuf,
    /// The key of its metadata document (`.zarray` or `zarr.json`).
    metadata_key: ObjectPath,
    array: Array<Storage>,
    shape: Vec<u64>,
    dtype: Dtype,
    native_chunk: Vec<u64>,
    zarr_format: u8,
    version: FileVersion,
    options: CodecOptions,
}

impl std::fmt::Debug for ZarrObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZarrObject")
            .field("url", &self.url)
            .field("shape", &self.shape)
            .field("dtype", &self.dtype)
            .finish_non_exhaustive()
    }
}

impl ZarrObject {
    /// Opens the array at `root` (v2 when `v2`), its version `version`; `Ok(None)` when the
    /// root's `zarr.json` is a group's (its arrays are sources of their own). Blocking.
    pub fn open(
        client: &Client,
        root: &str,
        v2: bool,
        version: FileVersion,
        limits: &Limits,
    ) -> Result<Option<ZarrObject>, ObjectStoreError> {
        let (metadata_key, doc) = metadata_document(client, root, v2)?;
        if !v2 && doc.get("node_type").and_then(Value::as_str) == Some("group") {
            return Ok(None);
        }
        Self::open_with(client, root, v2, metadata_key, &doc, version, limits).map(Some)
    }

    /// Opens the array at `root` whose metadata document, read from `metadata_key`, is
    /// `doc`. Blocking.
    pub fn open_with(
        client: &Client,
        root: &str,
        v2: bool,
        metadata_key: ObjectPath,
        doc: &Value,
        version: FileVersion,
        limits: &Limits,
    ) -> Result<ZarrObject, ObjectStoreError> {
        let url = client.address().url_of(root);
        let refuse = |why: String| ObjectStoreError::Refused {
            url: url.clone(),
            why,
        };
        check_metadata(v2, doc, Path::new(&url)).map_err(|e| refuse(e.to_string()))?;
        let prefixed = PrefixStore::new(client.store(), root);
        let storage = AsyncToSyncStorageAdapter::new(
            Arc::new(AsyncObjectStore::new(prefixed)),
            BlockOn(client.clone()),
        );
        let array = Array::open(Arc::new(storage), "/").map_err(|e| refuse(e.to_string()))?;
        let name = array
            .data_type()
            .name(zarrs::plugin::ZarrVersion::V3)
            .map(|n| n.to_string())
            .unwrap_or_default();
        let dtype = dtype_of_name(&name)
            .and_then(|d| Dtype::parse(d).ok())
            .ok_or_else(|| refuse(format!("its data type '{name}' is not served")))?;
        let shape = array.shape().to_vec();
        let elements = shape.iter().fold(1u64, |a, d| a.saturating_mul(*d));
        let bytes = elements.saturating_mul(dtype.itemsize as u64);
        if elements > limits.max_elements || bytes > limits.max_bytes {
            return Err(refuse(format!(
                "its shape {shape:?} is {bytes} bytes, more than this server serves"
            )));
        }
        let origin = vec![0; shape.len()];
        let native_chunk = array
            .chunk_shape(&origin)
            .map(|c| c.iter().map(|n| n.get()).collect())
            .map_err(|e| refuse(format!("its chunk grid is not regular: {e}")))?;
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(ZarrObject {
            client: client.clone(),
            root: root.to_string(),
            url: PathBuf::from(url),
            metadata_key,
            array,
            shape,
            dtype,
            native_chunk,
            zarr_format: if v2 { 2 } else { 3 },
            version,
            options: CodecOptions::default().with_concurrent_target(threads),
        })
    }

    /// The array's own axis names (v3 `dimension_names`, or v2 `_ARRAY_DIMENSIONS`).
    fn dimension_names(&self) -> Option<Vec<String>> {
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
        names.filter(|n| n.len() == self.shape.len())
    }

    /// The array over the chunks (or shards) `subset` touches, every one fetched first, all
    /// at once (the bucket's client bounds the requests in flight), into memory: zarrs
    /// then decodes without waiting on the store. Read through the adapter, zarrs would
    /// wait on one request per decoding thread, a round trip each (docs/decisions/0037).
    fn fetch(&self, subset: &ArraySubset) -> Result<Array<MemoryStore>, SourceError> {
        let mut keys = Vec::new();
        if let Some(chunks) = self
            .array
            .chunks_in_array_subset(subset)
            .map_err(|e| self.failure(e.to_string()))?
        {
            for indices in &chunks.indices() {
                keys.push(self.array.chunk_key(&indices));
            }
        }
        let paths: Vec<ObjectPath> = keys
            .iter()
            .map(|k| ObjectPath::from(join(&self.root, k.as_str())))
            .collect();
        let fetched = self
            .client
            .get_all(&paths)
            .map_err(|e| e.to_source_error())?;
        let memory = MemoryStore::new();
        for (key, bytes) in keys.iter().zip(fetched) {
            if let Some(bytes) = bytes {
                memory
                    .set(key, bytes)
                    .map_err(|e| self.failure(e.to_string()))?;
            }
        }
        Array::new_with_metadata(Arc::new(memory), "/", self.array.metadata().clone())
            .map_err(|e| self.failure(e.to_string()))
    }

    /// Why a read failed: the store is unreachable (one look at the metadata document tells),
    /// or zarrs' own error, naming the array.
    fn failure(&self, what: String) -> SourceError {
        match self.client.head(&self.metadata_key) {
            Err(err) if err.is_unreachable() => err.to_source_error(),
            Err(err @ ObjectStoreError::Missing { .. }) => SourceError::new(
                SourceErrorKind::Changed,
                format!("{}: {what} ({err})", self.url.display()),
            ),
            _ => SourceError::new(
                SourceErrorKind::Failed,
                format!(
                    "Zarr array {} could not be read: {what}",
                    self.url.display()
                ),
            ),
        }
    }
}

/// The key of the metadata document of the node at `root` (`.zarray` when `v2`, else
/// `zarr.json`) and the document. Blocking.
pub fn metadata_document(
    client: &Client,
    root: &str,
    v2: bool,
) -> Result<(ObjectPath, Value), ObjectStoreError> {
    document(client, root, if v2 { ".zarray" } else { "zarr.json" })
}

/// The key of `name` under `root` (`""`: the bucket's root).
fn join(root: &str, name: &str) -> String {
    if root.is_empty() {
        name.to_string()
    } else {
        format!("{root}/{name}")
    }
}

/// The key of the JSON document `name` of the node at `root`, and the document. Blocking.
pub fn document(
    client: &Client,
    root: &str,
    name: &str,
) -> Result<(ObjectPath, Value), ObjectStoreError> {
    let key = ObjectPath::from(join(root, name));
    let bytes = client.get(&key)?;
    let doc = serde_json::from_slice(&bytes).map_err(|e| ObjectStoreError::Refused {
        url: client.address().url_of(key.as_ref()),
        why: format!("it is not JSON: {e}"),
    })?;
    Ok((key, doc))
}

impl Dataset for ZarrObject {
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
        self.format_metadata()
    }

    fn read(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), SourceError> {
        self.read_region(start, stop, out)
    }

    /// The version the image was listed at (every object under its root).
    fn image_version(&self) -> ContentVersion {
        ContentVersion::File(self.version)
    }

    fn is_resident(&self) -> bool {
        false
    }

    /// A change is seen at the next listing (docs/decisions/0037), not per request.
    fn check_image(&self) -> Result<(), SourceError> {
        Ok(())
    }
}

impl Source for ZarrObject {
    fn format(&self) -> &'static str {
        "zarr"
    }

    fn path(&self) -> &Path {
        &self.url
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
        ContentVersion::File(self.version)
    }

    fn dim_labels(&self) -> Option<Vec<String>> {
        self.dimension_names()
    }

    fn format_metadata(&self) -> Map<String, Value> {
        let mut map = Map::new();
        map.insert("zarr_format".into(), json!(self.zarr_format));
        map.insert("zarr_chunks".into(), json!(self.native_chunk));
        if !self.array.attributes().is_empty() {
            map.insert(
                "attributes".into(),
                Value::Object(self.array.attributes().clone()),
            );
        }
        map
    }

    fn is_resident(&self) -> bool {
        false
    }

    fn read_region(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), SourceError> {
        let ranges: Vec<std::ops::Range<u64>> =
            start.iter().zip(stop).map(|(a, b)| *a..*b).collect();
        let subset = ArraySubset::new_with_ranges(&ranges);
        let fetched = self.fetch(&subset)?;
        let shape: Vec<u64> = start.iter().zip(stop).map(|(a, b)| b - a).collect();
        let mut target =
            crate::sys::decode_target(out, self.dtype.itemsize, &shape).ok_or_else(|| {
                self.failure(format!(
                    "the buffer for the region {start:?}..{stop:?} is not its size"
                ))
            })?;
        fetched
            .retrieve_array_subset_into_opt(&subset, (&mut target).into(), &self.options)
            .map_err(|e| self.failure(e.to_string()))?;
        Ok(())
    }
}
