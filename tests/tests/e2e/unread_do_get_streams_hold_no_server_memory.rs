//! A client that opens many DoGet streams and never reads them cannot make the server buffer
//! their chunks: a chunk reply is a slice of the mapped segment handed to the socket, not a
//! private copy, so the server's anonymous memory stays flat while 32 streams of 4 MiB wait
//! (tonic's own encoder would have copied all 128 MiB). The server keeps serving others
//! meanwhile, and after the streams are dropped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tessera_e2e::connect::stalled_flight_service;
use tessera_e2e::process::ServerProcess;
use tessera_e2e::*;

const CHUNK: u64 = 4 << 20;
const CHUNKS: u64 = 32;
/// Streams per connection (below the server's cap of 64).
const PER_CONNECTION: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_streams_do_not_grow_server_memory() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let small = pattern(4096, 1);
    write_npy(&dir.path().join("small.npy"), "|u1", &[4096], &small);
    let big = pattern((CHUNKS * CHUNK) as usize, 2);
    write_npy(&dir.path().join("big.npy"), "|u1", &[CHUNKS, CHUNK], &big);
    let mut server = ServerProcess::serve_cached(dir.path(), cache.path(), None, "4MiB");
    let mut client = server.client().await;
    let info = client
        .get_flight_info(read_descriptor("big", None))
        .await
        .unwrap();
    let tickets: Vec<_> = info
        .endpoint
        .iter()
        .map(|e| e.ticket.clone().unwrap())
        .collect();
    assert_eq!(tickets.len(), CHUNKS as usize);
    // Warm the cache through the client that reads, so the measurement below sees replies
    // only (decoding is measured by cold_2gib_read_keeps_server_memory_bounded.rs).
    for t in &tickets[..2] {
        let batch = fetch_chunk(&mut client, t.clone()).await;
        assert_eq!(chunk_parts(&batch).0.len() as u64, CHUNK);
    }
    let before = server.anonymous_rss();

    let mut held = Vec::new();
    for (i, ticket) in tickets.iter().enumerate() {
        if i % PER_CONNECTION == 0 {
            held.push((stalled_flight_service(server.url()).await, Vec::new()));
        }
        let (conn, streams) = held.last_mut().unwrap();
        // The reply's headers arrive; its body waits for a window the client never opens.
        let stream = conn.do_get(ticket.clone()).await.unwrap().into_inner();
        streams.push(stream);
    }
    // Every reply has been produced by now (its headers came back): give the server a
    // moment to settle, then measure.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let during = server.anonymous_rss();
    let growth = during.saturating_sub(before);
    eprintln!(
        "anonymous RSS {} MiB before, {} MiB with {CHUNKS} unread streams of {} MiB",
        before >> 20,
        during >> 20,
        CHUNK >> 20
    );
    assert!(
        growth < (CHUNKS * CHUNK) / 4,
        "{CHUNKS} unread streams grew the server's private memory by {} MiB",
        growth >> 20
    );

    // Others are served meanwhile, on their own connection.
    let info = client
        .get_flight_info(read_descriptor("small", None))
        .await
        .unwrap();
    let batch = fetch_chunk(&mut client, info.endpoint[0].ticket.clone().unwrap()).await;
    assert_eq!(chunk_parts(&batch).0, small);

    // Dropping the streams (RST_STREAM) frees them; the server is fine afterwards.
    drop(held);
    let batch = fetch_chunk(&mut client, tickets[CHUNKS as usize - 1].clone()).await;
    let start = ((CHUNKS - 1) * CHUNK) as usize;
    assert!(chunk_parts(&batch).0 == big[start..], "last chunk's bytes");
    assert!(server.is_running());
    assert!(server.terminate().success());
}
