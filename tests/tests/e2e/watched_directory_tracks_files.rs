//! With watch on, .npy files added to, rewritten in and removed from a served
//! directory are picked up without a restart, and `health` reports the scans.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use arrow_flight::FlightClient;
use arrow_flight::FlightInfo;
use tessera_e2e::*;

/// Polls `attempt` every 50 ms until it returns `Some` (bounded, so a broken watcher fails the test).
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut attempt: impl FnMut() -> F,
) -> T {
    for _ in 0..400 {
        if let Some(value) = attempt().await {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what} did not happen within 400 polls");
}

async fn plan(client: &mut FlightClient, id: &str) -> Result<FlightInfo, tonic::Status> {
    client
        .get_flight_info(read_descriptor(id, None))
        .await
        .map_err(status_of)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn added_changed_and_removed_files_follow_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    write_npy(&dir.path().join("a.npy"), "<u2", &[32], &pattern(64, 1));
    let server = TestServer::start_with(vec![dir.path().to_path_buf()], |config| {
        config.sources.watch = true;
        config.sources.watch_interval = Duration::from_millis(50).into();
    })
    .await;
    let mut client = server.client().await;

    let health = action_json(&mut client, "health", Vec::new()).await;
    assert_eq!(health["full_scan_in_progress"], false, "{health}");
    let first_scan = health["last_full_scan_finished_at"].as_f64().unwrap();
    assert!(first_scan > 1.6e9, "{health}");
    let status = plan(&mut client, "sub.b").await.unwrap_err();
    assert_eq!(extra_info(&status).unwrap()["reason"], "unknown_source");

    // Added, in a new subdirectory.
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    write_npy(&dir.path().join("sub/b.npy"), "<u2", &[16], &pattern(32, 2));
    let info = eventually("the added file becoming plannable", || async {
        plan(&mut server.client().await, "sub.b").await.ok()
    })
    .await;
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let (bytes, shape, _) = chunk_parts(&fetch_chunk(&mut client, ticket.clone()).await);
    assert_eq!((bytes, shape), (pattern(32, 2), vec![16]));

    // Changed: new bytes under new ids.
    std::thread::sleep(Duration::from_millis(20));
    write_npy(&dir.path().join("sub/b.npy"), "<u2", &[8], &pattern(16, 3));
    let info = eventually("the rewrite being served", || async {
        let info = plan(&mut server.client().await, "sub.b").await.ok()?;
        (info.endpoint[0].ticket.as_ref() != Some(&ticket)).then_some(info)
    })
    .await;
    let new_ticket = info.endpoint[0].ticket.clone().unwrap();
    let (bytes, shape, _) = chunk_parts(&fetch_chunk(&mut client, new_ticket).await);
    assert_eq!((bytes, shape), (pattern(16, 3), vec![8]));

    // Removed: unknown again, while the untouched source keeps serving.
    std::fs::remove_file(dir.path().join("sub/b.npy")).unwrap();
    eventually("the removed file becoming unknown", || async {
        let status = plan(&mut server.client().await, "sub.b").await.err()?;
        (extra_info(&status)?["reason"] == "unknown_source").then_some(())
    })
    .await;
    plan(&mut client, "a").await.unwrap();

    let health = action_json(&mut client, "health", Vec::new()).await;
    assert!(
        health["last_full_scan_finished_at"].as_f64().unwrap() >= first_scan,
        "{health}"
    );
    assert_eq!(health["source_count"], 1, "{health}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_watch_new_files_wait_for_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    write_npy(&dir.path().join("a.npy"), "<u2", &[32], &pattern(64, 1));
    let server = TestServer::start(vec![dir.path().to_path_buf()]).await;
    write_npy(&dir.path().join("b.npy"), "<u2", &[8], &pattern(16, 2));
    // Rescans happen only with watch on; with it off, the new file stays unknown.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut client = server.client().await;
    let status = plan(&mut client, "b").await.unwrap_err();
    assert_eq!(extra_info(&status).unwrap()["reason"], "unknown_source");
    server.stop().await;
}
