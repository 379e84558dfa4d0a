//! Sources that change while being served: replaced by rename, truncated, deleted, rewritten
//! in place over and over while clients read. Never stale or mixed bytes, never a crash (the
//! server reads sources with pread, so a shrunk file is an error, not SIGBUS), and a clear
//! error naming the source when it is gone. (A single in-place rewrite is covered by
//! rewritten_source_gets_new_ids.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arrow_flight::{FlightClient, Ticket};
use futures::TryStreamExt;
use tessera_e2e::*;
use tessera_server::config::Size;

const SHAPE: [u64; 2] = [256, 1024];

fn all_of(start: &[i64], stop: &[i64]) -> (Vec<u64>, Vec<u64>) {
    (
        start.iter().map(|&v| v as u64).collect(),
        stop.iter().map(|&v| v as u64).collect(),
    )
}

/// A do_get that must fail: its gRPC status.
async fn refused(client: &mut FlightClient, ticket: Ticket) -> tonic::Status {
    match client.do_get(ticket).await {
        Ok(stream) => status_of(stream.try_collect::<Vec<_>>().await.unwrap_err()),
        Err(e) => status_of(e),
    }
}

async fn start(grid: Grid, path: &std::path::Path) -> TestServer {
    TestServer::start_on(grid, vec![path.to_path_buf()], |c| {
        c.chunks.chunk_target = Size::bytes(16 << 10)
    })
    .await
}

async fn replaced_by_rename_serves_the_new_file_and_refuses_old_tickets(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.npy");
    let old = pattern((SHAPE[0] * SHAPE[1]) as usize, 1);
    let new = pattern((SHAPE[0] * SHAPE[1]) as usize, 2);
    write_npy(&path, "|u1", &SHAPE, &old);
    let server = start(grid, &path).await;
    let mut client = server.client().await;
    let info = client
        .get_flight_info(read_descriptor("s", None))
        .await
        .unwrap();
    server.assert_planned_on_its_grid(&info);
    let chunks = endpoint_bounds(&info);
    // Half the chunks cached from the old file.
    for (start, stop, ticket) in chunks.iter().step_by(2) {
        let (s, e) = all_of(start, stop);
        let bytes = chunk_parts(&fetch_chunk(&mut client, ticket.clone()).await).0;
        assert_eq!(bytes, region_bytes(&old, &SHAPE, 1, &s, &e));
    }

    // Atomic replace, the way editors and `np.save` to a temp name + rename do it.
    let tmp = dir.path().join(".s.npy.tmp");
    write_npy(&tmp, "|u1", &SHAPE, &new);
    std::fs::rename(&tmp, &path).unwrap();

    for (_, _, ticket) in &chunks {
        let status = refused(&mut client, ticket.clone()).await;
        assert!(
            status.message().contains("another version"),
            "{}",
            status.message()
        );
    }
    let info = client
        .get_flight_info(read_descriptor("s", None))
        .await
        .unwrap();
    for (start, stop, ticket) in endpoint_bounds(&info) {
        let (s, e) = all_of(&start, &stop);
        let bytes = chunk_parts(&fetch_chunk(&mut client, ticket.clone()).await).0;
        assert_eq!(bytes, region_bytes(&new, &SHAPE, 1, &s, &e));
        let located = action_json(&mut client, "chunk_locate", ticket.ticket.to_vec()).await;
        let loc = tessera_e2e::located::Located::from_json(&located).unwrap();
        let file = std::fs::read(&loc.path).unwrap();
        let batch = tessera_e2e::located::decode_located(&file, &loc);
        assert_eq!(chunk_parts(&batch).0, region_bytes(&new, &SHAPE, 1, &s, &e));
    }
    server.stop().await;
}

async fn truncated_source_gives_errors_never_bytes(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.npy");
    let data = pattern((SHAPE[0] * SHAPE[1]) as usize, 3);
    write_npy(&path, "|u1", &SHAPE, &data);
    let server = start(grid, &path).await;
    let mut client = server.client().await;
    let info = client
        .get_flight_info(read_descriptor("t", None))
        .await
        .unwrap();
    let chunks = endpoint_bounds(&info);
    let (start, stop, first) = &chunks[0];
    let (s, e) = all_of(start, stop);
    let bytes = chunk_parts(&fetch_chunk(&mut client, first.clone()).await).0;
    assert_eq!(bytes, region_bytes(&data, &SHAPE, 1, &s, &e));

    // Cut the file to half its payload, in place (same inode).
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();

    // Cold chunks past the end, cold chunks before it, and the cached one: all refused.
    for (_, _, ticket) in [&chunks[0], &chunks[1], chunks.last().unwrap()] {
        let status = refused(&mut client, ticket.clone()).await;
        assert!(
            status.message().contains("'t'"),
            "names the source: {}",
            status.message()
        );
    }
    let status = status_of(
        client
            .get_flight_info(read_descriptor("t", None))
            .await
            .unwrap_err(),
    );
    assert!(
        status.message().contains("can no longer be read") && status.message().contains("'t'"),
        "{}",
        status.message()
    );

    // Restored: served again, with fresh ids.
    write_npy(&path, "|u1", &SHAPE, &data);
    let info = client
        .get_flight_info(read_descriptor("t", None))
        .await
        .unwrap();
    let (start, stop, ticket) = endpoint_bounds(&info).pop().unwrap();
    let (s, e) = all_of(&start, &stop);
    let bytes = chunk_parts(&fetch_chunk(&mut client, ticket).await).0;
    assert_eq!(bytes, region_bytes(&data, &SHAPE, 1, &s, &e));
    server.stop().await;
}

async fn deleted_source_gives_a_clear_error(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.npy");
    let data = pattern((SHAPE[0] * SHAPE[1]) as usize, 4);
    write_npy(&path, "|u1", &SHAPE, &data);
    let server = start(grid, &path).await;
    let mut client = server.client().await;
    let info = client
        .get_flight_info(read_descriptor("d", None))
        .await
        .unwrap();
    let chunks = endpoint_bounds(&info);
    let cached = chunks[0].2.clone();
    fetch_chunk(&mut client, cached.clone()).await;

    std::fs::remove_file(&path).unwrap();

    for ticket in [cached.clone(), chunks[1].2.clone()] {
        let status = refused(&mut client, ticket.clone()).await;
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        let text = status.message();
        assert!(
            text.contains("'d'")
                && text.contains("can no longer be read")
                && text.contains("No such file"),
            "a deleted source is named and said to be gone: {text}"
        );
        let located = client
            .do_action(arrow_flight::Action::new(
                "chunk_locate",
                ticket.ticket.to_vec(),
            ))
            .await
            .err()
            .map(status_of)
            .expect("chunk_locate of a deleted source is refused");
        assert!(located.message().contains("'d'"), "{}", located.message());
    }
    let status = status_of(
        client
            .get_flight_info(read_descriptor("d", None))
            .await
            .unwrap_err(),
    );
    assert!(status.message().contains("'d'"), "{}", status.message());
    server.stop().await;
}

/// One version of the file's contents: writer `k` writes `pattern(n, 1000 + k)`.
fn version(k: u64) -> Vec<u8> {
    pattern((SHAPE[0] * SHAPE[1]) as usize, 1000 + k)
}

async fn repeated_rewrites_while_reading_never_mix_versions(grid: Grid) {
    const VERSIONS: u64 = 24;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.npy");
    write_npy(&path, "|u1", &SHAPE, &version(0));
    // A stability window shorter than the writer's pauses, so chunks are served between
    // rewrites (with the default 1 s window every read during the rewrites waits or is
    // refused as "being written"; docs/decisions/0011).
    let server = TestServer::start_on(grid, vec![path.clone()], |c| {
        c.chunks.chunk_target = Size::bytes(16 << 10);
        c.chunks.settle_window = Duration::from_millis(10).into();
    })
    .await;
    let versions: Arc<Vec<Vec<u8>>> = Arc::new((0..VERSIONS).map(version).collect());

    // The writer rewrites in place (same inode: truncate, then write), pausing between
    // versions longer than the stability window, which is itself longer than the file
    // system's timestamp granularity: each version gets a distinct mtime before it is read.
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (path, versions, done) = (path.clone(), versions.clone(), done.clone());
        std::thread::spawn(move || {
            for k in 1..VERSIONS as usize {
                std::thread::sleep(Duration::from_millis(40));
                write_npy(&path, "|u1", &SHAPE, &versions[k]);
            }
            done.store(true, Ordering::SeqCst);
        })
    };

    let mut client = server.client().await;
    let (mut plans, mut served, mut refusals) = (0, 0, 0);
    while !done.load(Ordering::SeqCst) {
        let Ok(info) = client.get_flight_info(read_descriptor("w", None)).await else {
            refusals += 1;
            continue;
        };
        plans += 1;
        // Every chunk one plan serves comes from one and the same version.
        let mut seen: Option<usize> = None;
        for (start, stop, ticket) in endpoint_bounds(&info) {
            let stream = match client.do_get(ticket).await {
                Ok(s) => s,
                Err(_) => {
                    refusals += 1;
                    continue;
                }
            };
            let Ok(batches) = stream.try_collect::<Vec<_>>().await else {
                refusals += 1;
                continue;
            };
            let bytes = chunk_parts(&batches[0]).0;
            let (s, e) = all_of(&start, &stop);
            let k = versions
                .iter()
                .position(|v| region_bytes(v, &SHAPE, 1, &s, &e) == bytes)
                .unwrap_or_else(|| {
                    panic!("chunk {s:?}..{e:?} is no version of the file (torn or mixed)")
                });
            assert!(
                *seen.get_or_insert(k) == k,
                "one plan served chunks of versions {seen:?} and {k}: stale bytes"
            );
            served += 1;
        }
    }
    writer.join().unwrap();
    assert!(plans > 0 && served > 0, "{plans} plans, {served} chunks");
    eprintln!("{plans} plans, {served} chunks served, {refusals} refusals");

    // The final version reads whole.
    let info = client
        .get_flight_info(read_descriptor("w", None))
        .await
        .unwrap();
    let last = &versions[VERSIONS as usize - 1];
    for (start, stop, ticket) in endpoint_bounds(&info) {
        let (s, e) = all_of(&start, &stop);
        let bytes = chunk_parts(&fetch_chunk(&mut client, ticket).await).0;
        assert_eq!(bytes, region_bytes(last, &SHAPE, 1, &s, &e));
    }
    server.stop().await;
}

on_both_grids!(
    replaced_by_rename_serves_the_new_file_and_refuses_old_tickets,
    truncated_source_gives_errors_never_bytes,
    deleted_source_gives_a_clear_error,
    repeated_rewrites_while_reading_never_mix_versions
);
