//! A client walking a tensor's chunks in grid order gets the next chunks decoded before it
//! asks (read-ahead); a client jumping around does not, and read-ahead can be turned off.
//! Chunks decoded ahead are served from the cache with the source's exact bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use arrow_flight::{FlightClient, Ticket};
use tessera_e2e::*;
use tessera_server::config::Size;

/// 10 planes of 64 KiB: one chunk per plane at a 64 KiB target, on either grid.
const SHAPE: [u64; 3] = [10, 64, 1024];
const PLANE: u64 = 64 * 1024;

async fn plan(server: &TestServer, client: &mut FlightClient) -> Vec<Ticket> {
    let info = client
        .get_flight_info(read_descriptor("vol", None))
        .await
        .unwrap();
    server.assert_planned_on_its_grid(&info);
    let bounds = endpoint_bounds(&info);
    assert_eq!(bounds.len(), SHAPE[0] as usize, "one chunk per plane");
    for (i, (start, _, _)) in bounds.iter().enumerate() {
        assert_eq!(start[0], i as i64, "endpoints in grid order");
    }
    bounds.into_iter().map(|(_, _, ticket)| ticket).collect()
}

/// A reader of the 10-plane volume on a fresh server with `read_ahead` bytes of read-ahead.
struct Reader {
    server: TestServer,
    client: FlightClient,
    tickets: Vec<Ticket>,
    data: Vec<u8>,
    _dir: tempfile::TempDir,
}

impl Reader {
    async fn start(grid: Grid, read_ahead: u64) -> Reader {
        let dir = tempfile::tempdir().unwrap();
        let data = pattern((SHAPE.iter().product::<u64>()) as usize, 11);
        let path = dir.path().join("vol.npy");
        write_npy(&path, "|u1", &SHAPE, &data);
        let server = TestServer::start_on(grid, vec![path], |c| {
            c.chunks.chunk_target = Size::bytes(grid.chunk_target_for(PLANE));
            c.chunks.read_ahead = Size::bytes(read_ahead);
        })
        .await;
        let mut client = server.client().await;
        let tickets = plan(&server, &mut client).await;
        // A cold plan starts decoding its two end cells (0 and 9) before any request
        // (tests/tests/e2e/cold_plans_decode_their_ends.rs); the walks below start after.
        if read_ahead > 0 {
            let s = wait_for_entries(&mut client, 2).await;
            assert_eq!(s["read_aheads"], 2, "{s}");
        }
        Reader {
            server,
            client,
            tickets,
            data,
            _dir: dir,
        }
    }

    /// Fetches chunk `i` over do_get and checks its bytes against the source.
    async fn fetch(&mut self, i: usize) {
        let batch = fetch_chunk(&mut self.client, self.tickets[i].clone()).await;
        let (bytes, shape, _) = chunk_parts(&batch);
        assert_eq!(shape, [1, 64, 1024]);
        let start = i * PLANE as usize;
        assert!(
            bytes == self.data[start..start + PLANE as usize],
            "chunk {i} differs from the source"
        );
    }

    async fn stats(&mut self) -> serde_json::Value {
        cache_stats(&mut self.client).await
    }
}

async fn sequential_requests_decode_the_next_chunks_ahead(grid: Grid) {
    let mut r = Reader::start(grid, 3 * PLANE).await;

    // Cell 0 (decoded by the plan) starts a read from the beginning: cells 1..=3 are
    // decoded ahead.
    r.fetch(0).await;
    assert_eq!(r.stats().await["read_aheads"], 2 + 3);
    wait_for_entries(&mut r.client, 2 + 3).await;

    // A jump to cell 6 (cells 5 and 7 not cached): nothing ahead.
    r.fetch(6).await;
    assert_eq!(r.stats().await["read_aheads"], 2 + 3, "random access");
    wait_for_entries(&mut r.client, 2 + 4).await;

    // chunk_locate of cell 4 follows cached cell 3: cells 5 and 7 are decoded ahead
    // (6 is cached already).
    let ticket = r.tickets[4].ticket.to_vec();
    let located = action_json(&mut r.client, "chunk_locate", ticket).await;
    assert_eq!(located["available"], true, "{located}");
    assert_eq!(r.stats().await["read_aheads"], 2 + 5);
    let before = wait_for_entries(&mut r.client, 2 + 7).await;

    // Every chunk decoded ahead is a cache hit with the source's bytes.
    for i in [0, 1, 2, 3, 5, 7, 9] {
        r.fetch(i).await;
    }
    let after = r.stats().await;
    assert_eq!(after["misses"], before["misses"], "{before} -> {after}");
    r.server.stop().await;
}

async fn read_ahead_zero_decodes_only_what_is_asked(grid: Grid) {
    let mut r = Reader::start(grid, 0).await;
    for i in 0..3 {
        r.fetch(i).await;
    }
    // Give a (wrongly) spawned decode time to land before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = r.stats().await;
    assert_eq!(s["read_aheads"], 0, "{s}");
    assert_eq!(s["total_entries"], 3, "{s}");
    r.server.stop().await;
}

async fn a_read_from_the_last_chunk_decodes_backward(grid: Grid) {
    // dask schedules an array's blocks from the last one: read-ahead follows it down.
    let mut r = Reader::start(grid, 3 * PLANE).await;
    r.fetch(9).await;
    assert_eq!(r.stats().await["read_aheads"], 2 + 3);
    let before = wait_for_entries(&mut r.client, 2 + 3).await;
    for i in [8, 7, 6] {
        r.fetch(i).await;
    }
    let after = r.stats().await;
    assert_eq!(after["misses"], before["misses"], "{before} -> {after}");
    r.server.stop().await;
}

on_both_grids!(
    sequential_requests_decode_the_next_chunks_ahead,
    read_ahead_zero_decodes_only_what_is_asked,
    a_read_from_the_last_chunk_decodes_backward
);
