//! The manifest: every upload's record and the chunks whose ack was sent, in one redb file
//! (`uploads/manifest.redb`). Every write is one transaction committed with redb's
//! default durability (fsynced before `commit` returns), so what the manifest says
//! survives a crash exactly.
//!
//! ```text
//! uploads: array id        → UploadRecord (JSON)
//! chunks:  (uid, cell)     → key of the chunk's entry in the upload's segment store
//! ```

use std::collections::HashMap;
use std::path::Path;

use redb::{ReadableTable, TableDefinition};

use crate::state_dir::reopening_db::ReopeningDb;

use super::record::UploadRecord;

const UPLOADS: TableDefinition<&str, &[u8]> = TableDefinition::new("uploads");
const CHUNKS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("chunks");

/// Why the manifest failed.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The database failed.
    #[error("upload manifest: {0}")]
    Db(#[from] redb::Error),
    /// A record does not decode (written by another version, or damaged).
    #[error("upload manifest: the record of '{array_id}' does not decode: {source}")]
    Record {
        /// The record's key.
        array_id: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

/// One upload as loaded at open: its record and its chunks (cell index → store key).
pub type Loaded = (UploadRecord, HashMap<u64, Vec<u8>>);

/// The open manifest (reopened by itself after an I/O error such as a full disk).
pub struct Manifest {
    db: ReopeningDb,
}

fn encode(record: &UploadRecord) -> Vec<u8> {
    // A record is plain data (strings, numbers, vectors): encoding it cannot fail.
    serde_json::to_vec(record).unwrap_or_default()
}

impl ManifestError {
    /// Whether the manifest failed for lack of room (a full or over-quota filesystem), or
    /// is being reopened after such a failure: worth retrying once there is room.
    pub fn is_disk_full(&self) -> bool {
        match self {
            ManifestError::Db(err) => {
                crate::state_dir::reopening_db::is_disk_full(err)
                    || matches!(err, redb::Error::PreviousIo)
            }
            ManifestError::Record { .. } => false,
        }
    }
}

impl Manifest {
    /// Opens (creating) the manifest at `path`.
    pub fn open(path: &Path) -> Result<Manifest, ManifestError> {
        let manifest = Manifest {
            db: ReopeningDb::open(path, None)?,
        };
        manifest.write(|tx| {
            tx.open_table(UPLOADS)?;
            tx.open_table(CHUNKS)?;
            Ok(())
        })?;
        Ok(manifest)
    }

    /// Runs `change` in one write transaction and commits it; an error is noted, so the
    /// database is reopened after an I/O error.
    fn write(
        &self,
        change: impl FnOnce(&redb::WriteTransaction) -> Result<(), redb::Error>,
    ) -> Result<(), ManifestError> {
        let tx = self.db.begin_write()?;
        let done = change(&tx).and_then(|()| tx.commit().map_err(redb::Error::from));
        if let Err(err) = &done {
            self.db.note(err);
        }
        Ok(done?)
    }

    /// Every upload with its chunks.
    pub fn load(&self) -> Result<Vec<Loaded>, ManifestError> {
        let tx = self.db.begin_read()?;
        let uploads = tx.open_table(UPLOADS).map_err(redb::Error::from)?;
        let chunks = tx.open_table(CHUNKS).map_err(redb::Error::from)?;
        let mut out = Vec::new();
        for row in uploads.iter().map_err(redb::Error::from)? {
            let (key, value) = row.map_err(redb::Error::from)?;
            let record: UploadRecord =
                serde_json::from_slice(value.value()).map_err(|source| ManifestError::Record {
                    array_id: key.value().to_string(),
                    source,
                })?;
            let mut cells = HashMap::new();
            let uid = record.uid;
            for row in chunks
                .range((uid, 0)..=(uid, u64::MAX))
                .map_err(redb::Error::from)?
            {
                let (key, value) = row.map_err(redb::Error::from)?;
                cells.insert(key.value().1, value.value().to_vec());
            }
            out.push((record, cells));
        }
        Ok(out)
    }

    /// Writes `record` (insert or replace).
    pub fn put_record(&self, record: &UploadRecord) -> Result<(), ManifestError> {
        self.write(|tx| {
            let mut uploads = tx.open_table(UPLOADS)?;
            uploads.insert(record.array_id.as_str(), encode(record).as_slice())?;
            Ok(())
        })
    }

    /// Records that cell `cell` of upload `uid` is the store entry `key`.
    pub fn put_chunk(&self, uid: u64, cell: u64, key: &[u8]) -> Result<(), ManifestError> {
        self.write(|tx| {
            let mut chunks = tx.open_table(CHUNKS)?;
            chunks.insert((uid, cell), key)?;
            Ok(())
        })
    }

    /// Forgets the chunks of upload `uid` (its storage is gone).
    pub fn drop_chunks(&self, uid: u64) -> Result<(), ManifestError> {
        self.write(|tx| {
            let mut chunks = tx.open_table(CHUNKS)?;
            chunks.retain_in((uid, 0)..=(uid, u64::MAX), |_, _| false)?;
            Ok(())
        })
    }

    /// Forgets the upload `array_id` and its chunks: its name is free again.
    pub fn remove(&self, array_id: &str, uid: u64) -> Result<(), ManifestError> {
        self.write(|tx| {
            let mut uploads = tx.open_table(UPLOADS)?;
            uploads.remove(array_id)?;
            let mut chunks = tx.open_table(CHUNKS)?;
            chunks.retain_in((uid, 0)..=(uid, u64::MAX), |_, _| false)?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::uploads::record::{State, StoreFormat};

    fn record(array_id: &str, uid: u64) -> UploadRecord {
        UploadRecord {
            array_id: array_id.to_string(),
            uid,
            shape: vec![4, 6],
            dtype: "<u2".to_string(),
            chunk_shape: vec![2, 6],
            dim_labels: vec!["y".into(), "x".into()],
            state: State::Pending,
            reason: String::new(),
            created_ns: 1,
            ttl_seconds: Some(60),
            expires_at: Some(100),
            discarded_at: None,
            format: StoreFormat::Cache,
        }
    }

    #[test]
    fn records_and_chunks_survive_a_reopen_and_removal_frees_them() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("manifest.redb");
        {
            let m = Manifest::open(&path).unwrap();
            m.put_record(&record("scratch/@fields/a", 7)).unwrap();
            m.put_record(&record("scratch/@fields/b", 8)).unwrap();
            m.put_chunk(7, 0, b"k0").unwrap();
            m.put_chunk(7, 1, b"k1").unwrap();
            m.put_chunk(7, 1, b"k1-retry").unwrap();
            m.put_chunk(8, 0, b"other").unwrap();
            let mut ready = record("scratch/@fields/a", 7);
            ready.state = State::Ready;
            m.put_record(&ready).unwrap();
        }
        let m = Manifest::open(&path).unwrap();
        let mut loaded = m.load().unwrap();
        loaded.sort_by_key(|(r, _)| r.uid);
        assert_eq!(loaded.len(), 2);
        assert_eq!(loaded[0].0.state, State::Ready);
        assert_eq!(loaded[0].1.len(), 2);
        assert_eq!(
            loaded[0].1.get(&1).map(Vec::as_slice),
            Some(&b"k1-retry"[..])
        );
        assert_eq!(loaded[1].1.len(), 1);
        m.drop_chunks(8).unwrap();
        m.remove("scratch/@fields/a", 7).unwrap();
        let loaded = m.load().unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].0.array_id, "scratch/@fields/b");
        assert!(loaded[0].1.is_empty());
    }
}
