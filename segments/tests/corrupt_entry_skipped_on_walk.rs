//! A boot walk (no sidecar) verifies every entry's crc32c: a corrupted entry is skipped, the
//! entries around it stay available, and verify-on-read reports a corrupted sealed entry.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::FileExt;

use common::{meta, pattern};
use tessera_segments::{Store, StoreError, StoreOptions};

fn flip_byte(path: &std::path::Path, at: u64) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x55], at).unwrap();
}

#[test]
fn corrupt_entry_skipped_on_walk() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut locs = Vec::new();
    {
        let store = Store::open(StoreOptions::new(dir).with_open_segments(1)).unwrap();
        for i in 0..3u64 {
            let data = pattern(i, 5000);
            locs.push(
                store
                    .append(format!("k{i}").as_bytes(), &meta(&[5000], "|u1"), &[&data])
                    .unwrap(),
            );
        }
    }
    let seg = locs[0].segment_path.clone();
    // Corrupt the middle of entry 1's payload and drop the sidecar.
    flip_byte(&seg, locs[1].byte_offset + locs[1].byte_length - 2000);
    std::fs::remove_file(seg.with_extension("idx")).unwrap();

    let store = Store::open(StoreOptions::new(dir)).unwrap();
    assert_eq!(store.locate(b"k0").as_ref(), Some(&locs[0]));
    assert_eq!(store.locate(b"k1"), None);
    assert_eq!(store.locate(b"k2").as_ref(), Some(&locs[2]));
}

#[test]
fn verify_on_read_detects_corruption() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let loc = {
        let store = Store::open(StoreOptions::new(dir)).unwrap();
        let data = pattern(1, 4096);
        store.append(b"k", &meta(&[4096], "|u1"), &[&data]).unwrap()
    };
    // The sidecar still matches (same size), so only a read-time check can notice.
    flip_byte(&loc.segment_path, loc.byte_offset + loc.byte_length - 100);
    let plain = Store::open(StoreOptions::new(dir)).unwrap();
    assert!(plain.read(b"k").unwrap().is_some());
    drop(plain);
    let verifying = Store::open(StoreOptions::new(dir).with_verify_on_read(true)).unwrap();
    let err = verifying.read(b"k").unwrap_err();
    assert!(matches!(err, StoreError::ChecksumMismatch { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&loc.segment_path.display().to_string())
    );
}
