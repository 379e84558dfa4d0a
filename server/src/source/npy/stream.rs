//! Owned reads: a `.npy` stream read into a buffer the reader owns.

use std::io::{self, Read};
use std::path::Path;

use super::error::NpyError;
use super::header::{Header, parse_prefix};
use super::limits::Limits;
use super::region::{fortran_strides, gather};

/// Reads the header through `fill`, asking for more bytes only when the parser needs them.
///
/// `fill(buf, want)` appends to `buf` until it holds `want` bytes or the source ends. The
/// first request is `first` bytes; later ones are exactly what the parser asks for, so a
/// stream is never read past the header when `first` is at most 8.
pub(crate) fn read_header(
    limits: &Limits,
    file: Option<&Path>,
    first: usize,
    mut fill: impl FnMut(&mut Vec<u8>, usize) -> io::Result<()>,
) -> Result<Header, NpyError> {
    let mut buf = Vec::new();
    let mut want = first;
    loop {
        fill(&mut buf, want).map_err(|source| NpyError::Io {
            file: file.map(Path::to_path_buf),
            action: "read the header",
            source,
        })?;
        match parse_prefix(&buf, limits, file) {
            Err(NpyError::TruncatedHeader { .. }) if buf.is_empty() => {
                return Err(NpyError::EmptyFile {
                    file: file.map(Path::to_path_buf),
                });
            }
            // `needed` is at most 12 + `max_header_len`, so it fits in usize.
            Err(NpyError::TruncatedHeader { needed, .. })
                if buf.len() == want && needed > want as u64 =>
            {
                want = needed as usize;
            }
            other => return other,
        }
    }
}

/// Reads a whole `.npy` stream: the payload goes straight into the returned buffer (one
/// copy), and a Fortran-order payload is then gathered into C order (one more buffer).
///
/// `file` names the source in errors. Nothing past the payload is read: trailing bytes are
/// left in the stream.
pub fn read_stream<R: Read>(
    mut reader: R,
    limits: &Limits,
    file: Option<&Path>,
) -> Result<(Header, Vec<u8>), NpyError> {
    let header = read_header(limits, file, 8, |buf, want| {
        let missing = want.saturating_sub(buf.len()) as u64;
        reader.by_ref().take(missing).read_to_end(buf).map(drop)
    })?;
    let data = read_payload(&mut reader, &header, file)?;
    let data = if header.is_c_layout() {
        data
    } else {
        to_c_order(&header, &data, file)?
    };
    Ok((header, data))
}

/// Reads exactly the payload, allocating it once.
fn read_payload<R: Read>(
    reader: &mut R,
    header: &Header,
    file: Option<&Path>,
) -> Result<Vec<u8>, NpyError> {
    let declared = header.data_len;
    let mut data = allocate(declared, file)?;
    reader
        .take(declared)
        .read_to_end(&mut data)
        .map_err(|source| NpyError::Io {
            file: file.map(Path::to_path_buf),
            action: "read the payload",
            source,
        })?;
    if (data.len() as u64) < declared {
        return Err(NpyError::TruncatedPayload {
            file: file.map(Path::to_path_buf),
            present: data.len() as u64,
            declared,
        });
    }
    Ok(data)
}

/// An empty buffer with room for `bytes`, or a typed error when it cannot be had.
pub(crate) fn allocate(bytes: u64, file: Option<&Path>) -> Result<Vec<u8>, NpyError> {
    let oom = || NpyError::OutOfMemory {
        file: file.map(Path::to_path_buf),
        bytes,
    };
    let len = usize::try_from(bytes).map_err(|_| oom())?;
    let mut data = Vec::new();
    data.try_reserve_exact(len).map_err(|_| oom())?;
    Ok(data)
}

/// The C-order bytes of a whole Fortran-order payload.
fn to_c_order(header: &Header, data: &[u8], file: Option<&Path>) -> Result<Vec<u8>, NpyError> {
    let mut out = allocate(header.data_len, file)?;
    out.resize(data.len(), 0);
    let itemsize = header.dtype.itemsize;
    // The header check keeps every dimension within usize.
    let shape: Vec<usize> = header.shape.iter().map(|&d| d as usize).collect();
    gather(
        data,
        0,
        &fortran_strides(&shape, itemsize),
        &shape,
        itemsize,
        &mut out,
    );
    Ok(out)
}
