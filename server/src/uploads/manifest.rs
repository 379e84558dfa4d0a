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

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

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

/// The open manifest.
pub struct Manifest {
    db: Database,
}

fn encode(record: &UploadRecord) -> Vec<u8> {
    // A record is plain data (strings, numbers, vectors): encoding it cannot fail.
    serde_json::to_vec(record).unwrap_or_default()
}

impl Manifest {
    /// Opens (creating) the manifest at `path`.
    pub fn open(path: &Path) -> Result<Manifest, ManifestError> {
        let db = Database::create(path).map_err(redb::Error::from)?;
        let tx = db.begin_write().map_err(redb::Error::from)?;
        tx.open_table(UPLOADS).map_err(redb::Error::from)?;
        tx.open_table(CHUNKS).map_err(redb::Error::from)?;
        tx.commit().map_err(redb::Error::from)?;
        Ok(Manifest { db })
    }

    /// Every upload with its chunks.
    pub fn load(&self) -> Result<Vec<Loaded>, ManifestError> {
        let tx = self.db.begin_read().map_err(redb::Error::from)?;
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
        let tx = self.db.begin_write().map_err(redb::Error::from)?;
        {
            let mut uploads = tx.open_table(UPLOADS).map_err(redb::Error::from)?;
            uploads
                .insert(record.array_id.as_str(), encode(record).as_slice())
                .map_err(redb::Error::from)?;
        }
        tx.commit().map_err(redb::Error::from)?;
        Ok(())
    }

    /// Records that cell `cell` of upload `uid` is the store entry `key`.
    pub fn put_chunk(&self, uid: u64, cell: u64, key: &[u8]) -> Result<(), ManifestError> {
        let tx = self.db.begin_write().map_err(redb::Error::from)?;
        {
            let mut chunks = tx.open_table(CHUNKS).map_err(redb::Error::from)?;
            chunks.insert((uid, cell), key).map_err(redb::Error::from)?;
        }
        tx.commit().map_err(redb::Error::from)?;
        Ok(())
    }

    /// Forgets the chunks of upload `uid` (its storage is gone).
    pub fn drop_chunks(&self, uid: u64) -> Result<(), ManifestError> {
        let tx = self.db.begin_write().map_err(redb::Error::from)?;
        {
            let mut chunks = tx.open_table(CHUNKS).map_err(redb::Error::from)?;
            chunks
                .retain_in((uid, 0)..=(uid, u64::MAX), |_, _| false)
                .map_err(redb::Error::from)?;
        }
        tx.commit().map_err(redb::Error::from)?;
        Ok(())
    }

    /// Forgets the upload `array_id` and its chunks: its name is free again.
    pub fn remove(&self, array_id: &str, uid: u64) -> Result<(), ManifestError> {
        let tx = self.db.begin_write().map_err(redb::Error::from)?;
        {
            let mut uploads = tx.open_table(UPLOADS).map_err(redb::Error::from)?;
            uploads.remove(array_id).map_err(redb::Error::from)?;
            let mut chunks = tx.open_table(CHUNKS).map_err(redb::Error::from)?;
            chunks
                .retain_in((uid, 0)..=(uid, u64::MAX), |_, _| false)
                .map_err(redb::Error::from)?;
        }
        tx.commit().map_err(redb::Error::from)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::uploads::record::State;

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
