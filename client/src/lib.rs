//! A Rust client for Tessera and other servers speaking the biopb tensor
//! Flight protocol (Flight protocol 2 or 3, chunk wire protocol 2), doing
//! what biopb's Python client does on the read path.
//!
//! ```text
//! Client::connect ── DoAction health (protocol must be 2 or 3)
//! Client::plan ───── GetFlightInfo CMD FlightRequest{tensor_read, mask ["endpoints"]}
//!                    check chunk_wire_protocol == "2", tile check, crop
//! Client::read ───── per chunk, `concurrency` at once:
//!                      cache (weak views, LRU of copies)
//!                      loopback + mmap on: DoAction chunk_locate → stat/inode
//!                        → mmap → IPC message parsed in place (zero copy)
//!                      otherwise, or on any fast-path failure: DoGet
//!                    scatter into one C-order buffer
//! ```
//!
//! The mmap fast path applies when [`ClientOptions::mmap`] is on (default,
//! unless `TESSERA_MMAP=0` or `BIOPB_CACHEFILE_TRANSFER_DISABLED` is
//! `1`/`true`/`yes`) and the location's host is `localhost`, `127.0.0.0/8`
//! or `::1`. Mapped views keep their segment mapped while they live; the
//! summed size of mapped segments is capped by [`ClientOptions::pin_limit`]
//! (`TESSERA_PIN_LIMIT`), past which chunks are copied out of the mapping.
//!
//! TLS locations (`grpc+tls://`, `grpcs://`) need the server's CA certificate
//! ([`ClientOptions::with_tls_ca_pem`]); there is no default trust store. The fast path needs Unix (inode numbers).

mod address;
mod assemble;
mod cache;
mod catalog;
mod chunk;
mod client;
mod dtype;
mod error;
mod health;
mod ipc;
mod mapping;
mod npy;
mod options;
mod pins;
mod plan;
mod region;
mod upload;

pub use catalog::RefusedSource;
pub use chunk::{ChunkOrigin, ChunkView};
pub use client::{
    ArrayData, Client, H2_CONNECTION_WINDOW_BYTES, H2_MAX_FRAME_BYTES, H2_STREAM_WINDOW_BYTES,
    LocalStats, MAX_MESSAGE_BYTES, ReadScale, TensorInfo,
};
pub use dtype::itemsize;
pub use error::ClientError;
pub use health::{SUPPORTED_PROTOCOLS, ServerHealth};
pub use npy::{npy_header, write_npy};
pub use options::{
    ClientOptions, DEFAULT_CONCURRENCY, DEFAULT_COPY_CACHE_BYTES, ENV_BIOPB_CACHEFILE_DISABLED,
    ENV_MMAP, ENV_PIN_LIMIT,
};
pub use plan::{Plan, PlannedChunk, check_tiling};
pub use region::{Region, Selection, parse_region, parse_selection};
pub use tessera_proto::json::{CacheStats, ChunkLocateReply};
pub use upload::upload_arrow_type;
