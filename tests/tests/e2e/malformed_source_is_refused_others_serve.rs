//! A directory holding a malformed file: it is refused with its reason while
//! the good file beside it serves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tessera_e2e::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_bad_file_does_not_stop_the_others() {
    let dir = tempfile::tempdir().unwrap();
    write_npy(&dir.path().join("good.npy"), "<u2", &[10], &pattern(20, 8));
    std::fs::write(
        dir.path().join("bad.npy"),
        b"\x93NUMPY\x01\x00\x10\x00{'descr': '|O'}",
    )
    .unwrap();
    write_npy(
        &dir.path().join("short.npy"),
        "<u2",
        &[100],
        &pattern(20, 8),
    );
    let server = TestServer::start(vec![dir.path().to_path_buf()]).await;
    let mut client = server.client().await;

    let info = client
        .get_flight_info(read_descriptor("good", None))
        .await
        .unwrap();
    let (bytes, _, _) =
        chunk_parts(&fetch_chunk(&mut client, info.endpoint[0].ticket.clone().unwrap()).await);
    assert_eq!(bytes, pattern(20, 8));
    for bad in ["bad", "short"] {
        let status = status_of(
            client
                .get_flight_info(read_descriptor(bad, None))
                .await
                .unwrap_err(),
        );
        assert!(
            status.message().contains("not served"),
            "{}",
            status.message()
        );
    }
    let health = action_json(&mut client, "health", Vec::new()).await;
    assert_eq!(health["source_count"], 1);
    server.stop().await;
}
