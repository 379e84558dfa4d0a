//! `--metrics-listen` serves Prometheus text that counts a known workload exactly.
//!
//! The server is this test's own daemon (its own metrics handle, nothing shared with any
//! other server), read-ahead is off and one client connection makes every call, so each
//! series has one right value: after `ROUNDS` do_gets of each of the `M` chunks, one
//! chunk_locate per chunk and two plans (one refused), the call, byte, latency, cache and
//! connection series equal what was done. On a server with a token a scrape needs it too,
//! and a metrics address other than loopback is refused at startup without one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use arrow_flight::FlightClient;
use arrow_flight::Ticket;
use arrow_flight::decode::DecodedPayload;
use futures::StreamExt;
use tessera_e2e::*;
use tessera_server::config::Settings;
use tessera_server::config::Size;
use tessera_server::{Daemon, DaemonError};
use tessera_test_support::http::{http_request, http_request_with};

/// Times every chunk is fetched over do_get.
const ROUNDS: usize = 3;

/// The value of the series whose line starts with `series ` (exact labels).
fn value(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("series {series} missing from:\n{text}"))
        .parse()
        .unwrap_or_else(|e| panic!("series {series} is not a whole number ({e}):\n{text}"))
}

/// Fetches one chunk over do_get; returns the bytes of its record-batch message as they
/// arrived (`data_header` + `data_body`), which is what `served_bytes{path="do_get"}` counts.
async fn fetch_message_bytes(client: &mut FlightClient, ticket: Ticket) -> u64 {
    let mut stream = client.do_get(ticket).await.unwrap().into_inner();
    let mut bytes = 0;
    let mut batches = 0;
    while let Some(message) = stream.next().await {
        let message = message.unwrap();
        if let DecodedPayload::RecordBatch(batch) = &message.payload {
            assert_eq!(batch.num_rows(), 1);
            batches += 1;
            bytes += (message.inner.data_header.len() + message.inner.data_body.len()) as u64;
        }
    }
    assert_eq!(batches, 1, "one record batch per chunk");
    bytes
}

async fn scrape_counts_a_known_workload_exactly(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.npy");
    write_npy(&path, "<u2", &[64, 64], &pattern(64 * 64 * 2, 5));
    let server = TestServer::start_on(grid, vec![path], |config| {
        config.operations.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        config.chunks.chunk_target = Size::bytes(grid.chunk_target_for(2048));
        config.chunks.read_ahead = Size::bytes(0);
    })
    .await;
    let metrics = server.metrics_addr.expect("metrics endpoint bound");
    let mut client = server.client().await;

    let info = client
        .get_flight_info(read_descriptor("m", None))
        .await
        .unwrap();
    let tickets: Vec<Ticket> = info
        .endpoint
        .iter()
        .map(|e| e.ticket.clone().unwrap())
        .collect();
    let chunks = tickets.len() as u64;
    assert_eq!(chunks, 4, "8 KiB in chunks of 2 KiB");

    let mut per_round = Vec::new();
    for _ in 0..ROUNDS {
        let mut round = 0;
        for ticket in &tickets {
            round += fetch_message_bytes(&mut client, ticket.clone()).await;
        }
        per_round.push(round);
    }
    assert!(
        per_round.iter().all(|&r| r == per_round[0]),
        "{per_round:?}"
    );
    let do_get_bytes: u64 = per_round.iter().sum();
    let do_gets = ROUNDS as u64 * chunks;

    let mut located_bytes = 0;
    for ticket in &tickets {
        let reply = action_json(&mut client, "chunk_locate", ticket.ticket.to_vec()).await;
        located_bytes += reply["byte_length"]
            .as_u64()
            .unwrap_or_else(|| panic!("not located: {reply}"));
    }
    client
        .get_flight_info(read_descriptor("nope", None))
        .await
        .unwrap_err();

    let scrape = http_request(metrics, "GET", "/metrics").await;
    assert_eq!(scrape.status, 200, "{scrape:?}");
    assert_eq!(
        scrape.content_type.as_deref(),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let text = scrape.body;

    // Calls, by method and code: exactly the ones made, and no others.
    let calls = |method: &str, code: &str| {
        value(
            &text,
            &format!("tessera_grpc_calls_total{{method=\"{method}\",code=\"{code}\"}}"),
        )
    };
    assert_eq!(calls("DoGet", "OK"), do_gets);
    assert_eq!(calls("DoAction", "OK"), chunks);
    assert_eq!(calls("GetFlightInfo", "OK"), 1);
    assert_eq!(calls("GetFlightInfo", "UNKNOWN"), 1);
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("tessera_grpc_calls_total{"))
            .count(),
        4,
        "{text}"
    );
    assert!(
        text.contains("# TYPE tessera_grpc_calls_total counter\n"),
        "{text}"
    );

    // Bytes: the sum of the messages received, and of the ranges handed out.
    assert_eq!(
        value(&text, "tessera_served_bytes_total{path=\"do_get\"}"),
        do_get_bytes
    );
    assert!(
        do_get_bytes > do_gets * 2048,
        "every message holds its 2 KiB"
    );
    assert_eq!(
        value(&text, "tessera_served_bytes_total{path=\"located\"}"),
        located_bytes
    );

    // One decode and one cache append per chunk; the rest were hits.
    assert_eq!(value(&text, "tessera_chunk_decode_seconds_count"), chunks);
    assert_eq!(
        value(&text, "tessera_chunk_decode_seconds_bucket{le=\"+Inf\"}"),
        chunks
    );
    assert_eq!(value(&text, "tessera_chunk_write_seconds_count"), chunks);
    assert_eq!(value(&text, "tessera_cache_do_gets_total"), do_gets);
    assert_eq!(value(&text, "tessera_cache_locates_total"), chunks);
    assert_eq!(value(&text, "tessera_cache_read_aheads_total"), 0);
    // A cold do_get misses, then reads the chunk back once it is stored (a hit); every
    // later do_get and every chunk_locate is one hit.
    assert_eq!(value(&text, "tessera_cache_misses_total"), chunks);
    assert_eq!(
        value(&text, "tessera_cache_hits_total"),
        chunks + (ROUNDS as u64 - 1) * chunks + chunks
    );
    assert_eq!(value(&text, "tessera_cache_entries"), chunks);
    assert_eq!(value(&text, "tessera_cache_evictions_total"), 0);
    assert_eq!(value(&text, "tessera_cache_info{backend=\"file\"}"), 1);

    // One client, one connection, still open.
    assert_eq!(value(&text, "tessera_connections_total"), 1);
    assert_eq!(value(&text, "tessera_open_connections"), 1);

    assert_eq!(value(&text, "tessera_sources"), 1);
    assert_eq!(value(&text, "tessera_full_scan_in_progress"), 0);
    let finished: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("tessera_last_full_scan_finished_timestamp_seconds "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(finished > 1.6e9, "{finished}");

    assert_eq!(http_request(metrics, "GET", "/other").await.status, 404);
    server.stop().await;
}

on_both_grids!(scrape_counts_a_known_workload_exactly);

const TOKEN: &str = "metrics-token_0123456789";

#[tokio::test]
async fn scrapes_of_a_token_server_need_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.npy");
    write_npy(&path, "|u1", &[8, 8], &pattern(64, 1));
    let server = TestServer::start_with(vec![path], |config| {
        config.operations.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        config.listener.token = Some(TOKEN.to_string());
    })
    .await;
    let metrics = server.metrics_addr.expect("metrics endpoint bound");

    let none = http_request(metrics, "GET", "/metrics").await;
    assert_eq!(none.status, 401, "{none:?}");
    assert!(none.body.contains("Authorization: Bearer"), "{none:?}");
    assert!(!none.body.contains("tessera_"), "{none:?}");
    let wrong = http_request_with(
        metrics,
        "GET",
        "/metrics",
        &[("authorization", "Bearer metrics-token_0123456780")],
    )
    .await;
    assert_eq!(wrong.status, 401, "{wrong:?}");
    let right = http_request_with(
        metrics,
        "GET",
        "/metrics",
        &[("authorization", &format!("Bearer {TOKEN}"))],
    )
    .await;
    assert_eq!(right.status, 200, "{right:?}");
    assert!(right.body.contains("tessera_sources 1\n"), "{}", right.body);
    server.stop().await;
}

#[tokio::test]
async fn public_metrics_without_a_token_are_refused_at_startup() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Settings::new(
        Vec::new(),
        "127.0.0.1:0".parse().unwrap(),
        dir.path().join("c"),
    );
    config.operations.metrics_listen = Some("0.0.0.0:0".parse().unwrap());
    let err = Daemon::bind(&config).await.err().expect("refused");
    assert!(
        matches!(err, DaemonError::MetricsExposedWithoutToken(_)),
        "{err}"
    );
    assert!(err.to_string().contains("--token"), "{err}");
}
