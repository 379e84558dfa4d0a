//! Sources in object stores: `tessera serve s3://BUCKET/PREFIX/` (`gs://BUCKET/PREFIX/`,
//! `az://CONTAINER/PREFIX/`) serves the `.npy` objects and Zarr arrays under the prefix, read with range requests through the segment cache;
//! `tessera serve https://HOST/PATH/STORE.zarr` (or `.npy`) one store or object of a web
//! server, which cannot be listed: its metadata documents are looked at instead
//! (docs/guides/object-stores.md, docs/decisions/0037).
//!
//! ```text
//!  Bucket::sync ── list the prefix (capped) ── classify (listing.rs) ──▶ NpyObject (npy.rs)
//!       │           once at start, then every object_store_rescan        ZarrObject (zarr.rs)
//!       │                                                                 OmeImage (ome.rs)
//!       ▼                                                                 one Source each,
//!  Sources (registry: add_kept, install_reopened, remove)                 its version from
//!                                                                         ETag, mtime, size
//!  chunk service ── read_region ──▶ NpyObject: GET with Range and If-Match, per cell
//!                                   ZarrObject: zarrs on zarrs_object_store, per chunk
//! ```
//!
//! The clients are object_store's (client.rs; cloud.rs builds the three clouds' one way;
//! its HTTP client for a web server): credentials, region and endpoint from each cloud's
//! standard variables (`AWS_*`, `GOOGLE_*`, `AZURE_*`), anonymous without credentials, at most
//! [`client::MAX_REQUESTS`] requests in flight per bucket, retried with backoff on 5xx and
//! throttling. The chunk service's single flight and cache keep each cell crossing the
//! link once; a store that cannot be reached leaves what is served alone (cached cells
//! keep serving, others fail UNAVAILABLE naming the store).

pub mod address;
pub mod client;
mod cloud;
pub mod error;
pub mod listing;
pub mod npy;
pub mod ome;
pub mod runtime;
pub mod zarr;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::content_version::FileVersion;

use crate::source::Source;
use crate::source::npy::Limits;
use crate::source::origin::Origin;
use crate::source::registry::{Opened, Settings};
use crate::source::sources::Sources;

pub use address::{StoreAddress, is_object_store};
use client::Client;
pub use error::ObjectStoreError;
use listing::Found;

pub use crate::source::runtime::DEFAULT_MAX_OBJECTS;

/// One object-store address served: its bucket's client and the listing's cap.
#[derive(Debug)]
pub struct Bucket {
    client: Client,
    max_objects: usize,
    /// The version of each refused object or array when it was refused: it is opened
    /// again only once it changes.
    refused: Mutex<HashMap<PathBuf, FileVersion>>,
}

/// What one [`Bucket::sync`] changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Synced {
    /// Sources served (or refused) for the first time.
    pub added: usize,
    /// Sources whose objects changed (reopened under their id).
    pub changed: usize,
    /// Sources whose objects are gone.
    pub removed: usize,
    /// Whether the listing stopped at the cap.
    pub truncated: bool,
}

impl Bucket {
    /// The source at `address`, listing at most `max_objects` objects; a plain `http://`
    /// one off loopback only when `allow_http`. Dials nothing yet; must be called on the
    /// runtime that will run its requests.
    pub fn new(
        address: &str,
        max_objects: usize,
        allow_http: bool,
    ) -> Result<Bucket, ObjectStoreError> {
        let address = StoreAddress::parse(address)?;
        Ok(Bucket {
            client: Client::new(address, allow_http)?,
            max_objects,
            refused: Mutex::default(),
        })
    }

    /// The address served.
    pub fn address(&self) -> &StoreAddress {
        self.client.address()
    }

    /// Whether requests go unsigned (no credentials in the environment).
    pub fn anonymous(&self) -> bool {
        self.client.anonymous()
    }

    /// Serves in `sources` what the address holds now: new objects and arrays are added
    /// (or refused, by name), changed ones reopened under their id, gone ones removed.
    /// Unreachable, denied or missing bucket: nothing changes. Blocking (run it on a
    /// blocking thread).
    pub fn sync(&self, sources: &Sources, limits: &Limits) -> Result<Synced, ObjectStoreError> {
        let address = self.client.address();
        let listing = self.client.list(self.max_objects)?;
        let mut synced = Synced {
            truncated: listing.truncated,
            ..Synced::default()
        };
        let mut listed = HashSet::new();
        for found in listing::classify(&listing.objects) {
            let path = PathBuf::from(address.url_of(found.key()));
            let local = sources.read().ids_by_path().get(&path).cloned();
            let held = local
                .as_ref()
                .and_then(|l| sources.read().get(l).map(|t| t.version));
            let refused_as = self.refused.lock().get(&path).copied();
            if held.is_some_and(|held| held == found.version())
                || refused_as == Some(found.version())
            {
                listed.insert(path);
                continue;
            }
            let opened: Result<Arc<dyn Source>, String> = match self.open(&found, limits) {
                Ok(Some(source)) => Ok(source),
                Ok(None) => continue,
                Err(err) if err.is_unreachable() => return Err(err),
                Err(err) => {
                    self.refused.lock().insert(path.clone(), found.version());
                    Err(err.to_string())
                }
            };
            if opened.is_ok() {
                self.refused.lock().remove(&path);
            }
            listed.insert(path.clone());
            let settings = Settings {
                origin: Origin::ObjectStore {
                    base: address.base(),
                },
                ..Settings::default()
            };
            let options = sources.open_options().clone();
            match local {
                Some(local) => {
                    let opened = Opened::of_source(&local, &path, opened, settings, &options);
                    if sources.write().install_reopened(opened) {
                        tracing::info!(store = %address.url, source_id = %local, "object changed; serving its new version");
                        synced.changed += 1;
                    }
                }
                None => {
                    let id = listing::id_of(address, found.key());
                    let opened = Opened::of_source(&id, &path, opened, settings, &options);
                    sources.write().add_kept(&id, opened);
                    synced.added += 1;
                }
            }
        }
        // What the listing covered and no longer holds is removed; a truncated listing
        // covers only what it returned.
        let covered = address.url_of(&address.prefix);
        let gone: Vec<String> = sources
            .read()
            .ids_by_path()
            .into_iter()
            .filter(|(path, _)| {
                !listing.truncated
                    && path.to_string_lossy().starts_with(&covered)
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

    /// Opens one source the listing found; `Ok(None)`: no source (a Zarr group that is no
    /// image).
    fn open(
        &self,
        found: &Found,
        limits: &Limits,
    ) -> Result<Option<Arc<dyn Source>>, ObjectStoreError> {
        match found {
            Found::Npy { meta, version } => {
                npy::NpyObject::open(&self.client, meta, *version, limits)
                    .map(|s| Some(Arc::new(s) as Arc<dyn Source>))
            }
            Found::Zarr {
                root,
                node,
                version,
            } => ome::open_node(&self.client, root, *node, *version, limits),
        }
    }
}
