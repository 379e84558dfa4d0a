//! Read-only memory maps of segment files: the crate's only `unsafe`.

use std::fs::File;
use std::sync::Arc;

use memmap2::{Mmap, MmapOptions};

/// A shared read-only mapping of a segment file prefix, usable as a [`bytes::Bytes`] owner.
#[derive(Debug)]
pub(crate) struct SegmentMap(Mmap);

impl SegmentMap {
    /// Maps the first `len` bytes of `file` (`len` must not exceed the file's size).
    pub(crate) fn map(file: &File, len: u64) -> std::io::Result<Arc<SegmentMap>> {
        let len = usize::try_from(len).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "segment too large to map")
        })?;
        // SAFETY: the mapping covers bytes of a segment file that this crate never truncates,
        // shrinks or rewrites: segments are append-only, a mapped prefix only ever holds
        // complete entries or the schema (written before the map is made), eviction only
        // unlinks (the inode outlives the mapping), and the only positional overwrite (the
        // end-of-stream marker after a torn write) lands past every byte handed out as a
        // slice of this map. Other processes are kept out of the directory by the lock file.
        let map = unsafe { MmapOptions::new().len(len).map(file)? };
        Ok(Arc::new(SegmentMap(map)))
    }

    /// Length of the mapping.
    pub(crate) fn len(&self) -> u64 {
        self.0.len() as u64
    }
}

impl AsRef<[u8]> for SegmentMap {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Runs `f` over bytes `[offset, offset + len)` of a segment file through a transient
/// read-only mapping (prefaulted), e.g. to checksum an entry just written without copying it.
pub(crate) fn with_range<T>(
    file: &File,
    offset: u64,
    len: u64,
    f: impl FnOnce(&[u8]) -> T,
) -> std::io::Result<T> {
    if len == 0 {
        return Ok(f(&[]));
    }
    let len = usize::try_from(len).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "range too large to map")
    })?;
    // SAFETY: `file` is a segment this crate writes: it is never truncated or shrunk (see
    // `SegmentMap::map`), the range was written by the caller, who holds the segment's shard
    // lock for the whole call, so nothing else writes or seals it meanwhile, and the mapping
    // is dropped before this function returns. The source files entries are copied from are
    // never mapped.
    let map = unsafe {
        MmapOptions::new()
            .offset(offset)
            .len(len)
            .populate()
            .map(file)?
    };
    Ok(f(&map))
}

/// Wrapper so an `Arc<SegmentMap>` can own a [`bytes::Bytes`].
#[derive(Debug, Clone)]
pub(crate) struct SharedMap(pub(crate) Arc<SegmentMap>);

impl AsRef<[u8]> for SharedMap {
    fn as_ref(&self) -> &[u8] {
        self.0.as_ref().as_ref()
    }
}
