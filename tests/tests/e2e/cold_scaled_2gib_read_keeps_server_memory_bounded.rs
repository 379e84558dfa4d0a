//! Memory regression guard for scaled reads: a cold `area` (1, 8, 8) read of a 2 GiB
//! volume over do_get reduces every scaled chunk tile by tile, so the server's anonymous
//! resident memory stays under 2 chunks + 32 MiB (48 MiB on the 8 MiB grid) although each
//! scaled chunk reduces 64 MiB of source. A server that read a chunk's whole source block
//! into memory would pass 64 MiB at the first chunk.
//!
//! The source is a sparse `|u1` file, 32 planes of 8192×8192, with a marker at the start of
//! every plane, so it costs little disk; the reduced marker is checked bit for bit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::FileExt;

use arrow_flight::Ticket;
use futures::TryStreamExt;
use tessera_e2e::process::ServerProcess;
use tessera_e2e::*;

const PLANES: u64 = 32;
const SIDE: u64 = 8192;
const MARK: usize = 4096;
const BOUND: u64 = (2 * 8 + 32) << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_area_read_of_2gib_stays_under_two_chunks_and_32mib_anonymous() {
    let sources = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let path = sources.path().join("vol.npy");
    write_npy(&path, "|u1", &[PLANES, SIDE, SIDE], &[]);
    let header = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(header + PLANES * SIDE * SIDE).unwrap();
    for z in 0..PLANES {
        file.write_all_at(&pattern(MARK, z), header + z * SIDE * SIDE)
            .unwrap();
    }
    drop(file);

    let server = ServerProcess::serve_cached(sources.path(), cache.path(), Some("512MiB"), "8MiB");
    let mut client = server.client().await;
    let info = client
        .get_flight_info(scaled_descriptor("vol", &[1, 8, 8], "area"))
        .await
        .unwrap();
    let chunks = endpoint_bounds(&info);
    assert_eq!(chunks.len() as u64, PLANES, "one scaled chunk per plane");
    let baseline = server.anonymous_rss();
    let mut peak = baseline;
    for group in chunks.chunks(4) {
        let mut reads = Vec::new();
        for (start, _, ticket) in group {
            let mut c = server.client().await;
            let (z, ticket): (u64, Ticket) = (start[0] as u64, ticket.clone());
            reads.push(tokio::spawn(async move {
                let frames: Vec<_> = c.do_get(ticket).await.unwrap().try_collect().await.unwrap();
                let (bytes, shape, _) = chunk_parts(&frames[0]);
                assert_eq!(shape, vec![1, 1024, 1024]);
                // Row 0 of the plane holds the marker: block j of it averages 8 marker bytes
                // and 56 zeros, rounded half to even.
                let marker = pattern(MARK, z);
                for j in 0..1024 {
                    let sum: u32 = if j < MARK / 8 {
                        marker[8 * j..8 * j + 8].iter().map(|&b| u32::from(b)).sum()
                    } else {
                        0
                    };
                    let want = (f64::from(sum) / 64.0).round_ties_even() as u8;
                    assert_eq!(bytes[j], want, "plane {z} column {j}");
                }
                assert!(bytes[1024..].iter().all(|&b| b == 0), "plane {z} body");
            }));
        }
        peak = peak.max(server.anonymous_rss());
        for r in reads {
            r.await.unwrap();
        }
        peak = peak.max(server.anonymous_rss());
    }
    eprintln!(
        "2 GiB cold area (1,8,8): anonymous RSS baseline {} MiB, peak {} MiB",
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
