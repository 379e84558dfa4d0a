//! Segment files reveal every chunk a server cached, so they are created readable by the
//! server's user only (0600); `--cache-group-readable` makes them 0640 so local users in the
//! server's group can map them. Never world-readable either way. The cache directory and its
//! `segments/` are 0700 (0750 when group-readable), so other users cannot even list segment
//! names and sizes, and the `lock` file is 0600 in both cases.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tessera_e2e::located::Located;
use tessera_e2e::*;
use tessera_server::config::Size;

/// Modes of every file under the cache's `segments/` directory.
fn segment_modes(cache: &Path) -> Vec<(String, u32)> {
    std::fs::read_dir(cache.join("segments"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().permissions().mode() & 0o777,
            )
        })
        .collect()
}

/// Permission bits of `path`.
fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Modes of the cache directory, its `segments/` and its `lock` file.
#[derive(Debug, PartialEq, Eq)]
struct CacheModes {
    dir: u32,
    segments: u32,
    lock: u32,
}

async fn cache_a_chunk(group_readable: bool) -> (Vec<(String, u32)>, CacheModes) {
    let dir = tempfile::tempdir().unwrap();
    write_npy(&dir.path().join("p.npy"), "<u2", &[4096], &pattern(8192, 8));
    let server = TestServer::start_with(vec![dir.path().to_path_buf()], |c| {
        c.cache.group_readable = group_readable;
        c.chunks.chunk_target = Size::bytes(1024);
    })
    .await;
    let mut client = server.client().await;
    let info = client
        .get_flight_info(read_descriptor("p", None))
        .await
        .unwrap();
    for (_, _, ticket) in endpoint_bounds(&info) {
        let v = action_json(&mut client, "chunk_locate", ticket.ticket.to_vec()).await;
        Located::from_json(&v).expect("located");
    }
    let kept = server.stop_keeping_cache().await; // seals: sidecars are written too
    let cache = kept.path().join("cache");
    let modes = CacheModes {
        dir: mode_of(&cache),
        segments: mode_of(&cache.join("segments")),
        lock: mode_of(&cache.join("lock")),
    };
    (segment_modes(&cache), modes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_files_are_owner_only_by_default_and_group_readable_on_request() {
    // A permissive umask, so the modes seen are the ones the server asked for.
    // SAFETY: umask(2) only swaps the process's file-creation mask.
    unsafe {
        libc::umask(0o022);
    }
    let (private, dirs) = cache_a_chunk(false).await;
    assert_eq!(
        dirs,
        CacheModes {
            dir: 0o700,
            segments: 0o700,
            lock: 0o600
        }
    );
    assert!(
        private.iter().any(|(n, _)| n.ends_with(".arrow")),
        "{private:?}"
    );
    assert!(
        private.iter().any(|(n, _)| n.ends_with(".idx")),
        "{private:?}"
    );
    for (name, mode) in &private {
        assert_eq!(*mode, 0o600, "{name} is {mode:o}");
    }
    let (shared, dirs) = cache_a_chunk(true).await;
    assert_eq!(
        dirs,
        CacheModes {
            dir: 0o750,
            segments: 0o750,
            lock: 0o600
        }
    );
    assert!(!shared.is_empty());
    for (name, mode) in &shared {
        assert_eq!(*mode, 0o640, "{name} is {mode:o}");
    }
}
