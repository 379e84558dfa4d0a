//! Concurrent `add_source` calls serve each file once, under one url (issue 28, item 16):
//! six calls adding the same folder of 600 files serve 600 sources, and two roots of the
//! same name added at once get labels of their own, so no `dnd://` url names two files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_flight::FlightClient;
use arrow_flight::Ticket;
use futures::TryStreamExt;
use tessera_e2e::*;

use crate::sources_never_leave_their_roots::add_source;

/// `(rows, distinct urls)` of the runtime sources, from the catalog.
async fn runtime_rows(client: &mut FlightClient) -> (i64, i64) {
    let sql = "SELECT count(*) AS n, count(DISTINCT source_url) AS urls FROM sources \
               WHERE source_url LIKE 'dnd://%'";
    let ticket = Ticket::new(tessera_proto::ticket::catalog_ticket(sql));
    let batches: Vec<arrow_array::RecordBatch> = client
        .do_get(ticket)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let column = |name: &str| {
        batches[0]
            .column_by_name(name)
            .unwrap()
            .as_primitive::<Int64Type>()
            .value(0)
    };
    (column("n"), column("urls"))
}

fn fill(dir: &Path, files: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..files {
        write_npy(&dir.join(format!("t{i:04}.npy")), "|u1", &[2], &[1, 2]);
    }
}

/// Runs `add_source(path)` from a client of its own for each path, all at once.
async fn add_at_once(server: &TestServer, paths: &[&Path]) -> usize {
    let mut calls = Vec::new();
    for path in paths {
        let mut client = server.client().await;
        let path = path.to_path_buf();
        calls.push(tokio::spawn(async move {
            add_source(&mut client, &path).await.added.len()
        }));
    }
    let mut added = 0;
    for call in calls {
        added += call.await.unwrap();
    }
    added
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_adds_serve_each_file_once_under_one_url() {
    let inbox = tempfile::tempdir().unwrap();
    let data = inbox.path().join("data");
    fill(&data, 600);
    fill(&inbox.path().join("x/data"), 150);
    fill(&inbox.path().join("y/data"), 150);
    let root = inbox.path().to_path_buf();
    let server = TestServer::start_with(Vec::new(), move |config| {
        config.sources.add_source_roots = vec![root];
    })
    .await;
    let mut client = server.client().await;

    let added = add_at_once(&server, &[data.as_path(); 6]).await;
    assert_eq!(added, 600, "each file is added by one call");
    assert_eq!(runtime_rows(&mut client).await, (600, 600));

    let (x, y) = (inbox.path().join("x/data"), inbox.path().join("y/data"));
    let added = add_at_once(&server, &[x.as_path(), y.as_path()]).await;
    assert_eq!(added, 300);
    assert_eq!(
        runtime_rows(&mut client).await,
        (900, 900),
        "two roots named data get labels of their own"
    );
}
