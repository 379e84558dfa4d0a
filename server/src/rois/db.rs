//! The annotation store: one redb database in `STATE_DIR/annotations/rois.redb`
//! (docs/decisions/0020). Every call is one transaction; a write commits with an fsync
//! before it returns, so an acknowledged batch survives a crash and a batch cut short by
//! one leaves nothing behind.
//!
//! ```text
//! rois   (array_id, roi_id)   -> StoredRoi (JSON)
//! sets   (array_id, set_name) -> row count        kept in the same transactions as rois
//! seen   array_id             -> Seen (JSON)      when the tensor was last served
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use redb::{ReadableTable, ReadableTableMetadata, Table, TableDefinition, WriteTransaction};
use serde::{Deserialize, Serialize};

use super::RESERVED_SET_PREFIX;
use crate::state_dir::reopening_db::ReopeningDb;

const ROIS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("rois");
const SETS: TableDefinition<(&str, &str), u64> = TableDefinition::new("sets");
const SEEN: TableDefinition<&str, &[u8]> = TableDefinition::new("seen");

/// Default memory redb may keep as its page cache (`annotation_cache`). redb's own default,
/// 1 GiB, kept most of a large store in RAM after one SQL scan of the `rois` table.
pub const DEFAULT_CACHE_BYTES: usize = 32 << 20;

/// Why the store failed or refused.
#[derive(Debug, thiserror::Error)]
pub enum RoiDbError {
    /// The database failed (I/O, corruption).
    #[error("annotation store {}: {source}", path.display())]
    Db {
        /// The database file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: Box<redb::Error>,
    },
    /// A stored record could not be decoded.
    #[error("annotation store {}: record {key} is unreadable: {reason}", path.display())]
    Corrupt {
        /// The database file.
        path: PathBuf,
        /// Which record.
        key: String,
        /// Why.
        reason: String,
    },
    /// The write would take a tensor past the per-tensor row cap.
    #[error(
        "annotation limit reached for '{array_id}': {stored} stored + {new} new is more than \
         the {cap} annotations a tensor may have (max_rois_per_tensor); this is an annotation \
         store, a segmentation belongs in a label tensor"
    )]
    Cap {
        /// The tensor.
        array_id: String,
        /// Rows already stored.
        stored: u64,
        /// Rows the batch would add.
        new: u64,
        /// The cap.
        cap: u64,
    },
}

impl RoiDbError {
    /// Whether the database failed for lack of room (a full or over-quota filesystem), or
    /// is being reopened after such a failure: worth retrying once there is room.
    pub fn is_disk_full(&self) -> bool {
        match self {
            RoiDbError::Db { source, .. } => {
                crate::state_dir::reopening_db::is_disk_full(source)
                    || matches!(**source, redb::Error::PreviousIo)
            }
            _ => false,
        }
    }
}

/// One stored annotation (the key holds its tensor and id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredRoi {
    /// Its set (layer).
    pub set_name: String,
    /// The user's name for it.
    pub label: String,
    /// The geometry's arm (`point`, `rectangle`, …).
    pub shape: String,
    /// `biopb.image.ROI`, canonical proto3 JSON.
    pub geometry: String,
    /// Axis → index pins.
    pub plane: BTreeMap<u32, u32>,
    /// Opaque client JSON.
    pub props_json: String,
    /// The tensor's content version when drawn.
    pub drawn_against_version: Option<Vec<u8>>,
    /// Bumped on every write, from 1.
    pub rev: i64,
    /// Creation time, Unix ms.
    pub created_ms: i64,
    /// Last write, Unix ms.
    pub updated_ms: i64,
}

/// A checked annotation about to be written.
#[derive(Debug, Clone)]
pub struct NewRoi {
    /// The id, or `None` to mint one.
    pub roi_id: Option<String>,
    /// The record; `rev` is the client's (compared under `check_rev`), the timestamps
    /// are replaced.
    pub record: StoredRoi,
}

/// One put: rows of one served tensor.
#[derive(Debug)]
pub struct Batch<'a> {
    /// The tensor.
    pub array_id: &'a str,
    /// Where it is served from (noted as its last sighting).
    pub source_url: &'a str,
    /// The rows.
    pub rows: Vec<NewRoi>,
    /// Write a stored row only when the row's `rev` is the stored one.
    pub check_rev: bool,
}

/// A set of a tensor and its row count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetCount {
    /// The set.
    pub set_name: String,
    /// Its rows.
    pub count: u64,
}

/// What a put did.
#[derive(Debug, Default)]
pub struct PutOutcome {
    /// The rows written, as stored.
    pub stored: Vec<(String, StoredRoi)>,
    /// `(roi_id, stored rev)` of the rows a `check_rev` put did not write.
    pub conflicts: Vec<(String, i64)>,
}

/// One listing.
#[derive(Debug, Default)]
pub struct Listing {
    /// The rows, oldest first (then by id).
    pub rois: Vec<(String, StoredRoi)>,
    /// Whether the row limit cut `rois`.
    pub truncated: bool,
    /// Every set of the tensor with its row count, by name.
    pub sets: Vec<SetCount>,
}

/// When a tensor was last served.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Seen {
    last_seen_ms: i64,
    source_url: String,
}

/// A tensor whose annotations outlived its serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unseen {
    /// The tensor.
    pub array_id: String,
    /// Its source when last served (empty when never seen).
    pub source_url: String,
    /// Its client-owned annotations.
    pub count: u64,
    /// When last served (0: never; its newest annotation's creation stood in).
    pub last_seen_ms: i64,
}

/// What a prune found (and deleted, with `apply`).
#[derive(Debug, Default)]
pub struct PruneOutcome {
    /// The tensors found, oldest sighting first.
    pub unseen: Vec<Unseen>,
    /// Annotations deleted.
    pub deleted: u64,
}

/// The annotation database.
#[derive(Debug)]
pub struct RoiDb {
    db: ReopeningDb,
    path: PathBuf,
}

fn is_reserved(set_name: &str) -> bool {
    set_name.starts_with(RESERVED_SET_PREFIX)
}

impl RoiDb {
    /// Opens (creating) the database at `path`, caching at most `cache_bytes` of its pages.
    pub fn open(path: &Path, cache_bytes: usize) -> Result<RoiDb, RoiDbError> {
        let fail = |e: redb::Error| RoiDbError::Db {
            path: path.to_path_buf(),
            source: Box::new(e),
        };
        let db = ReopeningDb::open(path, Some(cache_bytes)).map_err(fail)?;
        let store = RoiDb {
            db,
            path: path.to_path_buf(),
        };
        let tx = store.write()?;
        {
            tx.open_table(ROIS).map_err(|e| store.db_err(e))?;
            tx.open_table(SETS).map_err(|e| store.db_err(e))?;
            tx.open_table(SEEN).map_err(|e| store.db_err(e))?;
        }
        tx.commit().map_err(|e| store.db_err(e))?;
        Ok(store)
    }

    fn db_err(&self, e: impl Into<redb::Error>) -> RoiDbError {
        let source = e.into();
        self.db.note(&source);
        RoiDbError::Db {
            path: self.path.clone(),
            source: Box::new(source),
        }
    }

    fn corrupt(&self, key: String, reason: impl ToString) -> RoiDbError {
        RoiDbError::Corrupt {
            path: self.path.clone(),
            key,
            reason: reason.to_string(),
        }
    }

    fn write(&self) -> Result<WriteTransaction, RoiDbError> {
        self.db.begin_write().map_err(|e| self.db_err(e))
    }

    fn decode(&self, array_id: &str, roi_id: &str, bytes: &[u8]) -> Result<StoredRoi, RoiDbError> {
        serde_json::from_slice(bytes).map_err(|e| self.corrupt(format!("{array_id}/{roi_id}"), e))
    }

    fn encode(&self, key: &str, record: &impl Serialize) -> Result<Vec<u8>, RoiDbError> {
        serde_json::to_vec(record).map_err(|e| self.corrupt(key.to_string(), e))
    }

    /// Every row of `array_id`, in id order, from an open table.
    fn rows_of<T: ReadableTable<(&'static str, &'static str), &'static [u8]>>(
        &self,
        table: &T,
        array_id: &str,
    ) -> Result<Vec<(String, StoredRoi)>, RoiDbError> {
        let mut out = Vec::new();
        for entry in table.range((array_id, "")..).map_err(|e| self.db_err(e))? {
            let (key, value) = entry.map_err(|e| self.db_err(e))?;
            let (tensor, id) = key.value();
            if tensor != array_id {
                break;
            }
            out.push((id.to_string(), self.decode(tensor, id, value.value())?));
        }
        Ok(out)
    }

    fn sets_of<T: ReadableTable<(&'static str, &'static str), u64>>(
        &self,
        table: &T,
        array_id: &str,
    ) -> Result<Vec<SetCount>, RoiDbError> {
        let mut out = Vec::new();
        for entry in table.range((array_id, "")..).map_err(|e| self.db_err(e))? {
            let (key, value) = entry.map_err(|e| self.db_err(e))?;
            let (tensor, set_name) = key.value();
            if tensor != array_id {
                break;
            }
            out.push(SetCount {
                set_name: set_name.to_string(),
                count: value.value(),
            });
        }
        Ok(out)
    }

    fn bump_set(
        &self,
        sets: &mut Table<(&str, &str), u64>,
        array_id: &str,
        set_name: &str,
        delta: i64,
    ) -> Result<(), RoiDbError> {
        let now = sets
            .get((array_id, set_name))
            .map_err(|e| self.db_err(e))?
            .map_or(0, |v| v.value());
        let next = now.saturating_add_signed(delta);
        if next == 0 {
            sets.remove((array_id, set_name))
                .map_err(|e| self.db_err(e))?;
        } else {
            sets.insert((array_id, set_name), next)
                .map_err(|e| self.db_err(e))?;
        }
        Ok(())
    }

    fn stamp_seen(
        &self,
        tx: &WriteTransaction,
        array_id: &str,
        source_url: &str,
        now_ms: i64,
    ) -> Result<(), RoiDbError> {
        let mut seen = tx.open_table(SEEN).map_err(|e| self.db_err(e))?;
        let record = Seen {
            last_seen_ms: now_ms,
            source_url: source_url.to_string(),
        };
        let bytes = self.encode(array_id, &record)?;
        seen.insert(array_id, bytes.as_slice())
            .map_err(|e| self.db_err(e))?;
        Ok(())
    }

    /// Creates or updates the rows of `batch` in one transaction, durable when this
    /// returns. Under `check_rev` a row whose `rev` is not the stored one is a conflict and
    /// is not written; the rest land. Refused whole when the tensor would hold more than
    /// `cap` client-owned rows. `mint` names rows sent without an id.
    pub fn put(
        &self,
        batch: Batch<'_>,
        cap: u64,
        now_ms: i64,
        mut mint: impl FnMut() -> String,
    ) -> Result<PutOutcome, RoiDbError> {
        let Batch {
            array_id,
            source_url,
            rows,
            check_rev,
        } = batch;
        let tx = self.write()?;
        let mut outcome = PutOutcome::default();
        {
            let mut rois = tx.open_table(ROIS).map_err(|e| self.db_err(e))?;
            let mut sets = tx.open_table(SETS).map_err(|e| self.db_err(e))?;
            let stored: u64 = self
                .sets_of(&sets, array_id)?
                .iter()
                .filter(|s| !is_reserved(&s.set_name))
                .map(|s| s.count)
                .sum();
            let mut prior = HashMap::new();
            for row in &rows {
                if let Some(id) = &row.roi_id
                    && let Some(old) = rois
                        .get((array_id, id.as_str()))
                        .map_err(|e| self.db_err(e))?
                {
                    prior.insert(id.clone(), self.decode(array_id, id, old.value())?);
                }
            }
            let new = rows
                .iter()
                .filter(|r| r.roi_id.as_ref().is_none_or(|id| !prior.contains_key(id)))
                .count() as u64;
            if stored + new > cap {
                return Err(RoiDbError::Cap {
                    array_id: array_id.to_string(),
                    stored,
                    new,
                    cap,
                });
            }
            for row in rows {
                let (id, old) = match row.roi_id {
                    Some(id) => {
                        let old = prior.remove(&id);
                        (id, old)
                    }
                    None => (mint(), None),
                };
                let mut record = row.record;
                match &old {
                    Some(old) if check_rev && record.rev != old.rev => {
                        outcome.conflicts.push((id, old.rev));
                        continue;
                    }
                    Some(old) => {
                        record.rev = old.rev + 1;
                        record.created_ms = old.created_ms;
                        self.bump_set(&mut sets, array_id, &old.set_name, -1)?;
                    }
                    None => {
                        record.rev = 1;
                        record.created_ms = now_ms;
                    }
                }
                record.updated_ms = now_ms;
                let bytes = self.encode(&id, &record)?;
                rois.insert((array_id, id.as_str()), bytes.as_slice())
                    .map_err(|e| self.db_err(e))?;
                self.bump_set(&mut sets, array_id, &record.set_name, 1)?;
                outcome.stored.push((id, record));
            }
        }
        self.stamp_seen(&tx, array_id, source_url, now_ms)?;
        tx.commit().map_err(|e| self.db_err(e))?;
        Ok(outcome)
    }

    /// The rows of `array_id`: one set, or (with `set_name` empty) every client-owned
    /// set; at most `limit`, oldest first.
    pub fn list(
        &self,
        array_id: &str,
        set_name: &str,
        limit: usize,
    ) -> Result<Listing, RoiDbError> {
        let tx = self.db.begin_read().map_err(|e| self.db_err(e))?;
        let rois = tx.open_table(ROIS).map_err(|e| self.db_err(e))?;
        let sets = tx.open_table(SETS).map_err(|e| self.db_err(e))?;
        let mut rows: Vec<_> = self
            .rows_of(&rois, array_id)?
            .into_iter()
            .filter(|(_, r)| {
                if set_name.is_empty() {
                    !is_reserved(&r.set_name)
                } else {
                    r.set_name == set_name
                }
            })
            .collect();
        rows.sort_by(|(a_id, a), (b_id, b)| (a.created_ms, a_id).cmp(&(b.created_ms, b_id)));
        let truncated = rows.len() > limit;
        rows.truncate(limit);
        Ok(Listing {
            rois: rows,
            truncated,
            sets: self.sets_of(&sets, array_id)?,
        })
    }

    /// Deletes rows of `array_id`: those of `ids`, else those of set `set_name`, else
    /// every client-owned one. Answers the ids removed.
    pub fn delete(
        &self,
        array_id: &str,
        ids: &[String],
        set_name: &str,
    ) -> Result<Vec<String>, RoiDbError> {
        let tx = self.write()?;
        let mut deleted = Vec::new();
        {
            let mut rois = tx.open_table(ROIS).map_err(|e| self.db_err(e))?;
            let mut sets = tx.open_table(SETS).map_err(|e| self.db_err(e))?;
            let doomed: Vec<(String, String)> = if ids.is_empty() {
                self.rows_of(&rois, array_id)?
                    .into_iter()
                    .filter(|(_, r)| {
                        if set_name.is_empty() {
                            !is_reserved(&r.set_name)
                        } else {
                            r.set_name == set_name
                        }
                    })
                    .map(|(id, r)| (id, r.set_name))
                    .collect()
            } else {
                let mut found = Vec::new();
                for id in ids {
                    if let Some(old) = rois
                        .get((array_id, id.as_str()))
                        .map_err(|e| self.db_err(e))?
                    {
                        let record = self.decode(array_id, id, old.value())?;
                        found.push((id.clone(), record.set_name));
                    }
                }
                found
            };
            for (id, set) in doomed {
                if rois
                    .remove((array_id, id.as_str()))
                    .map_err(|e| self.db_err(e))?
                    .is_some()
                {
                    self.bump_set(&mut sets, array_id, &set, -1)?;
                    deleted.push(id);
                }
            }
        }
        tx.commit().map_err(|e| self.db_err(e))?;
        Ok(deleted)
    }

    /// Stamps every annotated tensor `served` answers a source url for as seen at
    /// `now_ms`; answers how many.
    pub fn stamp_served(
        &self,
        now_ms: i64,
        served: &dyn Fn(&str) -> Option<String>,
    ) -> Result<usize, RoiDbError> {
        let tx = self.write()?;
        let mut stamped = 0;
        {
            let sets = tx.open_table(SETS).map_err(|e| self.db_err(e))?;
            let mut tensors: Vec<String> = Vec::new();
            for entry in sets.iter().map_err(|e| self.db_err(e))? {
                let (key, _) = entry.map_err(|e| self.db_err(e))?;
                let tensor = key.value().0;
                if tensors.last().is_none_or(|last| last != tensor) {
                    tensors.push(tensor.to_string());
                }
            }
            drop(sets);
            for array_id in tensors {
                if let Some(url) = served(&array_id) {
                    self.stamp_seen(&tx, &array_id, &url, now_ms)?;
                    stamped += 1;
                }
            }
        }
        tx.commit().map_err(|e| self.db_err(e))?;
        Ok(stamped)
    }

    /// Finds the tensors whose annotations have not been served since `cutoff_ms`
    /// (`served` answers the source url of a tensor served now, which is stamped as seen
    /// at `now_ms`); with `apply`, deletes their client-owned annotations.
    pub fn prune(
        &self,
        cutoff_ms: i64,
        now_ms: i64,
        apply: bool,
        served: &dyn Fn(&str) -> Option<String>,
    ) -> Result<PruneOutcome, RoiDbError> {
        let tx = self.write()?;
        let mut outcome = PruneOutcome::default();
        {
            let mut rois = tx.open_table(ROIS).map_err(|e| self.db_err(e))?;
            let mut sets = tx.open_table(SETS).map_err(|e| self.db_err(e))?;
            let mut seen = tx.open_table(SEEN).map_err(|e| self.db_err(e))?;
            let mut counts: BTreeMap<String, u64> = BTreeMap::new();
            for entry in sets.iter().map_err(|e| self.db_err(e))? {
                let (key, value) = entry.map_err(|e| self.db_err(e))?;
                let (tensor, set_name) = key.value();
                if !is_reserved(set_name) {
                    *counts.entry(tensor.to_string()).or_default() += value.value();
                }
            }
            for (array_id, count) in counts {
                if let Some(url) = served(&array_id) {
                    let record = Seen {
                        last_seen_ms: now_ms,
                        source_url: url,
                    };
                    let bytes = self.encode(&array_id, &record)?;
                    seen.insert(array_id.as_str(), bytes.as_slice())
                        .map_err(|e| self.db_err(e))?;
                    continue;
                }
                let sighting = match seen.get(array_id.as_str()).map_err(|e| self.db_err(e))? {
                    Some(v) => Some(
                        serde_json::from_slice::<Seen>(v.value())
                            .map_err(|e| self.corrupt(format!("seen/{array_id}"), e))?,
                    ),
                    None => None,
                };
                let rows = self.rows_of(&rois, &array_id)?;
                let (age_from, last_seen_ms, source_url) = match sighting {
                    Some(s) => (s.last_seen_ms, s.last_seen_ms, s.source_url),
                    None => (
                        rows.iter().map(|(_, r)| r.created_ms).max().unwrap_or(0),
                        0,
                        String::new(),
                    ),
                };
                if age_from >= cutoff_ms {
                    continue;
                }
                outcome.unseen.push(Unseen {
                    array_id: array_id.clone(),
                    source_url,
                    count,
                    last_seen_ms,
                });
                if apply {
                    for (id, record) in rows.iter().filter(|(_, r)| !is_reserved(&r.set_name)) {
                        rois.remove((array_id.as_str(), id.as_str()))
                            .map_err(|e| self.db_err(e))?;
                        self.bump_set(&mut sets, &array_id, &record.set_name, -1)?;
                        outcome.deleted += 1;
                    }
                    seen.remove(array_id.as_str()).map_err(|e| self.db_err(e))?;
                }
            }
        }
        tx.commit().map_err(|e| self.db_err(e))?;
        outcome
            .unseen
            .sort_by(|a, b| (a.last_seen_ms, &a.array_id).cmp(&(b.last_seen_ms, &b.array_id)));
        Ok(outcome)
    }

    /// How many annotations the store holds (every tensor's; one read of the table's
    /// header).
    pub fn count(&self) -> Result<u64, RoiDbError> {
        let tx = self.db.begin_read().map_err(|e| self.db_err(e))?;
        let rois = tx.open_table(ROIS).map_err(|e| self.db_err(e))?;
        rois.len().map_err(|e| self.db_err(e))
    }

    /// The annotations after key `after` (from the first when `None`), in key order
    /// (tensor, then id): as many as fit `max_bytes` of stored records (at least one), at
    /// most `max_rows`. The SQL `rois` table reads the store page by page this way, each
    /// page in a read transaction of its own.
    pub fn page(
        &self,
        after: Option<&(String, String)>,
        max_rows: usize,
        max_bytes: usize,
    ) -> Result<Vec<(String, String, StoredRoi)>, RoiDbError> {
        let tx = self.db.begin_read().map_err(|e| self.db_err(e))?;
        let rois = tx.open_table(ROIS).map_err(|e| self.db_err(e))?;
        let range = match after {
            Some((tensor, id)) => rois.range::<(&str, &str)>((
                std::ops::Bound::Excluded((tensor.as_str(), id.as_str())),
                std::ops::Bound::Unbounded,
            )),
            None => rois.range::<(&str, &str)>(..),
        }
        .map_err(|e| self.db_err(e))?;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for entry in range {
            if out.len() >= max_rows || (bytes >= max_bytes && !out.is_empty()) {
                break;
            }
            let (key, value) = entry.map_err(|e| self.db_err(e))?;
            let (tensor, id) = key.value();
            bytes += value.value().len();
            out.push((
                tensor.to_string(),
                id.to_string(),
                self.decode(tensor, id, value.value())?,
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roi(id: Option<&str>, set: &str, rev: i64) -> NewRoi {
        NewRoi {
            roi_id: id.map(str::to_string),
            record: StoredRoi {
                set_name: set.to_string(),
                label: "l".to_string(),
                shape: "point".to_string(),
                geometry: r#"{"point":{}}"#.to_string(),
                plane: BTreeMap::new(),
                props_json: String::new(),
                drawn_against_version: None,
                rev,
                created_ms: 0,
                updated_ms: 0,
            },
        }
    }

    fn store() -> Result<(tempfile::TempDir, RoiDb), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let store = RoiDb::open(&dir.path().join("rois.redb"), DEFAULT_CACHE_BYTES)?;
        Ok((dir, store))
    }

    /// A put with ids minted `minted-1`, `minted-2`, … per store.
    fn put(
        store: &RoiDb,
        array_id: &str,
        source_url: &str,
        rows: Vec<NewRoi>,
        check_rev: bool,
        cap: u64,
        now_ms: i64,
    ) -> Result<PutOutcome, RoiDbError> {
        let mut n = usize::try_from(store.count()?).unwrap_or(usize::MAX);
        let batch = Batch {
            array_id,
            source_url,
            rows,
            check_rev,
        };
        store.put(batch, cap, now_ms, || {
            n += 1;
            format!("minted-{n}")
        })
    }

    #[test]
    fn put_creates_updates_and_reports_conflicts() -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, store) = store()?;
        let first = put(
            &store,
            "img",
            "u",
            vec![roi(None, "a", 0), roi(Some("mine"), "b", 0)],
            false,
            10,
            100,
        )?;
        assert_eq!(first.stored.len(), 2);
        assert_eq!(first.stored[0].0, "minted-1");
        assert!(
            first
                .stored
                .iter()
                .all(|(_, r)| r.rev == 1 && r.created_ms == 100)
        );
        // Update under check_rev: the right rev lands, a stale one is a conflict.
        let second = put(
            &store,
            "img",
            "u",
            vec![roi(Some("mine"), "a", 1), roi(Some("minted-1"), "a", 7)],
            true,
            10,
            200,
        )?;
        assert_eq!(second.conflicts, vec![("minted-1".to_string(), 1)]);
        assert_eq!(second.stored.len(), 1);
        assert_eq!(second.stored[0].1.rev, 2);
        assert_eq!(second.stored[0].1.created_ms, 100);
        assert_eq!(second.stored[0].1.updated_ms, 200);
        let listing = store.list("img", "", 100)?;
        assert_eq!(listing.rois.len(), 2);
        assert_eq!(
            listing.sets,
            vec![SetCount {
                set_name: "a".to_string(),
                count: 2
            }]
        );
        assert!(!listing.truncated);
        let clipped = store.list("img", "", 1)?;
        assert!(clipped.truncated);
        assert_eq!(clipped.rois.len(), 1);
        Ok(())
    }

    #[test]
    fn pages_walk_every_tensor_in_key_order() -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, store) = store()?;
        for (tensor, ids) in [("b", ["2", "1"]), ("a", ["9", "3"])] {
            let rows = ids.iter().map(|id| roi(Some(id), "s", 0)).collect();
            put(&store, tensor, "u", rows, false, 10, 1)?;
        }
        assert_eq!(store.count()?, 4);
        let mut after = None;
        let mut seen = Vec::new();
        loop {
            let page = store.page(after.as_ref(), 3, usize::MAX)?;
            let Some((tensor, id, _)) = page.last() else {
                break;
            };
            after = Some((tensor.clone(), id.clone()));
            seen.push(
                page.iter()
                    .map(|(t, i, _)| format!("{t}/{i}"))
                    .collect::<Vec<_>>(),
            );
        }
        assert_eq!(seen, vec![vec!["a/3", "a/9", "b/1"], vec!["b/2"]]);
        // A page holds at least one record, however small its byte budget.
        assert_eq!(store.page(None, 10, 1)?.len(), 1);
        Ok(())
    }

    #[test]
    fn the_cap_refuses_the_whole_batch() -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, store) = store()?;
        put(
            &store,
            "img",
            "u",
            vec![roi(Some("x"), "a", 0), roi(Some("y"), "a", 0)],
            false,
            3,
            1,
        )?;
        let refused = put(
            &store,
            "img",
            "u",
            vec![roi(Some("x"), "a", 0), roi(None, "a", 0), roi(None, "a", 0)],
            false,
            3,
            2,
        );
        let text = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.contains("2 stored + 2 new") && text.contains("max_rois_per_tensor"),
            "{text}"
        );
        assert_eq!(store.list("img", "", 10)?.rois.len(), 2);
        // An update of stored rows plus one new one fits.
        put(
            &store,
            "img",
            "u",
            vec![roi(Some("x"), "a", 0), roi(None, "a", 0)],
            false,
            3,
            2,
        )?;
        Ok(())
    }

    #[test]
    fn delete_by_ids_by_set_and_all() -> Result<(), Box<dyn std::error::Error>> {
        let (_dir, store) = store()?;
        put(
            &store,
            "img",
            "u",
            vec![
                roi(Some("1"), "a", 0),
                roi(Some("2"), "a", 0),
                roi(Some("3"), "b", 0),
                roi(Some("4"), "c", 0),
            ],
            false,
            10,
            1,
        )?;
        put(
            &store,
            "other",
            "u",
            vec![roi(Some("1"), "a", 0)],
            false,
            10,
            1,
        )?;
        assert_eq!(
            store.delete("img", &["1".to_string(), "nope".to_string()], "")?,
            vec!["1"]
        );
        assert_eq!(store.delete("img", &[], "b")?, vec!["3"]);
        assert_eq!(store.list("img", "", 10)?.sets.len(), 2);
        let mut all = store.delete("img", &[], "")?;
        all.sort();
        assert_eq!(all, vec!["2", "4"]);
        assert!(store.list("img", "", 10)?.sets.is_empty());
        assert_eq!(store.list("other", "", 10)?.rois.len(), 1);
        Ok(())
    }

    #[test]
    fn prune_reports_and_deletes_only_unserved_tensors() -> Result<(), Box<dyn std::error::Error>> {
        let (dir, store) = store()?;
        put(
            &store,
            "gone",
            "file:///gone.npy",
            vec![roi(None, "a", 0)],
            false,
            10,
            1_000,
        )?;
        put(
            &store,
            "here",
            "file:///here.npy",
            vec![roi(None, "a", 0)],
            false,
            10,
            1_000,
        )?;
        let served = |id: &str| (id == "here").then(|| "file:///here.npy".to_string());
        // A sighting moves the clock of what is served, and only of that.
        assert_eq!(store.stamp_served(4_000, &served)?, 1);
        assert!(
            store
                .prune(3_000, 4_000, false, &|_| None)?
                .unseen
                .iter()
                .all(|u| u.array_id == "gone")
        );
        let report = store.prune(5_000, 10_000, false, &served)?;
        assert_eq!(report.deleted, 0);
        assert_eq!(
            report.unseen,
            vec![Unseen {
                array_id: "gone".to_string(),
                source_url: "file:///gone.npy".to_string(),
                count: 1,
                last_seen_ms: 1_000
            }]
        );
        assert!(store.prune(500, 10_000, false, &served)?.unseen.is_empty());
        drop(store);
        // Durable: a reopened store answers the same, then applies.
        let store = RoiDb::open(&dir.path().join("rois.redb"), DEFAULT_CACHE_BYTES)?;
        let applied = store.prune(5_000, 10_000, true, &served)?;
        assert_eq!(applied.deleted, 1);
        assert!(store.list("gone", "", 10)?.rois.is_empty());
        assert_eq!(store.list("here", "", 10)?.rois.len(), 1);
        Ok(())
    }
}
