//! Fault injection for tests: lets a test make entry writes or directory fsyncs fail.

use std::io;

/// A fault to inject into one entry write.
#[derive(Debug)]
pub struct WriteFault {
    /// How many bytes of the entry reach the file before the error (torn write when > 0).
    pub written_before_error: usize,
    /// The error the write reports.
    pub error: io::Error,
}

/// Decides, per operation, whether it fails. Only tests install one
/// (see [`crate::StoreOptions::with_fault_injector`]).
pub trait FaultInjector: Send + Sync + std::fmt::Debug {
    /// Called before an entry of `len` bytes is written at `offset` of segment `segment_id`.
    fn on_entry_write(&self, segment_id: u64, offset: u64, len: u64) -> Option<WriteFault>;
    /// Called before a directory (or high-water mark) fsync; an error poisons the store.
    fn on_dir_sync(&self) -> Option<io::Error>;
}
