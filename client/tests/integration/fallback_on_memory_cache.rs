//! With `--cache memory` the server answers chunk_locate `available: false`;
//! the client falls back to DoGet chunk by chunk and the bytes stay exact.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::{Server, crop, npy_fixture, options};
use tessera_client::{Client, parse_region};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_cache_sends_every_chunk_over_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = npy_fixture(dir.path(), "img", "<f4", &[200, 300], 5);
    let server = Server::start(&[path], &["--chunk-target", "64KiB", "--cache", "memory"]);

    let client = Client::connect(&server.url, options(true)).await.unwrap();
    let plan = client.plan("img", None).await.unwrap();
    let chunks = plan.chunks.len() as u64;
    assert!(chunks > 1);
    let whole = client.read_plan(&plan, None).await.unwrap();
    assert!(whole.bytes == data, "whole read differs");

    let stats = client.local_stats();
    assert_eq!(
        stats.locate_probes, chunks,
        "every chunk was probed: {stats:?}"
    );
    assert!(
        stats.locate_supported,
        "available:false keeps the location supported"
    );
    assert_eq!(stats.mapped_chunks + stats.mapped_copies, 0, "{stats:?}");
    assert_eq!(stats.socket_chunks, chunks, "{stats:?}");

    let server_stats = server.stats().await;
    assert_eq!(server_stats.do_gets, chunks, "{server_stats:?}");
    assert_eq!(server_stats.locates, 0, "{server_stats:?}");

    let region = parse_region("17:190,33:251", &[200, 300]).unwrap();
    let fresh = Client::connect(&server.url, options(true).with_copy_cache_bytes(0))
        .await
        .unwrap();
    let part = fresh.read("img", Some(&region)).await.unwrap();
    assert!(
        part.bytes == crop(&data, &[200, 300], 4, &region),
        "region differs"
    );
}
