//! The set of sources a server serves: discovery, ids, and the tensors they hold.
//!
//! # Id rule
//! A file given directly (`cells.npy`) is served as source id and array id
//! `cells` (the file stem). A file found while scanning a directory gets the path
//! relative to that directory, without the `.npy` suffix, with each `/` replaced
//! by `.` (`plates/a1/cells.npy` → `plates.a1.cells`). Characters outside
//! `[A-Za-z0-9._-]` become `_`, so ids are slash-free and safe in SQL literals.
//! Files are visited in sorted path order; when two files map to the same id the
//! later one gets `-2`, `-3`, … appended, and the collision is logged.
//!
//! A file that fails to open (bad header, truncated, unsupported dtype) is kept
//! as a *refused* source with its reason, logged, and never stops the others.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::chunk_id::ContentVersion;
use crate::grid::{ChunkGrid, default_dim_labels};
use crate::source::npy::{Limits, NpyFile};

/// One served tensor: an opened `.npy` file with its chunk grid.
#[derive(Debug)]
pub struct Tensor {
    /// The array id clients address (equal to the source id for `.npy`).
    pub array_id: String,
    /// The source id (no `/`).
    pub source_id: String,
    /// The opened file.
    pub file: NpyFile,
    /// The chunk grid the tensor is cut into.
    pub grid: ChunkGrid,
    /// Axis labels reported to clients.
    pub dim_labels: Vec<String>,
    /// The file's content version at open time; part of every chunk id.
    pub version: ContentVersion,
}

impl Tensor {
    /// The numpy dtype string of the tensor, byte order included (`"<u2"`).
    pub fn dtype_str(&self) -> String {
        self.file.header().dtype.numpy_str()
    }

    /// Bytes per element.
    pub fn itemsize(&self) -> u64 {
        self.file.header().dtype.itemsize as u64
    }

    /// The tensor's shape.
    pub fn shape(&self) -> &[u64] {
        &self.file.header().shape
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
}

/// The sources of one server, keyed by id.
#[derive(Debug, Default)]
pub struct Registry {
    tensors: BTreeMap<String, Arc<Tensor>>,
    refused: BTreeMap<String, Refused>,
}

/// How to open sources.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// Bounds on headers and sizes.
    pub limits: Limits,
    /// Target chunk size in bytes (clamped to the 64 MiB cap by the grid).
    pub target_chunk_bytes: u64,
}

/// A candidate file with the id it should get.
struct Candidate {
    id: String,
    path: PathBuf,
}

impl Registry {
    /// Scans `paths` (files or directories, recursively) and opens every `.npy` found.
    ///
    /// Paths that do not exist or cannot be listed are returned as errors in the
    /// second element and logged; they never prevent the others from serving.
    pub fn scan(paths: &[PathBuf], options: &OpenOptions) -> (Registry, Vec<String>) {
        let mut problems = Vec::new();
        let mut candidates = Vec::new();
        for path in paths {
            match collect(path, &mut candidates) {
                Ok(()) => {}
                Err(err) => {
                    let msg = format!("{}: cannot be scanned: {err}", path.display());
                    tracing::warn!("{msg}");
                    problems.push(msg);
                }
            }
        }
        let mut registry = Registry::default();
        let mut taken: HashMap<String, u32> = HashMap::new();
        for candidate in candidates {
            let id = unique_id(&candidate.id, &mut taken, &candidate.path);
            registry.open_one(id, candidate.path, options);
        }
        (registry, problems)
    }

    fn open_one(&mut self, id: String, path: PathBuf, options: &OpenOptions) {
        match open_tensor(&id, &path, options) {
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
                self.refused.insert(
                    id.clone(),
                    Refused {
                        source_id: id,
                        path,
                        reason,
                    },
                );
            }
        }
    }

    /// Opens `path` again under `id`, replacing what was served (or refused) there.
    pub fn reopen(&mut self, id: &str, path: &Path, options: &OpenOptions) {
        self.tensors.remove(id);
        self.refused.remove(id);
        self.open_one(id.to_string(), path.to_path_buf(), options);
    }

    /// The tensor with this exact array id or source id.
    pub fn get(&self, id: &str) -> Option<&Arc<Tensor>> {
        self.tensors.get(id)
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

    /// How many sources are served.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether no source is served.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
}

fn open_tensor(id: &str, path: &Path, options: &OpenOptions) -> Result<Tensor, String> {
    let file = NpyFile::open(path, &options.limits).map_err(|e| e.to_string())?;
    let header = file.header();
    let grid = ChunkGrid::plan(
        &header.shape,
        header.dtype.itemsize as u64,
        header.fortran_order,
        options.target_chunk_bytes,
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    let identity = file.identity();
    let version = ContentVersion {
        dev: identity.dev,
        ino: identity.ino,
        size: identity.size,
        mtime_ns: identity.mtime_ns,
    };
    let dim_labels = default_dim_labels(header.shape.len());
    Ok(Tensor {
        array_id: id.to_string(),
        source_id: id.to_string(),
        file,
        grid,
        dim_labels,
        version,
    })
}

/// Adds `path` (a file, or a directory scanned recursively) to `out` in sorted order.
fn collect(path: &Path, out: &mut Vec<Candidate>) -> std::io::Result<()> {
    let meta = std::fs::metadata(path)?;
    if meta.is_file() {
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        out.push(Candidate {
            id: sanitize(&stem),
            path: absolute(path),
        });
        return Ok(());
    }
    let mut found = Vec::new();
    walk(path, &mut found)?;
    found.sort();
    for file in found {
        let rel = file.strip_prefix(path).unwrap_or(&file);
        let mut parts: Vec<String> = rel
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        if let Some(last) = parts.last_mut()
            && let Some(stripped) = last.strip_suffix(".npy")
        {
            *last = stripped.to_string();
        }
        out.push(Candidate {
            id: sanitize(&parts.join(".")),
            path: absolute(&file),
        });
    }
    Ok(())
}

/// Recursively lists `.npy` files under `dir`; unreadable subdirectories are logged and skipped.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            if let Err(err) = walk(&path, out) {
                tracing::warn!(path = %path.display(), %err, "directory skipped");
            }
        } else if path.extension().is_some_and(|e| e == "npy") && (kind.is_file() || path.is_file())
        {
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

fn unique_id(base: &str, taken: &mut HashMap<String, u32>, path: &Path) -> String {
    let mut id = base.to_string();
    let mut n = 1;
    while taken.contains_key(&id) {
        n += 1;
        id = format!("{base}-{n}");
    }
    if n > 1 {
        tracing::warn!(path = %path.display(), %base, %id, "source id collision resolved");
    }
    taken.insert(id.clone(), n);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_keeps_safe_characters_only() {
        assert_eq!(sanitize("a b/c'd.e-f_g"), "a_b_c_d.e-f_g");
        assert_eq!(sanitize(""), "_");
    }

    #[test]
    fn collisions_get_numbered_suffixes() {
        let mut taken = HashMap::new();
        let p = Path::new("x");
        assert_eq!(unique_id("a", &mut taken, p), "a");
        assert_eq!(unique_id("a", &mut taken, p), "a-2");
        assert_eq!(unique_id("a", &mut taken, p), "a-3");
    }
}
