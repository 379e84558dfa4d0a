//! A write that fails because the filesystem is full (a real 2 MiB tmpfs) seals the segment
//! at its last good entry: the append fails with a typed error, every entry stored before
//! reads back exactly, and a reopen finds them all. Skips with a message where a tmpfs cannot
//! be mounted (needs root), and fails under CI=true.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{meta, pattern};
use tessera_segments::{Store, StoreError, StoreOptions};

/// A tmpfs mounted for the test, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(at.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn full_tmpfs_seals_segment_and_keeps_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::mount(&tmp.path().join("small"), "2m") else {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true"),
            "CI=true, so this scenario must run, but a tmpfs cannot be mounted here (needs root)"
        );
        eprintln!("SKIPPED: cannot mount a tmpfs here (needs root)");
        return;
    };
    let dir = fs.0.join("cache");
    let store = Store::open(StoreOptions::new(&dir).with_open_segments(1)).unwrap();
    let m = meta(&[256 << 10], "|u1");
    let mut stored = Vec::new();
    let mut failure = None;
    for i in 0..20u64 {
        match store.append(format!("k{i}").as_bytes(), &m, &[&pattern(i, 256 << 10)]) {
            Ok(loc) => stored.push((i, loc)),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let err = failure.expect("a 2 MiB filesystem must fill up");
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    assert!(!stored.is_empty());
    assert!(err.is_disk_full(), "{err}");
    let stats = store.stats();
    assert_eq!(stats.disk_full_events, 1);
    assert_eq!(
        stats.disk_ceiling,
        Some(stats.total_bytes),
        "the first failure stops growth without evicting"
    );
    for (i, loc) in &stored {
        assert_eq!(common::payload_of(loc, 256 << 10), pattern(*i, 256 << 10));
    }
    drop(store);
    let store = Store::open(StoreOptions::new(&dir)).unwrap();
    for (i, loc) in &stored {
        assert_eq!(store.locate(format!("k{i}").as_bytes()).as_ref(), Some(loc));
    }
}
