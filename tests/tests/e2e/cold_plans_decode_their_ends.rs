//! A plan of a cold tensor starts decoding its first and last cells before the client asks
//! for any (a whole-tensor reader starts at one end or the other), so the first request
//! finds its chunk cached; a plan of a warm tensor, a scaled plan, ListFlights and a server
//! with read-ahead off start nothing. The chunks decoded this way hold the source's bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use arrow_flight::{FlightClient, FlightInfo};
use tessera_e2e::*;
use tessera_server::config::Size;

/// 10 planes of 64 KiB: one chunk per plane at a 64 KiB target, on either grid.
const SHAPE: [u64; 3] = [10, 64, 1024];
const PLANE: usize = 64 * 1024;

/// Waits until the cache holds `entries` chunks; then checks that it stays there.
async fn settle_at(client: &mut FlightClient, entries: u64) -> serde_json::Value {
    wait_for_entries(client, entries).await;
    // A decode started by mistake would land within this.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = cache_stats(client).await;
    assert_eq!(s["total_entries"], entries, "{s}");
    s
}

async fn start(grid: Grid, dir: &std::path::Path, read_ahead: u64) -> (TestServer, Vec<u8>) {
    let data = pattern(SHAPE.iter().product::<u64>() as usize, 21);
    let path = dir.join("vol.npy");
    write_npy(&path, "|u1", &SHAPE, &data);
    let server = TestServer::start_on(grid, vec![path], |c| {
        c.chunks.chunk_target = Size::bytes(grid.chunk_target_for(PLANE as u64));
        c.chunks.read_ahead = Size::bytes(read_ahead);
    })
    .await;
    (server, data)
}

async fn plan(client: &mut FlightClient, slice: Option<(&[i64], &[i64])>) -> FlightInfo {
    client
        .get_flight_info(read_descriptor("vol", slice))
        .await
        .unwrap()
}

async fn a_cold_plan_decodes_its_first_and_last_cells_before_any_request(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let (server, data) = start(grid, dir.path(), 4 * PLANE as u64).await;
    let mut client = server.client().await;

    // Browsing plans nothing: ListFlights lists the tensor and decodes no chunk.
    assert!(!list_all_flights(&mut client).await.is_empty());
    settle_at(&mut client, 0).await;

    // A scaled plan decodes nothing ahead either.
    client
        .get_flight_info(scaled_descriptor("vol", &[1, 2, 2], "nearest"))
        .await
        .unwrap();
    settle_at(&mut client, 0).await;

    // A slice's plan decodes the ends of the slice: planes 4 and 6 of 4..7.
    let sliced = plan(&mut client, Some((&[4, 0, 0], &[7, 64, 1024]))).await;
    assert_eq!(endpoint_bounds(&sliced).len(), 3);
    let s = settle_at(&mut client, 2).await;
    assert_eq!(s["read_aheads"], 2, "{s}");

    // The whole tensor: cells 0 and 9 as well, nothing else, before any request.
    let info = plan(&mut client, None).await;
    server.assert_planned_on_its_grid(&info);
    let cells = endpoint_bounds(&info);
    assert_eq!(cells.len(), 10);
    settle_at(&mut client, 4).await;

    // Planned again, the tensor is warm at its ends: nothing more starts.
    plan(&mut client, None).await;
    let before = settle_at(&mut client, 4).await;
    assert_eq!(before["read_aheads"], 4, "{before}");

    // The first requests of a reader at either end are hits, with the source's bytes.
    for i in [0, 9, 4, 6] {
        let (bytes, _, _) = chunk_parts(&fetch_chunk(&mut client, cells[i].2.clone()).await);
        assert!(bytes == data[i * PLANE..(i + 1) * PLANE], "cell {i}");
    }
    let after = cache_stats(&mut client).await;
    assert_eq!(
        after["misses"], before["misses"],
        "cells decoded for plans were hits: {after}"
    );
    server.stop().await;
}

async fn with_read_ahead_off_a_plan_decodes_nothing(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = start(grid, dir.path(), 0).await;
    let mut client = server.client().await;
    plan(&mut client, None).await;
    let s = settle_at(&mut client, 0).await;
    assert_eq!(s["read_aheads"], 0, "{s}");
    server.stop().await;
}

on_both_grids!(
    a_cold_plan_decodes_its_first_and_last_cells_before_any_request,
    with_read_ahead_off_a_plan_decodes_nothing
);
