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

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::source::origin::{DND_PREFIX, Origin};
use crate::source::registry::{Settings, sanitize};
use crate::source::sources::Sources;

/// Default most `.npy` files one `add_source` of a directory registers.
pub const DEFAULT_MAX_FILES: usize = 10_000;

/// Where runtime sources may come from.
#[derive(Clone, Debug)]
pub struct RuntimeRoots {
    /// Directories under which paths may be added; empty: adding is refused.
    pub roots: Vec<PathBuf>,
    /// Most `.npy` files one directory may hold to be added (the large-scan threshold).
    pub max_files: usize,
}

impl Default for RuntimeRoots {
    fn default() -> Self {
        Self {
            roots: Vec::new(),
            max_files: DEFAULT_MAX_FILES,
        }
    }
}

/// Why an `add_source` or `remove_source` request is refused as a whole.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// No roots are configured.
    #[error(
        "adding sources at runtime is turned off on this server: the operator lists the \
         directories it may add from in add_source_roots (config file) or --add-source-root"
    )]
    Disabled,
    /// The path is relative or empty.
    #[error("'{0}' is not an absolute path on the server")]
    NotAbsolute(String),
    /// The path cannot be resolved.
    #[error("'{path}' does not exist on the server or cannot be resolved: {source}")]
    NotFound {
        /// The path asked for.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The resolved path lies outside every root.
    #[error(
        "'{path}' (resolved to '{}') is outside the directories sources may be added from \
         (add_source_roots)", resolved.display()
    )]
    OutsideRoots {
        /// The path asked for.
        path: String,
        /// Where it resolves.
        resolved: PathBuf,
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
    label: String,
    root: PathBuf,
    max_files: usize,
}

/// `url` (a path or a `file://` url) checked against `config`: resolved and under a root.
pub fn plan_add(
    sources: &Sources,
    config: &RuntimeRoots,
    url: &str,
) -> Result<AddPlan, RuntimeError> {
    if config.roots.is_empty() {
        return Err(RuntimeError::Disabled);
    }
    let raw = url.strip_prefix("file://").unwrap_or(url);
    let asked = Path::new(raw);
    if raw.is_empty() || !asked.is_absolute() {
        return Err(RuntimeError::NotAbsolute(url.to_string()));
    }
    let resolved = std::fs::canonicalize(asked).map_err(|source| RuntimeError::NotFound {
        path: url.to_string(),
        source,
    })?;
    let roots: Vec<PathBuf> = config
        .roots
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .collect();
    if !under_any(&resolved, &roots) {
        return Err(RuntimeError::OutsideRoots {
            path: url.to_string(),
            resolved,
        });
    }
    let registry = sources.read();
    let existing: Vec<(String, PathBuf)> = registry
        .runtime_sources()
        .filter_map(|(_, origin)| match origin {
            Origin::Dropped { label, root } => Some((label.clone(), root.clone())),
            Origin::Configured => None,
        })
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    drop(registry);
    // Inside a runtime root already: its sources keep their place under that root.
    let (label, root) = match existing.iter().find(|(_, r)| resolved.starts_with(r)) {
        Some((label, root)) => (label.clone(), root.clone()),
        None => {
            let base = resolved
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "root".to_string());
            let mut label = base.clone();
            let mut n = 1;
            while existing.iter().any(|(l, _)| *l == label) {
                n += 1;
                label = format!("{base}-{n}");
            }
            (label, resolved.clone())
        }
    };
    Ok(AddPlan {
        asked: url.to_string(),
        resolved,
        roots,
        label,
        root,
        max_files: config.max_files,
    })
}

fn under_any(path: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|r| path.starts_with(r))
}

impl AddPlan {
    /// Registers the plan's files. `progress(count, path)` is called after each source
    /// registered (added, or already served and refreshed: `count` of them so far); a file
    /// that fails is only reported in the result. When `progress` returns false (the client went away) the walk stops, keeping
    /// what it registered.
    pub fn run(
        self,
        sources: &Sources,
        mut progress: impl FnMut(usize, &Path) -> bool,
    ) -> AddReport {
        let mut report = AddReport::default();
        let files = match self.files() {
            Ok(files) => files,
            Err(reason) => {
                report.failed.push((self.asked.clone(), reason));
                return report;
            }
        };
        let known = sources.read().ids_by_path();
        let options = sources.open_options().clone();
        let origin = Origin::Dropped {
            label: self.label.clone(),
            root: self.root.clone(),
        };
        let mut count = 0usize;
        for file in &files {
            let resolved = match std::fs::canonicalize(file) {
                Ok(r) if under_any(&r, &self.roots) => r,
                Ok(r) => {
                    report.failed.push((
                        file.display().to_string(),
                        format!("resolves to '{}', outside add_source_roots", r.display()),
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
            let served = known.get(file).or_else(|| known.get(&resolved));
            if let Some(id) = served {
                let mut registry = sources.write();
                let path = registry
                    .get(id)
                    .map(|t| t.file.path().to_path_buf())
                    .unwrap_or_else(|| file.clone());
                registry.reopen(id, &path, &options);
                report.already_present.push(id.clone());
                report.refreshed.push(id.clone());
            } else {
                let base = self.id_base(file);
                let settings = Settings {
                    origin: origin.clone(),
                    ..Default::default()
                };
                match sources.write().add(&base, file, settings, &options) {
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
                return report;
            }
        }
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

    /// The `.npy` files to register, in path order, or why there are none.
    fn files(&self) -> Result<Vec<PathBuf>, String> {
        let meta = std::fs::metadata(&self.resolved).map_err(|e| format!("cannot be read: {e}"))?;
        if meta.is_file() {
            if self.resolved.extension().is_some_and(|e| e == "npy") {
                return Ok(vec![self.resolved.clone()]);
            }
            return Err("is not a .npy file".to_string());
        }
        let mut found = Vec::new();
        walk(&self.resolved, &mut found, self.max_files)?;
        found.sort();
        Ok(found)
    }

    /// The id a new source at `file` is made from: the label and the path under the root.
    fn id_base(&self, file: &Path) -> String {
        let label = self.label.strip_suffix(".npy").unwrap_or(&self.label);
        let mut parts = vec![label.to_string()];
        if let Ok(rel) = file.strip_prefix(&self.root) {
            parts.extend(rel.iter().map(|c| c.to_string_lossy().into_owned()));
        }
        if let Some(last) = parts.last_mut()
            && let Some(stem) = last.strip_suffix(".npy")
        {
            *last = stem.to_string();
        }
        sanitize(&parts.join("."))
    }

    /// Removes runtime sources at or under the added path whose files are gone.
    fn remove_gone(&self, sources: &Sources) -> Vec<String> {
        let mut registry = sources.write();
        let gone: Vec<String> = registry
            .tensors()
            .map(|t| {
                (
                    t.source_id.clone(),
                    t.origin.clone(),
                    t.file.path().to_path_buf(),
                )
            })
            .chain(
                registry
                    .refused()
                    .map(|r| (r.source_id.clone(), r.origin.clone(), r.path.clone())),
            )
            .filter(|(_, origin, path)| {
                origin.is_dropped() && path.starts_with(&self.resolved) && !path.exists()
            })
            .map(|(id, _, _)| id)
            .collect();
        for id in &gone {
            registry.remove(id);
        }
        gone
    }
}

/// Lists `.npy` files under `dir` (recursively, not following directory links); refused
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
        if kind.is_dir() {
            walk(&path, out, max)?;
        } else if path.extension().is_some_and(|e| e == "npy") && (kind.is_file() || path.is_file())
        {
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
