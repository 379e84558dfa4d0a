//! Flight actions: `health`, `chunk_locate`, `cache_stats`, `catalog_children`,
//! `remove_source`, `roi_prune`, `add_tensor`, `set_upload_status` (one reply each) and
//! `resolve`, `add_source` (streamed replies).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use arrow_flight::ActionType;
use bytes::Bytes;
use prost::Message;
use tessera_proto::consts::{
    ACTION_ADD_SOURCE, ACTION_ADD_TENSOR, ACTION_CACHE_STATS, ACTION_CATALOG_CHILDREN,
    ACTION_CHUNK_LOCATE, ACTION_HEALTH, ACTION_REMOVE_SOURCE, ACTION_RESOLVE, ACTION_ROI_PRUNE,
    ACTION_SET_UPLOAD_STATUS, FLIGHT_PROTOCOL_VERSION, HEALTH_STATUS_SERVING, SERVER_NAME,
};
use tessera_proto::json::{ChunkLocateReply, Health};
use tessera_proto::pb::{
    AddSourceFailure, AddSourceProgress, AddSourceRequest, AddSourceResult, AddSourceStreamMessage,
    RemoveSourceRequest, RemoveSourceResult, ResolveProgress, ResolveStreamMessage,
    SetUploadStatus, TensorDescriptor, add_source_stream_message, resolve_stream_message,
};
use tessera_proto::ticket::{TicketPayload, decode_ticket};

use super::BoxStream;
use crate::catalog::tree::DEFAULT_LIMIT;
use crate::chunks::LocateOutcome;
use crate::error::{Fault, NotServed, RequestError, ServiceError, ServiceResult};
use crate::source::runtime::{self, AddReport, RuntimeError};
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
        (
            ACTION_CATALOG_CHILDREN,
            "One level of the catalog tree: JSON {key, limit} to {key, folders, sources, truncated}.",
        ),
        (
            ACTION_RESOLVE,
            "A source's `sources` row (streamed ResolveStreamMessage; .npy sources resolve at once).",
        ),
        (
            ACTION_ADD_SOURCE,
            "Serve a server path under add_source_roots at runtime (streamed AddSourceStreamMessage).",
        ),
        (
            ACTION_REMOVE_SOURCE,
            "Stop serving the runtime sources at or under a dnd:// url (RemoveSourceResult).",
        ),
        (
            ACTION_ROI_PRUNE,
            "Report (and with apply, delete) annotations of tensors not served for N days \
             (RoiPruneRequest to RoiPruneResult).",
        ),
        (
            ACTION_ADD_TENSOR,
            "Declare an upload cache://<source>/@fields/<name> (TensorDescriptor in and out; --writable).",
        ),
        (
            ACTION_SET_UPLOAD_STATUS,
            "Move an upload to READY or DISCARDED (SetUploadStatus to UploadStatus; --writable).",
        ),
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
        .map_err(|e| Fault::Json(Arc::new(e)).into())
}

/// What an action answers: one result body, or a stream of results.
pub enum Reply {
    /// The one result of `health`, `chunk_locate` and the other one-shot actions.
    One(Bytes),
    /// The results of `resolve` and `add_source`, streamed as they come.
    Stream(BoxStream<arrow_flight::Result>),
}

/// Runs the action named `kind` with `body`, for a peer on loopback or not (`loopback`).
pub async fn run(
    state: &Arc<ServiceState>,
    kind: &str,
    body: &[u8],
    loopback: bool,
) -> ServiceResult<Reply> {
    let one = match kind {
        ACTION_RESOLVE => return Ok(Reply::Stream(resolve(state, body)?)),
        ACTION_ADD_SOURCE => return Ok(Reply::Stream(add_source(state, body)?)),
        ACTION_HEALTH => json(&health(state)),
        ACTION_CHUNK_LOCATE => json(&chunk_locate(state, body, loopback).await?),
        ACTION_CACHE_STATS => json(&cache_stats(state)),
        ACTION_CATALOG_CHILDREN => json(&catalog_children(state, body)?),
        ACTION_REMOVE_SOURCE => remove_source(state, body),
        ACTION_ROI_PRUNE => super::roi::prune(state, body).await,
        ACTION_ADD_TENSOR => add_tensor(state, body),
        ACTION_SET_UPLOAD_STATUS => set_upload_status(state, body),
        other => Err(NotServed::Action {
            name: other.to_string(),
        }
        .into()),
    };
    one.map(Reply::One)
}

/// `{key, limit}`, both optional, to one level of the catalog tree.
fn catalog_children(
    state: &ServiceState,
    body: &[u8],
) -> ServiceResult<crate::catalog::tree::Level> {
    let bad = || ServiceError::from(RequestError::CatalogChildrenBody);
    let request: serde_json::Value = if body.is_empty() {
        serde_json::json!({})
    } else {
        serde_json::from_slice(body).map_err(|_| bad())?
    };
    let object = request.as_object().ok_or_else(bad)?;
    let key = match object.get("key") {
        None | Some(serde_json::Value::Null) => "",
        Some(serde_json::Value::String(key)) => key.as_str(),
        Some(_) => return Err(bad()),
    };
    let limit = match object.get("limit") {
        None | Some(serde_json::Value::Null) => DEFAULT_LIMIT,
        Some(value) => match value.as_u64() {
            Some(n) if n >= 1 => usize::try_from(n).unwrap_or(usize::MAX),
            _ => return Err(bad()),
        },
    };
    Ok(state.catalog_children(key, limit))
}

fn result(message: &impl Message) -> arrow_flight::Result {
    arrow_flight::Result::new(message.encode_to_vec())
}

/// The source's row, after one heartbeat naming what is resolved: a `.npy` source is
/// resolved as soon as it opens, so no other heartbeat is needed.
fn resolve(state: &ServiceState, body: &[u8]) -> ServiceResult<BoxStream<arrow_flight::Result>> {
    let started = Instant::now();
    let source_id = std::str::from_utf8(body).map_err(|_| RequestError::ResolveBody)?;
    let row = state
        .source_row(source_id)
        .map_err(ServiceError::into_value_error)?;
    let (target_name, target_bytes) = state
        .sources()
        .read()
        .get(source_id)
        .map(|t| {
            let path = t.source.path();
            let name = path.file_name().map_or_else(
                || source_id.to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            (name, i64::try_from(t.version.size()).unwrap_or(i64::MAX))
        })
        .unwrap_or_else(|| (source_id.to_string(), 0));
    let progress = ResolveStreamMessage {
        payload: Some(resolve_stream_message::Payload::Progress(ResolveProgress {
            elapsed_seconds: started.elapsed().as_secs_f64(),
            target_name,
            target_bytes,
        })),
    };
    let row = ResolveStreamMessage {
        payload: Some(resolve_stream_message::Payload::SourceRow(
            crate::wire::flight::catalog_query::ipc_stream(&row)?,
        )),
    };
    Ok(super::once(vec![result(&progress), result(&row)]))
}

/// How many progress messages may wait for a slow reader before the walk waits too.
const PROGRESS_QUEUE: usize = 16;

/// Checks the request at once (refusals are the call's status), then walks and registers
/// on a blocking thread, streaming progress; a closed stream stops the walk.
fn add_source(
    state: &Arc<ServiceState>,
    body: &[u8],
) -> ServiceResult<BoxStream<arrow_flight::Result>> {
    let request =
        AddSourceRequest::decode(body).map_err(|source| RequestError::AddSourceBody { source })?;
    if !matches!(request.source_type.as_str(), "" | "npy") {
        return Err(RequestError::SourceType {
            source_type: request.source_type,
        }
        .into());
    }
    if crate::objstore::is_object_store(&request.url) {
        return add_object_store(state, &request.url);
    }
    let plan = runtime::plan_add(state.runtime_roots(), &request.url)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<arrow_flight::Result>(PROGRESS_QUEUE);
    let worker_state = state.clone();
    tokio::task::spawn_blocking(move || {
        let report = plan.run(worker_state.sources(), |count, path| {
            let progress = AddSourceStreamMessage {
                payload: Some(add_source_stream_message::Payload::Progress(
                    AddSourceProgress {
                        added_count: i32::try_from(count).unwrap_or(i32::MAX),
                        current_path: path.display().to_string(),
                    },
                )),
            };
            tx.blocking_send(result(&progress)).is_ok()
        });
        // The client may have gone; what was registered stays registered.
        let _ = tx.blocking_send(finished(report));
        worker_state.catalog_tree();
    });
    Ok(replies(rx))
}

/// Adds the object-store address `url` (under `add_source_store_roots`, checked at once):
/// lists it on a blocking thread and answers one result, the ids it serves or refuses now.
fn add_object_store(
    state: &Arc<ServiceState>,
    url: &str,
) -> ServiceResult<BoxStream<arrow_flight::Result>> {
    let bucket = crate::objstore::runtime::plan_add(state.runtime_roots(), url)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<arrow_flight::Result>(1);
    let worker_state = state.clone();
    let url = url.to_string();
    tokio::task::spawn_blocking(move || {
        let sources = worker_state.sources();
        let held = |sources: &crate::source::sources::Sources| {
            let registry = sources.read();
            let served: BTreeSet<String> = registry.ids_by_path().into_values().collect();
            let refused: BTreeMap<String, String> = registry
                .refused()
                .map(|r| (r.source_id.clone(), r.reason.clone()))
                .collect();
            (served, refused)
        };
        let (served_before, refused_before) = held(sources);
        let limits = sources.open_options().limits;
        let mut report = AddReport::default();
        if let Err(err) = bucket.sync(sources, &limits) {
            report.failed.push((url.clone(), err.to_string()));
        }
        let (served, refused) = held(sources);
        report.added = served
            .difference(&served_before)
            .filter(|id| !refused.contains_key(*id))
            .cloned()
            .collect();
        report.removed = served_before.difference(&served).cloned().collect();
        report.failed.extend(
            refused
                .into_iter()
                .filter(|(id, _)| !refused_before.contains_key(id)),
        );
        let _ = tx.blocking_send(finished(report));
        worker_state.catalog_tree();
    });
    Ok(replies(rx))
}

/// The last message of an `add_source` stream: what was added, removed and refused.
fn finished(report: AddReport) -> arrow_flight::Result {
    result(&AddSourceStreamMessage {
        payload: Some(add_source_stream_message::Payload::Result(add_result(
            report,
        ))),
    })
}

/// The action's reply stream: the messages a worker sends, until it drops its sender.
fn replies(
    rx: tokio::sync::mpsc::Receiver<arrow_flight::Result>,
) -> BoxStream<arrow_flight::Result> {
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (Ok(item), rx))
    }))
}

fn add_result(report: AddReport) -> AddSourceResult {
    AddSourceResult {
        added: report.added,
        already_present: report.already_present,
        failed: report
            .failed
            .into_iter()
            .map(|(path, reason)| AddSourceFailure { path, reason })
            .collect(),
        refreshed: report.refreshed,
        removed: report.removed,
        skipped_offline: 0,
        skipped_cloud_dirs: 0,
    }
}

/// Declares an upload: the request's `TensorDescriptor` in, the server's out.
fn add_tensor(state: &ServiceState, body: &[u8]) -> ServiceResult<Bytes> {
    let request =
        TensorDescriptor::decode(body).map_err(|source| RequestError::AddTensorBody { source })?;
    Ok(Bytes::from(state.add_tensor(&request)?.encode_to_vec()))
}

/// Moves an upload along its ladder; an unset `UploadStatus` answers UNKNOWN.
fn set_upload_status(state: &ServiceState, body: &[u8]) -> ServiceResult<Bytes> {
    let request = SetUploadStatus::decode(body)
        .map_err(|source| RequestError::SetUploadStatusBody { source })?;
    let Some(to) = crate::uploads::State::from_wire(request.state) else {
        return Err(RequestError::UploadState {
            state: request.state,
        }
        .into());
    };
    let status = state.set_upload_status(&request.array_id, to, &request.reason)?;
    Ok(Bytes::from(status.unwrap_or_default().encode_to_vec()))
}

/// Removes the runtime sources at or under a `dnd://` url.
fn remove_source(state: &Arc<ServiceState>, body: &[u8]) -> ServiceResult<Bytes> {
    let request = RemoveSourceRequest::decode(body)
        .map_err(|source| RequestError::RemoveSourceBody { source })?;
    if state.runtime_roots().roots.is_empty() {
        return Err(RuntimeError::Disabled.into());
    }
    let removed = runtime::remove(state.sources(), &request.root_url)?;
    if !removed.is_empty() {
        let state = state.clone();
        tokio::task::spawn_blocking(move || state.catalog_tree());
    }
    Ok(Bytes::from(
        RemoveSourceResult {
            removed,
            failed: Vec::new(),
        }
        .encode_to_vec(),
    ))
}

/// The chunk cache's counters and what unread replies hold.
fn cache_stats(state: &ServiceState) -> tessera_proto::json::CacheStats {
    let pins = state.unread().stats();
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
        writable: state.writable(),
        // The catalog always answers queries (`catalog_query`, `catalog_children`).
        metadata_db_enabled: true,
        annotations_persisted: state.annotations().is_ok(),
        full_scan_in_progress: state.scan_status().in_progress(),
        last_full_scan_finished_at: state.scan_status().last_finished_at(),
        // Sources are registered before the port is bound and before `add_source`
        // answers: none is ever found and left to register later.
        registration_pending: 0,
        catalog_generation: Some(state.catalog_generation()),
        server: SERVER_NAME.to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        external_location: state.external_location().map(str::to_string),
        cache_degraded: state.chunks().writes_paused(),
    }
}

/// Where the chunk of `body`'s ticket lives in a segment file, for a peer on this machine.
/// A peer elsewhere (a replica behind a balancer, a client on another node) is sent to
/// DoGet before anything is decoded: the path would name a file it cannot see, or worse,
/// another file of the same name on its own machine (docs/decisions/0034).
async fn chunk_locate(
    state: &ServiceState,
    body: &[u8],
    loopback: bool,
) -> ServiceResult<ChunkLocateReply> {
    let chunk_id = match decode_ticket(body).map_err(|e| RequestError::ChunkLocateBody {
        source: Arc::new(e),
    })? {
        TicketPayload::ChunkId(id) => id,
        _ => return Err(RequestError::ChunkLocateTicket.into()),
    };
    if !loopback {
        return Ok(ChunkLocateReply::unavailable(
            "chunk_locate answers clients on this server's machine only (the call came from \
             another address, which cannot map this server's files): read the chunk with DoGet",
        ));
    }
    Ok(match state.read_path().locate_chunk(&chunk_id).await? {
        LocateOutcome::Located(location) => {
            state.metrics().record_located_bytes(location.byte_length);
            state.read_path().note_locate();
            ChunkLocateReply::located(
                location.segment_path.display().to_string(),
                location.byte_offset,
                location.byte_length,
                location.generation_id,
            )
        }
        LocateOutcome::UseDoGet(why) => ChunkLocateReply::unavailable(why.to_string()),
    })
}
