//! A failed entry write (torn or not) seals the segment at its last good entry: the append
//! fails with a typed error, earlier entries stay readable, the end-of-stream marker sits at
//! the last good end, the sidecar lists only good entries, and the next append opens a new
//! segment. On a real filesystem that runs out of space: full_tmpfs_seals_segment.rs (its own
//! process: a test that spawns `mount` while another reopens a store here would hand the
//! store's lock to the forked child for a moment and make that reopen fail).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{meta, pattern, segment_id};
use tessera_segments::fault::{FaultInjector, WriteFault};
use tessera_segments::{Store, StoreError, StoreOptions};

/// Fails the `fail_at`-th entry write (0-based) after writing `torn` bytes of it.
#[derive(Debug)]
struct FailNth {
    writes: AtomicU64,
    fail_at: u64,
    torn: usize,
}

impl FaultInjector for FailNth {
    fn on_entry_write(&self, _segment_id: u64, _offset: u64, _len: u64) -> Option<WriteFault> {
        (self.writes.fetch_add(1, Ordering::SeqCst) == self.fail_at).then(|| WriteFault {
            written_before_error: self.torn,
            error: io::Error::from_raw_os_error(libc::EIO),
        })
    }
    fn on_dir_sync(&self) -> Option<io::Error> {
        None
    }
}

fn check_fault(torn: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let fault = Arc::new(FailNth {
        writes: AtomicU64::new(0),
        fail_at: 2,
        torn,
    });
    let store = Store::open(
        StoreOptions::new(dir)
            .with_open_segments(1)
            .with_fault_injector(fault),
    )
    .unwrap();
    let m = meta(&[3000], "|u1");
    let a = store.append(b"a", &m, &[&pattern(1, 3000)]).unwrap();
    let b = store.append(b"b", &m, &[&pattern(2, 3000)]).unwrap();
    let err = store.append(b"c", &m, &[&pattern(3, 3000)]).unwrap_err();
    assert!(matches!(err, StoreError::Io { .. }), "{err}");
    assert!(err.to_string().contains("sealed"), "{err}");
    assert_eq!(store.locate(b"c"), None);

    let seg = a.segment_path.clone();
    let good_end = b.byte_offset + b.byte_length;
    let f = std::fs::File::open(&seg).unwrap();
    let mut eos = [0u8; 8];
    f.read_exact_at(&mut eos, good_end).unwrap();
    assert_eq!(
        eos,
        [0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0],
        "end-of-stream at last good end"
    );
    assert!(
        seg.with_extension("idx").exists(),
        "sidecar written on seal"
    );
    let len_after_seal = std::fs::metadata(&seg).unwrap().len();
    assert!(len_after_seal >= good_end + 8);

    // Next append: fresh segment; the sealed one never grows again.
    let c = store.append(b"c", &m, &[&pattern(3, 3000)]).unwrap();
    assert!(segment_id(&c.segment_path) > segment_id(&seg));
    assert_eq!(store.locate(b"a").as_ref(), Some(&a));
    let e = store.read(b"b").unwrap().unwrap();
    assert_eq!(&e.body[8..3008], &pattern(2, 3000)[..]);
    drop(store);
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), len_after_seal);

    let store = Store::open(StoreOptions::new(dir)).unwrap();
    assert_eq!(store.locate(b"a").as_ref(), Some(&a));
    assert_eq!(store.locate(b"b").as_ref(), Some(&b));
    assert_eq!(store.locate(b"c").as_ref(), Some(&c));
}

#[test]
fn torn_write_error_seals_segment() {
    check_fault(1500);
}

#[test]
fn clean_write_error_seals_segment() {
    check_fault(0);
}
