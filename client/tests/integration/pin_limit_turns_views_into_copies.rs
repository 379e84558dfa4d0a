//! Past the pin limit, chunks are copied out of the mapping instead of
//! keeping another segment mapped; they still never go through DoGet.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::{Server, crop, npy_fixture, options};
use tessera_client::{ChunkOrigin, Client, Region};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pin_limit_turns_views_into_copies() {
    let dir = tempfile::tempdir().unwrap();
    let shape = [256u64, 512];
    let (path, data) = npy_fixture(dir.path(), "img", "<u2", &shape, 21);
    let server = Server::start(&[path], &["--chunk-target", "64KiB"]);

    // No limit: every chunk is a view and the segments stay mapped while held.
    let free = Client::connect(&server.url, options(true)).await.unwrap();
    let plan = free.plan("img", None).await.unwrap();
    let chunks = plan.chunks.len() as u64;
    assert!(chunks > 2);
    let views = free.fetch_views(&plan).await.unwrap();
    assert!(views.iter().all(|(_, v)| v.origin() == ChunkOrigin::Mapped));
    assert!(free.local_stats().pinned_bytes > 0);
    drop(views);

    // Limit 0: always copy; nothing stays mapped.
    let never = Client::connect(&server.url, options(true).with_pin_limit(Some(0)))
        .await
        .unwrap();
    let views = never.fetch_views(&plan).await.unwrap();
    assert!(
        views
            .iter()
            .all(|(_, v)| v.origin() == ChunkOrigin::MappedCopy)
    );
    for (chunk, view) in &views {
        assert!(
            view.bytes() == crop(&data, &shape, 2, &chunk.bounds),
            "chunk {}",
            chunk.bounds
        );
    }
    let stats = never.local_stats();
    assert_eq!(stats.pinned_bytes, 0, "{stats:?}");
    assert_eq!(stats.mapped_copies, chunks, "{stats:?}");

    // A limit of about one chunk: the held views never pin more than it, the
    // rest are copies, and the bytes are right.
    let limit = plan.chunks[0].bounds.num_elements().unwrap() * 2 + 4096;
    let tight = Client::connect(&server.url, options(true).with_pin_limit(Some(limit)))
        .await
        .unwrap();
    let views = tight.fetch_views(&plan).await.unwrap();
    let stats = tight.local_stats();
    assert!(stats.pinned_bytes <= limit, "{stats:?} over {limit}");
    assert!(stats.mapped_copies >= 1, "{stats:?}");
    assert_eq!(
        stats.mapped_chunks + stats.mapped_copies,
        chunks,
        "{stats:?}"
    );
    assert_eq!(stats.socket_chunks, 0, "{stats:?}");
    for (chunk, view) in &views {
        assert!(
            view.bytes() == crop(&data, &shape, 2, &chunk.bounds),
            "chunk {}",
            chunk.bounds
        );
    }
    drop(views);
    assert_eq!(tight.local_stats().pinned_bytes, 0);
    let region = Region::new(vec![3, 100], vec![250, 511]);
    let read = tight.read("img", Some(&region)).await.unwrap();
    assert!(read.bytes == crop(&data, &shape, 2, &region));

    // None of this used the socket.
    assert_eq!(server.stats().await.do_gets, 0);
}
