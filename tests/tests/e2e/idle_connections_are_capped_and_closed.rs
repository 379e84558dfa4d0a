//! TCP peers that connect and never speak: the server holds at most `--max-connections` of
//! them, closes each once `--handshake-timeout` passes without an HTTP/2 preface, and when
//! the process runs out of descriptors it pauses its accept loop instead of spinning; real
//! clients are served again as soon as the idle peers are gone.
//!
//! HTTP/2 connections that answer PINGs but make no call hold a slot only until a new
//! connection needs it (`--reclaim-idle-after`), and one peer address holds at most its
//! share (`--max-connections-per-peer`). The `/metrics` endpoint holds at most
//! `--metrics-max-connections`, each for `--metrics-timeout`, so idle scrapers cannot take
//! the descriptors the Flight port needs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use arrow_flight::flight_service_client::FlightServiceClient;
use tessera_e2e::process::{ServerProcess, cpu_ticks};
use tessera_e2e::*;
use tessera_test_support::http::http_request_with;
use tonic::transport::{Channel, Endpoint};

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
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
    serve_env(dir, extra, &[])
}

/// [`serve`] with settings given by environment (`TESSERA_*`), which a server that does not
/// know them ignores: a build from before they existed runs these scenarios too.
fn serve_env(dir: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> ServerProcess {
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
    ServerProcess::spawn_env(&args, env)
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

const TOKEN: &str = "idle-token_0123456789";

/// The `/metrics` address, from the `metrics on http://ADDR/metrics` log line.
fn metrics_addr(server: &ServerProcess) -> SocketAddr {
    server
        .log()
        .iter()
        .find_map(|line| {
            let rest = line.split("metrics on http://").nth(1)?;
            rest.split('/').next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no metrics address in the log:\n{:?}", server.log()))
}

/// Whether a real client with `token` gets a plan within 5 s.
async fn serves_with_token(server: &ServerProcess, token: &str) -> bool {
    let mut client = server.client().await;
    client
        .add_header("authorization", &format!("Bearer {token}"))
        .unwrap();
    matches!(
        tokio::time::timeout(
            Duration::from_secs(5),
            client.get_flight_info(read_descriptor("small", None)),
        )
        .await,
        Ok(Ok(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_metrics_connections_are_capped_and_closed_while_flight_serves() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_env(
        dir.path(),
        &["--token", TOKEN, "--metrics-listen", "127.0.0.1:0"],
        &[
            ("TESSERA_METRICS_MAX_CONNECTIONS", "8"),
            ("TESSERA_METRICS_TIMEOUT", "1s"),
        ],
    );
    let pid = server.pid();
    let metrics = metrics_addr(&server);
    let baseline = open_fds(pid);
    // Room for 40 more descriptors: 200 idle scrapers held would take them all.
    let limit = baseline + 40;
    let status = Command::new("prlimit")
        .arg(format!("--nofile={limit}:{limit}"))
        .arg(format!("--pid={pid}"))
        .status()
        .expect("prlimit runs");
    assert!(
        status.success(),
        "prlimit could not lower the descriptor limit"
    );

    let mut idle: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect(metrics).ok())
        .collect();
    assert_eq!(idle.len(), 200, "the kernel queues every connection");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = open_fds(pid).saturating_sub(baseline);
    assert!(
        held <= 8,
        "the server holds {held} descriptors for 200 idle metrics connections, cap 8"
    );
    assert!(
        serves_with_token(&server, TOKEN).await,
        "the Flight port must serve while idle metrics connections are open"
    );
    let turned_away = idle
        .iter_mut()
        .map(|p| closed_by_server(p, Duration::from_millis(20)))
        .filter(|&closed| closed)
        .count();
    assert!(
        turned_away >= 192,
        "only {turned_away} of 192 metrics connections over the cap were closed"
    );

    // The admitted ones are closed once --metrics-timeout passes.
    let open_left = idle
        .iter_mut()
        .map(|p| closed_by_server(p, Duration::from_millis(2000)))
        .filter(|&closed| !closed)
        .count();
    assert_eq!(
        open_left, 0,
        "idle metrics connections outlived --metrics-timeout"
    );
    drop(idle);

    let refused = http_request_with(metrics, "GET", "/metrics", &[]).await;
    assert_eq!(refused.status, 401, "{refused:?}");
    let bearer = format!("Bearer {TOKEN}");
    let scrape = http_request_with(metrics, "GET", "/metrics", &[("authorization", &bearer)]).await;
    assert_eq!(scrape.status, 200, "{scrape:?}");
    assert!(
        scrape.body.contains("tessera_sources 1\n"),
        "{}",
        scrape.body
    );
}

/// A Flight client on a connection of its own from `local` (any loopback address: Linux
/// routes all of 127.0.0.0/8 to the loopback interface), or why it could not get a plan.
/// tonic answers the server's PINGs, so once its call is done the connection stays open,
/// idle, for as long as the channel lives.
async fn idle_client(
    server: &ServerProcess,
    local: IpAddr,
) -> Result<FlightServiceClient<Channel>, String> {
    let channel = Endpoint::from_shared(server.url())
        .unwrap()
        .local_address(Some(local))
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut client = FlightServiceClient::new(channel);
    tokio::time::timeout(
        Duration::from_secs(5),
        client.get_flight_info(read_descriptor("small", None)),
    )
    .await
    .map_err(|_| "no answer within 5 s".to_string())?
    .map_err(|status| status.to_string())?;
    Ok(client)
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_make_room_for_a_new_client() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_env(
        dir.path(),
        &["--max-connections", "8"],
        &[
            ("TESSERA_MAX_CONNECTIONS_PER_PEER", "8"),
            ("TESSERA_RECLAIM_IDLE_AFTER", "1s"),
        ],
    );
    // Every slot taken by a connection that answers PINGs and makes no further call.
    let mut holders = Vec::new();
    for i in 0..8 {
        let client = idle_client(&server, loopback(2))
            .await
            .unwrap_or_else(|e| panic!("holder {i} was not served: {e}"));
        holders.push(client);
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // A new client is served: the connection idle longest is closed to make room, so the
    // server still holds 8 connections, the newcomer's among them.
    let before = open_fds(server.pid());
    let newcomer = idle_client(&server, loopback(3)).await.unwrap_or_else(|e| {
        panic!("a new client was refused while idle connections held every slot: {e}")
    });
    assert!(
        server.log_arrives("to make room for a new one", Duration::from_secs(5)),
        "{:?}",
        server.log()
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    while open_fds(server.pid()) > before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        open_fds(server.pid()) <= before,
        "the idle connection closed for the newcomer still holds its descriptor"
    );
    drop(newcomer);
    drop(holders);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_cannot_hold_every_slot() {
    let dir = tempfile::tempdir().unwrap();
    // --max-connections-per-peer defaults to half of --max-connections: 4 of 8.
    let server = serve_env(
        dir.path(),
        &["--max-connections", "8"],
        &[("TESSERA_RECLAIM_IDLE_AFTER", "60s")],
    );
    let mut greedy = Vec::new();
    let mut refused = 0;
    for _ in 0..8 {
        match idle_client(&server, loopback(2)).await {
            Ok(client) => greedy.push(client),
            Err(_) => refused += 1,
        }
    }
    assert_eq!(
        (greedy.len(), refused),
        (4, 4),
        "one peer address must hold at most half the slots"
    );
    // Another address is served, and so is the usual 127.0.0.1.
    let other = idle_client(&server, loopback(3)).await;
    assert!(other.is_ok(), "another peer was refused: {other:?}");
    let local = idle_client(&server, loopback(1)).await;
    assert!(local.is_ok(), "127.0.0.1 was refused: {local:?}");
    assert!(
        server.log_arrives(
            "a peer holds its share of connections",
            Duration::from_secs(5)
        ),
        "{:?}",
        server.log()
    );
    drop(greedy);
}
