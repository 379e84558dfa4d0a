//! Many appenders and readers at once: every entry is readable whole as soon as it is
//! located, appends spread over the open segments, and one key appended concurrently by many
//! threads is written once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};

use common::{meta, pattern};
use tessera_segments::{Store, StoreOptions};

fn len_of(i: u64) -> usize {
    1000 + (i as usize * 7919) % 60_000
}

#[test]
fn concurrent_append_and_locate() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(
        Store::open(
            StoreOptions::new(tmp.path())
                .with_open_segments(3)
                .with_segment_bytes(1 << 20),
        )
        .unwrap(),
    );
    let done = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4u64)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut segs = HashSet::new();
                for j in 0..60u64 {
                    let i = t * 1000 + j;
                    let data = pattern(i, len_of(i));
                    let (a, b) = data.split_at(data.len() / 2);
                    let loc = store
                        .append(
                            format!("k{i}").as_bytes(),
                            &meta(&[data.len() as i64], "|u1"),
                            &[a, b],
                        )
                        .unwrap();
                    segs.insert(loc.segment_path);
                }
                segs
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let store = Arc::clone(&store);
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                let mut seen = 0u64;
                while !done.load(Ordering::Relaxed) {
                    for t in 0..4u64 {
                        for j in 0..60u64 {
                            let i = t * 1000 + j;
                            let key = format!("k{i}");
                            if store.locate(key.as_bytes()).is_some() {
                                // Located means complete: the bytes are all there.
                                let e = store.read(key.as_bytes()).unwrap().unwrap();
                                let n = len_of(i);
                                assert_eq!(&e.body[8..8 + n], &pattern(i, n)[..], "{key}");
                                seen += 1;
                            }
                        }
                    }
                }
                seen
            })
        })
        .collect();
    let mut all_segs = HashSet::new();
    for w in writers {
        all_segs.extend(w.join().unwrap());
    }
    done.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    assert!(
        all_segs.len() >= 3,
        "appends used several segments: {all_segs:?}"
    );
    assert_eq!(store.stats().total_entries, 240);
    for t in 0..4u64 {
        for j in 0..60u64 {
            let i = t * 1000 + j;
            let e = store.read(format!("k{i}").as_bytes()).unwrap().unwrap();
            assert_eq!(&e.body[8..8 + len_of(i)], &pattern(i, len_of(i))[..]);
        }
    }
}

#[test]
fn same_key_appended_concurrently_is_stored_once() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(StoreOptions::new(tmp.path()).with_open_segments(4)).unwrap());
    let data = Arc::new(pattern(7, 4 << 20));
    let n = 8;
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (store, data, barrier) =
                (Arc::clone(&store), Arc::clone(&data), Arc::clone(&barrier));
            std::thread::spawn(move || {
                barrier.wait();
                store
                    .append(b"same", &meta(&[data.len() as i64], "|u1"), &[&data[..]])
                    .unwrap()
            })
        })
        .collect();
    let locs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(locs.iter().all(|l| *l == locs[0]), "{locs:?}");
    let stats = store.stats();
    assert_eq!(stats.total_entries, 1);
    // Exactly one copy on disk: schema plus one message in one segment.
    let on_disk: u64 = common::segment_files(tmp.path())
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert_eq!(stats.segments, 1, "{stats:?}");
    assert_eq!(on_disk, locs[0].byte_offset + locs[0].byte_length);
}
