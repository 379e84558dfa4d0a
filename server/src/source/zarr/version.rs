//! A Zarr store's content version: what every file of its tree is now.
//!
//! A store is a directory of files (metadata documents and one file per chunk or shard), so
//! no single `stat` says whether its bytes changed. Opening a store takes a snapshot of its
//! tree: each file's path relative to the store, inode, size and mtime. The store's version
//! ([`FileVersion`], as for a file) is the store directory's device and inode, the total
//! size of its files, and in place of an mtime a 64-bit digest of the snapshot. A chunk file
//! rewritten in place (new mtime or size), replaced (new inode), added or removed, or a
//! metadata document changed, gives another digest, so another version and new chunk ids.
//!
//! A read checks afterwards the files it touched against the snapshot (one `stat` each):
//! bytes of a file that changed under the read are never returned.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::error::ZarrError;
use crate::content_version::FileVersion;

/// What one file of a store was when the snapshot was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Stamp {
    ino: u64,
    size: u64,
    mtime_ns: i64,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Stamp {
        let file = FileVersion::of(meta);
        Stamp {
            ino: file.ino,
            size: file.size,
            mtime_ns: file.mtime_ns,
        }
    }
}

/// Every file of a store's tree as it was at open, and the version that makes.
#[derive(Debug)]
pub struct Snapshot {
    root: PathBuf,
    files: HashMap<String, Stamp>,
    version: FileVersion,
    /// Set once a check found a file changed: the store is then not its version any more,
    /// and the registry reopens it on the next request.
    changed: AtomicBool,
}

impl Snapshot {
    /// Walks the tree under `root`.
    pub fn take(root: &Path) -> Result<Snapshot, ZarrError> {
        let io = |path: &Path, what, source| ZarrError::Io {
            path: path.to_path_buf(),
            what,
            source,
        };
        let top = std::fs::metadata(root).map_err(|e| io(root, "stat", e))?;
        let mut files = HashMap::new();
        let mut pending = vec![root.to_path_buf()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).map_err(|e| io(&dir, "list", e))? {
                let entry = entry.map_err(|e| io(&dir, "list", e))?;
                let path = entry.path();
                let meta = std::fs::metadata(&path).map_err(|e| io(&path, "stat", e))?;
                if meta.is_dir() {
                    pending.push(path);
                } else if let Ok(rel) = path.strip_prefix(root) {
                    files.insert(rel.to_string_lossy().into_owned(), Stamp::of(&meta));
                }
            }
        }
        let version = version_of(&top, &files);
        Ok(Snapshot {
            root: root.to_path_buf(),
            files,
            version,
            changed: AtomicBool::new(false),
        })
    }

    /// The path of the file at `key` (relative to the store).
    pub fn path_of(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    /// The store's version at the snapshot.
    pub fn version(&self) -> FileVersion {
        self.version
    }

    /// Whether a check has found a file of the store changed since the snapshot.
    pub fn found_changed(&self) -> bool {
        self.changed.load(Ordering::Relaxed)
    }

    /// Refuses with [`ZarrError::Changed`] when a file at one of `keys` (relative to the
    /// store) is not what it was at the snapshot: changed, replaced, added or removed.
    pub fn check<'a>(&self, keys: impl IntoIterator<Item = &'a str>) -> Result<(), ZarrError> {
        for key in keys {
            let now = std::fs::metadata(self.root.join(key))
                .ok()
                .filter(|m| m.is_file())
                .map(|m| Stamp::of(&m));
            if now.as_ref() != self.files.get(key) {
                self.changed.store(true, Ordering::Relaxed);
                return Err(ZarrError::Changed {
                    path: self.root.clone(),
                    file: key.to_string(),
                });
            }
        }
        Ok(())
    }
}

/// The version of a tree: the root's device and inode, the files' total size, and a
/// digest of every file's path and stamp (in sorted order, so the listing order is moot).
fn version_of(top: &std::fs::Metadata, files: &HashMap<String, Stamp>) -> FileVersion {
    let mut sorted: Vec<(&String, &Stamp)> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let mut hasher = Fnv64::default();
    for (path, stamp) in &sorted {
        path.hash(&mut hasher);
        stamp.hash(&mut hasher);
    }
    FileVersion {
        dev: top.dev(),
        ino: top.ino(),
        size: files.values().map(|s| s.size).fold(0, u64::saturating_add),
        mtime_ns: hasher.finish() as i64,
    }
}

/// The version of the store at `path` now (the registry and the watcher compare it).
pub fn tree_version(path: &Path) -> Option<FileVersion> {
    Snapshot::take(path).ok().map(|s| s.version)
}

/// FNV-1a, 64 bits: a digest that is the same in every process and every release (the
/// standard library's hasher is not promised to be), as chunk ids need.
struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Fnv64(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv64 {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_rewritten_added_or_removed_file_changes_the_version_and_fails_the_check() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".zarray"), b"{}").unwrap();
        std::fs::write(dir.path().join("0.0"), b"abcd").unwrap();
        let first = Snapshot::take(dir.path()).unwrap();
        assert_eq!(
            first.version(),
            Snapshot::take(dir.path()).unwrap().version()
        );
        first.check(["0.0", "1.0"]).unwrap();

        std::fs::write(dir.path().join("0.0"), b"abce").unwrap();
        let mtime = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(7);
        std::fs::File::options()
            .write(true)
            .open(dir.path().join("0.0"))
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        assert!(matches!(
            first.check(["0.0"]),
            Err(ZarrError::Changed { .. })
        ));
        let second = Snapshot::take(dir.path()).unwrap();
        assert_ne!(first.version(), second.version());

        std::fs::write(dir.path().join("1.0"), b"new").unwrap();
        assert!(second.check(["1.0"]).is_err());
        assert_ne!(
            second.version(),
            Snapshot::take(dir.path()).unwrap().version()
        );
    }
}
