//! Memory regression guard: reading a 2 GiB tensor cold over do_get keeps the server's
//! anonymous resident memory (heap and private copies; /proc/PID/smaps_rollup `Anonymous`)
//! under 128 MiB, a generous bound: the measured peak is 22 MiB, 5 at rest plus the pooled
//! decode buffers, one 8 MiB chunk per decoder (decision 0009; benches/run.py holds the real
//! target, ≤ 2 chunks + 32 MiB). The segment and source pages it maps are page cache, not
//! counted. It catches a server that starts copying or buffering chunks per reply.
//!
//! About 30 s alone on 2 cores, nearly 3 min inside a fresh-clone CI run (the slowest test).
//! The source is a sparse file with a marker at the start of every
//! row, so it costs little disk; the cache budget is 512 MiB.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::FileExt;

use arrow_flight::Ticket;
use futures::TryStreamExt;
use tessera_e2e::process::ServerProcess;
use tessera_e2e::*;

const ROWS: u64 = 256;
const ROW: u64 = 8 << 20;
const MARK: usize = 4096;
const BOUND: u64 = 128 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_read_of_2gib_stays_under_128mib_anonymous() {
    let sources = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let path = sources.path().join("big.npy");
    write_npy(&path, "|u1", &[ROWS, ROW], &[]);
    let header = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(header + ROWS * ROW).unwrap();
    for r in 0..ROWS {
        file.write_all_at(&pattern(MARK, r), header + r * ROW)
            .unwrap();
    }
    drop(file);

    let server = ServerProcess::serve_cached(sources.path(), cache.path(), Some("512MiB"), "8MiB");
    let mut client = server.client().await;
    let chunks = planned_chunks(&mut client, "big").await;
    assert_eq!(chunks.len() as u64, ROWS, "one chunk per 8 MiB row");
    let baseline = server.anonymous_rss();
    let mut peak = baseline;
    // Four readers at a time, like a client pool.
    for group in chunks.chunks(4) {
        let mut reads = Vec::new();
        for (start, _, ticket) in group {
            let mut c = server.client().await;
            let (row, ticket): (u64, Ticket) = (start[0] as u64, ticket.clone());
            reads.push(tokio::spawn(async move {
                let frames: Vec<_> = c.do_get(ticket).await.unwrap().try_collect().await.unwrap();
                let (bytes, _, _) = chunk_parts(&frames[0]);
                assert_eq!(bytes.len() as u64, ROW);
                assert_eq!(&bytes[..MARK], &pattern(MARK, row)[..], "row {row} marker");
                assert!(bytes[MARK..].iter().all(|&b| b == 0), "row {row} body");
            }));
        }
        peak = peak.max(server.anonymous_rss());
        for r in reads {
            r.await.unwrap();
        }
        peak = peak.max(server.anonymous_rss());
    }
    eprintln!(
        "2 GiB cold: anonymous RSS baseline {} MiB, peak {} MiB",
        baseline >> 20,
        peak >> 20
    );
    assert!(
        peak < BOUND,
        "server anonymous RSS reached {} MiB (bound {} MiB)",
        peak >> 20,
        BOUND >> 20
    );
}
