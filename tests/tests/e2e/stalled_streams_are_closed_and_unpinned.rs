//! Peers that open DoGet streams and stop reading (64 KiB windows they never reopen, pings
//! still answered) cannot pin chunks past the caps: once their replies stall, connections over
//! the per-connection or total cap of unread bytes are closed, and so is any connection whose
//! reply makes no progress for the stream idle timeout. Their pins go (no evicted segment
//! stays mapped, the ledger is back to zero), their calls fail, and a reading client is served
//! exact bytes throughout. Before the ledger, 512 evicted segments (4 GiB) stayed pinned
//! against a 64 MiB budget (issue 14).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use arrow_flight::Ticket;
use arrow_flight::flight_service_client::FlightServiceClient;
use tessera_e2e::connect::stalled_flight_service;
use tessera_e2e::process::ServerProcess;
use tessera_e2e::*;
use tonic::transport::Channel;

const CHUNK: u64 = 4 << 20;
const CHUNKS: u64 = 24;
/// A reply's body: the chunk's bytes and its IPC framing (well under a page).
const REPLY: u64 = CHUNK + 4096;

/// Mappings of unlinked files (evicted segments) the server still holds.
fn deleted_mappings(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter(|l| l.ends_with("(deleted)"))
        .count()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

struct Setup {
    server: ServerProcess,
    tickets: Vec<Ticket>,
    data: Vec<u8>,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

/// A 96 MiB source of 4 MiB chunks behind a 16 MiB file cache, so most replies below hold
/// segments that eviction already unlinked.
async fn setup(extra: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let data = pattern((CHUNKS * CHUNK) as usize, 5);
    write_npy(&dir.path().join("big.npy"), "|u1", &[CHUNKS, CHUNK], &data);
    let mut args = vec![
        dir.path().to_str().unwrap(),
        "--cache-dir",
        cache.path().to_str().unwrap(),
        "--cache-max-bytes",
        "16MiB",
        "--chunk-target",
        "4MiB",
    ];
    args.extend_from_slice(extra);
    let server = ServerProcess::spawn(&args);
    let mut client = server.client().await;
    let tickets: Vec<Ticket> = planned_chunks(&mut client, "big")
        .await
        .into_iter()
        .map(|(_, _, ticket)| ticket)
        .collect();
    assert_eq!(tickets.len(), CHUNKS as usize);
    Setup {
        server,
        tickets,
        data,
        _dirs: (dir, cache),
    }
}

async fn stats(server: &ServerProcess) -> serde_json::Value {
    let mut client = server.client().await;
    action_json(&mut client, "cache_stats", Vec::new()).await
}

/// Opens one stalled connection with a DoGet of each ticket; the replies' headers arrive,
/// their bodies wait for windows that never open.
async fn stall(
    server: &ServerProcess,
    tickets: &[Ticket],
) -> (
    FlightServiceClient<Channel>,
    Vec<tonic::Streaming<arrow_flight::FlightData>>,
) {
    let mut conn = stalled_flight_service(server.url()).await;
    let mut streams = Vec::new();
    for t in tickets {
        streams.push(conn.do_get(t.clone()).await.unwrap().into_inner());
    }
    (conn, streams)
}

/// Polls `cache_stats` until `done` holds or `wait` passes; the last stats.
async fn wait_for(
    server: &ServerProcess,
    wait: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + wait;
    loop {
        let s = stats(server).await;
        if done(&s) || Instant::now() > deadline {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Every stream of a closed connection ends in an error, promptly.
async fn all_fail(streams: Vec<tonic::Streaming<arrow_flight::FlightData>>) {
    for mut stream in streams {
        let outcome = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match stream.message().await {
                    Ok(Some(_)) => continue,
                    other => return other,
                }
            }
        })
        .await
        .expect("a stream of a closed connection ends");
        let status = outcome.expect_err("a stalled stream cannot complete once closed");
        assert!(
            matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Internal
            ),
            "{status}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_the_caps_stalled_connections_are_closed() {
    let Setup {
        mut server,
        tickets,
        data,
        _dirs,
    } = setup(&[
        "--max-pinned",
        "32MiB",
        "--max-pinned-per-connection",
        "24MiB",
        "--stream-idle-timeout",
        "600s",
    ])
    .await;
    let pid = server.pid();
    let fds_before = open_fds(pid);

    // Connection A: 8 replies, 32 MiB, over its own cap of 24 MiB.
    let (_a, a_streams) = stall(&server, &tickets[0..8]).await;
    // Connections B and C: 5 replies each (20 MiB, under the per-connection cap), together
    // with A over the total cap of 32 MiB.
    let (_b, b_streams) = stall(&server, &tickets[8..13]).await;
    let (_c, c_streams) = stall(&server, &tickets[13..18]).await;
    let held = stats(&server).await;
    eprintln!(
        "held right after opening: {} MiB, {} evicted segments mapped",
        held["pinned_bytes"].as_u64().unwrap() >> 20,
        deleted_mappings(pid)
    );

    // Stalled for a few seconds: A (over its cap) and then the longest stalled of B and C
    // (over the total cap) are closed; the survivor's replies fit the total cap.
    let after = wait_for(&server, Duration::from_secs(15), |s| {
        s["stalled_connections_closed"].as_u64().unwrap() >= 2
            && s["pinned_bytes"].as_u64().unwrap() <= 32 << 20
    })
    .await;
    let pinned = after["pinned_bytes"].as_u64().unwrap();
    assert!(
        after["stalled_connections_closed"].as_u64().unwrap() >= 2,
        "connections over the caps were closed: {after}"
    );
    assert!(
        pinned <= 32 << 20,
        "unread replies hold {pinned} bytes, over the 32 MiB cap"
    );
    assert!(
        pinned <= 5 * REPLY,
        "at most one connection of 5 replies is left holding them ({pinned} bytes)"
    );
    all_fail(a_streams).await;
    let log = server.log().join("\n");
    assert!(
        log.contains("per-connection cap"),
        "the log says why A was closed:\n{log}"
    );

    // A reading client is served exact bytes meanwhile.
    let mut client = server.client().await;
    for i in [0usize, 9, 23] {
        let (bytes, _, _) = chunk_parts(&fetch_chunk(&mut client, tickets[i].clone()).await);
        let start = i * CHUNK as usize;
        assert!(bytes == data[start..start + CHUNK as usize], "chunk {i}");
    }

    // Everything the stalled peers held is let go once all are gone.
    drop((b_streams, c_streams));
    let done = wait_for(&server, Duration::from_secs(10), |s| {
        s["pinned_bytes"].as_u64().unwrap() == 0
    })
    .await;
    assert_eq!(done["pinned_bytes"].as_u64().unwrap(), 0, "{done}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while deleted_mappings(pid) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        deleted_mappings(pid),
        0,
        "no evicted segment stays mapped once its readers are gone"
    );
    assert!(
        open_fds(pid) <= fds_before + 4,
        "descriptors: {} before, {} after",
        fds_before,
        open_fds(pid)
    );
    assert!(server.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_idle_past_the_timeout_closes_its_connection() {
    let Setup {
        mut server,
        tickets,
        _dirs,
        ..
    } = setup(&["--stream-idle-timeout", "3s"]).await;
    // Far under both default caps: only the idle timeout can close it.
    let (_conn, streams) = stall(&server, &tickets[0..2]).await;
    let started = Instant::now();
    let early = stats(&server).await;
    assert_eq!(early["stalled_connections_closed"].as_u64().unwrap(), 0);
    let held = early["pinned_bytes"].as_u64().unwrap();
    assert!(
        (2 * CHUNK..=2 * REPLY).contains(&held),
        "two unread replies hold {held} bytes"
    );

    let after = wait_for(&server, Duration::from_secs(15), |s| {
        s["stalled_connections_closed"].as_u64().unwrap() == 1
            && s["pinned_bytes"].as_u64().unwrap() == 0
    })
    .await;
    let took = started.elapsed();
    assert_eq!(after["stalled_connections_closed"].as_u64().unwrap(), 1);
    assert_eq!(after["pinned_bytes"].as_u64().unwrap(), 0);
    assert!(
        took >= Duration::from_secs(2),
        "closed after {took:?}, before the 3 s idle timeout"
    );
    all_fail(streams).await;
    assert!(server.log().join("\n").contains("stream idle timeout"));
    assert!(server.terminate().success());
}
