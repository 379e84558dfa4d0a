//! When an fsync of the directory (here: of the segment-id high-water mark) fails, the store
//! refuses every further write with a typed error instead of carrying on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{meta, pattern};
use tessera_segments::fault::{FaultInjector, WriteFault};
use tessera_segments::{Store, StoreError, StoreOptions};

#[derive(Debug)]
struct FailDirSync(AtomicBool);

impl FaultInjector for FailDirSync {
    fn on_entry_write(&self, _: u64, _: u64, _: u64) -> Option<WriteFault> {
        None
    }
    fn on_dir_sync(&self) -> Option<io::Error> {
        self.0
            .load(Ordering::SeqCst)
            .then(|| io::Error::from_raw_os_error(libc::EIO))
    }
}

#[test]
fn failed_fsync_poisons_store() {
    let tmp = tempfile::tempdir().unwrap();
    let fault = Arc::new(FailDirSync(AtomicBool::new(false)));
    let store = Store::open(
        StoreOptions::new(tmp.path())
            .with_open_segments(1)
            .with_segment_bytes(64 << 10)
            .with_fault_injector(fault.clone()),
    )
    .unwrap();
    let m = meta(&[40 << 10], "|u1");
    let a = store.append(b"a", &m, &[&pattern(1, 40 << 10)]).unwrap();
    fault.0.store(true, Ordering::SeqCst);
    // The next entry needs a new segment id, whose high-water mark cannot be made durable.
    let err = store
        .append(b"b", &m, &[&pattern(2, 40 << 10)])
        .unwrap_err();
    assert!(matches!(err, StoreError::Poisoned { .. }), "{err}");
    assert!(err.to_string().contains("high-water mark"), "{err}");
    fault.0.store(false, Ordering::SeqCst);
    // Still refused: poisoning is sticky until restart.
    let err = store.append(b"c", &m, &[&pattern(3, 10)]).unwrap_err();
    assert!(matches!(err, StoreError::Poisoned { .. }), "{err}");
    // Reads keep working.
    assert_eq!(store.locate(b"a").as_ref(), Some(&a));
    drop(store);
    let store = Store::open(StoreOptions::new(tmp.path())).unwrap();
    assert_eq!(store.locate(b"a").as_ref(), Some(&a));
    store.append(b"b", &m, &[&pattern(2, 40 << 10)]).unwrap();
}
