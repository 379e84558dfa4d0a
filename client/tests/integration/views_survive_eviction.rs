//! Views handed out by the fast path stay right after the server evicts and
//! unlinks the segments they point into.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::{Server, crop, npy_fixture, options};
use tessera_client::{ChunkOrigin, Client};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_survive_eviction_of_their_segments() {
    let dir = tempfile::tempdir().unwrap();
    let shape = [512u64, 1024];
    let (path, data) = npy_fixture(dir.path(), "big", "<u2", &shape, 31);
    let server = Server::start(
        &[path],
        &["--chunk-target", "64KiB", "--cache-max-bytes", "512KiB"],
    );

    let client = Client::connect(&server.url, options(true).with_concurrency(2))
        .await
        .unwrap();
    let plan = client.plan("big", None).await.unwrap();
    let views = client.fetch_views(&plan).await.unwrap();
    assert!(views.len() >= 16, "{} chunks", views.len());
    assert!(views.iter().all(|(_, v)| v.origin() == ChunkOrigin::Mapped));

    let stats = server.stats().await;
    assert!(
        stats.evictions > 0,
        "a 512KiB cache of a 1MiB array evicts: {stats:?}"
    );
    assert!(stats.unlinked_bytes > 0, "{stats:?}");
    let segments_dir = server.dir.path().join("cache");
    let on_disk = count_arrow_files(&segments_dir);
    assert!(
        (on_disk as usize) < client.local_stats().pinned_segments,
        "some mapped segments are gone from disk ({on_disk} files, {} mapped)",
        client.local_stats().pinned_segments
    );

    for (chunk, view) in &views {
        assert!(
            view.bytes() == crop(&data, &shape, 2, &chunk.bounds),
            "chunk {} changed after eviction",
            chunk.bounds
        );
    }
    drop(views);
    assert_eq!(client.local_stats().pinned_bytes, 0);

    // The server rebuilds evicted chunks on demand.
    let again = Client::connect(&server.url, options(true)).await.unwrap();
    assert!(again.read("big", None).await.unwrap().bytes == data);
}

fn count_arrow_files(dir: &std::path::Path) -> u64 {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            count += count_arrow_files(&path);
        } else if path.extension().is_some_and(|e| e == "arrow") {
            count += 1;
        }
    }
    count
}
