//! The HTTP API (`--http-listen ADDR`): tiles, slices, the catalog tree and annotations for
//! browsers and plain HTTP clients, in the contract of biopb's HTTP sidecar (its
//! `http-server.md` and `http-server-tile-endpoints.md`), served in-process by axum over
//! HTTP/1.1 with the viewer page at `/` (docs/guides/web.md, docs/decisions/0035); HTTPS on
//! the Flight endpoint's certificate when the server has one.
//!
//! ```text
//!  GET  /livez /readyz /healthz          no token
//!  GET  / and /viewer/*                  the page (embedded; no data, no token)
//!  GET  /api/tree?key=&limit=            a level of the catalog tree      ─┐
//!  GET  /api/tile_info/{array_id}        the tile grid and pyramid         │ token, when
//!  GET  /api/tile/{array_id}?level=…     one tile, raw little-endian       │ the server
//!  POST /api/slice                       a region at a scale, raw          │ has one
//!  GET  /api/rois/{array_id}?set=        the tensor's annotations         ─┘
//! ```
//!
//! Reads go through the Flight service's request path ([`read`]): the same chunk ids, the
//! same chunk cache, no gRPC hop. Connections are capped ([`listener`]), every request is
//! bounded in time and body size, and refusals answer `{"detail": "..."}` like the sidecar.
//! Cross-origin pages are refused unless their origins are configured ([`cors`]).

mod api;
mod cors;
mod encoding;
mod listener;
mod read;
mod tiles;
mod viewer;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

pub use cors::CorsOrigins;
pub use listener::{HttpLimits, HttpListener};

use crate::error::ServiceError;
use crate::source::sources::LookupError;
use crate::state::ServiceState;
use crate::wire::flight::auth::TokenCheck;

/// Connections the HTTP listener holds at once by default.
pub const DEFAULT_HTTP_MAX_CONNECTIONS: usize = 256;
/// The longest one HTTP request may take by default.
pub const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(120);
/// The port the HTTP API listens on by default (on 127.0.0.1).
pub const DEFAULT_HTTP_PORT: u16 = 8817;
/// The largest request body accepted (a slice request is a few hundred bytes).
const MAX_BODY_BYTES: usize = 64 << 10;

/// Why an HTTP request was refused or failed; answered as `{"detail": "..."}` with the
/// status each names.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// What the request path answered (its status mapped from the gRPC one).
    #[error(transparent)]
    Service(#[from] ServiceError),
    /// A request that names something that is not there (404).
    #[error("{0}")]
    NotFound(String),
    /// A request whose values cannot be served (422).
    #[error("{0}")]
    Invalid(String),
    /// A form the contract withdrew (410).
    #[error("{0}")]
    Gone(String),
    /// A read larger than one answer may be (413).
    #[error(
        "{what} is over the {max} bytes one HTTP read answers; ask a smaller region or a coarser scale"
    )]
    TooLarge {
        /// The read.
        what: String,
        /// The bound.
        max: u64,
    },
    /// A feature this server was started without (501).
    #[error("{0}")]
    NotOffered(String),
    /// A fault of the server (500).
    #[error("{0}")]
    Internal(String),
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let (status, detail) = match self {
            Self::Service(err) => {
                let detail = err.to_string();
                let status = match &err {
                    ServiceError::Lookup(
                        LookupError::UnknownSource(_)
                        | LookupError::UnknownField { .. }
                        | LookupError::NoTensorsYet(_),
                    ) => StatusCode::NOT_FOUND,
                    _ if matches!(err.clone().into_value_error(), ServiceError::Value(_)) => {
                        StatusCode::UNPROCESSABLE_ENTITY
                    }
                    _ => http_status(tonic::Status::from(err).code()),
                };
                (status, detail)
            }
            Self::NotFound(text) => (StatusCode::NOT_FOUND, text),
            Self::Invalid(text) => (StatusCode::UNPROCESSABLE_ENTITY, text),
            Self::Gone(text) => (StatusCode::GONE, text),
            err @ Self::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, err.to_string()),
            Self::NotOffered(text) => (StatusCode::NOT_IMPLEMENTED, text),
            Self::Internal(text) => (StatusCode::INTERNAL_SERVER_ERROR, text),
        };
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), %detail, "http request failed");
        }
        json_response(status, &serde_json::json!({ "detail": detail }))
    }
}

/// The HTTP status of a gRPC code the request path answered.
fn http_status(code: tonic::Code) -> StatusCode {
    use tonic::Code;
    match code {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
            StatusCode::UNPROCESSABLE_ENTITY
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unavailable | Code::ResourceExhausted => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
        _ => StatusCode::UNPROCESSABLE_ENTITY,
    }
}

/// A JSON body with its content type.
fn json_response(status: StatusCode, value: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// The bound HTTP endpoint, run beside the Flight service on the same state.
pub struct HttpServer {
    listener: HttpListener,
    check: TokenCheck,
    limits: HttpLimits,
    cors: CorsOrigins,
}

impl HttpServer {
    /// Binds `addr`; requests must carry `token` when one is given; every connection is
    /// HTTPS through `tls` when one is given.
    pub async fn bind(
        addr: SocketAddr,
        limits: HttpLimits,
        token: Option<String>,
        tls: Option<TlsAcceptor>,
    ) -> io::Result<Self> {
        Ok(Self {
            listener: HttpListener::new(TcpListener::bind(addr).await?, limits, tls),
            check: TokenCheck::new(token),
            limits,
            cors: CorsOrigins::default(),
        })
    }

    /// Lets pages from `cors`'s origins call the API (none: CORS off, the default).
    pub fn with_cors(mut self, cors: CorsOrigins) -> Self {
        self.cors = cors;
        self
    }

    /// The address bound.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// `https` or `http`: what a browser's address starts with.
    pub fn scheme(&self) -> &'static str {
        self.listener.scheme()
    }

    /// Serves until the task is dropped.
    pub async fn run(self, state: Arc<ServiceState>) {
        let api = Arc::new(Api {
            state,
            check: self.check,
            timeout: self.limits.timeout,
            cors: self.cors,
        });
        if let Err(err) = axum::serve(self.listener, router(api)).await {
            tracing::warn!(error = %err, "http endpoint stopped");
        }
    }
}

/// What every handler shares.
struct Api {
    state: Arc<ServiceState>,
    check: TokenCheck,
    timeout: Duration,
    cors: CorsOrigins,
}

fn router(api: Arc<Api>) -> Router {
    let protected = Router::new()
        .route("/api/tree", get(api::tree))
        .route("/api/tile_info/{*array_id}", get(tiles::tile_info))
        .route("/api/tile/{*array_id}", get(tiles::tile))
        .route("/api/slice", post(api::slice))
        .route("/api/rois/{*array_id}", get(api::rois))
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            require_token,
        ));
    Router::new()
        .route("/livez", get(api::livez))
        .route("/readyz", get(api::readyz))
        .route("/healthz", get(api::readyz))
        .route("/", get(viewer::page))
        .route("/viewer/{file}", get(viewer::asset))
        .merge(protected)
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(api.clone(), bounded))
        // Outermost: a preflight is answered before the token check and the bounds.
        .layer(axum::middleware::from_fn_with_state(
            api.clone(),
            cors::cors,
        ))
        .with_state(api)
}

/// Every request: at most [`MAX_BODY_BYTES`] of body and the configured time.
async fn bounded(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
    let too_long = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .is_some_and(|n| n > MAX_BODY_BYTES);
    if too_long {
        return json_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            &serde_json::json!({
                "detail": format!("request bodies are at most {MAX_BODY_BYTES} bytes")
            }),
        );
    }
    match tokio::time::timeout(api.timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => json_response(
            StatusCode::GATEWAY_TIMEOUT,
            &serde_json::json!({
                "detail": format!("the request took longer than --http-timeout ({:?})", api.timeout)
            }),
        ),
    }
}

/// The token check of the Flight service, on `Authorization: Bearer TOKEN` (or biopb's
/// `X-Biopb-Token: TOKEN`).
async fn require_token(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
    let headers = bearer_headers(request.headers());
    if let Err(refused) = api.check.check(&headers) {
        let mut response = json_response(
            StatusCode::UNAUTHORIZED,
            &serde_json::json!({
                "detail": format!(
                    "{}: this server has a token; send 'Authorization: Bearer TOKEN'",
                    refused.message()
                )
            }),
        );
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    next.run(request).await
}

/// The headers the token is checked on: `X-Biopb-Token` stands for a missing
/// `Authorization`.
fn bearer_headers(headers: &HeaderMap) -> HeaderMap {
    let mut out = HeaderMap::new();
    if let Some(auth) = headers.get(header::AUTHORIZATION) {
        out.insert(header::AUTHORIZATION, auth.clone());
    } else if let Some(token) = headers.get("x-biopb-token")
        && let Ok(value) = HeaderValue::from_bytes(&[b"Bearer ", token.as_bytes()].concat())
    {
        out.insert(header::AUTHORIZATION, value);
    }
    out
}

async fn not_found(request: Request) -> Response {
    HttpError::NotFound(format!("no such endpoint: {}", request.uri().path())).into_response()
}
