//! Model-based: random runs of append, read, locate, close-and-reopen, torn entry writes and
//! failed directory fsyncs, checked after every step against a map of what the store
//! acknowledged. What must hold, whatever the sequence:
//!
//! * a located entry reads back whole: the file holds, at its location, a message whose
//!   payload is the appended bytes and whose crc32c checks (`read` with verify-on-read);
//! * a key names the same bytes forever: nothing ever answers other bytes for it;
//! * a store that keeps everything (users' data) loses nothing it acknowledged, across
//!   faults and reopens; a cache may evict, but only whole entries.
//!
//! A key's bytes are a function of the key, as a chunk id's are of the id, so every answer
//! can be checked without remembering the order of appends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{meta, pattern};
use proptest::prelude::*;
use tessera_segments::fault::{FaultInjector, WriteFault};
use tessera_segments::{Location, Store, StoreError, StoreOptions};

/// Keys 0..KEYS; sizes span tiny entries to a quarter of a segment.
const KEYS: u8 = 24;
const SEGMENT_BYTES: u64 = 64 << 10;

/// The bytes stored under `key`.
fn bytes_of(key: u8) -> Vec<u8> {
    let len = 1 + (usize::from(key) * 7919) % (16 << 10);
    pattern(u64::from(key) + 1, len)
}

fn key_of(key: u8) -> [u8; 5] {
    let mut k = *b"key-\0";
    k[4] = key;
    k
}

/// One step of a run.
#[derive(Clone, Debug)]
enum Op {
    Append(u8),
    Read(u8),
    Locate(u8),
    /// The next entry write fails after `torn` of its bytes reached the file.
    TearNextWrite(u16),
    /// The next directory or high-water-mark fsync fails, which poisons the store.
    FailNextDirSync,
    /// Close the store and open the directory again.
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..KEYS).prop_map(Op::Append),
        3 => (0..KEYS).prop_map(Op::Read),
        3 => (0..KEYS).prop_map(Op::Locate),
        1 => any::<u16>().prop_map(Op::TearNextWrite),
        1 => Just(Op::FailNextDirSync),
        1 => Just(Op::Reopen),
    ]
}

/// Faults armed by the run, each firing once.
#[derive(Debug, Default)]
struct Armed {
    /// Torn length + 1 of the next entry write; 0 when unarmed.
    tear: AtomicUsize,
    dir_sync: AtomicBool,
}

impl FaultInjector for Armed {
    fn on_entry_write(&self, _segment_id: u64, _offset: u64, len: u64) -> Option<WriteFault> {
        let armed = self.tear.swap(0, Ordering::SeqCst);
        (armed > 0).then(|| WriteFault {
            written_before_error: (armed - 1) % (len as usize).max(1),
            error: io::Error::from_raw_os_error(libc::EIO),
        })
    }

    fn on_dir_sync(&self) -> Option<io::Error> {
        self.dir_sync
            .swap(false, Ordering::SeqCst)
            .then(|| io::Error::from_raw_os_error(libc::EIO))
    }
}

/// Which kind of store a run drives.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Users' data: never evicts, so every acknowledged entry must stay.
    KeepAll,
    /// A cache a few segments large: evicts whole sealed segments as it goes.
    Cache,
}

fn open(dir: &Path, kind: Kind, faults: &Arc<Armed>) -> Store {
    let opts = StoreOptions::new(dir)
        .with_segment_bytes(SEGMENT_BYTES)
        .with_open_segments(1)
        .with_verify_on_read(true)
        .with_fault_injector(Arc::clone(faults) as Arc<dyn FaultInjector>);
    let opts = match kind {
        Kind::KeepAll => opts.with_keep_all(true),
        Kind::Cache => opts.with_max_bytes(6 * SEGMENT_BYTES),
    };
    Store::open(opts).expect("the store opens again whatever happened before")
}

/// The message at `loc`, read with plain I/O; `None` when its segment was evicted.
fn message_at(loc: &Location) -> Option<Vec<u8>> {
    let file = match std::fs::File::open(&loc.segment_path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => panic!("opening {}: {e}", loc.segment_path.display()),
    };
    let mut buf = vec![0u8; loc.byte_length as usize];
    file.read_exact_at(&mut buf, loc.byte_offset)
        .expect("a located message lies wholly inside its segment");
    Some(buf)
}

/// The located message carries `key`'s bytes at the payload offset its framing gives.
fn check_location(key: u8, loc: &Location) {
    let Some(msg) = message_at(loc) else { return };
    let want = bytes_of(key);
    assert_eq!(&msg[..4], &[0xFF; 4], "continuation marker of key {key}");
    let meta_len = i32::from_le_bytes(msg[4..8].try_into().unwrap()) as usize;
    let start = 8 + meta_len + 8;
    assert_eq!(
        &msg[start..start + want.len()],
        &want[..],
        "key {key}: located bytes differ from the ones appended"
    );
}

/// `read` answers the key's bytes (its checksum verified) or nothing.
fn check_read(store: &Store, key: u8) -> bool {
    match store.read(&key_of(key)) {
        Ok(Some(entry)) => {
            let want = bytes_of(key);
            let body = &entry.body[8..8 + want.len()];
            assert_eq!(body, &want[..], "key {key}: read bytes differ");
            check_location(key, &entry.location);
            true
        }
        Ok(None) => false,
        Err(e) => panic!("read of key {key} failed: {e}"),
    }
}

/// Runs `ops`, checking the store against the set of acknowledged keys after every step.
fn run(kind: Kind, ops: &[Op]) {
    let tmp = tempfile::tempdir().unwrap();
    let faults = Arc::new(Armed::default());
    let mut store = open(tmp.path(), kind, &faults);
    let mut acked = BTreeSet::new();
    for op in ops {
        match op {
            Op::Append(key) => {
                let m = meta(&[bytes_of(*key).len() as i64], "|u1");
                match store.append(&key_of(*key), &m, &[&bytes_of(*key)]) {
                    Ok(loc) => {
                        check_location(*key, &loc);
                        acked.insert(*key);
                    }
                    Err(StoreError::Io { .. } | StoreError::Poisoned { .. }) => {}
                    Err(e) => panic!("append of key {key}: unexpected error {e}"),
                }
            }
            Op::Read(key) => {
                let found = check_read(&store, *key);
                if matches!(kind, Kind::KeepAll) && acked.contains(key) {
                    assert!(found, "acknowledged key {key} is gone");
                }
            }
            Op::Locate(key) => match store.locate(&key_of(*key)) {
                Some(loc) => check_location(*key, &loc),
                None => assert!(
                    !(matches!(kind, Kind::KeepAll) && acked.contains(key)),
                    "acknowledged key {key} cannot be located"
                ),
            },
            Op::TearNextWrite(torn) => faults.tear.store(usize::from(*torn) + 1, Ordering::SeqCst),
            Op::FailNextDirSync => faults.dir_sync.store(true, Ordering::SeqCst),
            Op::Reopen => {
                // A poisoned store reports it on close; reopening is how it recovers.
                let _ = store.close();
                drop(store);
                faults.tear.store(0, Ordering::SeqCst);
                faults.dir_sync.store(false, Ordering::SeqCst);
                store = open(tmp.path(), kind, &faults);
            }
        }
    }
    // Whatever the run did, a reopened store answers every key right, and keeps them all
    // when it keeps all.
    let _ = store.close();
    drop(store);
    faults.tear.store(0, Ordering::SeqCst);
    faults.dir_sync.store(false, Ordering::SeqCst);
    let store = open(tmp.path(), kind, &faults);
    for key in 0..KEYS {
        let found = check_read(&store, key);
        if matches!(kind, Kind::KeepAll) && acked.contains(&key) {
            assert!(found, "acknowledged key {key} lost across the final reopen");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn a_store_that_keeps_all_loses_nothing_acknowledged(ops in prop::collection::vec(op(), 1..80)) {
        run(Kind::KeepAll, &ops);
    }

    #[test]
    fn a_cache_only_ever_answers_the_bytes_appended(ops in prop::collection::vec(op(), 1..80)) {
        run(Kind::Cache, &ops);
    }
}
