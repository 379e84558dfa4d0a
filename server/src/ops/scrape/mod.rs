//! The `GET /metrics` endpoint (`--metrics-listen ADDR`), served by axum over HTTP/1.1:
//! the recorded series of the service's [`Metrics`] followed by the [`StateCollector`]'s
//! figures read from the service state at scrape time. Every other path answers 404, other
//! methods on `/metrics` 405. When the server has a token, a scrape must carry it
//! (`Authorization: Bearer TOKEN`) or is answered 401. Connections are capped and timed
//! ([`ScrapeListener`]); every reply closes its connection.

mod collector;
mod listener;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

pub use collector::StateCollector;
pub use listener::{ScrapeLimits, ScrapeListener};

use crate::metrics::{CONTENT_TYPE, Metrics, MetricsError};
use crate::state::ServiceState;
use crate::wire::flight::auth::TokenCheck;

/// Default cap on connections to the `/metrics` endpoint held at once.
pub const DEFAULT_METRICS_MAX_CONNECTIONS: usize = 16;
/// Default longest life of a connection to the `/metrics` endpoint (Prometheus's default
/// scrape timeout).
pub const DEFAULT_METRICS_TIMEOUT: Duration = Duration::from_secs(10);

/// The `GET /metrics` endpoint, bound and ready to run.
pub struct MetricsServer {
    listener: ScrapeListener,
    check: TokenCheck,
}

impl MetricsServer {
    /// Binds `addr`; connections are held within `limits`, and with a `token` every scrape
    /// must carry it.
    pub async fn bind(
        addr: SocketAddr,
        limits: ScrapeLimits,
        token: Option<String>,
    ) -> io::Result<Self> {
        Ok(Self {
            listener: ScrapeListener::new(TcpListener::bind(addr).await?, limits),
            check: TokenCheck::new(token),
        })
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Answers scrapes of `state` (its [`ServiceState::metrics`] and its state figures)
    /// until the task is dropped or aborted.
    pub async fn run(self, state: Arc<ServiceState>) {
        let router = router(Scrape::new(state, self.check));
        if let Err(err) = axum::serve(self.listener, router).await {
            tracing::warn!(error = %err, "metrics endpoint stopped");
        }
    }
}

/// What one scrape encodes.
struct Scrape {
    metrics: Metrics,
    /// Holds the [`StateCollector`] only: the state is read when it is encoded.
    state: Registry,
    check: TokenCheck,
}

impl Scrape {
    fn new(state: Arc<ServiceState>, check: TokenCheck) -> Arc<Self> {
        let metrics = state.metrics().clone();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(StateCollector::new(state)));
        Arc::new(Self {
            metrics,
            state: registry,
            check,
        })
    }

    fn text(&self) -> Result<String, MetricsError> {
        let mut out = String::new();
        self.metrics.encode(&mut out)?;
        crate::metrics::encode(&mut out, &self.state)?;
        Ok(out)
    }
}

fn router(scrape: Arc<Scrape>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(axum::middleware::map_response(close_connection))
        .with_state(scrape)
}

/// Every reply ends its connection: one scrape, one connection, bounded by its timeout.
async fn close_connection(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

async fn metrics(State(scrape): State<Arc<Scrape>>, headers: HeaderMap) -> Response {
    if let Err(refused) = scrape.check.check(&headers) {
        tracing::info!(cause = refused.message(), "metrics scrape refused");
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            format!(
                "{}: this server has a token; scrape with 'Authorization: Bearer TOKEN' \
                 (Prometheus: authorization.credentials in the scrape config)\n",
                refused.message()
            ),
        )
            .into_response();
    }
    match scrape.text() {
        Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        Err(err) => {
            tracing::warn!(error = %err, "metrics scrape failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot encode the metrics\n",
            )
                .into_response()
        }
    }
}

async fn not_found() -> (StatusCode, &'static str) {
    (StatusCode::NOT_FOUND, "only /metrics is served here\n")
}

/// A service state over no sources and a memory cache of 1 MiB, recording into `metrics`.
#[cfg(test)]
fn test_state(metrics: &Metrics) -> Arc<ServiceState> {
    use crate::chunks::{ChunkService, MemoryStore};
    use crate::source::registry::{OpenOptions, Registry as Sources};

    let Ok(store) = MemoryStore::new(1 << 20, "test".to_string()) else {
        panic!("a memory chunk store");
    };
    let chunks = ChunkService::new(Arc::new(store), 1 << 20, 1);
    let options = OpenOptions::with_target(8 << 20);
    let chunks = Arc::new(chunks.with_metrics(metrics.clone()));
    Arc::new(ServiceState::new(Sources::default(), options, chunks).with_metrics(metrics.clone()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use tessera_test_support::http::http_request;

    use super::*;

    #[tokio::test]
    async fn serves_metrics_and_refuses_other_paths() {
        let metrics = Metrics::new();
        let state = super::test_state(&metrics);
        metrics.record_do_get_bytes(7);
        let limits = ScrapeLimits {
            max_connections: DEFAULT_METRICS_MAX_CONNECTIONS,
            timeout: DEFAULT_METRICS_TIMEOUT,
        };
        let server = MetricsServer::bind("127.0.0.1:0".parse().unwrap(), limits, None)
            .await
            .unwrap();
        let addr = server.local_addr().unwrap();
        let task = tokio::spawn(server.run(state));

        let ok = http_request(addr, "GET", "/metrics").await;
        assert_eq!(ok.status, 200, "{ok:?}");
        assert_eq!(
            ok.content_type.as_deref(),
            Some("text/plain; version=0.0.4; charset=utf-8")
        );
        let body = &ok.body;
        assert!(
            body.contains("tessera_served_bytes_total{path=\"do_get\"} 7\n"),
            "{body}"
        );
        assert!(
            body.contains("tessera_cache_info{backend=\"memory\"} 1\n"),
            "{body}"
        );
        assert!(!body.contains("# EOF"), "{body}");

        assert_eq!(http_request(addr, "GET", "/other").await.status, 404);
        assert_eq!(http_request(addr, "POST", "/metrics").await.status, 405);
        task.abort();
    }
}
