//! `tessera warm` fills the file cache: afterwards every chunk_locate is a hit
//! and nothing is decoded again; with a memory cache, chunks are fetched instead.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tessera_cli::remote::Credentials;
use tessera_cli::warm::warm;
use tessera_e2e::*;
use tessera_server::Method;
use tessera_server::config::CacheKind;
use tessera_server::config::Size;
use tessera_server::config::value::Reduction;

async fn after_warm_locates_hit_without_decoding(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    write_npy(
        &dir.path().join("w1.npy"),
        "<u2",
        &[40, 50],
        &pattern(4000, 1),
    );
    write_npy(&dir.path().join("w2.npy"), "<f8", &[300], &pattern(2400, 2));
    let server = TestServer::start_on(grid, vec![dir.path().to_path_buf()], |config| {
        config.chunks.chunk_target = Size::bytes(grid.chunk_target_for(1024));
    })
    .await;
    let location = format!("grpc://{}", server.addr);
    let creds = Credentials::default();
    let ids = vec!["w1".to_string(), "w2".to_string()];
    let summary = warm(&location, creds, &ids, 3, false).await.unwrap();

    let mut client = server.client().await;
    let mut tickets = Vec::new();
    for id in &ids {
        let info = client
            .get_flight_info(read_descriptor(id, None))
            .await
            .unwrap();
        tickets.extend(info.endpoint.iter().map(|e| e.ticket.clone().unwrap()));
    }
    assert_eq!(summary.arrays, 2);
    assert_eq!(summary.chunks, tickets.len() as u64);
    assert_eq!(summary.located, summary.chunks);
    assert_eq!(summary.fetched, 0);
    assert!(summary.bytes >= 4000 + 2400, "{summary}");

    let before = action_json(&mut client, "cache_stats", Vec::new()).await;
    assert_eq!(before["total_entries"], tickets.len() as u64, "{before}");
    for ticket in &tickets {
        let reply = action_json(&mut client, "chunk_locate", ticket.ticket.to_vec()).await;
        assert_eq!(reply["available"], true, "{reply}");
    }
    let after = action_json(&mut client, "cache_stats", Vec::new()).await;
    assert_eq!(
        after["misses"], before["misses"],
        "no locate missed: {after}"
    );
    assert_eq!(
        after["hits"].as_u64().unwrap(),
        before["hits"].as_u64().unwrap() + tickets.len() as u64,
        "{after}"
    );
    assert_eq!(
        after["total_entries"], before["total_entries"],
        "nothing decoded again"
    );

    // Warming again finds everything warm.
    let again = warm(&location, creds, &ids, 3, false).await.unwrap();
    assert_eq!(again.located, summary.chunks);
    let last = action_json(&mut client, "cache_stats", Vec::new()).await;
    assert_eq!(last["misses"], before["misses"], "{last}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_cache_is_warmed_over_do_get_and_unknown_ids_fail() {
    let dir = tempfile::tempdir().unwrap();
    write_npy(&dir.path().join("m.npy"), "<u2", &[64], &pattern(128, 3));
    let server = TestServer::start_with(vec![dir.path().to_path_buf()], |config| {
        config.cache.kind = CacheKind::Memory;
    })
    .await;
    let location = format!("grpc://{}", server.addr);
    let creds = Credentials::default();
    let summary = warm(&location, creds, &["m".to_string()], 2, false)
        .await
        .unwrap();
    assert_eq!(
        (summary.chunks, summary.fetched, summary.located),
        (1, 1, 0)
    );
    assert!(
        summary.to_string().contains("fetched over do_get"),
        "{summary}"
    );

    let err = warm(&location, creds, &["nope".to_string()], 2, false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no tensor 'nope'"), "{err}");
    server.stop().await;
}

async fn warm_levels_fills_the_advertised_pyramid_level(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    write_npy(
        &dir.path().join("p.npy"),
        "|u1",
        &[200, 300],
        &pattern(60_000, 4),
    );
    let server = TestServer::start_on(grid, vec![dir.path().to_path_buf()], |config| {
        config.chunks.chunk_target = Size::bytes(grid.chunk_target_for(4096));
        // A small policy, so a small tensor has a computed level: [4, 8] here.
        config.pyramid.method = Reduction(Method::Area);
        config.pyramid.threshold = 64;
        config.pyramid.pixel_budget_cubic_root = 64;
        config.pyramid.plane_max_pixels = 4096;
    })
    .await;
    let location = format!("grpc://{}", server.addr);
    let creds = Credentials::default();
    let summary = warm(&location, creds, &["p".to_string()], 2, true)
        .await
        .unwrap();

    let mut client = server.client().await;
    let info = client
        .get_flight_info(scaled_descriptor("p", &[4, 8], "area"))
        .await
        .unwrap();
    assert_eq!(summary.chunks, info.endpoint.len() as u64, "{summary}");
    assert_eq!(summary.located, summary.chunks, "{summary}");
    let before = action_json(&mut client, "cache_stats", Vec::new()).await;
    assert_eq!(
        before["total_entries"], summary.chunks,
        "only the level: {before}"
    );
    for endpoint in &info.endpoint {
        let ticket = endpoint.ticket.clone().unwrap();
        let reply = action_json(&mut client, "chunk_locate", ticket.ticket.to_vec()).await;
        assert_eq!(reply["available"], true, "{reply}");
    }
    let after = action_json(&mut client, "cache_stats", Vec::new()).await;
    assert_eq!(
        after["misses"], before["misses"],
        "the level is warm: {after}"
    );
    assert_eq!(after["total_entries"], before["total_entries"], "{after}");
    server.stop().await;
}

on_both_grids!(
    after_warm_locates_hit_without_decoding,
    warm_levels_fills_the_advertised_pyramid_level
);
