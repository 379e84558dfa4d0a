//! The refusals the wire makes itself, before any lower layer is asked: a request whose
//! arguments it cannot take ([`RequestError`], carrying the values it refused), and a
//! request for something Tessera does not serve ([`NotServed`]). Their texts are what
//! clients read, word for word (tests and docs/reference quote them); `crate::error`
//! gives each its gRPC status.
//!
//! Sources that are not `Clone` are held in an `Arc`: a [`crate::error::ServiceError`]
//! is shared by every waiter of one chunk's decode.

use std::sync::Arc;

use arrow_flight::error::FlightError;
use arrow_schema::ArrowError;
use tessera_proto::ProtoError;

use crate::grid::GridError;
use crate::grid::chunk_id::ChunkIdError;
use crate::grid::scaled::ScaleError;
use crate::rois::rows::RowsError;
use crate::uploads::PUT_FRAMING_SLACK;

/// The most bytes the endpoints of one plan may take encoded: 64 MiB, under the 80 MiB one
/// reply message may carry (the server's encoder limit), leaving room for the descriptor.
/// A plan over it is refused before any endpoint is made.
pub const MAX_PLAN_ENDPOINT_BYTES: u64 = 64 << 20;

/// A request refused for its arguments: malformed bodies, descriptors and tickets, slices
/// outside the tensor, plans or puts over their bounds.
#[derive(Clone, Debug, thiserror::Error)]
pub enum RequestError {
    /// A PATH descriptor with other than one element.
    #[error("a path descriptor must hold exactly one array id, this one holds {len}")]
    PathLength {
        /// How many elements it holds.
        len: usize,
    },
    /// A descriptor that is neither CMD nor PATH.
    #[error("flight descriptor has no type (neither CMD nor PATH)")]
    UntypedDescriptor,
    /// A CMD descriptor holding a bare array id where a `FlightRequest` belongs.
    #[error(
        "a CMD descriptor holds a serialized biopb FlightRequest, not an array id; to name a \
         tensor by id use a PATH descriptor: FlightDescriptor.for_path(\"{array_id}\") in \
         pyarrow (ListFlights lists them)"
    )]
    BareIdCommand {
        /// The id the command holds.
        array_id: String,
    },
    /// A CMD descriptor that is not a `FlightRequest`.
    #[error(
        "malformed GetFlightInfo command: {source}; a CMD descriptor holds a serialized biopb \
         FlightRequest (a PATH descriptor names a tensor by id)"
    )]
    MalformedCommand {
        /// Why it does not decode.
        #[source]
        source: Arc<ProtoError>,
    },
    /// ListFlights criteria other than none or `catalog`.
    #[error(
        "ListFlights criteria '{criteria}' is not understood: send none for the tensors, or \
         'catalog' for the catalog's tables (sources, tensors)"
    )]
    ListCriteria {
        /// The criteria, cut to its first 64 bytes.
        criteria: String,
    },
    /// A `slice_hint` with another number of bounds than the tensor has axes.
    #[error(
        "slice_hint of '{array_id}' has {starts} start and {stops} stop values, but the tensor \
         has {rank} axes"
    )]
    SliceRank {
        /// The tensor.
        array_id: String,
        /// How many start values were sent.
        starts: usize,
        /// How many stop values were sent.
        stops: usize,
        /// The tensor's rank.
        rank: usize,
    },
    /// A `slice_hint` whose bounds on one axis are reversed or outside the tensor.
    #[error("slice_hint of '{array_id}' on axis {axis} is [{start}, {stop}), outside [0, {dim}]")]
    SliceOutside {
        /// The tensor.
        array_id: String,
        /// The axis.
        axis: usize,
        /// The start sent.
        start: i64,
        /// The stop sent.
        stop: i64,
        /// The axis length.
        dim: u64,
    },
    /// A `slice_hint` the plan's grid refuses to snap.
    #[error("slice of '{array_id}': {source}")]
    Slice {
        /// The tensor.
        array_id: String,
        /// Why the grid refused it.
        #[source]
        source: GridError,
    },
    /// A realized region the plan's grid cannot cut into cells.
    #[error("region of '{array_id}': {source}")]
    Region {
        /// The tensor.
        array_id: String,
        /// Why the grid refused it.
        #[source]
        source: GridError,
    },
    /// A `scale_hint` / `reduction_method` pair refused for the tensor.
    #[error("read of '{array_id}' refused: {source}")]
    Scale {
        /// The tensor.
        array_id: String,
        /// Why the scale was refused.
        #[source]
        source: ScaleError,
    },
    /// A scaled read of a tensor served at full resolution only (an upload).
    #[error(
        "read of '{array_id}' refused: scaled reads (scale_hint) of {what} are not served; \
         read it at full resolution"
    )]
    ScaledFullOnly {
        /// The tensor.
        array_id: String,
        /// The kind of tensor, plural (`uploaded tensors`).
        what: &'static str,
    },
    /// A `precompute` read whose `scale_hint` matches none of the levels the source stores.
    #[error(
        "read of '{array_id}' refused: no precomputed level matches scale_hint {hint:?}; \
         the stored levels have the factors {levels:?}"
    )]
    NoNativeLevel {
        /// The tensor.
        array_id: String,
        /// The hint as sent.
        hint: Vec<i64>,
        /// The factors of each stored level.
        levels: Vec<Vec<u64>>,
    },
    /// A plan whose endpoints would not fit one reply ([`MAX_PLAN_ENDPOINT_BYTES`]).
    #[error(
        "the plan of '{array_id}' over [{start:?}, {stop:?}) has {count} chunks, about {bytes} \
         bytes of endpoints, over the {MAX_PLAN_ENDPOINT_BYTES} bytes one reply carries: plan a \
         slice (slice_hint) of at most {fit} chunks at a time"
    )]
    TooManyEndpoints {
        /// The tensor.
        array_id: String,
        /// The realized region's start.
        start: Vec<u64>,
        /// The realized region's stop.
        stop: Vec<u64>,
        /// How many chunks the plan has.
        count: u64,
        /// About how many bytes their endpoints take.
        bytes: u64,
        /// How many chunks one plan may have.
        fit: u64,
    },
    /// A ticket that does not decode.
    #[error("malformed ticket: {source}")]
    MalformedTicket {
        /// Why.
        #[source]
        source: Arc<ProtoError>,
    },
    /// The DoPut stream failed while it was read.
    #[error("DoPut stream failed: {source}")]
    PutStream {
        /// The stream's status.
        #[source]
        source: tonic::Status,
    },
    /// A DoPut with no message at all.
    #[error("DoPut stream ended before its first message")]
    PutEmpty,
    /// A DoPut whose first message has no descriptor.
    #[error("DoPut's first message has no flight descriptor: it must carry a PutCommand")]
    PutNoDescriptor,
    /// A DoPut whose descriptor does not decode as a `PutCommand`.
    #[error("DoPut descriptor command is not a PutCommand: {source}")]
    PutNotCommand {
        /// Why.
        #[source]
        source: prost::DecodeError,
    },
    /// A DoPut `PutCommand` naming no command.
    #[error("DoPut descriptor's PutCommand names no command (chunk_ticket, roi_put or roi_delete)")]
    PutNoCommand,
    /// A DoPut `chunk_ticket` that does not decode.
    #[error("DoPut chunk_ticket: {source}")]
    PutTicket {
        /// Why.
        #[source]
        source: Arc<ProtoError>,
    },
    /// A DoPut `chunk_ticket` of another kind than a chunk ticket.
    #[error(
        "DoPut chunk_ticket must be a chunk ticket (TensorTicket{{chunk_id}}) of the upload's plan"
    )]
    PutNotChunkTicket,
    /// A chunk DoPut whose first message is over [`PUT_FRAMING_SLACK`].
    #[error(
        "DoPut: the first message of a chunk of '{array_id}' is {bytes} bytes; it carries the \
         descriptor and the schema, at most {PUT_FRAMING_SLACK} bytes"
    )]
    PutFirstTooLarge {
        /// The upload.
        array_id: String,
        /// The first message's encoded length.
        bytes: u64,
    },
    /// A chunk DoPut over the bytes its cell can hold.
    #[error(
        "DoPut: the chunk of '{array_id}' is over {limit} bytes, more than its cell of \
         {elements} elements of '{dtype}' can hold"
    )]
    PutChunkTooLarge {
        /// The upload.
        array_id: String,
        /// The most bytes the chunk may take.
        limit: u64,
        /// The elements of its cell.
        elements: u64,
        /// The upload's dtype.
        dtype: String,
    },
    /// A chunk DoPut that is not a schema and record batches.
    #[error("DoPut: the chunk of '{array_id}' is not a schema and record batches: {source}")]
    PutNotBatches {
        /// The upload.
        array_id: String,
        /// Why it does not decode.
        #[source]
        source: Arc<ArrowError>,
    },
    /// An annotation call naming no tensor.
    #[error("{call} names no array_id: annotations belong to a tensor")]
    NoArrayId {
        /// The call (`roi_read`, `roi_put`, `roi_delete`).
        call: &'static str,
    },
    /// An annotation DoPut over its size limit, counted as received.
    #[error(
        "an annotation DoPut carries at most {max_mib} MiB (as sent); send the rows in several \
         puts"
    )]
    RoiPutTooLarge {
        /// The limit, in MiB.
        max_mib: usize,
    },
    /// An annotation DoPut whose stream does not decode.
    #[error("reading the annotation stream: {source}")]
    RoiStream {
        /// Why.
        #[source]
        source: Arc<FlightError>,
    },
    /// An annotation DoPut of more rows than a tensor may hold.
    #[error(
        "an annotation DoPut carries at most {max_rows} rows (max_rois_per_tensor); this one \
         carries more"
    )]
    RoiTooManyRows {
        /// The limit (`max_rois_per_tensor`).
        max_rows: u64,
    },
    /// Annotation rows that do not follow the ROI row schema.
    #[error(transparent)]
    RoiRows(#[from] RowsError),
    /// A `roi_prune` body that is not a `RoiPruneRequest`.
    #[error("roi_prune body is not a RoiPruneRequest: {source}")]
    RoiPruneBody {
        /// Why.
        #[source]
        source: prost::DecodeError,
    },
    /// A `catalog_children` body that is not `{key, limit}`.
    #[error(
        "catalog_children takes a JSON object {{\"key\": a string, \"limit\": a positive integer}}"
    )]
    CatalogChildrenBody,
    /// A `resolve` body that is not UTF-8.
    #[error("resolve takes a source id as UTF-8 text")]
    ResolveBody,
    /// An `add_source` body that is not an `AddSourceRequest`.
    #[error("malformed add_source request: {source}")]
    AddSourceBody {
        /// Why.
        #[source]
        source: prost::DecodeError,
    },
    /// An `add_source` of a kind of source other than `.npy`.
    #[error(
        "source_type '{source_type}' is not served by Tessera: it serves .npy files only (leave \
         it empty or 'npy')"
    )]
    SourceType {
        /// The kind asked for.
        source_type: String,
    },
    /// A `remove_source` body that is not a `RemoveSourceRequest`.
    #[error("malformed remove_source request: {source}")]
    RemoveSourceBody {
        /// Why.
        #[source]
        source: prost::DecodeError,
    },
    /// An `add_tensor` body that is not a `TensorDescriptor`.
    #[error("add_tensor takes a TensorDescriptor: {source}")]
    AddTensorBody {
        /// Why.
        #[source]
        source: prost::DecodeError,
    },
    /// A `set_upload_status` body that is not a `SetUploadStatus`.
    #[error("set_upload_status takes a SetUploadStatus: {source}")]
    SetUploadStatusBody {
        /// Why.
        #[source]
        source: prost::DecodeError,
    },
    /// A `set_upload_status` to a state an upload cannot be moved to.
    #[error("set_upload_status: {state} is not a state to move to (PENDING, READY or DISCARDED)")]
    UploadState {
        /// The wire value sent.
        state: i32,
    },
    /// A `chunk_locate` body that is not a ticket.
    #[error("malformed chunk_locate body: {source}")]
    ChunkLocateBody {
        /// Why.
        #[source]
        source: Arc<ProtoError>,
    },
    /// A `chunk_locate` of a ticket of another kind than a chunk ticket.
    #[error("chunk_locate takes a chunk ticket (TensorTicket{{chunk_id}})")]
    ChunkLocateTicket,
    /// A chunk ticket whose chunk id does not decode.
    #[error("malformed chunk ticket: {source}")]
    ChunkTicket {
        /// Why the chunk id does not decode.
        #[source]
        source: ChunkIdError,
    },
    /// A scaled chunk ticket whose factors do not fit its tensor.
    #[error("chunk ticket scale {factors:?} does not fit '{array_id}' of shape {shape:?}")]
    TicketScale {
        /// The ticket's factors.
        factors: Vec<u64>,
        /// The tensor.
        array_id: String,
        /// The tensor's shape.
        shape: Vec<u64>,
    },
    /// A scaled chunk ticket asking for the `area` mean of a bool tensor.
    #[error("chunk ticket of '{array_id}' asks for 'area' of a bool tensor, which is refused")]
    TicketAreaOfBool {
        /// The tensor.
        array_id: String,
    },
    /// A chunk ticket whose region is not a cell of any of the tensor's grids.
    #[error("chunk ticket region {start:?}..{stop:?} is not a chunk of '{array_id}'")]
    TicketNotACell {
        /// The region's first element.
        start: Vec<u64>,
        /// One past its last element.
        stop: Vec<u64>,
        /// The tensor.
        array_id: String,
    },
}

/// A well-formed request for something Tessera does not offer.
#[derive(Clone, Debug, thiserror::Error)]
pub enum NotServed {
    /// A ticket arm this server does not answer.
    #[error("ticket kind '{arm}' is not served by Tessera")]
    TicketKind {
        /// The arm's name.
        arm: String,
    },
    /// DoExchange.
    #[error("DoExchange is not supported by Tessera")]
    DoExchange,
    /// An action name this server does not know. The text must contain `Unknown action`
    /// so clients stop probing.
    #[error("Unknown action: {name}")]
    Action {
        /// The name sent.
        name: String,
    },
}
