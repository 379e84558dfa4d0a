//! The state directory: what users write to the server (uploads, annotations). Unlike the
//! chunk cache it is never evicted and never rebuilt from sources, so it is opened with
//! care: created mode 0700, on a local filesystem, held by one server at a time through
//! the `DIR/lock` file the cache directory uses too.
//!
//! ```text
//! DIR/lock          flock + holder pid and listen address
//! DIR/<part>/       one subdirectory per kind of user data (see `part`)
//! ```

pub mod reopening_db;

use std::fs::{DirBuilder, Permissions};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tessera_segments::fsgate::{self, FsClass};
use tessera_segments::{DirLock, StoreError};

/// Why the state directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StateDirError {
    /// Another process holds the directory.
    #[error(
        "state directory {} is in use by another process{holder}; give this server one of its \
         own with --state-dir DIR (or TESSERA_STATE_DIR), or stop the other one",
        dir.display()
    )]
    Locked {
        /// The directory.
        dir: PathBuf,
        /// ` (pid N, listening on …)`, as far as the lock file tells.
        holder: String,
    },
    /// The lock file could not be taken or written.
    #[error("state directory {}: {source}", dir.display())]
    Lock {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: StoreError,
    },
    /// A filesystem call failed.
    #[error("state directory {}: cannot {action}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The directory is on a network filesystem, where locks and fsync cannot be trusted.
    #[error(
        "state directory {} is on a network filesystem ({kind}): uploads and annotations need a \
         local one for locks and fsync; choose another with --state-dir DIR",
        dir.display()
    )]
    NetworkFs {
        /// The directory.
        dir: PathBuf,
        /// What the filesystem was classified as.
        kind: String,
    },
}

/// An open, locked state directory. The lock is released when this is dropped.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    lock: DirLock,
}

impl StateDir {
    /// Creates (mode 0700) and locks `path`. A directory another process holds is refused
    /// with [`StateDirError::Locked`], naming the holder.
    pub fn open(path: &Path) -> Result<StateDir, StateDirError> {
        create_private(path)?;
        let class = fsgate::classify_dir(path).map_err(|source| StateDirError::Io {
            action: "statfs",
            path: path.to_path_buf(),
            source,
        })?;
        if let FsClass::Network(kind) = class {
            return Err(StateDirError::NetworkFs {
                dir: path.to_path_buf(),
                kind,
            });
        }
        let lock = DirLock::acquire(path).map_err(|source| match source {
            StoreError::Locked {
                dir,
                holder_pid,
                holder_note,
            } => StateDirError::Locked {
                dir,
                holder: match (holder_pid, holder_note) {
                    (Some(pid), Some(note)) => format!(" (pid {pid}, {note})"),
                    (Some(pid), None) => format!(" (pid {pid})"),
                    (None, Some(note)) => format!(" ({note})"),
                    (None, None) => String::new(),
                },
            },
            source => StateDirError::Lock {
                dir: path.to_path_buf(),
                source,
            },
        })?;
        Ok(StateDir {
            path: path.to_path_buf(),
            lock,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `DIR/name`, created mode 0700 if missing: the home of one kind of user data.
    pub fn part(&self, name: &str) -> Result<PathBuf, StateDirError> {
        let dir = self.path.join(name);
        create_private(&dir)?;
        Ok(dir)
    }

    /// Notes where this server can be found in the lock file, for a server it refuses.
    pub fn note_holder(&self, note: &str) -> Result<(), StateDirError> {
        self.lock.note(note).map_err(|source| StateDirError::Lock {
            dir: self.path.clone(),
            source,
        })
    }
}

/// Creates `dir` and its missing parents; `dir` itself ends up mode 0700 (users' data).
fn create_private(dir: &Path) -> Result<(), StateDirError> {
    let io = |action, source| StateDirError::Io {
        action,
        path: dir.to_path_buf(),
        source,
    };
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| io("create", e))?;
    let mode = std::fs::metadata(dir)
        .map_err(|e| io("stat", e))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, Permissions::from_mode(0o700)).map_err(|e| io("chmod", e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_open_is_refused_naming_the_flag() -> Result<(), StateDirError> {
        let tmp = tempfile::tempdir().map_err(|source| StateDirError::Io {
            action: "create",
            path: PathBuf::from("tmp"),
            source,
        })?;
        let dir = tmp.path().join("state");
        let first = StateDir::open(&dir)?;
        first.note_holder("listening on grpc://127.0.0.1:1")?;
        let mode = std::fs::metadata(&dir).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode.ok(), Some(0o700));
        let Err(refused) = StateDir::open(&dir) else {
            panic!("a second open of a held state directory was accepted");
        };
        let text = refused.to_string();
        assert!(text.contains("--state-dir"), "{text}");
        assert!(text.contains("127.0.0.1:1"), "{text}");
        drop(first);
        let part = StateDir::open(&dir)?.part("uploads")?;
        assert!(part.is_dir());
        Ok(())
    }
}
