//! Uploads: tensors clients write with the biopb upload API (`add_tensor`, one DoPut per
//! chunk, `set_upload_status`), kept in the state directory's `uploads` part and read back
//! through the same plan, `chunk_locate` and `do_get` routes as sources
//! (docs/decisions/0019).
//!
//! ```text
//! uploads/manifest.redb        records and acknowledged chunks (manifest)
//! uploads/data/<uid:016x>/     one segment store per upload (data), removed on discard
//! uploads/zarr/<uid:016x>/     a `zarr://` upload's Zarr v2 store (zarr_store), removed on
//!                              discard
//! ```
//!
//! A chunk is acknowledged only after its bytes are fsynced in the upload's store and its
//! cell is committed to the manifest; a chunk written but not committed (a crash between
//! the two) is an orphan entry under a key nobody names, never read. So after a crash an
//! upload holds exactly the chunks whose ack was sent, and a READY one reads back exactly.

mod batch;
mod data;
mod error;
mod id;
mod limits;
mod manifest;
mod open;
mod record;
mod source;
mod zarr_store;
mod zeros;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arrow_array::RecordBatch;
use parking_lot::{Mutex, RwLock};
use tessera_proto::pb::{TensorDescriptor, UploadStatus};
use tessera_segments::EntryMeta;

pub use batch::arrow_type;
pub use data::ChunkData;
pub use error::UploadError;
pub use id::{SCRATCH_SOURCE_ID, is_label_set, is_upload_id};
pub use limits::{MAX_IN_FLIGHT_LIMIT, PUT_FRAMING_SLACK, PutPermit, UploadLimits};
pub use manifest::Manifest;
pub use record::{State, StoreFormat, UploadRecord};

use crate::grid::chunk_id::{ChunkId, ContentVersion, UploadVersion};
use crate::grid::{ChunkGrid, MAX_CHUNK_BYTES, Region};
use crate::source::npy::Dtype;
use limits::{InFlight, PUT_ROOM_WAIT};
use open::{DataSlot, OpenStores};
use record::{Move, Refusal};
use zarr_store::ZarrStore;

/// Largest tensor an upload may declare: 1 TiB.
pub const MAX_UPLOAD_BYTES: u64 = 1 << 40;

/// How long a discarded upload keeps its name at most (a tombstone stragglers can still
/// learn the reason from): its own lifetime when shorter, else one hour.
pub const TOMBSTONE_SECONDS: u64 = 3600;

/// How often the sweep looks for expired uploads and discarded storage.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Longest discard reason `set_upload_status` takes, in bytes: it travels back in the
/// `extra_info` of every later refusal, which gRPC clients cap at a few KiB of metadata.
pub const MAX_REASON_BYTES: usize = 1024;

/// Longest axis label `add_tensor` takes, in bytes.
pub const MAX_DIM_LABEL_BYTES: usize = 256;

/// Default most uploads one state directory holds (`upload_max_count`).
pub const DEFAULT_MAX_UPLOADS: usize = 4096;

/// Default most upload stores open at once (`upload_open_stores`).
pub const DEFAULT_OPEN_STORES: usize = 64;

/// The largest message the server decodes (`ops/daemon.rs`): a DoPut message carries one
/// chunk of an upload, so it bounds an upload's cells.
pub const MAX_PUT_MESSAGE_BYTES: u64 = 16 << 20;
/// Room in a DoPut message for what is not the chunk's values (descriptor, IPC header,
/// padding, metadata).
const PUT_MESSAGE_OVERHEAD: u64 = 64 << 10;
/// The largest cell of an upload: its values fit one DoPut message.
pub const MAX_UPLOAD_CHUNK_BYTES: u64 = MAX_PUT_MESSAGE_BYTES - PUT_MESSAGE_OVERHEAD;

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn unix_now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// One upload: its record, grid and stored chunks.
pub struct Upload {
    record: Mutex<UploadRecord>,
    grid: ChunkGrid,
    dtype: Dtype,
    version: ContentVersion,
    dir: PathBuf,
    slot: Arc<DataSlot>,
    stores: Arc<OpenStores>,
    /// Cell index → store key of every acknowledged chunk.
    cells: Mutex<HashMap<u64, Vec<u8>>>,
    /// Bytes of its chunk DoPuts being received.
    in_flight: InFlight,
    /// Discarded (its storage removed) but the manifest could not record it yet (a full
    /// disk): the sweep writes the record once it can.
    unsaved: AtomicBool,
    /// The Zarr v2 store of a `zarr://` upload.
    zarr: Option<ZarrStore>,
    /// A chunk was put in place in the Zarr store but its cell was not committed (the
    /// manifest failed): the store is made to hold exactly the acknowledged chunks before
    /// the upload is sealed.
    zarr_unsynced: AtomicBool,
}

impl Upload {
    fn new(
        record: UploadRecord,
        roots: &Roots,
        limits: &UploadLimits,
        stores: &Arc<OpenStores>,
    ) -> Result<Upload, String> {
        let dtype = Dtype::parse(&record.dtype).map_err(|e| e.to_string())?;
        let grid =
            ChunkGrid::with_chunk_shape(&record.shape, dtype.itemsize as u64, &record.chunk_shape)
                .map_err(|e| e.to_string())?;
        let zarr = match record.format {
            StoreFormat::Cache => None,
            StoreFormat::Zarr => {
                let name = id::name_of(&record.array_id);
                let store = ZarrStore::new(
                    &roots.zarr.join(format!("{:016x}", record.uid)),
                    name,
                    &record.shape,
                    &record.chunk_shape,
                    &dtype,
                    &record.dim_labels,
                )
                .map_err(|e| e.to_string())?;
                Some(store)
            }
        };
        let bytes = record.shape.iter().product::<u64>() * dtype.itemsize as u64;
        let version = ContentVersion::Upload(UploadVersion {
            uid: record.uid,
            size: bytes,
            created_ns: record.created_ns,
        });
        Ok(Upload {
            dir: roots.data.join(format!("{:016x}", record.uid)),
            slot: DataSlot::new(record.uid),
            stores: stores.clone(),
            record: Mutex::new(record),
            grid,
            dtype,
            version,
            cells: Mutex::new(HashMap::new()),
            in_flight: InFlight::new(
                limits.max_bytes_in_flight_per_upload,
                "one upload",
                "--max-upload-bytes-in-flight-per-upload, \
                 TESSERA_MAX_UPLOAD_BYTES_IN_FLIGHT_PER_UPLOAD, \
                 max_upload_bytes_in_flight_per_upload",
            ),
            unsaved: AtomicBool::new(false),
            zarr,
            zarr_unsynced: AtomicBool::new(false),
        })
    }

    /// The array id (`<source_id>/@fields/<name>`).
    pub fn array_id(&self) -> String {
        self.record.lock().array_id.clone()
    }

    /// The tensor's shape.
    pub fn shape(&self) -> &[u64] {
        self.grid.shape()
    }

    /// The numpy dtype string.
    pub fn dtype_str(&self) -> String {
        self.dtype.numpy_str()
    }

    /// Axis labels.
    pub fn dim_labels(&self) -> Vec<String> {
        self.record.lock().dim_labels.clone()
    }

    /// The one grid of the upload: every chunk is a cell of it, on both routes.
    pub fn grid(&self) -> &ChunkGrid {
        &self.grid
    }

    /// The content version every chunk id of this upload carries.
    pub fn version(&self) -> ContentVersion {
        self.version
    }

    /// The directory of its segment store.
    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    /// Where the Zarr v2 store of a `zarr://` upload is (the directory `zarr.open_array`
    /// opens); `None` for a `cache://` upload.
    pub fn zarr_path(&self) -> Option<&Path> {
        self.zarr.as_ref().map(ZarrStore::path)
    }

    /// Where it stands.
    pub fn state(&self) -> State {
        self.record.lock().state
    }

    /// The granted lifetime.
    pub fn ttl_seconds(&self) -> Option<u32> {
        self.record.lock().ttl_seconds
    }

    /// The `upload_status` answer.
    pub fn status(&self) -> UploadStatus {
        let record = self.record.lock();
        UploadStatus {
            state: record.state.wire(),
            expected_chunks: i64::try_from(self.grid.num_chunks()).unwrap_or(i64::MAX),
            uploaded_chunks: self.cells.lock().len() as i64,
            reason: record.reason.clone(),
        }
    }

    fn tensor_bytes(&self) -> u64 {
        self.version.size()
    }

    /// Its store, opened on demand (see [`open`]).
    fn data(&self) -> Result<Arc<ChunkData>, UploadError> {
        self.stores
            .get(&self.slot, &self.dir)
            .map_err(|source| UploadError::Data {
                array_id: self.array_id(),
                source,
            })
    }

    fn meta_of(&self, cell: &Region) -> EntryMeta {
        EntryMeta {
            shape: cell
                .start
                .iter()
                .zip(&cell.stop)
                .map(|(a, b)| (b - a) as i64)
                .collect(),
            dtype: self.dtype_str(),
        }
    }

    /// Closes and removes the stored bytes (the upload is discarded).
    /// Removing files needs no room, so this works on a full disk. The store stays closed
    /// while its directory goes.
    fn reclaim(&self) -> Result<bool, UploadError> {
        self.cells.lock().clear();
        let zarr_removed = match &self.zarr {
            Some(zarr) => remove_dir(zarr.root())?,
            None => false,
        };
        let data_removed = self
            .stores
            .close_then(&self.slot, || remove_dir(&self.dir))?;
        Ok(zarr_removed || data_removed)
    }

    /// Whether any of its storage is on disk.
    fn has_storage(&self) -> bool {
        self.dir.exists() || self.zarr.as_ref().is_some_and(|z| z.root().exists())
    }

    /// The acknowledged bytes of `cell` (the values, C order), read from its segment store.
    fn acked_bytes(&self, cell: &Region) -> Result<Vec<u8>, UploadError> {
        let array_id = self.array_id();
        let index = self.grid.cell_index(cell).ok_or_else(|| {
            UploadError::invalid("resync", format!("a cell of '{array_id}' is off its grid"))
        })?;
        let Some(key) = self.cells.lock().get(&index).cloned() else {
            return Err(UploadError::invalid(
                "resync",
                format!("a cell of '{array_id}' is not acknowledged"),
            ));
        };
        let len = cell
            .num_elements()
            .and_then(|n| usize::try_from(n.saturating_mul(self.dtype.itemsize as u64)).ok())
            .unwrap_or(usize::MAX);
        let entry = self
            .data()?
            .read(&key)
            .map_err(|source| UploadError::Data {
                array_id: array_id.clone(),
                source,
            })?
            .ok_or_else(|| {
                UploadError::invalid(
                    "resync",
                    format!("a chunk of '{array_id}' is missing from its store"),
                )
            })?;
        let start = tessera_segments::ipc::DATA_BODY_OFFSET as usize;
        entry
            .body
            .get(start..start.saturating_add(len))
            .map(<[u8]>::to_vec)
            .ok_or_else(|| {
                UploadError::invalid("resync", format!("a chunk of '{array_id}' is malformed"))
            })
    }

    /// Makes its Zarr store hold exactly its acknowledged chunks (see
    /// [`ZarrStore::resync`]). Blocking; reads every acknowledged chunk.
    fn resync_zarr(&self) -> Result<(), UploadError> {
        let Some(zarr) = &self.zarr else {
            return Ok(());
        };
        if !zarr.path().join(".zarray").exists() {
            // Removed from under the server: written again, then filled below.
            zarr.create().map_err(|source| UploadError::Data {
                array_id: self.array_id(),
                source: source.into(),
            })?;
        }
        let mut acked: Vec<Region> = self
            .cells
            .lock()
            .keys()
            .filter_map(|&i| self.grid.cell_at(i))
            .collect();
        acked.sort_by(|a, b| a.start.cmp(&b.start));
        zarr.resync(&acked, |cell| self.acked_bytes(cell))
            .map_err(|err| match err {
                zarr_store::ResyncError::Zarr(source) => UploadError::Data {
                    array_id: self.array_id(),
                    source: source.into(),
                },
                zarr_store::ResyncError::Acked(err) => err,
            })?;
        self.zarr_unsynced.store(false, Ordering::Release);
        Ok(())
    }
}

/// Removes `dir` and what it holds; whether it was there.
fn remove_dir(dir: &Path) -> Result<bool, UploadError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(UploadError::Io {
            action: "remove",
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Where the uploads' bytes live: `uploads/data` (segment stores) and `uploads/zarr`
/// (the Zarr stores of `zarr://` uploads).
struct Roots {
    data: PathBuf,
    zarr: PathBuf,
}

/// What `add_tensor` needs to know of the served tensor a label set is added to.
pub struct Image {
    /// Its shape.
    pub shape: Vec<u64>,
    /// Its axis labels.
    pub dim_labels: Vec<String>,
}

/// Whether a label set of `shape` spans `image`: the image's axes at its lengths, the
/// channel axis (`c`) a singleton; the refusal says why not.
fn check_spans(id: &str, image_id: &str, image: &Image, shape: &[u64]) -> Result<(), String> {
    let spans = shape.len() == image.shape.len()
        && shape
            .iter()
            .zip(&image.shape)
            .zip(&image.dim_labels)
            .all(|((&s, &i), label)| {
                if label.eq_ignore_ascii_case("c") {
                    s == 1
                } else {
                    s == i
                }
            });
    if spans {
        return Ok(());
    }
    Err(format!(
        "'{id}': a label set has its image's axes at its image's lengths, the channel axis \
         'c' a singleton; shape {shape:?} does not span '{image_id}' ({:?}, axes {:?})",
        image.shape, image.dim_labels
    ))
}

/// A chunk named by a ticket, checked against its upload: the upload and the cell index.
pub struct ChunkTarget {
    /// The upload.
    pub upload: Arc<Upload>,
    /// The decoded chunk id.
    pub id: ChunkId,
    cell: u64,
}

impl ChunkTarget {
    /// The elements of the chunk's cell.
    pub fn elements(&self) -> u64 {
        // A cell of a grid under the 1 TiB tensor limit: its count always fits.
        self.id.region().num_elements().unwrap_or(u64::MAX)
    }

    /// The most bytes a DoPut of this chunk may send: the cell's values at the tensor's
    /// itemsize, a validity bitmap, and [`PUT_FRAMING_SLACK`] for the messages' metadata.
    pub fn put_bytes(&self) -> u64 {
        let elements = self.elements();
        elements
            .saturating_mul(self.upload.dtype.itemsize as u64)
            .saturating_add(elements.div_ceil(8))
            .saturating_add(PUT_FRAMING_SLACK)
    }
}

/// Every upload of one state directory.
pub struct Uploads {
    manifest: Manifest,
    roots: Roots,
    table: RwLock<HashMap<String, Arc<Upload>>>,
    /// Grid target for uploads whose requested chunk shape is not usable.
    target_chunk_bytes: u64,
    /// The longest lifetime of an upload to `scratch` (and of one there asking for none);
    /// `None`: no cap, an upload there lives as long as it asks.
    scratch_max_ttl: Option<u32>,
    last_uid: AtomicU64,
    /// The configured bounds.
    limits: UploadLimits,
    /// Bytes of chunk DoPuts being received, all uploads.
    in_flight: InFlight,
    /// Most uploads held at once (`upload_max_count`).
    max_uploads: usize,
    /// The open stores (at most `upload_open_stores`) and their one maintenance worker.
    stores: Arc<OpenStores>,
}

impl Uploads {
    /// Opens the uploads of the state directory part `dir` (manifest and data), removes
    /// the storage of discarded and orphaned uploads, discards what expired while the
    /// server was down, and starts the sweep. Uploads whose requested chunk shape cannot
    /// be used are cut on grids of about `target_chunk_bytes`; uploads to `scratch` live
    /// at most `scratch_max_ttl` (`upload_max_ttl`, `None` for no cap); `limits` bound
    /// their number, their open stores, their grids and the bytes of chunks being received.
    /// One thread sweeps and maintains every upload's store.
    pub fn open(
        dir: &Path,
        target_chunk_bytes: u64,
        scratch_max_ttl: Option<Duration>,
        limits: UploadLimits,
    ) -> Result<Arc<Uploads>, UploadError> {
        let data_root = dir.join("data");
        std::fs::create_dir_all(&data_root).map_err(|source| UploadError::Io {
            action: "create",
            path: data_root.clone(),
            source,
        })?;
        let zarr_root = dir.join("zarr");
        std::fs::create_dir_all(&zarr_root).map_err(|source| UploadError::Io {
            action: "create",
            path: zarr_root.clone(),
            source,
        })?;
        // Absolute, so the path `metadata_json` gives a user opens from anywhere.
        let zarr_root = std::fs::canonicalize(&zarr_root).unwrap_or(zarr_root);
        let roots = Roots {
            data: data_root,
            zarr: zarr_root,
        };
        let manifest = Manifest::open(&dir.join("manifest.redb"))?;
        let stores = OpenStores::new(limits.open_stores);
        let mut table = HashMap::new();
        let mut last_uid = 0;
        for (record, cells) in manifest.load()? {
            last_uid = last_uid.max(record.uid);
            let array_id = record.array_id.clone();
            let upload = match Upload::new(record, &roots, &limits, &stores) {
                Ok(upload) => upload,
                Err(reason) => {
                    tracing::error!(%array_id, %reason, "upload record cannot be served; left in the manifest");
                    continue;
                }
            };
            *upload.cells.lock() = cells;
            table.insert(array_id, Arc::new(upload));
        }
        let uploads = Arc::new(Uploads {
            manifest,
            roots,
            table: RwLock::new(table),
            target_chunk_bytes,
            scratch_max_ttl: scratch_max_ttl
                .map(|ttl| u32::try_from(ttl.as_secs()).unwrap_or(u32::MAX).max(1)),
            last_uid: AtomicU64::new(last_uid),
            limits,
            in_flight: InFlight::new(
                limits.max_bytes_in_flight,
                "the server",
                "--max-upload-bytes-in-flight, TESSERA_MAX_UPLOAD_BYTES_IN_FLIGHT, \
                 max_upload_bytes_in_flight",
            ),
            max_uploads: limits.max_uploads,
            stores: stores.clone(),
        });
        uploads.remove_orphan_dirs();
        uploads.check_chunks_present();
        uploads.resync_pending_zarr();
        uploads.sweep();
        let weak = Arc::downgrade(&uploads);
        std::thread::Builder::new()
            .name("tessera-uploads".to_string())
            .spawn(move || worker_loop(weak, stores))
            .map_err(|source| UploadError::Io {
                action: "start the sweep for",
                path: dir.to_path_buf(),
                source,
            })?;
        Ok(uploads)
    }

    /// Removes data and Zarr directories no live upload names (left by a crash
    /// mid-discard, or by an `add_tensor` whose record was never written).
    fn remove_orphan_dirs(&self) {
        let live: std::collections::HashSet<PathBuf> = self
            .table
            .read()
            .values()
            .filter(|u| u.state() != State::Discarded)
            .flat_map(|u| {
                let zarr = u.zarr.as_ref().map(|z| z.root().to_path_buf());
                std::iter::once(u.dir.clone()).chain(zarr)
            })
            .collect();
        let listed = [&self.roots.data, &self.roots.zarr]
            .into_iter()
            .filter_map(|root| std::fs::read_dir(root).ok())
            .flatten();
        for entry in listed.flatten() {
            let path = entry.path();
            if !live.contains(&path) {
                match std::fs::remove_dir_all(&path) {
                    Ok(()) => {
                        tracing::info!(dir = %path.display(), "removed the storage of a discarded upload")
                    }
                    Err(err) => {
                        tracing::warn!(dir = %path.display(), error = %err, "cannot remove the storage of a discarded upload")
                    }
                }
            }
        }
    }

    /// Checks each acknowledged chunk of every live upload is in its store (opening the
    /// stores one by one, within the open store cap). An upload whose storage is gone
    /// entirely was being discarded when the server stopped (the storage goes first): it is
    /// discarded.
    fn check_chunks_present(&self) {
        for upload in self.all() {
            if upload.state() == State::Discarded || upload.cells.lock().is_empty() {
                continue;
            }
            if !upload.dir.exists() {
                let array_id = upload.array_id();
                tracing::warn!(%array_id, "an upload's storage is gone: a discard did not finish before the server stopped; discarding it");
                let reason = "its storage was removed by a discard that had not been recorded when the server stopped";
                if let Err(err) = self.set_status(&array_id, State::Discarded, reason) {
                    tracing::warn!(%array_id, error = %err, "cannot discard an upload whose storage is gone");
                }
                continue;
            }
            match upload.data() {
                Ok(data) => {
                    let missing = upload
                        .cells
                        .lock()
                        .values()
                        .filter(|key| !data.contains(key))
                        .count();
                    if missing > 0 {
                        tracing::error!(array_id = %upload.array_id(), missing, "acknowledged upload chunks are missing from their store");
                    }
                }
                Err(err) => tracing::error!(error = %err, "cannot open an upload's store"),
            }
        }
    }

    /// Makes the Zarr store of every PENDING `zarr://` upload hold exactly its
    /// acknowledged chunks: the server may have stopped between a chunk file put in place
    /// and its cell's commit. A sealed upload needs none (it was synced before it was
    /// sealed, and takes no chunks since) beyond emptying `incoming/`; one that cannot be
    /// synced is discarded, since its store could no longer be trusted.
    fn resync_pending_zarr(&self) {
        for upload in self.all() {
            let Some(zarr) = &upload.zarr else {
                continue;
            };
            match upload.state() {
                State::Pending => {}
                State::Ready => {
                    if let Err(err) = zarr.clear_incoming() {
                        tracing::warn!(array_id = %upload.array_id(), error = %err, "cannot empty a Zarr upload's incoming folder");
                    }
                    continue;
                }
                State::Discarded => continue,
            }
            if let Err(err) = upload.resync_zarr() {
                let array_id = upload.array_id();
                tracing::error!(%array_id, error = %err, "cannot bring a Zarr upload's store in line with its acknowledged chunks; discarding it");
                let reason = format!("its Zarr store could not be checked after a restart: {err}");
                if let Err(err) = self.set_status(&array_id, State::Discarded, &reason) {
                    tracing::warn!(%array_id, error = %err, "cannot discard an upload");
                }
            }
        }
    }

    fn all(&self) -> Vec<Arc<Upload>> {
        self.table.read().values().cloned().collect()
    }

    /// The upload named `array_id`, in any state.
    pub fn get(&self, array_id: &str) -> Option<Arc<Upload>> {
        self.table.read().get(array_id).cloned()
    }

    /// The READY uploads, by array id (what ListFlights lists beside the sources).
    pub fn ready(&self) -> Vec<Arc<Upload>> {
        let mut out: Vec<Arc<Upload>> = self
            .all()
            .into_iter()
            .filter(|u| u.state() == State::Ready)
            .collect();
        out.sort_by_key(|u| u.array_id());
        out
    }

    fn next_uid(&self) -> u64 {
        let now = u64::try_from(unix_now_ns()).unwrap_or(0);
        let mut last = self.last_uid.load(Ordering::Relaxed);
        loop {
            let next = now.max(last + 1);
            match self
                .last_uid
                .compare_exchange(last, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }

    /// `add_tensor`: declares a tensor on a served source or on `scratch`, or a label set
    /// of a served tensor (`served` describes the served tensor an id names, if any), and
    /// answers its descriptor: the server's grid, the granted lifetime and a PENDING
    /// status.
    pub fn add(
        &self,
        request: &TensorDescriptor,
        served: impl Fn(&str) -> Option<Image>,
    ) -> Result<TensorDescriptor, UploadError> {
        const CALL: &str = "add_tensor";
        let new = id::parse_new(&request.array_id).map_err(|r| UploadError::invalid(CALL, r))?;
        let array_id = new.array_id();
        crate::source::sources::check_array_id_len(&array_id)
            .map_err(|e| UploadError::invalid(CALL, e.to_string()))?;
        let image = match &new.labels_of {
            Some(image_id) => Some(self.image_of(&request.array_id, image_id, &served)?),
            None if new.source_id != SCRATCH_SOURCE_ID && served(&new.source_id).is_none() => {
                return Err(UploadError::NoSource {
                    array_id: request.array_id.clone(),
                    source_id: new.source_id,
                });
            }
            None => None,
        };
        if !request.metadata_json.is_empty() {
            return Err(UploadError::invalid(
                CALL,
                "metadata_json is not taken: an uploaded tensor declares shape, dtype, chunk \
                 shape, axis labels and lifetime only",
            ));
        }
        let dtype = Dtype::parse(&request.dtype)
            .map_err(|e| UploadError::invalid(CALL, format!("dtype '{}': {e}", request.dtype)))?;
        arrow_type(&dtype).map_err(|r| UploadError::invalid(CALL, r))?;
        let shape = request
            .shape
            .iter()
            .map(|&d| u64::try_from(d))
            .collect::<Result<Vec<u64>, _>>()
            .map_err(|_| {
                UploadError::invalid(
                    CALL,
                    format!("shape {:?} has a negative axis", request.shape),
                )
            })?;
        if shape.is_empty() {
            return Err(UploadError::invalid(
                CALL,
                "shape has no axes: a tensor has at least one",
            ));
        }
        if let (Some(image), Some(image_id)) = (&image, &new.labels_of) {
            check_spans(&request.array_id, image_id, image, &shape)
                .map_err(|r| UploadError::invalid(CALL, r))?;
            if !matches!(
                dtype.kind,
                crate::source::npy::Kind::Int | crate::source::npy::Kind::UInt
            ) {
                return Err(UploadError::invalid(
                    CALL,
                    format!(
                        "'{}': a label set holds integer labels; dtype '{}' is not an integer",
                        request.array_id, request.dtype
                    ),
                ));
            }
        }
        let itemsize = dtype.itemsize as u64;
        let bytes = shape
            .iter()
            .try_fold(itemsize, |acc, &d| acc.checked_mul(d))
            .filter(|&b| b <= MAX_UPLOAD_BYTES)
            .ok_or_else(|| {
                UploadError::invalid(
                    CALL,
                    format!("shape {shape:?} of '{}' is over the upload limit of {MAX_UPLOAD_BYTES} bytes", request.dtype),
                )
            })?;
        let grid = self.grid_for(&shape, itemsize, &request.chunk_shape, bytes)?;
        let cells = grid.num_chunks();
        if cells > self.limits.max_cells {
            return Err(UploadError::TooManyCells {
                array_id,
                shape,
                chunk_shape: grid.chunk_shape().to_vec(),
                cells,
                limit: self.limits.max_cells,
            });
        }
        if !request.dim_labels.is_empty() && request.dim_labels.len() != shape.len() {
            return Err(UploadError::invalid(
                CALL,
                format!(
                    "dim_labels has {} labels, but the shape has {} axes",
                    request.dim_labels.len(),
                    shape.len()
                ),
            ));
        }
        if let Some((axis, label)) = request
            .dim_labels
            .iter()
            .enumerate()
            .find(|(_, l)| l.len() > MAX_DIM_LABEL_BYTES)
        {
            return Err(UploadError::invalid(
                CALL,
                format!(
                    "dim_labels[{axis}] is {} bytes, over the limit of {MAX_DIM_LABEL_BYTES} \
                     bytes an axis label may have",
                    label.len()
                ),
            ));
        }
        let dim_labels = match &image {
            _ if !request.dim_labels.is_empty() => request.dim_labels.clone(),
            Some(image) => image.dim_labels.clone(),
            None => crate::grid::default_dim_labels(&shape),
        };
        let ttl_seconds = match request.ttl_seconds {
            Some(0) => {
                return Err(UploadError::invalid(
                    CALL,
                    "ttl_seconds is a lifetime in seconds and must be positive; leave it unset \
                     for the server's default",
                ));
            }
            Some(ttl) if new.source_id == SCRATCH_SOURCE_ID => {
                Some(self.scratch_max_ttl.map_or(ttl, |cap| ttl.min(cap)))
            }
            None if new.source_id == SCRATCH_SOURCE_ID => self.scratch_max_ttl,
            other => other,
        };
        let now = unix_now();
        let record = UploadRecord {
            array_id: array_id.clone(),
            uid: self.next_uid(),
            shape,
            dtype: dtype.numpy_str(),
            chunk_shape: grid.chunk_shape().to_vec(),
            dim_labels,
            state: State::Pending,
            reason: String::new(),
            created_ns: unix_now_ns(),
            ttl_seconds,
            expires_at: ttl_seconds.map(|t| now.saturating_add(u64::from(t))),
            discarded_at: None,
            format: new.format,
        };
        let upload = Arc::new(
            Upload::new(record.clone(), &self.roots, &self.limits, &self.stores)
                .map_err(|r| UploadError::invalid(CALL, r))?,
        );
        {
            let mut table = self.table.write();
            if let Some(taken) = table.get(&array_id) {
                return Err(UploadError::Taken {
                    array_id,
                    state: taken.state(),
                });
            }
            if table.len() >= self.max_uploads {
                return Err(UploadError::TooMany {
                    held: table.len(),
                    limit: self.max_uploads,
                });
            }
            if let Some(zarr) = &upload.zarr {
                zarr.create().map_err(|source| UploadError::Data {
                    array_id: array_id.clone(),
                    source: source.into(),
                })?;
            }
            self.manifest.put_record(&record)?;
            table.insert(array_id.clone(), upload.clone());
        }
        tracing::info!(%array_id, shape = ?record.shape, dtype = %record.dtype, chunk_shape = ?record.chunk_shape, zarr_store = ?upload.zarr_path(), "upload added");
        Ok(TensorDescriptor {
            array_id,
            dim_labels: record.dim_labels,
            shape: record.shape.iter().map(|&d| d as i64).collect(),
            chunk_shape: record.chunk_shape.iter().map(|&d| d as i64).collect(),
            dtype: record.dtype,
            ttl_seconds,
            upload_status: Some(upload.status()),
            ..Default::default()
        })
    }

    /// The served tensor `image_id` a label set (`requested`) is added to: an upload must be
    /// READY (a PENDING one has no extent anyone may read yet).
    fn image_of(
        &self,
        requested: &str,
        image_id: &str,
        served: &impl Fn(&str) -> Option<Image>,
    ) -> Result<Image, UploadError> {
        if is_upload_id(image_id) {
            if let Some(upload) = self.get(image_id) {
                if upload.state() != State::Ready {
                    return Err(UploadError::invalid(
                        "add_tensor",
                        format!(
                            "'{requested}': a label set is added to a READY tensor; '{image_id}' \
                             is {}",
                            upload.state().name()
                        ),
                    ));
                }
                return Ok(Image {
                    shape: upload.shape().to_vec(),
                    dim_labels: upload.dim_labels(),
                });
            }
        } else if let Some(image) = served(image_id) {
            return Ok(image);
        }
        Err(UploadError::invalid(
            "add_tensor",
            format!(
                "'{requested}' asks for a Zarr label set of '{image_id}', which is no tensor \
                 this server serves"
            ),
        ))
    }

    /// The grid of a new upload: the requested chunk shape when it names chunks that fit
    /// one DoPut message ([`MAX_UPLOAD_CHUNK_BYTES`]), else the read policy's grid with
    /// its target bounded the same way. Clients write on the grid the plan returns.
    fn grid_for(
        &self,
        shape: &[u64],
        itemsize: u64,
        requested: &[i64],
        bytes: u64,
    ) -> Result<ChunkGrid, UploadError> {
        let refuse = |e: crate::grid::GridError| UploadError::invalid("add_tensor", e.to_string());
        let asked: Option<Vec<u64>> = (requested.len() == shape.len())
            .then(|| {
                requested
                    .iter()
                    .zip(shape)
                    .map(|(&c, &d)| {
                        u64::try_from(c)
                            .ok()
                            .filter(|&c| c >= 1)
                            .map(|c| c.min(d.max(1)))
                    })
                    .collect()
            })
            .flatten();
        if let Some(chunk) = asked {
            let chunk_bytes = chunk.iter().product::<u64>().saturating_mul(itemsize);
            if chunk_bytes <= MAX_UPLOAD_CHUNK_BYTES && bytes > 0 {
                return ChunkGrid::with_chunk_shape(shape, itemsize, &chunk).map_err(refuse);
            }
        }
        let target = self.target_chunk_bytes.min(MAX_UPLOAD_CHUNK_BYTES);
        ChunkGrid::plan(shape, itemsize, false, target).map_err(refuse)
    }

    /// The `upload_status` of `array_id`, `None` when no upload has that name.
    pub fn status(&self, array_id: &str) -> Option<UploadStatus> {
        self.get(array_id).map(|u| u.status())
    }

    /// `set_upload_status`: moves `array_id` up its ladder (a move to where it is changes
    /// nothing). DISCARDED of an id that is no upload answers `None` (UNKNOWN).
    pub fn set_status(
        &self,
        array_id: &str,
        to: State,
        reason: &str,
    ) -> Result<Option<UploadStatus>, UploadError> {
        const CALL: &str = "set_upload_status";
        let Some(upload) = self.get(array_id) else {
            if to == State::Discarded {
                return Ok(None);
            }
            return Err(UploadError::NotAnUpload {
                call: CALL,
                array_id: array_id.to_string(),
            });
        };
        if reason.len() > MAX_REASON_BYTES {
            return Err(UploadError::ReasonTooLong {
                array_id: array_id.to_string(),
                state: upload.state(),
                len: reason.len(),
            });
        }
        let moved = {
            let mut record = upload.record.lock();
            match record::transition(record.state, to) {
                Ok(Move::Stay) => false,
                Ok(Move::To(State::Discarded)) => {
                    let mut changed = record.clone();
                    changed.state = State::Discarded;
                    changed.reason = reason.to_string();
                    changed.discarded_at = Some(unix_now());
                    *record = changed.clone();
                    drop(record);
                    self.discard(&upload, &changed);
                    true
                }
                Ok(Move::To(next)) => {
                    if upload.zarr_unsynced.load(Ordering::Acquire) {
                        upload.resync_zarr()?;
                    }
                    let mut changed = record.clone();
                    changed.state = next;
                    self.manifest.put_record(&changed)?;
                    *record = changed;
                    true
                }
                Err(Refusal::Discarded) => {
                    return Err(UploadError::Closed {
                        call: CALL,
                        array_id: array_id.to_string(),
                        state: State::Discarded,
                        detail: record.reason.clone(),
                    });
                }
                Err(Refusal::Backwards { from }) => {
                    return Err(UploadError::Backwards {
                        array_id: array_id.to_string(),
                        from,
                        to,
                    });
                }
            }
        };
        if moved {
            tracing::info!(%array_id, state = to.name(), "upload status set");
        }
        Ok(Some(upload.status()))
    }

    /// Discards `upload` (its record in memory already says so): frees its storage first,
    /// since on a full disk that is what makes room for the manifest's write, then records
    /// the discard. A record the manifest cannot take yet is written by the sweep; were the
    /// server stopped before, the upload comes back without its storage and is discarded
    /// again at open ([`Uploads::check_chunks_present`]).
    fn discard(&self, upload: &Upload, record: &UploadRecord) {
        self.reclaim(upload);
        self.save_discard(upload, record);
    }

    /// Writes a discarded upload's record and forgets its chunks; on failure leaves it to
    /// the sweep.
    fn save_discard(&self, upload: &Upload, record: &UploadRecord) {
        let saved = self
            .manifest
            .put_record(record)
            .and_then(|()| self.manifest.drop_chunks(record.uid));
        match saved {
            Ok(()) => upload.unsaved.store(false, Ordering::Release),
            Err(err) => {
                if !upload.unsaved.swap(true, Ordering::AcqRel) {
                    tracing::warn!(array_id = %record.array_id, error = %err, "cannot record a discard yet; its storage is freed and the sweep records it once the manifest can be written");
                }
            }
        }
    }

    /// Removes a discarded upload's bytes (storage reclaimed).
    fn reclaim(&self, upload: &Upload) {
        match upload.reclaim() {
            Ok(removed) => {
                if removed {
                    tracing::info!(array_id = %upload.array_id(), "storage of a discarded upload removed");
                }
            }
            Err(err) => tracing::warn!(error = %err, "cannot remove a discarded upload's storage"),
        }
    }

    /// The upload and cell a DoPut ticket names, checked: an upload of that name, this
    /// upload (not an earlier one of the same name), a cell of its grid, still PENDING.
    pub fn put_target(&self, chunk_id: &[u8]) -> Result<ChunkTarget, UploadError> {
        const CALL: &str = "DoPut";
        let id = ChunkId::decode(chunk_id)
            .map_err(|e| UploadError::invalid(CALL, format!("malformed chunk ticket: {e}")))?;
        let target = self.target(CALL, id)?;
        let record = target.upload.record.lock();
        if record.state != State::Pending {
            return Err(UploadError::Closed {
                call: CALL,
                array_id: record.array_id.clone(),
                state: record.state,
                detail: record.reason.clone(),
            });
        }
        drop(record);
        Ok(target)
    }

    /// Reserves room for `bytes` of a chunk of `target` among the bytes in flight of its
    /// upload and of the server, waiting up to [`PUT_ROOM_WAIT`] for it.
    pub async fn reserve_put(
        &self,
        target: &ChunkTarget,
        bytes: u64,
    ) -> Result<PutPermit, UploadError> {
        let scopes = [&target.upload.in_flight, &self.in_flight];
        limits::reserve(&scopes, target.id.array_id(), bytes, PUT_ROOM_WAIT).await
    }

    fn target(&self, call: &'static str, id: ChunkId) -> Result<ChunkTarget, UploadError> {
        let Some(upload) = self.get(id.array_id()) else {
            return Err(UploadError::invalid(
                call,
                format!(
                    "the ticket names '{}', which is not an upload",
                    id.array_id()
                ),
            ));
        };
        let cell = upload.cell_of(call, &id)?;
        Ok(ChunkTarget { upload, id, cell })
    }

    /// Stores one chunk: checks the batches against the cell, appends and syncs the bytes,
    /// then commits the cell to the manifest, unless the upload was sealed or discarded
    /// meanwhile. Returns once the chunk is durable: the caller may ack. Blocking.
    pub fn put(&self, target: &ChunkTarget, batches: &[RecordBatch]) -> Result<(), UploadError> {
        const CALL: &str = "DoPut";
        let upload = &target.upload;
        let cell = target.id.region();
        let elements = target.elements();
        let buffers = batch::chunk_bytes(batches, &upload.dtype, elements).map_err(|r| {
            UploadError::invalid(CALL, format!("chunk of '{}': {r}", target.id.array_id()))
        })?;
        let slices: Vec<&[u8]> = buffers.iter().map(|b| b.as_slice()).collect();
        let chunk_bytes = elements.saturating_mul(upload.dtype.itemsize as u64);
        let data = upload.data()?;
        let limit = upload.tensor_bytes().saturating_mul(2) + 2 * MAX_CHUNK_BYTES;
        let stored = data.disk_bytes();
        if stored + chunk_bytes > limit {
            return Err(UploadError::OverLimit {
                array_id: target.id.array_id().to_string(),
                stored,
                chunk: chunk_bytes,
                limit,
            });
        }
        let data_error = |source: data::DataError| UploadError::Data {
            array_id: target.id.array_id().to_string(),
            source,
        };
        let staged = match &upload.zarr {
            Some(zarr) => Some(
                zarr.stage(cell, &slices)
                    .map_err(|e| data_error(e.into()))?,
            ),
            None => None,
        };
        let mut key = target.id.encode();
        key.extend_from_slice(&self.next_uid().to_be_bytes());
        let appended = data.append_durable(&key, &upload.meta_of(cell), &slices);
        let record = upload.record.lock();
        let refusal = match appended {
            Err(source) => Some(data_error(source)),
            Ok(_) if record.state != State::Pending => Some(UploadError::Closed {
                call: CALL,
                array_id: record.array_id.clone(),
                state: record.state,
                detail: record.reason.clone(),
            }),
            Ok(_) => None,
        };
        if let Some(refusal) = refusal {
            if let (Some(zarr), Some(staged)) = (&upload.zarr, staged) {
                zarr.forget(staged);
            }
            return Err(refusal);
        }
        if let (Some(zarr), Some(staged)) = (&upload.zarr, staged) {
            // In place only while the upload takes chunks (the record is locked), just
            // before the commit: a seal never sees a chunk file its cell does not match.
            if let Err(err) = zarr.commit(staged) {
                upload.zarr_unsynced.store(true, Ordering::Release);
                return Err(data_error(err.into()));
            }
        }
        if let Err(err) = self.manifest.put_chunk(record.uid, target.cell, &key) {
            if upload.zarr.is_some() {
                upload.zarr_unsynced.store(true, Ordering::Release);
            }
            return Err(err.into());
        }
        upload.cells.lock().insert(target.cell, key);
        Ok(())
    }

    /// One pass of the sweep: discards uploads whose lifetime ran out, removes discarded
    /// uploads' storage, and forgets tombstones whose time is up (their names free).
    pub fn sweep(&self) {
        let now = unix_now();
        for upload in self.all() {
            let (state, expires_at, array_id, ttl) = {
                let r = upload.record.lock();
                (r.state, r.expires_at, r.array_id.clone(), r.ttl_seconds)
            };
            if state != State::Discarded && expires_at.is_some_and(|at| at <= now) {
                let reason = format!(
                    "expired: its lifetime of {} s ran out",
                    ttl.unwrap_or_default()
                );
                if let Err(err) = self.set_status(&array_id, State::Discarded, &reason) {
                    tracing::warn!(%array_id, error = %err, "cannot discard an expired upload");
                }
                continue;
            }
            if state != State::Discarded {
                continue;
            }
            if upload.has_storage() {
                self.reclaim(&upload);
            }
            if upload.unsaved.load(Ordering::Acquire) {
                let record = upload.record.lock().clone();
                self.save_discard(&upload, &record);
                continue;
            }
            let (free_at, uid) = {
                let r = upload.record.lock();
                (r.tombstone_until(TOMBSTONE_SECONDS), r.uid)
            };
            if free_at.is_some_and(|at| at <= now) {
                let mut table = self.table.write();
                match self.manifest.remove(&array_id, uid) {
                    Ok(()) => {
                        table.remove(&array_id);
                        tracing::info!(%array_id, "discarded upload forgotten; its name is free");
                    }
                    Err(err) => {
                        tracing::warn!(%array_id, error = %err, "cannot forget a discarded upload")
                    }
                }
            }
        }
    }
}

/// The one thread of the uploads: maintains the open stores as they ask, and sweeps every
/// [`SWEEP_EVERY`]; ends once the uploads are dropped.
fn worker_loop(uploads: Weak<Uploads>, stores: Arc<OpenStores>) {
    let mut next_sweep = Instant::now() + SWEEP_EVERY;
    loop {
        stores.maintain(next_sweep.saturating_duration_since(Instant::now()));
        if Instant::now() >= next_sweep {
            let Some(uploads) = uploads.upgrade() else {
                return;
            };
            uploads.sweep();
            next_sweep = Instant::now() + SWEEP_EVERY;
        }
    }
}

impl Drop for Uploads {
    /// Closes the open stores (sealing their segments, releasing their locks).
    fn drop(&mut self) {
        self.stores.close_all();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use arrow_array::UInt16Array;

    /// Uploads kept in `dir` (1 MiB of pages, 10-minute TTL cap, default limits).
    fn open(dir: &Path) -> Arc<Uploads> {
        Uploads::open(
            dir,
            1 << 20,
            Some(Duration::from_secs(600)),
            UploadLimits::default(),
        )
        .unwrap()
    }

    /// The request adding `scratch/@fields/NAME`: 4×6 `<u2` in two 2×6 cells.
    fn descriptor(name: &str) -> TensorDescriptor {
        TensorDescriptor {
            array_id: format!("cache://scratch/@fields/{name}"),
            shape: vec![4, 6],
            dtype: "<u2".to_string(),
            chunk_shape: vec![2, 6],
            ..Default::default()
        }
    }

    fn chunk_of(upload: &Upload, cell: u64) -> (Vec<u8>, RecordBatch) {
        let region = upload.grid().cell_at(cell).unwrap();
        let id = ChunkId::new(upload.array_id(), upload.version(), region.clone()).unwrap();
        let n: u64 = region.shape().iter().product();
        let values: Vec<u16> = (0..n).map(|i| (i + 1000 * cell) as u16).collect();
        let column: Arc<dyn arrow_array::Array> = Arc::new(UInt16Array::from(values));
        (
            id.encode(),
            RecordBatch::try_from_iter([("data", column)]).unwrap(),
        )
    }

    #[test]
    fn a_region_reads_across_sent_and_unsent_cells() {
        use crate::source::Source;
        let tmp = tempfile::tempdir().unwrap();
        let uploads = open(tmp.path());
        let request = descriptor("r");
        uploads.add(&request, |_| None).unwrap();
        let upload = uploads.get("scratch/@fields/r").unwrap();
        let (ticket, batch) = chunk_of(&upload, 0);
        uploads
            .put(&uploads.put_target(&ticket).unwrap(), &[batch])
            .unwrap();
        uploads
            .set_status("scratch/@fields/r", State::Ready, "")
            .unwrap();
        // Rows 1..3, columns 2..5: row 1 from the sent cell, row 2 from the unsent one.
        let mut out = vec![0xffu8; 2 * 3 * 2];
        upload.read_region(&[1, 2], &[3, 5], &mut out).unwrap();
        let values: Vec<u16> = out
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(values, [8, 9, 10, 0, 0, 0]);
        assert!(upload.read_region(&[0, 0], &[5, 6], &mut out).is_err());
    }

    #[test]
    fn a_zarr_upload_keeps_a_zarr_store_of_exactly_its_acknowledged_chunks() {
        let tmp = tempfile::tempdir().unwrap();
        let array_id = "scratch/@fields/z";
        let mut request = descriptor("z");
        request.array_id = "zarr://scratch/@fields/z".to_string();
        let store = {
            let uploads = open(tmp.path());
            assert_eq!(uploads.add(&request, |_| None).unwrap().array_id, array_id);
            let upload = uploads.get(array_id).unwrap();
            let store = upload.zarr_path().unwrap().to_path_buf();
            assert!(store.join(".zarray").exists() && store.join(".zattrs").exists());
            let (ticket, batch) = chunk_of(&upload, 0);
            uploads
                .put(&uploads.put_target(&ticket).unwrap(), &[batch])
                .unwrap();
            let values: Vec<u8> = (0u16..12).flat_map(u16::to_le_bytes).collect();
            assert_eq!(std::fs::read(store.join("0.0")).unwrap(), values);
            // A crash between a chunk file put in place and its commit: a file of a cell
            // never acknowledged.
            std::fs::write(store.join("1.0"), [7u8; 24]).unwrap();
            store
        };
        {
            let uploads = open(tmp.path());
            let upload = uploads.get(array_id).unwrap();
            assert_eq!(upload.zarr_path(), Some(store.as_path()));
            assert!(store.join("0.0").exists());
            assert!(
                !store.join("1.0").exists(),
                "the unacknowledged chunk file is removed"
            );
        }
        // A store removed from under a PENDING upload is written again at open.
        std::fs::remove_dir_all(&store).unwrap();
        let uploads = open(tmp.path());
        let upload = uploads.get(array_id).unwrap();
        assert!(store.join(".zarray").exists() && store.join("0.0").exists());
        uploads.set_status(array_id, State::Ready, "").unwrap();
        let meta = upload.tensor().metadata_json();
        assert!(meta.contains("zarr_store"), "{meta}");
        uploads
            .set_status(array_id, State::Discarded, "done")
            .unwrap();
        assert!(!store.exists() && !upload.data_dir().exists());
    }

    fn upload_labels(uploads: &Uploads, array_id: &str) -> Vec<String> {
        uploads.get(array_id).unwrap().dim_labels()
    }

    #[test]
    fn a_label_set_spans_a_ready_image_and_is_an_upload_of_its_own() {
        let tmp = tempfile::tempdir().unwrap();
        let uploads = open(tmp.path());
        let mut image = descriptor("img");
        image.array_id = "zarr://scratch/@fields/img".to_string();
        uploads.add(&image, |_| None).unwrap();
        let mut set = descriptor("x");
        set.array_id = "zarr://scratch/@fields/img/@labels/nuclei".to_string();
        set.dtype = "<u4".to_string();
        set.dim_labels = Vec::new();
        let refused = |r: Result<TensorDescriptor, UploadError>| r.err().unwrap().to_string();
        assert!(refused(uploads.add(&set, |_| None)).contains("is PENDING"));
        uploads
            .set_status("scratch/@fields/img", State::Ready, "")
            .unwrap();
        let desc = uploads.add(&set, |_| None).unwrap();
        assert_eq!(desc.array_id, "scratch/@fields/img/@labels/nuclei");
        assert_eq!(
            desc.dim_labels,
            upload_labels(&uploads, "scratch/@fields/img")
        );
        let upload = uploads.get(&desc.array_id).unwrap();
        assert!(upload.zarr_path().unwrap().ends_with("nuclei.zarr"));
        let mut wrong = set.clone();
        wrong.array_id = "zarr://scratch/@fields/img/@labels/wide".to_string();
        wrong.shape = vec![4, 7];
        assert!(refused(uploads.add(&wrong, |_| None)).contains("does not span"));
        let mut float = set.clone();
        float.array_id = "zarr://scratch/@fields/img/@labels/f".to_string();
        float.dtype = "<f4".to_string();
        assert!(refused(uploads.add(&float, |_| None)).contains("integer labels"));
        let mut served = set.clone();
        served.array_id = "zarr://image/@labels/cells".to_string();
        let image_of = |id: &str| {
            (id == "image").then(|| Image {
                shape: vec![4, 6],
                dim_labels: vec!["y".into(), "x".into()],
            })
        };
        assert_eq!(
            uploads.add(&served, image_of).unwrap().dim_labels,
            ["y", "x"].map(String::from).to_vec()
        );
        served.array_id = "zarr://nosuch/@labels/cells".to_string();
        assert!(refused(uploads.add(&served, image_of)).contains("no tensor this server serves"));
    }

    #[test]
    fn chunks_and_states_survive_a_reopen_and_a_discard_reclaims() {
        let tmp = tempfile::tempdir().unwrap();
        let request = descriptor("t");
        let array_id = "scratch/@fields/t";
        {
            let uploads = open(tmp.path());
            let desc = uploads.add(&request, |_| None).unwrap();
            assert_eq!(desc.array_id, array_id);
            assert_eq!(desc.ttl_seconds, Some(600));
            assert!(matches!(
                uploads.add(&request, |_| None),
                Err(UploadError::Taken { .. })
            ));
            let upload = uploads.get(array_id).unwrap();
            let (ticket, batch) = chunk_of(&upload, 0);
            let target = uploads.put_target(&ticket).unwrap();
            uploads.put(&target, &[batch]).unwrap();
            assert_eq!(upload.status().uploaded_chunks, 1);
            assert_eq!(upload.status().expected_chunks, 2);
        }
        let uploads = open(tmp.path());
        let upload = uploads.get(array_id).unwrap();
        assert_eq!(upload.state(), State::Pending);
        assert_eq!(upload.status().uploaded_chunks, 1);
        let (ticket, _) = chunk_of(&upload, 1);
        let id = ChunkId::decode(&ticket).unwrap();
        assert!(matches!(
            upload.readable_cell(&id),
            Err(UploadError::NotReadable { .. })
        ));
        uploads.set_status(array_id, State::Ready, "").unwrap();
        assert!(matches!(
            uploads.set_status(array_id, State::Pending, ""),
            Err(UploadError::Backwards { .. })
        ));
        assert!(matches!(
            uploads.put_target(&ticket),
            Err(UploadError::Closed {
                state: State::Ready,
                ..
            })
        ));
        // The chunk sent reads back; the cell never sent reads as zeros.
        let (sent, _) = chunk_of(&upload, 0);
        let entry = upload.read_chunk(&ChunkId::decode(&sent).unwrap()).unwrap();
        assert!(entry.body.windows(4).any(|w| w == [0, 0, 1, 0]));
        let zeros = upload.read_chunk(&id).unwrap();
        assert!(zeros.body.windows(24).any(|w| w.iter().all(|&b| b == 0)));
        assert!(upload.data_dir().exists());
        uploads
            .set_status(array_id, State::Discarded, "done")
            .unwrap();
        assert!(!upload.data_dir().exists());
        assert!(matches!(
            uploads.set_status(array_id, State::Ready, ""),
            Err(UploadError::Closed {
                state: State::Discarded,
                ..
            })
        ));
        assert_eq!(uploads.status(array_id).unwrap().reason, "done");
    }
}
