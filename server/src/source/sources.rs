//! The served sources and their lifecycle: a registry of opened tensors (and of refused
//! files, with why), looked up by array id, reopened when their file changed on disk, retried
//! when a refused file changed, and swapped whole by a rescan.

use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::grid::chunk_id::MAX_ARRAY_ID_BYTES;
use crate::source::registry::{
    OpenOptions, Opened, Refused, Registry, Tensor, identity_at, level_tensor,
};

/// The served sources.
pub struct Sources {
    registry: RwLock<Registry>,
    open_options: OpenOptions,
    /// Held by each `add_source` from its first look at the registry to its last change.
    adds: Mutex<()>,
    /// The tensors of stored levels served under their source's id (`<id>.<level>`,
    /// [`Source::level`](crate::source::Source::level)), made on first use, by level id.
    levels: Mutex<std::collections::HashMap<String, Arc<Tensor>>>,
}

impl Sources {
    /// Sources of an already scanned `registry`; changed files are reopened with
    /// `open_options`.
    pub fn new(registry: Registry, open_options: OpenOptions) -> Self {
        Self {
            registry: RwLock::new(registry),
            open_options,
            adds: Mutex::new(()),
            levels: Mutex::default(),
        }
    }

    /// Held while one `add_source` runs: adds run one at a time, so each sees what the
    /// previous one registered.
    pub fn serialize_adds(&self) -> MutexGuard<'_, ()> {
        self.adds.lock()
    }

    /// A copy of the registry (cheap: tensors are shared), for a rescan to compare against.
    pub fn snapshot(&self) -> Registry {
        self.registry.read().clone()
    }

    /// The registry, read-locked (hold it briefly).
    pub fn read(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read()
    }

    /// The registry, write-locked (hold it briefly), for runtime sources.
    pub fn write(&self) -> RwLockWriteGuard<'_, Registry> {
        self.registry.write()
    }

    /// How sources are opened.
    pub fn open_options(&self) -> &OpenOptions {
        &self.open_options
    }

    /// Swaps in a rescanned registry, keeping the runtime sources as they are now.
    pub fn replace(&self, registry: Registry) {
        let mut current = self.registry.write();
        *current = registry.with_runtime_of(&current);
    }

    /// How many sources are served.
    pub fn len(&self) -> usize {
        self.registry.read().len()
    }

    /// Whether no source is served.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Paths of served sources (for logs and tests).
    pub fn paths(&self) -> Vec<PathBuf> {
        self.registry
            .read()
            .tensors()
            .map(|t| t.source.path().to_path_buf())
            .collect()
    }

    /// Reopens every served source whose file changed on disk (one `stat` per source); one
    /// that no longer opens moves to the refused list.
    pub fn refresh_changed(&self) {
        let stale: Vec<String> = self
            .registry
            .read()
            .tensors()
            .filter(|t| !t.is_current())
            .map(|t| t.array_id.clone())
            .collect();
        for array_id in stale {
            // A source that no longer opens moves to the refused list; that is
            // what the catalog should show, so the error needs no other handling.
            if let Err(err) = self.resolve(&array_id) {
                tracing::debug!(%array_id, %err, "changed source refused on reopen");
            }
        }
    }

    /// Resolves an array id (`source` or `source/field`) to its tensor, reopening
    /// the source first if its file changed on disk since it was opened.
    pub fn resolve(&self, array_id: &str) -> Result<Arc<Tensor>, LookupError> {
        check_array_id_len(array_id)?;
        let (source_id, field) = match array_id.split_once('/') {
            Some((s, f)) => (s, Some(f)),
            None => (array_id, None),
        };
        let tensor = {
            let registry = self.registry.read();
            match registry.get(source_id) {
                Some(t) => t.clone(),
                None => {
                    let Some(refused) = registry.refused_source(source_id) else {
                        drop(registry);
                        return match self.resolve_level(source_id) {
                            Some(level) => level,
                            None => Err(LookupError::UnknownSource(array_id.to_string())),
                        };
                    };
                    let refused = refused.clone();
                    let held = registry.refused_identity(source_id);
                    // No file I/O under the lock: a stat can hang on a broken mount.
                    drop(registry);
                    let changed = identity_at(&refused.path) != held;
                    self.retry_refused(refused, changed)?
                }
            }
        };
        if let Some(field) = field.filter(|f| !f.is_empty()) {
            return Err(LookupError::UnknownField {
                array_id: array_id.to_string(),
                source_id: source_id.to_string(),
                field: field.to_string(),
            });
        }
        if tensor.is_current() {
            return Ok(tensor);
        }
        self.reopen(&tensor)
    }

    /// The tensor of a stored level served under its source's id (`<id>.<level>`), when
    /// `id` names one; resolving the source first (so a changed file is reopened and its
    /// levels made again).
    fn resolve_level(&self, id: &str) -> Option<Result<Arc<Tensor>, LookupError>> {
        let (parent_id, level) = id.rsplit_once('.')?;
        if !self.registry.read().knows(parent_id) {
            return None;
        }
        let parent = match self.resolve(parent_id) {
            Ok(parent) => parent,
            Err(err) => return Some(Err(err)),
        };
        let source = parent.source.level(level)?;
        let mut levels = self.levels.lock();
        if let Some(held) = levels.get(id)
            && Arc::ptr_eq(&held.source, &source)
        {
            return Some(Ok(held.clone()));
        }
        let tensor = match level_tensor(&parent, id, source, &self.open_options) {
            Ok(tensor) => Arc::new(tensor),
            Err(why) => return Some(Err(LookupError::Unavailable(why))),
        };
        levels.insert(id.to_string(), tensor.clone());
        Some(Ok(tensor))
    }

    /// A refused source: opened again when its file changed since it was refused (fixed or
    /// restored), else refused with its reason. A source refused when it was first opened
    /// is bad input (`InvalidArgument`); one that broke after being served is `Unavailable`.
    fn retry_refused(&self, refused: Refused, changed: bool) -> Result<Arc<Tensor>, LookupError> {
        let id = refused.source_id.clone();
        let refused = if changed {
            let registry = self.reopen_unlocked(&id, &refused.path)?;
            match registry.get(&id) {
                Some(t) => {
                    tracing::info!(source_id = %id, path = %refused.path.display(), "refused source readable again");
                    return Ok(t.clone());
                }
                None => registry.refused_source(&id).cloned().unwrap_or(refused),
            }
        } else {
            refused
        };
        Err(if refused.after_change {
            LookupError::Unavailable(format!(
                "source '{id}' changed on disk and can no longer be read: {}",
                refused.reason
            ))
        } else {
            LookupError::Refused(format!("source '{id}' is not served: {}", refused.reason))
        })
    }

    /// Opens `path` again as source `id` with no lock held, then puts it in place under the
    /// write lock, which is returned; a source removed meanwhile stays removed.
    fn reopen_unlocked(
        &self,
        id: &str,
        path: &std::path::Path,
    ) -> Result<RwLockWriteGuard<'_, Registry>, LookupError> {
        let settings = self.registry.read().settings_of(id);
        let opened = Opened::open(id, path, settings, &self.open_options);
        let mut registry = self.registry.write();
        if !registry.install_reopened(opened) {
            return Err(LookupError::UnknownSource(id.to_string()));
        }
        Ok(registry)
    }

    fn reopen(&self, stale: &Arc<Tensor>) -> Result<Arc<Tensor>, LookupError> {
        let path = stale.source.path().to_path_buf();
        if let Err(busy) = stale.source.check_no_writer() {
            return Err(LookupError::Unavailable(format!(
                "source '{}' is being written; plan the read again when the write is done ({busy})",
                stale.source_id
            )));
        }
        tracing::info!(source_id = %stale.source_id, path = %path.display(), "source changed on disk; reopening");
        let registry = self.reopen_unlocked(&stale.source_id, &path)?;
        match registry.get(&stale.source_id) {
            Some(t) => Ok(t.clone()),
            None => Err(LookupError::Unavailable(format!(
                "source '{}' changed on disk and can no longer be read: {}",
                stale.source_id,
                registry
                    .refused_source(&stale.source_id)
                    .map(|r| r.reason.as_str())
                    .unwrap_or("unknown reason")
            ))),
        }
    }
}

/// Refuses an array id longer than any id a chunk ticket can carry
/// ([`MAX_ARRAY_ID_BYTES`]) by its length alone, without quoting it: such an id names no
/// source, and echoing it would turn a request into a large status.
pub fn check_array_id_len(array_id: &str) -> Result<(), LookupError> {
    if array_id.len() <= MAX_ARRAY_ID_BYTES {
        return Ok(());
    }
    Err(LookupError::Refused(format!(
        "array id is {} bytes, over the limit of {MAX_ARRAY_ID_BYTES} bytes",
        array_id.len()
    )))
}

/// Why an array id did not resolve to a served tensor; the wire gives each its status
/// (`From<LookupError> for ServiceError`).
#[derive(Clone, Debug, thiserror::Error)]
pub enum LookupError {
    /// No source has this id.
    #[error("unknown array id '{0}': no such source (Source not found: it names no known source)")]
    UnknownSource(String),
    /// The source exists but the field after `/` does not.
    #[error(
        "unknown array id '{array_id}': source '{source_id}' has no tensor '{field}' (no field \
         '{field}')"
    )]
    UnknownField {
        /// The id as requested.
        array_id: String,
        /// The source part of the id.
        source_id: String,
        /// The field part of the id.
        field: String,
    },
    /// A source served with no tensor yet (the `scratch` source before its first upload).
    #[error(
        "source '{0}' has no tensors yet: its tensors are uploads, named '{0}/@fields/NAME' \
         once added (add_tensor)"
    )]
    NoTensorsYet(String),
    /// The source cannot be read now (it changed and broke, or is being written).
    #[error("{0}")]
    Unavailable(String),
    /// The id itself is refused (too long), or names a source refused when it was opened.
    #[error("{0}")]
    Refused(String),
}
