//! What the writer and the maintenance both see: the directory and file settings (fixed at
//! open) and the owners of the state they share, each behind its own methods: the
//! [`Catalog`] of entries and segments, the [`Health`] that refuses writes, and the
//! [`Budget`] of bytes on disk.

use std::path::PathBuf;
use std::sync::Arc;

use crate::budget::Budget;
use crate::catalog::Catalog;
use crate::fault::FaultInjector;
use crate::health::Health;

/// The store's shared state. Its settings never change after open; everything that does
/// change lives in an owner with private fields.
#[derive(Debug)]
pub(crate) struct Shared {
    /// The cache directory (canonical).
    pub dir: PathBuf,
    /// `DIR/segments`.
    pub segdir: PathBuf,
    /// Permission bits of new files.
    pub mode: u32,
    /// The encapsulated schema message that starts every segment.
    pub schema: Vec<u8>,
    fault: Option<Arc<dyn FaultInjector>>,
    /// Entries, segments and their recency.
    pub catalog: Catalog,
    /// Whether writes are still taken.
    pub health: Health,
    /// Bytes on disk against the budget.
    pub budget: Budget,
}

impl Shared {
    /// Gathers the settings and owners of a store opening in `dir`.
    pub(crate) fn new(
        dir: PathBuf,
        mode: u32,
        schema: Vec<u8>,
        fault: Option<Arc<dyn FaultInjector>>,
        catalog: Catalog,
        budget: Budget,
    ) -> Shared {
        Shared {
            segdir: crate::layout::segments_dir(&dir),
            health: Health::new(dir.clone()),
            dir,
            mode,
            schema,
            fault,
            catalog,
            budget,
        }
    }

    /// The test's fault injector, if one is installed.
    pub(crate) fn fault(&self) -> Option<&dyn FaultInjector> {
        self.fault.as_deref()
    }
}
