//! An entry larger than a segment may hold is refused with a typed error and counted in
//! `oversized_skips`; nothing is written for it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{meta, pattern};
use tessera_segments::{Store, StoreError, StoreOptions};

#[test]
fn oversized_entry_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let store = Store::open(StoreOptions::new(tmp.path()).with_segment_bytes(64 << 10)).unwrap();
    let data = pattern(1, 100 << 10);
    let err = store
        .append(b"big", &meta(&[100 << 10], "|u1"), &[&data])
        .unwrap_err();
    assert!(matches!(err, StoreError::EntryTooLarge { .. }), "{err}");
    let stats = store.stats();
    assert_eq!(stats.oversized_skips, 1);
    assert_eq!(stats.total_entries, 0);
    assert_eq!(stats.segments, 0);
    let err = store
        .append(b"neg", &meta(&[-1], "|u1"), &[&data[..10]])
        .unwrap_err();
    assert!(matches!(err, StoreError::InvalidEntry { .. }), "{err}");
}
