//! Many clients asking for the same cold chunk at once: it is decoded and
//! written once, and everyone gets the same bytes and the same location.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tessera_e2e::*;
use tessera_server::config::Size;

async fn concurrent_cold_requests_share_one_decode(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(4 << 20, 4);
    write_npy(&dir.path().join("big.npy"), "<u4", &[1 << 20], &data);
    // No read-ahead: the plan alone would start the decode these requests are to share.
    let server = TestServer::start_on(grid, vec![dir.path().join("big.npy")], |c| {
        c.chunks.chunk_target = Size::bytes(grid.chunk_target_for(4 << 20));
        c.chunks.read_ahead = Size::bytes(0);
    })
    .await;
    let mut client = server.client().await;
    let info = client
        .get_flight_info(read_descriptor("big", None))
        .await
        .unwrap();
    server.assert_planned_on_its_grid(&info);
    assert_eq!(
        info.endpoint.len(),
        1,
        "4 MiB fits one chunk at a 4 MiB target"
    );
    let ticket = info.endpoint[0].ticket.clone().unwrap();

    let mut tasks = Vec::new();
    for i in 0..12 {
        let mut c = server.client().await;
        let t = ticket.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                let (bytes, _, _) = chunk_parts(&fetch_chunk(&mut c, t).await);
                (Some(bytes), None)
            } else {
                let v = action_json(&mut c, "chunk_locate", t.ticket.to_vec()).await;
                (None, Some(v))
            }
        }));
    }
    let mut locations = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (Some(bytes), _) => assert!(bytes == data, "do_get bytes differ from the source"),
            (_, Some(v)) => locations.push(v),
            _ => unreachable!(),
        }
    }
    assert!(
        locations.windows(2).all(|w| w[0] == w[1]),
        "one chunk, one location"
    );
    assert_eq!(locations[0]["available"], true);
    let stats = action_json(&mut client, "cache_stats", Vec::new()).await;
    assert_eq!(stats["total_entries"], 1, "written once: {stats}");
    server.stop().await;
}

on_both_grids!(concurrent_cold_requests_share_one_decode);
