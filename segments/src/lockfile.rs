//! `DIR/lock`: an advisory `flock` held for the store's lifetime, with the holder's pid on
//! the first line and, once the holder says where it can be found, a note on the second.
//! Mode `0o600` whatever the files' mode: only the server's user needs it.

use std::fs::{File, OpenOptions, Permissions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::StoreError;

/// The lock on a directory's `lock` file, held until dropped: for directories beside the
/// store (a server's state directory) that follow the same one-process rule.
#[derive(Debug)]
pub struct DirLock {
    file: File,
    dir: PathBuf,
}

impl DirLock {
    /// Takes the lock on `dir/lock`, or names the holder ([`StoreError::Locked`]).
    pub fn acquire(dir: &Path) -> Result<DirLock, StoreError> {
        Ok(DirLock {
            file: acquire(dir)?,
            dir: dir.to_path_buf(),
        })
    }

    /// Notes where the holder can be found, for a process the lock refuses.
    pub fn note(&self, note: &str) -> Result<(), StoreError> {
        write_note(&self.file, &self.dir, note)
    }
}

/// Takes the lock on `dir/lock` (creating the file), or names the holder.
///
/// The lock belongs to the open file description: a second open in the same process is
/// refused too, and the kernel releases it when the process dies.
pub(crate) fn acquire(dir: &Path) -> Result<File, StoreError> {
    let path = dir.join("lock");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|e| StoreError::io(format!("cannot open lock file {}", path.display()), e))?;
    // A lock file left by an older build may be 0o644.
    let mode = file.metadata().map(|m| m.permissions().mode() & 0o777);
    if mode.is_ok_and(|m| m & 0o077 != 0) {
        file.set_permissions(Permissions::from_mode(0o600))
            .map_err(|e| StoreError::io(format!("cannot chmod lock file {}", path.display()), e))?;
    }
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut text = String::new();
            let read = file.read_to_string(&mut text).is_ok();
            let mut lines = text.lines().map(str::trim);
            let holder_pid = lines.next().filter(|_| read).and_then(|l| l.parse().ok());
            let holder_note = lines
                .next()
                .filter(|l| read && !l.is_empty())
                .map(str::to_string);
            return Err(StoreError::Locked {
                dir: dir.to_path_buf(),
                holder_pid,
                holder_note,
            });
        }
        Err(TryLockError::Error(e)) => {
            return Err(StoreError::io(format!("cannot lock {}", path.display()), e));
        }
    }
    let pid = format!("{}\n", std::process::id());
    file.set_len(0)
        .and_then(|()| file.write_all(pid.as_bytes()))
        .map_err(|e| StoreError::io(format!("cannot write pid into {}", path.display()), e))?;
    Ok(file)
}

/// Rewrites the held lock file as `pid\nnote\n`, so a process refused by the lock can say
/// where the holder is (e.g. the address a server listens on). `note` is one line.
pub(crate) fn write_note(mut file: &File, dir: &Path, note: &str) -> Result<(), StoreError> {
    let text = format!("{}\n{}\n", std::process::id(), note.replace('\n', " "));
    file.set_len(0)
        .and_then(|()| file.seek(SeekFrom::Start(0)))
        .and_then(|_| file.write_all(text.as_bytes()))
        .map_err(|e| {
            StoreError::io(
                format!("cannot write into lock file {}", dir.join("lock").display()),
                e,
            )
        })
}
