//! Appends cannot outrun eviction: with seals made slow (as on a busy disk), concurrent
//! appenders wait at the admission gate, and the cache never holds more than its budget
//! plus one segment, sampled all along.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{meta, pattern};
use tessera_segments::fault::{FaultInjector, WriteFault};
use tessera_segments::{Store, StoreOptions};

const BUDGET: u64 = 1 << 20;
/// The store caps a segment at budget / (2 × open segments).
const SEGMENT: u64 = BUDGET / 4;
const ENTRY: usize = 16 << 10;
const WRITERS: u64 = 4;
const PER_WRITER: u64 = 150;

/// Makes every fsync of the maintenance thread (the seals) take 15 ms.
#[derive(Debug)]
struct SlowSeals;

impl FaultInjector for SlowSeals {
    fn on_entry_write(&self, _: u64, _: u64, _: u64) -> Option<WriteFault> {
        None
    }

    fn on_dir_sync(&self) -> Option<std::io::Error> {
        if std::thread::current().name() == Some("tessera-segments") {
            std::thread::sleep(Duration::from_millis(15));
        }
        None
    }
}

#[test]
fn the_cache_stays_within_one_segment_of_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        Store::open(
            StoreOptions::new(dir.path())
                .with_max_bytes(BUDGET)
                .with_open_segments(2)
                .with_fault_injector(Arc::new(SlowSeals)),
        )
        .unwrap(),
    );
    let done = Arc::new(AtomicBool::new(false));
    let worst = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (store, done, worst) = (Arc::clone(&store), Arc::clone(&done), Arc::clone(&worst));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                worst.fetch_max(store.stats().total_bytes, Ordering::Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for i in 0..PER_WRITER {
                    let seed = w * 1_000_000 + i;
                    let key = format!("w{w}-e{i}");
                    store
                        .append(
                            key.as_bytes(),
                            &meta(&[ENTRY as i64], "|u1"),
                            &[&pattern(seed, ENTRY)],
                        )
                        .unwrap();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    // Closing seals the open segments and finishes eviction, so nothing moves any more while
    // the stats and the entries are checked (reads keep working after close).
    store.close().unwrap();
    let stats = store.stats();
    let worst = worst.load(Ordering::Relaxed).max(stats.total_bytes);
    eprintln!("worst total {worst} of budget {BUDGET}: {stats:?}");
    assert!(stats.evictions > 0, "the budget forced eviction: {stats:?}");
    assert!(
        stats.budget_waits > 0,
        "slow seals made appends wait: {stats:?}"
    );
    assert_eq!(stats.budget_overruns, 0, "{stats:?}");
    assert!(
        worst <= BUDGET + SEGMENT,
        "the cache held {worst} bytes, more than one segment over its {BUDGET}-byte budget"
    );
    // Whatever survived eviction reads back exactly what was appended under its key.
    let mut kept = 0;
    for w in 0..WRITERS {
        for i in 0..PER_WRITER {
            let key = format!("w{w}-e{i}");
            if let Some(entry) = store.read(key.as_bytes()).unwrap() {
                assert!(
                    entry.body[8..8 + ENTRY] == pattern(w * 1_000_000 + i, ENTRY)[..],
                    "{key}"
                );
                kept += 1;
            }
        }
    }
    assert_eq!(kept, stats.total_entries);
}
