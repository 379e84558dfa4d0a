//! Sealed ROI grants: the `RoiGrant` a plan's `roi_ticket` carries, so whoever holds the
//! plan may read that tensor's annotations without a token.
//!
//! The seal is HMAC-SHA256, keyed by a 32-byte secret kept in
//! `STATE_DIR/annotations/seal.key` (mode 0600; made on first use, so seals outlive a
//! restart; deleting the file revokes every seal outstanding), over the tensor's array id,
//! its content version and the expiry, each framed by its length so no two inputs share
//! bytes.
//!
//! Replicas behind one load balancer share the key instead (`--seal-key-file`, [`Sealer::shared`]):
//! a file the operator made and gave every replica, read as it is and never made or repaired,
//! so a plan made on one replica is redeemable on any other.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use tessera_proto::pb::RoiGrant;

/// How long a grant is good for.
pub const GRANT_TTL_SECS: u64 = 24 * 3600;

const KEY_BYTES: usize = 32;
const DOMAIN: &[u8] = b"tessera roi grant v1";

/// Why the key could not be loaded or made.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A filesystem call failed.
    #[error("ROI seal key {}: cannot {action}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The key file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a key this server made.
    #[error("ROI seal key {} is {len} bytes, not {KEY_BYTES}: remove it to make a new one (every ROI ticket outstanding is then revoked)", path.display())]
    Malformed {
        /// The key file.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
    /// A shared key file users other than its owner may read.
    #[error(
        "seal key file {} has mode {mode:03o}: users other than its owner could read it and forge ROI \
         tickets; run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    Exposed {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A shared key file that does not hold exactly one key.
    #[error(
        "seal key file {} is {len} bytes, not {KEY_BYTES}: make one with \
         `head -c {KEY_BYTES} /dev/urandom > FILE && chmod 600 FILE` and give every replica the same file",
        path.display()
    )]
    SharedLength {
        /// The key file.
        path: PathBuf,
        /// Its length.
        len: usize,
    },
    /// The system's random source failed.
    #[error("no random bytes for the ROI seal key")]
    Random,
}

/// Why a grant does not let its holder read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// Past its expiry.
    #[error(
        "the ROI ticket of '{array_id}' expired at {expires_at} (Unix seconds); plan the tensor again for a fresh one"
    )]
    Expired {
        /// The tensor.
        array_id: String,
        /// Its expiry.
        expires_at: u64,
    },
    /// The seal does not match what it claims to cover.
    #[error(
        "the ROI ticket of '{0}' is not sealed by this server (altered, or sealed with a key since replaced)"
    )]
    Tampered(String),
    /// Sealed for a version of the tensor that is no longer served.
    #[error("the ROI ticket of '{0}' was sealed for another version of the tensor; plan it again")]
    OtherVersion(String),
}

/// Makes and checks grants.
pub struct Sealer {
    key: hmac::Key,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

/// `n` random bytes from the system.
pub fn random_bytes<const N: usize>() -> Option<[u8; N]> {
    let mut out = [0u8; N];
    SystemRandom::new().fill(&mut out).ok()?;
    Some(out)
}

impl Sealer {
    /// Loads the key at `path`, making it (mode 0600) when missing.
    pub fn open(path: &Path) -> Result<Sealer, KeyError> {
        let io = |action, source| KeyError::Io {
            action,
            path: path.to_path_buf(),
            source,
        };
        let fresh = random_bytes::<KEY_BYTES>().ok_or(KeyError::Random)?;
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(mut file) => {
                file.write_all(&fresh).map_err(|e| io("write", e))?;
                file.sync_all().map_err(|e| io("sync", e))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("create", e)),
        }
        let mut file = std::fs::File::open(path).map_err(|e| io("open", e))?;
        let mode = file
            .metadata()
            .map_err(|e| io("stat", e))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| io("chmod", e))?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(|e| io("read", e))?;
        if bytes.len() != KEY_BYTES {
            return Err(KeyError::Malformed {
                path: path.to_path_buf(),
                len: bytes.len(),
            });
        }
        Ok(Sealer {
            key: hmac::Key::new(hmac::HMAC_SHA256, &bytes),
        })
    }

    /// Loads the key replicas share from `path` (`--seal-key-file`): it must exist, hold
    /// exactly 32 bytes and be readable by its owner only. Nothing is made or changed.
    pub fn shared(path: &Path) -> Result<Sealer, KeyError> {
        let io = |action, source| KeyError::Io {
            action,
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(|e| io("open", e))?;
        let mode = file
            .metadata()
            .map_err(|e| io("stat", e))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(KeyError::Exposed {
                path: path.to_path_buf(),
                mode: mode & 0o777,
            });
        }
        let mut bytes = Vec::with_capacity(KEY_BYTES);
        // One byte past a key is enough to know the file is not one.
        (&mut file)
            .take(KEY_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io("read", e))?;
        if bytes.len() != KEY_BYTES {
            let len = file.metadata().map_or(bytes.len(), |m| {
                usize::try_from(m.len()).unwrap_or(usize::MAX)
            });
            return Err(KeyError::SharedLength {
                path: path.to_path_buf(),
                len,
            });
        }
        Ok(Sealer {
            key: hmac::Key::new(hmac::HMAC_SHA256, &bytes),
        })
    }

    fn message(array_id: &str, version: &[u8], expires_at: u64) -> Vec<u8> {
        let mut m = Vec::with_capacity(DOMAIN.len() + array_id.len() + version.len() + 24);
        for part in [DOMAIN, array_id.as_bytes(), version] {
            m.extend_from_slice(&(part.len() as u64).to_be_bytes());
            m.extend_from_slice(part);
        }
        m.extend_from_slice(&expires_at.to_be_bytes());
        m
    }

    /// A grant to read `array_id` at `version`, good until `now_secs + GRANT_TTL_SECS`.
    pub fn grant(&self, array_id: &str, version: &[u8], now_secs: u64) -> RoiGrant {
        let expires_at = now_secs + GRANT_TTL_SECS;
        let seal = hmac::sign(&self.key, &Self::message(array_id, version, expires_at));
        RoiGrant {
            content_version: version.to_vec(),
            expires_at,
            seal: seal.as_ref().to_vec(),
        }
    }

    /// Whether `grant` lets its holder read `array_id`, whose content version now is
    /// `current` (`None`: not served).
    pub fn check(
        &self,
        array_id: &str,
        grant: &RoiGrant,
        current: Option<&[u8]>,
        now_secs: u64,
    ) -> Result<(), GrantError> {
        let message = Self::message(array_id, &grant.content_version, grant.expires_at);
        if hmac::verify(&self.key, &message, &grant.seal).is_err() {
            return Err(GrantError::Tampered(array_id.to_string()));
        }
        if grant.expires_at != 0 && now_secs >= grant.expires_at {
            return Err(GrantError::Expired {
                array_id: array_id.to_string(),
                expires_at: grant.expires_at,
            });
        }
        if current != Some(grant.content_version.as_slice()) {
            return Err(GrantError::OtherVersion(array_id.to_string()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_check_and_refuse_by_cause() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("seal.key");
        let sealer = Sealer::open(&path)?;
        let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let grant = sealer.grant("img", b"v1", 1_000);
        assert_eq!(sealer.check("img", &grant, Some(b"v1"), 1_001), Ok(()));
        // The key persists: a reopened sealer accepts the same grant.
        assert_eq!(
            Sealer::open(&path)?.check("img", &grant, Some(b"v1"), 1_001),
            Ok(())
        );
        assert!(matches!(
            sealer.check("img", &grant, Some(b"v1"), 1_000 + GRANT_TTL_SECS),
            Err(GrantError::Expired { .. })
        ));
        assert_eq!(
            sealer.check("img", &grant, Some(b"v2"), 1_001),
            Err(GrantError::OtherVersion("img".to_string()))
        );
        assert_eq!(
            sealer.check("other", &grant, Some(b"v1"), 1_001),
            Err(GrantError::Tampered("other".to_string()))
        );
        let mut later = grant.clone();
        later.expires_at += 1;
        assert!(matches!(
            sealer.check("img", &later, Some(b"v1"), 1_001),
            Err(GrantError::Tampered(_))
        ));
        let mut flipped = grant;
        flipped.seal[0] ^= 1;
        assert!(matches!(
            sealer.check("img", &flipped, Some(b"v1"), 1_001),
            Err(GrantError::Tampered(_))
        ));
        // A shared key: the same bytes seal alike in every replica that loads them.
        let shared = dir.path().join("shared.key");
        std::fs::write(&shared, [7u8; KEY_BYTES])?;
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o600))?;
        let made_here = Sealer::shared(&shared)?.grant("img", b"v1", 1_000);
        assert_eq!(
            Sealer::shared(&shared)?.check("img", &made_here, Some(b"v1"), 1_001),
            Ok(())
        );
        assert_eq!(
            sealer.check("img", &made_here, Some(b"v1"), 1_001),
            Err(GrantError::Tampered("img".to_string()))
        );
        let refusal = |path: &Path| {
            Sealer::shared(path)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o640))?;
        let exposed = refusal(&shared);
        assert!(
            exposed.contains("mode 640") && exposed.contains("shared.key"),
            "{exposed}"
        );
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o400))?;
        assert!(Sealer::shared(&shared).is_ok());
        let long = dir.path().join("long.key");
        std::fs::write(&long, [1u8; KEY_BYTES + 1])?;
        std::fs::set_permissions(&long, std::fs::Permissions::from_mode(0o600))?;
        let wrong = refusal(&long);
        assert!(
            wrong.contains("33 bytes, not 32") && wrong.contains("long.key"),
            "{wrong}"
        );
        let missing = refusal(&dir.path().join("absent.key"));
        assert!(
            missing.contains("absent.key") && missing.contains("cannot open"),
            "{missing}"
        );
        std::fs::write(&path, b"short")?;
        assert!(
            Sealer::open(&path)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
                .contains("remove it")
        );
        Ok(())
    }
}
