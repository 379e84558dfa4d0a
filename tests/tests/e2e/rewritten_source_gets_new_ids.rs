//! A source rewritten in place: the next plan reopens it and hands out new
//! chunk ids with the new bytes; tickets of the old plan are refused as stale.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tessera_e2e::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewritten_file_serves_new_bytes_under_new_ids() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.npy");
    write_npy(&path, "<u2", &[64], &pattern(128, 9));
    let server = TestServer::start(vec![path.clone()]).await;
    let mut client = server.client().await;
    let old = client
        .get_flight_info(read_descriptor("r", None))
        .await
        .unwrap();
    let old_ticket = old.endpoint[0].ticket.clone().unwrap();
    let (bytes, _, _) = chunk_parts(&fetch_chunk(&mut client, old_ticket.clone()).await);
    assert_eq!(bytes, pattern(128, 9));

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
    assert_eq!(bytes, pattern(128, 10));

    let status = status_of(client.do_get(old_ticket).await.err().unwrap());
    assert!(
        status.message().contains("another version"),
        "{}",
        status.message()
    );
    server.stop().await;
}
