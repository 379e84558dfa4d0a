//! A cell whose bytes the cache already holds in chunks of the tensor's other grid is written
//! from those chunks, not read from the source again (docs/decisions/0024), both ways: fine
//! cells for socket readers out of the coarse chunks a mapping client left, and coarse cells
//! for a mapping client out of fine chunks socket readers left, including cells that
//! straddle two chunks of the other grid. Every cell reads back with the source's bytes, over
//! DoGet and through `chunk_locate`, and `cache_stats.recuts` counts the cells cut.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use arrow_flight::FlightClient;
use tessera_e2e::located::{Located, decode_located};
use tessera_e2e::*;
use tessera_server::LoopbackPlans;
use tessera_server::config::Size;

/// 30 rows of 1,000 bytes.
const SHAPE: [u64; 2] = [30, 1000];

/// A server on `source` whose loopback plans are pinned to `plans`, with 3-row fine cells and
/// 5-row coarse ones (every third fine cell straddles two coarse cells), caching in `cache`.
async fn start(source: &Path, cache: PathBuf, plans: LoopbackPlans) -> TestServer {
    TestServer::start_with(vec![source.to_path_buf()], |c| {
        c.chunks.chunk_target = Size::bytes(3000);
        c.chunks.mapped_chunk_target = Size::bytes(5000);
        c.chunks.loopback_plans = plans;
        c.cache.dir = cache;
    })
    .await
}

/// Plans the whole tensor: every cell's bounds and ticket.
async fn plan(client: &mut FlightClient) -> Vec<(Vec<u64>, Vec<u64>, arrow_flight::Ticket)> {
    endpoint_bounds(
        &client
            .get_flight_info(read_descriptor("t", None))
            .await
            .unwrap(),
    )
    .into_iter()
    .map(|(start, stop, ticket)| {
        let to_u64 = |v: Vec<i64>| v.into_iter().map(|x| x as u64).collect::<Vec<_>>();
        (to_u64(start), to_u64(stop), ticket)
    })
    .collect()
}

/// Reads every cell of a fresh plan: `by_locate` through `chunk_locate` and the segment
/// file, otherwise over DoGet; each must equal the source. Returns the number of cells.
async fn read_all(client: &mut FlightClient, data: &[u8], by_locate: bool) -> usize {
    let cells = plan(client).await;
    for (start, stop, ticket) in &cells {
        let bytes = if by_locate {
            let v = action_json(client, "chunk_locate", ticket.ticket.to_vec()).await;
            let located = Located::from_json(&v).expect("the file cache locates the cell");
            let segment = std::fs::read(&located.path).unwrap();
            chunk_parts(&decode_located(&segment, &located)).0
        } else {
            chunk_parts(&fetch_chunk(client, ticket.clone()).await).0
        };
        assert!(
            bytes == region_bytes(data, &SHAPE, 1, start, stop),
            "cell {start:?}..{stop:?} differs from the source"
        );
    }
    cells.len()
}

/// Reads the tensor through the grid of `first` on one server, then through the grid of
/// `second` on a new server over the same cache; returns the second server's stats and its
/// cell count.
async fn read_then_read_again(
    first: LoopbackPlans,
    second: LoopbackPlans,
) -> (serde_json::Value, usize) {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("t.npy");
    let data = pattern((SHAPE[0] * SHAPE[1]) as usize, 7);
    write_npy(&source, "|u1", &SHAPE, &data);
    let cache = dir.path().join("cache");

    let server = start(&source, cache.clone(), first).await;
    let mut client = server.client().await;
    read_all(&mut client, &data, first == LoopbackPlans::Mapped).await;
    assert_eq!(cache_stats(&mut client).await["recuts"], 0);
    server.stop().await;

    let server = start(&source, cache, second).await;
    let mut client = server.client().await;
    if second == LoopbackPlans::Socket {
        // A loopback socket reader of a tensor cached only on the coarse grid is planned
        // coarse while the fine cells are filled in the background (decision 0023); the
        // fill is what cuts them. Its plans are fine once they are in.
        assert_eq!(
            plan(&mut client).await.len(),
            6,
            "served from the coarse cache first"
        );
        wait_for_entries(&mut client, 6 + 10).await;
    }
    let cells = read_all(&mut client, &data, second == LoopbackPlans::Mapped).await;
    // Read again: every cell is a hit now, with the same bytes.
    let before = cache_stats(&mut client).await;
    read_all(&mut client, &data, second == LoopbackPlans::Mapped).await;
    let after = cache_stats(&mut client).await;
    assert_eq!(after["misses"], before["misses"], "{after}");
    server.stop().await;
    (after, cells)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fine_cells_are_cut_from_cached_coarse_chunks() {
    let (stats, cells) = read_then_read_again(LoopbackPlans::Mapped, LoopbackPlans::Socket).await;
    assert_eq!(cells, 10, "3-row cells of 30 rows");
    assert_eq!(
        stats["recuts"], 10,
        "every fine cell came from the cache: {stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coarse_cells_are_cut_from_cached_fine_chunks() {
    let (stats, cells) = read_then_read_again(LoopbackPlans::Socket, LoopbackPlans::Mapped).await;
    assert_eq!(cells, 6, "5-row cells of 30 rows");
    assert_eq!(
        stats["recuts"], 6,
        "every coarse cell came from the cache: {stats}"
    );
}
