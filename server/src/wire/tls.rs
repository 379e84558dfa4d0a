//! TLS for the Flight endpoint (`--tls-cert` / `--tls-key`): rustls with the ring provider,
//! through tonic's `tls-ring` feature.
//!
//! Clients connect with `grpcs://HOST:PORT` (biopb) or `grpc+tls://HOST:PORT` (pyarrow). The
//! certificate is an ordinary PEM chain, leaf first; a self-signed leaf works with biopb's
//! trust-on-first-use or with the PEM handed to the client (`tls_ca_pem=`). The key is PEM
//! (PKCS#8, PKCS#1 or SEC1). Both files are read once at startup and checked before the
//! server binds, so a bad pair stops the daemon with a message naming the file.
//!
//! The HTTP API speaks HTTPS with the same pair ([`TlsIdentity::https_acceptor`]): tonic
//! keeps its rustls configuration to itself, so the HTTP side builds its own from the same
//! PEM bytes, with the same crypto provider (ring).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Identity, Server, ServerTlsConfig};

/// A connection that has not finished its TLS handshake by then is dropped, so idle
/// half-open connections cannot pile up.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the TLS certificate or key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read TLS {what} {path}: {source}")]
    Read {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file does not hold the PEM block it should.
    #[error("TLS {what} {path} holds no PEM '{marker}' block")]
    NotPem {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The PEM label looked for.
        marker: &'static str,
    },
    /// rustls refused the pair (wrong key for the certificate, unsupported algorithm, …).
    #[error("TLS certificate {cert} and key {key} are not usable together: {reason}")]
    Refused {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        reason: String,
    },
}

/// A certificate chain and its private key, read and checked.
#[derive(Clone)]
pub struct TlsIdentity {
    config: ServerTlsConfig,
    https: TlsAcceptor,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print key material.
        f.write_str("TlsIdentity(..)")
    }
}

impl TlsIdentity {
    /// Reads the PEM certificate chain at `cert` and the PEM private key at `key`, and checks
    /// that rustls accepts them as a server identity.
    pub fn load(cert: &Path, key: &Path) -> Result<TlsIdentity, TlsError> {
        let cert_pem = read_pem(cert, "certificate", "CERTIFICATE")?;
        let key_pem = read_pem(key, "key", "PRIVATE KEY")?;
        warn_if_key_is_shared(key);
        let https = https_acceptor(&cert_pem, &key_pem).map_err(|reason| TlsError::Refused {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            reason,
        })?;
        let config = ServerTlsConfig::new()
            .identity(Identity::from_pem(cert_pem, key_pem))
            .timeout(HANDSHAKE_TIMEOUT);
        // Building the acceptor parses both files and matches the key to the leaf.
        Server::builder()
            .tls_config(config.clone())
            .map_err(|e| TlsError::Refused {
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
                reason: error_chain(&e),
            })?;
        Ok(TlsIdentity { config, https })
    }

    /// The tonic server configuration.
    pub fn server_config(&self) -> ServerTlsConfig {
        self.config.clone()
    }

    /// The acceptor of the HTTP API's HTTPS connections (HTTP/1.1 by ALPN), on the same
    /// certificate and key.
    pub fn https_acceptor(&self) -> TlsAcceptor {
        self.https.clone()
    }
}

/// A rustls server configuration of the PEM chain and key, offering HTTP/1.1 (the HTTP API
/// speaks nothing else); the error is rustls's or the PEM parser's reason.
fn https_acceptor(cert_pem: &[u8], key_pem: &[u8]) -> Result<TlsAcceptor, String> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("certificate chain: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| format!("private key: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn read_pem(path: &Path, what: &'static str, marker: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let found = text
        .lines()
        .any(|l| l.starts_with("-----BEGIN ") && l.contains(marker));
    if !found {
        return Err(TlsError::NotPem {
            what,
            path: path.to_path_buf(),
            marker,
        });
    }
    Ok(bytes)
}

/// A private key readable by other users is a leak waiting to happen: say so once.
fn warn_if_key_is_shared(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{mode:o}"),
                "TLS private key is readable by other users; chmod 600 it"
            );
        }
    }
}

/// The error and its causes, joined: tonic wraps the rustls reason one level down.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn missing_and_non_pem_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        let err = TlsIdentity::load(&cert, &key).unwrap_err().to_string();
        assert!(err.contains("cert.pem"), "{err}");
        std::fs::write(&cert, "not a certificate").unwrap();
        let err = TlsIdentity::load(&cert, &key).unwrap_err().to_string();
        assert!(
            err.contains("cert.pem") && err.contains("CERTIFICATE"),
            "{err}"
        );
    }

    #[test]
    fn garbage_inside_pem_markers_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let err = TlsIdentity::load(&cert, &key).unwrap_err();
        assert!(matches!(err, TlsError::Refused { .. }), "{err}");
    }
}
