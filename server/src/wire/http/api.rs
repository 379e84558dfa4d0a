//! The probes, `POST /api/slice`, `GET /api/tree` and `GET /api/rois/{array_id}`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::read::{self, Ask};
use super::tiles::{self, raw_response, resolve};
use super::{Api, HttpError, json_response};
use crate::catalog::tree::MAX_LIMIT;
use crate::state::ServiceState;

/// The `service` the probes name.
const SERVICE: &str = "tessera";
/// Folders and sources one tree level lists unless `?limit=` says otherwise.
const DEFAULT_TREE_LIMIT: usize = 2000;

fn now() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// `GET /livez`: the process answers.
pub async fn livez() -> Response {
    json_response(StatusCode::OK, &json!({"status": "ok", "timestamp": now()}))
}

/// `GET /readyz` (and `/healthz`): 200 once the first scan of the sources finished and the
/// service is serving, 503 before and from the moment a stop is requested (`"status":
/// "stopping"`, while in-flight calls finish).
pub async fn readyz(State(api): State<Arc<Api>>) -> Response {
    let state = &api.state;
    let stopping = state.is_stopping();
    let ready = state.scan_status().last_finished_at().is_some() && !stopping;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let word = match (ready, stopping) {
        (true, _) => "ok",
        (false, true) => "stopping",
        (false, false) => "degraded",
    };
    json_response(
        status,
        &json!({
            "status": word,
            "timestamp": now(),
            "ready": ready,
            "service": SERVICE,
            "version": env!("CARGO_PKG_VERSION"),
            "source_count": state.source_count(),
            "catalog_generation": state.catalog_generation(),
        }),
    )
}

/// The body of `POST /api/slice`.
#[derive(Debug, Deserialize)]
struct SliceRequest {
    array_id: Option<String>,
    #[serde(default)]
    slice_start: Vec<i64>,
    #[serde(default)]
    slice_stop: Vec<i64>,
    #[serde(default)]
    scale_hint: Option<Vec<i64>>,
    #[serde(default)]
    reduction_method: Option<String>,
    #[serde(default)]
    scale_policy: Option<String>,
}

/// `POST /api/slice`: `{array_id, slice_start, slice_stop, scale_hint, reduction_method}`
/// → the region's raw bytes, `X-Shape`, `X-Dtype`, `X-Dim-Labels`, `X-Scale-Hint`.
pub async fn slice(State(api): State<Arc<Api>>, headers: HeaderMap, body: Bytes) -> Response {
    match serve_slice(&api.state, &headers, &body).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    }
}

async fn serve_slice(
    state: &ServiceState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, HttpError> {
    let request: SliceRequest = serde_json::from_slice(body)
        .map_err(|e| HttpError::Invalid(format!("the slice request is not valid JSON: {e}")))?;
    let Some(array_id) = request.array_id else {
        return Err(HttpError::Invalid(
            "a slice request names its tensor by array_id".to_string(),
        ));
    };
    if let Some(policy) = request.scale_policy {
        return Err(HttpError::Invalid(format!(
            "scale_policy={policy:?} is not served by Tessera; give a scale_hint"
        )));
    }
    let (tensor, _) = resolve(state, &array_id)?;
    let shape = tensor.shape();
    let bound = |values: &[i64], name: &str, whole: &dyn Fn(usize) -> u64| {
        if values.is_empty() {
            return Ok((0..shape.len()).map(whole).collect::<Vec<u64>>());
        }
        values
            .iter()
            .map(|&v| {
                u64::try_from(v).map_err(|_| {
                    HttpError::Invalid(format!("{name} {values:?} has a negative bound"))
                })
            })
            .collect()
    };
    let start = bound(&request.slice_start, "slice_start", &|_| 0)?;
    let stop = bound(&request.slice_stop, "slice_stop", &|a| shape[a])?;
    let scale_hint = request.scale_hint.unwrap_or_default();
    let echoed = if scale_hint.is_empty() {
        vec![1; shape.len()]
    } else {
        scale_hint.clone()
    };
    let ask = Ask {
        start,
        stop,
        scale_hint,
        method: request.reduction_method.unwrap_or_default(),
    };
    let answer = read::read(state, tensor.clone(), &ask).await?;
    let codings = super::encoding::accepted(
        headers
            .get(header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    );
    let mut response = raw_response(&tensor, answer, &codings, None);
    let echoed = echoed
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    if let Ok(value) = HeaderValue::from_str(&echoed) {
        response.headers_mut().insert("x-scale-hint", value);
    }
    Ok(response)
}

/// `GET /api/tree?key=&limit=`: one level of the catalog tree, `{key, folders: [{name,
/// key}], sources: [{name, descriptor}], truncated}`, under an ETag of the body.
pub async fn tree(State(api): State<Arc<Api>>, uri: Uri, headers: HeaderMap) -> Response {
    let mut key = String::new();
    let mut limit = DEFAULT_TREE_LIMIT;
    for (k, v) in url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match k.as_ref() {
            "key" => key = v.into_owned(),
            "limit" => match v.parse::<usize>() {
                Ok(n) if n > 0 => limit = n.min(MAX_LIMIT),
                _ => {
                    return HttpError::Invalid(format!("limit={v} is not a positive integer"))
                        .into_response();
                }
            },
            _ => {}
        }
    }
    let state = api.state.clone();
    let level = tokio::task::spawn_blocking(move || {
        let level = state.catalog_children(&key, limit);
        let sources: Vec<serde_json::Value> = level
            .sources
            .iter()
            .map(|leaf| json!({"name": leaf.name, "descriptor": descriptor(&state, &leaf.source_id)}))
            .collect();
        json!({
            "key": level.key,
            "folders": level.folders.iter().map(|f| json!({"name": f.name, "key": f.key})).collect::<Vec<_>>(),
            "sources": sources,
            "truncated": level.truncated,
        })
    })
    .await;
    let body = match level {
        Ok(body) => body.to_string(),
        Err(e) => {
            return HttpError::Internal(format!("listing the tree failed: {e}")).into_response();
        }
    };
    let etag = format!(
        "\"{}\"",
        &tiles::hex(ring::digest::digest(&ring::digest::SHA256, body.as_bytes()).as_ref())[..32]
    );
    let held = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut response = if held {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    };
    if let Ok(value) = HeaderValue::from_str(&etag) {
        response.headers_mut().insert(header::ETAG, value);
    }
    response
}

/// A source's entry in a tree level: its id, url and default tensor.
fn descriptor(state: &ServiceState, source_id: &str) -> serde_json::Value {
    match state.resolve(source_id) {
        Ok(tensor) => json!({
            "source_id": source_id,
            "url": tensor.source_url(),
            "tensors": [{
                "array_id": tiles::versioned_id(&tensor),
                "dim_labels": tensor.dim_labels,
                "shape": tensor.shape(),
                "dtype": tensor.dtype_str(),
            }],
        }),
        Err(err) => json!({"source_id": source_id, "tensors": [], "error": err.to_string()}),
    }
}

/// `GET /api/rois/{array_id}?set=`: the tensor's annotations (every client-owned set, or
/// one), in proto3 JSON field names; the geometry as stored (canonical proto3 JSON of
/// `biopb.image.ROI`).
pub async fn rois(State(api): State<Arc<Api>>, Path(array_id): Path<String>, uri: Uri) -> Response {
    let set = url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .find(|(k, _)| k == "set")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    match list_rois(&api.state, &array_id, set).await {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(err) => err.into_response(),
    }
}

async fn list_rois(
    state: &ServiceState,
    asked: &str,
    set: String,
) -> Result<serde_json::Value, HttpError> {
    let rois = state
        .annotations()
        .map_err(|e| HttpError::NotOffered(e.to_string()))?;
    let (filed, shown) = match resolve(state, asked) {
        Ok((tensor, true)) => (tensor.array_id.clone(), tiles::versioned_id(&tensor)),
        Ok((tensor, false)) => (tensor.array_id.clone(), tensor.array_id.clone()),
        Err(HttpError::NotFound(text)) if asked.contains('@') => {
            return Err(HttpError::NotFound(text));
        }
        Err(_) => (asked.to_string(), asked.to_string()),
    };
    let listing = tokio::task::spawn_blocking(move || rois.list(&filed, &set))
        .await
        .map_err(|e| HttpError::Internal(format!("listing annotations failed: {e}")))?
        .map_err(|e| HttpError::from(crate::error::ServiceError::from(e)))?;
    let rows: Vec<serde_json::Value> = listing
        .rois
        .iter()
        .map(|(roi_id, r)| {
            let geometry: serde_json::Value =
                serde_json::from_str(&r.geometry).unwrap_or(serde_json::Value::Null);
            let plane: serde_json::Map<String, serde_json::Value> = r
                .plane
                .iter()
                .map(|(axis, index)| (axis.to_string(), json!(index)))
                .collect();
            json!({
                "arrayId": shown,
                "roiId": roi_id,
                "setName": r.set_name,
                "label": r.label,
                "shape": r.shape,
                "roi": geometry,
                "plane": plane,
                "propsJson": r.props_json,
                "rev": r.rev.to_string(),
                "createdMs": r.created_ms.to_string(),
                "updatedMs": r.updated_ms.to_string(),
            })
        })
        .collect();
    Ok(json!({
        "rois": rows,
        "truncated": listing.truncated,
        "sets": listing.sets.iter().map(|s| json!({"setName": s.set_name, "count": s.count.to_string()})).collect::<Vec<_>>(),
    }))
}
