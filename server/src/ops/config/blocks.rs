//! The settings of `tessera serve`, in blocks. One struct per block is at once its command-line
//! flags, their `TESSERA_*` environment variables and its config file keys; each field's doc
//! comment is its `--help` text, and its default is written beside it.
//!
//! [`settings_block!`] turns a block into two structs: the settings as given (every field an
//! `Option`, for clap and serde), and their values once resolved (a field with a default is
//! no longer optional), which `tessera config check` prints. One merge serves every block:
//! [`Listener::or`] keeps each setting given above (flag or environment variable) over the one
//! below (the file); `resolve` fills in the defaults. Each block then checks its values.
//!
//! Top-level keys of the file are spread over several blocks (flattened); `[cache]`, `[tls]`
//! and `[pyramid]` are tables of their own. A new setting is one field here, with its doc
//! comment and default, and one line in `docs/configuration.md`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use super::value::{Cap, Duration, ExternalLocation, HttpListen, Reduction, Size};
use super::{
    CacheKind, ConfigError, DEFAULT_ANNOTATION_CACHE_BYTES, DEFAULT_CACHE_MAX_BYTES,
    DEFAULT_HANDSHAKE_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_MEMORY_CACHE_BYTES,
    DEFAULT_RECLAIM_IDLE_AFTER, DEFAULT_UPLOAD_MAX_TTL, LogFormat, default_cache_dir,
    default_state_dir,
};
use crate::chunks::{
    DEFAULT_MAX_SCALED_DECODE_BYTES, DEFAULT_READ_AHEAD_BYTES, DEFAULT_SETTLE_WINDOW,
    DEFAULT_UPSTREAM_FETCHES, DEFAULT_WIRE_COMPRESSION_MEMORY, LabelTensors, WireCompression,
};
use crate::grid::route::LoopbackPlans;
use crate::grid::scaled::pyramid::PyramidPolicy;
use crate::grid::{DEFAULT_MAPPED_CHUNK_BYTES, DEFAULT_TARGET_CHUNK_BYTES, MAX_CHUNK_BYTES};
use crate::ops::scrape::{DEFAULT_METRICS_MAX_CONNECTIONS, DEFAULT_METRICS_TIMEOUT, ScrapeLimits};
use crate::ops::watch::DEFAULT_WATCH_INTERVAL;
use crate::source::npy::handles::DEFAULT_MAX_OPEN;
use crate::source::registry::DEFAULT_MAX_SOURCES;
use crate::source::runtime::{DEFAULT_MAX_FILES, RuntimeRoots};
use crate::unread::UnreadLimits;
use crate::uploads::{MAX_IN_FLIGHT_LIMIT, UploadLimits};
use crate::wire::http::{
    CorsOrigins, DEFAULT_HTTP_MAX_CONNECTIONS, DEFAULT_HTTP_PORT, DEFAULT_HTTP_TIMEOUT, HttpLimits,
};

/// Declares a block of settings: `$name` (every field `Option<T>`, the flags, environment
/// variables and file keys) and `$values` (each field `T` where a default is written after
/// `=`, else `Option<T>`), with `$name::or` (this layer over a lower one) and
/// `$name::resolve` (defaults filled in).
macro_rules! settings_block {
    (@type $ty:ty, $default:expr) => { $ty };
    (@type $ty:ty) => { Option<$ty> };
    (@value $value:expr, $default:expr) => { $value.unwrap_or_else(|| $default) };
    (@value $value:expr) => { $value };
    (
        $(#[$meta:meta])*
        pub struct $name:ident => $values:ident {
            $(
                $(#[$field_meta:meta])*
                $field:ident: $ty:ty $(= $default:expr)?,
            )*
        }
    ) => {
        #[derive(Clone, Debug, Default, PartialEq, clap::Args, serde::Deserialize)]
        $(#[$meta])*
        pub struct $name {
            $(
                $(#[$field_meta])*
                pub $field: Option<$ty>,
            )*
        }

        #[doc = concat!("The settings of [`", stringify!($name), "`], resolved: the value of \
                         each, or its default.")]
        #[derive(Clone, Debug, PartialEq, serde::Serialize)]
        pub struct $values {
            $(
                #[doc = concat!("`", stringify!($field), "`: see [`", stringify!($name), "`].")]
                pub $field: settings_block!(@type $ty $(, $default)?),
            )*
        }

        impl $name {
            /// Each setting of `self` where it is given, else the one of `under`.
            pub fn or(self, under: Self) -> Self {
                Self {
                    $($field: self.$field.or(under.$field),)*
                }
            }

            /// Each setting given, else its default.
            pub fn resolve(self) -> $values {
                $values {
                    $($field: settings_block!(@value self.$field $(, $default)?),)*
                }
            }
        }
    };
}

/// The heading `serve --help` shows first: the settings a first server needs, before the
/// tuning of each block.
const BASICS: &str = "Basics";

settings_block! {
    /// The Flight listener: its address, its token and the connections it holds.
    #[command(next_help_heading = "Listener")]
    pub struct Listener => ListenerValues {
        /// Address to listen on. A non-loopback address requires a token.
        #[arg(long, env = "TESSERA_LISTEN", value_name = "ADDR", help_heading = BASICS)]
        listen: SocketAddr = SocketAddr::from((Ipv4Addr::LOCALHOST, 8815)),
        /// Require `authorization: Bearer TOKEN` on every call (16–128 chars of [A-Za-z0-9_-]).
        #[arg(long, env = "TESSERA_TOKEN", hide_env_values = true, value_name = "TOKEN", help_heading = BASICS)]
        token: String,
        /// Connections held open at once; new ones beyond it are closed as they arrive
        /// [default: 512]. Keep it well under the descriptor limit (`ulimit -n`).
        #[arg(long, env = "TESSERA_MAX_CONNECTIONS", value_name = "N")]
        max_connections: usize = DEFAULT_MAX_CONNECTIONS,
        /// Connections one peer address may hold at once (all local clients are one address);
        /// past it, the peer's connection idle longest makes room or the new one is closed
        /// [default: half of --max-connections].
        #[arg(long, env = "TESSERA_MAX_CONNECTIONS_PER_PEER", value_name = "N")]
        max_connections_per_peer: usize,
        /// Time a new connection has to send its first bytes (HTTP/2 preface or TLS hello)
        /// before it is closed [default: 10s].
        #[arg(long, env = "TESSERA_HANDSHAKE_TIMEOUT", value_name = "DURATION")]
        handshake_timeout: Duration = Duration::of(DEFAULT_HANDSHAKE_TIMEOUT),
        /// When a new connection finds every slot taken, the connection with no call in flight
        /// for longest is closed for it if it has been idle this long [default: 5s].
        #[arg(long, env = "TESSERA_RECLAIM_IDLE_AFTER", value_name = "DURATION")]
        reclaim_idle_after: Duration = Duration::of(DEFAULT_RECLAIM_IDLE_AFTER),
        /// Address other machines dial this server at, answered by `health` (e.g.
        /// grpc://node7.cluster:8815), for dask workers on other nodes [default: the listen
        /// address when it is one IP other than loopback, else none].
        #[arg(long, env = "TESSERA_EXTERNAL_LOCATION", value_name = "URL")]
        external_location: ExternalLocation,
    }
}

impl ListenerValues {
    /// Refuses limits that would refuse every client.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.max_connections == 0 {
            return Err(ConfigError::Invalid(
                "max_connections 0 would refuse every client; use at least 1".to_string(),
            ));
        }
        if self.max_connections_per_peer == Some(0) {
            return Err(ConfigError::Invalid(
                "max_connections_per_peer 0 would refuse every client; use at least 1".to_string(),
            ));
        }
        Ok(())
    }
}

settings_block! {
    /// Unread replies: the bytes chunk replies not yet read by their peers may hold.
    #[command(next_help_heading = "Unread replies")]
    pub struct UnreadReplies => UnreadRepliesValues {
        /// Bytes that chunk replies not yet read by their peers may hold, over all connections;
        /// past it the connections whose replies stalled longest are closed [default: 1GiB].
        #[arg(long, env = "TESSERA_MAX_PINNED", value_name = "SIZE")]
        max_pinned: Size = Size::bytes(UnreadLimits::default().max_bytes),
        /// Bytes that unread chunk replies of one connection may hold; past it the connection is
        /// closed once one of its replies stalls [default: 512MiB].
        #[arg(long, env = "TESSERA_MAX_PINNED_PER_CONNECTION", value_name = "SIZE")]
        max_pinned_per_connection: Size = Size::bytes(UnreadLimits::default().max_connection_bytes),
        /// A chunk reply whose peer takes none of it for this long has its connection closed
        /// [default: 60s].
        #[arg(long, env = "TESSERA_STREAM_IDLE_TIMEOUT", value_name = "DURATION")]
        stream_idle_timeout: Duration = Duration::of(UnreadLimits::default().stream_idle_timeout),
    }
}

impl UnreadRepliesValues {
    /// The caps on bytes held by unread replies these settings give.
    pub fn limits(&self) -> UnreadLimits {
        UnreadLimits {
            max_bytes: self.max_pinned.get(),
            max_connection_bytes: self.max_pinned_per_connection.get(),
            stream_idle_timeout: self.stream_idle_timeout.get(),
        }
    }
}

settings_block! {
    /// Chunks: the grids reads are planned on, how chunks are decoded and how they are sent.
    #[command(next_help_heading = "Chunks")]
    pub struct Chunks => ChunksValues {
        /// Target chunk size below the 64MiB cap, e.g. 8MiB [default: 8MiB].
        #[arg(long, env = "TESSERA_CHUNK_TARGET", value_name = "SIZE")]
        chunk_target: Size = Size::bytes(DEFAULT_TARGET_CHUNK_BYTES),
        /// Target chunk size of plans for loopback clients while the file cache can be mapped:
        /// fewer, larger chunks for the mmap route (at most 24MiB of it with --loopback-plans
        /// learn); 0 plans every read on --chunk-target's grid [default: 64MiB].
        #[arg(long, env = "TESSERA_MAPPED_CHUNK_TARGET", value_name = "SIZE")]
        mapped_chunk_target: Size = Size::bytes(DEFAULT_MAPPED_CHUNK_BYTES),
        /// Grid of plans for loopback clients: `learn` plans them on --mapped-chunk-target's grid
        /// until a local client is seen reading it over the socket only; `mapped` always does
        /// (every local client maps); `socket` never does [default: learn].
        #[arg(long, env = "TESSERA_LOOPBACK_PLANS", value_enum)]
        loopback_plans: LoopbackPlans = LoopbackPlans::default(),
        /// Bytes of chunks decoded ahead of a reader walking a tensor in order, e.g. 32MiB; a
        /// cold plan's end chunks are decoded ahead too; 0 turns read-ahead off [default: 32MiB].
        #[arg(long, env = "TESSERA_READ_AHEAD", value_name = "SIZE")]
        read_ahead: Size = Size::bytes(DEFAULT_READ_AHEAD_BYTES),
        /// A source whose mtime or ctime is younger than this is not decoded until it is
        /// older (a write still in progress is never cached), e.g. 1s [default: 1s].
        #[arg(long, env = "TESSERA_SETTLE_WINDOW", value_name = "DURATION")]
        settle_window: Duration = Duration::of(DEFAULT_SETTLE_WINDOW),
        /// Memory that scaled (downsampled) decodes may hold, all together; a scaled chunk
        /// waits for its share, and one that alone needs more is refused [default: 512MiB].
        #[arg(long, env = "TESSERA_MAX_SCALED_DECODE_MEMORY", value_name = "SIZE")]
        max_scaled_decode_memory: Size = Size::bytes(DEFAULT_MAX_SCALED_DECODE_BYTES),
        /// Zstd-compress the buffers of do_get replies: `auto` for peers not on loopback
        /// (label tensors always, pixels that shrink when the peer's measured delivery rate
        /// is slower than compression would deliver), `zstd` for every peer, `off` never
        /// [default: auto].
        #[arg(long, env = "TESSERA_WIRE_COMPRESSION", value_enum)]
        wire_compression: WireCompression = WireCompression::default(),
        /// Memory the compressed bodies kept for replies may hold; the least recently used
        /// are dropped past it [default: 256MiB].
        #[arg(long, env = "TESSERA_WIRE_COMPRESSION_MEMORY", value_name = "SIZE")]
        wire_compression_memory: Size = Size::bytes(DEFAULT_WIRE_COMPRESSION_MEMORY),
        /// A pattern of array ids (`*` any characters, `?` one) of integer tensors that are
        /// label images: compressed to every peer off loopback under `--wire-compression
        /// auto`, like label set uploads; repeat for several [env: comma-separated list].
        #[arg(
            long = "label-tensors",
            env = "TESSERA_LABEL_TENSORS",
            value_delimiter = ',',
            value_name = "PATTERN"
        )]
        label_tensors: Vec<String> = Vec::new(),
    }
}

impl ChunksValues {
    /// Refuses chunk targets outside the chunk cap and a scaled decode budget too small
    /// for any scaled chunk.
    pub fn check(&self) -> Result<(), ConfigError> {
        let chunk_target = self.chunk_target.get();
        if chunk_target == 0 || chunk_target > MAX_CHUNK_BYTES {
            return Err(ConfigError::Invalid(format!(
                "chunk target {chunk_target} bytes is outside 1 byte ..= 64MiB"
            )));
        }
        let mapped_chunk_target = self.mapped_chunk_target.get();
        if mapped_chunk_target > MAX_CHUNK_BYTES {
            return Err(ConfigError::Invalid(format!(
                "mapped chunk target {mapped_chunk_target} bytes is over the 64MiB chunk cap"
            )));
        }
        let max_scaled_decode_bytes = self.max_scaled_decode_memory.get();
        if max_scaled_decode_bytes < 16 << 20 {
            return Err(ConfigError::Invalid(format!(
                "max_scaled_decode_memory {max_scaled_decode_bytes} bytes is under 16MiB: no scaled chunk could be computed"
            )));
        }
        self.label_tensors()?;
        Ok(())
    }

    /// The `label_tensors` patterns, refusing an empty one.
    pub fn label_tensors(&self) -> Result<LabelTensors, ConfigError> {
        LabelTensors::new(&self.label_tensors)
            .map_err(|err| ConfigError::Invalid(format!("label_tensors: {err}")))
    }
}

settings_block! {
    /// Sources: which are served, how many, and how they are watched and added at runtime.
    #[command(next_help_heading = "Sources")]
    pub struct Sources => SourcesValues {
        /// Rescan the sources every --watch-interval and serve added, changed and removed
        /// .npy files without a restart [default: true; `--watch=false` turns it off]. Given
        /// explicitly, a source path that does not exist yet is awaited instead of refused.
        #[arg(long, env = "TESSERA_WATCH", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", help_heading = BASICS)]
        watch: bool = true,
        /// Time between rescans with --watch, e.g. 2s, 500ms, 1m [default: 2s].
        #[arg(long, env = "TESSERA_WATCH_INTERVAL", value_name = "DURATION")]
        watch_interval: Duration = Duration::of(DEFAULT_WATCH_INTERVAL),
        /// A directory under which clients may add sources at runtime (`add_source`); repeat
        /// for several; none: refused [env: colon-separated list].
        #[arg(
            long = "add-source-root",
            env = "TESSERA_ADD_SOURCE_ROOTS",
            value_delimiter = ':',
            value_name = "DIR"
        )]
        add_source_roots: Vec<PathBuf> = Vec::new(),
        /// An object-store prefix (`s3://BUCKET/PREFIX/`, `gs://…`, `az://…`) under which
        /// clients may add object-store sources of the same cloud at runtime (`add_source`);
        /// repeat for several; none: refused [env: comma-separated list].
        #[arg(
            long = "add-source-store-root",
            env = "TESSERA_ADD_SOURCE_STORE_ROOTS",
            value_delimiter = ',',
            value_name = "STORE_PREFIX"
        )]
        add_source_store_roots: Vec<String> = Vec::new(),
        /// Most .npy files one `add_source` of a directory registers [default: 10000].
        #[arg(long, env = "TESSERA_ADD_SOURCE_MAX_FILES", value_name = "N")]
        add_source_max_files: usize = DEFAULT_MAX_FILES,
        /// Serve configured files whose path leads out of their configured folder (a symbolic
        /// link, or a directory replaced by one) [default: false: refused].
        #[arg(long, env = "TESSERA_FOLLOW_LINKS_OUTSIDE", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
        follow_links_outside: bool = false,
        /// Most sources served at once, configured and added at runtime [default: 100000].
        #[arg(long, env = "TESSERA_MAX_SOURCES", value_name = "N")]
        max_sources: usize = DEFAULT_MAX_SOURCES,
        /// Most descriptors of sources held open at once; the least recently used are closed
        /// and opened again on demand [default: 512].
        #[arg(long, env = "TESSERA_MAX_OPEN_SOURCES", value_name = "N")]
        max_open_sources: usize = DEFAULT_MAX_OPEN,
        /// A file holding the token sent to upstream tensor servers (`grpc://` sources);
        /// else `TESSERA_UPSTREAM_TOKEN`; never a flag's value.
        #[arg(long, env = "TESSERA_UPSTREAM_TOKEN_FILE", value_name = "FILE")]
        upstream_token_file: PathBuf,
        /// A PEM file of the CA certificates a `grpc+tls://` upstream's certificate is checked
        /// against.
        #[arg(long, env = "TESSERA_UPSTREAM_CA_FILE", value_name = "FILE")]
        upstream_ca_file: PathBuf,
        /// Time between looks at what an upstream serves: a changed tensor gets new chunk ids
        /// within it [default: 2s].
        #[arg(long, env = "TESSERA_UPSTREAM_POLL", value_name = "DURATION")]
        upstream_poll: Duration = Duration::of(DEFAULT_UPSTREAM_POLL),
        /// Chunks of upstream tensor servers (`grpc://` sources) fetched at once, apart from
        /// the decodes of local sources (one per core): a fetch waits on the link, not on a
        /// core [default: 8].
        #[arg(long, env = "TESSERA_UPSTREAM_FETCHES", value_name = "N")]
        upstream_fetches: usize = DEFAULT_UPSTREAM_FETCHES,
        /// Time between listings of an object-store source (`s3://`, `gs://`, `az://`;
        /// HEADs of an `https://` one): an object replaced or added gets new chunk ids, or is served,
        /// within it [default: 30s].
        #[arg(long, env = "TESSERA_OBJECT_STORE_RESCAN", value_name = "DURATION")]
        object_store_rescan: Duration = Duration::of(DEFAULT_OBJECT_STORE_RESCAN),
        /// Most objects one listing of an object-store prefix takes in; past it the listing
        /// stops and says so [default: 100000].
        #[arg(long, env = "TESSERA_OBJECT_STORE_MAX_OBJECTS", value_name = "N")]
        object_store_max_objects: usize = crate::objstore::DEFAULT_MAX_OBJECTS,
        /// Read `http://` object-store sources from hosts other than loopback (their bytes
        /// cross the network unauthenticated) [default: false: only `https://` there].
        #[arg(long, env = "TESSERA_OBJECT_STORE_ALLOW_HTTP", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
        object_store_allow_http: bool = false,
    }
}

/// Default of `--object-store-rescan`.
pub const DEFAULT_OBJECT_STORE_RESCAN: std::time::Duration = std::time::Duration::from_secs(30);

/// Default of `--upstream-poll`.
pub const DEFAULT_UPSTREAM_POLL: std::time::Duration = std::time::Duration::from_secs(2);

impl SourcesValues {
    /// Refuses relative runtime roots and limits that would serve nothing.
    pub fn check(&self) -> Result<(), ConfigError> {
        for address in &self.add_source_store_roots {
            crate::objstore::runtime::check_root(address)
                .map_err(|e| ConfigError::Invalid(format!("add_source_store_roots entry {e}")))?;
        }
        if let Some(relative) = self.add_source_roots.iter().find(|r| !r.is_absolute()) {
            return Err(ConfigError::Invalid(format!(
                "add_source_roots entry '{}' must be an absolute path",
                relative.display()
            )));
        }
        if self.max_sources == 0 {
            return Err(ConfigError::Invalid(
                "max_sources 0 would serve nothing; use at least 1".to_string(),
            ));
        }
        if self.upstream_fetches == 0 {
            return Err(ConfigError::Invalid(
                "upstream_fetches 0 would fetch no upstream chunk; use at least 1".to_string(),
            ));
        }
        if self.max_open_sources == 0 {
            return Err(ConfigError::Invalid(
                "max_open_sources 0 would leave no descriptor to read a source with; use at least 1"
                    .to_string(),
            ));
        }
        Ok(())
    }

    /// Where `add_source` may register paths from, and how many files one call may add.
    pub fn runtime_roots(&self) -> RuntimeRoots {
        RuntimeRoots {
            roots: self.add_source_roots.clone(),
            object_stores: self.add_source_store_roots.clone(),
            max_files: self.add_source_max_files,
            max_objects: self.object_store_max_objects,
        }
    }
}

settings_block! {
    /// Writes: uploads and annotations, kept in the state directory.
    #[command(next_help_heading = "Writes")]
    pub struct Writes => WritesValues {
        /// Accept uploads from clients (`add_tensor`, DoPut of chunks), kept in --state-dir;
        /// with a token, every write needs it [default: false].
        #[arg(long, env = "TESSERA_WRITABLE", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL", help_heading = BASICS)]
        writable: bool = false,
        /// Directory of what users write (uploads, annotations): never evicted, locked like the
        /// cache [default: $XDG_DATA_HOME/tessera or ~/.local/share/tessera].
        #[arg(long, env = "TESSERA_STATE_DIR", value_name = "DIR", help_heading = BASICS)]
        state_dir: PathBuf = default_state_dir(),
        /// Longest lifetime of an upload to the scratch source, and the lifetime of one that
        /// asks for none, e.g. 24h; 0 for no cap (uploads then live as long as they ask)
        /// [default: 24h].
        #[arg(long, env = "TESSERA_UPLOAD_MAX_TTL", value_name = "DURATION")]
        upload_max_ttl: Cap = Cap::of(DEFAULT_UPLOAD_MAX_TTL),
        /// Most cells (chunks) of one upload's grid; add_tensor refuses a grid with more
        /// [default: 262144].
        #[arg(long, env = "TESSERA_MAX_UPLOAD_CELLS", value_name = "N")]
        max_upload_cells: u64 = UploadLimits::default().max_cells,
        /// Most bytes of chunk DoPuts being received at once, all uploads; further chunks wait
        /// up to 30 s for room, then are refused UNAVAILABLE [default: 1GiB].
        #[arg(long, env = "TESSERA_MAX_UPLOAD_BYTES_IN_FLIGHT", value_name = "SIZE")]
        max_upload_bytes_in_flight: Size = Size::bytes(UploadLimits::default().max_bytes_in_flight),
        /// Most bytes of chunk DoPuts being received at once for one upload [default: 256MiB].
        #[arg(long, env = "TESSERA_MAX_UPLOAD_BYTES_IN_FLIGHT_PER_UPLOAD", value_name = "SIZE")]
        max_upload_bytes_in_flight_per_upload: Size =
            Size::bytes(UploadLimits::default().max_bytes_in_flight_per_upload),
        /// Most uploads held at once, a discarded one counting until its name frees; add_tensor
        /// beyond it is refused [default: 4096].
        #[arg(long, env = "TESSERA_UPLOAD_MAX_COUNT", value_name = "N")]
        upload_max_count: usize = UploadLimits::default().max_uploads,
        /// Most upload stores open at once (two descriptors each); the least recently used idle
        /// one is closed beyond it and reopened when next used [default: 64].
        #[arg(long, env = "TESSERA_UPLOAD_OPEN_STORES", value_name = "N")]
        upload_open_stores: usize = UploadLimits::default().open_stores,
        /// Keep ROI annotations users draw, in --state-dir; with false every ROI call is
        /// refused UNAVAILABLE and the catalog's rois table is empty [default: true].
        #[arg(long, env = "TESSERA_ANNOTATIONS", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
        annotations: bool = true,
        /// Memory the annotation database may keep as its page cache; a SQL scan of the `rois`
        /// table reads every page through it [default: 32MiB].
        #[arg(long, env = "TESSERA_ANNOTATION_CACHE", value_name = "SIZE")]
        annotation_cache: Size = Size::bytes(DEFAULT_ANNOTATION_CACHE_BYTES),
        /// File of the 32-byte secret that seals ROI tickets (mode 600), shared by replicas
        /// behind one load balancer so a plan made on one is redeemable on another
        /// [default: state_dir/annotations/seal.key, made on first use].
        #[arg(long, env = "TESSERA_SEAL_KEY_FILE", value_name = "FILE")]
        seal_key_file: PathBuf,
    }
}

impl WritesValues {
    /// Refuses an upload lifetime under a second, bounds that would refuse every upload and
    /// in-flight bounds over 4 TiB.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self
            .upload_max_ttl
            .get()
            .is_some_and(|ttl| ttl < std::time::Duration::from_secs(1))
        {
            return Err(ConfigError::Invalid(format!(
                "upload_max_ttl '{}' is under one second: an upload needs a lifetime (0 turns \
                 the cap off)",
                self.upload_max_ttl
            )));
        }
        if self.max_upload_cells == 0 {
            return Err(ConfigError::Invalid(
                "max_upload_cells 0 would refuse every upload; use at least 1".to_string(),
            ));
        }
        for (name, size) in [
            (
                "max_upload_bytes_in_flight",
                self.max_upload_bytes_in_flight,
            ),
            (
                "max_upload_bytes_in_flight_per_upload",
                self.max_upload_bytes_in_flight_per_upload,
            ),
        ] {
            if size.get() == 0 || size.get() > MAX_IN_FLIGHT_LIMIT {
                return Err(ConfigError::Invalid(format!(
                    "{name} '{size}' is outside 1 byte ..= 4TiB: it bounds the bytes of upload \
                     chunks being received at once"
                )));
            }
        }
        if self.upload_max_count == 0 {
            return Err(ConfigError::Invalid(
                "upload_max_count 0 would refuse every upload; use at least 1".to_string(),
            ));
        }
        if self.upload_open_stores == 0 {
            return Err(ConfigError::Invalid(
                "upload_open_stores 0 leaves no upload store open to write or read; use at least 1"
                    .to_string(),
            ));
        }
        Ok(())
    }

    /// The bounds on uploads these settings give.
    pub fn upload_limits(&self) -> UploadLimits {
        UploadLimits {
            max_cells: self.max_upload_cells,
            max_bytes_in_flight: self.max_upload_bytes_in_flight.get(),
            max_bytes_in_flight_per_upload: self.max_upload_bytes_in_flight_per_upload.get(),
            max_uploads: self.upload_max_count,
            open_stores: self.upload_open_stores,
        }
    }
}

settings_block! {
    /// Operations: the Prometheus endpoint, the HTTP API and the log format.
    #[command(next_help_heading = "Operations")]
    pub struct Operations => OperationsValues {
        /// Serve Prometheus metrics as text on http://ADDR/metrics.
        #[arg(long, env = "TESSERA_METRICS_LISTEN", value_name = "ADDR")]
        metrics_listen: SocketAddr,
        /// Connections to the --metrics-listen endpoint held at once; more are closed as they
        /// arrive [default: 16].
        #[arg(long, env = "TESSERA_METRICS_MAX_CONNECTIONS", value_name = "N")]
        metrics_max_connections: usize = DEFAULT_METRICS_MAX_CONNECTIONS,
        /// A --metrics-listen connection is closed this long after it was accepted, scrape
        /// finished or not [default: 10s].
        #[arg(long, env = "TESSERA_METRICS_TIMEOUT", value_name = "DURATION")]
        metrics_timeout: Duration = Duration::of(DEFAULT_METRICS_TIMEOUT),
        /// Serve the HTTP API and the viewer page on http://ADDR/, or `off` [default:
        /// 127.0.0.1:8817, skipped with a warning when that port is taken].
        #[arg(long, env = "TESSERA_HTTP_LISTEN", value_name = "ADDR|off")]
        http_listen: HttpListen,
        /// Connections to the HTTP API held at once; more are closed as they arrive
        /// [default: 256].
        #[arg(long, env = "TESSERA_HTTP_MAX_CONNECTIONS", value_name = "N")]
        http_max_connections: usize = DEFAULT_HTTP_MAX_CONNECTIONS,
        /// Longest one HTTP request may take [default: 120s].
        #[arg(long, env = "TESSERA_HTTP_TIMEOUT", value_name = "DURATION")]
        http_timeout: Duration = Duration::of(DEFAULT_HTTP_TIMEOUT),
        /// An origin (`https://host:port`, or `*` for any) whose pages may call the HTTP API
        /// from a browser (CORS); repeat for several; none: CORS off, only the server's own
        /// page reads its answers [env: comma-separated list].
        #[arg(
            long = "http-cors-origin",
            env = "TESSERA_HTTP_CORS_ORIGINS",
            value_delimiter = ',',
            value_name = "ORIGIN"
        )]
        http_cors_origins: Vec<String> = Vec::new(),
        /// Map every page of the binary's code and constants at start, so code paths a
        /// session uses rarely are never read back from disk after the page cache is
        /// dropped or pushed out; costs the binary's size in shared, file-backed resident
        /// memory (decision 0040) [default: true].
        #[arg(long, env = "TESSERA_RESIDENT_CODE", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_name = "BOOL")]
        resident_code: bool = true,
        /// Log line format; its flag, `--log-format` (`TESSERA_LOG_FORMAT`), is the binary's
        /// own and wins over the file.
        #[arg(skip)]
        log_format: LogFormat = LogFormat::default(),
    }
}

impl OperationsValues {
    /// Refuses a metrics endpoint that would refuse every scrape.
    pub fn check(&self) -> Result<(), ConfigError> {
        CorsOrigins::parse(&self.http_cors_origins)
            .map_err(|err| ConfigError::Invalid(err.to_string()))?;
        if self.http_max_connections == 0 {
            return Err(ConfigError::Invalid(
                "http_max_connections 0 would refuse every HTTP request; use at least 1"
                    .to_string(),
            ));
        }
        if self.metrics_max_connections == 0 {
            return Err(ConfigError::Invalid(
                "metrics_max_connections 0 would refuse every scrape; use at least 1".to_string(),
            ));
        }
        Ok(())
    }

    /// Where the HTTP API listens, and whether that address was configured (a default
    /// port that is taken is skipped with a warning, a configured one fails the start);
    /// `None`: off.
    pub fn http_address(&self) -> Option<(SocketAddr, bool)> {
        match self.http_listen {
            Some(HttpListen::Off) => None,
            Some(HttpListen::At(addr)) => Some((addr, true)),
            None => Some((
                SocketAddr::from((Ipv4Addr::LOCALHOST, DEFAULT_HTTP_PORT)),
                false,
            )),
        }
    }

    /// The origins whose pages may call the HTTP API (checked by [`Self::check`]; an entry
    /// that is not an origin allows nothing).
    pub fn http_cors(&self) -> CorsOrigins {
        CorsOrigins::parse(&self.http_cors_origins).unwrap_or_default()
    }

    /// The bounds on the HTTP API these settings give.
    pub fn http_limits(&self) -> HttpLimits {
        HttpLimits {
            max_connections: self.http_max_connections,
            timeout: self.http_timeout.get(),
        }
    }

    /// The bounds on the `/metrics` endpoint's connections these settings give.
    pub fn scrape_limits(&self) -> ScrapeLimits {
        ScrapeLimits {
            max_connections: self.metrics_max_connections,
            timeout: self.metrics_timeout.get(),
        }
    }
}

settings_block! {
    /// The `[cache]` table: where decoded chunks are kept.
    #[command(next_help_heading = "Cache")]
    #[serde(deny_unknown_fields)]
    pub struct Cache => CacheValues {
        /// Where chunks are cached: `file` lets local clients mmap them; `memory` sends every chunk over the socket.
        #[arg(long = "cache", env = "TESSERA_CACHE", value_enum)]
        kind: CacheKind = CacheKind::File,
        /// Directory of the chunk file cache [default: $XDG_CACHE_HOME/tessera or ~/.cache/tessera].
        #[arg(long = "cache-dir", env = "TESSERA_CACHE_DIR", value_name = "DIR", help_heading = BASICS)]
        dir: PathBuf = default_cache_dir(),
        /// Disk budget of the file cache (segments and sidecars), e.g. 64GiB [default: 10GiB].
        #[arg(long = "cache-max-bytes", env = "TESSERA_CACHE_MAX_BYTES", value_name = "SIZE")]
        max_bytes: Size = Size::bytes(DEFAULT_CACHE_MAX_BYTES),
        /// Use a cache directory on a network filesystem anyway (clients on other hosts may then see truncated files).
        #[arg(long = "allow-network-cache", env = "TESSERA_ALLOW_NETWORK_CACHE", num_args = 0, default_missing_value = "true")]
        allow_network: bool = false,
        /// Create cache files mode 0640 instead of 0600, so local users in the server's group can
        /// mmap them; other users' clients fall back to do_get.
        #[arg(long = "cache-group-readable", env = "TESSERA_CACHE_GROUP_READABLE", num_args = 0, default_missing_value = "true")]
        group_readable: bool = false,
    }
}

impl CacheValues {
    /// The memory cache's budget (the memory backend, and the fallback when the disk
    /// fails): the default, but no more than the file cache's budget (at least 1 MiB).
    pub fn memory_bytes(&self) -> u64 {
        DEFAULT_MEMORY_CACHE_BYTES.min(self.max_bytes.get().max(1 << 20))
    }
}

impl Cache {
    /// The two switches only turn on: `false` from a flag's environment variable leaves the
    /// file's `true` standing, as when they were plain flags.
    pub fn switches_only_turn_on(mut self) -> Cache {
        self.allow_network = self.allow_network.filter(|on| *on);
        self.group_readable = self.group_readable.filter(|on| *on);
        self
    }
}

settings_block! {
    /// The `[tls]` table: serve `grpcs://` (both keys, or neither).
    #[command(next_help_heading = "TLS")]
    #[serde(deny_unknown_fields)]
    pub struct Tls => TlsValues {
        /// PEM certificate chain: serve over TLS (clients use grpcs://); needs --tls-key.
        #[arg(long = "tls-cert", env = "TESSERA_TLS_CERT", value_name = "FILE")]
        cert: PathBuf,
        /// PEM private key of the --tls-cert leaf (keep it mode 600).
        #[arg(long = "tls-key", env = "TESSERA_TLS_KEY", value_name = "FILE")]
        key: PathBuf,
    }
}

settings_block! {
    /// The `[pyramid]` table: the levels descriptors advertise.
    #[command(next_help_heading = "Pyramid")]
    #[serde(deny_unknown_fields)]
    pub struct Pyramid => PyramidValues {
        /// Reduction method advertised for the computed pyramid levels of descriptors:
        /// nearest or area [default: nearest].
        #[arg(long = "pyramid-method", env = "TESSERA_PYRAMID_METHOD", value_name = "METHOD")]
        method: Reduction = Reduction(PyramidPolicy::default().method),
        /// Largest X or Y extent of the 2-D level (file only).
        #[arg(skip)]
        threshold: u64 = PyramidPolicy::default().threshold,
        /// Factor of one step (at least 2; file only).
        #[arg(skip)]
        downscale_factor: u64 = PyramidPolicy::default().downscale_factor,
        /// Cube root of the 3-D level's voxel budget (file only).
        #[arg(skip)]
        pixel_budget_cubic_root: u64 = PyramidPolicy::default().pixel_budget_cubic_root,
        /// Largest X·Y of the 2-D level (file only).
        #[arg(skip)]
        plane_max_pixels: u64 = PyramidPolicy::default().plane_max_pixels,
    }
}

impl PyramidValues {
    /// Refuses a floor `min(threshold, pixel_budget_cubic_root)` or a factor under 2: the
    /// levels could not shrink.
    pub fn check(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            ("threshold", self.threshold),
            ("downscale_factor", self.downscale_factor),
            ("pixel_budget_cubic_root", self.pixel_budget_cubic_root),
        ] {
            if value < 2 {
                return Err(ConfigError::Invalid(format!(
                    "pyramid {key} {value} is below 2: the levels could not shrink"
                )));
            }
        }
        Ok(())
    }

    /// The pyramid policy these settings give.
    pub fn policy(&self) -> PyramidPolicy {
        PyramidPolicy {
            method: self.method.0,
            threshold: self.threshold,
            downscale_factor: self.downscale_factor,
            pixel_budget_cubic_root: self.pixel_budget_cubic_root,
            plane_max_pixels: self.plane_max_pixels,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use clap::{Args, FromArgMatches};

    use crate::ops::config::{ServeArgs, Settings, SourceFile};

    const DOC: &str = include_str!("../../../../docs/configuration.md");

    /// `tessera serve`'s flags, parsed as the binary parses them (environment included).
    fn flags(args: &[&str]) -> ServeArgs {
        let command = ServeArgs::augment_args(clap::Command::new("serve"));
        let matches = command
            .try_get_matches_from(std::iter::once("serve").chain(args.iter().copied()))
            .unwrap();
        ServeArgs::from_arg_matches(&matches).unwrap()
    }

    /// The resolved settings of `args` over the config file `text`, as a TOML table.
    fn effective(args: &[&str], text: &str) -> toml::Table {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, text).unwrap();
        let mut args = flags(args);
        args.config = Some(path);
        let settings = Settings::resolve(args).unwrap();
        toml::from_str(&toml::to_string(&settings).unwrap()).unwrap()
    }

    /// `key` of `table`, or `key` of its sub-table `section`.
    fn value(table: &toml::Table, section: Option<&str>, key: &str) -> toml::Value {
        let table = match section {
            Some(name) => table[name].as_table().unwrap(),
            None => table,
        };
        table[key].clone()
    }

    #[test]
    fn each_block_takes_the_flag_over_the_file_over_the_default() {
        // One setting per block: its table, key, flag with a value, the file's value, and the
        // value printed for the flag, for the file and by default (TOML).
        let cases = [
            (
                None,
                "max_connections",
                ["--max-connections", "7"],
                "9",
                "7",
                "9",
                "512",
            ),
            (
                None,
                "max_pinned",
                ["--max-pinned", "2MiB"],
                "\"3MiB\"",
                "\"2MiB\"",
                "\"3MiB\"",
                "\"1GiB\"",
            ),
            (
                None,
                "read_ahead",
                ["--read-ahead", "1MiB"],
                "\"3MiB\"",
                "\"1MiB\"",
                "\"3MiB\"",
                "\"32MiB\"",
            ),
            (
                None,
                "wire_compression",
                ["--wire-compression", "zstd"],
                "\"off\"",
                "\"zstd\"",
                "\"off\"",
                "\"auto\"",
            ),
            (
                None,
                "watch_interval",
                ["--watch-interval", "250ms"],
                "\"3s\"",
                "\"250ms\"",
                "\"3s\"",
                "\"2s\"",
            ),
            (
                None,
                "upload_max_ttl",
                ["--upload-max-ttl", "1m"],
                "\"2h\"",
                "\"60s\"",
                "\"7200s\"",
                "\"86400s\"",
            ),
            (
                None,
                "metrics_timeout",
                ["--metrics-timeout", "1s"],
                "\"3s\"",
                "\"1s\"",
                "\"3s\"",
                "\"10s\"",
            ),
            (
                Some("cache"),
                "max_bytes",
                ["--cache-max-bytes", "1GiB"],
                "\"3GiB\"",
                "\"1GiB\"",
                "\"3GiB\"",
                "\"10GiB\"",
            ),
            (
                Some("pyramid"),
                "method",
                ["--pyramid-method", "area"],
                "\"NEAREST\"",
                "\"area\"",
                "\"nearest\"",
                "\"nearest\"",
            ),
        ];
        for (section, key, flag, file_value, by_flag, by_file, by_default) in cases {
            let file = match section {
                Some(name) => format!("[{name}]\n{key} = {file_value}\n"),
                None => format!("{key} = {file_value}\n"),
            };
            let printed = |args: &[&str], file: &str| value(&effective(args, file), section, key);
            assert_eq!(
                printed(&flag, &file).to_string(),
                by_flag,
                "{flag:?} over the file"
            );
            assert_eq!(printed(&[], &file).to_string(), by_file, "the file's {key}");
            assert_eq!(
                printed(&[], "").to_string(),
                by_default,
                "the default {key}"
            );
        }
        let tls = "[tls]\ncert = \"/file.pem\"\nkey = \"/file.key\"\n";
        let both = effective(&["--tls-cert", "/flag.pem"], tls);
        assert_eq!(both["tls"]["cert"].as_str(), Some("/flag.pem"));
        assert_eq!(both["tls"]["key"].as_str(), Some("/file.key"));
        assert!(!effective(&[], "").contains_key("tls"));
    }

    #[test]
    fn switches_only_turn_on_and_absent_flags_leave_the_file() {
        let on = effective(&[], "[cache]\nallow_network = true\n");
        assert_eq!(on["cache"]["allow_network"].as_bool(), Some(true));
        let flagged = effective(&["--cache-group-readable"], "");
        assert_eq!(flagged["cache"]["group_readable"].as_bool(), Some(true));
        let watch_off = effective(&["--watch=false"], "watch = true\n");
        assert_eq!(watch_off["watch"].as_bool(), Some(false));
        let roots = effective(&[], "add_source_roots = [\"/file\"]\n");
        assert_eq!(roots["add_source_roots"][0].as_str(), Some("/file"));
        let roots = effective(&["--add-source-root", "/a", "--add-source-root", "/b"], "");
        assert_eq!(roots["add_source_roots"].as_array().unwrap().len(), 2);
        let cors = effective(&[], "http_cors_origins = [\"https://a.example\"]\n");
        assert_eq!(
            cors["http_cors_origins"][0].as_str(),
            Some("https://a.example")
        );
        let cors = effective(
            &[
                "--http-cors-origin",
                "https://b.example",
                "--http-cors-origin",
                "*",
            ],
            "http_cors_origins = [\"https://a.example\"]\n",
        );
        assert_eq!(cors["http_cors_origins"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn flags_parse_sizes_and_durations_at_the_edge() {
        let command = ServeArgs::augment_args(clap::Command::new("serve"));
        let err = command
            .clone()
            .try_get_matches_from(["serve", "--chunk-target", "lots"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("size 'lots' is not understood"), "{err}");
        let err = command
            .try_get_matches_from(["serve", "--settle-window", "0s"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("duration '0s' is zero"), "{err}");
    }

    /// Every file key (`| \`key\` |` rows), flag and environment variable of `tessera serve`
    /// is in docs/configuration.md, and every key the doc lists exists.
    #[test]
    fn docs_list_every_setting_and_nothing_else() {
        let command = ServeArgs::augment_args(clap::Command::new("serve"));
        let mut keys: std::collections::BTreeSet<String> = ["sources", "token_file", "[[source]]"]
            .map(String::from)
            .into();
        for arg in command.get_arguments() {
            if let Some(long) = arg.get_long() {
                assert!(
                    DOC.contains(&format!("`--{long}")),
                    "--{long} is not documented"
                );
            }
            if let Some(env) = arg.get_env() {
                let env = env.to_string_lossy();
                assert!(DOC.contains(&format!("`{env}`")), "{env} is not documented");
            }
            let id = arg.get_id().as_str();
            if id != "paths" && id != "config" {
                keys.insert(id.to_string());
            }
        }
        let defaults = toml::Table::try_from(Settings::filled(ServeArgs::default())).unwrap();
        for (key, value) in &defaults {
            match value.as_table() {
                Some(table) => keys.extend(table.keys().cloned()),
                None => {
                    keys.insert(key.clone());
                }
            }
        }
        for key in &keys {
            assert!(
                DOC.contains(&format!("| `{key}` |")),
                "`{key}` is not documented"
            );
        }
        let table = SourceFile {
            path: "/a".into(),
            id: Some(String::new()),
            dim_labels: Some(Vec::new()),
            physical_scale: Some(Vec::new()),
            physical_unit: Some(crate::source::meta::Units::One(String::new())),
            metadata: Some(toml::Table::new()),
            metadata_file: Some("/m".into()),
        };
        keys.extend(toml::Table::try_from(table).unwrap().keys().cloned());
        for row in DOC.lines().filter(|l| l.starts_with("| `")) {
            let cell = row.split('|').nth(1).unwrap_or_default().trim();
            let key = cell.trim_matches('`');
            if key
                .chars()
                .all(|c| c.is_ascii_lowercase() || "_[]".contains(c))
            {
                assert!(
                    keys.contains(key),
                    "the doc lists `{key}`, which is no setting"
                );
            }
        }
    }

    #[test]
    fn the_docs_complete_file_is_read_by_the_real_parser() {
        let sample = DOC
            .split("## A complete file\n\n```toml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .unwrap();
        let parsed: ServeArgs = toml::from_str(sample).unwrap();
        assert_eq!(parsed.cache.max_bytes.unwrap().get(), 64 << 30);
        assert_eq!(parsed.source.len(), 1);
    }
}
