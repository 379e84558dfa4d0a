//! A segment whose last entry is torn (crash mid-write, no sidecar, no end-of-stream) is
//! recovered at boot: every complete entry is indexed, the torn tail is left in place (the
//! file is not modified), a fresh sidecar is written, and new appends go to a new segment.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{meta, pattern, segment_files, segment_id};
use tessera_segments::{Store, StoreOptions};

#[test]
fn torn_tail_recovered() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut locs = Vec::new();
    {
        let store = Store::open(StoreOptions::new(dir).with_open_segments(1)).unwrap();
        for i in 0..5u64 {
            let data = pattern(i, 10_000 + i as usize * 77);
            let key = format!("key{i}");
            locs.push(
                store
                    .append(key.as_bytes(), &meta(&[data.len() as i64], "|u1"), &[&data])
                    .unwrap(),
            );
        }
        store.close().unwrap();
    }
    let seg = &locs[0].segment_path;
    let sealed = std::fs::read(seg).unwrap();
    // Rebuild the file as a crash would leave it: entries 0..4 complete, entry 4 cut in half,
    // no end-of-stream marker, no sidecar.
    let last = &locs[4];
    let cut = (last.byte_offset + last.byte_length / 2) as usize;
    std::fs::write(seg, &sealed[..cut]).unwrap();
    std::fs::remove_file(seg.with_extension("idx")).unwrap();
    let torn = std::fs::read(seg).unwrap();

    let store = Store::open(StoreOptions::new(dir)).unwrap();
    for (i, loc) in locs.iter().enumerate().take(4) {
        let key = format!("key{i}");
        assert_eq!(store.locate(key.as_bytes()).as_ref(), Some(loc));
        let entry = store.read(key.as_bytes()).unwrap().unwrap();
        let data = pattern(i as u64, 10_000 + i * 77);
        assert_eq!(&entry.body[8..8 + data.len()], &data[..]);
    }
    assert_eq!(store.locate(b"key4"), None, "the torn entry is not indexed");
    // The data region is untouched: same length, same bytes.
    assert_eq!(std::fs::read(seg).unwrap(), torn);
    assert!(seg.with_extension("idx").exists(), "fresh sidecar written");

    // A new append goes to a fresh segment, never after the torn bytes.
    let data = pattern(99, 1000);
    let loc = store
        .append(b"new", &meta(&[1000], "|u1"), &[&data])
        .unwrap();
    assert!(segment_id(&loc.segment_path) > segment_id(seg));
    assert_eq!(std::fs::read(seg).unwrap(), torn);
    drop(store);

    // The fresh sidecar is trusted on the next boot and gives the same answers.
    let store = Store::open(StoreOptions::new(dir)).unwrap();
    assert_eq!(store.locate(b"key3").as_ref(), Some(&locs[3]));
    assert_eq!(store.locate(b"key4"), None);
    assert!(store.locate(b"new").is_some());
    assert_eq!(segment_files(dir).len(), 2);
}
