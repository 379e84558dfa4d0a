//! Segment and sidecar files are created 0o600 unless a group-readable mode is configured.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;

use common::{meta, pattern};
use tessera_segments::{Store, StoreOptions};

fn modes_after_append(opts: StoreOptions) -> (u32, u32) {
    let store = Store::open(opts).unwrap();
    let loc = store
        .append(b"k", &meta(&[10], "|u1"), &[&pattern(1, 10)])
        .unwrap();
    store.close().unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    (
        mode(&loc.segment_path),
        mode(&loc.segment_path.with_extension("idx")),
    )
}

#[test]
fn files_private_by_default() {
    let tmp = tempfile::tempdir().unwrap();
    let (seg, idx) = modes_after_append(StoreOptions::new(tmp.path().join("a")));
    assert_eq!((seg, idx), (0o600, 0o600));
}

#[test]
fn group_mode_is_configurable() {
    let tmp = tempfile::tempdir().unwrap();
    // The process umask may clear bits; 0o640 survives the usual 022.
    let (seg, idx) =
        modes_after_append(StoreOptions::new(tmp.path().join("b")).with_file_mode(0o640));
    assert_eq!((seg, idx), (0o640, 0o640));
}

#[test]
fn directories_and_lock_are_private_even_when_left_wider() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let set = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    // What an older build left behind: 0755 directories and a 0644 lock file.
    std::fs::create_dir_all(dir.join("segments")).unwrap();
    std::fs::write(dir.join("lock"), b"1\n").unwrap();
    set(&dir, 0o2755);
    set(&dir.join("segments"), 0o755);
    set(&dir.join("lock"), 0o644);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;

    let store = Store::open(StoreOptions::new(&dir)).unwrap();
    // The setgid bit an operator set is kept.
    assert_eq!(mode(&dir), 0o2700);
    assert_eq!(mode(&dir.join("segments")), 0o700);
    assert_eq!(mode(&dir.join("lock")), 0o600);
    store.close().unwrap();
    drop(store);

    set(&dir, 0o2775);
    let store = Store::open(StoreOptions::new(&dir).with_file_mode(0o640)).unwrap();
    assert_eq!(mode(&dir), 0o2750);
    assert_eq!(mode(&dir.join("segments")), 0o750);
    assert_eq!(mode(&dir.join("lock")), 0o600);
    store.close().unwrap();
    drop(store);

    // Created fresh: 0700 and 0750.
    let fresh = tmp.path().join("new/cache");
    let store = Store::open(StoreOptions::new(&fresh)).unwrap();
    assert_eq!(mode(&fresh), 0o700);
    assert_eq!(mode(&fresh.join("segments")), 0o700);
    store.close().unwrap();
    drop(store);
}
