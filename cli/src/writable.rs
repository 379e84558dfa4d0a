//! Whether this user can write a directory the server would create or use
//! (`tessera config check`): the directory itself when it exists, else the nearest folder
//! above it that does, where the server would create it. Asked of the file system by
//! creating (and removing) a probe, so permissions, read-only mounts and sandboxes all
//! answer as they would for the server.

use std::path::Path;

/// `Ok` when `dir` can be written (or created) by this process; else the OS's reason.
pub fn check(dir: &Path) -> Result<(), std::io::Error> {
    let mut existing = dir;
    while !existing.exists() {
        match existing.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => existing = parent,
            _ => {
                existing = Path::new(".");
                break;
            }
        }
    }
    let probe = existing.join(format!(".tessera-config-check-{}", std::process::id()));
    std::fs::create_dir(&probe)?;
    std::fs::remove_dir(&probe)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_existing_writable_folder_and_one_to_create_under_it_pass() {
        let dir = tempfile::tempdir().unwrap();
        check(dir.path()).unwrap();
        check(&dir.path().join("a/b/c")).unwrap();
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "the probe is removed"
        );
    }

    #[test]
    fn a_file_in_the_way_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"").unwrap();
        assert!(check(&file.join("state")).is_err());
    }
}
