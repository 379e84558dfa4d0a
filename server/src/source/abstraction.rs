//! The source abstraction: what every kind of source answers, so that the registry, the
//! plan and the request path never ask which kind they hold.
//!
//! A served tensor's bytes come from a [`Source`]: something that describes itself (shape,
//! dtype, its own axis labels, format metadata, how reads at other resolutions are answered,
//! its content version) and reads a region into a buffer it is given. `.npy` files
//! ([`NpyFile`](super::npy::NpyFile), `source/npy/source.rs`) and uploads
//! (`uploads/source.rs`) implement it, as do Zarr stores, TIFF files and the tensors of an
//! upstream tensor server (`upstream/source.rs`, outside this module: it speaks Flight).
//!
//! ```text
//!  registry / uploads ──▶ Tensor { source: Arc<dyn Source>, grids, labels, meta }
//!                                  │
//!   plan (flight/plan.rs) ─────────┤ describe: shape, dtype, version, scaling, metadata
//!   request path (read_path.rs) ───┤ held_chunks(): chunks the source keeps encoded?
//!                                  │   yes (an upload) ─▶ served as they are
//!                                  │   no             ─▶ the chunk service decodes:
//!   chunks/ ───────────────────────┘ settle, read_region (or byte_range: in-kernel copy),
//!                                    check_unchanged
//! ```
//!
//! Reads go into the caller's buffer (`&mut [u8]`, the chunk service's pooled buffer):
//! a format copies its bytes there once, and gathers there when its layout needs it. A
//! chunked format (Zarr) reads each native chunk the region touches and writes its part
//! of the region into the buffer; a format whose regions are byte ranges of a file says
//! so with [`Source::byte_range`], and the chunk service copies those inside the kernel.
//!
//! Errors are [`SourceError`]: a kind the request path acts on (changed: plan again; busy:
//! retry; refused: a bad request; failed) and the format's own typed error as its source.
//! Nothing here knows the wire (no tonic); `error.rs` maps the kinds once.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Map, Value};
use tessera_segments::Location;

use crate::content_version::ContentVersion;
use crate::grid::Region;
use crate::grid::chunk_id::ChunkId;
use crate::source::npy::Dtype;

/// Where a served tensor's bytes come from (see the module docs).
///
/// Implementations are opened once per content version and shared by every request
/// (`Arc<dyn Source>`); every method may run on several threads at once.
pub trait Source: Send + Sync + std::fmt::Debug {
    /// The format's name, as `metadata_json`'s `format` key says it (`"npy"`, `"upload"`).
    fn format(&self) -> &'static str;

    /// Where the source's bytes live: its file (a chunked format: its folder; an upload: its
    /// data directory).
    fn path(&self) -> &Path;

    /// The tensor's shape.
    fn shape(&self) -> &[u64];

    /// The element type, byte order included.
    fn dtype(&self) -> &Dtype;

    /// Whether the bytes are stored in Fortran order (first axis fastest): the grids are cut
    /// contiguity first, so along the axes that are contiguous on disk.
    fn fortran_order(&self) -> bool {
        false
    }

    /// The extent of the chunks the source stores and decodes whole (a Zarr store's chunks
    /// or shards): the grids are then cut in whole ones of them
    /// ([`ChunkGrid::fitted`](crate::grid::ChunkGrid::fitted)). `None`: any region reads
    /// alike (a `.npy` file).
    fn native_chunk(&self) -> Option<Vec<u64>> {
        None
    }

    /// Whether both grids are exactly the source's native chunks, never merged or cut: each
    /// chunk costs a fetch over a link (an upstream server's chunk), so a cell made of
    /// several, or a second grid over the same chunks, would fetch a chunk again for every
    /// cell that holds it. `false`: the grids are planned for their readers.
    fn cells_are_native(&self) -> bool {
        false
    }

    /// What the source's bytes are now (part of every chunk id).
    fn version(&self) -> ContentVersion;

    /// The source's own axis labels, when the format records them (an upload's, a Zarr
    /// image's); `None`: the configured or default labels apply.
    fn dim_labels(&self) -> Option<Vec<String>> {
        None
    }

    /// The format's own keys of `metadata_json`, after `format` (a `.npy` file's version
    /// and order). No server path: `source_url` says where a source is, as much as its
    /// origin lets it (a dropped folder's `dnd://` url does not name the server's folders).
    fn format_metadata(&self) -> Map<String, Value> {
        Map::new()
    }

    /// The size of one element along each axis and its unit (length units in µm), when the
    /// format records them (an OME-Zarr image's `scale`); configured or sidecar values win.
    fn physical_scale(&self) -> Option<(Vec<f64>, Vec<String>)> {
        None
    }

    /// How reads at other resolutions than the source's are answered.
    fn scaling(&self) -> Scaling {
        Scaling::Computed
    }

    /// A stored level (one of [`Scaling::Native`]'s, by its `path`) that is served under
    /// the source's id and the path (`<id>.<path>`) but is no source of its own on disk: an
    /// OME-TIFF's SubIFD levels. `None`: no such level, or the level is a source the
    /// registry serves itself (an OME-Zarr image's datasets).
    fn level(&self, _path: &str) -> Option<Arc<dyn Source>> {
        None
    }

    /// Whether the bytes are on this machine now (`is_resident`). One `stat` at most.
    fn is_resident(&self) -> bool {
        true
    }

    /// Whether reading a region waits on a network link rather than on this machine's
    /// CPU and disks (an upstream server's chunks): the chunk service then gives the read
    /// a permit of its larger pool of fetches (`upstream_fetches`), so more reads are in
    /// flight than there are cores (docs/decisions/0036).
    fn waits_on_link(&self) -> bool {
        false
    }

    /// Asks the operating system to start reading the files a later read of `start..stop`
    /// will touch, and returns at once: the chunk service calls it for cells a sequential
    /// reader will want after the ones being decoded, so their disk reads overlap those
    /// decodes. By default nothing (a `.npy` region is one kernel copy, read when it is).
    fn prefetch(&self, _start: &[u64], _stop: &[u64]) {}

    /// Reads the region `start..stop` (exclusive stop, per axis) into `out` in C order;
    /// `out` is exactly the region's bytes. Checks afterwards that the source is still the
    /// version it was opened at, so bytes of a changed source are never returned.
    fn read_region(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), SourceError>;

    /// The region's bytes as one byte range of a file, when they are one (a contiguous run
    /// of a C-order payload): the chunk service then copies them inside the kernel.
    /// `Ok(None)`: read the region instead.
    fn byte_range(&self, _region: &Region) -> Result<Option<ByteRange>, SourceError> {
        Ok(None)
    }

    /// Waits until the source is one complete version, the one opened (no writer, nothing
    /// touched within `window`), or refuses: [`SourceErrorKind::Changed`] or
    /// [`SourceErrorKind::Busy`]. Called before a chunk is decoded.
    fn settle(&self, _window: Duration) -> Result<(), SourceError> {
        Ok(())
    }

    /// Refuses with [`SourceErrorKind::Changed`] when the source is no longer the version
    /// it was opened at.
    fn check_unchanged(&self) -> Result<(), SourceError> {
        Ok(())
    }

    /// Refuses with [`SourceErrorKind::Busy`] while another process writes the source.
    fn check_no_writer(&self) -> Result<(), SourceError> {
        Ok(())
    }

    /// The chunks the source keeps encoded already (an upload's, as its client wrote them),
    /// served as they are; `None`: its chunks are decoded by the chunk service.
    fn held_chunks(&self) -> Option<&dyn HeldChunks> {
        None
    }

    /// The `upload_status` of a tensor clients write (`None`: not written by clients).
    fn upload_status(&self) -> Option<tessera_proto::pb::UploadStatus> {
        None
    }

    /// The lifetime granted to a tensor clients write.
    fn ttl_seconds(&self) -> Option<u32> {
        None
    }
}

/// How reads at other resolutions than the source's are answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scaling {
    /// Reduced from full resolution on demand (`scaled/`); plans advertise the pyramid
    /// policy's levels.
    Computed,
    /// The source stores its own levels (an OME-Zarr image's datasets): plans advertise
    /// them (`native: true`, `reduction_method` `precompute`), a `precompute` read of a
    /// level's factors reads that level, and other scaled reads are reduced on demand.
    Native {
        /// Every stored level, full resolution first.
        levels: Vec<NativeLevel>,
    },
    /// Refused; only full resolution is served. `what` names the kind of tensor in the
    /// refusal (`"uploaded tensors"`).
    FullOnly {
        /// The kind of tensor, plural.
        what: &'static str,
    },
}

/// One level a source stores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NativeLevel {
    /// Its path within the source (an OME-Zarr dataset's `path`); the level is served under
    /// the source's array id, a `.`, and this path with `/` as `.`.
    pub path: String,
    /// Its integer factor per axis against full resolution.
    pub factors: Vec<u64>,
    /// Its shape.
    pub shape: Vec<u64>,
}

/// A region's bytes as one byte range of an open file.
#[derive(Debug)]
pub struct ByteRange {
    /// The open file (never mapped: a file shrunk under a mapping kills the process).
    pub file: Arc<File>,
    /// Where the bytes start.
    pub offset: u64,
    /// How many bytes.
    pub len: u64,
}

/// Chunks a source keeps encoded (an upload's own store), each an Arrow IPC message.
/// Blocking: called on the blocking pool.
pub trait HeldChunks: Send + Sync {
    /// The IPC message of the chunk `id` names, after checking `id` names one of these
    /// chunks, readable now.
    fn read(&self, id: &ChunkId) -> Result<HeldChunk, SourceError>;

    /// Where the chunk `id` names lives in a segment file, or that it lives in none.
    fn locate(&self, id: &ChunkId) -> Result<HeldLocation, SourceError>;
}

/// Where a held chunk lives, for `chunk_locate`.
#[derive(Clone, Debug)]
pub enum HeldLocation {
    /// In this byte range of a segment file.
    Located(Location),
    /// In no file: the cell was never sent and reads as zeros (the client uses `do_get`).
    NeverSent,
}

/// One held chunk's IPC message.
#[derive(Clone, Debug)]
pub struct HeldChunk {
    /// The message header (flatbuffer).
    pub header: Bytes,
    /// The message body.
    pub body: Bytes,
}

/// What a request does about a failed source read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceErrorKind {
    /// The source changed since it was planned: plan the read again.
    Changed,
    /// The source is being written: retry once the write is done.
    Busy,
    /// The request asks for something the source does not serve (a bad ticket, an upload
    /// not readable yet).
    Refused,
    /// The bytes live on another server that cannot be reached now (an upstream tensor
    /// server, `upstream/`): UNAVAILABLE, naming it.
    Unreachable,
    /// Anything else (I/O, a corrupt source).
    Failed,
}

/// Why a source could not be read: what to do about it, and the format's own error.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct SourceError {
    kind: SourceErrorKind,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl SourceError {
    /// A failure of `kind`, caused by the format's `source` error.
    pub fn new(
        kind: SourceErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> SourceError {
        SourceError {
            kind,
            source: source.into(),
        }
    }

    /// What a request does about it.
    pub fn kind(&self) -> SourceErrorKind {
        self.kind
    }
}
