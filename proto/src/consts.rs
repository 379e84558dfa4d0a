//! Protocol constants shared by the server, the segment writer and the tests.
//!
//! Every value here is fixed by the `biopb==0.13.0` Python client (see
//! `docs/reference/biopb-protocol.md`); changing one breaks that client.

/// Flight protocol version Tessera speaks. Sent as `protocol` in the `health`
/// reply; the client accepts only 2 and 3 and refuses anything else.
pub const FLIGHT_PROTOCOL_VERSION: u32 = 3;

/// [`FLIGHT_PROTOCOL_VERSION`] as the UTF-8 string stamped into the plan
/// schema metadata under [`FLIGHT_PROTOCOL_KEY`].
pub const FLIGHT_PROTOCOL_VERSION_STR: &str = "3";

/// Chunk wire protocol version: the `data`/`shape`/`dtype` batch layout of
/// DoGet streams and segment files.
pub const CHUNK_WIRE_PROTOCOL_VERSION: u32 = 2;

/// [`CHUNK_WIRE_PROTOCOL_VERSION`] as the UTF-8 string stamped into the plan
/// schema metadata under [`CHUNK_WIRE_PROTOCOL_KEY`].
pub const CHUNK_WIRE_PROTOCOL_VERSION_STR: &str = "2";

/// Plan-schema metadata key for the chunk wire protocol. Required on every
/// GetFlightInfo schema; when it is missing the client reads version 1 and
/// refuses the plan.
pub const CHUNK_WIRE_PROTOCOL_KEY: &str = "chunk_wire_protocol";

/// Plan-schema metadata key for the Flight protocol. With value `"3"` it tells
/// the client that `FlightInfo.app_metadata` holds the echoed
/// `TensorReadOption` (v3) rather than a bare `SliceHint` (v2).
pub const FLIGHT_PROTOCOL_KEY: &str = "flight_protocol";

/// DoAction type of the health check. Every client calls it before anything
/// else; the JSON reply is [`crate::Health`].
pub const ACTION_HEALTH: &str = "health";

/// DoAction type of the localhost mmap fast path. The body is a chunk ticket;
/// the JSON reply is [`crate::ChunkLocateReply`].
pub const ACTION_CHUNK_LOCATE: &str = "chunk_locate";

/// DoAction type of the cache statistics call (`client.cache_stats()`); the
/// JSON reply is [`crate::CacheStats`].
pub const ACTION_CACHE_STATS: &str = "cache_stats";

/// DoAction type of one level of the catalog tree (`client.catalog_children`): JSON body
/// `{key, limit}`, JSON reply `{key, folders, sources, truncated}`.
pub const ACTION_CATALOG_CHILDREN: &str = "catalog_children";

/// DoAction type of `client.resolve_source`: the body is the source id; the reply streams
/// `ResolveStreamMessage`s, progress heartbeats then the source's `sources` row.
pub const ACTION_RESOLVE: &str = "resolve";

/// DoAction type of `client.register_local_path`: an `AddSourceRequest`; the reply streams
/// `AddSourceStreamMessage`s, progress then one `AddSourceResult`.
pub const ACTION_ADD_SOURCE: &str = "add_source";

/// DoAction type of `client.deregister_local_path`: a `RemoveSourceRequest`; the one reply
/// is a `RemoveSourceResult`.
pub const ACTION_REMOVE_SOURCE: &str = "remove_source";
/// DoAction type of `client.prune_rois`: a `RoiPruneRequest`; the one reply is a
/// `RoiPruneResult` (annotations of tensors not served for N days, deleted with `apply`).
pub const ACTION_ROI_PRUNE: &str = "roi_prune";

/// DoAction type of `client.setup_array_upload`: a `TensorDescriptor` declaring the tensor;
/// the one reply is the server's `TensorDescriptor` for it (grid, lifetime, status).
pub const ACTION_ADD_TENSOR: &str = "add_tensor";

/// DoAction type of `client.set_upload_status`: a `SetUploadStatus`; the one reply is the
/// `UploadStatus` (all unset for an id that is no upload).
pub const ACTION_SET_UPLOAD_STATUS: &str = "set_upload_status";

/// Prefix of the error text for an action the server does not know. The
/// client matches on "Unknown action" to stop probing `chunk_locate` and to
/// report other actions as "server too old".
pub const UNKNOWN_ACTION_PREFIX: &str = "Unknown action";

/// Chunk column holding the chunk's raw C-order bytes (Arrow `Binary`).
pub const COLUMN_DATA: &str = "data";

/// Chunk column holding the chunk's shape (Arrow `List<Int64>`).
pub const COLUMN_SHAPE: &str = "shape";

/// Chunk column holding the numpy dtype string (Arrow `Utf8`).
pub const COLUMN_DTYPE: &str = "dtype";

/// Largest chunk payload in bytes (64 MiB). The reference server never makes
/// a chunk bigger, and the client's per-thread connections only promise to
/// receive messages a little above it (80 MiB); exactly 64 MiB is allowed.
pub const MAX_CHUNK_BYTES: u64 = 67_108_864;

/// gRPC metadata key carrying the client's token, as `Bearer <token>`.
pub const AUTHORIZATION_HEADER: &str = "authorization";

/// Case-sensitive prefix in front of the token in [`AUTHORIZATION_HEADER`].
pub const BEARER_PREFIX: &str = "Bearer ";

/// `status` value of a `health` reply from a server ready to serve.
pub const HEALTH_STATUS_SERVING: &str = "SERVING";

/// `status` value of a `health` reply while the catalog is still being
/// scanned; `biopb.tensor.Connection` retries until it reads
/// [`HEALTH_STATUS_SERVING`].
pub const HEALTH_STATUS_STARTING: &str = "STARTING";

/// `server` value of a Tessera `health` reply.
pub const SERVER_NAME: &str = "tessera";

/// `format_version` of a located `chunk_locate` reply: the segment layout
/// (Arrow IPC stream, one single-row chunk batch per message).
pub const CHUNK_LOCATE_FORMAT_VERSION: u32 = 1;

/// Field-mask path asking GetFlightInfo for one endpoint per chunk.
pub const MASK_ENDPOINTS: &str = "endpoints";

/// Field-mask path asking for `TensorDescriptor.metadata_json`.
pub const MASK_METADATA_JSON: &str = "metadata_json";

/// Field-mask path asking for `TensorDescriptor.pyramid`.
pub const MASK_PYRAMID: &str = "pyramid";

/// Field-mask path asking for `TensorDescriptor.upload_status`.
pub const MASK_UPLOAD_STATUS: &str = "upload_status";

/// Field-mask path asking for `TensorDescriptor.is_resident`.
pub const MASK_IS_RESIDENT: &str = "is_resident";

/// Field-mask path asking for a stub plan; sent only when `health`
/// advertises `ticket_stubs`, which Tessera never does.
pub const MASK_TICKET_STUB: &str = "ticket_stub";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_forms_match_the_numbers() {
        assert_eq!(
            FLIGHT_PROTOCOL_VERSION.to_string(),
            FLIGHT_PROTOCOL_VERSION_STR
        );
        assert_eq!(
            CHUNK_WIRE_PROTOCOL_VERSION.to_string(),
            CHUNK_WIRE_PROTOCOL_VERSION_STR
        );
    }

    #[test]
    fn chunk_cap_is_64_mib() {
        assert_eq!(MAX_CHUNK_BYTES, 64 * 1024 * 1024);
    }
}
