//! Files of a cache directory: names, the `FORMAT` file, the segment-id high-water mark and
//! atomic small-file writes.
//!
//! ```text
//! DIR/FORMAT                          "tessera-segments <FORMAT_VERSION>\n"
//! DIR/lock                            flock + holder pid
//! DIR/next_segment_id                 persisted high-water mark (decimal)
//! DIR/recency                         per-segment last-use counters (see recency.rs)
//! DIR/segments/seg_{id:016}.arrow     Arrow IPC stream
//! DIR/segments/seg_{id:016}.idx       sidecar index, written on seal
//! ```

use std::fs::{DirBuilder, File, OpenOptions, Permissions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::StoreError;
use crate::fault::FaultInjector;

/// Version of the on-disk format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
const FORMAT_FILE: &str = "FORMAT";
const FORMAT_PREFIX: &str = "tessera-segments ";
const NEXT_ID_FILE: &str = "next_segment_id";
/// Suffix of temporary files (removed at boot).
pub(crate) const TMP_SUFFIX: &str = ".tmp";

/// Kinds of files in `DIR/segments`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SegmentFile {
    /// `seg_{id}.arrow`
    Data(u64),
    /// `seg_{id}.idx`
    Sidecar(u64),
}

/// Permission bits of the cache directory and its `segments/`: `0o700`, or `0o750` when
/// files are group-readable (`file_mode` has the group read bit, e.g. `0o640`). Never
/// world-searchable: other local users can list neither segment names nor their sizes.
pub(crate) fn dir_mode(file_mode: u32) -> u32 {
    if file_mode & 0o040 != 0 { 0o750 } else { 0o700 }
}

/// Creates `dir` and its missing parents with [`dir_mode`], and sets `dir` to exactly that
/// mode (a umask does not narrow it further): wider bits left by an older build go, and
/// turning group-readable files on or off takes effect (setgid and sticky bits are kept,
/// so a `chmod 2750` group setup survives). A directory the server cannot `chmod` (owned
/// by another user) is kept as it is, with a warning.
pub(crate) fn create_private_dir(dir: &Path, file_mode: u32) -> std::io::Result<()> {
    let mode = dir_mode(file_mode);
    DirBuilder::new().recursive(true).mode(mode).create(dir)?;
    let current = std::fs::metadata(dir)?.permissions().mode() & 0o7777;
    let tightened = (current & !0o777) | mode;
    if tightened != current
        && let Err(e) = std::fs::set_permissions(dir, Permissions::from_mode(tightened))
    {
        tracing::warn!(
            dir = %dir.display(),
            mode = format_args!("{current:o}"),
            error = %e,
            "cannot restrict the cache directory's permissions"
        );
    }
    Ok(())
}

pub(crate) fn segments_dir(dir: &Path) -> PathBuf {
    dir.join("segments")
}

pub(crate) fn segment_path(dir: &Path, id: u64) -> PathBuf {
    segments_dir(dir).join(format!("seg_{id:016}.arrow"))
}

pub(crate) fn sidecar_path(dir: &Path, id: u64) -> PathBuf {
    segments_dir(dir).join(format!("seg_{id:016}.idx"))
}

/// Recognises `seg_{16 digits}.arrow` and `.idx` names.
pub(crate) fn parse_segment_name(name: &str) -> Option<SegmentFile> {
    let rest = name.strip_prefix("seg_")?;
    let (digits, ext) = rest.split_once('.')?;
    if digits.len() != 16 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let id = digits.parse().ok()?;
    match ext {
        "arrow" => Some(SegmentFile::Data(id)),
        "idx" => Some(SegmentFile::Sidecar(id)),
        _ => None,
    }
}

/// Checks `DIR/FORMAT`, writing it when the directory is new. Never rewrites a directory of
/// another version.
pub(crate) fn check_or_init_format(dir: &Path, mode: u32) -> Result<(), StoreError> {
    let path = dir.join(FORMAT_FILE);
    let incompatible = |found: String| StoreError::IncompatibleFormat {
        dir: dir.to_path_buf(),
        found,
        expected: FORMAT_VERSION,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let found = text.trim();
            let version = found
                .strip_prefix(FORMAT_PREFIX)
                .and_then(|v| v.parse::<u32>().ok());
            match version {
                Some(FORMAT_VERSION) => Ok(()),
                _ => Err(incompatible(format!("{found:?}"))),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let has_segments = std::fs::read_dir(segments_dir(dir))
                .map(|mut entries| entries.next().is_some())
                .unwrap_or(false);
            if has_segments {
                return Err(incompatible(
                    "no FORMAT file next to existing segments".to_string(),
                ));
            }
            let text = format!("{FORMAT_PREFIX}{FORMAT_VERSION}\n");
            write_atomic(dir, FORMAT_FILE, text.as_bytes(), mode).map_err(|e| {
                StoreError::io(format!("cannot write {}", path.display()), e.into())
            })?;
            sync_dir(dir, None)
                .map_err(|e| StoreError::io(format!("cannot fsync {}", dir.display()), e))
        }
        Err(e) => Err(StoreError::io(format!("cannot read {}", path.display()), e)),
    }
}

/// A failed durable write: either the bytes could not be written (e.g. ENOSPC: the caller
/// may go on) or an fsync failed (durability is unknown: the store must stop writing).
#[derive(Debug)]
pub(crate) enum DurableError {
    /// Creating, writing or renaming failed.
    Write(std::io::Error),
    /// An fsync (of the file or of its directory) failed.
    Sync(std::io::Error),
}

impl std::fmt::Display for DurableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DurableError::Write(e) => write!(f, "write failed: {e}"),
            DurableError::Sync(e) => write!(f, "fsync failed: {e}"),
        }
    }
}

impl From<DurableError> for std::io::Error {
    fn from(e: DurableError) -> Self {
        match e {
            DurableError::Write(e) | DurableError::Sync(e) => e,
        }
    }
}

/// Writes `dir/name` atomically: a temporary file, fsync, rename. The caller syncs `dir`.
pub(crate) fn write_atomic(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    mode: u32,
) -> Result<(), DurableError> {
    let tmp = dir.join(format!("{name}{TMP_SUFFIX}"));
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(DurableError::Write)?;
    file.write_all(bytes).map_err(DurableError::Write)?;
    file.sync_all().map_err(DurableError::Sync)?;
    drop(file);
    std::fs::rename(&tmp, dir.join(name)).map_err(DurableError::Write)
}

/// fsyncs a directory (making renames and creations in it durable).
pub(crate) fn sync_dir(dir: &Path, fault: Option<&dyn FaultInjector>) -> std::io::Result<()> {
    if let Some(e) = fault.and_then(|f| f.on_dir_sync()) {
        return Err(e);
    }
    File::open(dir)?.sync_all()
}

/// Reads the persisted high-water mark (0 when absent).
pub(crate) fn read_next_id(dir: &Path) -> Result<u64, StoreError> {
    let path = dir.join(NEXT_ID_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map_err(|_| {
            StoreError::io(
                format!("cannot use {}", path.display()),
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{text:?} is not a segment id"),
                ),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(StoreError::io(format!("cannot read {}", path.display()), e)),
    }
}

/// Persists the high-water mark durably (file fsync, rename, directory fsync).
pub(crate) fn persist_next_id(
    dir: &Path,
    next: u64,
    mode: u32,
    fault: Option<&dyn FaultInjector>,
) -> Result<(), DurableError> {
    write_atomic(dir, NEXT_ID_FILE, format!("{next}\n").as_bytes(), mode)?;
    sync_dir(dir, fault).map_err(DurableError::Sync)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn segment_names_round_trip_and_sort_numerically() {
        let dir = Path::new("/x");
        let p = segment_path(dir, 42);
        let name = p.file_name().unwrap().to_str().unwrap();
        assert_eq!(name, "seg_0000000000000042.arrow");
        assert_eq!(parse_segment_name(name), Some(SegmentFile::Data(42)));
        assert_eq!(
            parse_segment_name("seg_0000000000000042.idx"),
            Some(SegmentFile::Sidecar(42))
        );
        assert_eq!(parse_segment_name("seg_42.arrow"), None);
        assert_eq!(parse_segment_name("seg_0000000000000042.idx.tmp"), None);
    }

    #[test]
    fn other_format_version_is_refused_and_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("FORMAT"), "tessera-segments 999\n").unwrap();
        let err = check_or_init_format(tmp.path(), 0o600).unwrap_err();
        assert!(
            matches!(err, StoreError::IncompatibleFormat { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("999"), "{err}");
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("FORMAT")).unwrap(),
            "tessera-segments 999\n"
        );
    }
}
