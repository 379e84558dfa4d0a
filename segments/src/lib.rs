//! tessera-segments: the append-only Arrow IPC segment store behind Tessera's local chunk
//! file cache, which clients on the same host `mmap` directly (biopb's `chunk_locate` fast
//! path).
//!
//! # Quick start
//! ```
//! use tessera_segments::{EntryMeta, Store, StoreOptions};
//!
//! # fn main() -> Result<(), tessera_segments::StoreError> {
//! let dir = std::env::temp_dir().join(format!("tessera-doc-{}", std::process::id()));
//! let store = Store::open(StoreOptions::new(&dir).with_max_bytes(64 << 20))?;
//! let meta = EntryMeta { shape: vec![2, 3], dtype: "<u2".to_string() };
//! let bytes: Vec<u8> = (0u8..12).collect();
//! // The pieces are written with one vectored write; together they are the chunk's bytes.
//! let loc = store.append(b"chunk-1", &meta, &[&bytes[..4], &bytes[4..]])?;
//! assert_eq!(store.locate(b"chunk-1"), Some(loc.clone()));
//! let entry = store.read(b"chunk-1")?.expect("just stored");
//! assert_eq!(entry.location, loc);
//! assert_eq!(loc.byte_length, (8 + entry.header.len() + entry.body.len()) as u64);
//! store.close()?;
//! # drop(store);
//! # std::fs::remove_dir_all(&dir).ok();
//! # Ok(())
//! # }
//! ```
//!
//! # Directory layout
//! ```text
//! DIR/FORMAT                        "tessera-segments <FORMAT_VERSION>"; another version is refused
//! DIR/lock                          flock held while a Store is open, holder pid inside
//! DIR/next_segment_id               segment-id high-water mark, fsynced before an id is used
//! DIR/recency                       last-use counter per segment (eviction order across restarts)
//! DIR/segments/seg_{id:016}.arrow   one Arrow IPC stream per segment
//! DIR/segments/seg_{id:016}.idx     sidecar index, written when the segment is sealed
//! ```
//!
//! # Owners
//! Each kind of state has one owner with private fields, and a module only uses modules
//! below it (docs/decisions/0026; `tests/modules_form_layers.rs` keeps it so):
//! ```text
//! store                      Store: the public API, the directory lock
//!   append   evict           Writer (open segments, ids, keys being written) and
//!                            Maintenance (seal, evict, save recency), the writer over it
//!     shared                 the fixed settings, and:
//!       budget  catalog  health   bytes on disk and admission; index, segments and
//!                                 recency; closed or poisoned
//!         segment, index, boot, layout, ipc, ...   files and formats
//! ```
//!
//! # Segment format
//! A segment is an Arrow IPC **stream**: the schema message at offset 0 (`data: Binary`,
//! `shape: List<Int64>`, `dtype: Utf8`, `key: Binary`), then one single-row record batch
//! message per entry, then, once sealed, the end-of-stream marker `FFFFFFFF 00000000`.
//! An entry's [`Location`] covers one whole encapsulated message, from its `0xFFFFFFFF`
//! continuation marker to the end of its body. The `data` value sits at byte 0 of its values
//! buffer and starts 64-byte aligned in the file (the metadata is padded for it). Every entry
//! message carries the crc32c of its body in `custom_metadata` (`tessera:crc32c`, 8 hex
//! digits), so a walk without a sidecar can verify it. See [`ipc`] for the exact body layout.
//!
//! # Invariants
//! * A segment file is never truncated, shrunk or rewritten: new segments get fresh,
//!   strictly increasing ids (the high-water mark survives eviction, restarts and the
//!   removal of every segment), and eviction only unlinks. The one positional write is the
//!   end-of-stream marker placed over torn bytes after a failed write; no entry was ever
//!   located there.
//! * An entry is written completely (one vectored write, or for
//!   [`Store::append_from_file`] body first, checksum read back from the segment, header
//!   last) before it enters the index, so a located entry is always whole; lookups are map
//!   accesses and never wait for writes.
//! * On any write error the segment is sealed at its last good entry, the append fails, and
//!   the next append opens a new segment: nothing is ever appended after torn bytes.
//! * A failed fsync of the id high-water mark, a sidecar or the directory poisons the store:
//!   further appends fail with [`StoreError::Poisoned`].
//! * Boot trusts a sidecar only when its own checksum holds and it records the segment's
//!   current size; otherwise it walks the stream, verifies each entry's crc32c, stops at a
//!   torn tail without modifying it, and writes a fresh sidecar. Segments found at boot are
//!   sealed.
//! * The budget counts real bytes on disk (segments and sidecars). A background thread
//!   evicts whole sealed segments, least recently used first (recency persisted in
//!   `DIR/recency`), never an open one; the budget is also enforced at open. Appends are
//!   admitted against it: while the cache would pass its budget by more than one segment,
//!   an append waits for eviction, so eviction cannot fall behind appends.
//! * A store opened with [`StoreOptions::with_keep_all`] (users' data, not a cache) never
//!   evicts: neither its budget nor a full disk removes anything; an append the filesystem
//!   cannot take fails.
//! * A full filesystem (ENOSPC, EDQUOT) stops the store growing, a second failure lowers its
//!   budget a quarter below what it holds, and eviction raises it again as free space
//!   returns (`diskfull`).
//! * The store refuses a network filesystem ([`fsgate`]) unless explicitly allowed, and a
//!   second open of the same directory ([`StoreError::Locked`]).

mod append;
mod boot;
mod budget;
mod catalog;
mod copy;
mod diskfull;
pub mod error;
mod evict;
#[doc(hidden)]
pub mod fault;
pub mod fsgate;
mod health;
mod index;
pub mod ipc;
mod layout;
mod lockfile;
mod mailbox;
mod map;
pub mod options;
mod recency;
mod segment;
mod shared;
mod sidecar;
mod store;
mod types;

pub use error::StoreError;
pub use layout::FORMAT_VERSION;
pub use lockfile::DirLock;
pub use options::StoreOptions;
pub use store::Store;
pub use types::{EntryBytes, EntryMeta, FileRange, Location, StoreStats};
