//! Copying an entry's data from a byte range of another file into a segment, inside the
//! kernel: `copy_file_range(2)` moves page-cache pages to page-cache pages (one copy, or
//! none where the filesystem shares extents), with a positional read/write loop through a
//! small reused buffer where the kernel cannot (another filesystem type, old kernels).
//!
//! The source is only ever read with system calls, never mapped: a source that shrinks
//! under the copy ends it early ([`CopyFailure::SourceShort`]), never with `SIGBUS`.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use rustix::io::Errno;

use crate::ipc::EntryBody;
use crate::types::FileRange;

/// Largest request handed to one `copy_file_range` call.
const MAX_CALL: u64 = 1 << 30;
/// Size of the per-thread buffer of the fallback loop.
const FALLBACK_BUFFER: usize = 1 << 20;

thread_local! {
    static FALLBACK: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Why a copy stopped.
#[derive(Debug)]
pub(crate) enum CopyFailure {
    /// The source ended after `copied` bytes of the range.
    SourceShort {
        /// Bytes of the range copied before the end of the source.
        copied: u64,
    },
    /// A read or write failed after `copied` bytes of the range.
    Io {
        /// Bytes of the range copied before the failure.
        copied: u64,
        /// The failure.
        error: io::Error,
    },
}

/// Writes `body`'s prefix, the source range and the suffix at `body_at` of `dst`.
pub(crate) fn write_body(
    dst: &File,
    body: &EntryBody,
    body_at: u64,
    src: FileRange<'_>,
) -> Result<(), CopyFailure> {
    let data_at = body_at + body.prefix().len() as u64;
    dst.write_all_at(body.prefix(), body_at)
        .map_err(|error| CopyFailure::Io { copied: 0, error })?;
    copy_range(src.file, src.offset, dst, data_at, src.len)?;
    dst.write_all_at(body.suffix(), data_at + src.len)
        .map_err(|error| CopyFailure::Io {
            copied: src.len,
            error,
        })
}

/// Copies `len` bytes at `src_off` of `src` to `dst_off` of `dst`.
pub(crate) fn copy_range(
    src: &File,
    src_off: u64,
    dst: &File,
    dst_off: u64,
    len: u64,
) -> Result<(), CopyFailure> {
    let mut copied = 0u64;
    while copied < len {
        let mut from = src_off + copied;
        let mut to = dst_off + copied;
        let want = (len - copied).min(MAX_CALL) as usize;
        match rustix::fs::copy_file_range(src, Some(&mut from), dst, Some(&mut to), want) {
            Ok(0) => return Err(CopyFailure::SourceShort { copied }),
            Ok(n) => copied += n as u64,
            Err(Errno::INTR) => {}
            Err(Errno::XDEV | Errno::NOSYS | Errno::INVAL | Errno::OPNOTSUPP) => {
                return fallback(src, src_off, dst, dst_off, len, copied);
            }
            Err(e) => {
                return Err(CopyFailure::Io {
                    copied,
                    error: e.into(),
                });
            }
        }
    }
    Ok(())
}

/// The same copy with positional reads and writes through a reused per-thread buffer,
/// resuming after the first `copied` bytes.
fn fallback(
    src: &File,
    src_off: u64,
    dst: &File,
    dst_off: u64,
    len: u64,
    mut copied: u64,
) -> Result<(), CopyFailure> {
    FALLBACK.with(|cell| {
        let mut buf = cell.borrow_mut();
        if buf.len() < FALLBACK_BUFFER {
            buf.resize(FALLBACK_BUFFER, 0);
        }
        while copied < len {
            let want = (len - copied).min(FALLBACK_BUFFER as u64) as usize;
            let got = match src.read_at(&mut buf[..want], src_off + copied) {
                Ok(0) => return Err(CopyFailure::SourceShort { copied }),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(CopyFailure::Io { copied, error }),
            };
            dst.write_all_at(&buf[..got], dst_off + copied)
                .map_err(|error| CopyFailure::Io { copied, error })?;
            copied += got as u64;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn file_with(bytes: &[u8]) -> File {
        let f = tempfile::tempfile().unwrap();
        f.write_all_at(bytes, 0).unwrap();
        f
    }

    #[test]
    fn fallback_copies_the_range_and_detects_a_short_source() {
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let src = file_with(&data);
        let dst = tempfile::tempfile().unwrap();
        fallback(&src, 5, &dst, 16, 2_500_000, 0).unwrap();
        let mut back = vec![0u8; 2_500_000];
        dst.read_exact_at(&mut back, 16).unwrap();
        assert_eq!(back, data[5..2_500_005]);
        match fallback(&src, 2_000_000, &dst, 0, 1_500_000, 0) {
            Err(CopyFailure::SourceShort { copied }) => assert_eq!(copied, 1_000_000),
            other => panic!("expected a short source, got {other:?}"),
        }
    }

    #[test]
    fn kernel_copy_stops_at_the_end_of_the_source() {
        let src = file_with(&[7u8; 4096]);
        let dst = tempfile::tempfile().unwrap();
        match copy_range(&src, 1000, &dst, 0, 5000) {
            Err(CopyFailure::SourceShort { copied }) => assert_eq!(copied, 3096),
            other => panic!("expected a short source, got {other:?}"),
        }
    }
}
