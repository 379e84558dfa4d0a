//! The address of an object-store source as an operator writes it where a path would go:
//! `s3://BUCKET/PREFIX/`, `gs://BUCKET/PREFIX/` or `az://CONTAINER/PREFIX/` (every `.npy`
//! object and Zarr array under the prefix), `…/KEY.npy` (one object) or `…/STORE.zarr` (one
//! store); and, on a plain web server, `https://HOST/PATH/STORE.zarr` or
//! `https://HOST/PATH/KEY.npy` (one store or one object only: a web server cannot be listed).
//!
//! Azure's other spellings that name a container the same way (`azure://`, and fsspec's
//! `abfs://`, `abfss://`) are read as `az://`; `gcs://` is recognised and refused by name
//! (object_store, like `gsutil`, writes `gs://`).

use std::ops::RangeInclusive;

use crate::objstore::error::ObjectStoreError;

/// The schemes served, each with how it is spoken to.
const SCHEMES: [(&str, Scheme); 8] = [
    ("s3://", Scheme::S3),
    ("gs://", Scheme::Gcs),
    ("az://", Scheme::Azure),
    ("azure://", Scheme::Azure),
    ("abfs://", Scheme::Azure),
    ("abfss://", Scheme::Azure),
    ("https://", Scheme::Https),
    ("http://", Scheme::Http),
];

/// Schemes recognised and refused, so they are not taken for local paths.
const RECOGNISED: [&str; 1] = ["gcs://"];

/// Whether `text` is written as an object-store address rather than a path.
pub fn is_object_store(text: &str) -> bool {
    SCHEMES.iter().any(|(s, _)| text.starts_with(s))
        || RECOGNISED.iter().any(|s| text.starts_with(s))
}

/// How a store is spoken to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// S3 or an S3-compatible store: listed, signed when credentials are given.
    S3,
    /// Google Cloud Storage (or an emulator a service-account file points at): listed,
    /// signed when credentials are given.
    Gcs,
    /// Azure Blob Storage (or Azurite): a container listed, signed when credentials are
    /// given.
    Azure,
    /// A web server over TLS: one store or object, read anonymously, never listed.
    Https,
    /// A web server over plain HTTP: as [`Scheme::Https`], to a loopback host unless
    /// `object_store_allow_http` is set.
    Http,
}

impl Scheme {
    /// `s3`, `gs`, `az`, `https` or `http`: how the catalog and `source_url` name the
    /// store, whichever spelling the address used.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::S3 => "s3",
            Scheme::Gcs => "gs",
            Scheme::Azure => "az",
            Scheme::Https => "https",
            Scheme::Http => "http",
        }
    }

    /// Whether the store is a cloud's, listed under a prefix (not a web server's).
    pub fn is_listed(self) -> bool {
        matches!(self, Scheme::S3 | Scheme::Gcs | Scheme::Azure)
    }

    /// The cloud's rule for a bucket's (container's) name: its lengths, the bytes it may
    /// hold beside lowercase letters and digits, and the rule in words. `None` for a web
    /// server (a host and port).
    fn bucket_rule(self) -> Option<(RangeInclusive<usize>, &'static [u8], &'static str)> {
        match self {
            Scheme::S3 => Some((
                3..=63,
                b"-.",
                "its bucket name must be 3 to 63 lowercase letters, digits, '-' or '.'",
            )),
            Scheme::Gcs => Some((
                3..=222,
                b"-_.",
                "its bucket name must be 3 to 222 lowercase letters, digits, '-', '_' or '.'",
            )),
            Scheme::Azure => Some((
                3..=63,
                b"-",
                "its container name must be 3 to 63 lowercase letters, digits or '-'",
            )),
            Scheme::Https | Scheme::Http => None,
        }
    }
}

/// A parsed object-store address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreAddress {
    /// The address as written (trailing `/` kept), as logs and refusals name it.
    pub url: String,
    /// How the store is spoken to.
    pub scheme: Scheme,
    /// The bucket (an Azure container); a web server's host and port.
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
        let Some((rest, scheme)) = SCHEMES
            .iter()
            .find_map(|(prefix, scheme)| Some((text.strip_prefix(prefix)?, *scheme)))
        else {
            return Err(bad(
                "this build reads s3:// (and S3-compatible), gs://, az:// and http(s):// \
                 stores; write a Google Cloud Storage bucket as gs://BUCKET/ \
                 (docs/guides/object-stores.md)",
            ));
        };
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if let Some((lengths, allowed, rule)) = scheme.bucket_rule() {
            let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || allowed.contains(&b);
            if !lengths.contains(&bucket.len()) || !bucket.bytes().all(ok) {
                return Err(bad(rule));
            }
        } else if bucket.is_empty() || bucket.contains('@') {
            return Err(bad(
                "it must name a host (and port), without user or password",
            ));
        } else if text.contains(['?', '#']) {
            return Err(bad("it must not carry a query or a fragment"));
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
        if !scheme.is_listed() && !object && !trimmed.to_ascii_lowercase().ends_with(".zarr") {
            return Err(bad(
                "a web server cannot be listed, so an http(s):// address must name one Zarr \
                 store (ending in '.zarr') or one '.npy' object, not a folder",
            ));
        }
        let prefix = if object || trimmed.is_empty() {
            trimmed.to_string()
        } else {
            format!("{trimmed}/")
        };
        Ok(StoreAddress {
            url: text.to_string(),
            scheme,
            bucket: bucket.to_string(),
            prefix,
            object,
        })
    }

    /// `s3://BUCKET`, `gs://BUCKET`, `az://CONTAINER` (`https://HOST:PORT`), as the catalog
    /// tree and `source_url` name the store.
    pub fn base(&self) -> String {
        format!("{}://{}", self.scheme.name(), self.bucket)
    }

    /// Whether the address is a web server's (read without listing).
    pub fn is_web(&self) -> bool {
        !self.scheme.is_listed()
    }

    /// Whether the host is this machine's loopback (`localhost`, `127.0.0.0/8`, `[::1]`),
    /// where plain HTTP crosses no network.
    pub fn is_loopback(&self) -> bool {
        let host = match self.bucket.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(v6),
            None => self.bucket.split(':').next().unwrap_or(&self.bucket),
        };
        host.eq_ignore_ascii_case("localhost")
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
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
            "gcs://lab/x",
            "gs://ab/x",
            "gs://Lab/x",
            "az://ab/x",
            "az://lab.data/x",
            "az://lab_data/x",
            "abfs://fs@acct.dfs.core.windows.net/x",
            "https://h/data/",
            "https://h/data/x.tif",
            "https://user:pw@h/x.zarr",
            "https:///x.zarr",
            "https://h/x.zarr?sig=1",
        ] {
            assert!(StoreAddress::parse(bad).is_err(), "{bad}");
        }
        let refused = StoreAddress::parse("gcs://lab/x").unwrap_err().to_string();
        assert!(
            refused.contains("gcs://lab/x") && refused.contains("gs://BUCKET/"),
            "{refused}"
        );

        let gs = StoreAddress::parse("gs://lab_data.eu/plates/").unwrap();
        assert_eq!(
            (gs.scheme, gs.bucket.as_str()),
            (Scheme::Gcs, "lab_data.eu")
        );
        assert_eq!(gs.url_of("plates/a.npy"), "gs://lab_data.eu/plates/a.npy");
        assert!(!gs.is_web());
        for spelling in ["az", "azure", "abfs", "abfss"] {
            let az = StoreAddress::parse(&format!("{spelling}://imaging/exp")).unwrap();
            assert_eq!((az.scheme, az.prefix.as_str()), (Scheme::Azure, "exp/"));
            assert_eq!(az.base(), "az://imaging", "{spelling}");
        }
        assert!(StoreAddress::parse("az://imaging/x/a.npy").unwrap().object);
        let folder = StoreAddress::parse("http://127.0.0.1:8/d/").unwrap_err();
        assert!(folder.to_string().contains("cannot be listed"), "{folder}");

        let web = StoreAddress::parse("http://127.0.0.1:8080/data/img.zarr").unwrap();
        assert_eq!(
            (web.scheme, web.bucket.as_str()),
            (Scheme::Http, "127.0.0.1:8080")
        );
        assert_eq!(web.prefix, "data/img.zarr/");
        assert_eq!(web.base(), "http://127.0.0.1:8080");
        assert!(web.is_web() && web.is_loopback());
        let npy = StoreAddress::parse("https://example.org/a/b.npy").unwrap();
        assert!(npy.object && !npy.is_loopback());
        assert!(
            StoreAddress::parse("http://[::1]:9/x.zarr")
                .unwrap()
                .is_loopback()
        );
        assert!(
            StoreAddress::parse("http://localhost/x.zarr")
                .unwrap()
                .is_loopback()
        );
        assert!(
            !StoreAddress::parse("http://127.example.org/x.zarr")
                .unwrap()
                .is_loopback()
        );
        assert!(is_object_store("gs://b/x") && is_object_store("s3://b"));
        assert!(is_object_store("gcs://b/x") && is_object_store("abfss://c/x"));
        assert!(!is_object_store("/data/s3://x") && !is_object_store("grpc://h:1"));
    }
}
