//! Configuration of `tessera serve`: flags override `TESSERA_*` environment variables, which
//! override the TOML config file, which overrides defaults.
//!
//! Every setting is written once, as a field of a block in [`blocks`] that is at once its
//! flag, its environment variable and its file key; [`ServeArgs`] gathers the blocks with
//! the source paths. [`Settings::resolve`] merges flags over the file, block by block, fills
//! in the defaults and checks each block; `tessera config check` prints those [`Settings`]
//! ([`effective`]), and the daemon reads them, block by block. Every key, flag and
//! environment variable is documented in `docs/configuration.md` (a test holds the two
//! together).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::source::registry::{SourceOptions, SourceSpec};
use crate::wire::listener::SeatLimits;

pub mod blocks;
pub mod effective;
pub mod source_tables;
pub mod value;

pub use blocks::{
    Cache, Chunks, Listener, Operations, Pyramid, Sources, Tls, UnreadReplies, Writes,
};
pub use source_tables::SourceFile;
pub use value::Size;

/// Default cap on connections held at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default time a new connection has to send its first bytes.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time without a call in flight after which a connection may be closed to make
/// room for a new one when every slot is taken.
pub const DEFAULT_RECLAIM_IDLE_AFTER: Duration = Duration::from_secs(5);

/// Default longest lifetime of an upload to the scratch source: one day, as biopb's.
pub const DEFAULT_UPLOAD_MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default memory the annotation database may keep as its page cache.
pub const DEFAULT_ANNOTATION_CACHE_BYTES: u64 = crate::rois::db::DEFAULT_CACHE_BYTES as u64;

/// Default listen address: loopback only, so no token is needed.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8815";
/// Default file cache budget.
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 10 << 30;
/// Default memory cache budget (the memory backend, and the fallback when the disk fails).
pub const DEFAULT_MEMORY_CACHE_BYTES: u64 = 1 << 30;

/// Where decoded chunks are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CacheKind {
    /// Segment files local clients can mmap (the default).
    File,
    /// RAM only: every chunk travels over the socket.
    Memory,
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
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

/// Everything `tessera serve` can be told: its command-line flags (each also settable by
/// environment) and, deserialized, the config file. Top-level keys of the file are spread
/// over the flattened blocks; `[cache]`, `[tls]` and `[pyramid]` are tables.
#[derive(Clone, Debug, Default, PartialEq, clap::Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeArgs {
    /// .npy files or directories (scanned recursively) to serve.
    #[serde(rename = "sources", default)]
    pub paths: Vec<PathBuf>,
    /// TOML config file; flags and environment override it.
    #[arg(long, env = "TESSERA_CONFIG", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// File holding the token, used when no token is set anywhere (file only).
    #[arg(skip)]
    pub token_file: Option<PathBuf>,
    /// Paths with options (`[[source]]` tables, file only), served after `sources`.
    #[arg(skip)]
    #[serde(default)]
    pub source: Vec<SourceFile>,
    /// The Flight listener.
    #[command(flatten)]
    #[serde(flatten)]
    pub listener: Listener,
    /// Unread replies.
    #[command(flatten)]
    #[serde(flatten)]
    pub unread_replies: UnreadReplies,
    /// Chunks.
    #[command(flatten)]
    #[serde(flatten)]
    pub chunks: Chunks,
    /// Sources.
    #[command(flatten)]
    #[serde(flatten)]
    pub sources: Sources,
    /// Writes.
    #[command(flatten)]
    #[serde(flatten)]
    pub writes: Writes,
    /// Operations.
    #[command(flatten)]
    #[serde(flatten)]
    pub operations: Operations,
    /// The `[cache]` table.
    #[command(flatten)]
    #[serde(default)]
    pub cache: Cache,
    /// The `[tls]` table.
    #[command(flatten)]
    #[serde(default)]
    pub tls: Tls,
    /// The `[pyramid]` table.
    #[command(flatten)]
    #[serde(default)]
    pub pyramid: Pyramid,
}

impl ServeArgs {
    /// Reads and parses a config file; unknown keys are errors that name the key, and sizes
    /// and durations are parsed as the flags parse them.
    pub fn load(path: &Path) -> Result<ServeArgs, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }

    /// The flags (with their environment variables) over `file`, block by block. Paths on
    /// the command line replace the file's `sources` and `[[source]]` tables as a whole.
    fn or(self, file: ServeArgs) -> ServeArgs {
        let (paths, source) = if self.paths.is_empty() {
            (file.paths, file.source)
        } else {
            (self.paths, Vec::new())
        };
        ServeArgs {
            paths,
            config: self.config,
            token_file: file.token_file,
            source,
            listener: self.listener.or(file.listener),
            unread_replies: self.unread_replies.or(file.unread_replies),
            chunks: self.chunks.or(file.chunks),
            sources: self.sources.or(file.sources),
            writes: self.writes.or(file.writes),
            operations: self.operations.or(file.operations),
            cache: self.cache.switches_only_turn_on().or(file.cache),
            tls: self.tls.or(file.tls),
            pyramid: self.pyramid.or(file.pyramid),
        }
    }
}

/// What `tessera serve` resolved: every block with its defaults filled in, and the sources.
/// The daemon reads it block by block; it has the config file's shape, so `tessera config
/// check` prints it by serializing it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Settings {
    /// The plain source paths (`sources`, or the command line's).
    #[serde(rename = "sources", skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathBuf>,
    /// The Flight listener.
    #[serde(flatten)]
    pub listener: blocks::ListenerValues,
    /// Unread replies.
    #[serde(flatten)]
    pub unread_replies: blocks::UnreadRepliesValues,
    /// Chunks.
    #[serde(flatten)]
    pub chunks: blocks::ChunksValues,
    /// Sources.
    #[serde(flatten)]
    pub sources: blocks::SourcesValues,
    /// Writes.
    #[serde(flatten)]
    pub writes: blocks::WritesValues,
    /// Operations.
    #[serde(flatten)]
    pub operations: blocks::OperationsValues,
    /// The `[cache]` table.
    pub cache: blocks::CacheValues,
    /// The `[tls]` table, if the server speaks TLS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsPaths>,
    /// The `[pyramid]` table.
    pub pyramid: blocks::PyramidValues,
    /// The `[[source]]` tables, served after `sources`.
    #[serde(rename = "source", skip_serializing_if = "Vec::is_empty")]
    pub source_tables: Vec<SourceFile>,
    /// Watching was asked for by a flag, variable or config key, not only defaulted.
    #[serde(skip)]
    pub watch_requested: bool,
    /// Every configured path, `sources` then the `[[source]]` tables'.
    #[serde(skip)]
    pub served_paths: Vec<PathBuf>,
    /// Id alias, axis labels and supplied metadata of the `[[source]]` tables' paths.
    #[serde(skip)]
    pub source_options: BTreeMap<PathBuf, SourceOptions>,
    /// The upstream tensor servers served (`grpc://host:port[/SOURCE]` among the paths).
    #[serde(skip)]
    pub upstreams: Vec<String>,
    /// The object-store sources served (`s3://BUCKET/PREFIX`, `gs://…`, `az://…`,
    /// `https://…` among the paths).
    #[serde(skip)]
    pub object_stores: Vec<String>,
}

impl Settings {
    /// Merges flags (already merged with env by clap) over the config file over defaults,
    /// then checks every block, reads `token_file` and the `[[source]]` tables' metadata.
    pub fn resolve(args: ServeArgs) -> Result<Settings, ConfigError> {
        let file = match &args.config {
            Some(path) => ServeArgs::load(path)?,
            None => ServeArgs::default(),
        };
        let watch_requested = args.sources.watch.or(file.sources.watch) == Some(true);
        let merged = args.or(file);
        let tls = tls_pair(merged.tls.clone().resolve())?;
        let token_file = merged.token_file.clone();
        let mut settings = Settings::filled(merged);
        settings.watch_requested = watch_requested;
        settings.tls = tls;
        if let (None, Some(path)) = (&settings.listener.token, token_file) {
            let text = std::fs::read_to_string(&path)
                .map_err(|source| ConfigError::Read { path, source })?;
            settings.listener.token = Some(text.trim().to_string());
        }
        let (upstreams, paths): (Vec<PathBuf>, Vec<PathBuf>) = settings
            .paths
            .iter()
            .cloned()
            .partition(|p| crate::upstream::is_upstream(&p.to_string_lossy()));
        for address in &upstreams {
            crate::upstream::UpstreamAddress::parse(&address.to_string_lossy())
                .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        }
        settings.upstreams = upstreams
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        let (object_stores, paths): (Vec<PathBuf>, Vec<PathBuf>) = paths
            .into_iter()
            .partition(|p| crate::objstore::is_object_store(&p.to_string_lossy()));
        for address in &object_stores {
            crate::objstore::StoreAddress::parse(&address.to_string_lossy())
                .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        }
        settings.object_stores = object_stores
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        (settings.served_paths, settings.source_options) =
            source_tables::file_sources(paths, settings.source_tables.clone())?;
        settings.writes.check()?;
        settings.chunks.check()?;
        settings.listener.check()?;
        settings.operations.check()?;
        settings.pyramid.check()?;
        settings.sources.check()?;
        settings.listener.max_connections_per_peer = Some(settings.seat_limits().max_per_peer);
        Ok(settings)
    }

    /// The defaults of every block, serving `paths`, listening on `listen`, caching in
    /// `cache_dir`, not watching its sources: what an embedded server (a test) starts from
    /// before it changes a block's field.
    pub fn new(paths: Vec<PathBuf>, listen: SocketAddr, cache_dir: PathBuf) -> Settings {
        let mut settings = Settings::filled(ServeArgs {
            paths,
            ..ServeArgs::default()
        });
        settings.listener.listen = listen;
        settings.cache.dir = cache_dir;
        settings.sources.watch = false;
        settings
    }

    /// The served paths with their options (a `[[source]]` table's), in order.
    pub fn source_specs(&self) -> Vec<SourceSpec> {
        self.served_paths
            .iter()
            .map(|path| SourceSpec {
                path: path.clone(),
                options: self.source_options.get(path).cloned().unwrap_or_default(),
            })
            .collect()
    }

    /// Every block of `args` with its defaults filled in, unchecked; no TLS (paired by
    /// [`Settings::resolve`]) and no source options (read by it).
    fn filled(args: ServeArgs) -> Settings {
        Settings {
            served_paths: args.paths.clone(),
            source_options: BTreeMap::new(),
            paths: args.paths,
            listener: args.listener.resolve(),
            unread_replies: args.unread_replies.resolve(),
            chunks: args.chunks.resolve(),
            sources: args.sources.resolve(),
            writes: args.writes.resolve(),
            operations: args.operations.resolve(),
            cache: args.cache.resolve(),
            tls: None,
            pyramid: args.pyramid.resolve(),
            source_tables: args.source,
            watch_requested: false,
            upstreams: Vec::new(),
            object_stores: Vec::new(),
        }
    }

    /// The seats of the Flight listener: `max_connections`, of which one peer may hold
    /// `max_connections_per_peer` (half, rounded up, when unset).
    pub fn seat_limits(&self) -> SeatLimits {
        let max_connections = self.listener.max_connections;
        SeatLimits {
            max_connections,
            max_per_peer: self
                .listener
                .max_connections_per_peer
                .unwrap_or(max_connections.div_ceil(2))
                .clamp(1, max_connections.max(1)),
            reclaim_idle_after: self.listener.reclaim_idle_after.get(),
        }
    }
}

/// The `[tls]` pair: both files, or neither.
fn tls_pair(tls: blocks::TlsValues) -> Result<Option<TlsPaths>, ConfigError> {
    match (tls.cert, tls.key) {
        (Some(cert), Some(key)) => Ok(Some(TlsPaths { cert, key })),
        (None, None) => Ok(None),
        (Some(_), None) => Err(ConfigError::Invalid(
            "a TLS certificate was given without its key: add --tls-key FILE".to_string(),
        )),
        (None, Some(_)) => Err(ConfigError::Invalid(
            "a TLS key was given without its certificate: add --tls-cert FILE".to_string(),
        )),
    }
}

/// Where the TLS certificate chain and its private key are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TlsPaths {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::grid::DEFAULT_TARGET_CHUNK_BYTES;
    use crate::ops::watch::DEFAULT_WATCH_INTERVAL;
    use crate::source::registry::DEFAULT_MAX_SOURCES;

    fn parse_size(text: &str) -> Result<u64, ConfigError> {
        text.parse::<Size>().map(Size::get)
    }

    fn parse_duration(text: &str) -> Result<Duration, ConfigError> {
        text.parse::<value::Duration>().map(value::Duration::get)
    }

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
        let err = ServeArgs::load(&path).unwrap_err().to_string();
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
            listener: Listener {
                listen: Some("127.0.0.1:2".parse().unwrap()),
                ..Default::default()
            },
            config: Some(path),
            ..Default::default()
        };
        let config = Settings::resolve(args).unwrap();
        assert_eq!(config.listener.listen.port(), 2);
        assert_eq!(config.chunks.chunk_target.get(), 4 << 20);
        assert_eq!(config.cache.kind, CacheKind::Memory);
    }

    fn resolve_file(text: &str, args: ServeArgs) -> Result<Settings, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, text).unwrap();
        Settings::resolve(ServeArgs {
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
        let sources = config.source_specs();
        let paths: Vec<_> = sources.iter().map(|s| s.path.to_str().unwrap()).collect();
        assert_eq!(paths, ["/d/plain", "/d/a.npy", "/d/dir"]);
        assert_eq!(sources[1].options.id.as_deref(), Some("alpha"));
        assert_eq!(
            sources[1].options.dim_labels,
            Some(vec!["y".to_string(), "x".to_string()])
        );
        assert_eq!(sources[0].options, SourceOptions::default());
        assert!(config.sources.watch && config.watch_requested);
        assert_eq!(
            config.sources.watch_interval.get(),
            Duration::from_millis(250)
        );
        assert_eq!(config.operations.metrics_listen.unwrap().port(), 9100);
        assert_eq!(config.operations.log_format, LogFormat::Json);
    }

    #[test]
    fn defaults_apply_when_the_file_is_silent() {
        let config = resolve_file("", ServeArgs::default()).unwrap();
        assert_eq!(config.listener.listen.to_string(), DEFAULT_LISTEN);
        assert!(config.sources.watch, "directories are watched by default");
        assert!(!config.watch_requested);
        assert_eq!(config.sources.watch_interval.get(), DEFAULT_WATCH_INTERVAL);
        assert_eq!(config.operations.metrics_listen, None);
        assert_eq!(config.operations.log_format, LogFormat::Text);
        assert_eq!(config.chunks.chunk_target.get(), DEFAULT_TARGET_CHUNK_BYTES);
        assert_eq!(config.cache.max_bytes.get(), DEFAULT_CACHE_MAX_BYTES);
    }

    #[test]
    fn flags_beat_the_file_for_operations_keys() {
        let args = ServeArgs {
            paths: vec![PathBuf::from("/cli/x.npy")],
            sources: Sources {
                watch: Some(false),
                watch_interval: Some("5s".parse().unwrap()),
                ..Default::default()
            },
            operations: Operations {
                metrics_listen: Some("127.0.0.1:7".parse().unwrap()),
                ..Default::default()
            },
            ..Default::default()
        };
        let config = resolve_file(
            "watch = true\nwatch_interval = \"1s\"\nmetrics_listen = \"127.0.0.1:8\"\n\
             [[source]]\npath = \"/file/a.npy\"\nid = \"a\"\n",
            args,
        )
        .unwrap();
        assert!(!config.sources.watch, "--watch=false beats watch = true");
        assert_eq!(config.sources.watch_interval.get(), Duration::from_secs(5));
        assert_eq!(config.operations.metrics_listen.unwrap().port(), 7);
        let sources = config.source_specs();
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
        assert_eq!(
            config.sources.runtime_roots().roots,
            [PathBuf::from("/data/inbox")]
        );
        assert_eq!(config.sources.runtime_roots().max_files, 7);
        assert!(!config.sources.follow_links_outside);
        assert_eq!(config.sources.max_sources, DEFAULT_MAX_SOURCES);
        let limits = resolve_file(
            "follow_links_outside = true\nmax_sources = 9\nmax_open_sources = 3\n",
            ServeArgs::default(),
        )
        .unwrap();
        assert!(limits.sources.follow_links_outside);
        assert_eq!(limits.sources.max_sources, 9);
        assert_eq!(limits.sources.max_open_sources, 3);
        let supplied = config.source_specs()[0].options.supplied.clone().unwrap();
        assert_eq!(supplied.physical_scale, Some(vec![0.5, 0.1]));
        assert_eq!(supplied.metadata.as_ref().unwrap()["objective"], "60x");
        let flags = ServeArgs {
            sources: Sources {
                add_source_roots: Some(vec![PathBuf::from("/flag/root")]),
                ..Default::default()
            },
            ..Default::default()
        };
        let config = resolve_file("add_source_roots = [\"/file/root\"]\n", flags).unwrap();
        assert_eq!(
            config.sources.runtime_roots().roots,
            [PathBuf::from("/flag/root")]
        );

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
            tls: Tls {
                cert: Some(PathBuf::from("/c.pem")),
                ..Default::default()
            },
            ..Default::default()
        };
        let err = Settings::resolve(half).unwrap_err().to_string();
        assert!(err.contains("--tls-key"), "{err}");
        let config = resolve_file(
            "[tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\"\n[cache]\ngroup_readable = true\n",
            ServeArgs::default(),
        )
        .unwrap();
        assert_eq!(config.tls.unwrap().key, PathBuf::from("/k.pem"));
        assert!(config.cache.group_readable);
        assert!(
            !Settings::resolve(ServeArgs::default())
                .unwrap()
                .cache
                .group_readable
        );
    }
}
