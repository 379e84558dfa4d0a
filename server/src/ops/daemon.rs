//! The daemon: open the cache, scan the sources, bind, serve until told to stop.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use tessera_segments::{Store, StoreError, StoreOptions};
use tokio::net::TcpListener;

use crate::chunks::{ChunkService, ChunkStore, MemoryStore, SegmentFiles};
use crate::error::NoAnnotations;
use crate::metrics::{Metered, Metrics};
use crate::objstore::{Bucket, ObjectStoreError};
use crate::ops::config::blocks::{CacheValues, WritesValues};
use crate::ops::config::value::ExternalLocation;
use crate::ops::config::{CacheKind, Settings};
use crate::ops::scrape::MetricsServer;
use crate::ops::watch::Watcher;
use crate::rois::seal::{KeyError, Sealer};
use crate::rois::{Annotations, RoiLimits};
use crate::source::ids::IdBook;
use crate::source::npy::Limits;
use crate::source::registry::{OpenOptions, Registry};
use crate::state::ServiceState;
use crate::state_dir::{StateDir, StateDirError};
use crate::uploads::Uploads;
use crate::upstream::{Upstream, UpstreamError};
use crate::wire::flight::TesseraFlight;
use crate::wire::flight::auth::{Authenticated, TokenCheck, validate_token};
use crate::wire::flight::chunk_get::ChunkGet;
use crate::wire::http::HttpServer;
use crate::wire::listener::{Admission, CountCalls, incoming};
use crate::wire::tls::TlsIdentity;

/// Largest message the server sends: a 64 MiB chunk plus its header, with room to spare.
const MAX_ENCODE_BYTES: usize = 80 << 20;
/// Largest request accepted: plans and tickets are small, a DoPut message is one chunk of an
/// upload (cut to fit: `uploads::MAX_UPLOAD_CHUNK_BYTES`); this bounds hostile ones.
const MAX_DECODE_BYTES: usize = crate::uploads::MAX_PUT_MESSAGE_BYTES as usize;
/// How long in-flight calls may run after a stop signal before the process exits anyway.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// Deadline of every call (a shorter `grpc-timeout` from the client wins): time to plan, or to
/// decode a cold chunk and send its response headers. A caller that gives up frees its task;
/// a full-resolution decode already running on the blocking pool still finishes and is cached
/// for the next call; a scaled one stops at its next piece once no caller waits for it.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// Concurrent HTTP/2 streams one connection may hold open. Each `do_get` stream holds at most
/// one encoded chunk, so this bounds what one connection can pin in memory.
const MAX_STREAMS_PER_CONNECTION: u32 = 64;
/// Keepalive pings find peers that vanished without closing, so their streams are dropped.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
/// A ping not acknowledged within this closes the connection.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// Why the daemon could not start or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Listening on a non-loopback address without a token.
    #[error(
        "refusing to listen on {0} without a token: anyone who can reach it could read every source. \
         Set one with --token TOKEN or TESSERA_TOKEN (16-128 chars of [A-Za-z0-9_-]), or listen on 127.0.0.1"
    )]
    ExposedWithoutToken(SocketAddr),
    /// Serving metrics on a non-loopback address without a token.
    #[error(
        "refusing to serve metrics on {0} without a token: anyone who can reach it could read \
         the server's figures and hold its connections. Set one with --token TOKEN or \
         TESSERA_TOKEN (scrapes then send 'Authorization: Bearer TOKEN'), or use \
         --metrics-listen 127.0.0.1:PORT"
    )]
    MetricsExposedWithoutToken(SocketAddr),
    /// Serving the HTTP API on a non-loopback address without a token.
    #[error(
        "refusing to serve the HTTP API on {0} without a token: anyone who can reach it could \
         read every source. Set one with --token TOKEN or TESSERA_TOKEN, or use \
         --http-listen 127.0.0.1:PORT (or off)"
    )]
    HttpExposedWithoutToken(SocketAddr),
    /// The token has the wrong form.
    #[error("{0}")]
    BadToken(#[from] crate::wire::flight::auth::BadToken),
    /// Another process holds the cache directory.
    #[error(
        "cache directory is in use: {0}; give this server a directory of its own with \
         --cache-dir DIR (or TESSERA_CACHE_DIR), or stop the other one"
    )]
    CacheLocked(StoreError),
    /// The state directory of a writable server cannot be used.
    #[error("{0}")]
    StateDir(#[from] StateDirError),
    /// The uploads kept in the state directory cannot be opened.
    #[error("uploads: {0}")]
    Uploads(#[from] crate::uploads::UploadError),
    /// The chunk cache could not be set up.
    #[error("chunk cache: {0}")]
    Cache(String),
    /// Binding the listen address failed.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The TLS certificate or key cannot be used.
    #[error("{0}")]
    Tls(#[from] crate::wire::tls::TlsError),
    /// The shared ROI seal key (`--seal-key-file`) cannot be used.
    #[error("{0}")]
    SealKey(#[from] KeyError),
    /// An upstream tensor server cannot be used as configured.
    #[error("{0}")]
    Upstream(#[from] UpstreamError),
    /// An object-store source cannot be set up as configured.
    #[error("{0}")]
    ObjectStore(#[from] ObjectStoreError),
}

/// A bound, ready-to-run server.
pub struct Daemon {
    listener: TcpListener,
    admission: Admission,
    state: Arc<ServiceState>,
    token: Option<String>,
    tls: Option<TlsIdentity>,
    metrics_server: Option<MetricsServer>,
    http_server: Option<HttpServer>,
    watcher: Option<Watcher>,
    upstreams: Vec<Arc<Upstream>>,
    upstream_poll: std::time::Duration,
    buckets: Vec<Arc<Bucket>>,
    object_store_rescan: std::time::Duration,
}

impl Daemon {
    /// Opens the cache, scans the sources and binds the listen address, as the resolved
    /// `settings` say.
    pub async fn bind(settings: &Settings) -> Result<Daemon, DaemonError> {
        let listen = settings.listener.listen;
        let token = settings.listener.token.clone();
        if let Some(token) = &token {
            validate_token(token)?;
        } else if !listen.ip().is_loopback() {
            return Err(DaemonError::ExposedWithoutToken(listen));
        } else if let Some(addr) = settings.operations.metrics_listen
            && !addr.ip().is_loopback()
        {
            return Err(DaemonError::MetricsExposedWithoutToken(addr));
        }
        let http = settings.operations.http_address();
        if let Some((addr, _)) = http
            && !addr.ip().is_loopback()
            && token.is_none()
        {
            return Err(DaemonError::HttpExposedWithoutToken(addr));
        }
        let tls = match &settings.tls {
            Some(paths) => Some(TlsIdentity::load(&paths.cert, &paths.key)?),
            None => None,
        };
        let shared_seal = match &settings.writes.seal_key_file {
            Some(path) => Some(Sealer::shared(path)?),
            None => None,
        };
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| DaemonError::Bind {
                addr: listen,
                source,
            })?;
        let scheme = if tls.is_some() { "grpcs" } else { "grpc" };
        let holder = match listener.local_addr() {
            Ok(addr) => format!("listening on {scheme}://{addr}"),
            Err(_) => format!("listening on {scheme}://{listen}"),
        };
        let external_location = settings.listener.external_location.clone().or_else(|| {
            ExternalLocation::of_listen(listener.local_addr().unwrap_or(listen), tls.is_some())
        });
        match &external_location {
            Some(location) => tracing::info!(%location, "health advertises this address"),
            None if listen.ip().is_unspecified() => tracing::info!(
                "health advertises no address: {listen} names no interface; set \
                 --external-location URL for clients on other machines (dask workers)"
            ),
            None => {}
        }
        let (chunks, sources, writes) = (&settings.chunks, &settings.sources, &settings.writes);
        let store = open_store(&settings.cache, &holder)?;
        let state_dir = open_state_dir(writes, &holder)?;
        let annotations = open_annotations(writes, state_dir.as_deref(), shared_seal);
        let uploads = open_uploads(settings, state_dir.as_deref())?;
        let options = OpenOptions {
            limits: Limits::default(),
            target_chunk_bytes: chunks.chunk_target.get(),
            mapped_chunk_bytes: chunks
                .loopback_plans
                .coarse_target(chunks.mapped_chunk_target.get()),
            follow_links_outside: sources.follow_links_outside,
            max_sources: sources.max_sources,
        };
        crate::source::npy::handles::set_max_open(sources.max_open_sources);
        let specs = settings.source_specs();
        let watcher = sources
            .watch
            .then(|| Watcher::new(specs.clone(), options.clone(), sources.watch_interval.get()));
        let scan_options = options.clone();
        let ids = source_ids(state_dir.as_deref());
        let (registry, _problems) = tokio::task::spawn_blocking(move || {
            Registry::scan_with_ids(&specs, &scan_options, ids)
        })
        .await
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "source scan failed");
            (Registry::default(), Vec::new())
        });
        let decoders = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .max(2);
        // The one handle everything records into and `/metrics` encodes.
        let metrics = Metrics::new();
        let service = ChunkService::new(store, settings.cache.memory_bytes(), decoders)
            .with_upstream_fetches(sources.upstream_fetches)
            .with_read_ahead(chunks.read_ahead.get())
            .with_settle_window(chunks.settle_window.get())
            .with_scaled_decode_budget(chunks.max_scaled_decode_memory.get())
            .with_wire_compression(
                chunks.wire_compression,
                chunks.wire_compression_memory.get(),
                chunks.label_tensors().unwrap_or_default(),
            )
            .with_metrics(metrics.clone());
        let state = Arc::new(
            ServiceState::new(registry, options, Arc::new(service))
                .with_unread_limits(settings.unread_replies.limits())
                .with_loopback_plans(chunks.loopback_plans)
                .with_pyramid(settings.pyramid.policy())
                .with_metrics(metrics)
                .with_runtime_roots(sources.runtime_roots())
                .with_writes(writes.writable, state_dir)
                .with_annotations(annotations)
                .with_external_location(external_location.map(String::from))
                .with_uploads(uploads),
        );
        let tree_state = state.clone();
        // The catalog tree of the first scan, built before the first call needs it.
        let _ = tokio::task::spawn_blocking(move || tree_state.catalog_tree()).await;
        let upstreams = open_upstreams(settings)?;
        for upstream in &upstreams {
            sync_upstream(upstream, &state, true).await;
        }
        let buckets = open_buckets(settings)?;
        for bucket in &buckets {
            sync_bucket(bucket, &state, true).await;
        }
        state.scan_status().finish();
        let metrics_server = match settings.operations.metrics_listen {
            Some(addr) => Some(
                MetricsServer::bind(addr, settings.operations.scrape_limits(), token.clone())
                    .await
                    .map_err(|source| DaemonError::Bind { addr, source })?,
            ),
            None => None,
        };
        let http_server = match http {
            Some((addr, configured)) => {
                let https = tls.as_ref().map(TlsIdentity::https_acceptor);
                let limits = settings.operations.http_limits();
                match HttpServer::bind(addr, limits, token.clone(), https).await {
                    Ok(server) => Some(server.with_cors(settings.operations.http_cors())),
                    Err(source) if configured => {
                        return Err(DaemonError::Bind { addr, source });
                    }
                    Err(err) => {
                        tracing::info!(
                            error = %err,
                            "HTTP API not served: the default address {addr} is taken \
                             (choose one with --http-listen ADDR, or --http-listen off)"
                        );
                        None
                    }
                }
            }
            None => None,
        };
        Ok(Daemon {
            listener,
            http_server,
            admission: Admission {
                seats: settings.seat_limits(),
                handshake_timeout: settings.listener.handshake_timeout.get(),
            },
            state,
            token,
            tls,
            metrics_server,
            watcher,
            upstreams,
            upstream_poll: settings.sources.upstream_poll.get(),
            buckets,
            object_store_rescan: settings.sources.object_store_rescan.get(),
        })
    }

    /// The address of the `/metrics` endpoint, if one is bound.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_server
            .as_ref()
            .and_then(|m| m.local_addr().ok())
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, std::io::Error> {
        self.listener.local_addr()
    }

    /// The shared service state.
    pub fn state(&self) -> &Arc<ServiceState> {
        &self.state
    }

    /// Serves until `shutdown` resolves, lets in-flight calls finish (bounded), then
    /// seals the cache.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), DaemonError> {
        let addr = self.listener.local_addr().ok();
        let service = FlightServiceServer::new(TesseraFlight::new(self.state.clone()))
            .max_encoding_message_size(MAX_ENCODE_BYTES)
            .max_decoding_message_size(MAX_DECODE_BYTES);
        // Chunk DoGets bypass tonic's encoder (one copy of the chunk fewer) with the same
        // request limit; the token is checked once per call, in front of both routes; every
        // call is counted, refusals included.
        let service = ChunkGet::new(service, self.state.clone(), MAX_DECODE_BYTES);
        let service = Authenticated::new(service, TokenCheck::new(self.token.clone()))
            .with_sealed_roi_reads();
        let service = Metered::new(service, self.state.metrics().clone());
        // Outermost: a call is in flight on its connection until its reply is gone, so
        // only connections without one are closed to make room (`--reclaim-idle-after`).
        let service = CountCalls::new(service);
        let mut side_tasks = Vec::new();
        if let Some(metrics) = self.metrics_server {
            if let Ok(at) = metrics.local_addr() {
                tracing::info!("metrics on http://{at}/metrics");
            }
            side_tasks.push(tokio::spawn(metrics.run(self.state.clone())));
        }
        if let Some(http) = self.http_server {
            if let Ok(at) = http.local_addr() {
                tracing::info!("viewer and HTTP API on {}://{at}/", http.scheme());
            }
            side_tasks.push(tokio::spawn(http.run(self.state.clone())));
        }
        side_tasks.push(tokio::spawn(self.state.unread().clone().run_reaper()));
        if let Some(watcher) = self.watcher {
            side_tasks.push(tokio::spawn(watcher.run(self.state.clone())));
        }
        side_tasks.push(tokio::spawn(note_served_annotations(self.state.clone())));
        for upstream in self.upstreams {
            side_tasks.push(tokio::spawn(follow_upstream(
                upstream,
                self.state.clone(),
                self.upstream_poll,
            )));
        }
        for bucket in self.buckets {
            side_tasks.push(tokio::spawn(follow_bucket(
                bucket,
                self.state.clone(),
                self.object_store_rescan,
            )));
        }
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let stopping_state = self.state.clone();
        let signal = async move {
            shutdown.await;
            stopping_state.begin_stopping();
            tracing::info!("stop requested; finishing in-flight calls");
            let _ = stopping_tx.send(());
        };
        let scheme = if self.tls.is_some() { "grpcs" } else { "grpc" };
        if let Some(addr) = addr {
            tracing::info!("listening on {scheme}://{addr}");
            tracing::info!("{}", read_hint(&self.state, &format!("{scheme}://{addr}")));
        }
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = &self.tls {
            builder = builder.tls_config(tls.server_config())?;
        }
        let server = builder
            .timeout(CALL_TIMEOUT)
            .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
            .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
            .initial_stream_window_size(16 << 20)
            .initial_connection_window_size(32 << 20)
            .max_frame_size(1 << 20)
            .add_service(service)
            .serve_with_incoming_shutdown(
                incoming(
                    self.listener,
                    self.admission,
                    self.state.unread().clone(),
                    self.state.metrics().clone(),
                ),
                signal,
            );
        tokio::pin!(server);
        let grace = async {
            if stopping_rx.await.is_ok() {
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let result = tokio::select! {
            r = &mut server => r.map_err(DaemonError::from),
            () = grace => {
                tracing::warn!("in-flight calls did not finish within {SHUTDOWN_GRACE:?}; stopping anyway");
                Ok(())
            }
        };
        for task in &side_tasks {
            task.abort();
        }
        // An aborted task lets go of the service state only once the runtime drops it.
        for task in side_tasks {
            let _ = task.await;
        }
        self.state.chunks().close();
        tracing::info!("stopped");
        result
    }
}

/// The startup line that says how to read what is served: the `tessera ls` command and
/// the Python line of the biopb client, with the first served id.
fn read_hint(state: &ServiceState, location: &str) -> String {
    let first = state
        .sources()
        .read()
        .tensors()
        .map(|t| t.array_id.clone())
        .min();
    let tls = if location.starts_with("grpcs") {
        " --tls-ca CERT.pem"
    } else {
        ""
    };
    match first {
        Some(id) => format!(
            "read with: tessera ls {location}{tls}   or, in Python: \
             biopb.tensor.TensorFlightClient(\"{location}\").get_tensor(\"{id}\")"
        ),
        None => format!(
            "nothing served yet; once .npy files are, read with: tessera ls {location}{tls}"
        ),
    }
}

/// The state directory, locked for this server. A writable server refuses to start without
/// it; a read-only one serves without (what needs it is then refused, naming the reason).
fn open_state_dir(
    writes: &WritesValues,
    holder: &str,
) -> Result<Option<Arc<StateDir>>, DaemonError> {
    match StateDir::open(&writes.state_dir) {
        Ok(dir) => {
            if let Err(err) = dir.note_holder(holder) {
                tracing::warn!(error = %err, "cannot note the listen address in the state directory's lock file");
            }
            tracing::info!(dir = %writes.state_dir.display(), writable = writes.writable, "state directory open");
            Ok(Some(Arc::new(dir)))
        }
        Err(err) if writes.writable => Err(DaemonError::StateDir(err)),
        Err(err) => {
            tracing::warn!(error = %err, "serving without a state directory");
            Ok(None)
        }
    }
}

/// The ids given to sources, kept in the state directory's `sources` part so a file keeps
/// its id across restarts; in memory only without one.
fn source_ids(state_dir: Option<&StateDir>) -> IdBook {
    let loaded = state_dir.map(|dir| {
        dir.part("sources")
            .map_err(|e| e.to_string())
            .and_then(|part| IdBook::load(&part.join("ids")).map_err(|e| e.to_string()))
    });
    match loaded {
        Some(Ok(book)) => book,
        Some(Err(why)) => {
            tracing::warn!(error = %why, "source ids are kept in memory only: they hold until the server stops");
            IdBook::default()
        }
        None => IdBook::default(),
    }
}

/// How often the tensors that carry annotations are noted as served (the clock `roi_prune`
/// reads); also once at start.
const SIGHTING_INTERVAL: Duration = Duration::from_secs(3600);

/// Notes, at start and then every [`SIGHTING_INTERVAL`], which annotated tensors are served,
/// so a tensor that stops being served is dated to within the interval.
async fn note_served_annotations(state: Arc<ServiceState>) {
    let mut every = tokio::time::interval(SIGHTING_INTERVAL);
    loop {
        every.tick().await;
        let Ok(rois) = state.annotations() else {
            return;
        };
        let served_by = state.clone();
        let noted = tokio::task::spawn_blocking(move || {
            rois.stamp_served(&|array_id| served_by.resolve(array_id).ok().map(|t| t.source_url()))
        })
        .await;
        match noted {
            Ok(Ok(count)) => tracing::debug!(count, "annotated tensors noted as served"),
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot note annotated tensors as served"),
            Err(e) => tracing::warn!(error = %e, "noting annotated tensors as served failed"),
        }
    }
}

/// The ROI annotation store in the state directory's `annotations` part, or why this server
/// keeps none (annotation calls are then refused UNAVAILABLE with that reason).
fn open_annotations(
    writes: &WritesValues,
    state_dir: Option<&StateDir>,
    shared_seal: Option<Sealer>,
) -> Result<Arc<Annotations>, Arc<NoAnnotations>> {
    if !writes.annotations {
        tracing::info!("ROI annotations turned off (--annotations=false)");
        return Err(Arc::new(NoAnnotations::Off));
    }
    let Some(dir) = state_dir else {
        return Err(Arc::new(NoAnnotations::StateDirHeld {
            dir: writes.state_dir.clone(),
        }));
    };
    let opened = dir
        .part("annotations")
        .map_err(NoAnnotations::Part)
        .and_then(|part| {
            let limits = RoiLimits {
                cache_bytes: usize::try_from(writes.annotation_cache.get()).unwrap_or(usize::MAX),
                ..RoiLimits::default()
            };
            Annotations::open(&part, limits, shared_seal).map_err(NoAnnotations::Open)
        });
    match opened {
        Ok(rois) => {
            tracing::info!(dir = %dir.path().join("annotations").display(), "ROI annotations open");
            Ok(Arc::new(rois))
        }
        Err(why) => {
            tracing::warn!(error = %why, "serving without ROI annotations");
            Err(Arc::new(why))
        }
    }
}

/// The uploads kept in the state directory's `uploads` part. A failure stops a
/// `--writable` server; a read-only one serves without them.
fn open_uploads(
    settings: &Settings,
    state_dir: Option<&StateDir>,
) -> Result<Option<Arc<Uploads>>, DaemonError> {
    let Some(dir) = state_dir else {
        return Ok(None);
    };
    let opened = dir
        .part("uploads")
        .map_err(DaemonError::from)
        .and_then(|part| {
            Ok(Uploads::open(
                &part,
                settings.chunks.chunk_target.get(),
                settings.writes.upload_max_ttl.get(),
                settings.writes.upload_limits(),
            )?)
        });
    match opened {
        Ok(uploads) => Ok(Some(uploads)),
        Err(err) if settings.writes.writable => Err(err),
        Err(err) => {
            tracing::warn!(error = %err, "serving without the uploads of the state directory");
            Ok(None)
        }
    }
}

/// The chunk store the `[cache]` settings ask for: the segment files, or RAM when they say
/// so or the cache directory is refused (a lock held by another process is an error
/// instead: two daemons must not share a directory by accident). `holder` (where this
/// server listens) is noted in the lock file for the next one refused.
fn open_store(cache: &CacheValues, holder: &str) -> Result<Arc<dyn ChunkStore>, DaemonError> {
    let memory = |reason: String| {
        MemoryStore::new(cache.memory_bytes(), reason)
            .map(|store| Arc::new(store) as Arc<dyn ChunkStore>)
            .map_err(|e| DaemonError::Cache(e.to_string()))
    };
    if cache.kind == CacheKind::Memory {
        return memory("this server runs with a memory cache (--cache memory)".to_string());
    }
    let options = StoreOptions::new(cache.dir.clone())
        .with_max_bytes(cache.max_bytes.get())
        .with_allow_network_fs(cache.allow_network)
        .with_file_mode(if cache.group_readable { 0o640 } else { 0o600 });
    match Store::open(options) {
        Ok(store) => {
            tracing::info!(dir = %cache.dir.display(), "file cache open");
            if let Err(err) = store.note_holder(holder) {
                tracing::warn!(error = %err, "cannot note the listen address in the lock file");
            }
            Ok(Arc::new(SegmentFiles::new(store)))
        }
        Err(err @ StoreError::Locked { .. }) => Err(DaemonError::CacheLocked(err)),
        Err(err) => {
            tracing::warn!(error = %err, "file cache unavailable; serving with a memory cache (chunks travel over do_get)");
            memory(format!("the file cache is unavailable: {err}"))
        }
    }
}

/// The upstream tensor servers of `settings`, with the token (`--upstream-token-file`, else
/// `TESSERA_UPSTREAM_TOKEN`) and CA certificates (`--upstream-ca-file`) they are dialled with.
fn open_upstreams(settings: &Settings) -> Result<Vec<Arc<Upstream>>, DaemonError> {
    if settings.upstreams.is_empty() {
        return Ok(Vec::new());
    }
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| {
            UpstreamError::Credentials(format!(
                "cannot read the upstream {what} {}: {e}",
                path.display()
            ))
        })
    };
    let token = match &settings.sources.upstream_token_file {
        Some(path) => Some(
            String::from_utf8_lossy(&read(path, "token file")?)
                .trim()
                .to_string(),
        ),
        None => std::env::var(UPSTREAM_TOKEN_ENV)
            .ok()
            .filter(|t| !t.is_empty()),
    };
    let ca = match &settings.sources.upstream_ca_file {
        Some(path) => Some(read(path, "CA file")?),
        None => None,
    };
    settings
        .upstreams
        .iter()
        .map(|address| {
            Upstream::new(address, token.as_deref(), ca.as_deref())
                .map(Arc::new)
                .map_err(DaemonError::from)
        })
        .collect()
}

/// The environment variable an upstream token may be given in.
const UPSTREAM_TOKEN_ENV: &str = "TESSERA_UPSTREAM_TOKEN";

/// How long the first look at an upstream may hold the server's start.
const FIRST_SYNC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves what `upstream` serves now; logs (at warning level when `first`) when it cannot
/// be reached, and keeps serving what it served.
async fn sync_upstream(upstream: &Upstream, state: &ServiceState, first: bool) -> bool {
    let base = &upstream.address().base;
    match tokio::time::timeout(FIRST_SYNC_TIMEOUT, upstream.sync(state.sources())).await {
        Ok(Ok(synced)) => {
            if synced != Default::default() {
                tracing::info!(upstream = %base, added = synced.added, changed = synced.changed, removed = synced.removed, "upstream tensors synced");
            }
            true
        }
        Ok(Err(err)) if first => {
            tracing::warn!(upstream = %base, %err, "upstream not reachable; its tensors are served once it is");
            false
        }
        Ok(Err(err)) => {
            tracing::debug!(upstream = %base, %err, "upstream not reachable; serving what is cached");
            false
        }
        Err(_) => {
            tracing::warn!(upstream = %base, "upstream did not answer within {FIRST_SYNC_TIMEOUT:?}");
            false
        }
    }
}

/// Looks at what `upstream` serves every `poll`, so a changed upstream tensor gets new
/// chunk ids within it (docs/decisions/0034).
async fn follow_upstream(
    upstream: Arc<Upstream>,
    state: Arc<ServiceState>,
    poll: std::time::Duration,
) {
    let mut reachable = true;
    loop {
        tokio::time::sleep(poll).await;
        let now = sync_upstream(&upstream, &state, false).await;
        if now != reachable {
            let base = &upstream.address().base;
            if now {
                tracing::info!(upstream = %base, "upstream reachable again");
            } else {
                tracing::warn!(upstream = %base, "upstream unreachable; cached chunks keep serving");
            }
            reachable = now;
        }
    }
}

/// The object-store sources of `settings` (`s3://`, `gs://`, `az://`, `https://` among the
/// paths).
fn open_buckets(settings: &Settings) -> Result<Vec<Arc<Bucket>>, DaemonError> {
    let cap = settings.sources.object_store_max_objects;
    let allow_http = settings.sources.object_store_allow_http;
    settings
        .object_stores
        .iter()
        .map(|address| {
            let bucket = Bucket::new(address, cap, allow_http)?;
            tracing::info!(
                store = %address,
                anonymous = bucket.anonymous(),
                "serving an object-store source"
            );
            Ok(Arc::new(bucket))
        })
        .collect()
}

/// Lists `bucket` and serves what it holds now; logs (at warning level when `first`) when
/// it cannot, and keeps serving what it served. Whether the listing succeeded.
async fn sync_bucket(bucket: &Arc<Bucket>, state: &Arc<ServiceState>, first: bool) -> bool {
    let url = bucket.address().url.clone();
    let (task_bucket, task_state) = (bucket.clone(), state.clone());
    let listed = tokio::task::spawn_blocking(move || {
        let limits = task_state.sources().open_options().limits;
        task_bucket.sync(task_state.sources(), &limits)
    })
    .await;
    match listed {
        Ok(Ok(synced)) => {
            if synced.truncated {
                tracing::warn!(
                    store = %url,
                    "the listing stopped at object_store_max_objects; objects past it are not served"
                );
            }
            if synced.added + synced.changed + synced.removed > 0 {
                tracing::info!(store = %url, added = synced.added, changed = synced.changed, removed = synced.removed, "object-store sources synced");
            }
            true
        }
        Ok(Err(err)) if first => {
            tracing::warn!(store = %url, %err, "object store not listed; its sources are served once it is");
            false
        }
        Ok(Err(err)) => {
            tracing::debug!(store = %url, %err, "object store not listed; serving what is cached");
            false
        }
        Err(join) => {
            tracing::error!(store = %url, error = %join, "object-store listing failed");
            false
        }
    }
}

/// Lists `bucket` every `rescan`, so a replaced object gets new chunk ids within it.
async fn follow_bucket(bucket: Arc<Bucket>, state: Arc<ServiceState>, rescan: std::time::Duration) {
    let mut reachable = true;
    loop {
        tokio::time::sleep(rescan).await;
        let now = sync_bucket(&bucket, &state, false).await;
        if now != reachable {
            let url = &bucket.address().url;
            if now {
                tracing::info!(store = %url, "object store listed again");
            } else {
                tracing::warn!(store = %url, "object store cannot be listed; cached chunks keep serving");
            }
            reachable = now;
        }
    }
}
