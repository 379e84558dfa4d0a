//! Client settings and the environment variables that set their defaults.

use tessera_proto::units::parse_size;

/// Disables the mmap fast path when set to `0`, `false` or `no`.
pub const ENV_MMAP: &str = "TESSERA_MMAP";
/// biopb's switch: `1`, `true` or `yes` disables the mmap fast path too.
pub const ENV_BIOPB_CACHEFILE_DISABLED: &str = "BIOPB_CACHEFILE_TRANSFER_DISABLED";
/// Pin limit as a size string (`16GiB`, `512MiB`, a byte count); unset,
/// negative or unparseable means no limit.
pub const ENV_PIN_LIMIT: &str = "TESSERA_PIN_LIMIT";

/// Default number of chunks fetched at once.
pub const DEFAULT_CONCURRENCY: usize = 4;
/// Default byte budget of the strong copy cache (1 GiB).
pub const DEFAULT_COPY_CACHE_BYTES: u64 = 1 << 30;

/// How a [`crate::Client`] talks to its server. Build with
/// [`ClientOptions::default`] (which reads the environment) and the `with_*`
/// methods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// Bearer token sent on every call, if any.
    pub token: Option<String>,
    /// Whether to try the localhost mmap fast path.
    pub mmap: bool,
    /// How many chunks to fetch at once (at least 1).
    pub concurrency: usize,
    /// Cap on the summed on-disk size of the distinct segments kept mapped;
    /// `None` is no cap, `Some(0)` always copies out of the mapping.
    pub pin_limit: Option<u64>,
    /// Byte budget of the strong copy cache; 0 disables it.
    pub copy_cache_bytes: u64,
    /// PEM CA certificate(s) a TLS server's certificate must chain to. There is no
    /// default trust store: a TLS location without one is refused rather than trusted
    /// blindly, and a self-signed server is trusted by giving its own certificate.
    pub tls_ca_pem: Option<Vec<u8>>,
}

impl Default for ClientOptions {
    /// Defaults: no token; mmap on unless [`ENV_MMAP`] or
    /// [`ENV_BIOPB_CACHEFILE_DISABLED`] say otherwise; concurrency 4; pin
    /// limit from [`ENV_PIN_LIMIT`]; 1 GiB copy cache.
    fn default() -> Self {
        Self {
            token: None,
            mmap: mmap_enabled_by_env(
                std::env::var(ENV_MMAP).ok().as_deref(),
                std::env::var(ENV_BIOPB_CACHEFILE_DISABLED).ok().as_deref(),
            ),
            concurrency: DEFAULT_CONCURRENCY,
            pin_limit: std::env::var(ENV_PIN_LIMIT)
                .ok()
                .and_then(|v| parse_size(&v)),
            copy_cache_bytes: DEFAULT_COPY_CACHE_BYTES,
            tls_ca_pem: None,
        }
    }
}

impl ClientOptions {
    /// Sends `authorization: Bearer <token>` on every call.
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Trusts servers whose certificate chains to these PEM CA certificates (needed for
    /// `grpc+tls://` / `grpcs://` locations).
    pub fn with_tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_ca_pem = Some(pem.into());
        self
    }

    /// Turns the localhost mmap fast path on or off.
    pub fn with_mmap(mut self, mmap: bool) -> Self {
        self.mmap = mmap;
        self
    }

    /// Fetches up to `n` chunks at once (0 is taken as 1).
    pub fn with_concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Caps the bytes of segments kept mapped (`None`: no cap).
    pub fn with_pin_limit(mut self, limit: Option<u64>) -> Self {
        self.pin_limit = limit;
        self
    }

    /// Sets the copy cache budget in bytes (0 disables it).
    pub fn with_copy_cache_bytes(mut self, bytes: u64) -> Self {
        self.copy_cache_bytes = bytes;
        self
    }
}

fn truthy(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "true" | "yes"
    )
}

fn falsy(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "0" | "false" | "no"
    )
}

/// Whether the environment leaves the fast path on, given the values of
/// [`ENV_MMAP`] and [`ENV_BIOPB_CACHEFILE_DISABLED`].
fn mmap_enabled_by_env(tessera_mmap: Option<&str>, biopb_disabled: Option<&str>) -> bool {
    !(tessera_mmap.is_some_and(falsy) || biopb_disabled.is_some_and(truthy))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_switches_turn_mmap_off() {
        assert!(mmap_enabled_by_env(None, None));
        assert!(mmap_enabled_by_env(Some("1"), Some("0")));
        assert!(!mmap_enabled_by_env(Some("0"), None));
        assert!(!mmap_enabled_by_env(None, Some("yes")));
        assert!(!mmap_enabled_by_env(None, Some("TRUE")));
    }

    #[test]
    fn builder_sets_every_field() {
        let options = ClientOptions::default()
            .with_token("t0k3n")
            .with_mmap(false)
            .with_concurrency(0)
            .with_pin_limit(Some(7))
            .with_copy_cache_bytes(0);
        assert_eq!(options.token.as_deref(), Some("t0k3n"));
        assert!(!options.mmap);
        assert_eq!(options.concurrency, 1);
        assert_eq!(options.pin_limit, Some(7));
        assert_eq!(options.copy_cache_bytes, 0);
    }
}
