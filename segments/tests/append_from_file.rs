//! `Store::append_from_file`: the data goes from a byte range of a source file into the
//! segment inside the kernel. The stored bytes equal the source's, the checksum recorded
//! from the segment verifies on a reopen that walks the stream, a source that shrank is a
//! typed error that stores nothing and leaves the store usable, and a refused caller check
//! stores nothing either (not even after a restart).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs::File;
use std::os::unix::fs::FileExt;

use common::{meta, pattern, payload_of, segment_files, segment_id};
use tessera_segments::{FileRange, Store, StoreError, StoreOptions};

fn source_with(dir: &std::path::Path, bytes: &[u8]) -> File {
    let path = dir.join("source.bin");
    std::fs::write(&path, bytes).unwrap();
    File::options().read(true).write(true).open(path).unwrap()
}

#[test]
fn copied_bytes_equal_the_source_and_verify_after_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let data = pattern(7, 3 << 20);
    let src = source_with(tmp.path(), &data);
    let m = meta(&[1 << 20], "<u2");
    let (a, b) = {
        let store = Store::open(StoreOptions::new(&dir).with_open_segments(1)).unwrap();
        let range = |offset| FileRange {
            file: &src,
            offset,
            len: 2 << 20,
        };
        let a = store.append_from_file(b"a", &m, range(64)).unwrap();
        // Mixed with an in-memory append in the same segment.
        let mid = store.append(b"mid", &m, &[&data[..2 << 20]]).unwrap();
        let b = store.append_from_file(b"b", &m, range(1000)).unwrap();
        assert_eq!(a.segment_path, b.segment_path);
        assert!(mid.byte_offset > a.byte_offset && b.byte_offset > mid.byte_offset);
        // A second append of a stored key answers the existing entry.
        assert_eq!(store.append_from_file(b"a", &m, range(0)).unwrap(), a);
        let e = store.read(b"a").unwrap().unwrap();
        assert_eq!(&e.body[8..8 + (2 << 20)], &data[64..64 + (2 << 20)]);
        (a, b)
    };
    assert_eq!(payload_of(&a, 2 << 20), &data[64..64 + (2 << 20)]);
    assert_eq!(payload_of(&b, 2 << 20), &data[1000..1000 + (2 << 20)]);
    // Without sidecars the reopen walks the stream and checks every entry's crc32c.
    for seg in segment_files(&dir) {
        std::fs::remove_file(seg.with_extension("idx")).unwrap();
    }
    let store = Store::open(StoreOptions::new(&dir).with_verify_on_read(true)).unwrap();
    assert_eq!(store.locate(b"a"), Some(a));
    assert_eq!(store.locate(b"b"), Some(b));
    let e = store.read(b"b").unwrap().unwrap();
    assert_eq!(&e.body[8..8 + (2 << 20)], &data[1000..1000 + (2 << 20)]);
}

#[test]
fn a_source_truncated_mid_range_fails_and_the_store_stays_usable() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let data = pattern(3, 1 << 20);
    let src = source_with(tmp.path(), &data);
    let m = meta(&[1 << 20], "|u1");
    let store = Store::open(StoreOptions::new(&dir).with_open_segments(1)).unwrap();
    let before = store.append(b"before", &m, &[&data]).unwrap();
    // The source shrinks after it was opened: the range now ends past its end.
    src.set_len(300_000).unwrap();
    let range = FileRange {
        file: &src,
        offset: 0,
        len: 1 << 20,
    };
    let err = store.append_from_file(b"short", &m, range).unwrap_err();
    match &err {
        StoreError::SourceShort {
            offset,
            expected,
            copied,
        } => assert_eq!((*offset, *expected, *copied), (0, 1 << 20, 300_000)),
        other => panic!("expected SourceShort, got {other}"),
    }
    assert!(err.to_string().contains("shrank"), "{err}");
    assert_eq!(store.locate(b"short"), None);
    assert_eq!(store.locate(b"before").as_ref(), Some(&before));

    // Not poisoned: the next appends work and go to a new segment.
    src.write_all_at(&data, 0).unwrap();
    let again = store.append_from_file(b"short", &m, range).unwrap();
    assert!(segment_id(&again.segment_path) > segment_id(&before.segment_path));
    assert_eq!(payload_of(&again, 1 << 20), data);
    let other = store.append(b"other", &m, &[&data]).unwrap();
    assert_eq!(payload_of(&other, 1 << 20), data);
    drop(store);

    let store = Store::open(StoreOptions::new(&dir)).unwrap();
    assert_eq!(store.locate(b"before"), Some(before));
    assert_eq!(store.locate(b"short"), Some(again));
}

#[test]
fn a_refused_check_stores_nothing_even_after_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cache");
    let data = pattern(9, 100_000);
    let src = source_with(tmp.path(), &data);
    let m = meta(&[100_000], "|u1");
    let range = FileRange {
        file: &src,
        offset: 0,
        len: 100_000,
    };
    let store = Store::open(StoreOptions::new(&dir).with_open_segments(1)).unwrap();
    let kept = store.append_from_file(b"kept", &m, range).unwrap();
    let mut ran = false;
    let refused = store
        .append_from_file_checked(b"changed", &m, range, || {
            ran = true;
            Err("the source changed")
        })
        .unwrap();
    assert!(ran);
    assert_eq!(refused, Err("the source changed"));
    assert_eq!(store.locate(b"changed"), None);
    let passed = store
        .append_from_file_checked(b"later", &m, range, || Ok::<(), String>(()))
        .unwrap()
        .unwrap();
    assert_eq!(payload_of(&passed, 100_000), data);
    drop(store);

    // The refused bytes never got a message header: a walk without sidecars skips them.
    for seg in segment_files(&dir) {
        let _ = std::fs::remove_file(seg.with_extension("idx"));
    }
    let store = Store::open(StoreOptions::new(&dir)).unwrap();
    assert_eq!(store.locate(b"changed"), None);
    assert_eq!(store.locate(b"kept"), Some(kept));
    assert_eq!(store.locate(b"later"), Some(passed));
}
