//! TCP peers that connect and never speak: the server holds at most `--max-connections` of
//! them, closes each once `--handshake-timeout` passes without an HTTP/2 preface, and when
//! the process runs out of descriptors it pauses its accept loop instead of spinning; real
//! clients are served again as soon as the idle peers are gone.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use tessera_e2e::process::ServerProcess;
use tessera_e2e::*;

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// User plus system CPU of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn ticks_per_second() -> u64 {
    let out = Command::new("getconf").arg("CLK_TCK").output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn serve(dir: &std::path::Path, extra: &[&str]) -> ServerProcess {
    let path = dir.join("small.npy");
    write_npy(&path, "|u1", &[64, 64], &pattern(64 * 64, 1));
    let cache = dir.join("cache");
    let mut args = vec![
        path.to_str().unwrap(),
        "--cache-dir",
        cache.to_str().unwrap(),
        "--handshake-timeout",
        "1s",
    ];
    args.extend_from_slice(extra);
    ServerProcess::spawn(&args)
}

fn silent_peers(server: &ServerProcess, n: usize) -> Vec<TcpStream> {
    (0..n)
        .filter_map(|_| TcpStream::connect(server.addr).ok())
        .collect()
}

/// Whether the server closed `peer` (EOF or reset) within `wait`.
fn closed_by_server(peer: &mut TcpStream, wait: Duration) -> bool {
    peer.set_read_timeout(Some(wait)).unwrap();
    let mut byte = [0u8; 64];
    loop {
        match peer.read(&mut byte) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

async fn still_serves(server: &ServerProcess) {
    let mut client = server.client().await;
    let info = tokio::time::timeout(
        Duration::from_secs(5),
        client.get_flight_info(read_descriptor("small", None)),
    )
    .await
    .expect("a real client is answered within 5 s")
    .unwrap();
    assert!(!info.endpoint.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peers_beyond_the_cap_are_closed_and_the_rest_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), &["--max-connections", "16"]);
    let pid = server.pid();
    let baseline = open_fds(pid);

    let mut peers = silent_peers(&server, 60);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = open_fds(pid) - baseline;
    assert!(
        held <= 16,
        "the server holds {held} descriptors for 60 silent peers, cap 16"
    );
    let turned_away = peers
        .iter_mut()
        .map(|p| closed_by_server(p, Duration::from_millis(50)))
        .filter(|&closed| closed)
        .count();
    assert!(
        turned_away >= 44,
        "only {turned_away} of 44 peers over the cap were closed"
    );

    // The admitted ones go once the handshake timeout passes.
    let started = Instant::now();
    let open_left = peers
        .iter_mut()
        .map(|p| closed_by_server(p, Duration::from_millis(2500)))
        .filter(|&closed| !closed)
        .count();
    assert_eq!(
        open_left, 0,
        "silent peers still open after the handshake timeout"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        open_fds(pid) <= baseline + 1,
        "descriptors were not released"
    );
    still_serves(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_out_of_descriptors_pauses_accept_instead_of_spinning() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve(dir.path(), &[]);
    let pid = server.pid();
    let limit = open_fds(pid) + 20;
    let status = Command::new("prlimit")
        .arg(format!("--nofile={limit}:{limit}"))
        .arg(format!("--pid={pid}"))
        .status()
        .expect("prlimit runs");
    assert!(
        status.success(),
        "prlimit could not lower the descriptor limit"
    );

    let peers = silent_peers(&server, 80);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let spent = cpu_ticks(pid) - before;
    let hz = ticks_per_second();
    assert!(
        spent * 10 < hz * 2,
        "the server burned {spent} ticks ({hz}/s) in 0.7 s with descriptors exhausted"
    );
    // Once the admitted silent peers time out, the queued ones are accepted (and time out
    // in turn); a real client gets through within the timeouts.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(peers);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    still_serves(&server).await;
}
