//! An opened `.npy` file read with positional reads.
//!
//! Positional reads (`pread`), not a memory map: a file shrunk under the reader gives an I/O
//! error, never `SIGBUS`.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::NpyError;
use super::handles::Slot;
use super::header::Header;
use super::limits::Limits;
use super::region::{Runs, check_output, check_region, fortran_strides, gather, stored_runs};
use super::stream::{allocate, read_header, read_stream};
use super::writers::{self, Writers};
use crate::content_version::FileVersion;

/// Bytes read first when opening a file; numpy headers are 64 or 128 bytes.
const FIRST_READ: usize = 4096;

/// Judges an opened descriptor before a byte of it is read (where the file really is);
/// the refusal, without anything read from the file.
pub type Placement = Arc<dyn Fn(&File) -> Result<(), String> + Send + Sync>;

/// A checked `.npy` file, open for region reads.
///
/// Opening reads only the header; the payload is read on demand with positional reads, which
/// may run concurrently from several threads. The descriptor is not pinned: it is held in
/// [`super::handles`] while used and opened again on demand, checked to be the same file
/// (device and inode) and judged by the placement again.
pub struct NpyFile {
    slot: Arc<Slot>,
    place: Option<Placement>,
    path: PathBuf,
    header: Header,
    identity: FileVersion,
    /// The preamble and header bytes as read at open, compared again before a decode.
    header_bytes: Vec<u8>,
}

/// How often [`NpyFile::settle`] waits out a stability window before giving up.
const SETTLE_ATTEMPTS: usize = 3;

impl NpyFile {
    /// Opens `path`, checks its header, that it is a regular file and that the payload is all
    /// there (a truncated file is refused here), and records its identity.
    pub fn open(path: &Path, limits: &Limits) -> Result<NpyFile, NpyError> {
        Self::open_within(path, limits, None)
    }

    /// [`NpyFile::open`], with `place` judging the opened descriptor (where it really is)
    /// before a byte is read, now and at every later open; its refusal is
    /// [`NpyError::Outside`].
    pub fn open_within(
        path: &Path,
        limits: &Limits,
        place: Option<Placement>,
    ) -> Result<NpyFile, NpyError> {
        let file = open_placed(path, place.as_ref())?;
        let meta = file
            .metadata()
            .map_err(|source| io_error(path, "stat", source))?;
        let identity = FileVersion::of(&meta);
        if identity.size == 0 {
            return Err(NpyError::EmptyFile {
                file: Some(path.to_path_buf()),
            });
        }
        let header = read_header(limits, Some(path), FIRST_READ, |buf, want| {
            fill_at(&file, buf, want)
        })?;
        let end = header.data_offset + header.data_len;
        if identity.size < end {
            return Err(NpyError::TruncatedPayload {
                file: Some(path.to_path_buf()),
                present: identity.size.saturating_sub(header.data_offset),
                declared: header.data_len,
            });
        }
        let header_bytes = read_prefix(&file, path, header.data_offset)?;
        let slot = Arc::new(Slot::default());
        slot.hold(file);
        Ok(NpyFile {
            slot,
            place,
            path: path.to_path_buf(),
            header,
            identity,
            header_bytes,
        })
    }

    /// Reads the whole array at `path` into an owned buffer, in C order: the payload goes
    /// straight into the returned buffer (one copy); a Fortran-order payload is then gathered
    /// into C order (one more buffer).
    pub fn read_all(path: &Path, limits: &Limits) -> Result<(Header, Vec<u8>), NpyError> {
        let file = open_regular(path)?;
        read_stream(&file, limits, Some(path))
    }

    /// The checked header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The open file, for positional reads and in-kernel copies (`copy_file_range`) of payload
    /// ranges. Never map it: a file shrunk under a mapping kills the process with `SIGBUS`.
    ///
    /// Opened again when its descriptor was closed to stay under the limit: refused as
    /// changed unless the path still names the file opened first, and judged by the
    /// placement again.
    pub fn file(&self) -> Result<Arc<File>, NpyError> {
        if let Some(file) = self.slot.get() {
            return Ok(file);
        }
        let file = open_placed(&self.path, self.place.as_ref())?;
        let meta = file
            .metadata()
            .map_err(|source| io_error(&self.path, "stat", source))?;
        if (meta.dev(), meta.ino()) != (self.identity.dev, self.identity.ino) {
            return Err(NpyError::SourceChanged {
                file: self.path.clone(),
                what: "the path now names a different file (replaced)".to_owned(),
            });
        }
        Ok(self.slot.hold(file))
    }

    /// Device, inode, size and mtime at open.
    pub fn identity(&self) -> FileVersion {
        self.identity
    }

    /// Checks that the path still names the opened file and that the file's size and mtime
    /// are those at open; anything else is [`NpyError::SourceChanged`] saying what changed.
    ///
    /// Limits: an in-place rewrite that keeps the size and lands within the file system's
    /// timestamp granularity of the previous write is not visible here.
    pub fn check_unchanged(&self) -> Result<(), NpyError> {
        let changed = |what: String| NpyError::SourceChanged {
            file: self.path.clone(),
            what,
        };
        let at_path = match std::fs::metadata(&self.path) {
            Ok(meta) => meta,
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                return Err(changed(
                    "the path no longer exists (deleted or renamed)".to_owned(),
                ));
            }
            Err(source) => return Err(io_error(&self.path, "stat the path", source)),
        };
        if (at_path.dev(), at_path.ino()) != (self.identity.dev, self.identity.ino) {
            return Err(changed(
                "the path now names a different file (replaced)".to_owned(),
            ));
        }
        // The path names the opened file (same device and inode), so its stat is the file's.
        let now = FileVersion::of(&at_path);
        if now.size != self.identity.size {
            return Err(changed(format!(
                "its size went from {} to {} bytes",
                self.identity.size, now.size
            )));
        }
        if now.mtime_ns != self.identity.mtime_ns {
            return Err(changed("it was modified (its mtime moved)".to_owned()));
        }
        Ok(())
    }

    /// Checks that the file is one complete version right now, the one opened: unchanged
    /// since open ([`NpyFile::check_unchanged`]), no process has it open for writing (asked
    /// of the kernel, see [`writers`]), its header bytes are those read at open, and its
    /// mtime and ctime are older than `window`. A file touched within the window is waited
    /// for (at most a few windows); a file open for writing is refused at once with
    /// [`NpyError::SourceBusy`].
    ///
    /// Why all of these: a single long `write` sets the mtime once, when it starts, so the
    /// identity alone cannot tell a finished write from one still copying; the writer probe
    /// can, where the kernel answers it; the window covers writers the probe cannot see
    /// (files of another owner, file systems without leases) as long as they pause less
    /// than the window, and timestamps coarser than the writes.
    pub fn settle(&self, window: std::time::Duration) -> Result<(), NpyError> {
        for _ in 0..SETTLE_ATTEMPTS {
            self.check_unchanged()?;
            self.check_no_writer()?;
            let meta = std::fs::metadata(&self.path)
                .map_err(|source| io_error(&self.path, "stat", source))?;
            match touched_within(&meta, window) {
                Some(wait) => std::thread::sleep(wait),
                None => return self.check_header_same(),
            }
        }
        Err(NpyError::SourceBusy {
            file: self.path.clone(),
            what: format!(
                "it kept changing within the {} ms stability window",
                window.as_millis()
            ),
        })
    }

    /// Refuses with [`NpyError::SourceBusy`] when another process has the file open for
    /// writing; passes when none has or when the kernel would not say.
    pub fn check_no_writer(&self) -> Result<(), NpyError> {
        match writers::probe(&*self.file()?) {
            Writers::Open => Err(NpyError::SourceBusy {
                file: self.path.clone(),
                what: "another process has it open for writing".to_owned(),
            }),
            Writers::None | Writers::Unknown => Ok(()),
        }
    }

    /// Checks that the file's preamble and header are still the bytes read at open.
    fn check_header_same(&self) -> Result<(), NpyError> {
        let now = read_prefix(&*self.file()?, &self.path, self.header.data_offset)?;
        if now != self.header_bytes {
            return Err(NpyError::SourceChanged {
                file: self.path.clone(),
                what: "its header bytes changed".to_owned(),
            });
        }
        Ok(())
    }

    /// Reads the region `start..stop` (exclusive stop, per axis) into `out` in C order.
    ///
    /// C-order files: one positional read per maximal contiguous run, straight into `out`
    /// (a contiguous region is a single read). Fortran-order files: the stored runs are read
    /// into one scratch buffer, then gathered into `out`. After reading, the file is checked
    /// unchanged, so bytes of a modified or replaced file are never returned.
    pub fn read_region(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), NpyError> {
        let needed = check_region(&self.header, start, stop, Some(&self.path))?;
        check_output(needed, out.len(), Some(&self.path))?;
        let runs = stored_runs(&self.header, start, stop);
        let file = self.file()?;
        let read = if self.header.is_c_layout() {
            self.read_runs(&file, runs, out)
        } else {
            self.read_fortran(&file, runs, start, stop, out)
        };
        if let Err(source) = read {
            self.check_unchanged()?;
            return Err(match source {
                ReadFailure::Io(source) => io_error(&self.path, "read the payload", source),
                ReadFailure::Npy(err) => err,
            });
        }
        self.check_unchanged()
    }

    /// Reads `runs` back to back into `out`.
    fn read_runs(&self, file: &File, runs: Runs, out: &mut [u8]) -> Result<(), ReadFailure> {
        let run_len = runs.run_len() as usize;
        for (offset, dst) in runs.zip(out.chunks_exact_mut(run_len.max(1))) {
            file.read_exact_at(dst, self.header.data_offset + offset)
                .map_err(ReadFailure::Io)?;
        }
        Ok(())
    }

    /// Reads the stored (transposed) region into a scratch buffer, then gathers it in C order.
    fn read_fortran(
        &self,
        file: &File,
        runs: Runs,
        start: &[u64],
        stop: &[u64],
        out: &mut [u8],
    ) -> Result<(), ReadFailure> {
        let mut scratch = allocate(out.len() as u64, Some(&self.path)).map_err(ReadFailure::Npy)?;
        scratch.resize(out.len(), 0);
        self.read_runs(file, runs, &mut scratch)?;
        let itemsize = self.header.dtype.itemsize;
        // Extents are at most their axes, which the header check keeps within usize.
        let extent: Vec<usize> = start
            .iter()
            .zip(stop)
            .map(|(&a, &b)| (b - a) as usize)
            .collect();
        gather(
            &scratch,
            0,
            &fortran_strides(&extent, itemsize),
            &extent,
            itemsize,
            out,
        );
        Ok(())
    }
}

impl std::fmt::Debug for NpyFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NpyFile")
            .field("path", &self.path)
            .field("header", &self.header)
            .field("identity", &self.identity)
            .field("placed", &self.place.is_some())
            .finish_non_exhaustive()
    }
}

/// Why a payload read failed, before the file is checked for changes.
enum ReadFailure {
    Io(io::Error),
    Npy(NpyError),
}

fn io_error(path: &Path, action: &'static str, source: io::Error) -> NpyError {
    NpyError::Io {
        file: Some(path.to_path_buf()),
        action,
        source,
    }
}

/// The first `len` bytes of `file` (the preamble and header: bounded by the header limits).
fn read_prefix(file: &File, path: &Path, len: u64) -> Result<Vec<u8>, NpyError> {
    let len = usize::try_from(len).map_err(|_| {
        io_error(
            path,
            "read the header",
            io::Error::other("header length does not fit in memory"),
        )
    })?;
    let mut buf = vec![0; len];
    file.read_exact_at(&mut buf, 0)
        .map_err(|source| io_error(path, "read the header", source))?;
    Ok(buf)
}

/// How much longer to wait when the file's mtime or ctime is within `window` of now;
/// `None` once both are older. Timestamps more than a window in the future (a clock set
/// back, a copied file) cannot be judged by age and count as old.
pub(crate) fn touched_within(
    meta: &Metadata,
    window: std::time::Duration,
) -> Option<std::time::Duration> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX))
        .unwrap_or(0);
    let window_ns = i128::try_from(window.as_nanos()).unwrap_or(i128::MAX);
    let stamp = |secs: i64, nanos: i64| i128::from(secs) * 1_000_000_000 + i128::from(nanos);
    let latest = stamp(meta.mtime(), meta.mtime_nsec()).max(stamp(meta.ctime(), meta.ctime_nsec()));
    let age = now - latest;
    if age >= window_ns || age < -window_ns {
        return None;
    }
    let left = u64::try_from((window_ns - age.max(0)).max(1_000_000)).unwrap_or(u64::MAX);
    Some(std::time::Duration::from_nanos(left))
}

/// [`open_regular`], then judged by `place` before anything is read.
pub(crate) fn open_placed(path: &Path, place: Option<&Placement>) -> Result<File, NpyError> {
    let file = open_regular(path)?;
    if let Some(place) = place {
        place(&file).map_err(|reason| NpyError::Outside {
            file: path.to_path_buf(),
            reason,
        })?;
    }
    Ok(file)
}

/// Opens `path` for reading without blocking on FIFOs, and refuses anything but a regular file.
fn open_regular(path: &Path) -> Result<File, NpyError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|source| io_error(path, "open", source))?;
    let kind = file
        .metadata()
        .map_err(|source| io_error(path, "stat", source))?
        .file_type();
    let refused = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_file() {
        return Ok(file);
    } else {
        "an unknown file type"
    };
    Err(NpyError::NotAFile {
        file: Some(path.to_path_buf()),
        kind: refused,
    })
}

/// Extends `buf` with the file's bytes from offset `buf.len()` until it holds `want` bytes or
/// the file ends.
fn fill_at(file: &File, buf: &mut Vec<u8>, want: usize) -> io::Result<()> {
    let mut got = buf.len();
    buf.resize(want.max(got), 0);
    while got < buf.len() {
        match file.read_at(&mut buf[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    buf.truncate(got);
    Ok(())
}
