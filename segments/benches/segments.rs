//! Benchmarks: append throughput (8 and 64 MiB entries, from memory and from a file range)
//! against a plain sequential write of the same bytes in the same run, locate latency, and
//! boot time for 100,000 entries (from sidecars, and by walking segments without them).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::io::Write;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tessera_segments::{EntryMeta, FileRange, Store, StoreOptions};

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

fn bench_append(c: &mut Criterion) {
    for mib in [8usize, 64] {
        let len = mib << 20;
        let data = payload(len);
        let mut g = c.benchmark_group(format!("append_{mib}MiB"));
        g.throughput(Throughput::Bytes(len as u64));
        g.sample_size(10);

        let tmp = tempfile::tempdir().unwrap();
        let store =
            Store::open(StoreOptions::new(tmp.path().join("store")).with_max_bytes(2 << 30))
                .unwrap();
        let meta = EntryMeta {
            shape: vec![len as i64],
            dtype: "|u1".to_string(),
        };
        let mut n = 0u64;
        g.bench_function("store_append", |b| {
            b.iter(|| {
                n += 1;
                let (x, y) = data.split_at(len / 2);
                black_box(store.append(&n.to_le_bytes(), &meta, &[x, y]).unwrap());
            })
        });

        // The cold-chunk path of the server: the data comes from a byte range of a source
        // file (page cache warm) with one in-kernel copy.
        let src_path = tmp.path().join("source.bin");
        std::fs::write(&src_path, &data).unwrap();
        let src = std::fs::File::open(&src_path).unwrap();
        g.bench_function("store_append_from_file", |b| {
            b.iter(|| {
                n += 1;
                let range = FileRange {
                    file: &src,
                    offset: 0,
                    len: len as u64,
                };
                black_box(
                    store
                        .append_from_file(&n.to_le_bytes(), &meta, range)
                        .unwrap(),
                );
            })
        });

        let path = tmp.path().join("plain.bin");
        let mut file = std::fs::File::create(&path).unwrap();
        let mut written = 0u64;
        g.bench_function("plain_sequential_write", |b| {
            b.iter(|| {
                if written >= 1 << 30 {
                    file = std::fs::File::create(&path).unwrap();
                    written = 0;
                }
                file.write_all(&data).unwrap();
                written += len as u64;
            })
        });
        g.finish();
    }
}

fn fill(dir: &std::path::Path, entries: u64) {
    let store = Store::open(StoreOptions::new(dir)).unwrap();
    let meta = EntryMeta {
        shape: vec![8, 8],
        dtype: "|u1".to_string(),
    };
    let data = payload(64);
    for i in 0..entries {
        store
            .append(format!("chunk-{i:08}").as_bytes(), &meta, &[&data])
            .unwrap();
    }
    store.close().unwrap();
}

fn bench_locate(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    fill(tmp.path(), 10_000);
    let store = Store::open(StoreOptions::new(tmp.path())).unwrap();
    let keys: Vec<Vec<u8>> = (0..10_000u64)
        .map(|i| format!("chunk-{:08}", (i * 7919) % 10_000).into_bytes())
        .collect();
    let mut i = 0;
    c.bench_function("locate_hit", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            black_box(store.locate(&keys[i]).unwrap());
        })
    });
    c.bench_function("locate_miss", |b| {
        b.iter(|| black_box(store.locate(b"absent-key")))
    });
}

fn bench_boot(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    fill(tmp.path(), 100_000);
    let mut g = c.benchmark_group("boot_100k_entries");
    g.sample_size(10);
    g.bench_function("from_sidecars", |b| {
        b.iter(|| {
            let store = Store::open(StoreOptions::new(tmp.path())).unwrap();
            assert_eq!(store.stats().total_entries, 100_000);
        })
    });
    g.bench_function("walk_without_sidecars", |b| {
        b.iter_batched(
            || {
                for e in std::fs::read_dir(tmp.path().join("segments")).unwrap() {
                    let p = e.unwrap().path();
                    if p.extension().is_some_and(|x| x == "idx") {
                        std::fs::remove_file(p).unwrap();
                    }
                }
            },
            |()| {
                let store = Store::open(StoreOptions::new(tmp.path())).unwrap();
                assert_eq!(store.stats().total_entries, 100_000);
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = bench_append, bench_locate, bench_boot
}
criterion_main!(benches);
