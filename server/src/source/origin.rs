//! Where a source came from, and the `source_url` and catalog tree place that follow.
//!
//! A configured source's url is the `file://` url of its path. A source added at runtime
//! (`add_source`) carries the `dnd://` origin: `dnd://LABEL/REL`, where LABEL names the
//! path that was added (its base name, made unique among the runtime roots) and REL is the
//! file's path under it. `remove_source` removes only sources with this origin.

use std::path::{Path, PathBuf};

/// The url scheme of sources added at runtime.
pub const DND_PREFIX: &str = "dnd://";

/// How a source came to be served.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Origin {
    /// A configured path (command line, `sources`, `[[source]]`).
    #[default]
    Configured,
    /// Added at runtime by `add_source` under the runtime root `root`, labelled `label`.
    Dropped {
        /// The runtime root's label: the first segment of the `dnd://` url.
        label: String,
        /// The canonical path that was added.
        root: PathBuf,
    },
    /// A tensor of an upstream tensor server (`upstream/`), its path its url
    /// (`grpc://host:port/ID`).
    Upstream {
        /// The upstream's address, `grpc://host:port`.
        base: String,
    },
    /// An object or Zarr store in an object store (`objstore/`), its path its url
    /// (`s3://BUCKET/KEY`, `gs://BUCKET/KEY`, `az://CONTAINER/KEY`, `https://HOST/PATH`).
    ObjectStore {
        /// The store, `s3://BUCKET` (`gs://BUCKET`, `az://CONTAINER`, `https://HOST`).
        base: String,
    },
}

impl Origin {
    /// The `source_url` of the file at `path` with this origin.
    pub fn url(&self, path: &Path) -> String {
        match self {
            Origin::Configured => file_url(path),
            Origin::Dropped { label, root } => {
                let mut url = format!("{DND_PREFIX}{label}");
                for part in relative_parts(root, path) {
                    url.push('/');
                    url.push_str(&part);
                }
                url
            }
            Origin::Upstream { .. } | Origin::ObjectStore { .. } => {
                path.to_string_lossy().into_owned()
            }
        }
    }

    /// The segments of the file's place in the catalog tree (folders, then its name).
    pub fn tree_parts(&self, path: &Path) -> Vec<String> {
        match self {
            Origin::Configured => path
                .iter()
                .filter(|c| *c != "/")
                .map(|c| c.to_string_lossy().into_owned())
                .collect(),
            Origin::Dropped { label, root } => std::iter::once(label.clone())
                .chain(relative_parts(root, path))
                .collect(),
            Origin::Upstream { base } => {
                let id = path.to_string_lossy();
                let id = id.strip_prefix(base.as_str()).unwrap_or(&id);
                let host = base.split_once("://").map_or(base.as_str(), |(_, h)| h);
                [host, id.trim_start_matches('/')]
                    .map(String::from)
                    .to_vec()
            }
            Origin::ObjectStore { base } => {
                let url = path.to_string_lossy();
                let key = url.strip_prefix(base.as_str()).unwrap_or(&url);
                let bucket = base.split_once("://").map_or(base.as_str(), |(_, b)| b);
                std::iter::once(bucket)
                    .chain(key.split('/').filter(|s| !s.is_empty()))
                    .map(String::from)
                    .collect()
            }
        }
    }

    /// Whether the source was added at runtime.
    pub fn is_dropped(&self) -> bool {
        matches!(self, Origin::Dropped { .. })
    }
}

fn relative_parts(root: &Path, path: &Path) -> Vec<String> {
    path.strip_prefix(root)
        .unwrap_or(Path::new(""))
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect()
}

/// `file://` URL of an absolute path, percent-encoding every byte outside the URL
/// unreserved set and `/` (what Python's `pathlib.Path.as_uri()` produces).
pub fn file_url(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut url = String::from("file://");
    for &byte in path.as_os_str().as_bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/') {
            url.push(char::from(byte));
        } else {
            url.push_str(&format!("%{byte:02X}"));
        }
    }
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_urls_escape_like_pathlib() {
        assert_eq!(file_url(Path::new("/a/b c/d.npy")), "file:///a/b%20c/d.npy");
        assert_eq!(
            file_url(Path::new("/x/it's/%/é.npy")),
            "file:///x/it%27s/%25/%C3%A9.npy"
        );
    }

    #[test]
    fn dropped_sources_sit_under_their_label() {
        let origin = Origin::Dropped {
            label: "exp".into(),
            root: "/r/exp".into(),
        };
        assert_eq!(
            origin.url(Path::new("/r/exp/sub/a.npy")),
            "dnd://exp/sub/a.npy"
        );
        assert_eq!(
            origin.tree_parts(Path::new("/r/exp/a.npy")),
            ["exp", "a.npy"]
        );
        let file = Origin::Dropped {
            label: "one.npy".into(),
            root: "/r/one.npy".into(),
        };
        assert_eq!(file.url(Path::new("/r/one.npy")), "dnd://one.npy");
        assert_eq!(
            Origin::Configured.tree_parts(Path::new("/d/l/a.npy")),
            ["d", "l", "a.npy"]
        );
    }
}
