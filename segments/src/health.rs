//! Whether the store still takes writes: open, closed, or poisoned by a failed fsync.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::error::StoreError;

/// The store's write state. Lookups and reads never ask it; appends do before they write.
#[derive(Debug)]
pub(crate) struct Health {
    /// The cache directory, named in refusals.
    dir: PathBuf,
    closed: AtomicBool,
    /// The first reason the store refuses writes, once a durability step failed.
    poisoned: Mutex<Option<String>>,
}

impl Health {
    /// An open, writable store in `dir`.
    pub(crate) fn new(dir: PathBuf) -> Health {
        Health {
            dir,
            closed: AtomicBool::new(false),
            poisoned: Mutex::new(None),
        }
    }

    /// Refuses all further writes, keeping the first reason.
    pub(crate) fn poison(&self, reason: String) {
        let mut slot = self.poisoned.lock();
        if slot.is_none() {
            tracing::error!(dir = %self.dir.display(), %reason, "segment store refuses further writes");
            *slot = Some(reason);
        }
    }

    /// Marks the store closed; false when it already was.
    pub(crate) fn close(&self) -> bool {
        !self.closed.swap(true, Ordering::AcqRel)
    }

    /// Errors when the store cannot take writes.
    pub(crate) fn check_writable(&self) -> Result<(), StoreError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed {
                dir: self.dir.clone(),
            });
        }
        self.check_not_poisoned()
    }

    /// Errors when a durability step failed since open.
    pub(crate) fn check_not_poisoned(&self) -> Result<(), StoreError> {
        match self.poisoned.lock().as_ref() {
            Some(reason) => Err(StoreError::Poisoned {
                dir: self.dir.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }
}
