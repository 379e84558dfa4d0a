//! Tessera server: sources → chunk grid → chunks → service state → wire.
//!
//! The modules, in the order a chunk's bytes flow through them:
//!
//! * `source` reads `.npy` files strictly (never evaluating headers) and keeps the registry
//!   of served sources.
//! * `grid` cuts a tensor into chunks of at most 64 MiB; beside it `grid::chunk_id` (the
//!   codec of the opaque chunk ids inside tickets), `grid::route` (which of a tensor's two
//!   grids a plan is cut on) and `grid::scaled` (downsampled reads and the pyramid).
//! * `chunks` decodes chunks once and keeps them in the segment store (or RAM).
//! * `state` is what the service shares between calls, below the wire; `error` is its one
//!   error type and the one mapping of it to gRPC status.
//! * `unread` is the ledger of unread replies: the bytes each connection's unread `do_get`
//!   replies hold, and the connections it closes when their readers stall.
//! * `wire` is the Arrow Flight service speaking the biopb tensor protocol, the listener that
//!   admits its connections, and TLS.
//!
//! Beside the read path, the features users write through: `uploads` (tensors clients
//! write), `rois` (annotations), `catalog` (SQL over the sources, tensors and ROIs), and
//! `state_dir`, the directory that keeps what users write. `metrics` is the handle every
//! layer records Prometheus metrics through; `ops` runs it all as a long-lived process: the
//! daemon, its configuration, the folder watcher and the metrics endpoint.
//!
//! Modules are private; the items below are the crate's public surface: what the `tessera`
//! binary, the end-to-end tests and the benchmarks use.

mod catalog;
mod chunks;
mod content_version;
mod error;
mod grid;
mod metrics;
mod objstore;
mod ops;
mod read_path;
mod rois;
mod source;
mod state;
mod state_dir;
mod sys;
mod unread;
mod uploads;
mod upstream;
mod wire;

pub use catalog::tree::{MAX_LIMIT as CATALOG_TREE_MAX_LIMIT, TreeIndex};
pub use catalog::{Catalog, CatalogError, CatalogLimits, Snapshot};
pub use chunks::DEFAULT_SETTLE_WINDOW;
pub use content_version::{ContentVersion, FileVersion};
pub use grid::chunk_id::{ChunkId, ChunkIdError};
pub use grid::route::LoopbackPlans;
pub use grid::scaled::pyramid::PyramidPolicy;
pub use grid::scaled::{Method, Scale};
pub use grid::{
    ChunkGrid, DEFAULT_TARGET_CHUNK_BYTES, GridError, MAX_CHUNK_BYTES, Region, element_range,
};
pub use ops::config::{self, CacheKind, LogFormat, ServeArgs, Settings};
pub use ops::daemon::{Daemon, DaemonError};
pub use rois::db::StoredRoi;
pub use rois::rows;
pub use source::npy;
pub use source::registry::{OpenOptions, Registry};
