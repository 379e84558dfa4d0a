//! The address of an object-store source as an operator writes it where a path would go:
//! `s3://BUCKET/PREFIX/` (every `.npy` object and Zarr array under the prefix),
//! `s3://BUCKET/KEY.npy` (one object) or `s3://BUCKET/STORE.zarr` (one store).
//!
//! `gs://`, `az://` and `https://` are recognised, so they are refused by name rather than
//! taken for local paths: this build reads S3 and S3-compatible stores only.

use crate::objstore::error::ObjectStoreError;

/// The schemes served, then those recognised and refused.
const SERVED: &str = "s3://";
const RECOGNISED: [&str; 6] = [
    "gs://", "gcs://", "az://", "azure://", "https://", "http://",
];

/// Whether `text` is written as an object-store address rather than a path.
pub fn is_object_store(text: &str) -> bool {
    text.starts_with(SERVED) || RECOGNISED.iter().any(|s| text.starts_with(s))
}

/// A parsed object-store address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreAddress {
    /// The address as written (trailing `/` kept), as logs and refusals name it.
    pub url: String,
    /// The bucket.
    pub bucket: String,
    /// The key prefix listed: empty (the whole bucket) or ending in `/`; or, when
    /// [`StoreAddress::object`] is set, that object's key.
    pub prefix: String,
    /// The one `.npy` object the address names, if it names one.
    pub object: bool,
}

impl StoreAddress {
    /// Parses `text`; refuses a scheme this build does not read, an empty or invalid bucket
    /// name, and keys with empty, `.` or `..` segments.
    pub fn parse(text: &str) -> Result<StoreAddress, ObjectStoreError> {
        let bad = |why: &str| ObjectStoreError::Address {
            url: text.to_string(),
            why: why.to_string(),
        };
        let Some(rest) = text.strip_prefix(SERVED) else {
            return Err(bad(
                "this build reads s3:// (and S3-compatible) stores only; gs://, az:// and \
                 https:// are not served yet (docs/guides/object-stores.md)",
            ));
        };
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
        if !bucket_ok {
            return Err(bad(
                "its bucket name must be 3 to 63 lowercase letters, digits, '-' or '.'",
            ));
        }
        let trimmed = key.trim_end_matches('/');
        if !trimmed.is_empty()
            && trimmed
                .split('/')
                .any(|s| s.is_empty() || s == "." || s == "..")
        {
            return Err(bad("its key has an empty, '.' or '..' segment"));
        }
        let object = !key.ends_with('/') && trimmed.to_ascii_lowercase().ends_with(".npy");
        let prefix = if object || trimmed.is_empty() {
            trimmed.to_string()
        } else {
            format!("{trimmed}/")
        };
        Ok(StoreAddress {
            url: text.to_string(),
            bucket: bucket.to_string(),
            prefix,
            object,
        })
    }

    /// `s3://BUCKET`, as the catalog tree and `source_url` name the store.
    pub fn base(&self) -> String {
        format!("{SERVED}{}", self.bucket)
    }

    /// The `source_url` (and registry path) of the object or store at `key`.
    pub fn url_of(&self, key: &str) -> String {
        format!("{}/{key}", self.base())
    }

    /// The part of `key` below the listed prefix (the whole key when the address names one
    /// object or the prefix is empty).
    pub fn relative<'a>(&self, key: &'a str) -> &'a str {
        if self.object {
            return key.rsplit('/').next().unwrap_or(key);
        }
        key.strip_prefix(self.prefix.as_str()).unwrap_or(key)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn prefixes_objects_and_refusals() {
        let all = StoreAddress::parse("s3://lab-data/plates/2026").unwrap();
        assert_eq!(all.bucket, "lab-data");
        assert_eq!(all.prefix, "plates/2026/");
        assert!(!all.object);
        assert_eq!(all.base(), "s3://lab-data");
        assert_eq!(
            all.url_of("plates/2026/a.npy"),
            "s3://lab-data/plates/2026/a.npy"
        );
        assert_eq!(all.relative("plates/2026/x/a.npy"), "x/a.npy");

        let bucket = StoreAddress::parse("s3://lab-data/").unwrap();
        assert_eq!(bucket.prefix, "");
        assert_eq!(
            StoreAddress::parse("s3://lab-data").unwrap().prefix,
            bucket.prefix
        );

        let one = StoreAddress::parse("s3://lab-data/x/cells.NPY").unwrap();
        assert!(one.object);
        assert_eq!(one.prefix, "x/cells.NPY");
        assert_eq!(one.relative("x/cells.NPY"), "cells.NPY");

        let store = StoreAddress::parse("s3://lab-data/img.zarr").unwrap();
        assert_eq!(store.prefix, "img.zarr/");

        for bad in [
            "s3://",
            "s3://ab/x",
            "s3://Lab/x",
            "s3://lab/a//b",
            "s3://lab/../b",
            "gs://lab/x",
            "https://h/x.zarr",
        ] {
            assert!(StoreAddress::parse(bad).is_err(), "{bad}");
        }
        let refused = StoreAddress::parse("az://c/x").unwrap_err().to_string();
        assert!(
            refused.contains("az://c/x") && refused.contains("s3://"),
            "{refused}"
        );
        assert!(is_object_store("gs://b/x") && is_object_store("s3://b"));
        assert!(!is_object_store("/data/s3://x") && !is_object_store("grpc://h:1"));
    }
}
