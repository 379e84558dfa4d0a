//! A source rewritten in place (same inode, same size, no truncate) while clients plan and
//! read it: no chunk that mixes two versions is ever served or cached, on either route,
//! live or after a restart on the same cache. A single `write` sets the mtime once, when
//! it starts, so a write still copying looks finished to a size-and-mtime check; these
//! tests hold a writer open mid-payload (what the server sees during a slow single
//! `pwrite`) and race a real single `pwrite` against readers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arrow_flight::FlightClient;
use futures::TryStreamExt;
use tessera_e2e::located::{Located, decode_located};
use tessera_e2e::*;
use tessera_server::config::Size;

/// 64 MiB of u8: eight 8 MiB chunks, on either grid.
const SHAPE: [u64; 2] = [64, 1 << 20];
const CHUNK: u64 = 8 << 20;

fn payload_len() -> usize {
    (SHAPE[0] * SHAPE[1]) as usize
}

/// Where the payload starts in the file `write_npy` wrote.
fn data_offset(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len() - payload_len() as u64
}

async fn start(grid: Grid, path: &Path, cache: Option<PathBuf>) -> TestServer {
    start_settling(grid, path, cache, tessera_server::DEFAULT_SETTLE_WINDOW).await
}

/// A server with stability window `settle`: shorter than a racing writer's pauses, so the
/// readers are served between its writes and only the writer probe keeps them safe.
async fn start_settling(
    grid: Grid,
    path: &Path,
    cache: Option<PathBuf>,
    settle: Duration,
) -> TestServer {
    TestServer::start_on(grid, vec![path.to_path_buf()], |c| {
        c.chunks.chunk_target = Size::bytes(grid.chunk_target_for(CHUNK));
        c.chunks.settle_window = settle.into();
        if let Some(dir) = cache {
            c.cache.dir = dir;
        }
    })
    .await
}

/// One whole read from one plan, over do_get: `Ok(bytes per chunk, with bounds)` or the
/// first refusal.
async fn read_plan(client: &mut FlightClient) -> Result<Vec<(u64, Vec<u8>)>, tonic::Status> {
    let info = client
        .get_flight_info(read_descriptor("s", None))
        .await
        .map_err(status_of)?;
    let mut out = Vec::new();
    let cells = endpoint_bounds(&info);
    assert_eq!(cells.len(), 8, "eight 8 MiB cells");
    for (start, _, ticket) in cells {
        let batches: Vec<_> = client
            .do_get(ticket)
            .await
            .map_err(status_of)?
            .try_collect()
            .await
            .map_err(status_of)?;
        let first_row = start[0] as u64 * SHAPE[1];
        out.push((first_row, chunk_parts(&batches[0]).0));
    }
    Ok(out)
}

/// Which version each chunk of a read equals; panics on a chunk equal to neither (torn)
/// and on a plan whose chunks come from different versions.
fn version_of(read: &[(u64, Vec<u8>)], versions: &[&[u8]]) -> usize {
    let mut seen = None;
    for (offset, bytes) in read {
        let range = *offset as usize..*offset as usize + bytes.len();
        let which = versions
            .iter()
            .position(|v| &v[range.clone()] == bytes.as_slice())
            .unwrap_or_else(|| panic!("chunk at byte {offset} is torn: equals no version"));
        assert!(
            seen.is_none_or(|s| s == which),
            "one plan served chunks of two versions"
        );
        seen = Some(which);
    }
    seen.expect("a plan has chunks")
}

/// Reads every chunk of a fresh plan through `chunk_locate` (the mmap route).
async fn read_located(client: &mut FlightClient) -> Vec<(u64, Vec<u8>)> {
    let info = client
        .get_flight_info(read_descriptor("s", None))
        .await
        .unwrap();
    let mut out = Vec::new();
    let cells = endpoint_bounds(&info);
    assert_eq!(cells.len(), 8, "eight 8 MiB cells");
    for (start, _, ticket) in cells {
        let answer = action_json(client, "chunk_locate", ticket.ticket.to_vec()).await;
        let located = Located::from_json(&answer).expect("file cache locates chunks");
        let segment = std::fs::read(&located.path).unwrap();
        let batch = decode_located(&segment, &located);
        out.push((start[0] as u64 * SHAPE[1], chunk_parts(&batch).0));
    }
    out
}

fn assert_exactly(read: &[(u64, Vec<u8>)], data: &[u8]) {
    let mut whole = Vec::with_capacity(data.len());
    for (_, bytes) in read {
        whole.extend_from_slice(bytes);
    }
    assert!(whole == data, "the read differs from the file's bytes");
}

async fn a_write_in_progress_is_refused_then_served_whole(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.npy");
    let old = pattern(payload_len(), 1);
    let new = pattern(payload_len(), 2);
    write_npy(&path, "|u1", &SHAPE, &old);
    let offset = data_offset(&path);
    let server = start(grid, &path, None).await;
    let mut client = server.client().await;
    assert_exactly(&read_plan(&mut client).await.unwrap(), &old);

    // A writer halfway through its payload, its mtime already older than the server's
    // stability window: the state a slow single pwrite leaves the file in for seconds.
    let writer = OpenOptions::new().write(true).open(&path).unwrap();
    let half = payload_len() / 2;
    writer.write_all_at(&new[..half], offset).unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    for _ in 0..3 {
        let status = read_plan(&mut client)
            .await
            .expect_err("a half-written source must not be served");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(
            status.message().contains("being written"),
            "{}",
            status.message()
        );
    }
    writer
        .write_all_at(&new[half..], offset + half as u64)
        .unwrap();
    writer.sync_all().unwrap();
    drop(writer);

    assert_exactly(&read_plan(&mut client).await.unwrap(), &new);
    assert_exactly(&read_located(&mut client).await, &new);
    let kept = server.stop_keeping_cache().await;

    let server = start(grid, &path, Some(kept.path().join("cache"))).await;
    let mut client = server.client().await;
    assert_exactly(&read_plan(&mut client).await.unwrap(), &new);
    assert_exactly(&read_located(&mut client).await, &new);
    server.stop().await;
}

async fn single_pwrites_racing_readers_never_mix_versions(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.npy");
    let versions: Vec<Vec<u8>> = (1..=3).map(|seed| pattern(payload_len(), seed)).collect();
    write_npy(&path, "|u1", &SHAPE, &versions[0]);
    let offset = data_offset(&path);
    let server = start_settling(grid, &path, None, Duration::from_millis(50)).await;
    let views: Vec<&[u8]> = versions.iter().map(|v| v.as_slice()).collect();

    // Each new version is written with one pwrite of the whole payload while two readers
    // plan and fetch as fast as they can.
    let done = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..2 {
        let done = done.clone();
        let versions = versions.clone();
        let mut client = server.client().await;
        readers.push(tokio::spawn(async move {
            let views: Vec<&[u8]> = versions.iter().map(|v| v.as_slice()).collect();
            let (mut served, mut refused) = (0, 0);
            while !done.load(Ordering::Relaxed) {
                match read_plan(&mut client).await {
                    Ok(read) => {
                        version_of(&read, &views);
                        served += 1;
                    }
                    Err(_) => refused += 1,
                }
            }
            (served, refused)
        }));
    }
    for version in versions.iter().skip(1) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let writer = OpenOptions::new().write(true).open(&path).unwrap();
        let payload = version.clone();
        tokio::task::spawn_blocking(move || writer.write_all_at(&payload, offset))
            .await
            .unwrap()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    done.store(true, Ordering::Relaxed);
    let mut served = 0;
    for reader in readers {
        served += reader.await.unwrap().0;
    }
    assert!(served > 0, "the readers were served at least once");

    let last = versions.last().unwrap();
    let mut client = server.client().await;
    assert_exactly(&read_plan(&mut client).await.unwrap(), last);
    assert_exactly(&read_located(&mut client).await, last);
    let kept = server.stop_keeping_cache().await;
    let server = start(grid, &path, Some(kept.path().join("cache"))).await;
    let mut client = server.client().await;
    let read = read_plan(&mut client).await.unwrap();
    assert_eq!(version_of(&read, &views), versions.len() - 1);
    assert_exactly(&read_located(&mut client).await, last);
    server.stop().await;
}

on_both_grids!(
    a_write_in_progress_is_refused_then_served_whole,
    single_pwrites_racing_readers_never_mix_versions
);
