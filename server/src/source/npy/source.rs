//! A `.npy` file as a [`Source`]: its header describes it, positional reads serve its
//! regions, and a contiguous region of a C-order payload is one byte range of the file.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::dtype::Dtype;
use super::error::NpyError;
use super::file::{NpyFile, Placement};
use super::limits::Limits;
use crate::content_version::ContentVersion;
use crate::grid::Region;
use crate::source::abstraction::{ByteRange, Source, SourceError, SourceErrorKind};

impl From<NpyError> for SourceError {
    fn from(err: NpyError) -> SourceError {
        let kind = match &err {
            NpyError::SourceChanged { .. } => SourceErrorKind::Changed,
            NpyError::SourceBusy { .. } => SourceErrorKind::Busy,
            _ => SourceErrorKind::Failed,
        };
        SourceError::new(kind, err)
    }
}

/// Opens the `.npy` file at `path` as a source (the registry's opener, `source/formats.rs`),
/// or refuses it with the reason clients see.
pub fn open_source(
    path: &Path,
    limits: &Limits,
    place: Option<Placement>,
) -> Result<Arc<dyn Source>, String> {
    match NpyFile::open_within(path, limits, place) {
        Ok(file) => Ok(Arc::new(file)),
        Err(err) => Err(refusal(path, &err)),
    }
}

/// The reason `path` was refused, as logged and sent to clients.
///
/// Only a path that names a regular file itself may have its bytes quoted (the magic check
/// shows the first 8 bytes it found, header errors a snippet of the header). A symbolic
/// link is followed when it names a regular file, wherever that lives, so it may point at
/// anything the server can read (`/etc/passwd`): its refusal says which check failed and
/// that it is a link, and quotes nothing read from it. Non-regular files (FIFOs, devices,
/// directories) are refused by `NpyFile::open` before anything is read.
fn refusal(path: &Path, err: &NpyError) -> String {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_file() => err.to_string(),
        Ok(meta) if meta.file_type().is_symlink() => format!(
            "{} (a symbolic link: nothing read through it is quoted)",
            err.without_content()
        ),
        _ => err.without_content(),
    }
}

impl Source for NpyFile {
    fn format(&self) -> &'static str {
        "npy"
    }

    fn path(&self) -> &Path {
        NpyFile::path(self)
    }

    fn shape(&self) -> &[u64] {
        &self.header().shape
    }

    fn dtype(&self) -> &Dtype {
        &self.header().dtype
    }

    fn fortran_order(&self) -> bool {
        self.header().fortran_order
    }

    fn version(&self) -> ContentVersion {
        ContentVersion::File(self.identity())
    }

    fn format_metadata(&self) -> Map<String, Value> {
        let header = self.header();
        let mut map = Map::new();
        map.insert(
            "npy_version".to_string(),
            json!(format!("{}.{}", header.version.0, header.version.1)),
        );
        map.insert("fortran_order".to_string(), json!(header.fortran_order));
        map
    }

    /// A local file: resident while it is there.
    fn is_resident(&self) -> bool {
        std::fs::metadata(NpyFile::path(self)).is_ok_and(|m| m.is_file())
    }

    fn read_region(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), SourceError> {
        Ok(NpyFile::read_region(self, start, stop, out)?)
    }

    /// One byte range when the region is one contiguous run of a C-order payload (the usual
    /// case: the grid splits the slowest axes first).
    fn byte_range(&self, region: &Region) -> Result<Option<ByteRange>, SourceError> {
        let header = self.header();
        if !header.is_c_layout() {
            return Ok(None);
        }
        let Some(elements) = crate::grid::element_range(region, &header.shape, false) else {
            return Ok(None);
        };
        let itemsize = header.dtype.itemsize as u64;
        let range = elements.start.checked_mul(itemsize).and_then(|start| {
            let offset = header.data_offset.checked_add(start)?;
            let len = (elements.end - elements.start).checked_mul(itemsize)?;
            Some((offset, len))
        });
        let Some((offset, len)) = range else {
            return Ok(None);
        };
        Ok(Some(ByteRange {
            file: self.file()?,
            offset,
            len,
        }))
    }

    fn settle(&self, window: Duration) -> Result<(), SourceError> {
        Ok(NpyFile::settle(self, window)?)
    }

    fn check_unchanged(&self) -> Result<(), SourceError> {
        Ok(NpyFile::check_unchanged(self)?)
    }

    fn check_no_writer(&self) -> Result<(), SourceError> {
        Ok(NpyFile::check_no_writer(self)?)
    }
}
