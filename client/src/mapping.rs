//! The only `unsafe` in this crate: mapping a server segment file read-only.
//!
//! Everything built on the mapping (Arrow buffers, chunk views) is safe code
//! that borrows the bytes through `bytes::Bytes::from_owner`, which keeps the
//! mapping alive for as long as any view of it exists.

use std::fs::File;

use memmap2::Mmap;

/// Maps all of `file` read-only.
///
/// The caller must have opened a Tessera (or biopb) segment file: an
/// append-only Arrow IPC stream.
pub(crate) fn map_segment(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: a mapping is only sound while nobody truncates or rewrites the
    // mapped range. The chunk_locate contract (biopb-protocol.md §2.6) makes
    // the server treat segment files as append-only: it never truncates,
    // shrinks or rewrites one, and evicts by unlinking, which keeps the inode
    // (and so this mapping) valid until the last unmap. The mapping is
    // read-only (PROT_READ), so this process never writes through it, and its
    // length is the file size at open time, so appends past it are not seen.
    unsafe { Mmap::map(file) }
}
