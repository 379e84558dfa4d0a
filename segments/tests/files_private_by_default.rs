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
