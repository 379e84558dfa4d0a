//! Segment ids are strictly monotonic for the life of the directory: after every segment is
//! removed (wipe or eviction) and the store restarts, new segments get higher ids.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{meta, pattern, segment_id};
use tessera_segments::{Store, StoreOptions};

#[test]
fn ids_never_repeat_after_wipe() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = pattern(1, 1000);
    let m = meta(&[1000], "|u1");
    let first = {
        let store = Store::open(StoreOptions::new(dir)).unwrap();
        let a = store.append(b"a", &m, &[&data]).unwrap();
        let b = store.append(b"b", &m, &[&data]).unwrap();
        segment_id(&a.segment_path).max(segment_id(&b.segment_path))
    };
    // Remove every segment and sidecar.
    for e in std::fs::read_dir(dir.join("segments")).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let second = {
        let store = Store::open(StoreOptions::new(dir)).unwrap();
        assert_eq!(store.locate(b"a"), None);
        let loc = store.append(b"a", &m, &[&data]).unwrap();
        segment_id(&loc.segment_path)
    };
    assert!(
        second > first,
        "id {second} reused after wipe (previous max {first})"
    );

    // Eviction of every sealed segment, then restart: still no reuse.
    let third = {
        let store = Store::open(StoreOptions::new(dir).with_max_bytes(0)).unwrap();
        assert_eq!(
            store.stats().segments,
            0,
            "a zero budget evicts everything at open"
        );
        drop(store);
        let store = Store::open(StoreOptions::new(dir)).unwrap();
        let loc = store.append(b"c", &m, &[&data]).unwrap();
        segment_id(&loc.segment_path)
    };
    assert!(
        third > second,
        "id {third} reused after eviction (previous max {second})"
    );
}
