//! The only `unsafe` in this crate: mapping a server segment file read-only, and
//! advising the kernel to back a large output buffer with huge pages.
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

/// Size of an x86-64 / aarch64 (4 KiB base page) transparent huge page.
#[cfg(target_os = "linux")]
const HUGE_PAGE: usize = 2 << 20;

/// Asks the kernel to back the whole 2 MiB pages inside `buf` with transparent huge pages,
/// as numpy does for large arrays: filling a fresh 256 MiB output then takes 128 page
/// faults instead of 65,536 (on machines whose THP mode is `madvise`, the common default).
/// A hint only: it changes no byte, errors are ignored, and buffers under 4 MiB are left
/// alone. Call it before the buffer is first written, while its pages are untouched.
pub(crate) fn advise_huge_pages(buf: &mut [u8]) {
    #[cfg(target_os = "linux")]
    {
        if buf.len() < 2 * HUGE_PAGE {
            return;
        }
        let start = buf.as_mut_ptr() as usize;
        let (Some(first), Some(end)) = (
            start.checked_next_multiple_of(HUGE_PAGE),
            start
                .checked_add(buf.len())
                .map(|e| e / HUGE_PAGE * HUGE_PAGE),
        ) else {
            return;
        };
        if end <= first {
            return;
        }
        // SAFETY: `[first, end)` lies inside `buf`, which this function borrows mutably,
        // and is page aligned as madvise(2) requires. MADV_HUGEPAGE only changes how the
        // kernel backs the range (it never changes or discards contents, unlike
        // MADV_DONTNEED), so no Rust reference to those bytes can observe it.
        let _ =
            unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}
