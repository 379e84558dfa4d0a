//! Everything the service shares between calls, below the wire: the sources, the uploads,
//! the chunk service, the catalog, the ledger of unread replies and the metrics handle, as
//! handles with getters. `flight/` turns calls into these; `watch` and `scrape` read and
//! refresh them. The request path (plans' grids, chunks' bytes) is [`crate::read_path`].

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use arrow_array::RecordBatch;
use parking_lot::Mutex;

use crate::catalog::tree::{Level, TreeIndex};
use crate::catalog::{self, Catalog, CatalogLimits};
use crate::chunks::ChunkService;
use crate::error::{Fault, NoAnnotations, NotServed, ServiceResult, Unavailable};
use crate::grid::route::{LoopbackPlans, RoutePlanner};
use crate::grid::scaled::pyramid::PyramidPolicy;
use crate::metrics::Metrics;
use crate::read_path::ReadPath;
use crate::rois::Annotations;
use crate::source::registry::{OpenOptions, Registry, Tensor};
use crate::source::runtime::RuntimeRoots;
use crate::source::scan::ScanStatus;
use crate::source::sources::Sources;
use crate::state_dir::StateDir;
use crate::unread::{UnreadLimits, UnreadReplies};
use crate::uploads::{Upload, Uploads};
use tessera_proto::pb::{TensorDescriptor, UploadStatus};

/// Everything the service shares between calls.
pub struct ServiceState {
    sources: Sources,
    chunks: Arc<ChunkService>,
    started: Instant,
    /// The start time in Unix milliseconds: the run part of `catalog_generation`.
    run_id: u128,
    scan: ScanStatus,
    catalog: Catalog,
    unread: Arc<UnreadReplies>,
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
    annotations: Result<Arc<Annotations>, Arc<NoAnnotations>>,
    /// The uploads kept in the state directory.
    uploads: Option<Arc<Uploads>>,
    /// The address `health` advertises (`external_location`), if any.
    external_location: Option<String>,
    /// A stop was requested: in-flight calls are finishing, readiness probes say no.
    stopping: AtomicBool,
}

impl ServiceState {
    /// State over an already scanned registry.
    pub fn new(registry: Registry, open_options: OpenOptions, chunks: Arc<ChunkService>) -> Self {
        Self {
            sources: Sources::new(registry, open_options),
            chunks,
            started: Instant::now(),
            run_id: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis()),
            scan: ScanStatus::default(),
            catalog: Catalog::new(CatalogLimits::default()),
            unread: UnreadReplies::new(UnreadLimits::default()),
            routes: RoutePlanner::default(),
            metrics: Metrics::default(),
            pyramid: PyramidPolicy::default(),
            runtime: RuntimeRoots::default(),
            tree: Mutex::new(None),
            writable: false,
            state_dir: None,
            annotations: Err(Arc::new(NoAnnotations::NoStateDir)),
            uploads: None,
            external_location: None,
            stopping: AtomicBool::new(false),
        }
    }

    /// Notes that a stop was requested: from now on readiness probes (`/readyz`) answer
    /// 503, so a load balancer sends no new viewers while in-flight calls finish.
    pub fn begin_stopping(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Whether a stop was requested.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }

    /// Advertises `location` as the address other machines dial (`health`'s
    /// `external_location`).
    pub fn with_external_location(mut self, location: Option<String>) -> Self {
        self.external_location = location;
        self
    }

    /// The address other machines dial this server at, when it has one.
    pub fn external_location(&self) -> Option<&str> {
        self.external_location.as_deref()
    }

    /// Plans loopback reads by `policy` (`--loopback-plans`).
    pub fn with_loopback_plans(mut self, policy: LoopbackPlans) -> Self {
        self.routes = RoutePlanner::default().with_policy(policy);
        self
    }

    /// Keeps ROI annotations in `annotations`, or refuses them with the reason given.
    pub fn with_annotations(
        mut self,
        annotations: Result<Arc<Annotations>, Arc<NoAnnotations>>,
    ) -> Self {
        self.annotations = annotations;
        self
    }

    /// The ROI annotation store; UNAVAILABLE, naming why, when there is none.
    pub fn annotations(&self) -> ServiceResult<Arc<Annotations>> {
        self.annotations
            .clone()
            .map_err(|why| Unavailable::Annotations(why).into())
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
            return Err(NotServed::ReadOnly {
                call: call.to_string(),
            }
            .into());
        }
        self.uploads.as_ref().ok_or_else(|| {
            Unavailable::NoStateDir {
                call: call.to_string(),
            }
            .into()
        })
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
                    nbytes: u.version().size(),
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

    /// `add_tensor`: declares an upload on a served source or on `scratch`, or a label set
    /// of a served tensor.
    pub fn add_tensor(&self, request: &TensorDescriptor) -> ServiceResult<TensorDescriptor> {
        let uploads = self.uploads_for_write("add_tensor")?;
        Ok(uploads.add(request, |array_id| {
            self.resolve(array_id)
                .ok()
                .map(|tensor| crate::uploads::Image {
                    shape: tensor.shape().to_vec(),
                    dim_labels: tensor.dim_labels.clone(),
                })
        })?)
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
        let failed = |e: arrow_schema::ArrowError| Fault::SourceRow {
            source_id: source_id.to_string(),
            source: Arc::new(e),
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
        Ok(batch.project(&columns).map_err(failed)?)
    }

    /// Sets the caps on bytes held by unread chunk replies (defaults: [`UnreadLimits::default`]).
    pub fn with_unread_limits(mut self, limits: UnreadLimits) -> Self {
        self.unread = UnreadReplies::new(limits);
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
    pub fn unread(&self) -> &Arc<UnreadReplies> {
        &self.unread
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

    /// Names the catalog's content (`health`'s `catalog_generation`):
    /// `<run>.<registry generation>.<uploads>`, where the run is the start time in
    /// milliseconds (so a value never repeats across restarts), the registry generation
    /// moves whenever a source is added, removed or reopened after a change, and the last
    /// part is a digest of the READY uploads' ids and content versions. Equal values mean
    /// the `sources` and `tensors` tables held the same rows (a file changed on disk
    /// counts once the server has reopened it, on a read or a catalog query).
    pub fn catalog_generation(&self) -> String {
        use std::hash::{DefaultHasher, Hash, Hasher};
        let registry = self.sources.read().generation();
        let mut uploads = DefaultHasher::new();
        for upload in self.ready_uploads() {
            upload.array_id().hash(&mut uploads);
            upload.version().hash(&mut uploads);
        }
        format!("{}.{registry}.{:x}", self.run_id, uploads.finish())
    }

    /// The registry as the SQL catalog shows it, after reopening any served source
    /// whose file changed on disk (one `stat` per source).
    pub fn catalog_snapshot(&self) -> catalog::Snapshot {
        self.sources.refresh_changed();
        catalog::Snapshot::of(&self.sources.read())
            .with_uploads(self.upload_rows())
            .with_scratch(self.writable() && self.uploads.is_some())
    }

    /// Runs a catalog SQL query over the current registry (and the annotation store, which
    /// the `rois` table reads only while the query scans it).
    pub async fn catalog_query(&self, sql: &str) -> ServiceResult<catalog::QueryAnswer> {
        let mut snapshot = self.catalog_snapshot();
        if let Ok(rois) = self.annotations() {
            let store = Arc::clone(&rois);
            let rows = tokio::task::spawn_blocking(move || store.count())
                .await
                .map_err(|e| Fault::task("counting annotations", e))??;
            snapshot = snapshot.with_rois(rois, rows);
        }
        Ok(self.catalog.query(&snapshot, sql).await?)
    }

    /// The request path: plans' grids and chunks' bytes, whatever the source
    /// ([`ReadPath`]).
    pub fn read_path(&self) -> ReadPath<'_> {
        ReadPath::new(
            &self.sources,
            self.uploads.as_ref(),
            &self.chunks,
            &self.routes,
            &self.metrics,
        )
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
        Ok(self.sources.resolve(array_id)?)
    }

    /// Paths of served sources (for logs and tests).
    pub fn source_paths(&self) -> Vec<PathBuf> {
        self.sources.paths()
    }
}
