//! SIGKILL of the real `tessera` process while concurrent `chunk_locate` calls are appending,
//! then a restart on the same cache directory: it starts, every tensor reads bit-exact over
//! do_get and over chunk_locate, every message a client located before the crash is still
//! there, byte for byte, at the same place (no segment truncated or rewritten), and views a
//! client mapped before the crash still hold the right bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arrow_flight::Action;
use futures::TryStreamExt;
use tessera_e2e::located::{Located, decode_located};
use tessera_e2e::process::ServerProcess;
use tessera_e2e::*;

const TENSORS: usize = 4;
const SHAPE: [u64; 2] = [1024, 4096];
const ITEMSIZE: usize = 2;

/// One planned chunk: which tensor, its box, its ticket.
#[derive(Clone)]
struct Chunk {
    tensor: usize,
    start: Vec<u64>,
    stop: Vec<u64>,
    ticket: Vec<u8>,
}

fn expected(data: &[Vec<u8>], chunk: &Chunk) -> Vec<u8> {
    region_bytes(
        &data[chunk.tensor],
        &SHAPE,
        ITEMSIZE,
        &chunk.start,
        &chunk.stop,
    )
}

async fn plan_all(grid: Grid, server: &ServerProcess) -> Vec<Chunk> {
    let mut client = server.client().await;
    let mut chunks = Vec::new();
    for tensor in 0..TENSORS {
        let info = client
            .get_flight_info(read_descriptor(&format!("t{tensor}"), None))
            .await
            .unwrap();
        assert_planned_on(grid, grid.chunk_target_for(64 << 10), &info);
        for (start, stop, ticket) in endpoint_bounds(&info) {
            chunks.push(Chunk {
                tensor,
                start: start.iter().map(|&v| v as u64).collect(),
                stop: stop.iter().map(|&v| v as u64).collect(),
                ticket: ticket.ticket.to_vec(),
            });
        }
    }
    chunks
}

/// Reads each segment file once.
fn read_files<'a>(paths: impl Iterator<Item = &'a String>) -> BTreeMap<String, Vec<u8>> {
    paths
        .map(|p| (p.clone(), std::fs::read(p).unwrap()))
        .collect()
}

async fn locate(client: &mut arrow_flight::FlightClient, ticket: &[u8]) -> Option<Located> {
    let results: Vec<bytes::Bytes> = client
        .do_action(Action::new("chunk_locate", ticket.to_vec()))
        .await
        .ok()?
        .try_collect()
        .await
        .ok()?;
    Located::from_json(&serde_json::from_slice(results.first()?).ok()?)
}

async fn sigkill_while_appending_loses_nothing_a_client_located(grid: Grid) {
    let sources = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let n = (SHAPE[0] * SHAPE[1]) as usize * ITEMSIZE;
    let data: Vec<Vec<u8>> = (0..TENSORS)
        .map(|t| {
            let bytes = pattern(n, 100 + t as u64);
            write_npy(
                &sources.path().join(format!("t{t}.npy")),
                "<u2",
                &SHAPE,
                &bytes,
            );
            bytes
        })
        .collect();
    let mut args = vec![
        sources.path().as_os_str().to_owned(),
        "--cache-dir".into(),
        cache.path().join("c").into_os_string(),
    ];
    args.extend(grid.serve_flags(64 << 10));
    let mut server = ServerProcess::spawn(&args);
    let chunks = Arc::new(plan_all(grid, &server).await);
    assert!(chunks.len() >= 500, "{} chunks", chunks.len());

    // Eight clients locate disjoint shares of the chunks, recording what they were told.
    let located: Arc<Mutex<Vec<(usize, Located)>>> = Arc::default();
    let mut workers = Vec::new();
    for w in 0..8 {
        let mut client = server.client().await;
        let chunks = chunks.clone();
        let located = located.clone();
        workers.push(tokio::spawn(async move {
            for i in (w..chunks.len()).step_by(8) {
                match locate(&mut client, &chunks[i].ticket).await {
                    Some(loc) => located.lock().unwrap().push((i, loc)),
                    None => return,
                }
            }
        }));
    }
    // Once a quarter is located, map every segment seen so far (as a client would), then
    // kill the server while the workers keep appending.
    while located.lock().unwrap().len() < chunks.len() / 4 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let mut maps: BTreeMap<String, memmap2::Mmap> = BTreeMap::new();
    let mapped_before: Vec<(usize, Located, Vec<u8>)> = {
        let seen = located.lock().unwrap().clone();
        seen.into_iter()
            .map(|(i, loc)| {
                let map = maps.entry(loc.path.clone()).or_insert_with(|| {
                    let file = std::fs::File::open(&loc.path).unwrap();
                    // SAFETY: segment files are never truncated or rewritten (the invariant
                    // under test); a violation would show as wrong bytes or SIGBUS here.
                    unsafe { memmap2::Mmap::map(&file).unwrap() }
                });
                let bytes = loc.range(map).to_vec();
                (i, loc, bytes)
            })
            .collect()
    };
    server.kill();
    for w in workers {
        w.await.unwrap();
    }
    let located = located.lock().unwrap().clone();
    assert!(
        located.len() < chunks.len(),
        "the kill should land mid-way ({} of {} located); make the sources larger",
        located.len(),
        chunks.len()
    );

    // What a client could have read right after the crash: located bytes and segment sizes.
    let files = read_files(located.iter().map(|(_, l)| &l.path));
    let sizes: BTreeMap<String, u64> = files
        .iter()
        .map(|(p, f)| (p.clone(), f.len() as u64))
        .collect();
    let mut before: Vec<(usize, Located, Vec<u8>)> = Vec::new();
    for (i, loc) in &located {
        let file = &files[&loc.path];
        let (bytes, _, _) = chunk_parts(&decode_located(file, loc));
        assert_eq!(
            bytes,
            expected(&data, &chunks[*i]),
            "located bytes of chunk {i}"
        );
        before.push((*i, loc.clone(), loc.range(file).to_vec()));
    }
    drop(files);

    let mut server = ServerProcess::spawn(&args);
    assert!(server.is_running());

    // Nothing a client located was truncated, rewritten or moved.
    for (path, size) in &sizes {
        let now = std::fs::metadata(path).unwrap().len();
        assert!(now >= *size, "{path} shrank from {size} to {now} bytes");
    }
    let mut client = server.client().await;
    let files = read_files(sizes.keys());
    for (i, loc, bytes) in &before {
        assert_eq!(
            &loc.range(&files[&loc.path]),
            bytes,
            "located range of chunk {i} changed"
        );
        let again = locate(&mut client, &chunks[*i].ticket).await.unwrap();
        assert_eq!(&again, loc, "chunk {i} located before the crash moved");
    }
    // Views mapped before the crash still read right.
    for (i, loc, bytes) in &mapped_before {
        let map = &maps[&loc.path];
        assert_eq!(&loc.range(map), bytes, "mapped view of chunk {i}");
        let (data_now, _, _) = chunk_parts(&decode_located(map, loc));
        assert_eq!(data_now, expected(&data, &chunks[*i]));
    }

    drop(files);

    // Every tensor reads bit-exact over both paths after the restart.
    let mut all = Vec::with_capacity(chunks.len());
    for chunk in chunks.iter() {
        all.push(locate(&mut client, &chunk.ticket).await.unwrap());
    }
    let files = read_files(all.iter().map(|l| &l.path));
    for (i, (chunk, loc)) in chunks.iter().zip(&all).enumerate() {
        let want = expected(&data, chunk);
        let (bytes, _, _) = chunk_parts(&decode_located(&files[&loc.path], loc));
        assert_eq!(bytes, want, "chunk {i} over chunk_locate");
        let batch = fetch_chunk(&mut client, arrow_flight::Ticket::new(chunk.ticket.clone())).await;
        assert_eq!(chunk_parts(&batch).0, want, "chunk {i} over do_get");
    }
    let status = server.terminate();
    assert!(status.success(), "clean exit after SIGTERM: {status:?}");
}

on_both_grids!(workers = 4; sigkill_while_appending_loses_nothing_a_client_located);
