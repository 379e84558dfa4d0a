//! Boot: rebuilds the index from the segments directory.
//!
//! Each segment is restored from its sidecar when the sidecar's checksum holds and it
//! records the segment's current size; otherwise the stream is walked from the end of the
//! schema, every entry's crc32c is verified, the walk stops at a torn tail without touching
//! the data, and a fresh sidecar is written. Every segment found is sealed (read-only).

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::error::StoreError;
use crate::fault::FaultInjector;
use crate::ipc::{self, END_OF_STREAM, Parsed};
use crate::layout::{self, SegmentFile, TMP_SUFFIX};
use crate::map::SegmentMap;
use crate::segment::Segment;
use crate::sidecar::{self, SidecarEntry};

/// A segment restored at boot, with its entries.
pub(crate) struct Restored {
    pub seg: Arc<Segment>,
    pub entries: Vec<SidecarEntry>,
}

/// Everything boot found.
pub(crate) struct BootResult {
    /// Restored segments in id order.
    pub segments: Vec<Restored>,
    /// Highest segment id seen on disk (data or sidecar), if any.
    pub max_id: Option<u64>,
    /// One past the largest persisted last-use counter.
    pub clock: u64,
    /// A directory fsync failed while writing fresh sidecars.
    pub dir_sync_failed: Option<String>,
}

/// Result of walking one segment without a usable sidecar.
struct Walk {
    entries: Vec<SidecarEntry>,
    /// The walk reached the end of the file exactly, with no end-of-stream marker and no
    /// damaged entry: an end-of-stream marker may be appended.
    clean_unterminated: bool,
}

fn walk(path: &Path, size: u64, schema: &[u8]) -> std::io::Result<Walk> {
    let empty = Walk {
        entries: Vec::new(),
        clean_unterminated: false,
    };
    if size < schema.len() as u64 {
        return Ok(empty);
    }
    let file = std::fs::File::open(path)?;
    let map = SegmentMap::map(&file, size)?;
    let buf: &[u8] = map.as_ref().as_ref();
    if buf.get(..schema.len()) != Some(schema) {
        tracing::warn!(segment = %path.display(), "segment does not start with this format's schema");
        return Ok(empty);
    }
    let mut off = schema.len();
    let mut entries = Vec::new();
    let mut damaged = false;
    let mut terminated = false;
    while off < buf.len() {
        match ipc::parse_message(&buf[off..]) {
            Parsed::EndOfStream => {
                terminated = true;
                break;
            }
            Parsed::Truncated => {
                tracing::warn!(segment = %path.display(), offset = off, "torn tail left in place");
                damaged = true;
                break;
            }
            Parsed::Invalid(reason) => {
                tracing::warn!(segment = %path.display(), offset = off, %reason, "walk stops at unreadable bytes");
                damaged = true;
                break;
            }
            Parsed::Entry(e) => {
                let end = off + e.total_len as usize;
                let body = &buf[off + 8 + e.meta_len as usize..end];
                if crc32c::crc32c(body) == e.crc {
                    entries.push(SidecarEntry {
                        offset: off as u64,
                        length: e.total_len,
                        meta_len: e.meta_len,
                        crc: e.crc,
                        key: e.key.into(),
                    });
                } else {
                    tracing::warn!(segment = %path.display(), offset = off, "entry fails its checksum; skipped");
                    damaged = true;
                }
                off = end;
            }
        }
    }
    Ok(Walk {
        entries,
        clean_unterminated: !damaged && !terminated && off == buf.len(),
    })
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::io(format!("cannot {what} {}", path.display()), e)
}

/// Restores one segment; `None` when it holds no entry (it is then unlinked).
fn restore(
    dir: &Path,
    id: u64,
    schema: &[u8],
    mode: u32,
    last_use: u64,
    wrote_sidecar: &mut bool,
) -> Result<Option<Restored>, StoreError> {
    let path = layout::segment_path(dir, id);
    let idx_path = layout::sidecar_path(dir, id);
    let meta = std::fs::metadata(&path).map_err(|e| io_err("stat", &path, e))?;
    let mut size = meta.len();
    let sidecar_bytes = std::fs::read(&idx_path).ok();
    let from_sidecar = sidecar_bytes
        .as_deref()
        .and_then(|b| sidecar::decode(b, size).map(|e| (e, b.len() as u64)));
    let (entries, sidecar_len) = match from_sidecar {
        Some(found) => found,
        None => {
            let w = walk(&path, size, schema).map_err(|e| io_err("walk", &path, e))?;
            if w.entries.is_empty() {
                // Nothing in it was ever completely written: unlinking is safe.
                for p in [&path, &idx_path] {
                    if let Err(e) = std::fs::remove_file(p)
                        && e.kind() != std::io::ErrorKind::NotFound
                    {
                        return Err(io_err("remove empty segment file", p, e));
                    }
                }
                return Ok(None);
            }
            if w.clean_unterminated {
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|e| io_err("open", &path, e))?;
                match file
                    .write_all_at(&END_OF_STREAM, size)
                    .and_then(|()| file.sync_data())
                {
                    Ok(()) => size += END_OF_STREAM.len() as u64,
                    Err(e) => {
                        tracing::warn!(segment = %path.display(), error = %e, "cannot terminate stream")
                    }
                }
            }
            let bytes = sidecar::encode(size, &w.entries);
            let name = format!("seg_{id:016}.idx");
            let written = layout::write_atomic(&layout::segments_dir(dir), &name, &bytes, mode);
            let len = match written {
                Ok(()) => {
                    *wrote_sidecar = true;
                    bytes.len() as u64
                }
                Err(e) => {
                    tracing::warn!(segment = %path.display(), error = %e, "cannot write sidecar");
                    0
                }
            };
            (w.entries, len)
        }
    };
    if entries.is_empty() {
        let _ = std::fs::remove_file(&idx_path);
        std::fs::remove_file(&path).map_err(|e| io_err("remove empty segment", &path, e))?;
        return Ok(None);
    }
    let readable_end = entries
        .iter()
        .map(|e| e.offset + e.length)
        .max()
        .unwrap_or(schema.len() as u64);
    let seg = Segment::new(id, path, meta.ino(), last_use, readable_end);
    seg.disk_bytes.store(size + sidecar_len, Ordering::Relaxed);
    seg.sealed.store(true, Ordering::Release);
    *seg.keys.lock() = entries.iter().map(|e| e.key.clone()).collect();
    Ok(Some(Restored {
        seg: Arc::new(seg),
        entries,
    }))
}

/// Scans `dir/segments`, removing temporary files and orphan sidecars.
pub(crate) fn boot(
    dir: &Path,
    schema: &[u8],
    mode: u32,
    recency: &HashMap<u64, u64>,
    fault: Option<&dyn FaultInjector>,
) -> Result<BootResult, StoreError> {
    let segdir = layout::segments_dir(dir);
    layout::create_private_dir(&segdir, mode).map_err(|e| io_err("create", &segdir, e))?;
    let mut data_ids = Vec::new();
    let mut sidecar_ids = Vec::new();
    let listing = std::fs::read_dir(&segdir).map_err(|e| io_err("list", &segdir, e))?;
    for item in listing {
        let item = item.map_err(|e| io_err("list", &segdir, e))?;
        let name = item.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(TMP_SUFFIX) {
            let p = item.path();
            std::fs::remove_file(&p).map_err(|e| io_err("remove temporary file", &p, e))?;
            continue;
        }
        match layout::parse_segment_name(name) {
            Some(SegmentFile::Data(id)) => data_ids.push(id),
            Some(SegmentFile::Sidecar(id)) => sidecar_ids.push(id),
            None => {}
        }
    }
    data_ids.sort_unstable();
    let max_id = data_ids.iter().chain(&sidecar_ids).copied().max();
    for id in &sidecar_ids {
        if data_ids.binary_search(id).is_err() {
            let p = layout::sidecar_path(dir, *id);
            std::fs::remove_file(&p).map_err(|e| io_err("remove orphan sidecar", &p, e))?;
        }
    }
    let mut wrote_sidecar = false;
    let mut segments = Vec::with_capacity(data_ids.len());
    for id in data_ids {
        let last_use = recency.get(&id).copied().unwrap_or(0);
        if let Some(r) = restore(dir, id, schema, mode, last_use, &mut wrote_sidecar)? {
            segments.push(r);
        }
    }
    let dir_sync_failed = if wrote_sidecar {
        layout::sync_dir(&segdir, fault).err().map(|e| {
            format!(
                "fsync of {} after writing sidecars failed: {e}",
                segdir.display()
            )
        })
    } else {
        None
    };
    let clock = recency.values().copied().max().map_or(1, |m| m + 1);
    Ok(BootResult {
        segments,
        max_id,
        clock,
        dir_sync_failed,
    })
}
