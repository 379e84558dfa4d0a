//! `.npy` files with known bytes, and the crop a read is compared with.

use std::path::{Path, PathBuf};

/// Writes a C-order little-endian `.npy` (version 1.0) with `descr` and `shape`.
pub fn write_npy(path: &Path, descr: &str, shape: &[u64], data: &[u8]) {
    write_npy_ordered(path, descr, shape, false, data);
}

/// Writes a `.npy` with explicit order; `data` must already be in that order.
pub fn write_npy_ordered(path: &Path, descr: &str, shape: &[u64], fortran: bool, data: &[u8]) {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_text = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let fortran = if fortran { "True" } else { "False" };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape_text}, }}");
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::new();
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

/// Deterministic pseudo-random bytes (xorshift64*), so failures reproduce.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The C-order bytes of `region` of a C-order array of `shape` with `itemsize`.
pub fn region_bytes(
    data: &[u8],
    shape: &[u64],
    itemsize: usize,
    start: &[u64],
    stop: &[u64],
) -> Vec<u8> {
    let rank = shape.len();
    let mut out = Vec::new();
    let mut idx: Vec<u64> = start.to_vec();
    if start.iter().zip(stop).any(|(a, b)| a >= b) {
        return out;
    }
    let row = (stop[rank - 1] - start[rank - 1]) as usize * itemsize;
    loop {
        let mut offset = 0u64;
        for axis in 0..rank {
            offset = offset * shape[axis] + idx[axis];
        }
        let at = offset as usize * itemsize;
        out.extend_from_slice(&data[at..at + row]);
        // Advance all but the last axis, odometer style.
        let mut axis = rank - 1;
        loop {
            if axis == 0 {
                return out;
            }
            axis -= 1;
            idx[axis] += 1;
            if idx[axis] < stop[axis] {
                break;
            }
            idx[axis] = start[axis];
        }
    }
}

/// Writes `DIR/NAME.npy`, C-order, of `descr` (`<u2`, `>i4`, `|u1`: the item size is its
/// digits) and `shape`, holding [`pattern`] bytes of `seed`; returns its path and payload.
pub fn npy_fixture(
    dir: &Path,
    name: &str,
    descr: &str,
    shape: &[u64],
    seed: u64,
) -> (PathBuf, Vec<u8>) {
    let itemsize: usize = descr[2..].parse().unwrap();
    let len = shape.iter().product::<u64>() as usize * itemsize;
    let data = pattern(len, seed);
    let path = dir.join(format!("{name}.npy"));
    write_npy(&path, descr, shape, &data);
    (path, data)
}
