//! A store opened `with_shared_maintenance` starts no thread of its own: it signals its
//! owner when a rotated segment needs sealing, `maintain` seals it on the caller's thread,
//! and `close` does what was left. (An owner of many stores, such as the server's uploads,
//! otherwise paid a thread per store.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{meta, pattern};
use tessera_segments::{Store, StoreOptions};

const ENTRY: usize = 40 << 10;

/// Names of this process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect()
}

/// Sidecar files (written when a segment is sealed) in the store's directory.
fn sidecars(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "idx"))
        })
        .count()
}

#[test]
fn shared_maintenance_runs_on_the_owners_worker() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let wakes = Arc::new(AtomicUsize::new(0));
    let counted = wakes.clone();
    let stores: Vec<Store> = (0..8)
        .map(|i| {
            let counted = counted.clone();
            Store::open(
                StoreOptions::new(dir.join(i.to_string()))
                    .with_open_segments(1)
                    .with_segment_bytes(64 << 10)
                    .with_keep_all(true)
                    .with_shared_maintenance(Arc::new(move || {
                        counted.fetch_add(1, Ordering::Relaxed);
                    })),
            )
            .unwrap()
        })
        .collect();
    assert!(
        !thread_names().iter().any(|n| n == "tessera-segments"),
        "no store started a maintenance thread: {:?}",
        thread_names()
    );

    let store = &stores[0];
    let keys: Vec<Vec<u8>> = (0..3u8).map(|i| vec![b'k', i]).collect();
    for (i, k) in keys.iter().enumerate() {
        let data = pattern(i as u64, ENTRY);
        store
            .append(k, &meta(&[ENTRY as i64], "|u1"), &[&data])
            .unwrap();
    }
    // Two rotations (one entry per 64 KiB segment): the owner was signalled, nothing sealed.
    assert!(wakes.load(Ordering::Relaxed) >= 2);
    let dir0 = store.dir().to_path_buf();
    assert_eq!(sidecars(&dir0), 0, "sealed before the owner's worker ran");
    store.maintain();
    assert_eq!(
        sidecars(&dir0),
        2,
        "the worker's pass sealed both rotated segments"
    );
    for (i, k) in keys.iter().enumerate() {
        let entry = store.read(k).unwrap().expect("stored");
        assert_eq!(&entry.body[8..8 + ENTRY], &pattern(i as u64, ENTRY)[..]);
    }
    store.close().unwrap();
    assert_eq!(sidecars(&dir0), 3, "close sealed the open segment");
    drop(stores);
    let reopened = Store::open(StoreOptions::new(&dir0).with_keep_all(true)).unwrap();
    for (i, k) in keys.iter().enumerate() {
        let entry = reopened.read(k).unwrap().expect("kept across the reopen");
        assert_eq!(&entry.body[8..8 + ENTRY], &pattern(i as u64, ENTRY)[..]);
    }
}
