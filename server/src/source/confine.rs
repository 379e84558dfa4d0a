//! Where a source's file may really be.
//!
//! A path that was under a root when it was found can lead elsewhere later: a symbolic link
//! retargeted, a directory replaced by a link. So the check is made on every open, on the
//! opened descriptor itself: the kernel's name for it (`/proc/self/fd/N`, every link
//! resolved) must lie under one of the allowed directories. The bytes read are those of that
//! descriptor, so nothing swapped between the check and the read can slip through.
//!
//! Runtime sources are confined to `add_source_roots`; configured sources to the folder that
//! was configured (the parent folder of a configured file), unless `follow_links_outside`.
//! Refusals say only that the file resolves outside; they never name where it resolves.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Directories a source's file must really lie under, and what they are called in refusals.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Confine {
    /// Canonical directories.
    roots: Vec<PathBuf>,
    /// What the directories are, for refusals (`add_source_roots`).
    what: &'static str,
}

impl Confine {
    /// Confined to `add_source_roots` (already canonical).
    pub fn add_source_roots(roots: Vec<PathBuf>) -> Confine {
        Confine {
            roots,
            what: "add_source_roots",
        }
    }

    /// Confined to the configured folder `path` (a directory, or the folder of a file),
    /// resolved now; `None` when it cannot be resolved.
    pub fn served_folder(path: &Path) -> Option<Confine> {
        let canonical = std::fs::canonicalize(path).ok()?;
        let folder = if canonical.is_dir() {
            canonical
        } else {
            canonical.parent()?.to_path_buf()
        };
        Some(Confine {
            roots: vec![folder],
            what: "the served folder (follow_links_outside = false)",
        })
    }

    /// Whether the resolved `path` lies under one of the directories.
    pub fn holds(&self, path: &Path) -> bool {
        self.roots.iter().any(|root| path.starts_with(root))
    }

    /// Refuses `file` unless the kernel places it under one of the directories; the reason
    /// names the directories' kind, never where the file resolves.
    pub fn check(&self, file: &File) -> Result<(), String> {
        match resolved(file) {
            Ok(real) if self.holds(&real) => Ok(()),
            Ok(_) => Err(format!("resolves outside {}: not served", self.what)),
            Err(err) => Err(format!(
                "where it resolves cannot be told ({err}), so it is not served from {}",
                self.what
            )),
        }
    }
}

/// The path the kernel holds for an open descriptor, every link resolved.
pub fn resolved(file: &File) -> std::io::Result<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_descriptor_is_judged_where_it_really_is() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"x").unwrap();
        std::fs::write(root.path().join("own"), b"y").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), root.path().join("link"))
            .unwrap();
        let confine = Confine::served_folder(root.path()).unwrap();
        let own = File::open(root.path().join("own")).unwrap();
        assert!(confine.check(&own).is_ok());
        let link = File::open(root.path().join("link")).unwrap();
        let reason = confine.check(&link).unwrap_err();
        assert!(
            reason.contains("resolves outside the served folder"),
            "{reason}"
        );
        assert!(
            !reason.contains(&*outside.path().to_string_lossy()),
            "{reason}"
        );
    }
}
