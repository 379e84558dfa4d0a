//! Everything the service shares between calls, below the wire: the sources, the chunk
//! service, the catalog, the ledger of unread replies and the metrics handle. `flight/` turns
//! calls into these; `watch` and `scrape` read and refresh them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arrow_array::RecordBatch;
use parking_lot::Mutex;

use crate::catalog::tree::{Level, TreeIndex};
use crate::catalog::{self, Catalog, CatalogLimits};
use crate::chunk_id::ChunkId;
use crate::chunks::{ChunkService, EncodedChunk, LocateOutcome};
use crate::error::{ServiceError, ServiceResult};
use crate::metrics::Metrics;
use crate::pins::{PinLimits, Pins};
use crate::rois::Annotations;
use crate::route::{LoopbackPlans, Route, RoutePlanner};
use crate::scaled::pyramid::PyramidPolicy;
use crate::source::registry::{OpenOptions, Registry, Tensor};
use crate::source::runtime::RuntimeRoots;
use crate::source::scan::ScanStatus;
use crate::source::sources::Sources;
use crate::state_dir::StateDir;
use crate::uploads::{ChunkTarget, Upload, Uploads, is_upload_id};
use tessera_proto::pb::{TensorDescriptor, UploadStatus};

/// Everything the service shares between calls.
pub struct ServiceState {
    sources: Sources,
    chunks: Arc<ChunkService>,
    started: Instant,
    scan: ScanStatus,
    catalog: Catalog,
    pins: Arc<Pins>,
    routes: RoutePlanner,
    metrics: Metrics,
    pyramid: PyramidPolicy,
    runtime: RuntimeRoots,
    /// The catalog tree of the registry generation it was built for.
    tree: Mutex<Option<(u64, Arc<TreeIndex>)>>,
    /// Clients may write (`--writable`).
    writable: bool,
    /// Where users' data lives, when this server holds it.
    state_dir: Option<Arc<StateDir>>,
    /// The ROI annotation store, or why there is none.
    annotations: Result<Arc<Annotations>, String>,
    /// The uploads kept in the state directory.
    uploads: Option<Arc<Uploads>>,
}

impl ServiceState {
    /// State over an already scanned registry.
    pub fn new(registry: Registry, open_options: OpenOptions, chunks: Arc<ChunkService>) -> Self {
        Self {
            sources: Sources::new(registry, open_options),
            chunks,
            started: Instant::now(),
            scan: ScanStatus::default(),
            catalog: Catalog::new(CatalogLimits::default()),
            pins: Pins::new(PinLimits::default()),
            routes: RoutePlanner::default(),
            metrics: Metrics::default(),
            pyramid: PyramidPolicy::default(),
            runtime: RuntimeRoots::default(),
            tree: Mutex::new(None),
            writable: false,
            state_dir: None,
            annotations: Err(
                "this server has no state directory to keep annotations in".to_string()
            ),
            uploads: None,
        }
    }

    /// Plans loopback reads by `policy` (`--loopback-plans`).
    pub fn with_loopback_plans(mut self, policy: LoopbackPlans) -> Self {
        self.routes = RoutePlanner::default().with_policy(policy);
        self
    }

    /// Keeps ROI annotations in `annotations`, or refuses them with the reason given.
    pub fn with_annotations(mut self, annotations: Result<Arc<Annotations>, String>) -> Self {
        self.annotations = annotations;
        self
    }

    /// The ROI annotation store; UNAVAILABLE, naming why, when there is none.
    pub fn annotations(&self) -> ServiceResult<Arc<Annotations>> {
        self.annotations.clone().map_err(|why| {
            ServiceError::Unavailable(format!("ROI annotations are unavailable: {why}"))
        })
    }

    /// Serves the uploads kept in the state directory (READY ones are readable even when
    /// the server is not `--writable`).
    pub fn with_uploads(mut self, uploads: Option<Arc<Uploads>>) -> Self {
        self.uploads = uploads;
        self
    }

    /// The uploads, for a call that writes: refused on a read-only server, naming the flag.
    pub fn uploads_for_write(&self, call: &str) -> ServiceResult<&Arc<Uploads>> {
        if !self.writable {
            return Err(ServiceError::Unsupported(format!(
                "{call} refused: this server is read-only; start it with --writable \
                 (TESSERA_WRITABLE=true, or writable = true in its config file) to accept uploads"
            )));
        }
        self.uploads.as_ref().ok_or_else(|| {
            ServiceError::Unavailable(format!(
                "{call} refused: this server has no usable state directory to keep uploads in \
                 (see its log; choose one with --state-dir DIR)"
            ))
        })
    }

    /// The upload `array_id` names, when it names one (`<source>/@fields/<name>`); such an
    /// id that names no upload is refused as unknown.
    pub fn upload(&self, array_id: &str) -> ServiceResult<Option<Arc<Upload>>> {
        if !is_upload_id(array_id) {
            return Ok(None);
        }
        self.uploads
            .as_ref()
            .and_then(|uploads| uploads.get(array_id))
            .map(Some)
            .ok_or_else(|| ServiceError::UnknownSource(array_id.to_string()))
    }

    /// The READY uploads as catalog rows.
    fn upload_rows(&self) -> Vec<catalog::tables::UploadRow> {
        self.ready_uploads()
            .into_iter()
            .map(|u| {
                let array_id = u.array_id();
                let source_id = array_id
                    .split_once('/')
                    .map_or_else(|| array_id.clone(), |(s, _)| s.to_string());
                catalog::tables::UploadRow {
                    source_id,
                    dim_labels: u.dim_labels(),
                    shape: u.shape().to_vec(),
                    chunk_shape: u.grid().chunk_shape().to_vec(),
                    dtype: u.dtype_str(),
                    nbytes: u.version().size,
                    path: u.data_dir().display().to_string(),
                    content_version: catalog::tables::version_hex(u.version()),
                    array_id,
                }
            })
            .collect()
    }

    /// The READY uploads (listed beside the sources).
    pub fn ready_uploads(&self) -> Vec<Arc<Upload>> {
        self.uploads.as_ref().map(|u| u.ready()).unwrap_or_default()
    }

    /// `add_tensor`: declares an upload on a served source or on `scratch`.
    pub fn add_tensor(&self, request: &TensorDescriptor) -> ServiceResult<TensorDescriptor> {
        let uploads = self.uploads_for_write("add_tensor")?;
        Ok(uploads.add(request, |source_id| self.resolve(source_id).is_ok())?)
    }

    /// `set_upload_status`: `None` answers UNKNOWN (discarding an id that is no upload).
    pub fn set_upload_status(
        &self,
        array_id: &str,
        state: crate::uploads::State,
        reason: &str,
    ) -> ServiceResult<Option<UploadStatus>> {
        let uploads = self.uploads_for_write("set_upload_status")?;
        Ok(uploads.set_status(array_id, state, reason)?)
    }

    /// The READY upload chunk a ticket names, or `None` when the ticket is not an upload's.
    fn upload_read_target(&self, chunk_id: &[u8]) -> ServiceResult<Option<ChunkTarget>> {
        let id = ChunkId::decode(chunk_id)
            .map_err(|e| ServiceError::InvalidArgument(format!("malformed chunk ticket: {e}")))?;
        if !is_upload_id(id.array_id()) {
            return Ok(None);
        }
        let Some(uploads) = self.uploads.as_ref() else {
            return Err(ServiceError::UnknownSource(id.array_id().to_string()));
        };
        Ok(Some(uploads.read_target(&id)?))
    }

    /// Where the chunk a ticket names lives in a segment file (`chunk_locate`), decoding
    /// it first if it is cold; or why the client should use `do_get`.
    pub async fn locate_chunk(&self, chunk_id: &[u8]) -> ServiceResult<LocateOutcome> {
        if let Some(target) = self.upload_read_target(chunk_id)? {
            let uploads = self.uploads.clone();
            let located =
                tokio::task::spawn_blocking(move || uploads.map(|u| u.locate(&target)).transpose())
                    .await
                    .map_err(|e| {
                        ServiceError::Internal(format!("locating an upload chunk: {e}"))
                    })??;
            let located =
                located.ok_or_else(|| ServiceError::Internal("uploads vanished".to_string()))?;
            if located.is_located() {
                self.chunks.count_served(true);
            }
            return Ok(located);
        }
        let (tensor, id) = self.resolve_chunk(chunk_id)?;
        Ok(self.chunks.locate(&tensor, &id).await?)
    }

    /// Lets clients write, keeping what they write in `state_dir` (default: read-only, no
    /// state directory). Writes are accepted only with both.
    pub fn with_writes(mut self, writable: bool, state_dir: Option<Arc<StateDir>>) -> Self {
        self.writable = writable;
        self.state_dir = state_dir;
        self
    }

    /// Whether clients may write: `--writable` and a state directory this server holds.
    pub fn writable(&self) -> bool {
        self.writable && self.state_dir.is_some()
    }

    /// The state directory, when this server holds one.
    pub fn state_dir(&self) -> Option<&Arc<StateDir>> {
        self.state_dir.as_ref()
    }

    /// Sets the policy of the pyramid descriptors advertise (default: the reference's).
    pub fn with_pyramid(mut self, pyramid: PyramidPolicy) -> Self {
        self.pyramid = pyramid;
        self
    }

    /// The policy of the pyramid descriptors advertise.
    pub fn pyramid(&self) -> &PyramidPolicy {
        &self.pyramid
    }

    /// Sets where `add_source` may register paths from (default: nowhere, refused).
    pub fn with_runtime_roots(mut self, runtime: RuntimeRoots) -> Self {
        self.runtime = runtime;
        self
    }

    /// Where `add_source` may register paths from.
    pub fn runtime_roots(&self) -> &RuntimeRoots {
        &self.runtime
    }

    /// One level of the catalog tree (`catalog_children`). The tree is built once per
    /// registry generation, so a level costs a few binary searches.
    pub fn catalog_children(&self, key: &str, limit: usize) -> Level {
        self.catalog_tree().children(key, limit)
    }

    /// The catalog tree of the current registry, built now if the set of sources changed
    /// since it was last built. Called (blocking) after every change of the set, so a
    /// `catalog_children` rarely pays for the build.
    pub fn catalog_tree(&self) -> Arc<TreeIndex> {
        let registry = self.sources.read();
        let generation = registry.generation();
        let mut cached = self.tree.lock();
        match cached.as_ref() {
            Some((built, index)) if *built == generation => index.clone(),
            _ => {
                let index = Arc::new(TreeIndex::of(&registry));
                *cached = Some((generation, index.clone()));
                index
            }
        }
    }

    /// The `sources` row of `source_id` in the columns every biopb reader decodes
    /// (`SOURCE_ROW_COLUMNS`: what `resolve` answers), after resolving it as a read would:
    /// an unknown id or a refused file is refused the same way.
    pub fn source_row(&self, source_id: &str) -> ServiceResult<RecordBatch> {
        let failed = |e: arrow_schema::ArrowError| {
            ServiceError::Internal(format!("building the row of '{source_id}': {e}"))
        };
        let tensor = self.resolve(source_id)?;
        let snapshot = catalog::Snapshot::of_source(&self.sources.read(), &tensor.source_id);
        let batch = catalog::tables::sources_batch(&snapshot).map_err(failed)?;
        let schema = batch.schema();
        let columns = catalog::tables::SOURCE_ROW_COLUMNS
            .iter()
            .map(|name| schema.index_of(name))
            .collect::<Result<Vec<_>, _>>()
            .map_err(failed)?;
        batch.project(&columns).map_err(failed)
    }

    /// Sets the caps on bytes held by unread chunk replies (defaults: [`PinLimits::default`]).
    pub fn with_pin_limits(mut self, limits: PinLimits) -> Self {
        self.pins = Pins::new(limits);
        self
    }

    /// Records served bytes in `metrics` (by default in a handle of its own, which nobody
    /// scrapes); the daemon passes the one it serves on `/metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The metrics this service records into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The ledger of bytes held by unread chunk replies.
    pub fn pins(&self) -> &Arc<Pins> {
        &self.pins
    }

    /// Whether the sources are being rescanned and when the last scan finished.
    pub fn scan_status(&self) -> &ScanStatus {
        &self.scan
    }

    /// The served sources.
    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    /// A copy of the registry (cheap: tensors are shared), for a rescan to compare against.
    pub fn registry_snapshot(&self) -> Registry {
        self.sources.snapshot()
    }

    /// Swaps in a rescanned registry.
    pub fn replace_registry(&self, registry: Registry) {
        self.sources.replace(registry);
    }

    /// Time since the service started.
    pub fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// The registry as the SQL catalog shows it, after reopening any served source
    /// whose file changed on disk (one `stat` per source).
    pub fn catalog_snapshot(&self) -> catalog::Snapshot {
        self.sources.refresh_changed();
        catalog::Snapshot::of(&self.sources.read()).with_uploads(self.upload_rows())
    }

    /// Runs a catalog SQL query over the current registry (and the annotation store, which
    /// the `rois` table reads only while the query scans it).
    pub async fn catalog_query(&self, sql: &str) -> ServiceResult<catalog::QueryAnswer> {
        let mut snapshot = self.catalog_snapshot();
        if let Ok(rois) = self.annotations() {
            let store = Arc::clone(&rois);
            let rows = tokio::task::spawn_blocking(move || store.count())
                .await
                .map_err(|e| ServiceError::Internal(format!("counting annotations: {e}")))??;
            snapshot = snapshot.with_rois(rois, rows);
        }
        Ok(self.catalog.query(&snapshot, sql).await?)
    }

    /// The chunk service (for shutdown).
    pub fn chunks(&self) -> &Arc<ChunkService> {
        &self.chunks
    }

    /// How many sources are served.
    pub fn source_count(&self) -> usize {
        self.sources.len()
    }

    /// Resolves an array id (`source` or `source/field`) to its tensor, reopening the source
    /// first if its file changed on disk since it was opened.
    pub fn resolve(&self, array_id: &str) -> ServiceResult<Arc<Tensor>> {
        self.sources.resolve(array_id)
    }

    /// The grid a plan for a peer on loopback (or not) is cut on (see [`crate::route`]).
    pub fn plan_route(&self, loopback: bool) -> Route {
        self.routes.route(loopback, self.chunks.mappable())
    }

    /// The grid of a plan of `tensor` for a peer whose route is `route`: a loopback peer
    /// planned on the socket grid reads the coarse grid instead while only that one is
    /// cached, and the fine grid is filled in the background meanwhile
    /// (`chunks/regrid.rs`, docs/decisions/0023).
    pub fn route_for(&self, tensor: &Arc<Tensor>, loopback: bool, route: Route) -> Route {
        let chunks = &self.chunks;
        if route == Route::Socket
            && loopback
            && chunks.mappable()
            && tensor.mapped_grid != tensor.grid
            && !chunks.ends_cached(tensor, &tensor.grid)
            && chunks.ends_cached(tensor, &tensor.mapped_grid)
        {
            chunks.fill_grid(tensor, &tensor.grid);
            return Route::Mapped;
        }
        route
    }

    /// A client asked where a chunk lives (`chunk_locate`): loopback plans may map again.
    pub fn note_locate(&self) {
        self.routes.note_locate();
    }

    /// Decodes and validates a chunk id from a ticket: the tensor must exist, the
    /// content version must be current, and the region must be a cell of one of its grids.
    pub fn resolve_chunk(&self, chunk_id: &[u8]) -> ServiceResult<(Arc<Tensor>, ChunkId)> {
        let id = ChunkId::decode(chunk_id)
            .map_err(|e| ServiceError::InvalidArgument(format!("malformed chunk ticket: {e}")))?;
        let tensor = self.resolve(id.array_id())?;
        if id.version() != tensor.version {
            return Err(ServiceError::Stale(format!(
                "chunk of '{}' was planned against another version of the source; plan the read again",
                id.array_id()
            )));
        }
        let is_chunk = match id.scale() {
            None => tensor.grid_of(id.region()).is_some(),
            Some(scale) => {
                if !scale.fits(tensor.shape()) {
                    return Err(ServiceError::InvalidArgument(format!(
                        "chunk ticket scale {:?} does not fit '{}' of shape {:?}",
                        scale.factors(),
                        id.array_id(),
                        tensor.shape()
                    )));
                }
                if scale.check_dtype(&tensor.file.header().dtype).is_err() {
                    return Err(ServiceError::InvalidArgument(format!(
                        "chunk ticket of '{}' asks for 'area' of a bool tensor, which is refused",
                        id.array_id()
                    )));
                }
                tensor
                    .scaled_grid_of(id.region(), scale.factors())
                    .is_some()
            }
        };
        if !is_chunk {
            return Err(ServiceError::InvalidArgument(format!(
                "chunk ticket region {:?}..{:?} is not a chunk of '{}'",
                id.region().start,
                id.region().stop,
                id.array_id()
            )));
        }
        Ok((tensor, id))
    }

    /// The IPC message of the chunk a ticket names, decoding it first if it is cold;
    /// counted as served by do_get. A loopback peer reading a chunk only the mapped grid
    /// has is a local client that does not map: later loopback plans use the fine grid.
    pub async fn encoded_chunk(
        &self,
        chunk_id: &[u8],
        loopback: bool,
    ) -> ServiceResult<EncodedChunk> {
        if let Some(target) = self.upload_read_target(chunk_id)? {
            let uploads = self.uploads.clone();
            let chunk =
                tokio::task::spawn_blocking(move || uploads.map(|u| u.read(&target)).transpose())
                    .await
                    .map_err(|e| ServiceError::Internal(format!("reading an upload chunk: {e}")))??
                    .ok_or_else(|| ServiceError::Internal("uploads vanished".to_string()))?;
            self.metrics.record_do_get_bytes(chunk.len() as u64);
            self.chunks.count_served(false);
            return Ok(chunk);
        }
        let (tensor, id) = self.resolve_chunk(chunk_id)?;
        let fine_cell = match id.scale() {
            None => tensor.grid.is_cell(id.region()),
            Some(scale) => tensor.grid.scaled(scale.factors()).is_cell(id.region()),
        };
        if loopback && !fine_cell {
            self.routes.note_local_socket_read();
        }
        let chunk = self.chunks.encoded(&tensor, &id).await?;
        self.metrics.record_do_get_bytes(chunk.len() as u64);
        Ok(chunk)
    }

    /// Paths of served sources (for logs and tests).
    pub fn source_paths(&self) -> Vec<PathBuf> {
        self.sources.paths()
    }
}
