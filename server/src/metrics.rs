//! Prometheus metrics: process-wide counters and histograms, recorded with thin
//! calls from the Flight service, served as text on `GET /metrics` by a tiny
//! HTTP/1.1 responder (`--metrics-listen ADDR`).
//!
//! ```text
//!  gRPC call ─▶ Metered (tower wrapper) ─▶ tessera_grpc_calls_total{method,code}
//!                                          + one log line per failed call
//!  accepted TCP connection ─▶ Counted ─▶ tessera_open_connections (gauge)
//!  do_get / chunk_locate ─▶ tessera_served_bytes_total{path}
//!  cold chunk materialized / cache append ─▶ tessera_chunk_{decode,write}_seconds
//!  scrape ─▶ the above + ChunkService::stats() + registry and scan state
//! ```
//!
//! Labels have bounded cardinality: methods are the ten Flight RPC names (else
//! `unknown`), codes the seventeen gRPC codes; array ids never become labels.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tessera_proto::json::CacheBackend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::Code;
use tonic::codegen::http;
use tonic::server::NamedService;

use crate::flight::ServiceState;

/// Upper bounds (seconds) of the latency histogram buckets; `+Inf` follows.
const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// The Flight RPC names used as the `method` label.
const METHODS: [&str; 10] = [
    "Handshake",
    "ListFlights",
    "GetFlightInfo",
    "PollFlightInfo",
    "GetSchema",
    "DoGet",
    "DoPut",
    "DoExchange",
    "DoAction",
    "ListActions",
];
/// Largest HTTP request head the metrics responder reads.
const MAX_REQUEST_HEAD: usize = 8 << 10;
/// How long a scraper may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A latency histogram with fixed buckets.
#[derive(Default)]
struct Histogram {
    /// Per-bucket (not cumulative) counts; the last one is `+Inf`.
    counts: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    fn observe(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let bucket = BUCKETS
            .iter()
            .position(|&bound| secs <= bound)
            .unwrap_or(BUCKETS.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0u64;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            match BUCKETS.get(i) {
                Some(bound) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

/// The process-wide metrics.
#[derive(Default)]
pub struct Metrics {
    calls: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    served_do_get: AtomicU64,
    served_located: AtomicU64,
    decode: Histogram,
    write: Histogram,
    open_connections: AtomicI64,
    connections: AtomicU64,
}

/// The metrics of this process.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::default)
}

impl Metrics {
    /// Counts one finished call of `method` with `code`.
    pub fn record_call(&self, method: &'static str, code: Code) {
        *self
            .calls
            .lock()
            .entry((method, code_name(code)))
            .or_insert(0) += 1;
    }

    /// Counts chunk bytes sent in `do_get` replies.
    pub fn record_do_get_bytes(&self, bytes: u64) {
        self.served_do_get.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Counts chunk bytes handed out by `chunk_locate` (read by the client from the mapping).
    pub fn record_located_bytes(&self, bytes: u64) {
        self.served_located.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Records how long materializing one cold chunk (read from its source, then cached) took.
    pub fn record_decode(&self, elapsed: Duration) {
        self.decode.observe(elapsed);
    }

    /// Records how long appending one chunk to the file cache took.
    pub fn record_write(&self, elapsed: Duration) {
        self.write.observe(elapsed);
    }

    /// The text exposition (format 0.0.4) of these metrics and of `state`.
    pub fn render(&self, state: &ServiceState) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# HELP tessera_grpc_calls_total Finished gRPC calls by Flight method and status code."
        );
        let _ = writeln!(out, "# TYPE tessera_grpc_calls_total counter");
        for ((method, code), n) in self.calls.lock().iter() {
            let _ = writeln!(
                out,
                "tessera_grpc_calls_total{{method=\"{method}\",code=\"{code}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP tessera_served_bytes_total Chunk bytes served, by path: do_get (over the socket) or located (mapped by the client)."
        );
        let _ = writeln!(out, "# TYPE tessera_served_bytes_total counter");
        let do_get = self.served_do_get.load(Ordering::Relaxed);
        let located = self.served_located.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "tessera_served_bytes_total{{path=\"do_get\"}} {do_get}"
        );
        let _ = writeln!(
            out,
            "tessera_served_bytes_total{{path=\"located\"}} {located}"
        );
        self.decode.render(
            &mut out,
            "tessera_chunk_decode_seconds",
            "Time to materialize one cold chunk: read it from its source and cache it.",
        );
        self.write.render(
            &mut out,
            "tessera_chunk_write_seconds",
            "Time to append one chunk to the file cache (for contiguous chunks, including the in-kernel copy from the source).",
        );
        gauge(
            &mut out,
            "tessera_open_connections",
            "Client connections open now.",
            self.open_connections.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "tessera_connections_total",
            "Client connections accepted.",
            self.connections.load(Ordering::Relaxed),
        );
        render_cache(&mut out, state);
        render_sources(&mut out, state);
        out
    }
}

fn gauge(out: &mut String, name: &str, help: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} gauge");
    let _ = writeln!(out, "{name} {value}");
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
    let _ = writeln!(out, "{name} {value}");
}

fn render_cache(out: &mut String, state: &ServiceState) {
    let stats = state.chunks().stats();
    let backend = match stats.backend {
        CacheBackend::File => "file",
        CacheBackend::Memory => "memory",
    };
    let _ = writeln!(
        out,
        "# HELP tessera_cache_info The chunk cache backend in use."
    );
    let _ = writeln!(out, "# TYPE tessera_cache_info gauge");
    let _ = writeln!(out, "tessera_cache_info{{backend=\"{backend}\"}} 1");
    for (name, help, value) in [
        ("hits", "Cache lookups that found the chunk.", stats.hits),
        ("misses", "Cache lookups that did not.", stats.misses),
        (
            "evictions",
            "Chunks evicted to stay in budget.",
            stats.evictions,
        ),
        (
            "pending_waits",
            "Callers that waited for another caller's decode of the same chunk.",
            stats.pending_waits,
        ),
        (
            "locates",
            "Chunks handed out by chunk_locate.",
            stats.locates,
        ),
        ("do_gets", "Chunks requested over do_get.", stats.do_gets),
        (
            "budget_waits",
            "Cache appends that waited for eviction (cache over budget by a segment).",
            stats.budget_waits,
        ),
        (
            "budget_overruns",
            "Cache appends admitted over budget because eviction stalled.",
            stats.budget_overruns,
        ),
        (
            "read_aheads",
            "Chunks queued for decoding ahead of a sequential reader.",
            stats.read_aheads,
        ),
        (
            "write_failures",
            "Cache appends that failed (the chunk was served from memory).",
            stats.write_failures,
        ),
        (
            "disk_full",
            "Cache appends that failed because the filesystem was full.",
            stats.disk_full_events,
        ),
    ] {
        counter(out, &format!("tessera_cache_{name}_total"), help, value);
    }
    gauge(
        out,
        "tessera_cache_writes_paused",
        "1 while cache appends are paused after failures (chunks served from memory).",
        u8::from(stats.writes_paused.is_some()),
    );
    if let Some(ceiling) = stats.disk_ceiling_bytes {
        gauge(
            out,
            "tessera_cache_disk_ceiling_bytes",
            "Bytes the cache evicts down to while its filesystem is full.",
            ceiling,
        );
    }
    let pins = state.pins().stats();
    gauge(
        out,
        "tessera_pinned_bytes",
        "Bytes of chunk replies their peers have not read yet.",
        pins.held_bytes,
    );
    counter(
        out,
        "tessera_stalled_connections_closed_total",
        "Connections closed because their unread replies stalled.",
        pins.closed_connections,
    );
    gauge(
        out,
        "tessera_cache_bytes",
        "Bytes held by the cache.",
        stats.total_bytes,
    );
    gauge(
        out,
        "tessera_cache_max_bytes",
        "Cache budget in bytes.",
        stats.max_bytes,
    );
    gauge(
        out,
        "tessera_cache_entries",
        "Chunks held by the cache.",
        stats.total_entries,
    );
}

fn render_sources(out: &mut String, state: &ServiceState) {
    gauge(
        out,
        "tessera_sources",
        "Sources served.",
        state.source_count(),
    );
    let scan = state.scan_status();
    gauge(
        out,
        "tessera_full_scan_in_progress",
        "1 while the sources are being rescanned.",
        u8::from(scan.in_progress()),
    );
    if let Some(at) = scan.last_finished_at() {
        gauge(
            out,
            "tessera_last_full_scan_finished_timestamp_seconds",
            "Unix time the last full scan of the sources finished.",
            at,
        );
    }
}

/// The canonical upper-case name of a gRPC code.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The Flight method named by a gRPC request path, or `unknown`.
fn method_name(path: &str) -> &'static str {
    let name = path.rsplit('/').next().unwrap_or_default();
    METHODS
        .iter()
        .find(|m| **m == name)
        .copied()
        .unwrap_or("unknown")
}

/// A gRPC service wrapper that counts every call by method and status code and
/// logs one line per failed call with its cause (the status message).
#[derive(Clone, Debug)]
pub struct Metered<S> {
    inner: S,
}

impl<S> Metered<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S: NamedService> NamedService for Metered<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> tonic::codegen::Service<http::Request<B>> for Metered<S>
where
    S: tonic::codegen::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = method_name(request.uri().path());
        let call = self.inner.call(request);
        Box::pin(async move {
            let result = call.await;
            if let Ok(response) = &result {
                // Failures before the first message travel as a trailers-only
                // response: the status is in the headers. Streams that started
                // end with OK (Tessera's replies never fail mid-stream).
                let status = tonic::Status::from_header_map(response.headers());
                let code = status.as_ref().map_or(Code::Ok, tonic::Status::code);
                global().record_call(method, code);
                if let Some(status) = status.filter(|s| s.code() != Code::Ok) {
                    log_failure(method, &status);
                }
            }
            result
        })
    }
}

/// One line per failed call: server faults at error, unavailability at warn, the
/// caller's mistakes (unknown id, bad ticket, missing token) at info.
fn log_failure(method: &str, status: &tonic::Status) {
    let code = code_name(status.code());
    let cause = status.message();
    match status.code() {
        Code::Internal | Code::DataLoss => {
            tracing::error!(method, code, cause, "call failed");
        }
        Code::Unavailable | Code::ResourceExhausted => {
            tracing::warn!(method, code, cause, "call failed");
        }
        _ => tracing::info!(method, code, cause, "call failed"),
    }
}

/// Counts one accepted connection in `tessera_open_connections` while it lives (held by
/// the connection, `crate::listener::Admitted`).
#[derive(Debug)]
pub struct Counted(());

impl Counted {
    /// Counts a connection as open until this is dropped.
    pub fn new() -> Self {
        let metrics = global();
        metrics.connections.fetch_add(1, Ordering::Relaxed);
        metrics.open_connections.fetch_add(1, Ordering::Relaxed);
        Self(())
    }
}

impl Default for Counted {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        global().open_connections.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The `GET /metrics` responder, bound and ready to run.
pub struct MetricsServer {
    listener: TcpListener,
}

impl MetricsServer {
    /// Binds `addr`.
    pub async fn bind(addr: SocketAddr) -> io::Result<Self> {
        Ok(Self {
            listener: TcpListener::bind(addr).await?,
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Answers scrapes until the task is dropped or aborted; one connection per scrape.
    pub async fn run(self, state: Arc<ServiceState>) {
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) => {
                    let state = state.clone();
                    tokio::spawn(async move {
                        if let Err(err) = answer(stream, &state).await {
                            tracing::debug!(error = %err, "metrics scrape failed");
                        }
                    });
                }
                Err(err) => {
                    tracing::warn!(error = %err, "metrics listener cannot accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Reads one request head and writes one response, then closes.
async fn answer(mut stream: TcpStream, state: &ServiceState) -> io::Result<()> {
    let head = tokio::time::timeout(REQUEST_TIMEOUT, read_head(&mut stream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "request head timed out"))??;
    let mut parts = head.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            global().render(state),
        ),
        ("GET", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "only /metrics is served here\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "use GET /metrics\n".to_string(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// The request line and headers, up to the blank line.
async fn read_head(stream: &mut TcpStream) -> io::Result<String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        if buf.len() > MAX_REQUEST_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head too large",
            ));
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(100));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(20));
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.0005\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.005\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"10\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count 3\n"), "{out}");
    }

    #[test]
    fn method_labels_are_bounded() {
        assert_eq!(
            method_name("/arrow.flight.protocol.FlightService/DoGet"),
            "DoGet"
        );
        assert_eq!(method_name("/evil/xyz"), "unknown");
        assert_eq!(code_name(Code::Unauthenticated), "UNAUTHENTICATED");
    }
}
