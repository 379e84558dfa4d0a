//! An id, once given, stays with its file (issue 28, item 15): annotations and clients
//! follow ids, so a new file whose name derives the same id gets the next one, on a running
//! server, after a restart, and whatever order runtime roots are added in again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use tessera_e2e::*;

use crate::sources_never_leave_their_roots::{add_source, read_all};

async fn start(served: &Path, state: &Path, inbox: &Path) -> TestServer {
    let (state, inbox) = (state.to_path_buf(), inbox.to_path_buf());
    TestServer::start_with(vec![served.to_path_buf()], move |config| {
        config.writes.state_dir = state;
        config.sources.add_source_roots = vec![inbox];
        config.chunks.settle_window = std::time::Duration::ZERO.into();
    })
    .await
}

#[tokio::test]
async fn an_id_stays_with_its_file_across_new_files_restarts_and_add_orders() {
    let tmp = tempfile::tempdir().unwrap();
    let (served, state, inbox) = (
        tmp.path().join("served"),
        tmp.path().join("state"),
        tmp.path().join("inbox"),
    );
    std::fs::create_dir_all(&served).unwrap();
    write_npy(&served.join("a_b.npy"), "|u1", &[1], &[1]);
    let roots: Vec<PathBuf> = ["x", "y"]
        .iter()
        .map(|r| inbox.join(r).join("data"))
        .collect();
    for (i, root) in roots.iter().enumerate() {
        std::fs::create_dir_all(root).unwrap();
        write_npy(&root.join("t.npy"), "|u1", &[1], &[10 + i as u8]);
    }

    let server = start(&served, &state, &inbox).await;
    let mut client = server.client().await;
    assert_eq!(read_all(&mut client, "a_b").await.unwrap(), [1]);
    for root in &roots {
        add_source(&mut client, root).await;
    }
    assert_eq!(read_all(&mut client, "data.t").await.unwrap(), [10]);
    assert_eq!(read_all(&mut client, "data-2.t").await.unwrap(), [11]);
    server.stop().await;

    // `a b.npy` sorts before `a_b.npy` and derives the same id; the roots come back in
    // the other order.
    write_npy(&served.join("a b.npy"), "|u1", &[2], &[2, 2]);
    let server = start(&served, &state, &inbox).await;
    let mut client = server.client().await;
    assert_eq!(
        read_all(&mut client, "a_b").await.unwrap(),
        [1],
        "a_b moved"
    );
    assert_eq!(read_all(&mut client, "a_b-2").await.unwrap(), [2, 2]);
    for root in roots.iter().rev() {
        add_source(&mut client, root).await;
    }
    assert_eq!(
        read_all(&mut client, "data.t").await.unwrap(),
        [10],
        "data.t moved"
    );
    assert_eq!(read_all(&mut client, "data-2.t").await.unwrap(), [11]);
    server.stop().await;
}
