//! The Zarr v2 store of a `zarr://` upload (docs/decisions/0031): a copy of its
//! acknowledged chunks that zarr-python, xarray and napari open as it is, kept beside the
//! upload's segment store (which still serves every read).
//!
//! ```text
//! uploads/zarr/<uid:016x>/<name>.zarr/.zarray   shape, chunks = the upload's grid, dtype,
//!                                               C order, fill_value 0, no compressor
//! uploads/zarr/<uid:016x>/<name>.zarr/.zattrs   {"_ARRAY_DIMENSIONS": dim_labels}
//! uploads/zarr/<uid:016x>/<name>.zarr/<i>.<j>   one file per acknowledged chunk
//! uploads/zarr/<uid:016x>/incoming/<n>          a chunk written, not yet in place
//! ```
//!
//! The metadata and the chunk files are written through `zarrs` (its filesystem store
//! syncs each file it writes). A chunk is first written whole under `incoming/`, then
//! renamed to its key and the store's directory synced: a chunk file is never torn, and the
//! rename happens only while the upload still takes chunks, just before the manifest
//! commits the cell (see `Uploads::put`). A cell never sent has no file and reads as the
//! fill value, 0, as it does through Tessera.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use zarrs::array::{Array, ArrayCreateError, ArrayMetadata, ArrayMetadataV2, FillValueMetadata};
use zarrs::filesystem::{FilesystemStore, FilesystemStoreCreateError};
use zarrs::metadata::v2::DataTypeMetadataV2;
use zarrs::storage::{
    AtomicRenameStorageTraits, StorageError, StoreKey, StoreKeyError, WritableStorageTraits,
};

use crate::grid::Region;
use crate::source::npy::{Dtype, Kind};

/// The folder under the upload's own directory that holds chunks being written.
const INCOMING: &str = "incoming";

/// Why the Zarr store of an upload could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ZarrError {
    /// The store's root could not be opened.
    #[error("Zarr store {}: {source}", path.display())]
    Open {
        /// The store's root.
        path: PathBuf,
        /// The cause.
        #[source]
        source: FilesystemStoreCreateError,
    },
    /// zarrs refused the array's metadata (a dtype or name it cannot write).
    #[error("Zarr store {}: {source}", path.display())]
    Metadata {
        /// The array's directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<ArrayCreateError>,
    },
    /// Writing, renaming or removing a file of the store failed.
    #[error("Zarr store {}: {source}", path.display())]
    Storage {
        /// The array's directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: StorageError,
    },
    /// A key of the store could not be formed.
    #[error("Zarr store {}: {source}", path.display())]
    Key {
        /// The array's directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: StoreKeyError,
    },
    /// Syncing a directory or reading a chunk file back failed.
    #[error("Zarr store: cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// To what.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl ZarrError {
    /// Whether the filesystem is full (or over quota).
    pub fn is_disk_full(&self) -> bool {
        let full = |e: &std::io::Error| {
            matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        };
        match self {
            ZarrError::Io { source, .. } => full(source),
            ZarrError::Storage {
                source: StorageError::IOError(source),
                ..
            } => full(source),
            _ => false,
        }
    }
}

/// A chunk written under `incoming/`, synced, not yet in place.
#[derive(Debug)]
pub struct Staged {
    key: StoreKey,
    chunk: StoreKey,
}

/// The Zarr v2 store of one upload.
pub struct ZarrStore {
    /// `uploads/zarr/<uid:016x>`: removed whole with the upload.
    root: PathBuf,
    /// `<root>/<name>.zarr`: what a user opens.
    array_dir: PathBuf,
    storage: Arc<FilesystemStore>,
    array: Array<FilesystemStore>,
    chunk_shape: Vec<u64>,
    itemsize: usize,
    next_incoming: AtomicU64,
}

impl std::fmt::Debug for ZarrStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZarrStore")
            .field("array_dir", &self.array_dir)
            .finish_non_exhaustive()
    }
}

impl ZarrStore {
    /// The store of the upload `name` whose directory is `root`, described (nothing is
    /// written: [`ZarrStore::create`] writes the metadata).
    pub fn new(
        root: &Path,
        name: &str,
        shape: &[u64],
        chunk_shape: &[u64],
        dtype: &Dtype,
        dim_labels: &[String],
    ) -> Result<ZarrStore, ZarrError> {
        let array_dir = root.join(format!("{name}.zarr"));
        let storage = Arc::new(
            FilesystemStore::new(root).map_err(|source| ZarrError::Open {
                path: root.to_path_buf(),
                source,
            })?,
        );
        let chunks = chunk_shape
            .iter()
            .map(|&c| std::num::NonZeroU64::new(c.max(1)).unwrap_or(std::num::NonZeroU64::MIN))
            .collect();
        let fill_value = if dtype.kind == Kind::Bool {
            FillValueMetadata::Bool(false)
        } else {
            FillValueMetadata::from(0u8)
        };
        let mut attributes = serde_json::Map::new();
        attributes.insert(
            "_ARRAY_DIMENSIONS".to_string(),
            serde_json::json!(dim_labels),
        );
        let metadata = ArrayMetadataV2::new(
            shape.to_vec(),
            chunks,
            DataTypeMetadataV2::Simple(dtype.numpy_str()),
            fill_value,
            None,
            None,
        )
        .with_attributes(attributes);
        let array = Array::new_with_metadata(
            storage.clone(),
            &format!("/{name}.zarr"),
            ArrayMetadata::V2(metadata),
        )
        .map_err(|source| ZarrError::Metadata {
            path: array_dir.clone(),
            source: Box::new(source),
        })?;
        Ok(ZarrStore {
            root: root.to_path_buf(),
            array_dir,
            storage,
            array,
            chunk_shape: chunk_shape.to_vec(),
            itemsize: dtype.itemsize,
            next_incoming: AtomicU64::new(0),
        })
    }

    /// Where the store is: the directory a user opens with `zarr.open_array`.
    pub fn path(&self) -> &Path {
        &self.array_dir
    }

    /// The upload's own directory (`uploads/zarr/<uid:016x>`), removed with it.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Writes `.zarray` and `.zattrs` (each synced) and syncs the directories that name
    /// them, up to the parent of the upload's own directory.
    pub fn create(&self) -> Result<(), ZarrError> {
        self.array
            .store_metadata()
            .map_err(|source| self.storage_error(source))?;
        sync_dir(&self.array_dir)?;
        sync_dir(&self.root)?;
        match self.root.parent() {
            Some(parent) => sync_dir(parent),
            None => Ok(()),
        }
    }

    /// Writes the chunk of `cell` (its bytes `parts`, in C order of the cell) under
    /// `incoming/`, padded with zeros to the store's chunk shape at the array's edges,
    /// and synced.
    pub fn stage(&self, cell: &Region, parts: &[&[u8]]) -> Result<Staged, ZarrError> {
        let chunk = self.key_of(cell);
        let n = self.next_incoming.fetch_add(1, Ordering::Relaxed);
        let key = StoreKey::new(format!("{INCOMING}/{n}")).map_err(|source| ZarrError::Key {
            path: self.array_dir.clone(),
            source,
        })?;
        let bytes = padded(&cell.shape(), &self.chunk_shape, self.itemsize, parts);
        self.storage
            .set(&key, bytes.into())
            .map_err(|source| self.storage_error(source))?;
        Ok(Staged { key, chunk })
    }

    /// Puts a staged chunk in place (one rename) and syncs the store's directory, so the
    /// chunk file is durable under its key when this returns.
    pub fn commit(&self, staged: Staged) -> Result<(), ZarrError> {
        self.storage
            .rename(&staged.key, &staged.chunk)
            .map_err(|source| self.storage_error(source))?;
        sync_dir(&self.array_dir)
    }

    /// Removes a staged chunk that is not to be put in place (the upload stopped taking
    /// chunks meanwhile).
    pub fn forget(&self, staged: Staged) {
        if let Err(err) = self.storage.erase(&staged.key) {
            tracing::warn!(store = %self.array_dir.display(), error = %err, "cannot remove a chunk written but not put in place; the next start removes it");
        }
    }

    /// Makes the store hold exactly the acknowledged chunks, the cells `acked` with their
    /// bytes from `bytes_of`: chunk files of other cells are removed, files that differ
    /// from their acknowledged bytes are written again, and `incoming/` is emptied. For a
    /// store whose last writes may not have been committed (a crash between a rename and
    /// the manifest's commit, or a failed commit).
    pub fn resync<E: std::error::Error + 'static>(
        &self,
        acked: &[Region],
        mut bytes_of: impl FnMut(&Region) -> Result<Vec<u8>, E>,
    ) -> Result<(), ResyncError<E>> {
        let keys: Vec<StoreKey> = acked.iter().map(|cell| self.key_of(cell)).collect();
        let names: std::collections::HashSet<&str> = keys
            .iter()
            .filter_map(|k| k.as_str().rsplit('/').next())
            .collect();
        let listing = std::fs::read_dir(&self.array_dir).map_err(|source| {
            ResyncError::Zarr(ZarrError::Io {
                action: "list",
                path: self.array_dir.clone(),
                source,
            })
        })?;
        for entry in listing.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !name.starts_with('.') && !names.contains(name.as_ref()) {
                std::fs::remove_file(entry.path()).map_err(|source| {
                    ResyncError::Zarr(ZarrError::Io {
                        action: "remove",
                        path: entry.path(),
                        source,
                    })
                })?;
            }
        }
        for (cell, key) in acked.iter().zip(&keys) {
            let bytes = bytes_of(cell).map_err(ResyncError::Acked)?;
            let want = padded(&cell.shape(), &self.chunk_shape, self.itemsize, &[&bytes]);
            let file = self.root.join(key.as_str());
            let same = std::fs::read(&file).is_ok_and(|on_disk| on_disk == want);
            if !same {
                let staged = self.stage(cell, &[&bytes]).map_err(ResyncError::Zarr)?;
                self.commit(staged).map_err(ResyncError::Zarr)?;
            }
        }
        sync_dir(&self.array_dir).map_err(ResyncError::Zarr)?;
        self.clear_incoming().map_err(ResyncError::Zarr)
    }

    /// The store key of the chunk holding `cell`.
    fn key_of(&self, cell: &Region) -> StoreKey {
        let indices: Vec<u64> = cell
            .start
            .iter()
            .zip(&self.chunk_shape)
            .map(|(&s, &c)| s / c.max(1))
            .collect();
        self.array.chunk_key(&indices)
    }

    /// Removes `incoming/` (chunks written but never put in place: a DoPut refused, or a
    /// crash, between the two).
    pub fn clear_incoming(&self) -> Result<(), ZarrError> {
        let dir = self.root.join(INCOMING);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(ZarrError::Io {
                action: "empty",
                path: dir,
                source,
            }),
        }
    }

    fn storage_error(&self, source: StorageError) -> ZarrError {
        ZarrError::Storage {
            path: self.array_dir.clone(),
            source,
        }
    }
}

/// Why a resync failed: the store, or reading an acknowledged chunk.
#[derive(Debug, thiserror::Error)]
pub enum ResyncError<E: std::error::Error + 'static> {
    /// The store could not be read or written.
    #[error(transparent)]
    Zarr(ZarrError),
    /// An acknowledged chunk could not be read.
    #[error(transparent)]
    Acked(E),
}

fn sync_dir(dir: &Path) -> Result<(), ZarrError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| ZarrError::Io {
            action: "sync",
            path: dir.to_path_buf(),
            source,
        })
}

/// The bytes of a store chunk of `chunk_shape` holding a cell of `cell_shape` at its
/// origin (`parts`, concatenated, C order): the cell's bytes as they are when the cell is a
/// whole chunk, else zero-padded along the axes where the array ends.
fn padded(cell_shape: &[u64], chunk_shape: &[u64], itemsize: usize, parts: &[&[u8]]) -> Vec<u8> {
    let cell: Vec<u8> = parts.concat();
    if cell_shape == chunk_shape {
        return cell;
    }
    let as_usize = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    let chunk_elements: usize = chunk_shape.iter().map(|&c| as_usize(c)).product();
    let mut out = vec![0u8; chunk_elements * itemsize];
    let Some((&last, outer)) = cell_shape.split_last() else {
        return cell;
    };
    let run = as_usize(last) * itemsize;
    if run == 0 {
        return out;
    }
    // Strides of the chunk, in elements.
    let mut strides = vec![1usize; chunk_shape.len()];
    for axis in (0..chunk_shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * as_usize(chunk_shape[axis + 1]);
    }
    let mut index = vec![0u64; outer.len()];
    for row in cell.chunks_exact(run) {
        let at: usize = index
            .iter()
            .zip(&strides)
            .map(|(&i, &s)| as_usize(i) * s)
            .sum::<usize>()
            * itemsize;
        out[at..at + run].copy_from_slice(row);
        for axis in (0..outer.len()).rev() {
            index[axis] += 1;
            if index[axis] < outer[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn store(root: &Path) -> ZarrStore {
        let dtype = Dtype::parse("<u2").unwrap();
        ZarrStore::new(
            root,
            "img",
            &[5, 3],
            &[2, 2],
            &dtype,
            &["y".into(), "x".into()],
        )
        .unwrap()
    }

    #[test]
    fn every_dtype_an_upload_takes_has_zarr_v2_metadata() {
        let tmp = tempfile::tempdir().unwrap();
        for dtype in [
            "|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8",
        ] {
            let parsed = Dtype::parse(dtype).unwrap();
            let zarr = ZarrStore::new(tmp.path(), dtype, &[3], &[2], &parsed, &["x".into()]);
            assert!(zarr.is_ok(), "{dtype}: {zarr:?}");
        }
    }

    #[test]
    fn an_edge_cell_is_padded_to_the_chunk_shape() {
        // A 1x1 cell of a 2x2 chunk (itemsize 1): its value at the origin, zeros elsewhere.
        assert_eq!(padded(&[1, 1], &[2, 2], 1, &[&[7]]), [7, 0, 0, 0]);
        // A 2x1 cell split over two parts.
        assert_eq!(padded(&[2, 1], &[2, 2], 1, &[&[1], &[2]]), [1, 0, 2, 0]);
        assert_eq!(padded(&[2, 2], &[2, 2], 1, &[&[1, 2, 3, 4]]), [1, 2, 3, 4]);
    }

    #[test]
    fn metadata_and_a_committed_chunk_are_in_zarr_v2_form() {
        let tmp = tempfile::tempdir().unwrap();
        let zarr = store(&tmp.path().join("0001"));
        zarr.create().unwrap();
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(zarr.path().join(".zarray")).unwrap()).unwrap();
        assert_eq!(meta["zarr_format"], 2);
        assert_eq!(meta["shape"], serde_json::json!([5, 3]));
        assert_eq!(meta["chunks"], serde_json::json!([2, 2]));
        assert_eq!(meta["dtype"], "<u2");
        assert_eq!(meta["order"], "C");
        assert_eq!(meta["fill_value"], 0);
        assert!(meta["compressor"].is_null());
        let attrs: serde_json::Value =
            serde_json::from_slice(&std::fs::read(zarr.path().join(".zattrs")).unwrap()).unwrap();
        assert_eq!(attrs["_ARRAY_DIMENSIONS"], serde_json::json!(["y", "x"]));
        // The edge cell rows 4..5, columns 2..3: chunk 2.1, padded to 2x2.
        let cell = Region::new(vec![4, 2], vec![5, 3]);
        let staged = zarr.stage(&cell, &[&[9, 0]]).unwrap();
        assert!(!zarr.path().join("2.1").exists());
        zarr.commit(staged).unwrap();
        assert_eq!(
            std::fs::read(zarr.path().join("2.1")).unwrap(),
            [9, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn a_resync_keeps_exactly_the_acknowledged_chunks() {
        let tmp = tempfile::tempdir().unwrap();
        let zarr = store(&tmp.path().join("0002"));
        zarr.create().unwrap();
        let cells = [
            Region::new(vec![0, 0], vec![2, 2]),
            Region::new(vec![0, 2], vec![2, 3]),
        ];
        // Cell 0 put in place but never acknowledged; cell 1 acknowledged with other bytes
        // than its file holds; a chunk left in incoming/.
        let staged = zarr.stage(&cells[0], &[&[1; 8]]).unwrap();
        zarr.commit(staged).unwrap();
        let staged = zarr.stage(&cells[1], &[&[2; 4]]).unwrap();
        zarr.commit(staged).unwrap();
        let _left = zarr.stage(&cells[1], &[&[3; 4]]).unwrap();
        zarr.resync::<std::io::Error>(&cells[1..], |_| Ok(vec![5u8; 4]))
            .unwrap();
        assert!(!zarr.path().join("0.0").exists());
        assert_eq!(
            std::fs::read(zarr.path().join("0.1")).unwrap(),
            [5, 5, 0, 0, 5, 5, 0, 0]
        );
        assert!(!zarr.root().join(INCOMING).exists());
    }
}
