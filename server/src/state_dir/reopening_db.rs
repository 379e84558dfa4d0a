//! A redb database that reopens itself after an I/O error.
//!
//! After a failed write (a full disk: ENOSPC, EDQUOT) redb answers every later call with
//! "Previous I/O error occurred. Please close and re-open the database." until the
//! `Database` is dropped and opened again, so without this the state directory's
//! databases stayed broken until a restart, even once room was made (issue 28, item 13).
//! [`ReopeningDb`] notes such errors and opens the file again (redb repairs it from its
//! last commit) before the next transaction; a reopen that fails leaves it broken and the
//! next call tries again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;
use redb::{Database, ReadTransaction, WriteTransaction};

/// A redb database file, reopened after an I/O error.
pub struct ReopeningDb {
    path: PathBuf,
    /// The page cache each (re)open gets; `None`: redb's default.
    cache_bytes: Option<usize>,
    /// `None` only while broken and a reopen has failed.
    db: RwLock<Option<Database>>,
    /// An I/O error was seen: reopen before the next transaction.
    broken: AtomicBool,
}

impl std::fmt::Debug for ReopeningDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReopeningDb")
            .field("path", &self.path)
            .field("broken", &self.broken.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Whether `err` is the filesystem refusing a write for lack of space or quota.
pub fn is_disk_full(err: &redb::Error) -> bool {
    matches!(
        err,
        redb::Error::Io(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
    )
}

/// Opens (creating) the database at `path` with the given page cache.
fn create(path: &Path, cache_bytes: Option<usize>) -> Result<Database, redb::Error> {
    let mut builder = Database::builder();
    if let Some(bytes) = cache_bytes {
        builder.set_cache_size(bytes);
    }
    Ok(builder.create(path)?)
}

impl ReopeningDb {
    /// Opens (creating) the database at `path`, with a page cache of `cache_bytes` (redb's
    /// default when `None`).
    pub fn open(path: &Path, cache_bytes: Option<usize>) -> Result<ReopeningDb, redb::Error> {
        let db = create(path, cache_bytes)?;
        Ok(ReopeningDb {
            path: path.to_path_buf(),
            cache_bytes,
            db: RwLock::new(Some(db)),
            broken: AtomicBool::new(false),
        })
    }

    /// Notes an error a transaction of this database met: after an I/O error (or redb's
    /// "previous I/O error") the next transaction reopens the file first.
    pub fn note(&self, err: &redb::Error) {
        if matches!(err, redb::Error::Io(_) | redb::Error::PreviousIo)
            && !self.broken.swap(true, Ordering::AcqRel)
        {
            tracing::warn!(db = %self.path.display(), error = %err, "database write failed; it is reopened before its next use");
        }
    }

    /// Begins a write transaction (reopening the file first after an I/O error).
    pub fn begin_write(&self) -> Result<WriteTransaction, redb::Error> {
        self.with_db(|db| db.begin_write().map_err(redb::Error::from))
    }

    /// Begins a read transaction (reopening the file first after an I/O error).
    pub fn begin_read(&self) -> Result<ReadTransaction, redb::Error> {
        use redb::ReadableDatabase;
        self.with_db(|db| db.begin_read().map_err(redb::Error::from))
    }

    fn with_db<T>(
        &self,
        begin: impl FnOnce(&Database) -> Result<T, redb::Error>,
    ) -> Result<T, redb::Error> {
        if self.broken.load(Ordering::Acquire) {
            self.reopen()?;
        }
        let slot = self.db.read();
        let out = match slot.as_ref() {
            Some(db) => begin(db),
            None => Err(redb::Error::PreviousIo),
        };
        if let Err(err) = &out {
            self.note(err);
        }
        out
    }

    /// Drops the broken database (releasing its file lock) and opens the file again.
    fn reopen(&self) -> Result<(), redb::Error> {
        let mut slot = self.db.write();
        if !self.broken.load(Ordering::Acquire) && slot.is_some() {
            return Ok(());
        }
        drop(slot.take());
        let db = create(&self.path, self.cache_bytes).inspect_err(|err| {
            tracing::warn!(db = %self.path.display(), error = %err, "cannot reopen the database yet");
        })?;
        *slot = Some(db);
        self.broken.store(false, Ordering::Release);
        tracing::info!(db = %self.path.display(), "database reopened after an I/O error");
        Ok(())
    }
}
