//! Prometheus metrics: one [`Metrics`] handle, created by the daemon and handed to
//! everything that records, over a `prometheus-client` registry; served as text on
//! `GET /metrics` (`--metrics-listen ADDR`) by the scrape endpoint.
//!
//! ```text
//!  gRPC call ─▶ Metered (metered.rs) ─▶ tessera_grpc_calls_total{method,code}
//!                                       + one log line per failed call
//!  accepted TCP connection ─▶ Metrics::connection_opened ─▶ tessera_open_connections (gauge)
//!                                                          + tessera_connections_total
//!  do_get / chunk_locate ─▶ tessera_served_bytes_total{path}
//!  do_get reply body ─▶ tessera_do_get_body_bytes_total{encoding} (raw or zstd)
//!  do_get table reply (catalog, roi) ─▶ tessera_table_replies_total{table,encoding}
//!  cold chunk materialized / cache append ─▶ tessera_chunk_{decode,write}_seconds
//!  scrape endpoint ─▶ the above + a collector over the service state: cache, pins,
//!                             sources, scans
//! ```
//!
//! Labels have bounded cardinality: methods are the ten Flight RPC names (else
//! `unknown`), codes the seventeen gRPC codes; array ids never become labels.
//! The text is the Prometheus exposition format 0.0.4 ([`CONTENT_TYPE`]).

mod metered;
pub mod quiet;

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

pub use metered::Metered;

/// The `Content-Type` of the text [`Metrics::encode`] writes: Prometheus text format 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Upper bounds (seconds) of the latency histogram buckets; `+Inf` follows.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Why the metrics text could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The text encoder failed (it writes into a `String`, so only a metric's own
    /// encoding can fail).
    #[error("encoding the metrics text failed")]
    Encode(#[from] std::fmt::Error),
}

/// Labels of `tessera_grpc_calls_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    method: &'static str,
    code: &'static str,
}

/// Labels of `tessera_served_bytes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabels {
    path: &'static str,
}

/// Labels of `tessera_do_get_body_bytes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EncodingLabels {
    encoding: &'static str,
}

/// Labels of `tessera_table_replies_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TableLabels {
    table: &'static str,
    encoding: &'static str,
}

/// The metrics this server records, and the registry they are encoded from. Cheap to
/// clone: every clone records into the same registry.
#[derive(Clone, Debug)]
pub struct Metrics {
    inner: Arc<Recorded>,
}

#[derive(Debug)]
struct Recorded {
    registry: Registry,
    calls: Family<CallLabels, Counter>,
    served_do_get: Counter,
    served_located: Counter,
    bodies: Family<EncodingLabels, Counter>,
    tables: Family<TableLabels, Counter>,
    decode: Histogram,
    write: Histogram,
    open_connections: Gauge,
    connections: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh set of metrics, every series at zero. The daemon makes one and hands
    /// clones to whatever records; a component built without one records into its own,
    /// which nobody scrapes.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        // Help texts without their final full stop: the registry appends it.
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "tessera_grpc_calls",
            "Finished gRPC calls by Flight method and status code",
            calls.clone(),
        );
        let served = Family::<PathLabels, Counter>::default();
        registry.register(
            "tessera_served_bytes",
            "Chunk bytes served, by path: do_get (over the socket) or located (mapped by the client)",
            served.clone(),
        );
        // Both paths are exported from the start, at zero.
        let served_do_get = served.get_or_create(&PathLabels { path: "do_get" }).clone();
        let served_located = served
            .get_or_create(&PathLabels { path: "located" })
            .clone();
        let bodies = Family::<EncodingLabels, Counter>::default();
        registry.register(
            "tessera_do_get_body_bytes",
            "Bytes of do_get reply bodies sent, by encoding: raw (the chunk as stored) or zstd (its buffers compressed)",
            bodies.clone(),
        );
        for encoding in ["raw", "zstd"] {
            let _ = bodies.get_or_create(&EncodingLabels { encoding });
        }
        let tables = Family::<TableLabels, Counter>::default();
        registry.register(
            "tessera_table_replies",
            "do_get replies of tables, by table (catalog: query answers; roi: annotation reads) and encoding (raw, or zstd: buffers compressed)",
            tables.clone(),
        );
        for table in ["catalog", "roi"] {
            for encoding in ["raw", "zstd"] {
                let _ = tables.get_or_create(&TableLabels { table, encoding });
            }
        }
        let decode = Histogram::new(BUCKETS);
        registry.register_with_unit(
            "tessera_chunk_decode",
            "Time to materialize one cold chunk: read it from its source and cache it",
            Unit::Seconds,
            decode.clone(),
        );
        let write = Histogram::new(BUCKETS);
        registry.register_with_unit(
            "tessera_chunk_write",
            "Time to append one chunk to the file cache (for contiguous chunks, including the in-kernel copy from the source)",
            Unit::Seconds,
            write.clone(),
        );
        let open_connections = Gauge::default();
        registry.register(
            "tessera_open_connections",
            "Client connections open now",
            open_connections.clone(),
        );
        let connections = Counter::default();
        registry.register(
            "tessera_connections",
            "Client connections accepted",
            connections.clone(),
        );
        Self {
            inner: Arc::new(Recorded {
                registry,
                calls,
                served_do_get,
                served_located,
                bodies,
                tables,
                decode,
                write,
                open_connections,
                connections,
            }),
        }
    }

    /// Counts one finished call of `method` with `code` (names from [`Metered`]).
    fn record_call(&self, method: &'static str, code: &'static str) {
        self.inner
            .calls
            .get_or_create(&CallLabels { method, code })
            .inc();
    }

    /// Counts chunk bytes sent in `do_get` replies.
    pub fn record_do_get_bytes(&self, bytes: u64) {
        self.inner.served_do_get.inc_by(bytes);
    }

    /// Counts the body bytes of one `do_get` chunk reply sent with `encoding` (`raw` or
    /// `zstd`).
    pub fn record_do_get_body(&self, encoding: &'static str, bytes: u64) {
        self.inner
            .bodies
            .get_or_create(&EncodingLabels { encoding })
            .inc_by(bytes);
    }

    /// Counts one do_get reply of a table (`catalog` or `roi`) sent with `encoding`.
    pub fn record_table_reply(&self, table: &'static str, encoding: &'static str) {
        self.inner
            .tables
            .get_or_create(&TableLabels { table, encoding })
            .inc();
    }

    /// Counts chunk bytes handed out by `chunk_locate` (read by the client from the mapping).
    pub fn record_located_bytes(&self, bytes: u64) {
        self.inner.served_located.inc_by(bytes);
    }

    /// Records how long materializing one cold chunk (read from its source, then cached) took.
    pub fn record_decode(&self, elapsed: Duration) {
        self.inner.decode.observe(elapsed.as_secs_f64());
    }

    /// Records how long appending one chunk to the file cache took.
    pub fn record_write(&self, elapsed: Duration) {
        self.inner.write.observe(elapsed.as_secs_f64());
    }

    /// Counts an accepted connection, and counts it open until the guard is dropped (the
    /// connection of the accept loop holds it).
    pub fn connection_opened(&self) -> OpenConnection {
        self.inner.connections.inc();
        self.inner.open_connections.inc();
        OpenConnection {
            open: self.inner.open_connections.clone(),
        }
    }

    /// Appends the text exposition of the recorded series to `out`.
    pub fn encode(&self, out: &mut String) -> Result<(), MetricsError> {
        encode(out, &self.inner.registry)
    }
}

/// Appends the text exposition ([`CONTENT_TYPE`]) of `registry` to `out`.
pub fn encode(out: &mut String, registry: &Registry) -> Result<(), MetricsError> {
    prometheus_client::encoding::prometheus_text::encode(out, registry)?;
    Ok(())
}

/// One open connection in `tessera_open_connections`, from
/// [`Metrics::connection_opened`] until dropped.
#[derive(Debug)]
pub struct OpenConnection {
    open: Gauge,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.open.dec();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn text(metrics: &Metrics) -> String {
        let mut out = String::new();
        metrics.encode(&mut out).unwrap();
        out
    }

    #[test]
    fn counters_keep_their_names_help_and_labels() {
        let metrics = Metrics::new();
        metrics.record_call("DoGet", "OK");
        metrics.record_call("DoGet", "OK");
        metrics.record_call("GetFlightInfo", "UNKNOWN");
        metrics.record_do_get_bytes(100);
        metrics.record_do_get_bytes(23);
        metrics.record_do_get_body("zstd", 40);
        metrics.record_table_reply("roi", "zstd");
        let out = text(&metrics);
        for line in [
            "# HELP tessera_grpc_calls_total Finished gRPC calls by Flight method and status code.\n",
            "# TYPE tessera_grpc_calls_total counter\n",
            "tessera_grpc_calls_total{method=\"DoGet\",code=\"OK\"} 2\n",
            "tessera_grpc_calls_total{method=\"GetFlightInfo\",code=\"UNKNOWN\"} 1\n",
            "# TYPE tessera_served_bytes_total counter\n",
            "tessera_served_bytes_total{path=\"do_get\"} 123\n",
            "tessera_served_bytes_total{path=\"located\"} 0\n",
            "tessera_do_get_body_bytes_total{encoding=\"raw\"} 0\n",
            "tessera_do_get_body_bytes_total{encoding=\"zstd\"} 40\n",
            "tessera_table_replies_total{table=\"roi\",encoding=\"zstd\"} 1\n",
            "tessera_table_replies_total{table=\"catalog\",encoding=\"raw\"} 0\n",
            "# HELP tessera_connections_total Client connections accepted.\n",
            "tessera_connections_total 0\n",
        ] {
            assert!(out.contains(line), "{line:?} missing from:\n{out}");
        }
        assert!(!out.contains("_total_total"), "{out}");
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let metrics = Metrics::new();
        metrics.record_decode(Duration::from_micros(100));
        metrics.record_decode(Duration::from_millis(3));
        metrics.record_decode(Duration::from_secs(20));
        let out = text(&metrics);
        for line in [
            "# TYPE tessera_chunk_decode_seconds histogram\n",
            "tessera_chunk_decode_seconds_bucket{le=\"0.0005\"} 1\n",
            "tessera_chunk_decode_seconds_bucket{le=\"0.005\"} 2\n",
            "tessera_chunk_decode_seconds_bucket{le=\"10\"} 2\n",
            "tessera_chunk_decode_seconds_bucket{le=\"+Inf\"} 3\n",
            "tessera_chunk_decode_seconds_count 3\n",
            "tessera_chunk_write_seconds_count 0\n",
        ] {
            assert!(out.contains(line), "{line:?} missing from:\n{out}");
        }
    }

    #[test]
    fn open_connections_follow_their_guards_and_clones_share_the_registry() {
        let metrics = Metrics::new();
        let clone = metrics.clone();
        let first = clone.connection_opened();
        let second = metrics.connection_opened();
        assert!(text(&metrics).contains("tessera_open_connections 2\n"));
        drop(first);
        let out = text(&metrics);
        assert!(
            out.contains("# TYPE tessera_open_connections gauge\n"),
            "{out}"
        );
        assert!(out.contains("tessera_open_connections 1\n"), "{out}");
        assert!(out.contains("tessera_connections_total 2\n"), "{out}");
        drop(second);
        assert!(text(&clone).contains("tessera_open_connections 0\n"));
        // Another handle is another registry: nothing recorded there.
        assert!(text(&Metrics::new()).contains("tessera_connections_total 0\n"));
    }
}
