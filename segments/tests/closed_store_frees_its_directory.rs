//! `close` hands the directory over: a second store opens it at once, even while handles to
//! the closed one are still alive (a server that stops while a request finishes), and the
//! closed store keeps reading what it holds but takes no more writes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{meta, pattern};
use tessera_segments::{Store, StoreError, StoreOptions};

const ENTRY: usize = 32 << 10;

#[test]
fn closed_store_frees_its_directory_while_handles_remain() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let data = pattern(7, ENTRY);
    let first = Arc::new(Store::open(StoreOptions::new(dir)).unwrap());
    first
        .append(b"a", &meta(&[ENTRY as i64], "|u1"), &[&data])
        .unwrap();
    let still_reading = first.clone();
    assert!(matches!(
        Store::open(StoreOptions::new(dir)),
        Err(StoreError::Locked { .. })
    ));

    first.close().unwrap();
    let second = Store::open(StoreOptions::new(dir)).expect("a closed store frees its directory");
    let entry = second
        .read(b"a")
        .unwrap()
        .expect("the sealed entry is kept");
    assert_eq!(&entry.body[8..8 + ENTRY], &data[..]);

    // The old handle still reads, refuses writes, and closing it again changes nothing.
    let old = still_reading.read(b"a").unwrap().expect("reads go on");
    assert_eq!(&old.body[8..8 + ENTRY], &data[..]);
    assert!(matches!(
        still_reading.append(b"b", &meta(&[ENTRY as i64], "|u1"), &[&data]),
        Err(StoreError::Closed { .. })
    ));
    assert!(matches!(
        still_reading.note_holder("gone"),
        Err(StoreError::Closed { .. })
    ));
    drop(first);
    drop(still_reading);
    second
        .append(b"b", &meta(&[ENTRY as i64], "|u1"), &[&data])
        .unwrap();
    assert!(second.read(b"b").unwrap().is_some());
}
