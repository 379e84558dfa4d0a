//! Helpers shared by the integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::FileExt;
use std::path::Path;

use tessera_segments::{EntryMeta, Location};

/// Deterministic pseudo-random bytes for entry `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn meta(shape: &[i64], dtype: &str) -> EntryMeta {
    EntryMeta {
        shape: shape.to_vec(),
        dtype: dtype.to_string(),
    }
}

/// The bytes of a located message, read from the file with plain I/O.
pub fn read_location(loc: &Location) -> Vec<u8> {
    let f = std::fs::File::open(&loc.segment_path).unwrap();
    let mut buf = vec![0u8; loc.byte_length as usize];
    f.read_exact_at(&mut buf, loc.byte_offset).unwrap();
    buf
}

/// The data payload inside a located message: the last `data_len` bytes before the suffix,
/// found through the message's own framing (metadata length at bytes 4..8, data at body
/// offset 8).
pub fn payload_of(loc: &Location, data_len: usize) -> Vec<u8> {
    let msg = read_location(loc);
    assert_eq!(&msg[..4], &[0xFF; 4], "continuation marker");
    let meta_len = i32::from_le_bytes(msg[4..8].try_into().unwrap()) as usize;
    let start = 8 + meta_len + 8;
    assert_eq!(
        (loc.byte_offset as usize + start) % 64,
        0,
        "payload is 64-byte aligned in the file"
    );
    msg[start..start + data_len].to_vec()
}

/// Segment files (`.arrow`) in a store directory, sorted by name.
pub fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "arrow"))
        .collect();
    v.sort();
    v
}

/// Numeric id of a segment path `seg_{id:016}.arrow`.
pub fn segment_id(path: &Path) -> u64 {
    let name = path.file_stem().unwrap().to_str().unwrap();
    name.strip_prefix("seg_").unwrap().parse().unwrap()
}
