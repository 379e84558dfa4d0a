//! Against a server started with `--token`, the client's token travels on
//! every call (health, GetFlightInfo, chunk_locate, DoGet); without it the
//! refusal says a token is wanted.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::{Server, npy_fixture, options};
use tessera_client::Client;

const TOKEN: &str = "client-test-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_is_sent_on_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let (path, data) = npy_fixture(dir.path(), "img", "<i2", &[128, 300], 51);
    let server = Server::start(&[path], &["--chunk-target", "64KiB", "--token", TOKEN]);

    for mmap in [true, false] {
        let client = Client::connect(&server.url, options(mmap).with_token(TOKEN))
            .await
            .unwrap();
        assert!(client.read("img", None).await.unwrap().bytes == data);
        let stats = client.local_stats();
        if mmap {
            assert!(
                stats.mapped_chunks > 0,
                "chunk_locate carried the token: {stats:?}"
            );
        } else {
            assert!(
                stats.socket_chunks > 0,
                "DoGet carried the token: {stats:?}"
            );
        }
    }
    let client = Client::connect(&server.url, options(false).with_token(TOKEN))
        .await
        .unwrap();
    let listing = client.list().await.unwrap();
    assert!(
        listing
            .iter()
            .any(|t| t.array_id == "img" && t.shape == [128, 300] && t.dtype == "<i2"),
        "ListFlights carried the token: {listing:?}"
    );
    let stats = client.cache_stats().await.unwrap();
    assert!(
        stats.locates > 0,
        "cache_stats carried the token: {stats:?}"
    );

    let refused = match Client::connect(&server.url, options(false)).await {
        Err(e) => e.to_string(),
        Ok(client) => client.read("img", None).await.unwrap_err().to_string(),
    };
    assert!(refused.contains("token"), "{refused}");
}
