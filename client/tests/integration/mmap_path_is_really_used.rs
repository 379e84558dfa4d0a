//! On loopback with mmap on, chunks come from mapped segments (the server
//! answers chunk_locate and sends nothing with do_get); with `--no-mmap`
//! they all come over the socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::{Server, npy_fixture, options};
use tessera_client::{ChunkOrigin, Client, ClientOptions, write_npy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mmap_path_is_really_used_and_no_mmap_really_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = npy_fixture(dir.path(), "img", "<u2", &[256, 384], 11);
    let server = Server::start(&[path], &["--chunk-target", "64KiB"]);

    let client = Client::connect(&server.url, options(true)).await.unwrap();
    let plan = client.plan("img", None).await.unwrap();
    let chunks = plan.chunks.len() as u64;
    assert!(chunks > 1);
    let views = client.fetch_views(&plan).await.unwrap();
    assert!(views.iter().all(|(_, v)| v.origin() == ChunkOrigin::Mapped));
    let stats = client.local_stats();
    assert!(stats.fast_path);
    assert_eq!(stats.mapped_chunks, chunks);
    assert_eq!(stats.socket_chunks, 0);
    assert!(
        stats.pinned_bytes > 0 && stats.pinned_segments > 0,
        "{stats:?}"
    );
    drop(views);
    assert_eq!(
        client.local_stats().pinned_bytes,
        0,
        "mappings go with the last view"
    );

    let server_stats = server.stats().await;
    assert!(server_stats.locates >= chunks, "{server_stats:?}");
    assert_eq!(server_stats.do_gets, 0, "{server_stats:?}");

    let out = dir.path().join("out.npy");
    let socket_only = Client::connect(&server.url, ClientOptions::default().with_mmap(false))
        .await
        .unwrap();
    let array = socket_only.read("img", None).await.unwrap();
    write_npy(&out, &array.dtype, &array.shape, &array.bytes).unwrap();
    let local = socket_only.local_stats();
    assert_eq!(local.socket_chunks, chunks);
    assert_eq!(local.mapped_chunks + local.mapped_copies, 0);
    let written = std::fs::read(&out).unwrap();
    assert!(written.ends_with(&data));
    assert_eq!(
        (written.len() - data.len()) % 64,
        0,
        "header is 64-byte aligned"
    );

    let after = server.stats().await;
    assert_eq!(
        after.locates, server_stats.locates,
        "--no-mmap makes no chunk_locate"
    );
    assert_eq!(
        after.do_gets, chunks,
        "--no-mmap fetches every chunk with do_get"
    );
}
