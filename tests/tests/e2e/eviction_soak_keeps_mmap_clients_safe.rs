//! Bounded soak: several Python biopb client processes read random slices through the mmap
//! fast path while a tiny cache budget forces constant eviction. No client dies (SIGBUS would
//! kill it with signal 7), no client sees a wrong byte, and the cache stays within its budget
//! plus one segment (appends wait for eviction beyond that), sampled through `cache_stats`
//! all along.
//!
//! Runs on both grids (the coarse one is what mapping clients get from a daemon), 30 s each by
//! default; set `TESSERA_SOAK_SECONDS` to soak longer. Skips with a message
//! when the interop venv (.venv with biopb, numpy, pyarrow) is missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tessera_e2e::process::{ServerProcess, have_python_venv, workspace_root};
use tessera_e2e::*;

const CLIENTS: u64 = 3;
const BUDGET: u64 = 8 << 20;
/// The store caps a segment at a quarter of the budget with two open segments
/// (segments/src/store.rs).
const SEGMENT: u64 = BUDGET / 4;

async fn constant_eviction_under_mmap_readers(grid: Grid) {
    let Some(python) = have_python_venv() else {
        skip_unless_ci(
            "eviction soak: no Python venv with biopb, numpy and pyarrow (run ./run-tests \
             once, or set TESSERA_PYTHON)",
        );
        return;
    };
    let seconds: u64 = std::env::var("TESSERA_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let sources = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    // 40 MiB of sources against an 8 MiB budget: most reads are cold, most segments short-lived.
    for (i, (descr, shape, itemsize)) in [
        ("<u2", vec![512u64, 4096], 2usize),
        ("<f4", vec![64, 128, 256], 4),
        ("|u1", vec![3000, 3000], 1),
        ("<i8", vec![1024, 1024], 8),
    ]
    .into_iter()
    .enumerate()
    {
        let n = shape.iter().product::<u64>() as usize * itemsize;
        let mut bytes = pattern(n, 500 + i as u64);
        if descr == "<f4" {
            // Finite floats, so numpy's equality compares every value.
            for v in bytes.chunks_mut(4) {
                v[3] &= 0x3f;
            }
        }
        write_npy(
            &sources.path().join(format!("s{i}.npy")),
            descr,
            &shape,
            &bytes,
        );
    }
    let mut args = vec![
        sources.path().as_os_str().to_owned(),
        "--cache-dir".into(),
        cache.path().as_os_str().to_owned(),
        "--cache-max-bytes".into(),
        BUDGET.to_string().into(),
    ];
    args.extend(grid.serve_flags(256 << 10));
    let server = ServerProcess::spawn(&args);
    let script = workspace_root().join("tests/interop/soak_client.py");
    let location = format!("grpc://{}", server.addr);
    let mut clients: Vec<_> = (0..CLIENTS)
        .map(|seed| {
            Command::new(&python)
                .arg(&script)
                .arg(&location)
                .arg(sources.path())
                .arg(seconds.to_string())
                .arg(seed.to_string())
                .env_remove("BIOPB_CACHEFILE_TRANSFER_DISABLED")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();

    // Sample the cache's own accounting all along.
    let mut client = server.client().await;
    let mut samples = 0u64;
    let mut worst = 0u64;
    let deadline = Instant::now() + Duration::from_secs(seconds + 120);
    while clients.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
        assert!(Instant::now() < deadline, "soak clients did not finish");
        let stats = action_json(&mut client, "cache_stats", Vec::new()).await;
        assert_eq!(stats["max_bytes"], BUDGET);
        worst = worst.max(stats["total_bytes"].as_u64().unwrap());
        samples += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut reads = 0u64;
    for (i, c) in clients.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "soak client {i} failed ({:?}; signal 7 is SIGBUS):\n{stderr}",
            out.status
        );
        let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        reads += line["reads"].as_u64().unwrap();
    }
    let stats = action_json(&mut client, "cache_stats", Vec::new()).await;
    eprintln!(
        "soak {seconds}s: {reads} reads, {samples} samples, worst total_bytes {} KiB of {} KiB; {stats}",
        worst >> 10,
        BUDGET >> 10
    );
    assert!(reads >= CLIENTS, "every client read something");
    assert!(
        stats["locates"].as_u64().unwrap() > 0,
        "clients used the mmap path"
    );
    assert!(
        stats["evictions"].as_u64().unwrap() > 0,
        "the budget forced eviction"
    );
    assert_eq!(stats["budget_overruns"], 0, "eviction stalled: {stats}");
    assert!(
        worst <= BUDGET + SEGMENT,
        "cache grew to {worst} bytes, more than one segment over its {BUDGET}-byte budget"
    );
    assert!(
        server.log_count("ERROR") == 0,
        "{}",
        server.log().join("\n")
    );
}

on_both_grids!(constant_eviction_under_mmap_readers);
