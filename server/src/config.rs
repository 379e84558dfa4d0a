//! Configuration of `tessera serve`: flags override `TESSERA_*` environment
//! variables, which override the TOML config file, which overrides defaults.
//!
//! ```toml
//! # tessera.toml — every key optional
//! listen = "127.0.0.1:8815"
//! sources = ["/data/volumes", "/data/cells.npy"]
//! token_file = "/etc/tessera/token"     # or: token = "…"
//! chunk_target = "8MiB"                 # chunks of reads that travel the socket
//! mapped_chunk_target = "64MiB"          # chunks of loopback reads that are mapped; "0": same grid
//! loopback_plans = "learn"               # or "mapped" / "socket": pin the grid of loopback plans
//! read_ahead = "32MiB"                   # decode ahead of sequential readers; "0" turns it off
//! settle_window = "1s"                   # sources touched this recently are waited for
//! max_connections = 512                  # connections held at once; more are closed
//! handshake_timeout = "10s"              # time a new connection has to start speaking
//! max_connections_per_peer = 256         # connections of one address [default: half of max_connections]
//! reclaim_idle_after = "5s"              # with every slot taken, close one idle this long
//! max_pinned = "1GiB"                    # bytes unread replies may hold, all peers
//! max_pinned_per_connection = "512MiB"   # bytes unread replies may hold, one connection
//! stream_idle_timeout = "60s"            # a reply idle this long closes its connection
//! max_scaled_decode_memory = "512MiB"    # memory scaled (downsampled) decodes hold, all together
//!
//! [cache]
//! kind = "file"                          # or "memory"
//! dir = "/var/cache/tessera"
//! max_bytes = "64GiB"
//! allow_network = false
//! group_readable = false                 # true: cache files 0640, for local users of the group
//!
//! [tls]                                  # serve grpcs:// (both keys, or neither)
//! cert = "/etc/tessera/cert.pem"
//! key = "/etc/tessera/key.pem"
//!
//! [[source]]                             # one table per path, with options
//! path = "/data/plates"
//! id = "plates"                          # id of a file, or id prefix of a directory's files
//! dim_labels = ["c", "y", "x"]           # must match each tensor's rank
//! physical_scale = [1.0, 0.1, 0.1]       # size of one element per axis
//! physical_unit = "um"                   # one unit, or one per axis; lengths become µm
//! metadata = { objective = "60x" }       # or metadata_file = "meta.json"
//! ```
//!
//! Runtime sources (`add_source`): `add_source_roots = ["/data/inbox"]` (none by default:
//! refused) and `add_source_max_files = 10000`. `max_sources = 100000` caps what is served
//! at once, `max_open_sources = 512` the descriptors they hold; `follow_links_outside = false` refuses configured files whose path leads out of
//! their configured folder.
//!
//! Writes: `writable = true` accepts uploads; `state_dir = "/var/lib/tessera"` holds what
//! users write (uploads, annotations), never evicted; `upload_max_ttl = "168h"` caps the
//! lifetime of uploads to the scratch source; `max_upload_cells = 262144` caps an upload's
//! grid; `max_upload_bytes_in_flight = "1GiB"` and
//! `max_upload_bytes_in_flight_per_upload = "256MiB"` cap the chunks being received;
//! `annotation_cache = "32MiB"` is the memory the annotation database may cache.
//!
//! Operations keys: `watch = false` (sources are rescanned by default) and
//! `watch_interval = "2s"` (live directories),
//! `metrics_listen = "127.0.0.1:9815"` (`metrics_max_connections = 16`,
//! `metrics_timeout = "10s"`), `log_format = "json"`. Every key, flag and
//! environment variable is documented in `docs/configuration.md`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::scaled::Method;
use crate::scaled::pyramid::PyramidPolicy;

use crate::chunks::{
    DEFAULT_MAX_SCALED_DECODE_BYTES, DEFAULT_READ_AHEAD_BYTES, DEFAULT_SETTLE_WINDOW,
};
use crate::grid::{DEFAULT_MAPPED_CHUNK_BYTES, DEFAULT_TARGET_CHUNK_BYTES, MAX_CHUNK_BYTES};
use crate::listener::SeatLimits;
use crate::pins::PinLimits;
use crate::route::LoopbackPlans;
use crate::scrape::{DEFAULT_METRICS_MAX_CONNECTIONS, DEFAULT_METRICS_TIMEOUT, ScrapeLimits};
use crate::source::meta::{Supplied, Units};
use crate::source::npy::handles::DEFAULT_MAX_OPEN;
use crate::source::registry::{DEFAULT_MAX_SOURCES, SourceOptions, SourceSpec, sanitize};
use crate::source::runtime::{DEFAULT_MAX_FILES, RuntimeRoots};
use crate::uploads::{MAX_IN_FLIGHT_LIMIT, UploadLimits};
use crate::watch::DEFAULT_WATCH_INTERVAL;

/// Default cap on connections held at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default time a new connection has to send its first bytes.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time without a call in flight after which a connection may be closed to make
/// room for a new one when every slot is taken.
pub const DEFAULT_RECLAIM_IDLE_AFTER: Duration = Duration::from_secs(5);

/// Default longest lifetime of an upload to the scratch source: 7 days.
pub const DEFAULT_UPLOAD_MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Default memory the annotation database may keep as its page cache.
pub const DEFAULT_ANNOTATION_CACHE_BYTES: u64 = crate::rois::store::DEFAULT_CACHE_BYTES as u64;

pub mod effective;

/// Default listen address: loopback only, so no token is needed.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8815";
/// Default file cache budget.
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 10 << 30;
/// Default memory cache budget (the memory backend, and the fallback when the disk fails).
pub const DEFAULT_MEMORY_CACHE_BYTES: u64 = 1 << 30;

/// Where decoded chunks are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CacheKind {
    /// Segment files local clients can mmap (the default).
    File,
    /// RAM only: every chunk travels over the socket.
    Memory,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Errors reading or checking configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The config file is not valid TOML or has unknown keys.
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the key named.
        message: String,
    },
    /// A size string could not be parsed.
    #[error("size '{0}' is not understood: use bytes or a unit such as 64MiB, 4GiB, 500MB")]
    Size(String),
    /// A value is out of range or inconsistent.
    #[error("{0}")]
    Invalid(String),
}

/// The `[cache]` table of the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheFile {
    /// `file` or `memory`.
    pub kind: Option<CacheKind>,
    /// Cache directory.
    pub dir: Option<PathBuf>,
    /// Budget, as a size string.
    pub max_bytes: Option<String>,
    /// Allow a network filesystem for the cache directory.
    pub allow_network: Option<bool>,
    /// Create cache files readable by the server's group (0640) instead of 0600.
    pub group_readable: Option<bool>,
}

/// The `[tls]` table of the config file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFile {
    /// PEM certificate chain, leaf first.
    pub cert: Option<PathBuf>,
    /// PEM private key of the leaf.
    pub key: Option<PathBuf>,
}

/// The `[pyramid]` table of the config file: the levels descriptors advertise.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PyramidFile {
    /// Method advertised for computed levels (`nearest` or `area`).
    pub method: Option<String>,
    /// Largest X or Y extent of the 2-D level.
    pub threshold: Option<u64>,
    /// Factor of one step (at least 2).
    pub downscale_factor: Option<u64>,
    /// Cube root of the 3-D level's voxel budget.
    pub pixel_budget_cubic_root: Option<u64>,
    /// Largest X·Y of the 2-D level.
    pub plane_max_pixels: Option<u64>,
}

/// The config file's contents.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Listen address.
    pub listen: Option<SocketAddr>,
    /// Source paths.
    pub sources: Option<Vec<PathBuf>>,
    /// Token inline.
    pub token: Option<String>,
    /// File holding the token.
    pub token_file: Option<PathBuf>,
    /// Target chunk size, as a size string.
    pub chunk_target: Option<String>,
    /// Target chunk size of plans a local client maps, as a size string.
    pub mapped_chunk_target: Option<String>,
    /// How loopback plans pick their grid.
    pub loopback_plans: Option<LoopbackPlans>,
    /// Read-ahead budget, as a size string.
    pub read_ahead: Option<String>,
    /// Stability window, as a duration string.
    pub settle_window: Option<String>,
    /// Connections held at once.
    pub max_connections: Option<usize>,
    /// Handshake timeout, as a duration string.
    pub handshake_timeout: Option<String>,
    /// Cap on bytes held by unread replies of all connections, as a size string.
    pub max_pinned: Option<String>,
    /// Cap on bytes held by unread replies of one connection, as a size string.
    pub max_pinned_per_connection: Option<String>,
    /// Time a reply may make no progress, as a duration string.
    pub stream_idle_timeout: Option<String>,
    /// Cache settings.
    pub cache: Option<CacheFile>,
    /// TLS settings.
    pub tls: Option<TlsFile>,
    /// Pyramid policy.
    pub pyramid: Option<PyramidFile>,
    /// Paths with options (`[[source]]` tables), served after `sources`.
    pub source: Option<Vec<SourceFile>>,
    /// Rescan the sources periodically and serve what changed.
    pub watch: Option<bool>,
    /// Time between rescans, as a duration string (`2s`, `500ms`, `1m`).
    pub watch_interval: Option<String>,
    /// Address of the Prometheus `/metrics` endpoint.
    pub metrics_listen: Option<SocketAddr>,
    /// Log line format.
    pub log_format: Option<LogFormat>,
    /// Directories under which `add_source` may register paths at runtime.
    pub add_source_roots: Option<Vec<PathBuf>>,
    /// Most `.npy` files one `add_source` of a directory registers.
    pub add_source_max_files: Option<usize>,
    /// Accept writes (uploads) from clients.
    pub writable: Option<bool>,
    /// Directory of users' data (uploads, annotations): never evicted.
    pub state_dir: Option<PathBuf>,
    /// Longest lifetime of an upload to the scratch source (a duration).
    pub upload_max_ttl: Option<String>,
    /// Most cells of one upload's grid.
    pub max_upload_cells: Option<u64>,
    /// Most bytes of chunk DoPuts being received at once, all uploads (a size).
    pub max_upload_bytes_in_flight: Option<String>,
    /// Most bytes of chunk DoPuts being received at once, one upload (a size).
    pub max_upload_bytes_in_flight_per_upload: Option<String>,
    /// Most uploads the state directory holds at once.
    pub upload_max_count: Option<usize>,
    /// Most upload stores open at once.
    pub upload_open_stores: Option<usize>,
    /// Connections one peer address may hold at once.
    pub max_connections_per_peer: Option<usize>,
    /// Idle time after which a connection may be closed for a new one, as a duration string.
    pub reclaim_idle_after: Option<String>,
    /// Connections to the `/metrics` endpoint held at once.
    pub metrics_max_connections: Option<usize>,
    /// Longest life of a `/metrics` connection, as a duration string.
    pub metrics_timeout: Option<String>,
    /// Serve configured files whose path leads out of their configured folder.
    pub follow_links_outside: Option<bool>,
    /// Most sources served at once (configured and runtime, served and refused).
    pub max_sources: Option<usize>,
    /// Most descriptors of sources held open at once.
    pub max_open_sources: Option<usize>,
    /// Page cache of the annotation database, as a size string.
    pub annotation_cache: Option<String>,
    /// Memory all scaled decodes together may hold, as a size string.
    pub max_scaled_decode_memory: Option<String>,
}

/// One `[[source]]` table of the config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceFile {
    /// A `.npy` file or a directory scanned recursively.
    pub path: PathBuf,
    /// Id of the file, or id prefix of the directory's files.
    pub id: Option<String>,
    /// Axis labels replacing the defaults.
    pub dim_labels: Option<Vec<String>>,
    /// Size of one element along each axis.
    pub physical_scale: Option<Vec<f64>>,
    /// Unit of the sizes: one for every axis, or one per axis.
    pub physical_unit: Option<Units>,
    /// Free-form metadata reported in `metadata_json`.
    pub metadata: Option<toml::Table>,
    /// A JSON file holding an object of free-form metadata (instead of `metadata`).
    pub metadata_file: Option<PathBuf>,
}

impl ConfigFile {
    /// Reads and parses a config file; unknown keys are errors that name the key.
    pub fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }
}

/// Command-line flags of `tessera serve` (each also settable by environment).
#[derive(Debug, Default, clap::Args)]
pub struct ServeArgs {
    /// .npy files or directories (scanned recursively) to serve.
    pub paths: Vec<PathBuf>,
    /// Address to listen on. A non-loopback address requires a token.
    #[arg(long, env = "TESSERA_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Directory of the chunk file cache [default: $XDG_CACHE_HOME/tessera or ~/.cache/tessera].
    #[arg(long, env = "TESSERA_CACHE_DIR", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Disk budget of the file cache (segments and sidecars), e.g. 64GiB [default: 10GiB].
    #[arg(long, env = "TESSERA_CACHE_MAX_BYTES", value_name = "SIZE")]
    pub cache_max_bytes: Option<String>,
    /// Where chunks are cached: `file` lets local clients mmap them; `memory` sends every chunk over the socket.
    #[arg(long, env = "TESSERA_CACHE", value_enum)]
    pub cache: Option<CacheKind>,
    /// Use a cache directory on a network filesystem anyway (clients on other hosts may then see truncated files).
    #[arg(long, env = "TESSERA_ALLOW_NETWORK_CACHE")]
    pub allow_network_cache: bool,
    /// Require `authorization: Bearer TOKEN` on every call (16–128 chars of [A-Za-z0-9_-]).
    #[arg(
        long,
        env = "TESSERA_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// Target chunk size below the 64MiB cap, e.g. 8MiB [default: 8MiB].
    #[arg(long, env = "TESSERA_CHUNK_TARGET", value_name = "SIZE")]
    pub chunk_target: Option<String>,
    /// Target chunk size of plans for loopback clients while the file cache can be mapped:
    /// fewer, larger chunks for the mmap route; 0 plans every read on --chunk-target's grid
    /// [default: 64MiB].
    #[arg(long, env = "TESSERA_MAPPED_CHUNK_TARGET", value_name = "SIZE")]
    pub mapped_chunk_target: Option<String>,
    /// Grid of plans for loopback clients: `learn` plans them on --mapped-chunk-target's grid
    /// until a local client is seen reading it over the socket only; `mapped` always does
    /// (every local client maps); `socket` never does [default: learn].
    #[arg(long, env = "TESSERA_LOOPBACK_PLANS", value_enum)]
    pub loopback_plans: Option<LoopbackPlans>,
    /// Bytes of chunks decoded ahead of a reader walking a tensor in order, e.g. 32MiB; a
    /// cold plan's end chunks are decoded ahead too; 0 turns read-ahead off [default: 32MiB].
    #[arg(long, env = "TESSERA_READ_AHEAD", value_name = "SIZE")]
    pub read_ahead: Option<String>,
    /// A source whose mtime or ctime is younger than this is not decoded until it is
    /// older (a write still in progress is never cached), e.g. 1s [default: 1s].
    #[arg(long, env = "TESSERA_SETTLE_WINDOW", value_name = "DURATION")]
    pub settle_window: Option<String>,
    /// Connections held open at once; new ones beyond it are closed as they arrive
    /// [default: 512]. Keep it well under the descriptor limit (`ulimit -n`).
    #[arg(long, env = "TESSERA_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<usize>,
    /// Time a new connection has to send its first bytes (HTTP/2 preface or TLS hello)
    /// before it is closed [default: 10s].
    #[arg(long, env = "TESSERA_HANDSHAKE_TIMEOUT", value_name = "DURATION")]
    pub handshake_timeout: Option<String>,
    /// Bytes that chunk replies not yet read by their peers may hold, over all connections;
    /// past it the connections whose replies stalled longest are closed [default: 1GiB].
    #[arg(long, env = "TESSERA_MAX_PINNED", value_name = "SIZE")]
    pub max_pinned: Option<String>,
    /// Bytes that unread chunk replies of one connection may hold; past it the connection is
    /// closed once one of its replies stalls [default: 512MiB].
    #[arg(long, env = "TESSERA_MAX_PINNED_PER_CONNECTION", value_name = "SIZE")]
    pub max_pinned_per_connection: Option<String>,
    /// A chunk reply whose peer takes none of it for this long has its connection closed
    /// [default: 60s].
    #[arg(long, env = "TESSERA_STREAM_IDLE_TIMEOUT", value_name = "DURATION")]
    pub stream_idle_timeout: Option<String>,
    /// Reduction method advertised for the computed pyramid levels of descriptors:
    /// nearest or area [default: nearest].
    #[arg(long, env = "TESSERA_PYRAMID_METHOD", value_name = "METHOD")]
    pub pyramid_method: Option<String>,
    /// TOML config file; flags and environment override it.
    #[arg(long, env = "TESSERA_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// PEM certificate chain: serve over TLS (clients use grpcs://); needs --tls-key.
    #[arg(long, env = "TESSERA_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the --tls-cert leaf (keep it mode 600).
    #[arg(long, env = "TESSERA_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Create cache files mode 0640 instead of 0600, so local users in the server's group can
    /// mmap them; other users' clients fall back to do_get.
    #[arg(long, env = "TESSERA_CACHE_GROUP_READABLE")]
    pub cache_group_readable: bool,
    /// Rescan the sources every --watch-interval and serve added, changed and removed
    /// .npy files without a restart [default: true; `--watch=false` turns it off]. Given
    /// explicitly, a source path that does not exist yet is awaited instead of refused.
    #[arg(long, env = "TESSERA_WATCH", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub watch: Option<bool>,
    /// Time between rescans with --watch, e.g. 2s, 500ms, 1m [default: 2s].
    #[arg(long, env = "TESSERA_WATCH_INTERVAL", value_name = "DURATION")]
    pub watch_interval: Option<String>,
    /// Serve Prometheus metrics as text on http://ADDR/metrics.
    #[arg(long, env = "TESSERA_METRICS_LISTEN", value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// A directory under which clients may add sources at runtime (`add_source`); repeat
    /// for several; none: refused [env: colon-separated list].
    #[arg(
        long = "add-source-root",
        env = "TESSERA_ADD_SOURCE_ROOTS",
        value_delimiter = ':',
        value_name = "DIR"
    )]
    pub add_source_roots: Vec<PathBuf>,
    /// Most .npy files one `add_source` of a directory registers [default: 10000].
    #[arg(long, env = "TESSERA_ADD_SOURCE_MAX_FILES", value_name = "N")]
    pub add_source_max_files: Option<usize>,
    /// Accept uploads from clients (`add_tensor`, DoPut of chunks), kept in --state-dir;
    /// with a token, every write needs it [default: false].
    #[arg(long, env = "TESSERA_WRITABLE", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub writable: Option<bool>,
    /// Directory of what users write (uploads, annotations): never evicted, locked like the
    /// cache [default: $XDG_DATA_HOME/tessera or ~/.local/share/tessera].
    #[arg(long, env = "TESSERA_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Longest lifetime of an upload to the scratch source, and the lifetime of one that
    /// asks for none, e.g. 168h [default: 168h].
    #[arg(long, env = "TESSERA_UPLOAD_MAX_TTL", value_name = "DURATION")]
    pub upload_max_ttl: Option<String>,
    /// Most cells (chunks) of one upload's grid; add_tensor refuses a grid with more
    /// [default: 262144].
    #[arg(long, env = "TESSERA_MAX_UPLOAD_CELLS", value_name = "N")]
    pub max_upload_cells: Option<u64>,
    /// Most bytes of chunk DoPuts being received at once, all uploads; further chunks wait
    /// up to 30 s for room, then are refused UNAVAILABLE [default: 1GiB].
    #[arg(long, env = "TESSERA_MAX_UPLOAD_BYTES_IN_FLIGHT", value_name = "SIZE")]
    pub max_upload_bytes_in_flight: Option<String>,
    /// Most bytes of chunk DoPuts being received at once for one upload [default: 256MiB].
    #[arg(
        long,
        env = "TESSERA_MAX_UPLOAD_BYTES_IN_FLIGHT_PER_UPLOAD",
        value_name = "SIZE"
    )]
    pub max_upload_bytes_in_flight_per_upload: Option<String>,
    /// Most uploads held at once, a discarded one counting until its name frees; add_tensor
    /// beyond it is refused [default: 4096].
    #[arg(long, env = "TESSERA_UPLOAD_MAX_COUNT", value_name = "N")]
    pub upload_max_count: Option<usize>,
    /// Most upload stores open at once (two descriptors each); the least recently used idle
    /// one is closed beyond it and reopened when next used [default: 64].
    #[arg(long, env = "TESSERA_UPLOAD_OPEN_STORES", value_name = "N")]
    pub upload_open_stores: Option<usize>,
    /// Connections one peer address may hold at once (all local clients are one address);
    /// past it, the peer's connection idle longest makes room or the new one is closed
    /// [default: half of --max-connections].
    #[arg(long, env = "TESSERA_MAX_CONNECTIONS_PER_PEER", value_name = "N")]
    pub max_connections_per_peer: Option<usize>,
    /// When a new connection finds every slot taken, the connection with no call in flight
    /// for longest is closed for it if it has been idle this long [default: 5s].
    #[arg(long, env = "TESSERA_RECLAIM_IDLE_AFTER", value_name = "DURATION")]
    pub reclaim_idle_after: Option<String>,
    /// Connections to the --metrics-listen endpoint held at once; more are closed as they
    /// arrive [default: 16].
    #[arg(long, env = "TESSERA_METRICS_MAX_CONNECTIONS", value_name = "N")]
    pub metrics_max_connections: Option<usize>,
    /// A --metrics-listen connection is closed this long after it was accepted, scrape
    /// finished or not [default: 10s].
    #[arg(long, env = "TESSERA_METRICS_TIMEOUT", value_name = "DURATION")]
    pub metrics_timeout: Option<String>,
    /// Serve configured files whose path leads out of their configured folder (a symbolic
    /// link, or a directory replaced by one) [default: false: refused].
    #[arg(long, env = "TESSERA_FOLLOW_LINKS_OUTSIDE", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
    pub follow_links_outside: Option<bool>,
    /// Most sources served at once, configured and added at runtime [default: 100000].
    #[arg(long, env = "TESSERA_MAX_SOURCES", value_name = "N")]
    pub max_sources: Option<usize>,
    /// Most descriptors of sources held open at once; the least recently used are closed
    /// and opened again on demand [default: 512].
    #[arg(long, env = "TESSERA_MAX_OPEN_SOURCES", value_name = "N")]
    pub max_open_sources: Option<usize>,
    /// Memory the annotation database may keep as its page cache; a SQL scan of the `rois`
    /// table reads every page through it [default: 32MiB].
    #[arg(long, env = "TESSERA_ANNOTATION_CACHE", value_name = "SIZE")]
    pub annotation_cache: Option<String>,
    /// Memory that scaled (downsampled) decodes may hold, all together; a scaled chunk
    /// waits for its share, and one that alone needs more is refused [default: 512MiB].
    #[arg(long, env = "TESSERA_MAX_SCALED_DECODE_MEMORY", value_name = "SIZE")]
    pub max_scaled_decode_memory: Option<String>,
}

/// The effective configuration of a server.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Source paths.
    pub paths: Vec<PathBuf>,
    /// Listen address.
    pub listen: SocketAddr,
    /// Cache kind.
    pub cache: CacheKind,
    /// Cache directory.
    pub cache_dir: PathBuf,
    /// File cache budget.
    pub cache_max_bytes: u64,
    /// Memory cache budget.
    pub memory_cache_bytes: u64,
    /// Allow a network filesystem for the cache.
    pub allow_network_cache: bool,
    /// Token, if any.
    pub token: Option<String>,
    /// Target chunk size.
    pub chunk_target: u64,
    /// Target chunk size of plans mapped by local clients (0 or at most `chunk_target`:
    /// the same grid for every route).
    pub mapped_chunk_target: u64,
    /// How loopback plans pick their grid (see `--loopback-plans`).
    pub loopback_plans: LoopbackPlans,
    /// Read-ahead budget in bytes (0: off).
    pub read_ahead_bytes: u64,
    /// Stability window of sources (see `--settle-window`).
    pub settle_window: Duration,
    /// Connections held at once (see `--max-connections`).
    pub max_connections: usize,
    /// Time a new connection has to start speaking (see `--handshake-timeout`).
    pub handshake_timeout: Duration,
    /// Caps on bytes held by unread replies (see `--max-pinned`).
    pub pins: PinLimits,
    /// TLS certificate chain and key (PEM files), if the server speaks TLS.
    pub tls: Option<TlsPaths>,
    /// Cache files readable by the server's group (0640) rather than its user only (0600).
    pub cache_group_readable: bool,
    /// Id alias and axis labels of configured paths (keys as in `paths`).
    pub source_options: BTreeMap<PathBuf, SourceOptions>,
    /// Rescan the sources periodically (the default).
    pub watch: bool,
    /// Watching was asked for by a flag, variable or config key, not only defaulted: a
    /// source path that does not exist yet is then awaited rather than an error.
    pub watch_requested: bool,
    /// Time between rescans.
    pub watch_interval: Duration,
    /// Address of the Prometheus `/metrics` endpoint, if any.
    pub metrics_listen: Option<SocketAddr>,
    /// Log line format (the `--log-format` flag, applied by the binary, wins).
    pub log_format: LogFormat,
    /// The pyramid descriptors advertise (`[pyramid]`, `--pyramid-method`).
    pub pyramid: PyramidPolicy,
    /// Where `add_source` may register paths from.
    pub runtime: RuntimeRoots,
    /// Clients may write (uploads).
    pub writable: bool,
    /// Directory of users' data (uploads, annotations).
    pub state_dir: PathBuf,
    /// Longest lifetime of an upload to the scratch source (`upload_max_ttl`).
    pub upload_max_ttl: Duration,
    /// Bounds on the uploads: their number and open stores (`upload_max_count`,
    /// `upload_open_stores`), their grids and the chunks being received (`max_upload_*`).
    pub upload_limits: UploadLimits,
    /// Connections one peer address may hold (`None`: half of `max_connections`).
    pub max_connections_per_peer: Option<usize>,
    /// Idle time after which a connection may be closed for a new one.
    pub reclaim_idle_after: Duration,
    /// Bounds of the `/metrics` endpoint's connections.
    pub metrics_limits: ScrapeLimits,
    /// Serve configured files whose path leads out of their configured folder.
    pub follow_links_outside: bool,
    /// Most sources served at once (`max_sources`).
    pub max_sources: usize,
    /// Most descriptors of sources held open at once (`max_open_sources`).
    pub max_open_sources: usize,
    /// Page cache of the annotation database (`annotation_cache`).
    pub annotation_cache_bytes: u64,
    /// Memory scaled decodes may hold, all together (`max_scaled_decode_memory`).
    pub max_scaled_decode_bytes: u64,
}

/// Where the TLS certificate chain and its private key are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsPaths {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
}

impl ServeConfig {
    /// A configuration with defaults for `paths`, listening on `listen`, caching in `cache_dir`.
    pub fn new(paths: Vec<PathBuf>, listen: SocketAddr, cache_dir: PathBuf) -> Self {
        Self {
            paths,
            listen,
            cache: CacheKind::File,
            cache_dir,
            cache_max_bytes: DEFAULT_CACHE_MAX_BYTES,
            memory_cache_bytes: DEFAULT_MEMORY_CACHE_BYTES,
            allow_network_cache: false,
            token: None,
            chunk_target: DEFAULT_TARGET_CHUNK_BYTES,
            mapped_chunk_target: DEFAULT_MAPPED_CHUNK_BYTES,
            loopback_plans: LoopbackPlans::Learn,
            read_ahead_bytes: DEFAULT_READ_AHEAD_BYTES,
            settle_window: DEFAULT_SETTLE_WINDOW,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            pins: PinLimits::default(),
            tls: None,
            cache_group_readable: false,
            source_options: BTreeMap::new(),
            watch: false,
            watch_requested: false,
            watch_interval: DEFAULT_WATCH_INTERVAL,
            metrics_listen: None,
            log_format: LogFormat::Text,
            pyramid: PyramidPolicy::default(),
            runtime: RuntimeRoots::default(),
            writable: false,
            state_dir: default_state_dir(),
            upload_max_ttl: DEFAULT_UPLOAD_MAX_TTL,
            upload_limits: UploadLimits::default(),
            max_connections_per_peer: None,
            reclaim_idle_after: DEFAULT_RECLAIM_IDLE_AFTER,
            metrics_limits: ScrapeLimits {
                max_connections: DEFAULT_METRICS_MAX_CONNECTIONS,
                timeout: DEFAULT_METRICS_TIMEOUT,
            },
            follow_links_outside: false,
            max_sources: DEFAULT_MAX_SOURCES,
            max_open_sources: DEFAULT_MAX_OPEN,
            annotation_cache_bytes: DEFAULT_ANNOTATION_CACHE_BYTES,
            max_scaled_decode_bytes: DEFAULT_MAX_SCALED_DECODE_BYTES,
        }
    }

    /// The seats of the Flight listener: `max_connections`, of which one peer may hold
    /// `max_connections_per_peer` (half, rounded up, when unset).
    pub fn seat_limits(&self) -> SeatLimits {
        SeatLimits {
            max_connections: self.max_connections,
            max_per_peer: self
                .max_connections_per_peer
                .unwrap_or(self.max_connections.div_ceil(2))
                .clamp(1, self.max_connections.max(1)),
            reclaim_idle_after: self.reclaim_idle_after,
        }
    }

    /// The configured paths with their options, in order.
    pub fn sources(&self) -> Vec<SourceSpec> {
        self.paths
            .iter()
            .map(|path| SourceSpec {
                path: path.clone(),
                options: self.source_options.get(path).cloned().unwrap_or_default(),
            })
            .collect()
    }

    /// Merges flags (already merged with env by clap) over the config file over defaults.
    pub fn resolve(args: ServeArgs) -> Result<ServeConfig, ConfigError> {
        let file = match &args.config {
            Some(path) => ConfigFile::load(path)?,
            None => ConfigFile::default(),
        };
        let cache_file = file.cache.unwrap_or_default();
        let tls_file = file.tls.unwrap_or_default();
        let tls = match (
            args.tls_cert.or(tls_file.cert),
            args.tls_key.or(tls_file.key),
        ) {
            (Some(cert), Some(key)) => Some(TlsPaths { cert, key }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::Invalid(
                    "a TLS certificate was given without its key: add --tls-key FILE".to_string(),
                ));
            }
            (None, Some(_)) => {
                return Err(ConfigError::Invalid(
                    "a TLS key was given without its certificate: add --tls-cert FILE".to_string(),
                ));
            }
        };
        let listen = match args.listen.or(file.listen) {
            Some(a) => a,
            None => DEFAULT_LISTEN
                .parse()
                .map_err(|_| ConfigError::Invalid("bad default listen address".to_string()))?,
        };
        let token = match (args.token, file.token, file.token_file) {
            (Some(t), _, _) | (None, Some(t), _) => Some(t),
            (None, None, Some(path)) => Some(
                std::fs::read_to_string(&path)
                    .map_err(|source| ConfigError::Read { path, source })?
                    .trim()
                    .to_string(),
            ),
            (None, None, None) => None,
        };
        let (paths, source_options) = if args.paths.is_empty() {
            file_sources(file.sources, file.source)?
        } else {
            (args.paths, BTreeMap::new())
        };
        let upload_max_ttl = match args.upload_max_ttl.or(file.upload_max_ttl) {
            Some(s) => {
                let ttl = parse_duration(&s)?;
                if ttl < Duration::from_secs(1) {
                    return Err(ConfigError::Invalid(format!(
                        "upload_max_ttl '{s}' is under one second: an upload needs a lifetime"
                    )));
                }
                ttl
            }
            None => DEFAULT_UPLOAD_MAX_TTL,
        };
        let upload_limits = upload_limits(
            args.max_upload_cells.or(file.max_upload_cells),
            args.max_upload_bytes_in_flight
                .or(file.max_upload_bytes_in_flight),
            args.max_upload_bytes_in_flight_per_upload
                .or(file.max_upload_bytes_in_flight_per_upload),
            args.upload_max_count.or(file.upload_max_count),
            args.upload_open_stores.or(file.upload_open_stores),
        )?;
        let annotation_cache_bytes = match args.annotation_cache.or(file.annotation_cache) {
            Some(s) => parse_size(&s)?,
            None => DEFAULT_ANNOTATION_CACHE_BYTES,
        };
        let watch_interval = match args.watch_interval.or(file.watch_interval) {
            Some(s) => parse_duration(&s)?,
            None => DEFAULT_WATCH_INTERVAL,
        };
        let chunk_target = match args.chunk_target.or(file.chunk_target) {
            Some(s) => parse_size(&s)?,
            None => DEFAULT_TARGET_CHUNK_BYTES,
        };
        if chunk_target == 0 || chunk_target > MAX_CHUNK_BYTES {
            return Err(ConfigError::Invalid(format!(
                "chunk target {chunk_target} bytes is outside 1 byte ..= 64MiB"
            )));
        }
        let mapped_chunk_target = match args.mapped_chunk_target.or(file.mapped_chunk_target) {
            Some(s) => parse_size(&s)?,
            None => DEFAULT_MAPPED_CHUNK_BYTES,
        };
        if mapped_chunk_target > MAX_CHUNK_BYTES {
            return Err(ConfigError::Invalid(format!(
                "mapped chunk target {mapped_chunk_target} bytes is over the 64MiB chunk cap"
            )));
        }
        let read_ahead_bytes = match args.read_ahead.or(file.read_ahead) {
            Some(s) => parse_size(&s)?,
            None => DEFAULT_READ_AHEAD_BYTES,
        };
        let settle_window = match args.settle_window.or(file.settle_window) {
            Some(s) => parse_duration(&s)?,
            None => DEFAULT_SETTLE_WINDOW,
        };
        let handshake_timeout = match args.handshake_timeout.or(file.handshake_timeout) {
            Some(s) => parse_duration(&s)?,
            None => DEFAULT_HANDSHAKE_TIMEOUT,
        };
        let max_connections = args
            .max_connections
            .or(file.max_connections)
            .unwrap_or(DEFAULT_MAX_CONNECTIONS);
        if max_connections == 0 {
            return Err(ConfigError::Invalid(
                "max_connections 0 would refuse every client; use at least 1".to_string(),
            ));
        }
        let max_connections_per_peer = args
            .max_connections_per_peer
            .or(file.max_connections_per_peer);
        if max_connections_per_peer == Some(0) {
            return Err(ConfigError::Invalid(
                "max_connections_per_peer 0 would refuse every client; use at least 1".to_string(),
            ));
        }
        let reclaim_idle_after = match args.reclaim_idle_after.or(file.reclaim_idle_after) {
            Some(s) => parse_duration(&s)?,
            None => DEFAULT_RECLAIM_IDLE_AFTER,
        };
        let metrics_limits = ScrapeLimits {
            max_connections: args
                .metrics_max_connections
                .or(file.metrics_max_connections)
                .unwrap_or(DEFAULT_METRICS_MAX_CONNECTIONS),
            timeout: match args.metrics_timeout.or(file.metrics_timeout) {
                Some(s) => parse_duration(&s)?,
                None => DEFAULT_METRICS_TIMEOUT,
            },
        };
        if metrics_limits.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "metrics_max_connections 0 would refuse every scrape; use at least 1".to_string(),
            ));
        }
        let defaults = PinLimits::default();
        let pins = PinLimits {
            max_bytes: match args.max_pinned.or(file.max_pinned) {
                Some(s) => parse_size(&s)?,
                None => defaults.max_bytes,
            },
            max_connection_bytes: match args
                .max_pinned_per_connection
                .or(file.max_pinned_per_connection)
            {
                Some(s) => parse_size(&s)?,
                None => defaults.max_connection_bytes,
            },
            stream_idle_timeout: match args.stream_idle_timeout.or(file.stream_idle_timeout) {
                Some(s) => parse_duration(&s)?,
                None => defaults.stream_idle_timeout,
            },
        };
        if pins.stream_idle_timeout.is_zero() {
            return Err(ConfigError::Invalid(
                "stream_idle_timeout 0 would close every connection with a reply in flight; use at least 1s".to_string(),
            ));
        }
        let pyramid = pyramid_policy(args.pyramid_method, file.pyramid.unwrap_or_default())?;
        let roots = if args.add_source_roots.is_empty() {
            file.add_source_roots.unwrap_or_default()
        } else {
            args.add_source_roots
        };
        if let Some(relative) = roots.iter().find(|r| !r.is_absolute()) {
            return Err(ConfigError::Invalid(format!(
                "add_source_roots entry '{}' must be an absolute path",
                relative.display()
            )));
        }
        let runtime = RuntimeRoots {
            roots,
            max_files: args
                .add_source_max_files
                .or(file.add_source_max_files)
                .unwrap_or(DEFAULT_MAX_FILES),
        };
        let max_sources = args
            .max_sources
            .or(file.max_sources)
            .unwrap_or(DEFAULT_MAX_SOURCES);
        if max_sources == 0 {
            return Err(ConfigError::Invalid(
                "max_sources 0 would serve nothing; use at least 1".to_string(),
            ));
        }
        let max_open_sources = args
            .max_open_sources
            .or(file.max_open_sources)
            .unwrap_or(DEFAULT_MAX_OPEN);
        if max_open_sources == 0 {
            return Err(ConfigError::Invalid(
                "max_open_sources 0 would leave no descriptor to read a source with; use at least 1"
                    .to_string(),
            ));
        }
        let cache_max_bytes = match args.cache_max_bytes.or(cache_file.max_bytes) {
            Some(s) => parse_size(&s)?,
            None => DEFAULT_CACHE_MAX_BYTES,
        };
        let max_scaled_decode_bytes = match args
            .max_scaled_decode_memory
            .or(file.max_scaled_decode_memory)
        {
            Some(s) => parse_size(&s)?,
            None => DEFAULT_MAX_SCALED_DECODE_BYTES,
        };
        if max_scaled_decode_bytes < 16 << 20 {
            return Err(ConfigError::Invalid(format!(
                "max_scaled_decode_memory {max_scaled_decode_bytes} bytes is under 16MiB: no scaled chunk could be computed"
            )));
        }
        Ok(ServeConfig {
            paths,
            listen,
            cache: args.cache.or(cache_file.kind).unwrap_or(CacheKind::File),
            cache_dir: args
                .cache_dir
                .or(cache_file.dir)
                .unwrap_or_else(default_cache_dir),
            cache_max_bytes,
            memory_cache_bytes: DEFAULT_MEMORY_CACHE_BYTES.min(cache_max_bytes.max(1 << 20)),
            allow_network_cache: args.allow_network_cache
                || cache_file.allow_network.unwrap_or(false),
            token,
            chunk_target,
            mapped_chunk_target,
            loopback_plans: args
                .loopback_plans
                .or(file.loopback_plans)
                .unwrap_or_default(),
            read_ahead_bytes,
            settle_window,
            max_connections,
            handshake_timeout,
            pins,
            tls,
            cache_group_readable: args.cache_group_readable
                || cache_file.group_readable.unwrap_or(false),
            source_options,
            watch: args.watch.or(file.watch).unwrap_or(true),
            watch_requested: args.watch.or(file.watch) == Some(true),
            watch_interval,
            metrics_listen: args.metrics_listen.or(file.metrics_listen),
            log_format: file.log_format.unwrap_or_default(),
            pyramid,
            runtime,
            writable: args.writable.or(file.writable).unwrap_or(false),
            state_dir: args
                .state_dir
                .or(file.state_dir)
                .unwrap_or_else(default_state_dir),
            upload_max_ttl,
            upload_limits,
            max_connections_per_peer,
            reclaim_idle_after,
            metrics_limits,
            follow_links_outside: args
                .follow_links_outside
                .or(file.follow_links_outside)
                .unwrap_or(false),
            max_sources,
            max_open_sources,
            annotation_cache_bytes,
            max_scaled_decode_bytes,
        })
    }
}

/// The bounds on uploads: each setting (flags over the file) over its default. Every one must be at least 1 (a
/// zero would refuse every upload) and an in-flight limit at most 4 TiB.
fn upload_limits(
    max_cells: Option<u64>,
    in_flight: Option<String>,
    per_upload: Option<String>,
    max_count: Option<usize>,
    open_stores: Option<usize>,
) -> Result<UploadLimits, ConfigError> {
    let defaults = UploadLimits::default();
    let size = |value: Option<String>, name: &str, default: u64| -> Result<u64, ConfigError> {
        let Some(text) = value else {
            return Ok(default);
        };
        let bytes = parse_size(&text)?;
        if bytes == 0 || bytes > MAX_IN_FLIGHT_LIMIT {
            return Err(ConfigError::Invalid(format!(
                "{name} '{text}' is outside 1 byte ..= 4TiB: it bounds the bytes of upload \
                 chunks being received at once"
            )));
        }
        Ok(bytes)
    };
    let max_cells = max_cells.unwrap_or(defaults.max_cells);
    if max_cells == 0 {
        return Err(ConfigError::Invalid(
            "max_upload_cells 0 would refuse every upload; use at least 1".to_string(),
        ));
    }
    let limits = UploadLimits {
        max_cells,
        max_bytes_in_flight: size(
            in_flight,
            "max_upload_bytes_in_flight",
            defaults.max_bytes_in_flight,
        )?,
        max_bytes_in_flight_per_upload: size(
            per_upload,
            "max_upload_bytes_in_flight_per_upload",
            defaults.max_bytes_in_flight_per_upload,
        )?,
        max_uploads: max_count.unwrap_or(defaults.max_uploads),
        open_stores: open_stores.unwrap_or(defaults.open_stores),
    };
    if limits.max_uploads == 0 {
        return Err(ConfigError::Invalid(
            "upload_max_count 0 would refuse every upload; use at least 1".to_string(),
        ));
    }
    if limits.open_stores == 0 {
        return Err(ConfigError::Invalid(
            "upload_open_stores 0 leaves no upload store open to write or read; use at least 1"
                .to_string(),
        ));
    }
    Ok(limits)
}

/// The pyramid policy: the flag's method over the `[pyramid]` table over the defaults.
/// The floor `min(threshold, pixel_budget_cubic_root)` must be at least 2 and the factor
/// at least 2, or the levels could not shrink.
fn pyramid_policy(
    flag_method: Option<String>,
    file: PyramidFile,
) -> Result<PyramidPolicy, ConfigError> {
    let defaults = PyramidPolicy::default();
    let method = match flag_method.or(file.method) {
        None => defaults.method,
        Some(name) => match name.trim().to_ascii_lowercase().as_str() {
            "nearest" => Method::Nearest,
            "area" => Method::Area,
            _ => {
                return Err(ConfigError::Invalid(format!(
                    "pyramid method '{name}' is not one of nearest, area"
                )));
            }
        },
    };
    let policy = PyramidPolicy {
        method,
        threshold: file.threshold.unwrap_or(defaults.threshold),
        downscale_factor: file.downscale_factor.unwrap_or(defaults.downscale_factor),
        pixel_budget_cubic_root: file
            .pixel_budget_cubic_root
            .unwrap_or(defaults.pixel_budget_cubic_root),
        plane_max_pixels: file.plane_max_pixels.unwrap_or(defaults.plane_max_pixels),
    };
    for (key, value) in [
        ("threshold", policy.threshold),
        ("downscale_factor", policy.downscale_factor),
        ("pixel_budget_cubic_root", policy.pixel_budget_cubic_root),
    ] {
        if value < 2 {
            return Err(ConfigError::Invalid(format!(
                "pyramid {key} {value} is below 2: the levels could not shrink"
            )));
        }
    }
    Ok(policy)
}

/// The file's `sources = [...]` list then its `[[source]]` tables, with their
/// options checked: ids of `[A-Za-z0-9._-]`, non-empty distinct labels.
fn file_sources(
    plain: Option<Vec<PathBuf>>,
    tables: Option<Vec<SourceFile>>,
) -> Result<(Vec<PathBuf>, BTreeMap<PathBuf, SourceOptions>), ConfigError> {
    let mut paths = plain.unwrap_or_default();
    let mut options = BTreeMap::new();
    for table in tables.unwrap_or_default() {
        let shown = table.path.display();
        if let Some(id) = &table.id
            && (id.is_empty() || sanitize(id) != *id)
        {
            return Err(ConfigError::Invalid(format!(
                "[[source]] {shown}: id '{id}' must be non-empty and use only A-Z a-z 0-9 . _ -"
            )));
        }
        if let Some(labels) = &table.dim_labels {
            let distinct: std::collections::BTreeSet<&String> = labels.iter().collect();
            if labels.iter().any(String::is_empty) || distinct.len() != labels.len() {
                return Err(ConfigError::Invalid(format!(
                    "[[source]] {shown}: dim_labels {labels:?} must be non-empty and distinct"
                )));
            }
        }
        if paths.contains(&table.path) {
            return Err(ConfigError::Invalid(format!(
                "source {shown} is listed twice"
            )));
        }
        let supplied = supplied_of(&table)?;
        paths.push(table.path.clone());
        options.insert(
            table.path,
            SourceOptions {
                id: table.id,
                dim_labels: table.dim_labels,
                supplied: (!supplied.is_empty()).then(|| std::sync::Arc::new(supplied)),
            },
        );
    }
    Ok((paths, options))
}

/// The physical scale and metadata a `[[source]]` table supplies, checked: metadata from
/// `metadata` or `metadata_file` (not both), an object whose keys Tessera does not write.
fn supplied_of(table: &SourceFile) -> Result<Supplied, ConfigError> {
    let shown = table.path.display();
    let metadata = match (&table.metadata, &table.metadata_file) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::Invalid(format!(
                "[[source]] {shown}: give metadata or metadata_file, not both"
            )));
        }
        (Some(inline), None) => {
            let value = serde_json::to_value(inline)
                .map_err(|e| ConfigError::Invalid(format!("[[source]] {shown}: metadata: {e}")))?;
            value.as_object().cloned()
        }
        (None, Some(file)) => {
            let text = std::fs::read(file).map_err(|source| ConfigError::Read {
                path: file.clone(),
                source,
            })?;
            let value: serde_json::Value =
                serde_json::from_slice(&text).map_err(|e| ConfigError::Parse {
                    path: file.clone(),
                    message: format!("metadata_file of [[source]] {shown}: {e}"),
                })?;
            match value {
                serde_json::Value::Object(map) => Some(map),
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "[[source]] {shown}: metadata_file {} must hold a JSON object",
                        file.display()
                    )));
                }
            }
        }
        (None, None) => None,
    };
    let supplied = Supplied {
        physical_scale: table.physical_scale.clone(),
        physical_unit: table.physical_unit.clone(),
        metadata,
    };
    supplied
        .check_keys()
        .map_err(|why| ConfigError::Invalid(format!("[[source]] {shown}: {why}")))?;
    if let Some(bad) = supplied
        .physical_scale
        .iter()
        .flatten()
        .find(|v| !v.is_finite() || **v < 0.0)
    {
        return Err(ConfigError::Invalid(format!(
            "[[source]] {shown}: physical_scale value {bad} is not a finite size of 0 or more"
        )));
    }
    if supplied.physical_unit.is_some() && supplied.physical_scale.is_none() {
        return Err(ConfigError::Invalid(format!(
            "[[source]] {shown}: physical_unit needs physical_scale"
        )));
    }
    Ok(supplied)
}

/// Parses `2s`, `500ms`, `1.5s`, `1m`, or a bare number of seconds; zero is refused
/// ([`tessera_proto::units::parse_duration`]).
pub fn parse_duration(text: &str) -> Result<Duration, ConfigError> {
    tessera_proto::units::parse_duration(text).ok_or_else(|| {
        ConfigError::Invalid(format!(
            "duration '{text}' is not understood: use e.g. 2s, 500ms, 1m"
        ))
    })
}

/// `$XDG_CACHE_HOME/tessera`, else `~/.cache/tessera`, else a folder in the temp dir.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("tessera");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(home).join(".cache").join("tessera");
    }
    std::env::temp_dir().join("tessera-cache")
}

/// The default state directory: `$XDG_DATA_HOME/tessera`, else `~/.local/share/tessera`
/// (else a directory under the system's temporary directory).
pub fn default_state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("tessera");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(home)
            .join(".local")
            .join("share")
            .join("tessera");
    }
    std::env::temp_dir().join("tessera-state")
}

/// Parses `123`, `64MiB`, `4GiB`, `500MB`, `1.5GiB` (binary and decimal units,
/// case-insensitive): [`tessera_proto::units::parse_size`], which the client reads sizes with.
pub fn parse_size(text: &str) -> Result<u64, ConfigError> {
    tessera_proto::units::parse_size(text).ok_or_else(|| ConfigError::Size(text.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("500MB").unwrap(), 500_000_000);
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("12XB").is_err());
    }

    #[test]
    fn unknown_config_keys_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, "listen = \"127.0.0.1:1\"\nlisten_port = 3\n").unwrap();
        let err = ConfigFile::load(&path).unwrap_err().to_string();
        assert!(err.contains("listen_port"), "{err}");
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:1\"\nchunk_target = \"4MiB\"\n[cache]\nkind = \"memory\"\n",
        )
        .unwrap();
        let args = ServeArgs {
            listen: Some("127.0.0.1:2".parse().unwrap()),
            config: Some(path),
            ..Default::default()
        };
        let config = ServeConfig::resolve(args).unwrap();
        assert_eq!(config.listen.port(), 2);
        assert_eq!(config.chunk_target, 4 << 20);
        assert_eq!(config.cache, CacheKind::Memory);
    }

    fn resolve_file(text: &str, args: ServeArgs) -> Result<ServeConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, text).unwrap();
        ServeConfig::resolve(ServeArgs {
            config: Some(path),
            ..args
        })
    }

    #[test]
    fn source_tables_carry_options_after_the_plain_list() {
        let config = resolve_file(
            "sources = [\"/d/plain\"]\nwatch = true\nwatch_interval = \"250ms\"\n\
             metrics_listen = \"127.0.0.1:9100\"\nlog_format = \"json\"\n\
             [[source]]\npath = \"/d/a.npy\"\nid = \"alpha\"\ndim_labels = [\"y\", \"x\"]\n\
             [[source]]\npath = \"/d/dir\"\n",
            ServeArgs::default(),
        )
        .unwrap();
        let sources = config.sources();
        let paths: Vec<_> = sources.iter().map(|s| s.path.to_str().unwrap()).collect();
        assert_eq!(paths, ["/d/plain", "/d/a.npy", "/d/dir"]);
        assert_eq!(sources[1].options.id.as_deref(), Some("alpha"));
        assert_eq!(
            sources[1].options.dim_labels,
            Some(vec!["y".to_string(), "x".to_string()])
        );
        assert_eq!(sources[0].options, SourceOptions::default());
        assert!(config.watch && config.watch_requested);
        assert_eq!(config.watch_interval, Duration::from_millis(250));
        assert_eq!(config.metrics_listen.unwrap().port(), 9100);
        assert_eq!(config.log_format, LogFormat::Json);
    }

    #[test]
    fn defaults_apply_when_the_file_is_silent() {
        let config = resolve_file("", ServeArgs::default()).unwrap();
        assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
        assert!(config.watch, "directories are watched by default");
        assert!(!config.watch_requested);
        assert_eq!(config.watch_interval, DEFAULT_WATCH_INTERVAL);
        assert_eq!(config.metrics_listen, None);
        assert_eq!(config.log_format, LogFormat::Text);
        assert_eq!(config.chunk_target, DEFAULT_TARGET_CHUNK_BYTES);
        assert_eq!(config.cache_max_bytes, DEFAULT_CACHE_MAX_BYTES);
    }

    #[test]
    fn flags_beat_the_file_for_operations_keys() {
        let args = ServeArgs {
            paths: vec![PathBuf::from("/cli/x.npy")],
            watch: Some(false),
            watch_interval: Some("5s".to_string()),
            metrics_listen: Some("127.0.0.1:7".parse().unwrap()),
            ..Default::default()
        };
        let config = resolve_file(
            "watch = true\nwatch_interval = \"1s\"\nmetrics_listen = \"127.0.0.1:8\"\n\
             [[source]]\npath = \"/file/a.npy\"\nid = \"a\"\n",
            args,
        )
        .unwrap();
        assert!(!config.watch, "--watch=false beats watch = true");
        assert_eq!(config.watch_interval, Duration::from_secs(5));
        assert_eq!(config.metrics_listen.unwrap().port(), 7);
        let sources = config.sources();
        assert_eq!(
            sources.len(),
            1,
            "paths on the command line replace the file's"
        );
        assert_eq!(sources[0].options, SourceOptions::default());
    }

    #[test]
    fn bad_source_options_and_unknown_keys_are_named() {
        let err = |text: &str| {
            resolve_file(text, ServeArgs::default())
                .unwrap_err()
                .to_string()
        };
        let e = err("[[source]]\npath = \"/a.npy\"\nid = \"has space\"\n");
        assert!(e.contains("has space") && e.contains("/a.npy"), "{e}");
        let e = err("[[source]]\npath = \"/a.npy\"\ndim_labels = [\"y\", \"y\"]\n");
        assert!(e.contains("dim_labels"), "{e}");
        let e = err("[[source]]\npath = \"/a.npy\"\nlabels = [\"y\"]\n");
        assert!(e.contains("labels"), "{e}");
        let e = err("[[source]]\nid = \"x\"\n");
        assert!(e.contains("path"), "{e}");
        let e = err("[cache]\nkind = \"file\"\nbudget = 3\n");
        assert!(e.contains("budget"), "{e}");
        let e = err("watch_interval = \"soon\"\n");
        assert!(e.contains("soon"), "{e}");
        let e = err("sources = [\"/a.npy\"]\n[[source]]\npath = \"/a.npy\"\n");
        assert!(e.contains("listed twice"), "{e}");
    }

    #[test]
    fn source_metadata_and_runtime_roots_are_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let meta = dir.path().join("m.json");
        std::fs::write(&meta, r#"{"objective": "60x"}"#).unwrap();
        let config = resolve_file(
            &format!(
                "add_source_roots = [\"/data/inbox\"]\nadd_source_max_files = 7\n\
                 [[source]]\npath = \"/d/a.npy\"\nphysical_scale = [0.5, 0.1]\n\
                 physical_unit = \"um\"\nmetadata_file = \"{}\"\n",
                meta.display()
            ),
            ServeArgs::default(),
        )
        .unwrap();
        assert_eq!(config.runtime.roots, [PathBuf::from("/data/inbox")]);
        assert_eq!(config.runtime.max_files, 7);
        assert!(!config.follow_links_outside);
        assert_eq!(config.max_sources, DEFAULT_MAX_SOURCES);
        let limits = resolve_file(
            "follow_links_outside = true\nmax_sources = 9\nmax_open_sources = 3\n",
            ServeArgs::default(),
        )
        .unwrap();
        assert!(limits.follow_links_outside);
        assert_eq!(limits.max_sources, 9);
        assert_eq!(limits.max_open_sources, 3);
        let supplied = config.sources()[0].options.supplied.clone().unwrap();
        assert_eq!(supplied.physical_scale, Some(vec![0.5, 0.1]));
        assert_eq!(supplied.metadata.as_ref().unwrap()["objective"], "60x");
        let flags = ServeArgs {
            add_source_roots: vec![PathBuf::from("/flag/root")],
            ..Default::default()
        };
        let config = resolve_file("add_source_roots = [\"/file/root\"]\n", flags).unwrap();
        assert_eq!(config.runtime.roots, [PathBuf::from("/flag/root")]);

        let err = |text: &str| {
            resolve_file(text, ServeArgs::default())
                .unwrap_err()
                .to_string()
        };
        let e = err("add_source_roots = [\"relative\"]\n");
        assert!(e.contains("relative") && e.contains("absolute"), "{e}");
        let e = err(&format!(
            "[[source]]\npath = \"/a.npy\"\nmetadata = {{ a = 1 }}\nmetadata_file = \"{}\"\n",
            meta.display()
        ));
        assert!(e.contains("not both"), "{e}");
        let e = err("[[source]]\npath = \"/a.npy\"\nmetadata = { shape = 1 }\n");
        assert!(e.contains("shape"), "{e}");
        let e = err("[[source]]\npath = \"/a.npy\"\nphysical_scale = [-1.0]\n");
        assert!(e.contains("-1"), "{e}");
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("2 fortnights").is_err());
    }

    #[test]
    fn tls_needs_both_files_and_group_mode_is_opt_in() {
        let half = ServeArgs {
            tls_cert: Some(PathBuf::from("/c.pem")),
            ..Default::default()
        };
        let err = ServeConfig::resolve(half).unwrap_err().to_string();
        assert!(err.contains("--tls-key"), "{err}");
        let config = resolve_file(
            "[tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\"\n[cache]\ngroup_readable = true\n",
            ServeArgs::default(),
        )
        .unwrap();
        assert_eq!(config.tls.unwrap().key, PathBuf::from("/k.pem"));
        assert!(config.cache_group_readable);
        assert!(
            !ServeConfig::resolve(ServeArgs::default())
                .unwrap()
                .cache_group_readable
        );
    }
}
