//! Upstream tensor servers as sources: `tessera serve grpc://origin:8815` serves the tensors
//! another tensor server (a Tessera, or biopb's reference server) serves, as a node-local
//! cache in front of it (docs/guides/upstream-sources.md, docs/decisions/0036).
//!
//! ```text
//!  Upstream::sync ── ListFlights, GetFlightInfo (link.rs) ──▶ UpstreamTensor (source.rs)
//!       │                                                     one Source per tensor,
//!       ▼                                                     its version a digest of
//!  Sources (registry: add, install_reopened, remove)          the upstream's chunk ids
//!
//!  chunk service ── read_region ──▶ UpstreamTensor ── DoGet (once per chunk) ──▶ upstream
//! ```
//!
//! The Flight-speaking part lives here, outside `source/`, which names no gRPC crate; an
//! upstream tensor is a `Source` like a file. The local grids are cut in whole upstream
//! chunks (`native_chunk`), so each local cell reads whole upstream chunks, and the chunk
//! service's single flight and cache keep each one crossing the link once per node.

pub mod address;
pub mod error;
pub mod link;
pub mod source;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use crate::source::Source;
use crate::source::origin::Origin;
use crate::source::registry::{Opened, Settings};
use crate::source::sources::Sources;

pub use address::{UpstreamAddress, is_upstream};
pub use error::UpstreamError;
use link::{Described, Link};
use source::{DescribedLevel, UpstreamTensor, stored_levels};

/// One upstream tensor server this server serves the tensors of.
#[derive(Debug)]
pub struct Upstream {
    link: Link,
}

/// What one [`Upstream::sync`] changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Synced {
    /// Tensors served for the first time.
    pub added: usize,
    /// Tensors whose upstream version changed (reopened under their id).
    pub changed: usize,
    /// Tensors the upstream no longer serves.
    pub removed: usize,
}

impl Upstream {
    /// The upstream at `address`, with `token` and, for `grpc+tls://`, `ca_pem` to trust.
    /// Dials nothing yet; must be called on the runtime that will run its calls.
    pub fn new(
        address: &str,
        token: Option<&str>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Upstream, UpstreamError> {
        let address = UpstreamAddress::parse(address)?;
        Ok(Upstream {
            link: Link::new(address, token, ca_pem)?,
        })
    }

    /// The upstream's address.
    pub fn address(&self) -> &UpstreamAddress {
        self.link.address()
    }

    /// Serves in `sources` what the upstream serves now: new tensors are added (under
    /// their upstream id, made unique), tensors whose upstream version changed are
    /// reopened, tensors gone upstream removed. Unreachable: nothing changes, and what is
    /// served keeps being served (from the cache).
    pub async fn sync(&self, sources: &Sources) -> Result<Synced, UpstreamError> {
        let address = self.link.address();
        let ids: Vec<String> = match &address.source {
            Some(one) => vec![one.clone()],
            None => self.link.list().await?,
        };
        let mut synced = Synced::default();
        let mut listed = HashSet::new();
        for id in ids {
            // Uploads' ids (`source/@fields/name`) name no local source id.
            if id.contains('/') {
                continue;
            }
            let path = PathBuf::from(address.url_of(&id));
            listed.insert(path.clone());
            // A source the upstream cannot describe as one tensor (biopb's `scratch`, a
            // refused file) is passed over; what was served under it stays as it was.
            let opened = match self.describe(&id).await {
                Ok((described, levels)) => {
                    UpstreamTensor::new(self.link.clone(), &id, described, levels)
                        .map(|t| Arc::new(t) as Arc<dyn Source>)
                        .map_err(|e| e.to_string())
                }
                Err(err @ UpstreamError::Unreachable { .. }) => return Err(err),
                Err(err) => {
                    tracing::debug!(upstream = %address.base, array_id = %id, %err, "upstream source not served");
                    continue;
                }
            };
            let local = sources.read().ids_by_path().get(&path).cloned();
            let held = local
                .as_ref()
                .and_then(|l| sources.read().get(l).map(|t| t.version));
            if let (Some(held), Ok(source)) = (held, &opened)
                && held == source.version()
            {
                continue;
            }
            let settings = Settings {
                origin: Origin::Upstream {
                    base: address.base.clone(),
                },
                ..Settings::default()
            };
            let options = sources.open_options().clone();
            match local {
                Some(local) => {
                    let opened = Opened::of_source(&local, &path, opened, settings, &options);
                    if sources.write().install_reopened(opened) {
                        tracing::info!(upstream = %address.base, source_id = %local, "upstream tensor changed; serving its new version");
                        synced.changed += 1;
                    }
                }
                None => {
                    let opened = Opened::of_source(&id, &path, opened, settings, &options);
                    match sources.write().add(&id, opened) {
                        Ok(_) => synced.added += 1,
                        Err(reason) => {
                            tracing::warn!(upstream = %address.base, array_id = %id, %reason, "upstream tensor not served");
                        }
                    }
                }
            }
        }
        let gone: Vec<String> = sources
            .read()
            .ids_by_path()
            .into_iter()
            .filter(|(path, _)| {
                path.to_string_lossy()
                    .strip_prefix(&address.base)
                    .is_some_and(|rest| rest.starts_with('/'))
                    && !listed.contains(path)
            })
            .map(|(_, id)| id)
            .collect();
        for id in gone {
            if sources.write().remove(&id) {
                synced.removed += 1;
            }
        }
        Ok(synced)
    }

    /// The upstream's plan of tensor `id` and of each stored level it advertises.
    async fn describe(&self, id: &str) -> Result<(Described, Vec<DescribedLevel>), UpstreamError> {
        let described = self.link.describe(id).await?;
        let mut levels = Vec::new();
        for factors in stored_levels(&described.descriptor) {
            let level = self.link.describe_level(id, &factors).await?;
            levels.push(DescribedLevel {
                factors,
                described: level,
            });
        }
        Ok((described, levels))
    }
}
