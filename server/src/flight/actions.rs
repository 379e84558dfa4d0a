//! Flight actions: `health`, `chunk_locate`, `cache_stats`.

use arrow_flight::ActionType;
use bytes::Bytes;
use tessera_proto::consts::{
    ACTION_CACHE_STATS, ACTION_CHUNK_LOCATE, ACTION_HEALTH, FLIGHT_PROTOCOL_VERSION,
    HEALTH_STATUS_SERVING, SERVER_NAME,
};
use tessera_proto::json::{ChunkLocateReply, Health};
use tessera_proto::ticket::{TicketPayload, decode_ticket};

use crate::error::{ServiceError, ServiceResult};
use crate::state::ServiceState;

/// The actions this server answers, for ListActions.
pub fn action_types() -> Vec<ActionType> {
    [
        (ACTION_HEALTH, "Server status and protocol version (JSON)."),
        (
            ACTION_CHUNK_LOCATE,
            "Where a chunk lives in a local segment file, for zero-copy mmap reads (JSON).",
        ),
        (ACTION_CACHE_STATS, "Chunk cache counters (JSON)."),
    ]
    .into_iter()
    .map(|(name, description)| ActionType {
        r#type: name.to_string(),
        description: description.to_string(),
    })
    .collect()
}

fn json(value: &impl serde::Serialize) -> ServiceResult<Bytes> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|e| ServiceError::Internal(format!("encoding JSON reply: {e}")))
}

/// Runs the action named `kind` with `body` and returns the one result body.
pub async fn run(state: &ServiceState, kind: &str, body: &[u8]) -> ServiceResult<Bytes> {
    match kind {
        ACTION_HEALTH => json(&health(state)),
        ACTION_CHUNK_LOCATE => json(&chunk_locate(state, body).await?),
        ACTION_CACHE_STATS => json(&cache_stats(state)),
        other => Err(ServiceError::UnknownAction(other.to_string())),
    }
}

/// The chunk cache's counters and what unread replies hold.
fn cache_stats(state: &ServiceState) -> tessera_proto::json::CacheStats {
    let pins = state.pins().stats();
    let mut stats = state.chunks().stats();
    stats.pinned_bytes = pins.held_bytes;
    stats.stalled_connections_closed = pins.closed_connections;
    stats
}

fn health(state: &ServiceState) -> Health {
    Health {
        status: HEALTH_STATUS_SERVING.to_string(),
        protocol: FLIGHT_PROTOCOL_VERSION,
        source_count: state.source_count() as u64,
        uptime_seconds: state.uptime().as_secs_f64(),
        writable: false,
        metadata_db_enabled: false,
        full_scan_in_progress: state.scan_status().in_progress(),
        last_full_scan_finished_at: state.scan_status().last_finished_at(),
        server: SERVER_NAME.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        external_location: None,
        cache_degraded: state.chunks().writes_paused(),
    }
}

async fn chunk_locate(state: &ServiceState, body: &[u8]) -> ServiceResult<ChunkLocateReply> {
    let chunk_id = match decode_ticket(body)
        .map_err(|e| ServiceError::InvalidArgument(format!("malformed chunk_locate body: {e}")))?
    {
        TicketPayload::ChunkId(id) => id,
        _ => {
            return Err(ServiceError::InvalidArgument(
                "chunk_locate takes a chunk ticket (TensorTicket{chunk_id})".to_string(),
            ));
        }
    };
    let (tensor, id) = state.resolve_chunk(&chunk_id)?;
    Ok(match state.chunks().locate(&tensor, &id).await? {
        Ok(location) => {
            state.metrics().record_located_bytes(location.byte_length);
            state.note_locate();
            ChunkLocateReply::located(
                location.segment_path.display().to_string(),
                location.byte_offset,
                location.byte_length,
                location.generation_id,
            )
        }
        Err(reason) => ChunkLocateReply::unavailable(reason),
    })
}
