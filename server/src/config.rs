//! Configuration of `tessera serve`: flags override `TESSERA_*` environment
//! variables, which override the TOML config file, which overrides defaults.
//!
//! ```toml
//! # tessera.toml — every key optional
//! listen = "127.0.0.1:8815"
//! sources = ["/data/volumes", "/data/cells.npy"]
//! token_file = "/etc/tessera/token"     # or: token = "…"
//! chunk_target = "8MiB"
//!
//! [cache]
//! kind = "file"                          # or "memory"
//! dir = "/var/cache/tessera"
//! max_bytes = "64GiB"
//! allow_network = false
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::grid::{DEFAULT_TARGET_CHUNK_BYTES, MAX_CHUNK_BYTES};

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
    /// Cache settings.
    pub cache: Option<CacheFile>,
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
    /// TOML config file; flags and environment override it.
    #[arg(long, env = "TESSERA_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
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
        }
    }

    /// Merges flags (already merged with env by clap) over the config file over defaults.
    pub fn resolve(args: ServeArgs) -> Result<ServeConfig, ConfigError> {
        let file = match &args.config {
            Some(path) => ConfigFile::load(path)?,
            None => ConfigFile::default(),
        };
        let cache_file = file.cache.unwrap_or_default();
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
        let paths = if args.paths.is_empty() {
            file.sources.unwrap_or_default()
        } else {
            args.paths
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
        let cache_max_bytes = match args.cache_max_bytes.or(cache_file.max_bytes) {
            Some(s) => parse_size(&s)?,
            None => DEFAULT_CACHE_MAX_BYTES,
        };
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
        })
    }
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

/// Parses `123`, `64MiB`, `4GiB`, `500MB`, `1.5GiB` (binary and decimal units, case-insensitive).
pub fn parse_size(text: &str) -> Result<u64, ConfigError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| ConfigError::Size(text.to_string()))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        "t" | "tb" => 1_000_000_000_000,
        "tib" => 1 << 40,
        _ => return Err(ConfigError::Size(text.to_string())),
    };
    let bytes = value * multiplier as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(ConfigError::Size(text.to_string()));
    }
    Ok(bytes as u64)
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
}
