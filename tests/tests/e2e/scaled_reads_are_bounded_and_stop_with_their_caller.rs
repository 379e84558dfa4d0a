//! Scaled `area` reads whose factors span huge blocks of the source (issue 28, item 1): the
//! server reduces them piece by piece in bounded memory, stops computing when the caller
//! is gone, and bounds what all scaled decodes together hold (`--max-scaled-decode-memory`).
//!
//! The sources are sparse `.npy` files (a header, then `ftruncate` to full size: zeros
//! that cost no disk). The server is a child process; its peak resident memory is its
//! `VmHWM` from `/proc/PID/status`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use tessera_e2e::process::{ServerProcess, cpu_ticks, status_bytes};
use tessera_e2e::*;

/// Peak memory a server may reach serving one of these reads: its own baseline (under
/// 64 MiB in a debug build) plus one decode (output chunk, a 4 MiB piece, 4 MiB of sums).
const PEAK_BOUND: u64 = 160 << 20;

/// A sparse `|u1`/`<u2` source of `shape`: the header, then zeros to the full size.
fn sparse_npy(path: &Path, descr: &str, shape: &[u64], itemsize: u64) -> u64 {
    write_npy(path, descr, shape, &[]);
    let header = std::fs::metadata(path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.set_len(header + shape.iter().product::<u64>() * itemsize)
        .unwrap();
    header
}

/// A (2^19, 2^19) u8 tensor averaged to one element: the whole 256 GiB is one block. The
/// read cannot finish before its deadline; the server must neither allocate the block
/// (it aborted: "memory allocation of 274877906944 bytes failed") nor go on computing once
/// the call is gone, and must keep serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_element_of_a_256gib_tensor_is_bounded_and_stops_with_its_caller() {
    const SIDE: u64 = 1 << 19;
    let sources = tempfile::tempdir().unwrap();
    sparse_npy(&sources.path().join("big.npy"), "|u1", &[SIDE, SIDE], 1);
    let cache = tempfile::tempdir().unwrap();
    let server = ServerProcess::spawn(&[
        sources.path().as_os_str(),
        "--cache-dir".as_ref(),
        cache.path().as_os_str(),
    ]);
    let mut client = server.client().await;
    let side = SIDE as i64;
    let info = client
        .get_flight_info(scaled_descriptor("big", &[side, side], "area"))
        .await
        .unwrap();
    let chunks = endpoint_bounds(&info);
    assert_eq!(chunks.len(), 1, "one scaled chunk: the whole tensor's mean");
    let ticket = chunks[0].2.clone();

    // The call's own deadline (grpc-timeout) ends it while the decode runs.
    let mut reader = server.client().await;
    reader.add_header("grpc-timeout", "4S").unwrap();
    let started = Instant::now();
    let answer = match reader.do_get(ticket).await {
        Ok(stream) => stream.try_collect::<Vec<_>>().await.map(|_| ()),
        Err(err) => Err(err),
    };
    assert!(answer.is_err(), "a 256 GiB reduction cannot finish in 4 s");
    eprintln!("answered after {:?}: {:?}", started.elapsed(), answer.err());
    let mut server = server;
    assert!(server.is_running(), "the server died: {:#?}", server.log());

    // The decode stops with its caller: the process goes quiet.
    let quiet = Duration::from_secs(3);
    let mut idle = false;
    for _ in 0..10 {
        let before = cpu_ticks(server.pid());
        tokio::time::sleep(quiet).await;
        let used = cpu_ticks(server.pid()) - before;
        // 100 ticks a second: under a tenth of a core over the window.
        if used < 30 {
            idle = true;
            break;
        }
    }
    assert!(idle, "the server kept computing after the call was gone");

    let peak = status_bytes(server.pid(), "VmHWM:");
    eprintln!(
        "(2^19, 2^19) u8 at [2^19, 2^19]: peak RSS {} MiB",
        peak >> 20
    );
    assert!(
        peak < PEAK_BOUND,
        "peak RSS {} MiB (bound {} MiB)",
        peak >> 20,
        PEAK_BOUND >> 20
    );
    // Still serving: a plan answers.
    client
        .get_flight_info(scaled_descriptor("big", &[side, side], "nearest"))
        .await
        .unwrap();
}

/// A z-mean `[256, 1, 1]` of a (256, 1024, 16384) u16 stack: each output averages 256
/// planes, so one scaled chunk (1, 32, 16384) spans 256 MiB of source. It is computed in
/// many pieces of a few planes each, whose sums are carried from piece to piece: the bytes
/// are the means of the marked first rows, and the server's peak stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_z_mean_of_a_stack_is_summed_in_bounded_pieces() {
    const PLANES: u64 = 256;
    const ROWS: u64 = 1024;
    const SIDE: u64 = 16384;
    let sources = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let path = sources.path().join("stack.npy");
    let header = sparse_npy(&path, "<u2", &[PLANES, ROWS, SIDE], 2);
    // Row 0 of every plane carries a marker; the rest are zeros.
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let markers: Vec<Vec<u8>> = (0..PLANES).map(|z| pattern(2 * SIDE as usize, z)).collect();
    for (z, marker) in markers.iter().enumerate() {
        file.write_all_at(marker, header + z as u64 * ROWS * SIDE * 2)
            .unwrap();
    }
    drop(file);
    let server = ServerProcess::serve_cached(sources.path(), cache.path(), None, "1MiB");
    let mut client = server.client().await;
    let info = client
        .get_flight_info(scaled_descriptor("stack", &[PLANES as i64, 1, 1], "area"))
        .await
        .unwrap();
    let chunks = endpoint_bounds(&info);
    let (start, _, ticket) = chunks
        .iter()
        .find(|(start, _, _)| start.iter().all(|&s| s == 0))
        .expect("the first chunk")
        .clone();
    assert_eq!(start, vec![0, 0, 0]);
    let frames: Vec<_> = client
        .do_get(ticket)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let (bytes, shape, _) = chunk_parts(&frames[0]);
    assert_eq!(shape[0], 1);
    assert_eq!(shape[2], SIDE as i64, "whole rows: {shape:?}");
    // Column j of row 0: the mean of the 256 markers' element j, rounded half to even.
    for j in 0..SIDE as usize {
        let sum: u64 = markers
            .iter()
            .map(|m| u64::from(u16::from_le_bytes([m[2 * j], m[2 * j + 1]])))
            .sum();
        let want = (sum as f64 / PLANES as f64).round_ties_even() as u16;
        let got = u16::from_le_bytes([bytes[2 * j], bytes[2 * j + 1]]);
        assert_eq!(got, want, "column {j}");
    }
    assert!(
        bytes[2 * SIDE as usize..].iter().all(|&b| b == 0),
        "rows past the first"
    );
    let peak = status_bytes(server.pid(), "VmHWM:");
    eprintln!(
        "z-mean [256,1,1] of (256, 1024, 16384) u16, chunk {shape:?}: peak RSS {} MiB",
        peak >> 20
    );
    assert!(
        peak < PEAK_BOUND,
        "peak RSS {} MiB (bound {} MiB)",
        peak >> 20,
        PEAK_BOUND >> 20
    );
}

/// A scaled chunk that alone needs more than `--max-scaled-decode-memory` is refused
/// UNAVAILABLE, naming the limit; a full-resolution read is not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scaled_chunk_over_the_decode_budget_is_refused_naming_it() {
    let sources = tempfile::tempdir().unwrap();
    sparse_npy(&sources.path().join("v.npy"), "|u1", &[8, 4096, 4096], 1);
    let cache = tempfile::tempdir().unwrap();
    let server = ServerProcess::spawn(&[
        sources.path().as_os_str(),
        "--cache-dir".as_ref(),
        cache.path().as_os_str(),
        "--chunk-target".as_ref(),
        "16MiB".as_ref(),
        "--max-scaled-decode-memory".as_ref(),
        "16MiB".as_ref(),
    ]);
    let mut client = server.client().await;
    let info = client
        .get_flight_info(scaled_descriptor("v", &[2, 1, 1], "area"))
        .await
        .unwrap();
    let (_, _, ticket) = endpoint_bounds(&info)[0].clone();
    let err = match client.do_get(ticket).await {
        Ok(stream) => stream.try_collect::<Vec<_>>().await.unwrap_err(),
        Err(err) => err,
    };
    let status = status_of(err);
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("--max-scaled-decode-memory")
            && status.message().contains("16 MiB"),
        "{}",
        status.message()
    );
    let info = client
        .get_flight_info(read_descriptor("v", None))
        .await
        .unwrap();
    let (_, _, ticket) = endpoint_bounds(&info)[0].clone();
    let frames: Vec<_> = client
        .do_get(ticket)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(!frames.is_empty());
}

/// `reduction_method='linear'` (deprecated, read as `area`) is logged once per window,
/// however often old clients send it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deprecated_method_is_warned_about_once_not_per_request() {
    let sources = tempfile::tempdir().unwrap();
    write_npy(
        &sources.path().join("s.npy"),
        "|u1",
        &[8, 8],
        &pattern(64, 3),
    );
    let cache = tempfile::tempdir().unwrap();
    let server = ServerProcess::spawn(&[
        sources.path().as_os_str(),
        "--cache-dir".as_ref(),
        cache.path().as_os_str(),
    ]);
    let mut client = server.client().await;
    for _ in 0..5 {
        client
            .get_flight_info(scaled_descriptor("s", &[2, 2], "linear"))
            .await
            .unwrap();
    }
    assert_eq!(
        server.log_count("'linear' is deprecated"),
        1,
        "{:#?}",
        server.log()
    );
}
