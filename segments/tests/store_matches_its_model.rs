//! Model-based: random runs of append, read, locate, reading every key, maintenance (seal
//! and evict), close, reopen, torn entry writes and failed directory fsyncs, checked after every step against
//! a map model of what the store acknowledged. What must hold, whatever the sequence:
//!
//! * a located entry reads back whole: the file holds, at its location, a message whose
//!   payload is the appended bytes, and `read` (verify-on-read) answers the same location
//!   with its crc32c checked;
//! * a key names the same bytes and the same location for as long as it is stored: an
//!   append of a stored key answers where it already lives;
//! * nothing acknowledged is lost except by an eviction the rule allows: a store that keeps
//!   everything (users' data) loses nothing across faults and reopens; a cache loses whole
//!   segments only, only where maintenance, close or open may evict, never the segment it is
//!   writing, least recently used first;
//! * a cache keeps its headline invariant: the bytes of its segment files and sidecars stay
//!   within its budget plus one segment.
//!
//! The cache runs without a thread of its own ([`StoreOptions::with_shared_maintenance`]):
//! the test is the owner's worker, so every seal and eviction happens at a step the model
//! sees. It answers a wake before an append that would otherwise wait for eviction.
//!
//! A key's bytes are a function of the key, as a chunk id's are of the id, so every answer
//! can be checked without remembering the order of appends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{meta, pattern};
use proptest::prelude::*;
use tessera_segments::fault::{FaultInjector, WriteFault};
use tessera_segments::{Location, Store, StoreError, StoreOptions};

/// Keys 0..KEYS; sizes span tiny entries to half a segment.
const KEYS: u8 = 32;
const SEGMENT_BYTES: u64 = 64 << 10;
/// The cache's budget: two segments, so a run evicts many times.
const CACHE_BUDGET: u64 = 2 * SEGMENT_BYTES;

/// The bytes stored under `key`.
fn bytes_of(key: u8) -> Vec<u8> {
    let len = 1 + (usize::from(key) * 7919) % (32 << 10);
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
    /// Read every key, in key order (a client reading a whole tensor again): the segment
    /// being written may then be the least recently used.
    ReadAll,
    /// The owner's worker runs: rotated segments are sealed, the cache evicted to budget.
    Maintain,
    /// The next entry write fails after `torn` of its bytes reached the file.
    TearNextWrite(u16),
    /// The next directory or high-water-mark fsync fails, which poisons the store.
    FailNextDirSync,
    /// Close the store; it still answers lookups and reads, and refuses appends.
    Close,
    /// Close the store (if open) and open the directory again.
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0..KEYS).prop_map(Op::Append),
        3 => (0..KEYS).prop_map(Op::Read),
        3 => (0..KEYS).prop_map(Op::Locate),
        1 => Just(Op::ReadAll),
        2 => Just(Op::Maintain),
        1 => any::<u16>().prop_map(Op::TearNextWrite),
        1 => Just(Op::FailNextDirSync),
        1 => Just(Op::Close),
        2 => Just(Op::Reopen),
    ]
}

/// Faults armed by the run, each firing once.
#[derive(Debug, Default)]
struct Armed {
    /// Torn length + 1 of the next entry write; 0 when unarmed.
    tear: AtomicUsize,
    dir_sync: AtomicBool,
}

impl Armed {
    fn disarm(&self) {
        self.tear.store(0, Ordering::SeqCst);
        self.dir_sync.store(false, Ordering::SeqCst);
    }
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Users' data: never evicts, so every acknowledged entry must stay. Runs its own
    /// maintenance thread, concurrently with the steps.
    KeepAll,
    /// A cache of two segments: evicts whole sealed segments, at the steps that may.
    Cache,
}

/// The store under test and what drives its maintenance.
struct Harness {
    kind: Kind,
    dir: PathBuf,
    faults: Arc<Armed>,
    /// Set when the cache asks its owner's worker for maintenance.
    woken: Arc<AtomicBool>,
    store: Store,
}

impl Harness {
    fn new(dir: &Path, kind: Kind) -> Harness {
        let faults = Arc::new(Armed::default());
        let woken = Arc::new(AtomicBool::new(false));
        let store = open(dir, kind, &faults, &woken);
        Harness {
            kind,
            dir: dir.to_path_buf(),
            faults,
            woken,
            store,
        }
    }

    /// Closes the store (a poisoned store reports it; reopening is how it recovers).
    fn close(&mut self) {
        let _ = self.store.close();
    }

    fn reopen(&mut self) {
        self.close();
        self.faults.disarm();
        self.store = open(&self.dir, self.kind, &self.faults, &self.woken);
    }

    /// The owner's worker: one maintenance pass.
    fn maintain(&mut self) {
        self.woken.store(false, Ordering::SeqCst);
        self.store.maintain();
    }
}

fn open(dir: &Path, kind: Kind, faults: &Arc<Armed>, woken: &Arc<AtomicBool>) -> Store {
    let opts = StoreOptions::new(dir)
        .with_segment_bytes(SEGMENT_BYTES)
        .with_open_segments(1)
        .with_verify_on_read(true)
        .with_fault_injector(Arc::clone(faults) as Arc<dyn FaultInjector>);
    let opts = match kind {
        Kind::KeepAll => opts.with_keep_all(true),
        Kind::Cache => {
            let woken = Arc::clone(woken);
            opts.with_max_bytes(CACHE_BUDGET)
                .with_shared_maintenance(Arc::new(move || woken.store(true, Ordering::SeqCst)))
        }
    };
    Store::open(opts).expect("the store opens again whatever happened before")
}

/// The message at `loc`, read with plain I/O.
fn message_at(loc: &Location) -> Vec<u8> {
    let file = std::fs::File::open(&loc.segment_path)
        .unwrap_or_else(|e| panic!("opening {}: {e}", loc.segment_path.display()));
    let mut buf = vec![0u8; loc.byte_length as usize];
    file.read_exact_at(&mut buf, loc.byte_offset)
        .expect("a located message lies wholly inside its segment");
    buf
}

/// The located message carries `key`'s bytes at the payload offset its framing gives.
fn check_location(key: u8, loc: &Location) {
    let msg = message_at(loc);
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

/// Real bytes of the segment files and sidecars in the store's directory.
fn bytes_on_disk(dir: &Path) -> u64 {
    std::fs::read_dir(dir.join("segments"))
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// What the store acknowledged and has not (by the model's rule) evicted, and the
/// recency the eviction order follows.
#[derive(Debug, Default)]
struct Model {
    /// Stored keys and where they live.
    stored: BTreeMap<u8, Location>,
    /// The model's logical clock, advanced by every append, locate and read that finds or
    /// stores its key, as the store's is.
    clock: u64,
    /// Last use of each segment on the model's clock.
    last_use: HashMap<PathBuf, u64>,
    /// The segment the store certainly still appends to (no failure or close since).
    writing: Option<PathBuf>,
    /// The segment the store may still append to (a failure may have sealed it).
    maybe_writing: Option<PathBuf>,
    closed: bool,
}

impl Model {
    fn touch(&mut self, loc: &Location) {
        if self.closed {
            // A closed store saved its recency at close; later uses are not kept.
            return;
        }
        self.clock += 1;
        self.last_use.insert(loc.segment_path.clone(), self.clock);
    }

    /// The store answered `key` at `loc`: it must be the model's entry of it.
    fn found(&mut self, key: u8, loc: &Location) {
        let Some(known) = self.stored.get(&key) else {
            panic!("key {key} answered at {loc:?} but the model does not hold it");
        };
        assert_eq!(known, loc, "key {key} moved");
        self.touch(loc);
    }

    fn appended(&mut self, key: u8, loc: Location) {
        if self.stored.contains_key(&key) {
            return self.found(key, &loc);
        }
        self.touch(&loc);
        self.writing = Some(loc.segment_path.clone());
        self.maybe_writing = Some(loc.segment_path.clone());
        self.stored.insert(key, loc);
    }

    fn append_failed(&mut self) {
        self.writing = None;
    }

    fn stopped_writing(&mut self) {
        self.writing = None;
        self.maybe_writing = None;
    }
}

fn step(h: &mut Harness, model: &mut Model, op: &Op) {
    match op {
        Op::Append(key) => {
            if h.kind == Kind::Cache
                && h.woken.load(Ordering::SeqCst)
                && h.store.stats().total_bytes > CACHE_BUDGET
            {
                // The append would wait for eviction: the worker answers the wake first.
                evicting(h, model, false, Harness::maintain);
            }
            let m = meta(&[bytes_of(*key).len() as i64], "|u1");
            match h.store.append(&key_of(*key), &m, &[&bytes_of(*key)]) {
                Ok(loc) => {
                    assert!(!model.closed, "a closed store took an append");
                    check_location(*key, &loc);
                    model.appended(*key, loc);
                }
                Err(StoreError::Closed { .. }) => assert!(model.closed, "an open store refused"),
                Err(StoreError::Io { .. } | StoreError::Poisoned { .. }) => model.append_failed(),
                Err(e) => panic!("append of key {key}: unexpected error {e}"),
            }
        }
        Op::Read(key) => match h.store.read(&key_of(*key)) {
            Ok(Some(entry)) => {
                let want = bytes_of(*key);
                assert_eq!(
                    &entry.body[8..8 + want.len()],
                    &want[..],
                    "key {key}: read bytes differ"
                );
                check_location(*key, &entry.location);
                model.found(*key, &entry.location);
            }
            Ok(None) => assert!(!model.stored.contains_key(key), "stored key {key} not read"),
            Err(e) => panic!("read of key {key} failed: {e}"),
        },
        Op::Locate(key) => match h.store.locate(&key_of(*key)) {
            Some(loc) => {
                check_location(*key, &loc);
                model.found(*key, &loc);
                // A located entry reads back, its checksum verified, at the same place.
                let entry = h
                    .store
                    .read(&key_of(*key))
                    .unwrap()
                    .expect("located, then read");
                assert_eq!(
                    entry.location, loc,
                    "key {key}: read answers another location"
                );
                model.found(*key, &loc);
            }
            None => assert!(
                !model.stored.contains_key(key),
                "stored key {key} not located"
            ),
        },
        Op::ReadAll => {
            for key in 0..KEYS {
                step(h, model, &Op::Read(key));
            }
        }
        Op::Maintain => evicting(h, model, false, Harness::maintain),
        Op::TearNextWrite(torn) => h
            .faults
            .tear
            .store(usize::from(*torn) + 1, Ordering::SeqCst),
        Op::FailNextDirSync => h.faults.dir_sync.store(true, Ordering::SeqCst),
        Op::Close => {
            evicting(h, model, true, Harness::close);
            model.closed = true;
        }
        Op::Reopen => {
            evicting(h, model, true, Harness::reopen);
            model.closed = false;
        }
    }
}

/// Runs `action`, a step that may evict (`seals_all`: it seals every segment first, as
/// close does), and checks what went against the eviction rule: only a cache evicts; whole
/// segments, never the one it was certainly writing; least recently used first.
fn evicting<F: FnOnce(&mut Harness)>(
    h: &mut Harness,
    model: &mut Model,
    seals_all: bool,
    action: F,
) {
    action(h);
    if seals_all {
        model.stopped_writing();
    }
    let gone: BTreeSet<u8> = model
        .stored
        .keys()
        .copied()
        .filter(|k| !h.store.contains(&key_of(*k)))
        .collect();
    if gone.is_empty() {
        return;
    }
    assert_eq!(
        h.kind,
        Kind::Cache,
        "a store that keeps all lost keys {gone:?}"
    );
    let evicted: BTreeSet<PathBuf> = gone
        .iter()
        .map(|k| model.stored[k].segment_path.clone())
        .collect();
    for seg in &evicted {
        assert!(
            !seg.exists(),
            "keys of {} evicted, its file left",
            seg.display()
        );
        assert_ne!(
            Some(seg),
            model.writing.as_ref(),
            "the segment being written was evicted"
        );
    }
    for (key, loc) in &model.stored {
        let survives = !gone.contains(key);
        assert!(
            !(survives && evicted.contains(&loc.segment_path)),
            "key {key} survived the eviction of its segment: eviction is by whole segments"
        );
        let sealed = seals_all || model.maybe_writing.as_ref() != Some(&loc.segment_path);
        if survives && sealed {
            for seg in &evicted {
                assert!(
                    model.last_use[&loc.segment_path] > model.last_use[seg],
                    "{} evicted before the less recently used {}",
                    seg.display(),
                    loc.segment_path.display()
                );
            }
        }
    }
    model.stored.retain(|k, _| !gone.contains(k));
}

/// Runs `ops`, checking the store against the model after every step.
fn run(kind: Kind, ops: &[Op]) {
    let tmp = tempfile::tempdir().unwrap();
    let mut h = Harness::new(tmp.path(), kind);
    let mut model = Model::default();
    for op in ops {
        step(&mut h, &mut model, op);
        for (key, loc) in &model.stored {
            assert!(
                h.store.contains(&key_of(*key)),
                "key {key} lost outside an eviction"
            );
            assert!(loc.segment_path.exists(), "segment of key {key} gone");
        }
        if kind == Kind::Cache {
            let held = bytes_on_disk(tmp.path());
            assert!(
                held <= CACHE_BUDGET + SEGMENT_BYTES,
                "{held} bytes on disk, past the budget plus one segment"
            );
        }
    }
    // Whatever the run did, a reopened store answers every key the model holds.
    evicting(&mut h, &mut model, true, Harness::reopen);
    for key in 0..KEYS {
        step(&mut h, &mut model, &Op::Read(key));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn a_store_that_keeps_all_loses_nothing_acknowledged(ops in prop::collection::vec(op(), 1..100)) {
        run(Kind::KeepAll, &ops);
    }

    #[test]
    fn a_cache_evicts_only_what_its_rule_allows(ops in prop::collection::vec(op(), 1..100)) {
        run(Kind::Cache, &ops);
    }
}
