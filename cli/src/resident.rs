//! Keeps the daemon's own machine code in memory (`resident_code`, decision 0040).
//!
//! A long-running server runs most of its code paths rarely: the first `get_descriptor` of a
//! session, a scaled read, a catalog query. When the page cache is dropped, or when reads of
//! terabyte volumes push it out, each of those paths is read back from the executable file
//! on its first call, page by page (27 major faults, 57–67 ms for one descriptor in
//! benches/planes.py). Mapping every page of the executable's read-only segments once at
//! start makes them part of the process: the kernel does not drop pages a process maps, and
//! it keeps mapped executable pages ahead of plain file pages under memory pressure. The
//! cost is the binary's size in file-backed (shared, reclaimable) resident memory.
//!
//! This is the crate's one module with `unsafe`: `madvise` on the process's own mappings,
//! and the one-byte reads that stand in for it on kernels older than Linux 5.14.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why the binary's code could not be kept resident (the server serves regardless).
#[derive(Debug, thiserror::Error)]
pub enum ResidentError {
    /// `/proc/self/exe` or `/proc/self/maps` could not be read.
    #[error("cannot read {path}")]
    Proc {
        /// The file that could not be read.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The kernel refused to map a range of the executable.
    #[error("madvise(MADV_POPULATE_READ) of {len} bytes at {start:#x} failed")]
    Populate {
        /// First address of the range.
        start: usize,
        /// Its length in bytes.
        len: usize,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
}

/// What [`keep_code_resident`] mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resident {
    /// Bytes of the executable's read-only segments now mapped.
    pub bytes: usize,
    /// How long mapping them took.
    pub took: Duration,
}

/// One read-only mapping of the executable file: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    start: usize,
    end: usize,
}

/// Maps every page of this executable's read-only segments (code and constants) into the
/// process, so none of them is read from disk again while the process lives.
pub fn keep_code_resident() -> Result<Resident, ResidentError> {
    let started = Instant::now();
    let exe_link = Path::new("/proc/self/exe");
    let exe = std::fs::read_link(exe_link).map_err(|source| ResidentError::Proc {
        path: exe_link.to_path_buf(),
        source,
    })?;
    let maps_path = Path::new("/proc/self/maps");
    let maps = std::fs::read_to_string(maps_path).map_err(|source| ResidentError::Proc {
        path: maps_path.to_path_buf(),
        source,
    })?;
    let mut bytes = 0;
    for range in read_only_ranges(&maps, &exe) {
        populate(range)?;
        bytes += range.end - range.start;
    }
    Ok(Resident {
        bytes,
        took: started.elapsed(),
    })
}

/// The mappings of `maps` (the text of `/proc/self/maps`) that map file `exe` readable and
/// not writable.
fn read_only_ranges(maps: &str, exe: &Path) -> Vec<Range> {
    let exe = exe.as_os_str().to_string_lossy();
    maps.lines()
        .filter_map(|line| {
            // address perms offset dev inode pathname
            let mut fields = line.splitn(6, ' ');
            let (start, end) = fields.next()?.split_once('-')?;
            let perms = fields.next()?;
            let path = fields.nth(3)?.trim_start();
            let readable_only = perms.starts_with('r') && perms.as_bytes().get(1) == Some(&b'-');
            if !readable_only || path != exe {
                return None;
            }
            let start = usize::from_str_radix(start, 16).ok()?;
            let end = usize::from_str_radix(end, 16).ok()?;
            (end > start).then_some(Range { start, end })
        })
        .collect()
}

/// Maps the pages of `range`, one of this process's own read-only file mappings.
fn populate(range: Range) -> Result<(), ResidentError> {
    let len = range.end - range.start;
    // SAFETY: `range` is a whole mapping of this process read from /proc/self/maps, so the
    // address range is mapped; MADV_POPULATE_READ only faults its pages in, as reading them
    // would, and changes neither their contents nor the mapping.
    let rc = unsafe {
        libc::madvise(
            range.start as *mut libc::c_void,
            len,
            libc::MADV_POPULATE_READ,
        )
    };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EINVAL) {
        return Err(ResidentError::Populate {
            start: range.start,
            len,
            source: err,
        });
    }
    // Kernels before 5.14 do not know MADV_POPULATE_READ: read one byte of every page.
    let page = page_size();
    let mut address = range.start;
    while address < range.end {
        // SAFETY: `address` lies inside a readable mapping of this process (see above) that
        // stays mapped while the executable runs; a volatile one-byte read faults the page in.
        unsafe { std::ptr::read_volatile(address as *const u8) };
        address += page;
    }
    Ok(())
}

/// The size of a memory page.
fn page_size() -> usize {
    // SAFETY: sysconf only reads a system constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096).max(1)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    #[test]
    fn only_the_executables_read_only_mappings_are_kept() {
        let maps = "\
55d0a0000000-55d0a1000000 r--p 00000000 fd:01 123 /usr/bin/tessera
55d0a1000000-55d0a3000000 r-xp 01000000 fd:01 123 /usr/bin/tessera
55d0a3000000-55d0a3100000 rw-p 03000000 fd:01 123 /usr/bin/tessera
7f0000000000-7f0000100000 r-xp 00000000 fd:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000200000-7f0000300000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";
        let ranges = read_only_ranges(maps, Path::new("/usr/bin/tessera"));
        assert_eq!(
            ranges,
            vec![
                Range {
                    start: 0x55d0a0000000,
                    end: 0x55d0a1000000
                },
                Range {
                    start: 0x55d0a1000000,
                    end: 0x55d0a3000000
                },
            ]
        );
    }

    #[test]
    fn a_path_with_spaces_is_matched_whole() {
        let maps = "1000-3000 r-xp 00000000 fd:01 9 /opt/my tools/tessera\n\
                    3000-4000 r-xp 00000000 fd:01 9 /opt/my\n";
        let ranges = read_only_ranges(maps, Path::new("/opt/my tools/tessera"));
        assert_eq!(
            ranges,
            vec![Range {
                start: 0x1000,
                end: 0x3000
            }]
        );
    }

    #[test]
    fn this_test_binary_keeps_its_own_code_resident() {
        let resident = keep_code_resident().expect("the test binary's code can be mapped");
        assert!(
            resident.bytes > 1 << 20,
            "a test binary has more than 1 MiB of code and constants, got {}",
            resident.bytes
        );
    }
}
