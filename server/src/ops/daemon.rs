//! The daemon: open the cache, scan the sources, bind, serve until told to stop.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use tessera_segments::{Store, StoreError, StoreOptions};
use tokio::net::TcpListener;

use crate::chunks::{ChunkService, ChunkStore, MemoryStore, SegmentFiles};
use crate::metrics::{Metered, Metrics};
use crate::ops::config::{CacheKind, ServeConfig};
use crate::ops::scrape::MetricsServer;
use crate::ops::watch::Watcher;
use crate::rois::{Annotations, RoiLimits};
use crate::source::ids::IdBook;
use crate::source::npy::Limits;
use crate::source::registry::{OpenOptions, Registry};
use crate::state::ServiceState;
use crate::state_dir::{StateDir, StateDirError};
use crate::uploads::Uploads;
use crate::wire::flight::TesseraFlight;
use crate::wire::flight::auth::{Authenticated, TokenCheck, validate_token};
use crate::wire::flight::chunk_get::ChunkGet;
use crate::wire::listener::{Admission, CountCalls, incoming};
use crate::wire::tls::TlsIdentity;

/// Largest message the server sends: a 64 MiB chunk plus its header, with room to spare.
const MAX_ENCODE_BYTES: usize = 80 << 20;
/// Largest request accepted: plans and tickets are small; this bounds hostile ones.
const MAX_DECODE_BYTES: usize = 16 << 20;
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
}

/// A bound, ready-to-run server.
pub struct Daemon {
    listener: TcpListener,
    admission: Admission,
    state: Arc<ServiceState>,
    token: Option<String>,
    tls: Option<TlsIdentity>,
    metrics_server: Option<MetricsServer>,
    watcher: Option<Watcher>,
}

impl Daemon {
    /// Opens the cache, scans the sources and binds the listen address.
    pub async fn bind(config: &ServeConfig) -> Result<Daemon, DaemonError> {
        if let Some(token) = &config.token {
            validate_token(token)?;
        } else if !config.listen.ip().is_loopback() {
            return Err(DaemonError::ExposedWithoutToken(config.listen));
        } else if let Some(addr) = config.metrics_listen
            && !addr.ip().is_loopback()
        {
            return Err(DaemonError::MetricsExposedWithoutToken(addr));
        }
        let tls = match &config.tls {
            Some(paths) => Some(TlsIdentity::load(&paths.cert, &paths.key)?),
            None => None,
        };
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| DaemonError::Bind {
                    addr: config.listen,
                    source,
                })?;
        let scheme = if tls.is_some() { "grpcs" } else { "grpc" };
        let holder = match listener.local_addr() {
            Ok(addr) => format!("listening on {scheme}://{addr}"),
            Err(_) => format!("listening on {scheme}://{}", config.listen),
        };
        let store = open_store(config, &holder)?;
        let state_dir = open_state_dir(config, &holder)?;
        let annotations = open_annotations(config, state_dir.as_deref());
        let uploads = open_uploads(config, state_dir.as_deref())?;
        let options = OpenOptions {
            limits: Limits::default(),
            target_chunk_bytes: config.chunk_target,
            mapped_chunk_bytes: config.mapped_chunk_target,
            follow_links_outside: config.follow_links_outside,
            max_sources: config.max_sources,
        };
        crate::source::npy::handles::set_max_open(config.max_open_sources);
        let sources = config.sources();
        let watcher = config
            .watch
            .then(|| Watcher::new(sources.clone(), options.clone(), config.watch_interval));
        let scan_options = options.clone();
        let ids = source_ids(state_dir.as_deref());
        let (registry, _problems) = tokio::task::spawn_blocking(move || {
            Registry::scan_with_ids(&sources, &scan_options, ids)
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
        let chunks = ChunkService::new(store, config.memory_cache_bytes, decoders)
            .with_read_ahead(config.read_ahead_bytes)
            .with_settle_window(config.settle_window)
            .with_scaled_decode_budget(config.max_scaled_decode_bytes)
            .with_metrics(metrics.clone());
        let chunks = Arc::new(chunks);
        let state = Arc::new(
            ServiceState::new(registry, options, chunks)
                .with_unread_limits(config.unread)
                .with_loopback_plans(config.loopback_plans)
                .with_pyramid(config.pyramid.clone())
                .with_metrics(metrics)
                .with_runtime_roots(config.runtime.clone())
                .with_writes(config.writable, state_dir)
                .with_annotations(annotations)
                .with_uploads(uploads),
        );
        let tree_state = state.clone();
        // The catalog tree of the first scan, built before the first call needs it.
        let _ = tokio::task::spawn_blocking(move || tree_state.catalog_tree()).await;
        state.scan_status().finish();
        let metrics_server = match config.metrics_listen {
            Some(addr) => Some(
                MetricsServer::bind(addr, config.metrics_limits, config.token.clone())
                    .await
                    .map_err(|source| DaemonError::Bind { addr, source })?,
            ),
            None => None,
        };
        Ok(Daemon {
            listener,
            admission: Admission {
                seats: config.seat_limits(),
                handshake_timeout: config.handshake_timeout,
            },
            state,
            token: config.token.clone(),
            tls,
            metrics_server,
            watcher,
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
        side_tasks.push(tokio::spawn(self.state.unread().clone().run_reaper()));
        if let Some(watcher) = self.watcher {
            side_tasks.push(tokio::spawn(watcher.run(self.state.clone())));
        }
        side_tasks.push(tokio::spawn(note_served_annotations(self.state.clone())));
        let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
        let signal = async move {
            shutdown.await;
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
    config: &ServeConfig,
    holder: &str,
) -> Result<Option<Arc<StateDir>>, DaemonError> {
    match StateDir::open(&config.state_dir) {
        Ok(dir) => {
            if let Err(err) = dir.note_holder(holder) {
                tracing::warn!(error = %err, "cannot note the listen address in the state directory's lock file");
            }
            tracing::info!(dir = %config.state_dir.display(), writable = config.writable, "state directory open");
            Ok(Some(Arc::new(dir)))
        }
        Err(err) if config.writable => Err(DaemonError::StateDir(err)),
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
    config: &ServeConfig,
    state_dir: Option<&StateDir>,
) -> Result<Arc<Annotations>, String> {
    let Some(dir) = state_dir else {
        return Err(format!(
            "the state directory {} is held by another server; give this one its own with \
             --state-dir DIR (or TESSERA_STATE_DIR)",
            config.state_dir.display()
        ));
    };
    let opened = dir
        .part("annotations")
        .map_err(|e| e.to_string())
        .and_then(|part| {
            let limits = RoiLimits {
                cache_bytes: usize::try_from(config.annotation_cache_bytes).unwrap_or(usize::MAX),
                ..RoiLimits::default()
            };
            Annotations::open(&part, limits).map_err(|e| e.to_string())
        });
    match opened {
        Ok(rois) => {
            tracing::info!(dir = %dir.path().join("annotations").display(), "ROI annotations open");
            Ok(Arc::new(rois))
        }
        Err(why) => {
            tracing::warn!(error = %why, "serving without ROI annotations");
            Err(why)
        }
    }
}

/// The uploads kept in the state directory's `uploads` part. A failure stops a
/// `--writable` server; a read-only one serves without them.
fn open_uploads(
    config: &ServeConfig,
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
                config.chunk_target,
                config.upload_max_ttl,
                config.upload_limits,
            )?)
        });
    match opened {
        Ok(uploads) => Ok(Some(uploads)),
        Err(err) if config.writable => Err(err),
        Err(err) => {
            tracing::warn!(error = %err, "serving without the uploads of the state directory");
            Ok(None)
        }
    }
}

/// The chunk store the configuration asks for: the segment files, or RAM when the
/// configuration says so or the cache directory is refused (a lock held by another
/// process is an error instead: two daemons must not share a directory by accident).
/// `holder` (where this server listens) is noted in the lock file for the next one refused.
fn open_store(config: &ServeConfig, holder: &str) -> Result<Arc<dyn ChunkStore>, DaemonError> {
    let memory = |reason: String| {
        MemoryStore::new(config.memory_cache_bytes, reason)
            .map(|store| Arc::new(store) as Arc<dyn ChunkStore>)
            .map_err(|e| DaemonError::Cache(e.to_string()))
    };
    if config.cache == CacheKind::Memory {
        return memory("this server runs with a memory cache (--cache memory)".to_string());
    }
    let options = StoreOptions::new(config.cache_dir.clone())
        .with_max_bytes(config.cache_max_bytes)
        .with_allow_network_fs(config.allow_network_cache)
        .with_file_mode(if config.cache_group_readable {
            0o640
        } else {
            0o600
        });
    match Store::open(options) {
        Ok(store) => {
            tracing::info!(dir = %config.cache_dir.display(), "file cache open");
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
