//! The opened TIFF file: its descriptor (held in the sources' bounded set of handles, opened
//! again on demand), its identity (device, inode, size, mtime: the content version), and
//! the checks that the path still names that version, as for a `.npy` file.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::error::TiffError;
use crate::content_version::FileVersion;
use crate::source::npy::handles::Slot;
use crate::source::npy::{
    NpyError, Placement, Writers, open_placed, probe_writers, touched_within,
};

/// How often [`TiffFile::settle`] waits out a stability window before giving up.
const SETTLE_ATTEMPTS: usize = 3;

/// An opened TIFF file, shared by the image and its levels.
pub struct TiffFile {
    slot: Arc<Slot>,
    place: Option<Placement>,
    path: PathBuf,
    identity: FileVersion,
}

impl std::fmt::Debug for TiffFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TiffFile")
            .field("path", &self.path)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

fn opened(path: &Path, err: NpyError) -> TiffError {
    match err {
        NpyError::Outside { reason, .. } => TiffError::Outside {
            path: path.to_path_buf(),
            reason,
        },
        other => TiffError::Open {
            why: other.without_content(),
        },
    }
}

impl TiffFile {
    /// Opens `path` (a regular file, judged by `place` before a byte is read) and records
    /// its identity; the open descriptor for the first reads.
    pub fn open(path: &Path, place: Option<Placement>) -> Result<(TiffFile, Arc<File>), TiffError> {
        let file = open_placed(path, place.as_ref()).map_err(|e| opened(path, e))?;
        let meta = file.metadata().map_err(|source| TiffError::Io {
            path: path.to_path_buf(),
            what: "stat",
            source,
        })?;
        let slot = Arc::new(Slot::default());
        let file = slot.hold(file);
        Ok((
            TiffFile {
                slot,
                place,
                path: path.to_path_buf(),
                identity: FileVersion::of(&meta),
            },
            file,
        ))
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Device, inode, size and mtime at open.
    pub fn identity(&self) -> FileVersion {
        self.identity
    }

    fn changed(&self, what: &str) -> TiffError {
        TiffError::Changed {
            path: self.path.clone(),
            what: what.to_string(),
        }
    }

    /// The open descriptor, opened again if it was closed to stay under the limit (refused
    /// as changed unless the path still names the file opened first).
    pub fn file(&self) -> Result<Arc<File>, TiffError> {
        if let Some(file) = self.slot.get() {
            return Ok(file);
        }
        let file =
            open_placed(&self.path, self.place.as_ref()).map_err(|e| opened(&self.path, e))?;
        let meta = file.metadata().map_err(|source| TiffError::Io {
            path: self.path.clone(),
            what: "stat",
            source,
        })?;
        if (meta.dev(), meta.ino()) != (self.identity.dev, self.identity.ino) {
            return Err(self.changed("the path now names a different file"));
        }
        Ok(self.slot.hold(file))
    }

    /// Refuses with [`TiffError::Changed`] unless the path names the opened file with the
    /// size and mtime it had.
    pub fn check_unchanged(&self) -> Result<(), TiffError> {
        let Ok(meta) = std::fs::metadata(&self.path) else {
            return Err(self.changed("the path no longer names a file"));
        };
        let now = FileVersion::of(&meta);
        if (now.dev, now.ino) != (self.identity.dev, self.identity.ino) {
            return Err(self.changed("the path now names a different file"));
        }
        if now.size != self.identity.size {
            return Err(self.changed(&format!(
                "its size went from {} to {} bytes",
                self.identity.size, now.size
            )));
        }
        if now.mtime_ns != self.identity.mtime_ns {
            return Err(self.changed("it was modified"));
        }
        Ok(())
    }

    /// Refuses with [`TiffError::Busy`] while another process has the file open for writing
    /// (when the kernel says).
    pub fn check_no_writer(&self) -> Result<(), TiffError> {
        match probe_writers(&*self.file()?) {
            Writers::Open => Err(TiffError::Busy {
                path: self.path.clone(),
                what: "another process has it open for writing".into(),
            }),
            Writers::None | Writers::Unknown => Ok(()),
        }
    }

    /// Waits until the file is untouched for `window` and has no writer, still the version
    /// opened; refuses as changed or busy otherwise.
    pub fn settle(&self, window: Duration) -> Result<(), TiffError> {
        for _ in 0..SETTLE_ATTEMPTS {
            self.check_unchanged()?;
            self.check_no_writer()?;
            let meta = std::fs::metadata(&self.path).map_err(|source| TiffError::Io {
                path: self.path.clone(),
                what: "stat",
                source,
            })?;
            match touched_within(&meta, window) {
                Some(wait) => std::thread::sleep(wait),
                None => return Ok(()),
            }
        }
        Err(TiffError::Busy {
            path: self.path.clone(),
            what: format!(
                "it kept changing within the {} ms stability window",
                window.as_millis()
            ),
        })
    }
}
