//! A borrowed, zero-copy view over `.npy` bytes the caller holds (e.g. a memory map).

use std::fmt;
use std::path::{Path, PathBuf};

use super::error::NpyError;
use super::header::{Header, parse_prefix};
use super::limits::Limits;
use super::region::{Runs, check_output, check_region, fortran_strides, gather, stored_runs};

/// A checked `.npy` file over bytes the caller holds.
///
/// Nothing is copied at construction. The bytes must outlive the view and must not change
/// while it lives (for a memory map: the file must not be truncated or rewritten).
pub struct NpyView<'a> {
    header: Header,
    payload: &'a [u8],
    file: Option<PathBuf>,
}

impl fmt::Debug for NpyView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NpyView")
            .field("header", &self.header)
            .field("payload_len", &self.payload.len())
            .field("file", &self.file)
            .finish()
    }
}

impl<'a> NpyView<'a> {
    /// Checks the header of `bytes` (a whole `.npy` file) and that the payload is all there.
    ///
    /// Errors name the source `<memory>`; see [`NpyView::new_named`].
    pub fn new(bytes: &'a [u8], limits: &Limits) -> Result<Self, NpyError> {
        Self::build(bytes, limits, None)
    }

    /// [`NpyView::new`] for bytes that come from `file` (e.g. its memory map): errors name it.
    pub fn new_named(bytes: &'a [u8], limits: &Limits, file: &Path) -> Result<Self, NpyError> {
        Self::build(bytes, limits, Some(file))
    }

    fn build(bytes: &'a [u8], limits: &Limits, file: Option<&Path>) -> Result<Self, NpyError> {
        let owned = file.map(Path::to_path_buf);
        if bytes.is_empty() {
            return Err(NpyError::EmptyFile { file: owned });
        }
        let header = parse_prefix(bytes, limits, file)?;
        // The header check keeps offset + length within usize.
        let start = header.data_offset as usize;
        let end = start + header.data_len as usize;
        let payload = bytes
            .get(start..end)
            .ok_or_else(|| NpyError::TruncatedPayload {
                file: owned.clone(),
                present: bytes.len().saturating_sub(start) as u64,
                declared: header.data_len,
            })?;
        Ok(NpyView {
            header,
            payload,
            file: owned,
        })
    }

    /// The checked header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The payload exactly (trailing bytes excluded), in the file's order and byte order.
    pub fn payload(&self) -> &'a [u8] {
        self.payload
    }

    /// Copies the region `start..stop` (exclusive stop, per axis) into `out` in C order, with
    /// exactly one copy whatever the file's order. `out.len()` must be the region's byte size.
    pub fn read_region(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), NpyError> {
        let needed = check_region(&self.header, start, stop, self.file.as_deref())?;
        check_output(needed, out.len(), self.file.as_deref())?;
        if self.header.is_c_layout() {
            let runs = stored_runs(&self.header, start, stop);
            let run_len = runs.run_len() as usize;
            for (offset, dst) in runs.zip(out.chunks_exact_mut(run_len.max(1))) {
                let offset = offset as usize;
                dst.copy_from_slice(&self.payload[offset..offset + run_len]);
            }
        } else {
            let itemsize = self.header.dtype.itemsize;
            let shape: Vec<usize> = self.header.shape.iter().map(|&d| d as usize).collect();
            let strides = fortran_strides(&shape, itemsize);
            let base = start
                .iter()
                .zip(&strides)
                .map(|(&a, &s)| a as usize * s)
                .sum();
            let extent: Vec<usize> = start
                .iter()
                .zip(stop)
                .map(|(&a, &b)| (b - a) as usize)
                .collect();
            gather(self.payload, base, &strides, &extent, itemsize, out);
        }
        Ok(())
    }

    /// The payload slices that make up the region `start..stop`, in C output order, with no
    /// copy: concatenated they are what [`NpyView::read_region`] writes.
    ///
    /// `Ok(None)` for Fortran-order payloads whose layout differs from C order (no such
    /// slices exist); errors when the region does not fit the shape.
    pub fn region_runs(
        &self,
        start: &[u64],
        stop: &[u64],
    ) -> Result<Option<RegionRuns<'a>>, NpyError> {
        check_region(&self.header, start, stop, self.file.as_deref())?;
        if !self.header.is_c_layout() {
            return Ok(None);
        }
        Ok(Some(RegionRuns {
            payload: self.payload,
            runs: stored_runs(&self.header, start, stop),
        }))
    }
}

/// The contiguous payload slices of a region, in C output order (see [`NpyView::region_runs`]).
#[derive(Clone, Debug)]
pub struct RegionRuns<'a> {
    payload: &'a [u8],
    runs: Runs,
}

impl<'a> Iterator for RegionRuns<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let offset = self.runs.next()? as usize;
        let len = self.runs.run_len() as usize;
        Some(&self.payload[offset..offset + len])
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.runs.len()).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}

impl ExactSizeIterator for RegionRuns<'_> {}
