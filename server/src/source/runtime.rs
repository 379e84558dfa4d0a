//! Sources added and removed at runtime (`add_source`, `remove_source`).
//!
//! Registering a path of the server's filesystem is a privileged act. It is allowed only
//! under the configured roots (`add_source_roots`, none by default: refused), judged on the
//! path with every symbolic link and `..` resolved — the path asked for and each file found
//! under it — and, like every call, only with the token when one is configured.
//!
//! An added path is a *runtime root* labelled by its base name (made unique): its files are
//! served as `dnd://LABEL/REL` (see [`Origin`]) under ids `LABEL.REL` with `.npy` cut and
//! `/` as `.`. Adding a path again rebuilds its sources against the files as they are now
//! and removes those whose files are gone. Runtime sources live in memory only: they do not
//! survive a restart (docs/decisions/0016).

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use crate::source::confine::Confine;
use crate::source::origin::{DND_PREFIX, Origin};
use crate::source::registry::{OpenOptions, Opened, Registry, Settings, sanitize};
use crate::source::sources::Sources;

/// Default most `.npy` files one `add_source` of a directory registers.
pub const DEFAULT_MAX_FILES: usize = 10_000;
/// Default of `object_store_max_objects`: the most objects one listing of an object-store
/// prefix takes in (here, below the object stores, so runtime roots need not reach up).
pub const DEFAULT_MAX_OBJECTS: usize = 100_000;

/// Where runtime sources may come from.
#[derive(Clone, Debug)]
pub struct RuntimeRoots {
    /// Directories under which paths may be added; empty (and no object-store prefix):
    /// adding is refused.
    pub roots: Vec<PathBuf>,
    /// Object-store prefixes (`s3://BUCKET/PREFIX/`, `gs://…`, `az://…`) under which
    /// addresses of the same cloud may be added (`objstore::runtime`).
    pub object_stores: Vec<String>,
    /// Most `.npy` files one directory may hold to be added (the large-scan threshold).
    pub max_files: usize,
    /// Most objects one listing of an added object-store address takes in.
    pub max_objects: usize,
}

impl Default for RuntimeRoots {
    fn default() -> Self {
        Self {
            roots: Vec::new(),
            object_stores: Vec::new(),
            max_files: DEFAULT_MAX_FILES,
            max_objects: DEFAULT_MAX_OBJECTS,
        }
    }
}

/// Why an `add_source` or `remove_source` request is refused as a whole.
///
/// No refusal names where a path resolves, or whether a path outside the roots exists:
/// only paths under a root are told apart.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// No roots are configured (docs/decisions/0033: there is no default root).
    #[error(
        "adding sources at runtime (register_local_path, napari's drag and drop) is turned \
         off on this server: start it with --add-source-root DIR (repeatable; or \
         TESSERA_ADD_SOURCE_ROOTS=DIR1:DIR2, or add_source_roots in the config file) naming \
         the folders sources may be added from, for example --add-source-root \"$HOME\""
    )]
    Disabled,
    /// The path is relative or empty.
    #[error("'{0}' is not an absolute path on the server")]
    NotAbsolute(String),
    /// The path, under a root, cannot be resolved.
    #[error("'{path}' does not exist on the server or cannot be resolved: {source}")]
    NotFound {
        /// The path asked for.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The path lies outside every root, or cannot be told to lie inside one.
    #[error(
        "'{0}' is outside the directories sources may be added from (add_source_roots); \
         to allow it, start the server with --add-source-root naming a folder that holds it \
         (or add it to TESSERA_ADD_SOURCE_ROOTS)"
    )]
    OutsideRoots(String),
    /// An object-store address that cannot be added: not one this build reads, or under
    /// no object-store prefix of `add_source_roots`.
    #[error("'{url}' cannot be added: {why}")]
    ObjectStore {
        /// The address asked for.
        url: String,
        /// Why.
        why: String,
    },
    /// `remove_source` of something other than a runtime root.
    #[error(
        "remove_source removes only sources added at runtime: root_url must be a dnd:// \
         url naming them, not '{0}'"
    )]
    NotDnd(String),
}

/// The outcome of one `add_source`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AddReport {
    /// Ids of sources registered now.
    pub added: Vec<String>,
    /// Ids of sources that were already served.
    pub already_present: Vec<String>,
    /// Of those, the ones rebuilt against their file as it is now.
    pub refreshed: Vec<String>,
    /// Ids of runtime sources under the path whose files are gone, now removed.
    pub removed: Vec<String>,
    /// `(path, reason)` of what could not be registered.
    pub failed: Vec<(String, String)>,
}

/// A checked `add_source` request, ready to run.
#[derive(Debug)]
pub struct AddPlan {
    asked: String,
    resolved: PathBuf,
    roots: Vec<PathBuf>,
    max_files: usize,
}

/// The runtime root an add registers under: its label and canonical path.
#[derive(Debug)]
struct Place {
    label: String,
    root: PathBuf,
}

/// `url` (a path or a `file://` url) checked against `config`: resolved and under a root.
pub fn plan_add(config: &RuntimeRoots, url: &str) -> Result<AddPlan, RuntimeError> {
    if config.roots.is_empty() {
        if config.object_stores.is_empty() {
            return Err(RuntimeError::Disabled);
        }
        return Err(RuntimeError::OutsideRoots(url.to_string()));
    }
    let raw = url.strip_prefix("file://").unwrap_or(url);
    let asked = Path::new(raw);
    if raw.is_empty() || !asked.is_absolute() {
        return Err(RuntimeError::NotAbsolute(url.to_string()));
    }
    let roots: Vec<PathBuf> = config
        .roots
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .collect();
    let resolved = match std::fs::canonicalize(asked) {
        Ok(resolved) => resolved,
        // Whether a path outside the roots exists is not the client's to learn.
        Err(source) if under_any(&lexical(asked), &config.roots) => {
            return Err(RuntimeError::NotFound {
                path: url.to_string(),
                source,
            });
        }
        Err(_) => return Err(RuntimeError::OutsideRoots(url.to_string())),
    };
    if !under_any(&resolved, &roots) {
        return Err(RuntimeError::OutsideRoots(url.to_string()));
    }
    Ok(AddPlan {
        asked: url.to_string(),
        resolved,
        roots,
        max_files: config.max_files,
    })
}

/// `path` with `.` and `..` resolved by name alone (no link followed).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn under_any(path: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|r| path.starts_with(r))
}

/// Served files by what they are (device and inode) and by path, with their ids.
struct Known {
    by_identity: HashMap<(u64, u64), String>,
    by_path: HashMap<PathBuf, String>,
}

impl Known {
    fn of(registry: &Registry) -> Known {
        let mut by_identity: HashMap<(u64, u64), String> = registry
            .tensors()
            .filter_map(|t| {
                let id = t.version.file()?;
                Some(((id.dev, id.ino), t.source_id.clone()))
            })
            .collect();
        for refused in registry.refused() {
            if let Some(id) = registry.refused_identity(&refused.source_id) {
                by_identity.insert((id.dev, id.ino), refused.source_id.clone());
            }
        }
        Known {
            by_identity,
            by_path: registry.ids_by_path(),
        }
    }

    /// The id serving the file found at `file` (resolved to `resolved`), if one does.
    fn id_of(&self, file: &Path, resolved: &Path) -> Option<&String> {
        let identity = std::fs::metadata(resolved)
            .ok()
            .and_then(|m| self.by_identity.get(&(m.dev(), m.ino())));
        identity
            .or_else(|| self.by_path.get(file))
            .or_else(|| self.by_path.get(resolved))
    }
}

impl AddPlan {
    /// Registers the plan's files. `progress(count, path)` is called after each source
    /// registered (added, or already served and refreshed: `count` of them so far); a file
    /// that fails is only reported in the result. When `progress` returns false (the client
    /// went away) the walk stops, keeping what it registered.
    ///
    /// Adds run one at a time (a second waits for the first), so a file is served once
    /// however many calls name it, and two roots of the same name get distinct labels.
    pub fn run(
        self,
        sources: &Sources,
        mut progress: impl FnMut(usize, &Path) -> bool,
    ) -> AddReport {
        let _one_at_a_time = sources.serialize_adds();
        let mut report = AddReport::default();
        let files = match self.files() {
            Ok(files) => files,
            Err(reason) => {
                report.failed.push((self.asked.clone(), reason));
                return report;
            }
        };
        let place = self.place(sources);
        let options = sources.open_options().clone();
        let settings = Settings {
            origin: Origin::Dropped {
                label: place.label.clone(),
                root: place.root.clone(),
            },
            confine: Some(Arc::new(Confine::add_source_roots(self.roots.clone()))),
            ..Default::default()
        };
        let known = Known::of(&sources.read());
        // Ids given are written down after the loop, with no registry lock held.
        let ids = sources.read().ids();
        let mut count = 0usize;
        for file in &files {
            let resolved = match std::fs::canonicalize(file) {
                Ok(r) if under_any(&r, &self.roots) => r,
                Ok(_) => {
                    report.failed.push((
                        file.display().to_string(),
                        "resolves outside add_source_roots".to_string(),
                    ));
                    continue;
                }
                Err(e) => {
                    report.failed.push((
                        file.display().to_string(),
                        format!("cannot be resolved: {e}"),
                    ));
                    continue;
                }
            };
            if let Some(id) = known.id_of(file, &resolved) {
                let (path, settings) = {
                    let registry = sources.read();
                    let path = registry
                        .get(id)
                        .map(|t| t.source.path().to_path_buf())
                        .unwrap_or_else(|| file.clone());
                    (path, registry.settings_of(id))
                };
                let opened = Opened::open(id, &path, settings, &options);
                sources.write().install_reopened(opened);
                report.already_present.push(id.clone());
                report.refreshed.push(id.clone());
            } else {
                let served = sources.read().count();
                if served >= options.max_sources {
                    report
                        .failed
                        .push((self.asked.clone(), over_cap(served, &options)));
                    break;
                }
                let base = place.id_base(file);
                let opened = Opened::open(&base, file, settings.clone(), &options);
                match sources.write().add(&base, opened) {
                    Ok(id) => report.added.push(id),
                    Err(reason) => {
                        report.failed.push((file.display().to_string(), reason));
                        continue;
                    }
                }
            }
            count += 1;
            if !progress(count, file) {
                tracing::info!(path = %self.asked, count, "add_source cancelled by the client");
                ids.lock().flush();
                return report;
            }
        }
        ids.lock().flush();
        report.removed = self.remove_gone(sources);
        tracing::info!(
            path = %self.asked,
            added = report.added.len(),
            refreshed = report.refreshed.len(),
            removed = report.removed.len(),
            failed = report.failed.len(),
            "add_source done"
        );
        report
    }

    /// The runtime root the files go under: the one the path lies in already (its sources
    /// keep their place), else a new one labelled by the path's base name, made unique.
    fn place(&self, sources: &Sources) -> Place {
        let existing: BTreeSet<(String, PathBuf)> = sources
            .read()
            .runtime_sources()
            .filter_map(|(_, origin)| match origin {
                Origin::Dropped { label, root } => Some((label.clone(), root.clone())),
                Origin::Configured | Origin::Upstream { .. } | Origin::ObjectStore { .. } => None,
            })
            .collect();
        if let Some((label, root)) = existing.iter().find(|(_, r)| self.resolved.starts_with(r)) {
            return Place {
                label: label.clone(),
                root: root.clone(),
            };
        }
        let base = self
            .resolved
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "root".to_string());
        let mut label = base.clone();
        let mut n = 1;
        while existing.iter().any(|(l, _)| *l == label) {
            n += 1;
            label = format!("{base}-{n}");
        }
        Place {
            label,
            root: self.resolved.clone(),
        }
    }

    /// The `.npy` files to register, in path order, or why there are none.
    fn files(&self) -> Result<Vec<PathBuf>, String> {
        let meta = std::fs::metadata(&self.resolved).map_err(|e| format!("cannot be read: {e}"))?;
        if meta.is_file() {
            if crate::source::formats::is_served(&self.resolved, false) {
                return Ok(vec![self.resolved.clone()]);
            }
            return Err("is not a .npy file".to_string());
        }
        if !meta.is_dir() {
            return Err(
                "is neither a regular file nor a directory (a FIFO, socket or device)".to_string(),
            );
        }
        let mut found = Vec::new();
        if crate::source::formats::is_served(&self.resolved, true) {
            found.push(self.resolved.clone());
            if !crate::source::formats::walks_into(&self.resolved) {
                return Ok(found);
            }
        }
        walk(&self.resolved, &mut found, self.max_files)?;
        found.sort();
        Ok(found)
    }

    /// Removes runtime sources at or under the added path whose files are gone (looked for
    /// with no lock held).
    fn remove_gone(&self, sources: &Sources) -> Vec<String> {
        let under: Vec<(String, PathBuf)> = {
            let registry = sources.read();
            registry
                .tensors()
                .map(|t| {
                    (
                        t.source_id.clone(),
                        t.origin.clone(),
                        t.source.path().to_path_buf(),
                    )
                })
                .chain(
                    registry
                        .refused()
                        .map(|r| (r.source_id.clone(), r.origin.clone(), r.path.clone())),
                )
                .filter(|(_, origin, path)| origin.is_dropped() && path.starts_with(&self.resolved))
                .map(|(id, _, path)| (id, path))
                .collect()
        };
        let gone: Vec<String> = under
            .into_iter()
            .filter(|(_, path)| !path.exists())
            .map(|(id, _)| id)
            .collect();
        let mut registry = sources.write();
        for id in &gone {
            registry.remove(id);
        }
        gone
    }
}

/// Why the rest of an add is refused: the server serves `served` sources, its most.
fn over_cap(served: usize, options: &OpenOptions) -> String {
    format!(
        "not all added: the server serves {served} sources, the most it serves at once \
         (max_sources {}); remove sources or raise the limit (--max-sources, \
         TESSERA_MAX_SOURCES, max_sources)",
        options.max_sources
    )
}

impl Place {
    /// The id a new source at `file` is made from: the label and the path under the root.
    fn id_base(&self, file: &Path) -> String {
        let strip = crate::source::formats::strip_extension;
        let mut parts = vec![strip(&self.label).to_string()];
        if let Ok(rel) = file.strip_prefix(&self.root) {
            parts.extend(rel.iter().map(|c| strip(&c.to_string_lossy()).to_string()));
        }
        sanitize(&parts.join("."))
    }
}

/// Lists the files and stores served under `dir` (recursively, not following directory
/// links; into Zarr groups, not into arrays); refused
/// once more than `max` are found.
fn walk(dir: &Path, out: &mut Vec<PathBuf>, max: usize) -> Result<(), String> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("{}: cannot be listed: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: cannot be listed: {e}", dir.display()))?;
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let is_dir = kind.is_dir();
        let served = crate::source::formats::is_served(&path, is_dir);
        if is_dir && (!served || crate::source::formats::walks_into(&path)) {
            if served {
                out.push(path.clone());
            }
            walk(&path, out, max)?;
        } else if served && (is_dir || kind.is_file() || path.is_file()) {
            out.push(path);
            if out.len() > max {
                return Err(format!(
                    "holds more than {max} .npy files, the most one add_source registers \
                     (add_source_max_files); add its subdirectories one by one or raise the limit"
                ));
            }
        }
    }
    Ok(())
}

/// Removes every runtime source whose `source_url` is `root_url` or under it; their ids.
pub fn remove(sources: &Sources, root_url: &str) -> Result<Vec<String>, RuntimeError> {
    let Some(rest) = root_url.strip_prefix(DND_PREFIX) else {
        return Err(RuntimeError::NotDnd(root_url.to_string()));
    };
    if rest.trim_matches(['/', '\\']).is_empty() {
        return Err(RuntimeError::NotDnd(root_url.to_string()));
    }
    let prefix = format!("{}/", root_url.trim_end_matches('/'));
    let mut registry = sources.write();
    let matching: Vec<String> = registry
        .tensors()
        .map(|t| (t.source_id.clone(), t.origin.clone(), t.source_url()))
        .chain(
            registry
                .refused()
                .map(|r| (r.source_id.clone(), r.origin.clone(), r.source_url())),
        )
        .filter(|(_, origin, url)| {
            origin.is_dropped()
                && (url == root_url.trim_end_matches('/') || url.starts_with(&prefix))
        })
        .map(|(id, _, _)| id)
        .collect();
    for id in &matching {
        registry.remove(id);
    }
    Ok(matching)
}
