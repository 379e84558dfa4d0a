//! Whether another process has a file open for writing, asked of the kernel.
//!
//! A read lease (`fcntl(F_SETLEASE, F_RDLCK)`) can only be placed on a file that no process
//! has open for writing (a writable shared mapping counts), so placing one and releasing it
//! at once answers "is anybody writing this file right now?" without blocking any writer
//! for longer than the two calls. The kernel grants leases to the file's owner or to a
//! process with `CAP_LEASE`, and only on file systems that support them; elsewhere the
//! answer is [`Writers::Unknown`] and the caller relies on its stability window alone.
//!
//! The two `fcntl` calls are in [`crate::sys`].

use std::fs::File;

use crate::sys;

/// What the kernel says about writers of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writers {
    /// No process has the file open for writing.
    None,
    /// At least one process has the file open for writing.
    Open,
    /// The kernel would not say (not the owner, no `CAP_LEASE`, or no lease support).
    Unknown,
}

/// Asks whether any process has `file` (opened read-only) open for writing.
pub fn probe(file: &File) -> Writers {
    match sys::set_read_lease(file) {
        Ok(()) => {
            sys::release_lease(file);
            Writers::None
        }
        Err(e) => match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EBUSY) => Writers::Open,
            _ => Writers::Unknown,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_writer_is_seen_and_its_close_too() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("a.bin");
        std::fs::write(&path, b"bytes").unwrap_or_else(|e| panic!("write: {e}"));
        let reader = File::open(&path).unwrap_or_else(|e| panic!("open: {e}"));
        let first = probe(&reader);
        if first == Writers::Unknown {
            // Leases refused here (file system or permissions): nothing more to check.
            assert!(std::env::var_os("CI").is_none(), "leases unavailable in CI");
            return;
        }
        assert_eq!(first, Writers::None);
        let writer = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open for write: {e}"));
        assert_eq!(probe(&reader), Writers::Open);
        drop(writer);
        assert_eq!(probe(&reader), Writers::None);
    }
}
