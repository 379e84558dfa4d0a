//! Writing `.npy` files numpy reads back exactly.

use std::io::Write;
use std::path::Path;

use crate::error::ClientError;

/// The `.npy` preamble (magic, version, header length, header) for a C-order
/// array of `dtype` and `shape`: version 1.0, or 2.0 when the header would not
/// fit a 16-bit length. The preamble length is a multiple of 64.
pub fn npy_header(dtype: &str, shape: &[u64]) -> Vec<u8> {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let shape_text = match dims.as_slice() {
        [one] => format!("({one},)"),
        _ => format!("({})", dims.join(", ")),
    };
    let dict = format!("{{'descr': '{dtype}', 'fortran_order': False, 'shape': {shape_text}, }}");
    let build = |major: u8, len_bytes: usize| {
        let fixed = 6 + 2 + len_bytes;
        let unpadded = fixed + dict.len() + 1;
        let header_len = dict.len() + (64 - unpadded % 64) % 64 + 1;
        let mut out = Vec::with_capacity(fixed + header_len);
        out.extend_from_slice(b"\x93NUMPY");
        out.extend_from_slice(&[major, 0]);
        if len_bytes == 2 {
            out.extend_from_slice(&(header_len as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&(header_len as u32).to_le_bytes());
        }
        out.extend_from_slice(dict.as_bytes());
        out.resize(fixed + header_len - 1, b' ');
        out.push(b'\n');
        out
    };
    let v1 = build(1, 2);
    if v1.len() - 10 <= usize::from(u16::MAX) {
        v1
    } else {
        build(2, 4)
    }
}

/// Writes a C-order `.npy` of `dtype` and `shape` holding `data`.
pub fn write_npy(path: &Path, dtype: &str, shape: &[u64], data: &[u8]) -> Result<(), ClientError> {
    let io = |source| ClientError::Io {
        what: "writing .npy",
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::create(path).map_err(io)?;
    file.write_all(&npy_header(dtype, shape)).map_err(io)?;
    file.write_all(data).map_err(io)?;
    // A finished `get` leaves the file on disk; devices and pipes (`/dev/null`,
    // `/dev/stdout`) have nothing to sync and refuse fsync.
    if file.metadata().map_err(io)?.is_file() {
        file.sync_all().map_err(io)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn headers_are_aligned_and_parseable() {
        let header = npy_header("<u2", &[3, 4]);
        assert_eq!(header.len() % 64, 0);
        assert_eq!(&header[..8], b"\x93NUMPY\x01\x00");
        let len = u16::from_le_bytes([header[8], header[9]]) as usize;
        assert_eq!(len + 10, header.len());
        let text = std::str::from_utf8(&header[10..]).unwrap();
        assert!(text.starts_with("{'descr': '<u2', 'fortran_order': False, 'shape': (3, 4), }"));
        assert!(text.ends_with(" \n"));
        let one = String::from_utf8_lossy(&npy_header("|u1", &[5])).to_string();
        assert!(one.contains("'shape': (5,)"), "{one}");
        let scalar = String::from_utf8_lossy(&npy_header("<f8", &[])).to_string();
        assert!(scalar.contains("'shape': ()"), "{scalar}");
    }

    #[test]
    fn writes_to_devices_and_files() {
        write_npy(Path::new("/dev/null"), "<u2", &[2], &[1, 0, 2, 0]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npy");
        write_npy(&path, "<u2", &[2], &[1, 0, 2, 0]).unwrap();
        let written = std::fs::read(&path).unwrap();
        assert_eq!(&written[written.len() - 4..], &[1, 0, 2, 0]);
        assert_eq!(written.len(), npy_header("<u2", &[2]).len() + 4);
    }
}
