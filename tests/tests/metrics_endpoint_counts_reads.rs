//! `--metrics-listen` serves Prometheus text: after a read, the call, byte,
//! cache, latency and connection series are present and count it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use tessera_e2e::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: tessera\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

/// The value of the series whose line starts with `series ` (exact labels).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("series {series} missing from:\n{text}"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_after_a_read_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.npy");
    write_npy(&path, "<u2", &[64, 64], &pattern(64 * 64 * 2, 5));
    let server = TestServer::start_with(vec![path], |config| {
        config.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        config.chunk_target = 2048;
    })
    .await;
    let metrics = server.metrics_addr.expect("metrics endpoint bound");
    let mut client = server.client().await;
    let info = client
        .get_flight_info(read_descriptor("m", None))
        .await
        .unwrap();
    for endpoint in &info.endpoint {
        fetch_chunk(&mut client, endpoint.ticket.clone().unwrap()).await;
    }
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    action_json(&mut client, "chunk_locate", ticket.ticket.to_vec()).await;
    client
        .get_flight_info(read_descriptor("nope", None))
        .await
        .unwrap_err();

    let response = http_get(metrics, "/metrics").await;
    let (head, text) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let chunks = info.endpoint.len() as f64;
    assert!(chunks > 1.0);
    assert!(
        value(
            text,
            "tessera_grpc_calls_total{method=\"DoGet\",code=\"OK\"}"
        ) >= chunks
    );
    assert!(
        value(
            text,
            "tessera_grpc_calls_total{method=\"GetFlightInfo\",code=\"OK\"}"
        ) >= 1.0
    );
    assert!(
        value(
            text,
            "tessera_grpc_calls_total{method=\"GetFlightInfo\",code=\"UNKNOWN\"}"
        ) >= 1.0
    );
    assert!(
        value(
            text,
            "tessera_grpc_calls_total{method=\"DoAction\",code=\"OK\"}"
        ) >= 1.0
    );
    assert!(value(text, "tessera_served_bytes_total{path=\"do_get\"}") >= 64.0 * 64.0 * 2.0);
    assert!(value(text, "tessera_served_bytes_total{path=\"located\"}") > 0.0);
    // Every chunk was either missed by a request or decoded ahead of one.
    assert!(
        value(text, "tessera_cache_misses_total") + value(text, "tessera_cache_read_aheads_total")
            >= chunks
    );
    assert!(value(text, "tessera_cache_hits_total") >= 1.0);
    assert!(value(text, "tessera_cache_bytes") > 0.0);
    assert!(value(text, "tessera_chunk_decode_seconds_count") >= chunks);
    assert!(value(text, "tessera_chunk_write_seconds_count") >= chunks);
    assert!(value(text, "tessera_chunk_decode_seconds_bucket{le=\"+Inf\"}") >= chunks);
    assert!(value(text, "tessera_open_connections") >= 1.0);
    assert!(value(text, "tessera_connections_total") >= 1.0);
    assert_eq!(value(text, "tessera_sources"), 1.0);
    assert!(value(text, "tessera_last_full_scan_finished_timestamp_seconds") > 1.6e9);

    let missing = http_get(metrics, "/other").await;
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
    server.stop().await;
}
