//! An opened `.npy` file read with positional reads.
//!
//! Positional reads (`pread`), not a memory map: a file shrunk under the reader gives an I/O
//! error, never `SIGBUS`.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::error::NpyError;
use super::header::Header;
use super::limits::Limits;
use super::region::{Runs, check_output, check_region, fortran_strides, gather, stored_runs};
use super::stream::{allocate, read_header, read_stream};

/// Bytes read first when opening a file; numpy headers are 64 or 128 bytes.
const FIRST_READ: usize = 4096;

/// What identifies a file's content at open: changed identity means changed bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    /// Device number.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time in nanoseconds since the Unix epoch.
    pub mtime_ns: i64,
}

impl FileIdentity {
    /// The identity a `stat` result describes.
    pub fn of(meta: &Metadata) -> FileIdentity {
        FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: meta
                .mtime()
                .saturating_mul(1_000_000_000)
                .saturating_add(meta.mtime_nsec()),
        }
    }
}

/// A checked `.npy` file, open for region reads.
///
/// Opening reads only the header; the payload is read on demand with positional reads, which
/// may run concurrently from several threads.
#[derive(Debug)]
pub struct NpyFile {
    file: File,
    path: PathBuf,
    header: Header,
    identity: FileIdentity,
}

impl NpyFile {
    /// Opens `path`, checks its header, that it is a regular file and that the payload is all
    /// there (a truncated file is refused here), and records its identity.
    pub fn open(path: &Path, limits: &Limits) -> Result<NpyFile, NpyError> {
        let file = open_regular(path)?;
        let meta = file
            .metadata()
            .map_err(|source| io_error(path, "stat", source))?;
        let identity = FileIdentity::of(&meta);
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
        Ok(NpyFile {
            file,
            path: path.to_path_buf(),
            header,
            identity,
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
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Device, inode, size and mtime at open.
    pub fn identity(&self) -> FileIdentity {
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
        let now = FileIdentity::of(
            &self
                .file
                .metadata()
                .map_err(|source| io_error(&self.path, "stat", source))?,
        );
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
        let read = if self.header.is_c_layout() {
            self.read_runs(runs, out)
        } else {
            self.read_fortran(runs, start, stop, out)
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
    fn read_runs(&self, runs: Runs, out: &mut [u8]) -> Result<(), ReadFailure> {
        let run_len = runs.run_len() as usize;
        for (offset, dst) in runs.zip(out.chunks_exact_mut(run_len.max(1))) {
            self.file
                .read_exact_at(dst, self.header.data_offset + offset)
                .map_err(ReadFailure::Io)?;
        }
        Ok(())
    }

    /// Reads the stored (transposed) region into a scratch buffer, then gathers it in C order.
    fn read_fortran(
        &self,
        runs: Runs,
        start: &[u64],
        stop: &[u64],
        out: &mut [u8],
    ) -> Result<(), ReadFailure> {
        let mut scratch = allocate(out.len() as u64, Some(&self.path)).map_err(ReadFailure::Npy)?;
        scratch.resize(out.len(), 0);
        self.read_runs(runs, &mut scratch)?;
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
