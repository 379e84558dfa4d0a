//! A source rewritten in place: the next plan reopens it and hands out new
//! chunk ids with the new bytes; tickets of the old plan are refused as stale.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tessera_e2e::*;
use tessera_server::config::Size;

async fn rewritten_file_serves_new_bytes_under_new_ids(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.npy");
    write_npy(&path, "<u2", &[64], &pattern(128, 9));
    let server = TestServer::start_on(grid, vec![path.clone()], |c| {
        c.chunks.chunk_target = Size::bytes(32)
    })
    .await;
    let mut client = server.client().await;
    let old = client
        .get_flight_info(read_descriptor("r", None))
        .await
        .unwrap();
    server.assert_planned_on_its_grid(&old);
    let old_ticket = old.endpoint[0].ticket.clone().unwrap();
    let (bytes, _, _) = chunk_parts(&fetch_chunk(&mut client, old_ticket.clone()).await);
    assert_eq!(
        bytes,
        region_bytes(&pattern(128, 9), &[64], 2, &[0], &[cell_len(&old)])
    );

    // Rewrite in place (same inode, new content and mtime).
    std::thread::sleep(std::time::Duration::from_millis(20));
    write_npy(&path, "<u2", &[64], &pattern(128, 10));

    let new = client
        .get_flight_info(read_descriptor("r", None))
        .await
        .unwrap();
    let new_ticket = new.endpoint[0].ticket.clone().unwrap();
    assert_ne!(
        new_ticket.ticket, old_ticket.ticket,
        "a changed source gets new chunk ids"
    );
    let (bytes, _, _) = chunk_parts(&fetch_chunk(&mut client, new_ticket).await);
    assert_eq!(
        bytes,
        region_bytes(&pattern(128, 10), &[64], 2, &[0], &[cell_len(&new)])
    );

    let status = status_of(client.do_get(old_ticket).await.err().unwrap());
    assert!(
        status.message().contains("another version"),
        "{}",
        status.message()
    );
    server.stop().await;
}

/// The length of a 1-d plan's first cell.
fn cell_len(info: &arrow_flight::FlightInfo) -> u64 {
    let (start, stop, _) = &endpoint_bounds(info)[0];
    (stop[0] - start[0]) as u64
}

on_both_grids!(rewritten_file_serves_new_bytes_under_new_ids);
