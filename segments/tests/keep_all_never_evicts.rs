//! A store opened with `with_keep_all` (users' data, not a cache) never evicts: over its
//! budget, during appends and at a reopen, every entry stays and reads back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{meta, pattern};
use tessera_segments::{Store, StoreOptions};

const ENTRY: usize = 40 << 10;

fn opts(dir: &std::path::Path, keep_all: bool) -> StoreOptions {
    // 64 KiB segments, one shard, a budget of two segments: a cache would evict.
    StoreOptions::new(dir)
        .with_open_segments(1)
        .with_segment_bytes(64 << 10)
        .with_max_bytes(100 << 10)
        .with_keep_all(keep_all)
}

#[test]
fn keep_all_never_evicts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let keys: Vec<Vec<u8>> = (0..6u8).map(|i| vec![b'k', i]).collect();
    {
        let store = Store::open(opts(dir, true)).unwrap();
        for (i, k) in keys.iter().enumerate() {
            let data = pattern(i as u64, ENTRY);
            store
                .append(k, &meta(&[ENTRY as i64], "|u1"), &[&data])
                .unwrap();
        }
        let stats = store.stats();
        assert_eq!(stats.evictions, 0, "{stats:?}");
        assert!(stats.total_bytes > 100 << 10, "{stats:?}");
    }
    let store = Store::open(opts(dir, true)).unwrap();
    for (i, k) in keys.iter().enumerate() {
        let entry = store.read(k).unwrap().expect("a kept entry was evicted");
        assert_eq!(&entry.body[8..8 + ENTRY], &pattern(i as u64, ENTRY)[..]);
    }
    drop(store);
    // The same directory opened as a cache is brought back to its budget.
    let cache = Store::open(opts(dir, false)).unwrap();
    assert!(cache.stats().evictions > 0);
}
