//! Eviction removes least recently used sealed segments first, and recency survives a
//! restart: a segment used in the previous session outlives older, unused ones.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{meta, pattern};
use tessera_segments::{Store, StoreOptions};

const ENTRY: usize = 40 << 10;

fn opts(dir: &std::path::Path, max_bytes: u64) -> StoreOptions {
    // 64 KiB segments and one shard: each 40 KiB entry gets a segment of its own.
    StoreOptions::new(dir)
        .with_open_segments(1)
        .with_segment_bytes(64 << 10)
        .with_max_bytes(max_bytes)
}

#[test]
fn eviction_order_survives_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let keys = [b"A", b"B", b"C", b"D"];
    let mut paths = Vec::new();
    {
        let store = Store::open(opts(dir, 1 << 30)).unwrap();
        for (i, k) in keys.iter().enumerate() {
            let data = pattern(i as u64, ENTRY);
            let loc = store
                .append(*k, &meta(&[ENTRY as i64], "|u1"), &[&data])
                .unwrap();
            paths.push(loc.segment_path);
        }
        assert_eq!(store.stats().segments, 4);
    }
    {
        // A new session uses A (the oldest) only.
        let store = Store::open(opts(dir, 1 << 30)).unwrap();
        assert!(store.locate(b"A").is_some());
    }
    // Room for two segments: B then C (least recently used) must go; A and D stay.
    let store = Store::open(opts(dir, 100 << 10)).unwrap();
    assert!(store.locate(b"A").is_some(), "recently used A was evicted");
    assert!(store.locate(b"D").is_some());
    assert_eq!(store.locate(b"B"), None);
    assert_eq!(store.locate(b"C"), None);
    assert!(
        !paths[1].exists() && !paths[2].exists(),
        "evicted files are unlinked"
    );
    assert!(paths[0].exists() && paths[3].exists());
    let stats = store.stats();
    assert!(stats.total_bytes <= 100 << 10, "{stats:?}");
    assert_eq!(stats.evictions, 2);
    assert!(stats.unlinked_bytes >= 2 * ENTRY as u64);
    let entry = store.read(b"A").unwrap().unwrap();
    assert_eq!(&entry.body[8..8 + ENTRY], &pattern(0, ENTRY)[..]);
}

#[test]
fn appends_beyond_budget_are_evicted_down_to_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let budget = 200 << 10;
    let store = Store::open(opts(dir, budget)).unwrap();
    for i in 0..20u64 {
        let data = pattern(i, ENTRY);
        store
            .append(
                format!("k{i}").as_bytes(),
                &meta(&[ENTRY as i64], "|u1"),
                &[&data],
            )
            .unwrap();
    }
    // close() finishes pending seals and a last eviction pass.
    store.close().unwrap();
    let stats = store.stats();
    assert!(stats.total_bytes <= budget, "{stats:?}");
    assert!(stats.evictions > 0);
    // The newest entry survives; the oldest is gone.
    assert!(store.locate(b"k19").is_some());
    assert_eq!(store.locate(b"k0"), None);
    let on_disk: u64 = std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert_eq!(
        on_disk, stats.total_bytes,
        "budget counts real bytes on disk"
    );
}
