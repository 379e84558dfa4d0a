//! `add_source` of an object-store address (`s3://BUCKET/PREFIX/`, `gs://…`, `az://…`;
//! `…/KEY.npy`, `…/STORE.zarr`): allowed only under a prefix of `add_source_store_roots`
//! of the same cloud, then listed
//! and served as a configured address is, once per call (an address added again is listed
//! again: changed objects reopened, gone ones removed). Not followed by rescans.

use crate::objstore::Bucket;
use crate::objstore::address::StoreAddress;
use crate::source::runtime::{RuntimeError, RuntimeRoots};

/// Refuses an `add_source_store_roots` entry that is not a cloud's prefix (`s3://`,
/// `gs://`, `az://`).
pub fn check_root(root: &str) -> Result<StoreAddress, String> {
    let address = StoreAddress::parse(root).map_err(|e| format!("'{root}': {e}"))?;
    if !address.scheme.is_listed() || address.object {
        return Err(format!(
            "'{root}' must be an s3://, gs:// or az:// prefix (s3://BUCKET/ or \
             s3://BUCKET/PREFIX/)"
        ));
    }
    Ok(address)
}

/// The bucket of `url` when it lies under one of `config`'s object-store prefixes.
/// Must be called on the runtime that will run its requests.
pub fn plan_add(config: &RuntimeRoots, url: &str) -> Result<Bucket, RuntimeError> {
    if config.object_stores.is_empty() {
        if config.roots.is_empty() {
            return Err(RuntimeError::Disabled);
        }
        return Err(RuntimeError::ObjectStore {
            url: url.to_string(),
            why: "no object-store prefix is allowed (start the server with \
                  --add-source-store-root s3://BUCKET/PREFIX/)"
                .to_string(),
        });
    }
    let refused = |why: String| RuntimeError::ObjectStore {
        url: url.to_string(),
        why,
    };
    let address = StoreAddress::parse(url).map_err(|e| refused(e.to_string()))?;
    let under = config
        .object_stores
        .iter()
        .filter_map(|root| check_root(root).ok())
        .any(|root| {
            address.scheme == root.scheme
                && root.bucket == address.bucket
                && address.prefix.starts_with(&root.prefix)
        });
    if !under {
        return Err(refused(
            "it is under no prefix of add_source_store_roots (--add-source-store-root)".to_string(),
        ));
    }
    Bucket::new(url, config.max_objects, false).map_err(|e| refused(e.to_string()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn roots_are_cloud_prefixes() {
        assert!(check_root("s3://lab/exp/").is_ok());
        assert!(check_root("s3://lab").is_ok());
        assert!(check_root("gs://lab/exp/").is_ok());
        assert!(check_root("azure://lab/exp/").is_ok());
        assert!(check_root("s3://lab/a.npy").is_err());
        assert!(check_root("az://lab/a.npy").is_err());
        assert!(check_root("https://h/x.zarr").is_err());
    }
}
