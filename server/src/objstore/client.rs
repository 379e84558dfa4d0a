//! The client of one bucket: object_store's S3, GCS or Azure client set up from the
//! cloud's standard environment variables (cloud.rs), or its HTTP client for a web
//! server's store, its requests bounded in number (`LimitStore`) and retried with
//! backoff on server errors and throttling (`RetryConfig`), and blocking wrappers the
//! sources call from the chunk service's blocking threads.

use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::http::HttpBuilder;
use object_store::limit::LimitStore;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt,
    RetryConfig,
};

use crate::objstore::address::{Scheme, StoreAddress};
use crate::objstore::cloud;
use crate::objstore::error::ObjectStoreError;

/// Requests one bucket's client has in flight at most (listing, heads and range reads of
/// every source in it together).
pub const MAX_REQUESTS: usize = 16;

/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one request may take, its body included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The refusal of a store whose client object_store could not build.
fn setup_failed(address: &StoreAddress, err: object_store::Error) -> ObjectStoreError {
    ObjectStoreError::Setup {
        url: address.url.clone(),
        why: err.to_string(),
    }
}

/// The retries of one request: a few, with backoff, and never past this time, so a store
/// that is down fails a read within seconds rather than minutes.
fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: 4,
        retry_timeout: Duration::from_secs(15),
    }
}

/// What one listing found.
#[derive(Debug)]
pub struct Listing {
    /// The objects, at most the cap, in the store's order.
    pub objects: Vec<ObjectMeta>,
    /// Whether the prefix holds more objects than the cap.
    pub truncated: bool,
}

/// One bucket's client.
#[derive(Clone)]
pub struct Client {
    address: StoreAddress,
    store: Arc<dyn ObjectStore>,
    runtime: tokio::runtime::Handle,
    anonymous: bool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("address", &self.address.url)
            .field("anonymous", &self.anonymous)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// The client of `address`'s bucket, set up from its cloud's environment variables
    /// (`AWS_*`, `GOOGLE_*`, `AZURE_*`: credentials, region, endpoint, plain HTTP);
    /// anonymous when none gives credentials. A web server's (`https://`, `http://`) is
    /// anonymous; plain HTTP is refused unless its host is loopback or `allow_http`. Dials
    /// nothing yet; must be called on the runtime that will run its requests.
    pub fn new(address: StoreAddress, allow_http: bool) -> Result<Client, ObjectStoreError> {
        let options = ClientOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT);
        if address.is_web() {
            return Self::web(address, options, allow_http);
        }
        let (store, anonymous) =
            cloud::store(&address, options, retry()).map_err(|e| setup_failed(&address, e))?;
        Ok(Client::limited(address, store, anonymous))
    }

    /// The client of `store` for `address`, with at most `MAX_REQUESTS` requests in flight.
    fn limited(address: StoreAddress, store: impl ObjectStore, anonymous: bool) -> Client {
        Client {
            address,
            store: Arc::new(LimitStore::new(store, MAX_REQUESTS)),
            runtime: tokio::runtime::Handle::current(),
            anonymous,
        }
    }

    /// The client of a web server's store: object_store's HTTP client on the server's
    /// origin (`http(s)://HOST:PORT`), the keys its paths.
    fn web(
        address: StoreAddress,
        options: ClientOptions,
        allow_http: bool,
    ) -> Result<Client, ObjectStoreError> {
        let plain = address.scheme == Scheme::Http;
        if plain && !allow_http && !address.is_loopback() {
            return Err(ObjectStoreError::Address {
                url: address.url.clone(),
                why: "plain http:// is read from a loopback host only (its bytes would cross \
                      the network unauthenticated); use https://, or set \
                      object_store_allow_http to accept it"
                    .to_string(),
            });
        }
        let store = HttpBuilder::new()
            .with_url(address.base())
            .with_client_options(options.with_allow_http(plain))
            .with_retry(retry())
            .build()
            .map_err(|e| setup_failed(&address, e))?;
        Ok(Client::limited(address, store, true))
    }

    /// The address the client was made for.
    pub fn address(&self) -> &StoreAddress {
        &self.address
    }

    /// Whether requests go unsigned (no credentials in the environment).
    pub fn anonymous(&self) -> bool {
        self.anonymous
    }

    /// The store, for zarrs' adapter.
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        self.store.clone()
    }

    /// Runs `future` on the client's runtime and waits for it, from any thread of a
    /// multi-threaded runtime or outside one (the chunk service reads on blocking threads,
    /// zarrs on its own).
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        tokio::task::block_in_place(|| self.runtime.block_on(future))
    }

    fn error(&self, what: &'static str, key: &str, err: object_store::Error) -> ObjectStoreError {
        ObjectStoreError::of_store(&self.address.base(), what, &self.address.url_of(key), err)
    }

    /// Lists the address: its one object, or the objects under its prefix, at most `cap`
    /// (then `truncated`); a web server's store, which cannot be listed, as its metadata
    /// documents ([`Client::list_web_store`]). Blocking.
    pub fn list(&self, cap: usize) -> Result<Listing, ObjectStoreError> {
        if self.address.object {
            let key = self.address.prefix.clone();
            let meta = self.head(&ObjectPath::from(key.as_str()))?;
            return Ok(Listing {
                objects: vec![meta],
                truncated: false,
            });
        }
        if self.address.is_web() {
            return self.list_web_store();
        }
        let prefix = self.address.prefix.trim_end_matches('/');
        let prefix = (!prefix.is_empty()).then(|| ObjectPath::from(prefix));
        self.block_on(async {
            let mut stream = self.store.list(prefix.as_ref()).take(cap.saturating_add(1));
            let mut objects = Vec::new();
            while let Some(meta) = stream
                .try_next()
                .await
                .map_err(|e| self.error("list", &self.address.prefix, e))?
            {
                objects.push(meta);
            }
            let truncated = objects.len() > cap;
            objects.truncate(cap);
            Ok(Listing { objects, truncated })
        })
    }

    /// A web server's Zarr store as a listing of what names its sources: the root's
    /// metadata documents (`.zarray`, `.zgroup`, `.zattrs`, `zarr.json`) and, for an
    /// OME-Zarr image, its datasets' (`.zarray` or `zarr.json`), each looked at with a
    /// HEAD (ETag, Last-Modified, size: the versions). A store with none of them is
    /// missing. Blocking.
    fn list_web_store(&self) -> Result<Listing, ObjectStoreError> {
        let root = self.address.prefix.trim_end_matches('/');
        let mut objects = self.heads(root, &[".zarray", ".zgroup", ".zattrs", "zarr.json"])?;
        if objects.is_empty() {
            return Err(ObjectStoreError::Missing {
                url: self.address.url.clone(),
                answer: "none of .zarray, .zgroup, .zattrs or zarr.json is there (not a Zarr \
                         store, or not on this server)"
                    .to_string(),
            });
        }
        let name = |m: &ObjectMeta| m.location.filename().unwrap_or("").to_string();
        let names: Vec<String> = objects.iter().map(name).collect();
        let has = |n: &str| names.iter().any(|m| m == n);
        let group = if has(".zarray") {
            None
        } else if has(".zattrs") {
            Some((true, ".zattrs"))
        } else if has("zarr.json") {
            Some((false, "zarr.json"))
        } else {
            None
        };
        if let Some((v2, document)) = group {
            let doc = self.get(&ObjectPath::from(format!("{root}/{document}")))?;
            let doc: serde_json::Value =
                serde_json::from_slice(&doc).map_err(|e| ObjectStoreError::Refused {
                    url: self.address.url_of(&format!("{root}/{document}")),
                    why: format!("its JSON does not parse: {e}"),
                })?;
            let datasets = crate::source::zarr::image_of_group(v2, &doc)
                .and_then(|meta| meta.multiscales.get("datasets").cloned())
                .and_then(|d| d.as_array().cloned())
                .unwrap_or_default();
            let metadata = if v2 { ".zarray" } else { "zarr.json" };
            for dataset in datasets {
                let Some(path) = dataset.get("path").and_then(serde_json::Value::as_str) else {
                    continue;
                };
                // A path that leaves the store is no dataset of it (the image refuses it).
                if path
                    .split('/')
                    .any(|s| s.is_empty() || s == "." || s == "..")
                {
                    continue;
                }
                objects.extend(self.heads(&format!("{root}/{path}"), &[metadata])?);
            }
        }
        Ok(Listing {
            objects,
            truncated: false,
        })
    }

    /// The documents `names` under `dir` that the store has, looked at at once. Blocking.
    fn heads(&self, dir: &str, names: &[&str]) -> Result<Vec<ObjectMeta>, ObjectStoreError> {
        let look = |name: &&str| {
            let path = ObjectPath::from(format!("{dir}/{name}"));
            async move {
                match self.store.head(&path).await {
                    Ok(meta) => Ok(Some(meta)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(err) => Err(self.error("look at", path.as_ref(), err)),
                }
            }
        };
        let found: Vec<Option<ObjectMeta>> = self.block_on(
            futures::stream::iter(names.iter().map(look))
                .buffered(MAX_REQUESTS)
                .try_collect(),
        )?;
        Ok(found.into_iter().flatten().collect())
    }

    /// What the store says the object at `path` is now. Blocking.
    pub fn head(&self, path: &ObjectPath) -> Result<ObjectMeta, ObjectStoreError> {
        self.block_on(self.store.head(path))
            .map_err(|e| self.error("look at", path.as_ref(), e))
    }

    /// The whole object at `path` (a metadata document). Blocking.
    pub fn get(&self, path: &ObjectPath) -> Result<Bytes, ObjectStoreError> {
        self.block_on(async { self.store.get(path).await?.bytes().await })
            .map_err(|e| self.error("read", path.as_ref(), e))
    }

    /// The whole objects at `paths`, fetched at once (the client bounds how many are in
    /// flight), in order; `None` for an object the store does not have (a Zarr chunk never
    /// written: its fill value). Blocking.
    pub fn get_all(&self, paths: &[ObjectPath]) -> Result<Vec<Option<Bytes>>, ObjectStoreError> {
        let fetch = |path: &ObjectPath| {
            let path = path.clone();
            async move {
                let got = match self.store.get(&path).await {
                    Ok(got) => got.bytes().await,
                    Err(err) => Err(err),
                };
                match got {
                    Ok(bytes) => Ok(Some(bytes)),
                    Err(object_store::Error::NotFound { .. }) => Ok(None),
                    Err(err) => Err(self.error("read", path.as_ref(), err)),
                }
            }
        };
        self.block_on(
            futures::stream::iter(paths.iter().map(fetch))
                .buffered(MAX_REQUESTS)
                .try_collect(),
        )
    }

    /// The bytes `ranges` of the object at `path`, each checked to be exactly as long as
    /// asked, and only while its ETag is still `e_tag` (a replaced object is refused as
    /// changed, never read mixed). The ranges are fetched at once (the client bounds how
    /// many). Blocking.
    pub fn get_ranges(
        &self,
        path: &ObjectPath,
        ranges: &[Range<u64>],
        e_tag: Option<&str>,
    ) -> Result<Vec<Bytes>, ObjectStoreError> {
        let fetch = |range: Range<u64>| {
            let options = GetOptions {
                range: Some(GetRange::Bounded(range.clone())),
                if_match: e_tag.map(str::to_string),
                ..GetOptions::default()
            };
            async move {
                let got = self.store.get_opts(path, options).await;
                let bytes = match got {
                    Ok(got) => got.bytes().await,
                    Err(err) => Err(err),
                }
                .map_err(|e| self.error("read", path.as_ref(), e))?;
                let want = range.end - range.start;
                if bytes.len() as u64 != want {
                    return Err(ObjectStoreError::Refused {
                        url: self.address.url_of(path.as_ref()),
                        why: format!(
                            "the store answered {} bytes for bytes {}..{} ({want} asked)",
                            bytes.len(),
                            range.start,
                            range.end
                        ),
                    });
                }
                Ok(bytes)
            }
        };
        self.block_on(
            futures::stream::iter(ranges.iter().cloned().map(fetch))
                .buffered(MAX_REQUESTS)
                .try_collect(),
        )
    }
}
