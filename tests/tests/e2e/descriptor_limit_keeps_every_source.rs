//! More served files than descriptors (issue 28, item 8). A `tessera` child process under a
//! descriptor limit of 160 serves 400 files: sources hold no descriptor each
//! (`--max-open-sources`, here 32, the least recently used closed first), so every file is
//! served and readable. With the descriptors then exhausted, the rescan cannot list the
//! folder, and removes nothing it could not see; once descriptors are back, all still read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use arrow_flight::FlightClient;
use tessera_e2e::process::ServerProcess;
use tessera_e2e::*;

use crate::sources_never_leave_their_roots::read_all;

const FILES: usize = 400;

/// The child's hard descriptor limit: the soft one moves under it, with no privilege needed
/// to raise it back.
const HARD_LIMIT: usize = 160;

/// Sets the child's soft descriptor limit (under [`HARD_LIMIT`]) with `prlimit`.
fn limit_descriptors(pid: u32, limit: usize) {
    let status = std::process::Command::new("prlimit")
        .arg(format!("--pid={pid}"))
        .arg(format!("--nofile={limit}:{HARD_LIMIT}"))
        .status()
        .expect("prlimit runs");
    assert!(status.success(), "prlimit --nofile={limit} failed");
}

async fn source_count(client: &mut FlightClient) -> u64 {
    action_json(client, "health", Vec::new()).await["source_count"]
        .as_u64()
        .unwrap()
}

fn contents(i: usize) -> [u8; 2] {
    [(i % 251) as u8, (i / 251) as u8]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_files_than_descriptors_stay_served_and_readable() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut args = vec![
        dir.path().as_os_str().to_owned(),
        "--cache-dir".into(),
        cache.path().as_os_str().to_owned(),
        "--watch".into(),
        "--watch-interval".into(),
        "100ms".into(),
    ];
    args.extend(["--settle-window".into(), "1ms".into()]);
    let server = ServerProcess::spawn_env(&args, &[("TESSERA_MAX_OPEN_SOURCES", "32")]);
    let pid = server.pid();
    limit_descriptors(pid, 160);
    for i in 0..FILES {
        write_npy(
            &dir.path().join(format!("t{i:03}.npy")),
            "|u1",
            &[2],
            &contents(i),
        );
    }
    let mut client = server.client().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while source_count(&mut client).await != FILES as u64 {
        assert!(
            Instant::now() < deadline,
            "{} of {FILES} files served under a limit of 160 descriptors:\n{}",
            source_count(&mut client).await,
            server.log().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..FILES {
        let bytes = read_all(&mut client, &format!("t{i:03}")).await;
        assert_eq!(bytes.unwrap(), contents(i), "t{i:03}");
    }

    // No descriptor left: the rescan cannot list the folder, and keeps what it held. The
    // limit caps descriptor numbers, so only 0-2 (stdio) fit: every new open fails EMFILE,
    // while the descriptors already open stay.
    limit_descriptors(pid, 3);
    let problems = server.log_count("cannot be scanned");
    let waited = Instant::now() + Duration::from_secs(30);
    while server.log_count("cannot be scanned") == problems {
        assert!(
            Instant::now() < waited,
            "no rescan failed to list the folder"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        source_count(&mut client).await,
        FILES as u64,
        "a rescan that could not list the folder removed sources"
    );
    limit_descriptors(pid, 160);
    for i in (0..FILES).step_by(7) {
        let bytes = read_all(&mut client, &format!("t{i:03}")).await;
        assert_eq!(bytes.unwrap(), contents(i), "t{i:03}");
    }
}
