//! The set of sources a server serves: discovery, ids, and the tensors they hold.
//!
//! # Id rule
//! A file given directly (`cells.npy`) is served as source id and array id
//! `cells` (the file stem). A file found while scanning a directory gets the path
//! relative to that directory, without its format's suffix (`.npy`), with each `/` replaced
//! by `.` (`plates/a1/cells.npy` → `plates.a1.cells`). Characters outside
//! `[A-Za-z0-9._-]` become `_`, so ids are slash-free and safe in SQL literals.
//! Files are visited in sorted path order; when two files map to the same id the
//! later one gets `-2`, `-3`, … appended, and the collision is logged.
//!
//! A configured path may carry an id alias: a file is then served under that id,
//! and the files of a directory under `alias.` followed by their usual id.
//!
//! A file that fails to open (bad header, truncated, unsupported dtype, axis
//! labels of the wrong rank) is kept as a *refused* source with its reason,
//! logged, and never stops the others.
//!
//! Scanning is two steps, so the directory watcher can rescan cheaply:
//! [`Discovery::run`] lists files and assigns ids (no opening, no logging), then
//! [`Registry::rebuild`] opens what is new or changed and keeps what is not.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::content_version::FileVersion;
use crate::grid::chunk_id::ContentVersion;
use crate::grid::{ChunkGrid, Region, default_dim_labels, mapped_target};
use crate::source::Source;
use crate::source::confine::Confine;
use crate::source::formats;
use crate::source::ids::IdBook;
use crate::source::meta::{self, SourceMeta, Supplied};
use crate::source::npy::{Limits, Placement};
use crate::source::origin::Origin;

/// Source of registry generations: every registry whose sources may differ from its
/// parent's (one added, removed, or reopened after a change) gets a new one, so what is
/// derived from them (the catalog tree, `health`'s `catalog_generation`) is rebuilt only
/// when they changed.
static GENERATIONS: AtomicU64 = AtomicU64::new(1);

fn next_generation() -> u64 {
    GENERATIONS.fetch_add(1, Ordering::Relaxed)
}

/// One served tensor: an opened source with its chunk grids, labels and metadata.
#[derive(Debug)]
pub struct Tensor {
    /// The array id clients address (equal to the source id for a file; an upload's is
    /// `<source>/@fields/<name>`).
    pub array_id: String,
    /// The source id (no `/`).
    pub source_id: String,
    /// Where its bytes come from (see [`Source`]).
    pub source: Arc<dyn Source>,
    /// The chunk grid of reads that travel the socket (`--chunk-target`).
    pub grid: ChunkGrid,
    /// The coarser grid of reads a local client maps (`--mapped-chunk-target`; the same
    /// cells as `grid` when both targets cut the tensor alike). Cells of the two grids are
    /// different chunks with ids of their own (docs/decisions/0015).
    pub mapped_grid: ChunkGrid,
    /// Axis labels reported to clients.
    pub dim_labels: Vec<String>,
    /// The file's content version at open time; part of every chunk id.
    pub version: ContentVersion,
    /// Configured, or added at runtime.
    pub origin: Origin,
    /// Operator-supplied metadata and physical scale (docs/configuration.md).
    pub meta: SourceMeta,
}

impl Tensor {
    /// What Tessera knows about a source, as the JSON clients get with `metadata_json`
    /// (GetFlightInfo) and in the `tensors` catalog table.
    /// Supplied metadata keys come after Tessera's own (which they may not replace), then
    /// the physical scale and why supplied metadata was refused, when either is known.
    /// A tensor cut on one grid for both routes (its source's own cells: an upload's)
    /// reports no `mapped_chunk_shape`.
    pub fn metadata_json(&self) -> String {
        let mut map = serde_json::Map::new();
        map.insert("format".to_string(), self.source.format().into());
        map.extend(self.source.format_metadata());
        map.insert("dtype".to_string(), self.dtype_str().into());
        map.insert("shape".to_string(), serde_json::json!(self.shape()));
        map.insert(
            "chunk_shape".to_string(),
            serde_json::json!(self.grid.chunk_shape()),
        );
        if self.source.held_chunks().is_none() {
            map.insert(
                "mapped_chunk_shape".to_string(),
                serde_json::json!(self.mapped_grid.chunk_shape()),
            );
        }
        let mut out = serde_json::Value::Object(map);
        if let Some(map) = out.as_object_mut() {
            for (key, value) in &self.meta.metadata {
                map.entry(key.clone()).or_insert_with(|| value.clone());
            }
            if !self.meta.physical_scale.is_empty() {
                map.insert(
                    "physical_scale".to_string(),
                    serde_json::json!(self.meta.physical_scale),
                );
                map.insert(
                    "physical_unit".to_string(),
                    serde_json::json!(self.meta.physical_unit),
                );
            }
            if let Some(error) = &self.meta.error {
                map.insert("metadata_error".to_string(), serde_json::json!(error));
            }
        }
        out.to_string()
    }

    /// The `source_url` clients see.
    pub fn source_url(&self) -> String {
        self.origin.url(self.source.path())
    }

    /// Whether the source and its metadata sidecar are as they were when opened (two
    /// `stat`s for a file).
    pub fn is_current(&self) -> bool {
        self.source.check_unchanged().is_ok()
            && meta::sidecar_identity(self.source.path()) == self.meta.sidecar
    }

    /// The numpy dtype string of the tensor, byte order included (`"<u2"`).
    pub fn dtype_str(&self) -> String {
        self.source.dtype().numpy_str()
    }

    /// Bytes per element.
    pub fn itemsize(&self) -> u64 {
        self.source.dtype().itemsize as u64
    }

    /// The tensor's shape.
    pub fn shape(&self) -> &[u64] {
        self.source.shape()
    }

    /// The grid `cell` is a cell of (the socket grid first), or `None` when it is a cell
    /// of neither.
    pub fn grid_of(&self, cell: &Region) -> Option<&ChunkGrid> {
        [&self.grid, &self.mapped_grid]
            .into_iter()
            .find(|grid| grid.is_cell(cell))
    }

    /// The scaled read grid `cell` is a cell of (that of the socket grid first), for a
    /// chunk reduced by `factors`; `None` when it is a cell of neither.
    pub fn scaled_grid_of(&self, cell: &Region, factors: &[u64]) -> Option<ChunkGrid> {
        [&self.grid, &self.mapped_grid]
            .into_iter()
            .map(|grid| grid.scaled(factors))
            .find(|grid| grid.is_cell(cell))
    }
}

/// A file that was found but could not be served, with the reason.
#[derive(Clone, Debug)]
pub struct Refused {
    /// The id it would have had.
    pub source_id: String,
    /// Where it is.
    pub path: PathBuf,
    /// Why it was refused.
    pub reason: String,
    /// It was served until its file changed on disk into something unreadable (a request
    /// or a rescan reopened it), as opposed to refused when first opened.
    pub after_change: bool,
    /// Configured, or added at runtime.
    pub origin: Origin,
}

impl Refused {
    /// The `source_url` clients see.
    pub fn source_url(&self) -> String {
        self.origin.url(&self.path)
    }
}

/// The sources of one server, keyed by id. Cloning is cheap: tensors are shared.
#[derive(Clone, Debug)]
pub struct Registry {
    tensors: BTreeMap<String, Arc<Tensor>>,
    refused: BTreeMap<String, Refused>,
    /// Configured axis labels by id, so a reopen keeps them.
    label_overrides: BTreeMap<String, Vec<String>>,
    /// Configured metadata by id, so a reopen keeps it.
    supplied: BTreeMap<String, Arc<Supplied>>,
    /// Origins other than [`Origin::Configured`] by id, so a reopen keeps them.
    origins: BTreeMap<String, Origin>,
    /// Where each source's file may really be, so a reopen is judged again.
    confines: BTreeMap<String, Arc<Confine>>,
    /// Changes whenever the set of sources (ids and paths) may have changed.
    generation: u64,
    /// Identity of each refused file when it was refused: a rebuild retries it
    /// only once this changes.
    refused_identities: BTreeMap<String, FileVersion>,
    /// Every id given, by path, shared by the registries rebuilt from this one: an id stays
    /// with its file and is never given to another.
    ids: Arc<Mutex<IdBook>>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            tensors: BTreeMap::new(),
            refused: BTreeMap::new(),
            label_overrides: BTreeMap::new(),
            supplied: BTreeMap::new(),
            origins: BTreeMap::new(),
            confines: BTreeMap::new(),
            refused_identities: BTreeMap::new(),
            generation: next_generation(),
            ids: Arc::default(),
        }
    }
}

/// How one configured path is served.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceOptions {
    /// For a file, the id it is served under; for a directory, the prefix of the
    /// ids of the files in it (`alias.sub.name`).
    pub id: Option<String>,
    /// Axis labels replacing the defaults; a tensor of another rank is refused.
    pub dim_labels: Option<Vec<String>>,
    /// Physical scale and metadata of every file of the path (a sidecar overlays them).
    pub supplied: Option<Arc<Supplied>>,
}

/// A configured path (a `.npy` file or a directory scanned recursively) and its options.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceSpec {
    /// The file or directory.
    pub path: PathBuf,
    /// Id alias and axis labels.
    pub options: SourceOptions,
}

impl From<PathBuf> for SourceSpec {
    fn from(path: PathBuf) -> Self {
        SourceSpec {
            path,
            options: SourceOptions::default(),
        }
    }
}

/// How to open sources.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Bounds on headers and sizes.
    pub limits: Limits,
    /// Target chunk size in bytes (clamped to the 64 MiB cap by the grid).
    pub target_chunk_bytes: u64,
    /// Target chunk size of the grid for mapped reads; at most the target above has no
    /// effect (both plans use the same grid).
    pub mapped_chunk_bytes: u64,
    /// Serve configured files whose path leads out of their configured folder (a symbolic
    /// link, or a directory replaced by one); runtime sources never leave
    /// `add_source_roots` whatever this says.
    pub follow_links_outside: bool,
    /// Most sources served at once, served and refused, configured and runtime together
    /// (`max_sources`): files found beyond it are not opened, and `add_source` stops there.
    pub max_sources: usize,
}

/// Default of [`OpenOptions::max_sources`].
pub const DEFAULT_MAX_SOURCES: usize = 100_000;

impl OpenOptions {
    /// Default limits, chunks cut at `target_chunk_bytes` for every route.
    pub fn with_target(target_chunk_bytes: u64) -> Self {
        Self {
            limits: Limits::default(),
            target_chunk_bytes,
            mapped_chunk_bytes: target_chunk_bytes,
            follow_links_outside: false,
            max_sources: DEFAULT_MAX_SOURCES,
        }
    }
}

/// A candidate file with the id it derives.
#[derive(Debug)]
pub(crate) struct Candidate {
    /// The id before collision suffixes.
    pub(crate) base: String,
    /// Where it is.
    pub(crate) path: PathBuf,
    dim_labels: Option<Vec<String>>,
    supplied: Option<Arc<Supplied>>,
    /// The configured folder it was found in.
    confine: Option<Arc<Confine>>,
}

/// The `.npy` files found under the configured paths, with the ids they get.
#[derive(Debug, Default)]
pub struct Discovery {
    candidates: Vec<Candidate>,
    /// Configured paths or subdirectories that could not be listed, with the cause.
    pub problems: Vec<String>,
    /// Folders that exist but could not be listed (out of descriptors, no permission, an
    /// I/O error): what is served under them is kept, not removed, since it was not seen.
    unseen: Vec<PathBuf>,
}

impl Discovery {
    /// Lists the `.npy` files of `sources` (directories recursively, in sorted order)
    /// and assigns their ids. Opens no file and logs nothing.
    pub fn run(sources: &[SourceSpec]) -> Discovery {
        let mut found = Discovery::default();
        let mut raw = Vec::new();
        for spec in sources {
            if let Err(err) = collect(spec, &mut raw, &mut found) {
                found
                    .problems
                    .push(format!("{}: cannot be scanned: {err}", spec.path.display()));
                found.not_seen(&spec.path, &err);
            }
        }
        found.candidates = raw;
        found
    }

    /// The files found, in sorted order.
    pub fn paths(&self) -> impl Iterator<Item = &Path> {
        self.candidates.iter().map(|c| c.path.as_path())
    }

    /// Whether `path` lies in a folder that could not be listed: its absence means nothing.
    pub fn unseen(&self, path: &Path) -> bool {
        self.unseen.iter().any(|folder| path.starts_with(folder))
    }

    /// Notes that `folder` could not be listed for `err`; a folder that is gone was seen
    /// (empty), anything else was not.
    fn not_seen(&mut self, folder: &Path, err: &std::io::Error) {
        if err.kind() != std::io::ErrorKind::NotFound {
            self.unseen.push(absolute(folder));
        }
    }
}

impl Registry {
    /// Scans `sources` (files or directories, recursively) and opens every `.npy` found.
    ///
    /// Paths that do not exist or cannot be listed are returned as errors in the
    /// second element and logged; they never prevent the others from serving.
    pub fn scan(sources: &[SourceSpec], options: &OpenOptions) -> (Registry, Vec<String>) {
        Self::scan_with_ids(sources, options, IdBook::default())
    }

    /// [`Registry::scan`], keeping the ids `ids` gave before (and giving new ones from it).
    pub fn scan_with_ids(
        sources: &[SourceSpec],
        options: &OpenOptions,
        ids: IdBook,
    ) -> (Registry, Vec<String>) {
        let found = Discovery::run(sources);
        for problem in &found.problems {
            tracing::warn!("{problem}");
        }
        let empty = Registry {
            ids: Arc::new(Mutex::new(ids)),
            ..Registry::default()
        };
        let registry = empty.rebuild(&found, |_| false, options);
        (registry, found.problems)
    }

    /// The registry for what `found` lists. Entries of `self` whose file is unchanged
    /// are kept as they are (not reopened, not logged again); new and changed files are
    /// opened. A file for which `unsettled` is true (still being written) keeps its
    /// previous entry, or waits for a later rebuild if it had none. Sources that are
    /// gone are dropped with one log line each.
    pub fn rebuild(
        &self,
        found: &Discovery,
        unsettled: impl Fn(&Path) -> bool,
        options: &OpenOptions,
    ) -> Registry {
        let mut next = Registry {
            ids: self.ids.clone(),
            ..Registry::default()
        };
        let given = self.ids.lock().assign_all(&found.candidates);
        let mut over_cap = 0usize;
        for (candidate, id) in found.candidates.iter().zip(&given) {
            if next.tensors.len() + next.refused.len() >= options.max_sources {
                over_cap += 1;
                continue;
            }
            let same_path = |p: &Path| p == candidate.path;
            let tensor = self.tensors.get(id).filter(|t| same_path(t.source.path()));
            let refused = self.refused.get(id).filter(|r| same_path(&r.path));
            if unsettled(&candidate.path) {
                next.carry(self, id, tensor, refused);
                continue;
            }
            let labels_same = self.label_overrides.get(id) == candidate.dim_labels.as_ref()
                && self.supplied.get(id) == candidate.supplied.as_ref();
            // The whole version as well: a store's chunk files are compared only here.
            let tensor = tensor.filter(|t| {
                labels_same && t.is_current() && t.version.file() == identity_at(&candidate.path)
            });
            let refused = refused.filter(|r| {
                labels_same
                    && self
                        .refused_identity(id)
                        .is_some_and(|held| Some(held) == identity_at(&r.path))
            });
            if tensor.is_some() || refused.is_some() {
                next.carry(self, id, tensor, refused);
                continue;
            }
            if *id != candidate.base {
                tracing::warn!(path = %candidate.path.display(), base = %candidate.base, %id, "source id collision resolved");
            }
            next.open_one(
                id.clone(),
                candidate.path.clone(),
                Settings {
                    labels: candidate.dim_labels.clone(),
                    supplied: candidate.supplied.clone(),
                    origin: Origin::Configured,
                    confine: candidate.confine.clone(),
                },
                options,
            );
        }
        if over_cap > 0 {
            tracing::warn!(
                files = over_cap,
                max_sources = options.max_sources,
                "files not served: the server serves at most max_sources sources; raise it \
                 (--max-sources, TESSERA_MAX_SOURCES, max_sources) to serve them"
            );
        }
        next.keep_unseen(self, found);
        self.ids.lock().flush();
        // Sources added at runtime are not on the configured paths: a rescan keeps them,
        // unless a configured file took the id meanwhile.
        for (id, origin) in &self.origins {
            if next.tensors.contains_key(id) || next.refused.contains_key(id) {
                tracing::warn!(source_id = %id, ?origin, "runtime source shadowed by a configured file with its id; removed");
                continue;
            }
            next.carry(self, id, self.tensors.get(id), self.refused.get(id));
        }
        for (id, tensor) in &self.tensors {
            let path = tensor.source.path();
            if !next.tensors.contains_key(id) && !found.paths().any(|p| p == path) {
                tracing::info!(source_id = %id, path = %path.display(), "source removed");
            }
        }
        next
    }

    /// Carries the configured sources of `previous` that lie in folders `found` could not
    /// list (and whose ids nothing else took): not seen is not gone.
    fn keep_unseen(&mut self, previous: &Registry, found: &Discovery) {
        let unseen: Vec<String> = previous
            .tensors
            .values()
            .map(|t| (t.source_id.as_str(), t.source.path()))
            .chain(
                previous
                    .refused
                    .values()
                    .map(|r| (r.source_id.as_str(), r.path.as_path())),
            )
            .filter(|(id, path)| {
                !previous.origins.contains_key(*id) && !self.knows(id) && found.unseen(path)
            })
            .map(|(id, _)| id.to_string())
            .collect();
        for id in unseen {
            tracing::debug!(source_id = %id, "kept: its folder could not be listed");
            self.carry(
                previous,
                &id,
                previous.tensors.get(&id),
                previous.refused.get(&id),
            );
        }
    }

    /// The ids given, shared by the registries rebuilt from this one; flush it
    /// ([`IdBook::flush`]) with no registry lock held.
    pub fn ids(&self) -> Arc<Mutex<IdBook>> {
        self.ids.clone()
    }

    /// How many sources are served or refused.
    pub fn count(&self) -> usize {
        self.tensors.len() + self.refused.len()
    }

    /// The generation of this registry's sources: equal generations hold the same ids at
    /// the same paths, opened from the same file versions.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Copies one entry of `previous` into `self` unchanged, with its settings.
    fn carry(
        &mut self,
        previous: &Registry,
        id: &str,
        tensor: Option<&Arc<Tensor>>,
        refused: Option<&Refused>,
    ) {
        if let Some(tensor) = tensor {
            self.tensors.insert(id.to_string(), tensor.clone());
        } else if let Some(refused) = refused {
            self.refused.insert(id.to_string(), refused.clone());
            if let Some(identity) = previous.refused_identity(id) {
                self.refused_identities.insert(id.to_string(), identity);
            }
        } else {
            return;
        }
        if let Some(labels) = previous.label_overrides.get(id) {
            self.label_overrides.insert(id.to_string(), labels.clone());
        }
        if let Some(supplied) = previous.supplied.get(id) {
            self.supplied.insert(id.to_string(), supplied.clone());
        }
        if let Some(origin) = previous.origins.get(id) {
            self.origins.insert(id.to_string(), origin.clone());
        }
        if let Some(confine) = previous.confines.get(id) {
            self.confines.insert(id.to_string(), confine.clone());
        }
    }

    /// The settings `id` was opened with.
    pub fn settings_of(&self, id: &str) -> Settings {
        Settings {
            labels: self.label_overrides.get(id).cloned(),
            supplied: self.supplied.get(id).cloned(),
            origin: self.origins.get(id).cloned().unwrap_or_default(),
            confine: self.confines.get(id).cloned(),
        }
    }

    fn open_one(&mut self, id: String, path: PathBuf, settings: Settings, options: &OpenOptions) {
        self.install(Opened::open(&id, &path, settings, options));
    }

    /// Puts what [`Opened::open`] made in place under its id: served, or refused with why.
    fn install(&mut self, opened: Opened) {
        let Opened {
            id,
            path,
            settings,
            result,
            identity,
        } = opened;
        let origin = settings.origin.clone();
        if let Some(labels) = settings.labels {
            self.label_overrides.insert(id.clone(), labels);
        }
        if let Some(supplied) = settings.supplied {
            self.supplied.insert(id.clone(), supplied);
        }
        if let Some(confine) = settings.confine {
            self.confines.insert(id.clone(), confine);
        }
        if origin != Origin::Configured {
            self.origins.insert(id.clone(), origin.clone());
        }
        match result {
            Ok(tensor) => {
                tracing::info!(
                    source_id = %id,
                    path = %path.display(),
                    shape = ?tensor.shape(),
                    dtype = %tensor.dtype_str(),
                    chunk = ?tensor.grid.chunk_shape(),
                    "serving source"
                );
                self.tensors.insert(id, Arc::new(tensor));
            }
            Err(reason) => {
                tracing::warn!(source_id = %id, path = %path.display(), %reason, "source refused");
                if let Some(identity) = identity {
                    self.refused_identities.insert(id.clone(), identity);
                }
                self.refused.insert(
                    id.clone(),
                    Refused {
                        source_id: id,
                        path,
                        reason,
                        after_change: false,
                        origin,
                    },
                );
            }
        }
    }

    /// Opens `path` again under `id`, replacing what was served (or refused) there;
    /// configured axis labels are kept.
    pub fn reopen(&mut self, id: &str, path: &Path, options: &OpenOptions) {
        let opened = Opened::open(id, path, self.settings_of(id), options);
        self.install_reopened(opened);
    }

    /// Puts a source reopened outside the lock ([`Opened::open`] with
    /// [`Registry::settings_of`]) in place of what was served (or refused) under its id;
    /// false, and nothing changed, when the id was removed meanwhile.
    pub fn install_reopened(&mut self, opened: Opened) -> bool {
        let id = opened.id.clone();
        if !self.knows(&id) {
            return false;
        }
        let was_served = self.tensors.remove(&id).is_some();
        let broke_before = self.refused.remove(&id).is_some_and(|r| r.after_change);
        self.refused_identities.remove(&id);
        self.install(opened);
        if let Some(refused) = self.refused.get_mut(&id) {
            refused.after_change = was_served || broke_before;
        }
        // The source's row changed (its shape, dtype or refusal): the catalog did.
        self.generation = next_generation();
        true
    }

    /// Whether `id` is served or refused.
    pub fn knows(&self, id: &str) -> bool {
        self.tensors.contains_key(id) || self.refused.contains_key(id)
    }

    /// `self` with the runtime sources of `current` in place of its own: a rescan started
    /// from an older snapshot neither loses a source added since nor brings back one
    /// removed since.
    pub fn with_runtime_of(mut self, current: &Registry) -> Registry {
        let own: Vec<String> = self.origins.keys().cloned().collect();
        for id in own {
            self.forget(&id);
        }
        for id in current.origins.keys() {
            if self.tensors.contains_key(id) || self.refused.contains_key(id) {
                continue;
            }
            self.carry(
                current,
                id,
                current.tensors.get(id),
                current.refused.get(id),
            );
        }
        self.generation = next_generation();
        self
    }

    /// Removes every trace of `id`.
    fn forget(&mut self, id: &str) {
        self.tensors.remove(id);
        self.refused.remove(id);
        self.label_overrides.remove(id);
        self.supplied.remove(id);
        self.origins.remove(id);
        self.confines.remove(id);
        self.refused_identities.remove(id);
    }

    /// Removes the source `id`; whether there was one.
    pub fn remove(&mut self, id: &str) -> bool {
        let known = self.tensors.contains_key(id) || self.refused.contains_key(id);
        if known {
            self.forget(id);
            self.generation = next_generation();
            tracing::info!(source_id = %id, "runtime source removed");
        }
        known
    }

    /// Adds a file opened outside the lock ([`Opened::open`]) under a new id made unique
    /// from `base`: its id, or why it cannot be served (it is then not registered).
    pub fn add(&mut self, base: &str, mut opened: Opened) -> Result<String, String> {
        let base = sanitize(base);
        let id = self
            .ids
            .lock()
            .assign(&base, &opened.path, |id| self.knows(id));
        if let Ok(tensor) = &mut opened.result {
            tensor.array_id.clone_from(&id);
            tensor.source_id.clone_from(&id);
        }
        opened.id.clone_from(&id);
        self.install(opened);
        self.generation = next_generation();
        if self.tensors.contains_key(&id) {
            return Ok(id);
        }
        let reason = self
            .refused
            .get(&id)
            .map_or_else(|| "not opened".to_string(), |r| r.reason.clone());
        self.forget(&id);
        Err(reason)
    }

    /// Adds a source opened outside the lock under a new id made unique from `base`, served
    /// or refused (then listed with why, like a configured file that does not open): its id.
    pub fn add_kept(&mut self, base: &str, mut opened: Opened) -> String {
        let base = sanitize(base);
        let id = self
            .ids
            .lock()
            .assign(&base, &opened.path, |id| self.knows(id));
        if let Ok(tensor) = &mut opened.result {
            tensor.array_id.clone_from(&id);
            tensor.source_id.clone_from(&id);
        }
        opened.id.clone_from(&id);
        self.install(opened);
        self.generation = next_generation();
        id
    }

    /// Ids of every source (served or refused) by path.
    pub fn ids_by_path(&self) -> HashMap<PathBuf, String> {
        self.tensors
            .values()
            .map(|t| (t.source.path().to_path_buf(), t.source_id.clone()))
            .chain(
                self.refused
                    .values()
                    .map(|r| (r.path.clone(), r.source_id.clone())),
            )
            .collect()
    }

    /// The origin of `id` (configured unless it was added at runtime).
    pub fn origin(&self, id: &str) -> Origin {
        self.origins.get(id).cloned().unwrap_or_default()
    }

    /// Runtime sources: id and origin.
    pub fn runtime_sources(&self) -> impl Iterator<Item = (&String, &Origin)> {
        self.origins.iter()
    }

    /// The tensor with this exact array id or source id.
    pub fn get(&self, id: &str) -> Option<&Arc<Tensor>> {
        self.tensors.get(id)
    }

    /// This registry serving `tensor` too, under its source id (tests of the request path
    /// with a source of their own).
    #[cfg(test)]
    pub(crate) fn with_tensor(mut self, tensor: Arc<Tensor>) -> Registry {
        self.tensors.insert(tensor.source_id.clone(), tensor);
        self
    }

    /// All served tensors in id order.
    pub fn tensors(&self) -> impl Iterator<Item = &Arc<Tensor>> {
        self.tensors.values()
    }

    /// All refused files in id order.
    pub fn refused(&self) -> impl Iterator<Item = &Refused> {
        self.refused.values()
    }

    /// A refused file by id.
    pub fn refused_source(&self, id: &str) -> Option<&Refused> {
        self.refused.get(id)
    }

    /// The identity a refused file had when it was refused, if it could be stat'ed.
    pub fn refused_identity(&self, id: &str) -> Option<FileVersion> {
        self.refused_identities.get(id).copied()
    }

    /// How many sources are served.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether no source is served.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
}

/// Device, inode, size and mtime of the file at `path` now (a Zarr store: its tree's version,
/// `source/zarr/version.rs`), or `None` if it cannot be stat'ed.
pub fn identity_at(path: &Path) -> Option<FileVersion> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_dir() {
        return crate::source::zarr::tree_version(path);
    }
    Some(FileVersion::of(&meta))
}

/// What a source is opened with besides its path.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// Configured axis labels.
    pub labels: Option<Vec<String>>,
    /// Configured metadata and physical scale.
    pub supplied: Option<Arc<Supplied>>,
    /// Where it came from.
    pub origin: Origin,
    /// Where its file may really be (checked at every open, see [`Confine`]).
    pub confine: Option<Arc<Confine>>,
}

impl Settings {
    /// The confinement that applies under `options`: a runtime source's always, a
    /// configured one's unless links may lead out of the served folder.
    fn confine_under(&self, options: &OpenOptions) -> Option<&Arc<Confine>> {
        self.confine
            .as_ref()
            .filter(|_| self.origin.is_dropped() || !options.follow_links_outside)
    }
}

/// A source opened, or refused with why, without the registry's lock: file I/O never
/// happens under it (a FIFO or a slow disk would stall every request).
#[derive(Debug)]
pub struct Opened {
    id: String,
    path: PathBuf,
    settings: Settings,
    result: Result<Tensor, String>,
    /// The identity of a refused file, so it is retried only once it changes.
    identity: Option<FileVersion>,
}

impl Opened {
    /// Opens the file at `path` as source `id` with `settings`.
    pub fn open(id: &str, path: &Path, settings: Settings, options: &OpenOptions) -> Opened {
        let result = open_tensor(id, path, &settings, options);
        let identity = result.as_ref().err().and_then(|_| identity_at(path));
        Opened {
            id: id.to_string(),
            path: path.to_path_buf(),
            settings,
            result,
            identity,
        }
    }

    /// A source opened elsewhere (an upstream server's tensor, `upstream/`), or refused
    /// with why, as source `id` at `path` (its url) with `settings`.
    pub fn of_source(
        id: &str,
        path: &Path,
        source: Result<Arc<dyn Source>, String>,
        settings: Settings,
        options: &OpenOptions,
    ) -> Opened {
        let result = source.and_then(|source| tensor_of(id, path, source, &settings, options));
        Opened {
            id: id.to_string(),
            path: path.to_path_buf(),
            settings,
            result,
            identity: None,
        }
    }
}

fn open_tensor(
    id: &str,
    path: &Path,
    settings: &Settings,
    options: &OpenOptions,
) -> Result<Tensor, String> {
    let confine = settings.confine_under(options);
    let place = confine.map(|c| {
        let c = c.clone();
        Arc::new(move |file: &std::fs::File| c.check(file)) as Placement
    });
    let source = formats::open(path, &options.limits, place)?;
    tensor_of(id, path, source, settings, options)
}

/// One grid of the source's own chunks for both routes (`Source::cells_are_native`);
/// `None`: the grids are planned for their readers, as they are when a native chunk is
/// over the cap (it is then read in parts, as any source's).
fn native_cells(source: &dyn Source) -> Option<ChunkGrid> {
    if !source.cells_are_native() {
        return None;
    }
    let native = source.native_chunk()?;
    ChunkGrid::with_chunk_shape(source.shape(), source.dtype().itemsize as u64, &native).ok()
}

/// The tensor of an opened `source`: its grids, labels and metadata.
fn tensor_of(
    id: &str,
    path: &Path,
    source: Arc<dyn Source>,
    settings: &Settings,
    options: &OpenOptions,
) -> Result<Tensor, String> {
    let labels = settings.labels.as_deref();
    let confine = settings.confine_under(options);
    let shape = source.shape();
    let native = source.native_chunk();
    let itemsize = source.dtype().itemsize as u64;
    let fortran = source.fortran_order();
    // The fine grid cuts large planes into tiles for socket readers; the coarse grid keeps
    // contiguity for clients that map (docs/decisions/0003, 0015).
    let plan_grid = |target: u64, socket: bool| {
        match &native {
            _ if socket => ChunkGrid::socket(shape, itemsize, fortran, native.as_deref(), target),
            Some(native) => ChunkGrid::fitted(shape, itemsize, native, target),
            None => ChunkGrid::plan(shape, itemsize, fortran, target),
        }
        .map_err(|e| format!("{}: {e}", path.display()))
    };
    let (grid, mapped_grid) = match native_cells(source.as_ref()) {
        Some(grid) => (grid.clone(), grid),
        None => (
            plan_grid(options.target_chunk_bytes, true)?,
            plan_grid(
                mapped_target(
                    shape,
                    itemsize,
                    fortran,
                    options.target_chunk_bytes,
                    options.mapped_chunk_bytes.max(options.target_chunk_bytes),
                ),
                false,
            )?,
        ),
    };
    let version = source.version();
    let rank = shape.len();
    let dim_labels = match labels {
        None => source
            .dim_labels()
            .unwrap_or_else(|| default_dim_labels(shape)),
        Some(labels) if labels.len() == rank => labels.to_vec(),
        Some(labels) => {
            return Err(format!(
                "{}: configured dim_labels {labels:?} name {} axes, but the tensor has {rank}",
                path.display(),
                labels.len()
            ));
        }
    };
    let mut meta = meta::load(
        path,
        rank,
        settings.supplied.as_deref(),
        confine.map(|c| &**c),
    );
    if meta.physical_scale.is_empty()
        && let Some((scale, unit)) = source.physical_scale()
    {
        meta.physical_scale = scale;
        meta.physical_unit = unit;
    }
    Ok(Tensor {
        array_id: id.to_string(),
        source_id: id.to_string(),
        source,
        grid,
        mapped_grid,
        dim_labels,
        version,
        origin: settings.origin.clone(),
        meta,
    })
}

/// The tensor of a stored level of `parent`'s source (`source`, served as `id`): grids of
/// its own, the parent's labels, origin and metadata, the physical scale the level reports.
pub fn level_tensor(
    parent: &Tensor,
    id: &str,
    source: Arc<dyn Source>,
    options: &OpenOptions,
) -> Result<Tensor, String> {
    let shape = source.shape().to_vec();
    let itemsize = source.dtype().itemsize as u64;
    let grid_of = |target: u64, socket: bool| {
        let native = source.native_chunk();
        match &native {
            _ if socket => ChunkGrid::socket(&shape, itemsize, false, native.as_deref(), target),
            Some(native) => ChunkGrid::fitted(&shape, itemsize, native, target),
            None => ChunkGrid::plan(&shape, itemsize, false, target),
        }
        .map_err(|e| format!("level '{id}': {e}"))
    };
    let (grid, mapped_grid) = match native_cells(source.as_ref()) {
        Some(grid) => (grid.clone(), grid),
        None => (
            grid_of(options.target_chunk_bytes, true)?,
            grid_of(
                options.mapped_chunk_bytes.max(options.target_chunk_bytes),
                false,
            )?,
        ),
    };
    let mut meta = parent.meta.clone();
    if let Some((scale, unit)) = source.physical_scale() {
        meta.physical_scale = scale;
        meta.physical_unit = unit;
    }
    Ok(Tensor {
        array_id: id.to_string(),
        source_id: parent.source_id.clone(),
        version: source.version(),
        source,
        grid,
        mapped_grid,
        dim_labels: parent.dim_labels.clone(),
        origin: parent.origin.clone(),
        meta,
    })
}

/// Adds the spec's file, or the files of its directory (recursively), to `out` in
/// sorted order; unreadable subdirectories are noted in `found` and skipped.
fn collect(
    spec: &SourceSpec,
    out: &mut Vec<Candidate>,
    found: &mut Discovery,
) -> std::io::Result<()> {
    let path = spec.path.as_path();
    let alias = spec.options.id.as_deref();
    let labels = &spec.options.dim_labels;
    let supplied = &spec.options.supplied;
    let meta = std::fs::metadata(path)?;
    let confine = Confine::served_folder(path).map(Arc::new);
    // A file or store given by name is served under its stem; a store that is a group
    // (an OME-Zarr image) also serves its members, under the stem and their path.
    let named = meta.is_file() || formats::is_served(path, true);
    let stem = path
        .file_name()
        .map(|s| formats::strip_extension(&s.to_string_lossy()).to_string())
        .unwrap_or_default();
    if named {
        out.push(Candidate {
            base: sanitize(alias.unwrap_or(&stem)),
            path: absolute(path),
            dim_labels: labels.clone(),
            supplied: supplied.clone(),
            confine: confine.clone(),
        });
        if meta.is_file() || !formats::walks_into(path) {
            return Ok(());
        }
    }
    let prefix = match alias {
        Some(alias) => Some(alias.to_string()),
        None if named => Some(stem),
        None => None,
    };
    let mut files = Vec::new();
    walk(path, &mut files, found)?;
    files.sort();
    for file in files {
        let rel = file.strip_prefix(path).unwrap_or(&file);
        // Each component without the extension of a format (`cells.npy` → `cells`,
        // `image.zarr/0` → `image.0`).
        let mut parts: Vec<String> = rel
            .iter()
            .map(|c| formats::strip_extension(&c.to_string_lossy()).to_string())
            .collect();
        if let Some(prefix) = &prefix {
            parts.insert(0, prefix.clone());
        }
        out.push(Candidate {
            base: sanitize(&parts.join(".")),
            path: absolute(&file),
            dim_labels: labels.clone(),
            supplied: supplied.clone(),
            confine: confine.clone(),
        });
    }
    Ok(())
}

/// Recursively lists the files and stores served under `dir` (into Zarr groups, not into
/// arrays); unreadable subdirectories are noted and skipped.
fn walk(dir: &Path, out: &mut Vec<PathBuf>, found: &mut Discovery) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        let is_dir = kind.is_dir();
        let served = formats::is_served(&path, is_dir);
        if is_dir && served {
            out.push(path.clone());
        }
        if is_dir && (!served || formats::walks_into(&path)) {
            if let Err(err) = walk(&path, out, found) {
                found
                    .problems
                    .push(format!("{}: directory skipped: {err}", path.display()));
                found.not_seen(&path, &err);
            }
        } else if !is_dir && served && (kind.is_file() || path.is_file()) {
            out.push(path);
        }
    }
    Ok(())
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Replaces every character outside `[A-Za-z0-9._-]` with `_`; an empty id becomes `_`.
pub fn sanitize(raw: &str) -> String {
    let id: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if id.is_empty() { "_".to_string() } else { id }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Writes a `|u1` C-order `.npy` of `shape` holding `values`.
    pub(crate) fn npy(path: &Path, shape: &[usize], values: &[u8]) {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        let shape = match dims.as_slice() {
            [one] => format!("({one},)"),
            _ => format!("({})", dims.join(", ")),
        };
        let mut header = format!("{{'descr': '|u1', 'fortran_order': False, 'shape': {shape}, }}");
        let total = 10 + header.len() + 1;
        header.push_str(&" ".repeat((64 - total % 64) % 64));
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(values);
        std::fs::write(path, out).unwrap();
    }

    fn options() -> OpenOptions {
        OpenOptions::with_target(1 << 20)
    }

    fn spec(path: &Path, id: Option<&str>, labels: Option<&[&str]>) -> SourceSpec {
        SourceSpec {
            path: path.to_path_buf(),
            options: SourceOptions {
                id: id.map(str::to_string),
                dim_labels: labels.map(|l| l.iter().map(|s| s.to_string()).collect()),
                supplied: None,
            },
        }
    }

    #[test]
    fn aliases_name_files_and_prefix_directories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plate")).unwrap();
        npy(&dir.path().join("plate/w1.npy"), &[2, 3], &[0; 6]);
        npy(&dir.path().join("cells.npy"), &[4], &[1, 2, 3, 4]);
        let (registry, problems) = Registry::scan(
            &[
                spec(&dir.path().join("cells.npy"), Some("alpha"), None),
                spec(&dir.path().join("plate"), Some("p7"), Some(&["row", "col"])),
            ],
            &options(),
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert!(registry.get("cells").is_none());
        assert_eq!(registry.get("alpha").unwrap().shape(), [4]);
        let well = registry.get("p7.w1").unwrap();
        assert_eq!(well.dim_labels, ["row", "col"]);
        assert_eq!(well.array_id, "p7.w1");
    }

    #[test]
    fn labels_of_the_wrong_rank_refuse_the_source_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.npy");
        npy(&path, &[2, 3], &[0; 6]);
        let (mut registry, _) =
            Registry::scan(&[spec(&path, None, Some(&["z", "y", "x"]))], &options());
        assert!(registry.get("v").is_none());
        let reason = &registry.refused_source("v").unwrap().reason;
        assert!(
            reason.contains("dim_labels") && reason.contains("has 2"),
            "{reason}"
        );

        npy(&path, &[1, 2, 3], &[0; 6]);
        registry.reopen("v", &path, &options());
        assert_eq!(registry.get("v").unwrap().dim_labels, ["z", "y", "x"]);
    }

    #[test]
    fn refused_files_are_retried_only_when_they_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.npy");
        std::fs::write(&path, b"not an npy file").unwrap();
        let specs = [SourceSpec::from(dir.path().to_path_buf())];
        let (registry, _) = Registry::scan(&specs, &options());
        assert!(registry.refused_source("bad").is_some());
        let found = Discovery::run(&specs);
        let again = registry.rebuild(&found, |_| false, &options());
        assert!(again.refused_source("bad").is_some());

        npy(&path, &[2], &[7, 8]);
        let fixed = again.rebuild(&Discovery::run(&specs), |_| false, &options());
        assert_eq!(fixed.get("bad").unwrap().shape(), [2]);
    }

    #[test]
    fn refusals_quote_bytes_of_regular_files_only() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("passwd");
        std::fs::write(&secret, b"root:x:0:0:root:/root:/bin/sh\n").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(&secret, dir.path().join("link.npy")).unwrap();
        std::fs::copy(&secret, dir.path().join("copy.npy")).unwrap();
        let specs = [SourceSpec::from(dir.path().to_path_buf())];
        // By default a link out of the served folder is refused as that, quoting nothing.
        let (confined, _) = Registry::scan(&specs, &options());
        let link = &confined.refused_source("link").unwrap().reason;
        assert!(
            link.contains("resolves outside the served folder"),
            "{link}"
        );
        assert!(
            !link.contains("root:") && !link.contains("passwd"),
            "{link}"
        );
        let follow = OpenOptions {
            follow_links_outside: true,
            ..options()
        };
        let (registry, _) = Registry::scan(&specs, &follow);

        let link = &registry.refused_source("link").unwrap().reason;
        assert!(!link.contains("root"), "{link}");
        assert!(link.contains("not a .npy file"), "{link}");
        assert!(link.contains("symbolic link"), "{link}");
        // A regular file served by name still shows what it begins with.
        let copy = &registry.refused_source("copy").unwrap().reason;
        assert!(copy.contains("root:x:0"), "{copy}");
    }

    fn dropped(root: &Path) -> Settings {
        Settings {
            origin: Origin::Dropped {
                label: "drop".into(),
                root: root.to_path_buf(),
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_rescan_keeps_the_runtime_sources_of_the_swap_not_of_its_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        npy(&dir.path().join("conf.npy"), &[2], &[1, 2]);
        let inbox = tempfile::tempdir().unwrap();
        npy(&inbox.path().join("a.npy"), &[1], &[3]);
        npy(&inbox.path().join("b.npy"), &[1], &[4]);
        let specs = [SourceSpec::from(dir.path().to_path_buf())];
        let (mut current, _) = Registry::scan(&specs, &options());
        let a = current
            .add(
                "drop.a",
                Opened::open(
                    "drop.a",
                    &inbox.path().join("a.npy"),
                    dropped(inbox.path()),
                    &options(),
                ),
            )
            .unwrap();
        let before = current.generation();
        // A rescan starts from this snapshot; meanwhile `a` is removed and `b` added.
        let snapshot = current.clone();
        assert!(current.remove(&a));
        let b = current
            .add(
                "drop.b",
                Opened::open(
                    "drop.b",
                    &inbox.path().join("b.npy"),
                    dropped(inbox.path()),
                    &options(),
                ),
            )
            .unwrap();
        assert_ne!(current.generation(), before);
        let rescanned = snapshot.rebuild(&Discovery::run(&specs), |_| false, &options());
        assert!(
            rescanned.get(&a).is_some(),
            "a rebuild alone keeps runtime sources"
        );
        let swapped = rescanned.with_runtime_of(&current);
        assert!(
            swapped.get(&a).is_none(),
            "removed during the rescan: stays removed"
        );
        assert_eq!(swapped.get(&b).unwrap().source_url(), "dnd://drop/b.npy");
        assert!(swapped.get("conf").is_some());
        assert!(!swapped.origin("conf").is_dropped());
    }

    #[test]
    fn runtime_ids_never_take_a_served_id_and_bad_files_are_not_kept() {
        let dir = tempfile::tempdir().unwrap();
        npy(&dir.path().join("x.npy"), &[1], &[1]);
        std::fs::write(dir.path().join("bad.npy"), b"nope").unwrap();
        let mut registry = Registry::default();
        let first = registry
            .add(
                "x",
                Opened::open(
                    "x",
                    &dir.path().join("x.npy"),
                    dropped(dir.path()),
                    &options(),
                ),
            )
            .unwrap();
        let second = registry
            .add(
                "x",
                Opened::open(
                    "x",
                    &dir.path().join("x.npy"),
                    dropped(dir.path()),
                    &options(),
                ),
            )
            .unwrap();
        assert_eq!((first.as_str(), second.as_str()), ("x", "x-2"));
        let refused = registry.add(
            "bad",
            Opened::open(
                "bad",
                &dir.path().join("bad.npy"),
                dropped(dir.path()),
                &options(),
            ),
        );
        assert!(refused.unwrap_err().contains("not a .npy file"));
        assert!(registry.refused_source("bad").is_none());
    }

    #[test]
    fn sanitize_keeps_safe_characters_only() {
        assert_eq!(sanitize("a b/c'd.e-f_g"), "a_b_c_d.e-f_g");
        assert_eq!(sanitize(""), "_");
    }

    #[test]
    fn an_id_stays_with_its_file_when_a_colliding_file_appears() {
        let dir = tempfile::tempdir().unwrap();
        npy(&dir.path().join("a_b.npy"), &[1], &[1]);
        let specs = [SourceSpec::from(dir.path().to_path_buf())];
        let (registry, _) = Registry::scan(&specs, &options());
        assert_eq!(registry.get("a_b").unwrap().shape(), [1]);
        // `a b.npy` sorts first and derives the same id: it gets the next one.
        npy(&dir.path().join("a b.npy"), &[2], &[2, 2]);
        let next = registry.rebuild(&Discovery::run(&specs), |_| false, &options());
        assert_eq!(next.get("a_b").unwrap().shape(), [1]);
        assert_eq!(next.get("a_b-2").unwrap().shape(), [2]);
    }
}
