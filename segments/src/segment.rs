//! One segment file: its shared state, the writer side of an open segment, and sealing.

use std::fs::{File, OpenOptions};
use std::io::IoSlice;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::fault::FaultInjector;
use crate::ipc::END_OF_STREAM;
use crate::layout;
use crate::map::SegmentMap;
use crate::sidecar::{self, SidecarEntry};

/// Linux's `IOV_MAX`: the most slices one `pwritev` accepts.
const IOV_MAX: usize = 1024;

/// Shared state of one segment file (open or sealed).
#[derive(Debug)]
pub(crate) struct Segment {
    /// Segment id (its file name).
    pub id: u64,
    /// Absolute path of the `.arrow` file.
    pub path: PathBuf,
    /// The file's inode (`generation_id`).
    pub inode: u64,
    /// Logical time of the last append, locate or read.
    pub last_use: AtomicU64,
    /// Retired: no shard writes it any more; it is sealed or waiting to be.
    pub retired: AtomicBool,
    /// Sealed: read-only, evictable.
    pub sealed: AtomicBool,
    /// Bytes on disk: the segment file plus its sidecar.
    pub disk_bytes: AtomicU64,
    /// End of the last complete entry: how far the file may be mapped.
    pub readable_end: AtomicU64,
    /// Keys stored in this segment (filled when sealed, used by eviction).
    pub keys: Mutex<Vec<Box<[u8]>>>,
    map: RwLock<Option<Arc<SegmentMap>>>,
}

impl Segment {
    pub(crate) fn new(
        id: u64,
        path: PathBuf,
        inode: u64,
        last_use: u64,
        readable_end: u64,
    ) -> Self {
        Segment {
            id,
            path,
            inode,
            last_use: AtomicU64::new(last_use),
            retired: AtomicBool::new(false),
            sealed: AtomicBool::new(false),
            disk_bytes: AtomicU64::new(0),
            readable_end: AtomicU64::new(readable_end),
            keys: Mutex::new(Vec::new()),
            map: RwLock::new(None),
        }
    }

    /// A mapping covering at least `[0, end)`, remapping when the segment has grown.
    pub(crate) fn map_covering(&self, end: u64) -> std::io::Result<Arc<SegmentMap>> {
        if let Some(map) = self.map.read().as_ref().filter(|m| m.len() >= end) {
            return Ok(Arc::clone(map));
        }
        let mut slot = self.map.write();
        if let Some(map) = slot.as_ref().filter(|m| m.len() >= end) {
            return Ok(Arc::clone(map));
        }
        let limit = self.readable_end.load(Ordering::Acquire);
        if limit < end {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("range end {end} is past the last complete entry ({limit})"),
            ));
        }
        let file = File::open(&self.path)?;
        let map = SegmentMap::map(&file, limit)?;
        *slot = Some(Arc::clone(&map));
        Ok(map)
    }

    /// Drops the cached mapping (after eviction; clients' slices keep theirs alive).
    pub(crate) fn forget_map(&self) {
        *self.map.write() = None;
    }
}

/// Writer side of an open segment, owned by one shard.
#[derive(Debug)]
pub(crate) struct Active {
    pub seg: Arc<Segment>,
    pub file: File,
    /// End of the last good entry (where the next entry goes).
    pub end: u64,
    pub entries: Vec<SidecarEntry>,
}

/// Creates a brand-new segment file (`O_EXCL`) and writes the schema message at offset 0.
pub(crate) fn create(
    path: &Path,
    id: u64,
    schema: &[u8],
    mode: u32,
    last_use: u64,
) -> std::io::Result<Active> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    let inode = match file.write_all_at(schema, 0).and_then(|()| file.metadata()) {
        Ok(meta) => meta.ino(),
        Err(e) => {
            // Nothing in it was ever located: removing the fresh file is safe.
            drop(file);
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
    };
    let end = schema.len() as u64;
    let seg = Segment::new(id, path.to_path_buf(), inode, last_use, end);
    seg.disk_bytes.store(end, Ordering::Relaxed);
    Ok(Active {
        seg: Arc::new(seg),
        file,
        end,
        entries: Vec::new(),
    })
}

/// A failed entry write: how many bytes reached the file, and why it failed.
#[derive(Debug)]
pub(crate) struct WriteFailure {
    pub written: u64,
    pub error: std::io::Error,
}

/// Writes `bufs` at `offset` with vectored positional writes, looping on short writes.
pub(crate) fn write_vectored_at(
    file: &File,
    bufs: &mut [IoSlice<'_>],
    offset: u64,
    fault: Option<(&dyn FaultInjector, u64)>,
) -> Result<(), WriteFailure> {
    let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
    if let Some(f) = fault.and_then(|(f, id)| f.on_entry_write(id, offset, total)) {
        let torn: Vec<u8> = bufs
            .iter()
            .flat_map(|b| b.iter().copied())
            .take(f.written_before_error)
            .collect();
        let written = match file.write_all_at(&torn, offset) {
            Ok(()) => torn.len() as u64,
            Err(_) => 0,
        };
        return Err(WriteFailure {
            written,
            error: f.error,
        });
    }
    let mut slices = bufs;
    let mut written = 0u64;
    while !slices.is_empty() {
        let batch = &slices[..slices.len().min(IOV_MAX)];
        match rustix::io::pwritev(file, batch, offset + written) {
            Ok(0) => {
                return Err(WriteFailure {
                    written,
                    error: std::io::ErrorKind::WriteZero.into(),
                });
            }
            Ok(n) => {
                written += n as u64;
                IoSlice::advance_slices(&mut slices, n);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(WriteFailure {
                    written,
                    error: e.into(),
                });
            }
        }
    }
    Ok(())
}

/// Outcome of sealing.
#[derive(Debug, Default)]
pub(crate) struct Sealed {
    /// Bytes the segment now takes on disk (file plus sidecar).
    pub disk_bytes: u64,
    /// A sidecar or directory fsync failed: the store must be poisoned.
    pub dir_sync_failed: Option<String>,
}

/// Seals a segment at its last good entry: end-of-stream marker at `active.end` (over torn
/// bytes, which nobody ever located), fsync, then the sidecar (temp file, fsync, rename,
/// directory fsync). Best effort: a failed step is logged and the segment is sealed anyway
/// (a later boot walks it).
pub(crate) fn seal(
    active: Active,
    segments_dir: &Path,
    mode: u32,
    fault: Option<&dyn FaultInjector>,
) -> Sealed {
    let Active {
        seg,
        file,
        end,
        entries,
    } = active;
    let mut out = Sealed::default();
    let mut durable = true;
    if let Err(e) = file.write_all_at(&END_OF_STREAM, end) {
        tracing::warn!(segment = %seg.path.display(), error = %e, "cannot write end-of-stream");
    }
    if let Err(e) = file.sync_data() {
        tracing::warn!(segment = %seg.path.display(), error = %e, "cannot fsync segment; no sidecar");
        durable = false;
    }
    let size = match file.metadata() {
        Ok(m) => m.len(),
        Err(e) => {
            tracing::warn!(segment = %seg.path.display(), error = %e, "cannot stat segment");
            durable = false;
            end
        }
    };
    let mut sidecar_len = 0;
    if durable {
        let bytes = sidecar::encode(size, &entries);
        let name = format!("seg_{:016}.idx", seg.id);
        match layout::write_atomic(segments_dir, &name, &bytes, mode) {
            Ok(()) => {
                sidecar_len = bytes.len() as u64;
                if let Err(e) = layout::sync_dir(segments_dir, fault) {
                    out.dir_sync_failed = Some(format!(
                        "fsync of {} after writing sidecar {name} failed: {e}",
                        segments_dir.display()
                    ));
                }
            }
            Err(layout::DurableError::Sync(e)) => {
                out.dir_sync_failed = Some(format!("fsync of sidecar {name} failed: {e}"));
            }
            Err(e) => {
                tracing::warn!(segment = %seg.path.display(), error = %e, "cannot write sidecar")
            }
        }
    }
    *seg.keys.lock() = entries.into_iter().map(|e| e.key).collect();
    out.disk_bytes = size + sidecar_len;
    seg.disk_bytes.store(out.disk_bytes, Ordering::Relaxed);
    seg.sealed.store(true, Ordering::Release);
    out
}
