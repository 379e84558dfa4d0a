//! The `roi` flight on the wire: DoGet of a `roi_read` ticket streams a tensor's
//! annotations as ROI rows; the `roi_put` and `roi_delete` DoPuts write them; the
//! `roi_prune` action drops those of tensors no longer served; every plan's descriptor
//! carries a sealed `roi_ticket`. The annotations themselves are [`crate::rois`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow_array::RecordBatch;
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::{FlightData, PutResult};
use arrow_ipc::writer::IpcWriteOptions;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use tessera_proto::image_pb::{RoiDeleteResult, RoiPruneRequest, RoiPruneResult, RoiUnseen};
use tessera_proto::pb::{RoiDelete, RoiPut, RoiRead, TensorTicket, tensor_ticket};
use tonic::{Status, Streaming};

use super::BoxStream;
use super::plan::version_bytes;
use crate::error::{Fault, RequestError, ServiceError, ServiceResult};
use crate::rois::{RoiError, rows};
use crate::source::registry::Tensor;
use crate::state::ServiceState;

/// The `roi_ticket` of plans of `tensor`: a `roi_read` of all its sets with a grant sealed
/// over its id and content version. Empty when this server keeps no annotations.
pub fn ticket(state: &ServiceState, tensor: &Tensor) -> Vec<u8> {
    let Ok(rois) = state.annotations() else {
        return Vec::new();
    };
    let grant = rois.grant(&tensor.array_id, &version_bytes(tensor.version));
    TensorTicket {
        payload: Some(tensor_ticket::Payload::RoiRead(RoiRead {
            array_id: tensor.array_id.clone(),
            set_name: String::new(),
            grant: Some(grant),
        })),
    }
    .encode_to_vec()
}

/// Runs `job` on the blocking pool (the store fsyncs).
async fn blocking<T: Send + 'static>(
    job: impl FnOnce() -> Result<T, RoiError> + Send + 'static,
) -> ServiceResult<T> {
    tokio::task::spawn_blocking(job)
        .await
        .map_err(|e| Fault::task("annotation task failed", e))?
        .map_err(ServiceError::from)
}

fn require_array_id(array_id: &str, call: &'static str) -> ServiceResult<()> {
    if array_id.is_empty() {
        return Err(RequestError::NoArrayId { call }.into());
    }
    Ok(())
}

/// The id annotations of `asked` are filed under: its tensor's own id when served (a
/// bare source id names its default tensor), else the id as asked (what an earlier write
/// left can still be listed and deleted).
fn filed_under(state: &ServiceState, asked: &str) -> (String, Option<Arc<Tensor>>) {
    match state.resolve(asked) {
        Ok(tensor) => (tensor.array_id.clone(), Some(tensor)),
        Err(_) => (asked.to_string(), None),
    }
}

/// The id annotations put on `asked` are filed under, and its source's url: the served
/// tensor's own (a source's or an upload's), else, as biopb checks only the source, the id
/// as asked under its served source (an array id the source does not serve yet).
fn put_target(state: &ServiceState, asked: &str) -> ServiceResult<(String, String)> {
    let refused = match state.read_path().tensor(asked) {
        Ok(tensor) => return Ok((tensor.array_id.clone(), tensor.source_url())),
        Err(refused) => refused,
    };
    match asked.split_once('/') {
        Some((source_id, _)) => match state.resolve(source_id) {
            Ok(source) => Ok((asked.to_string(), source.source_url())),
            Err(_) => Err(refused),
        },
        None => Err(refused),
    }
}

/// DoGet of a `roi_read`: the rows, with `truncated` and `sets` in the schema metadata, and
/// the bytes the reply holds until it is sent. A grant, when the ticket carries one, must be
/// this server's seal over the tensor as served now. Written with `options` (zstd buffers
/// or not).
pub async fn read(
    state: &ServiceState,
    read: RoiRead,
    options: IpcWriteOptions,
) -> ServiceResult<(BoxStream<FlightData>, u64)> {
    let rois = state.annotations()?;
    require_array_id(&read.array_id, "roi_read")?;
    let (array_id, tensor) = filed_under(state, &read.array_id);
    if let Some(grant) = &read.grant {
        let current = tensor.as_deref().map(|t| version_bytes(t.version));
        rois.check_grant(&read.array_id, grant, current.as_deref())?;
    }
    let set_name = read.set_name;
    let listed_id = array_id.clone();
    let listing = blocking(move || rois.list(&listed_id, &set_name)).await?;
    let schema = rows::schema(listing.truncated, &listing.sets);
    let batch = rows::to_batch(schema.clone(), &array_id, &listing.rois)
        .map_err(|e| ServiceError::from(Fault::encode("annotations", e)))?;
    drop(listing);
    let bytes = batch.get_array_memory_size() as u64;
    let stream = FlightDataEncoderBuilder::new()
        .with_options(options)
        .with_schema(schema)
        .build(futures::stream::iter([Ok(batch)]))
        .map_err(|e| Status::from(ServiceError::from(Fault::encode_stream("annotations", e))));
    Ok((Box::pin(stream), bytes))
}

/// Most bytes one annotation DoPut may carry, counted as received (every message's
/// header, body and metadata).
const MAX_PUT_BYTES: usize = 64 << 20;

/// The refusal of a DoPut of more than [`MAX_PUT_BYTES`].
fn put_too_large() -> ServiceError {
    RequestError::RoiPutTooLarge {
        max_mib: MAX_PUT_BYTES >> 20,
    }
    .into()
}

/// The bytes of one message as received.
fn received_bytes(data: &FlightData) -> usize {
    data.data_header.len() + data.data_body.len() + data.app_metadata.len()
}

/// The record batches of a DoPut, its first message included; refused past `max_rows`
/// rows or [`MAX_PUT_BYTES`] received. The bytes are counted as they arrive, before they
/// are decoded: a decoded batch's Arrow memory size counts whole shared buffers once per
/// batch, which made a 9.6 MB put look like 200 MB.
async fn batches(
    first: FlightData,
    rest: Streaming<FlightData>,
    max_rows: u64,
) -> ServiceResult<Vec<RecordBatch>> {
    let received = Arc::new(AtomicUsize::new(received_bytes(&first)));
    if received.load(Ordering::Relaxed) > MAX_PUT_BYTES {
        return Err(put_too_large());
    }
    let counter = Arc::clone(&received);
    let rest = rest.map_err(FlightError::from).and_then(move |data| {
        let total =
            counter.fetch_add(received_bytes(&data), Ordering::Relaxed) + received_bytes(&data);
        std::future::ready(if total > MAX_PUT_BYTES {
            Err(FlightError::ProtocolError(
                "the annotation DoPut is over its size limit".to_string(),
            ))
        } else {
            Ok(data)
        })
    });
    let data = futures::stream::once(async { Ok(first) }).chain(rest);
    let mut decoder = FlightRecordBatchStream::new_from_flight_data(data);
    let mut out = Vec::new();
    let mut rows = 0u64;
    while let Some(batch) = decoder.next().await {
        if received.load(Ordering::Relaxed) > MAX_PUT_BYTES {
            return Err(put_too_large());
        }
        let batch = batch.map_err(|e| RequestError::RoiStream {
            source: Arc::new(e),
        })?;
        rows += batch.num_rows() as u64;
        if rows > max_rows {
            return Err(RequestError::RoiTooManyRows { max_rows }.into());
        }
        out.push(batch);
    }
    Ok(out)
}

fn reply(app_metadata: Vec<u8>) -> BoxStream<PutResult> {
    Box::pin(futures::stream::iter([Ok(PutResult {
        app_metadata: Bytes::from(app_metadata),
    })]))
}

/// DoPut `roi_put`: creates or updates the streamed rows on a served tensor, in one
/// transaction; the reply's app_metadata is a `RoiPutResult`.
pub async fn put(
    state: &ServiceState,
    cmd: RoiPut,
    first: FlightData,
    rest: Streaming<FlightData>,
) -> ServiceResult<BoxStream<PutResult>> {
    let rois = state.annotations()?;
    require_array_id(&cmd.array_id, "roi_put")?;
    let (filed, source_url) = put_target(state, &cmd.array_id)?;
    let mut incoming = Vec::new();
    for batch in batches(first, rest, rois.limits().max_rois_per_tensor).await? {
        incoming.extend(rows::from_batch(&batch).map_err(RequestError::from)?);
    }
    let asked = cmd.array_id.clone();
    let result =
        blocking(move || rois.put(&filed, &asked, &source_url, incoming, cmd.check_rev)).await?;
    tracing::debug!(
        array_id = cmd.array_id,
        stored = result.stored.len(),
        conflicts = result.conflicts.len(),
        "roi_put"
    );
    Ok(reply(result.encode_to_vec()))
}

/// DoPut `roi_delete`: deletes the streamed ids, else a set, else every client-owned
/// annotation of the tensor; the reply's app_metadata is a `RoiDeleteResult`.
pub async fn delete(
    state: &ServiceState,
    cmd: RoiDelete,
    first: FlightData,
    rest: Streaming<FlightData>,
) -> ServiceResult<BoxStream<PutResult>> {
    let rois = state.annotations()?;
    require_array_id(&cmd.array_id, "roi_delete")?;
    let (array_id, _) = filed_under(state, &cmd.array_id);
    let mut ids = Vec::new();
    for batch in batches(first, rest, rois.limits().max_rois_per_tensor).await? {
        ids.extend(rows::ids_from_batch(&batch).map_err(RequestError::from)?);
    }
    let set_name = cmd.set_name;
    let deleted = blocking(move || rois.delete(&array_id, &ids, &set_name)).await?;
    Ok(reply(RoiDeleteResult { deleted }.encode_to_vec()))
}

/// Action `roi_prune`: reports (and with `apply` deletes) the annotations of tensors not
/// served for `unseen_days`.
pub async fn prune(state: &Arc<ServiceState>, body: &[u8]) -> ServiceResult<Bytes> {
    let request =
        RoiPruneRequest::decode(body).map_err(|source| RequestError::RoiPruneBody { source })?;
    let rois = state.annotations()?;
    let served_by = Arc::clone(state);
    let outcome = blocking(move || {
        rois.prune(request.unseen_days, request.apply, &|array_id| {
            served_by.resolve(array_id).ok().map(|t| t.source_url())
        })
    })
    .await?;
    let result = RoiPruneResult {
        unseen: outcome
            .unseen
            .into_iter()
            .map(|u| RoiUnseen {
                array_id: u.array_id,
                source_url: u.source_url,
                count: i64::try_from(u.count).unwrap_or(i64::MAX),
                last_seen_at_unix_ms: u.last_seen_ms,
            })
            .collect(),
        deleted: i32::try_from(outcome.deleted).unwrap_or(i32::MAX),
    };
    Ok(Bytes::from(result.encode_to_vec()))
}
