//! The bytes of one upload: a segment store of its own (`uploads/data/<uid>/`, the
//! segments crate's format and checksums), never evicted, removed whole when the upload
//! is discarded. The store's `append` writes without syncing; [`ChunkData::append_durable`]
//! syncs the segment (and, for a segment new to it, the directory that names it) before
//! it returns, so an ack sent after it is an ack of bytes on disk.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use tessera_segments::{EntryBytes, EntryMeta, Location, Store, StoreError, StoreOptions};

/// The nominal budget of an upload's store; it keeps everything regardless
/// (`with_keep_all`: user data is never evicted, not even when the disk is full; uploads
/// are bounded by their own limits instead).
const NOMINAL_BYTES: u64 = 1 << 62;

/// Why the upload's bytes could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The segment store failed.
    #[error("upload store {}: {source}", dir.display())]
    Store {
        /// The store's directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: StoreError,
    },
    /// Syncing written bytes failed: they are not durable, so no ack.
    #[error("cannot fsync {}: {source}", path.display())]
    Sync {
        /// What was being synced.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The upload's Zarr store failed (`zarr://` uploads).
    #[error(transparent)]
    Zarr(#[from] super::zarr_store::ZarrError),
}

impl DataError {
    /// Whether the filesystem is full (or over quota).
    pub fn is_disk_full(&self) -> bool {
        match self {
            DataError::Store { source, .. } => source.is_disk_full(),
            DataError::Sync { source, .. } => {
                matches!(
                    source.raw_os_error(),
                    Some(libc::ENOSPC) | Some(libc::EDQUOT)
                )
            }
            DataError::Zarr(source) => source.is_disk_full(),
        }
    }
}

/// One upload's segment store.
pub struct ChunkData {
    dir: PathBuf,
    store: Store,
    /// Segments whose directory entry is known durable.
    synced_segments: Mutex<HashSet<PathBuf>>,
}

impl ChunkData {
    /// Opens (creating) the store in `dir`; recovery drops torn tails, as for the cache.
    /// The store has no maintenance thread of its own: it calls `wake` when it has work,
    /// and the owner's worker runs [`ChunkData::maintain`].
    pub fn open(dir: &Path, wake: Arc<dyn Fn() + Send + Sync>) -> Result<ChunkData, DataError> {
        let store = Store::open(
            StoreOptions::new(dir)
                .with_max_bytes(NOMINAL_BYTES)
                .with_keep_all(true)
                .with_file_mode(0o600)
                .with_shared_maintenance(wake),
        )
        .map_err(|source| DataError::Store {
            dir: dir.to_path_buf(),
            source,
        })?;
        Ok(ChunkData {
            dir: dir.to_path_buf(),
            store,
            synced_segments: Mutex::new(HashSet::new()),
        })
    }

    /// Appends `bytes` under `key` and syncs them before returning.
    pub fn append_durable(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        bytes: &[&[u8]],
    ) -> Result<Location, DataError> {
        let location = self.append(key, meta, bytes)?;
        let sync = |path: &Path| {
            File::open(path)
                .and_then(|f| f.sync_data())
                .map_err(|source| DataError::Sync {
                    path: path.to_path_buf(),
                    source,
                })
        };
        sync(&location.segment_path)?;
        let new_segment = !self.synced_segments.lock().contains(&location.segment_path);
        if new_segment {
            if let Some(parent) = location.segment_path.parent() {
                sync(parent)?;
            }
            self.synced_segments
                .lock()
                .insert(location.segment_path.clone());
        }
        Ok(location)
    }

    /// Appends `bytes` under `key` without syncing (bytes that can be made again).
    pub fn append(
        &self,
        key: &[u8],
        meta: &EntryMeta,
        bytes: &[&[u8]],
    ) -> Result<Location, DataError> {
        self.store
            .append(key, meta, bytes)
            .map_err(|source| DataError::Store {
                dir: self.dir.clone(),
                source,
            })
    }

    /// Where `key` lives, if stored.
    pub fn locate(&self, key: &[u8]) -> Option<Location> {
        self.store.locate(key)
    }

    /// Whether `key` is stored.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.store.contains(key)
    }

    /// The message of `key`, as slices of the mapped segment.
    pub fn read(&self, key: &[u8]) -> Result<Option<EntryBytes>, DataError> {
        self.store.read(key).map_err(|source| DataError::Store {
            dir: self.dir.clone(),
            source,
        })
    }

    /// Bytes on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.store.stats().total_bytes
    }

    /// Does the store's queued maintenance (seals rotated segments).
    pub fn maintain(&self) {
        self.store.maintain();
    }

    /// Seals the open segments (before the directory is removed, or at shutdown).
    pub fn close(&self) {
        if let Err(err) = self.store.close() {
            tracing::warn!(dir = %self.dir.display(), error = %err, "closing an upload store");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_durable_append_reads_back_after_a_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("u");
        let meta = EntryMeta {
            shape: vec![2, 2],
            dtype: "<u2".to_string(),
        };
        let bytes: Vec<u8> = (0u8..8).collect();
        {
            let data = ChunkData::open(&dir, Arc::new(|| {})).unwrap();
            data.append_durable(b"k", &meta, &[&bytes]).unwrap();
            assert!(data.contains(b"k"));
        }
        let data = ChunkData::open(&dir, Arc::new(|| {})).unwrap();
        let entry = data.read(b"k").unwrap().unwrap();
        assert!(entry.body.windows(8).any(|w| w == bytes.as_slice()));
    }
}
