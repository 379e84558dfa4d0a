//! `GET /api/tile_info/{array_id}` and `GET /api/tile/{array_id}`: a tensor as a grid of
//! square tiles per power-of-two level, in the sidecar's contract
//! (`http-server-tile-endpoints.md`). Level 0 is full resolution; level `L` reads the
//! plane at scale `2^L` on Y and X: from the source's stored level of that scale, else the
//! advertised computed level of that scale (the same scaled chunks a Flight reader of the
//! pyramid gets), else `nearest`; a source serving full resolution only is decimated here.
//! A tile's ETag names the tensor's content version, so a tile URL never revalidates to
//! other bytes; a URL carrying the version token (`source@token/field`) is `immutable`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::encoding::{self, Coding};
use super::read::{self, Ask};
use super::{Api, HttpError};
use crate::source::Scaling;
use crate::source::registry::Tensor;
use crate::state::ServiceState;
use crate::wire::flight::plan;

/// The tile edge aimed at when a chunk does not decide it.
const TARGET_EDGE: u64 = 512;
/// The deepest level served (a plane of 2^24 pixels a side still fits in one tile there).
const MAX_LEVEL: u32 = 24;
/// `Cache-Control` of a tile whose URL names its content version.
const IMMUTABLE: &str = "private, max-age=31536000, immutable";
/// `Cache-Control` of a tile addressed without its version: kept, but revalidated (its
/// ETag changes with the content).
const REVALIDATE: &str = "private, no-cache";

/// The axes a tile is: Y, X and a trailing RGB(A) samples axis, if there is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plane {
    /// The row axis.
    pub y: usize,
    /// The column axis.
    pub x: usize,
    /// The interleaved samples axis (last, 3 or 4 long, labelled `s`, `c`, `rgb` or `rgba`).
    pub s: Option<usize>,
}

impl Plane {
    /// The plane of a tensor of `shape` labelled `labels` (rank 2 or more): the last two
    /// axes, or the two before a trailing samples axis.
    pub fn of(labels: &[String], shape: &[u64]) -> Plane {
        let rank = shape.len();
        let samples = rank >= 3
            && matches!(shape[rank - 1], 3 | 4)
            && labels.get(rank - 1).is_some_and(|l| {
                matches!(l.to_ascii_lowercase().as_str(), "s" | "c" | "rgb" | "rgba")
            });
        let x = if samples { rank - 2 } else { rank - 1 };
        Plane {
            y: x - 1,
            x,
            s: samples.then_some(rank - 1),
        }
    }

    fn contains(&self, axis: usize) -> bool {
        axis == self.y || axis == self.x || Some(axis) == self.s
    }
}

/// One level of the tile grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Level {
    /// Its index (0: full resolution).
    pub level: u32,
    /// `2^level`.
    pub scale: u64,
    /// The plane's rows at this level.
    pub height: u64,
    /// The plane's columns at this level.
    pub width: u64,
    /// Tiles across.
    pub cols: u64,
    /// Tiles down.
    pub rows: u64,
}

/// The tile geometry of one tensor.
#[derive(Clone, Debug)]
pub struct Grid {
    /// The plane's axes.
    pub plane: Plane,
    /// The square tile edge in pixels.
    pub edge: u64,
    /// The levels, full resolution first, down to the one whose plane fits one tile.
    pub levels: Vec<Level>,
}

impl Grid {
    /// The tile grid of `tensor`: the edge nests in the socket grid's chunks (a power-of-two
    /// divisor of the chunk's plane near [`TARGET_EDGE`]) so a tile never straddles two.
    pub fn of(tensor: &Tensor) -> Result<Grid, HttpError> {
        let shape = tensor.shape();
        if shape.len() < 2 {
            return Err(HttpError::Invalid(format!(
                "'{}' is not tileable: its shape {shape:?} has no plane",
                tensor.array_id
            )));
        }
        let plane = Plane::of(&tensor.dim_labels, shape);
        let (height, width) = (shape[plane.y], shape[plane.x]);
        let chunk = tensor.grid.chunk_shape();
        let (cy, cx) = (chunk[plane.y], chunk[plane.x]);
        let largest = height.max(width).max(1);
        let edge = if cy >= height && cx >= width {
            TARGET_EDGE.min(largest)
        } else {
            let mut edge = cy.min(cx).max(1);
            while edge > TARGET_EDGE && edge % 2 == 0 {
                edge /= 2;
            }
            edge.min(largest)
        };
        let mut levels = Vec::new();
        for level in 0..=MAX_LEVEL {
            let scale = 1u64 << level;
            let (h, w) = (height.div_ceil(scale), width.div_ceil(scale));
            levels.push(Level {
                level,
                scale,
                height: h,
                width: w,
                cols: w.div_ceil(edge).max(1),
                rows: h.div_ceil(edge).max(1),
            });
            if h <= edge && w <= edge {
                break;
            }
        }
        Ok(Grid {
            plane,
            edge,
            levels,
        })
    }
}

/// The axes the `t`, `z` and `c` parameters name: the first axis of that label outside the
/// plane.
fn named_axes(labels: &[String], plane: &Plane) -> [(&'static str, Option<usize>); 3] {
    ["t", "z", "c"].map(|name| {
        let axis = labels
            .iter()
            .enumerate()
            .find(|(i, l)| !plane.contains(*i) && l.eq_ignore_ascii_case(name))
            .map(|(i, _)| i);
        (name, axis)
    })
}

/// The version token of a tensor's content: 8 hex digits of the SHA-256 of its content
/// version, which the HTTP-only array id `source@token[/field]` carries.
pub fn version_token(tensor: &Tensor) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, &plan::version_bytes(tensor.version));
    hex8(digest.as_ref())
}

fn hex8(bytes: &[u8]) -> String {
    bytes.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// `array_id` with the version token of its content spliced into its source half.
pub fn versioned_id(tensor: &Tensor) -> String {
    let token = version_token(tensor);
    match tensor.array_id.split_once('/') {
        Some((source, field)) => format!("{source}@{token}/{field}"),
        None => format!("{}@{token}", tensor.array_id),
    }
}

/// The tensor an array id names, and whether the id carried its (current) version token.
/// A superseded token is a 404 that names the id the content is served under now.
pub fn resolve(state: &ServiceState, asked: &str) -> Result<(Arc<Tensor>, bool), HttpError> {
    let (head, field) = match asked.split_once('/') {
        Some((head, field)) => (head, Some(field)),
        None => (asked, None),
    };
    let (source, token) = match head.split_once('@') {
        Some((source, token)) => (source, Some(token)),
        None => (head, None),
    };
    let bare = match field {
        Some(field) => format!("{source}/{field}"),
        None => source.to_string(),
    };
    let tensor = state.read_path().tensor(&bare)?;
    match token {
        None => Ok((tensor, false)),
        Some(token) if token == version_token(&tensor) => Ok((tensor, true)),
        Some(token) => Err(HttpError::NotFound(format!(
            "'{asked}' names version {token} of '{bare}', whose content has changed since; \
             it is served as '{}' now",
            versioned_id(&tensor)
        ))),
    }
}

/// numpy's name of a dtype (`uint16`), as the sidecar's `X-Dtype` has it.
pub fn dtype_name(tensor: &Tensor) -> String {
    let dtype = tensor.source.dtype();
    let bits = dtype.itemsize * 8;
    let code = dtype.numpy_str();
    match code.as_bytes().get(1) {
        Some(b'b') => "bool".to_string(),
        Some(b'u') => format!("uint{bits}"),
        Some(b'i') => format!("int{bits}"),
        Some(b'f') => format!("float{bits}"),
        Some(b'c') => format!("complex{bits}"),
        _ => code,
    }
}

/// `GET /api/tile_info/{array_id}`.
pub async fn tile_info(State(api): State<Arc<Api>>, Path(array_id): Path<String>) -> Response {
    match info(&api.state, &array_id) {
        Ok(body) => super::json_response(StatusCode::OK, &body),
        Err(err) => err.into_response(),
    }
}

fn info(state: &ServiceState, array_id: &str) -> Result<serde_json::Value, HttpError> {
    let (tensor, _) = resolve(state, array_id)?;
    let grid = Grid::of(&tensor)?;
    let shape = tensor.shape();
    let plane = grid.plane;
    let named = named_axes(&tensor.dim_labels, &plane);
    let sel_axes: Vec<serde_json::Value> = (0..shape.len())
        .filter(|&a| !plane.contains(a) && shape[a] > 1)
        .filter(|&a| named.iter().all(|(_, n)| *n != Some(a)))
        .map(|a| json!({"axis": a, "label": tensor.dim_labels.get(a), "size": shape[a]}))
        .collect();
    let pyramid: Vec<serde_json::Value> = plan::pyramid_levels(&tensor, state.pyramid())
        .into_iter()
        .map(|level| {
            json!({
                "scale_hint": level.scale_hint,
                "shape": level.shape,
                "reduction_method": level.reduction_method,
                "native": level.native,
            })
        })
        .collect();
    let levels: Vec<serde_json::Value> = grid
        .levels
        .iter()
        .map(|l| {
            json!({"level": l.level, "scale": l.scale, "height": l.height, "width": l.width,
                   "cols": l.cols, "rows": l.rows})
        })
        .collect();
    let selectable: serde_json::Map<String, serde_json::Value> = named
        .iter()
        .map(|(name, axis)| (name.to_string(), json!(axis)))
        .collect();
    Ok(json!({
        "array_id": versioned_id(&tensor),
        "dim_labels": tensor.dim_labels,
        "shape": shape,
        "chunk_shape": tensor.grid.chunk_shape(),
        "dtype": tensor.dtype_str(),
        "tile_size": grid.edge,
        "plane": {"y": plane.y, "x": plane.x, "s": plane.s},
        "selectable": selectable,
        "sel_axes": sel_axes,
        "levels": levels,
        "pyramid": pyramid,
        "volume": {
            "available": false,
            "reason": "Tessera's HTTP API reads volumes with /api/slice at a scale_hint; \
                       scale_policy is not served",
        },
        "physical_scale": tensor.meta.physical_scale,
        "physical_unit": tensor.meta.physical_unit,
    }))
}

/// The parameters of a tile request.
#[derive(Debug, Default)]
struct TileQuery {
    level: u32,
    col: u64,
    row: u64,
    named: [(&'static str, u64); 3],
    sel: Vec<(usize, u64)>,
    method: Option<String>,
    fmt: Option<String>,
}

fn parse_query(uri: &Uri) -> Result<TileQuery, HttpError> {
    let mut q = TileQuery {
        named: [("t", 0), ("z", 0), ("c", 0)],
        ..Default::default()
    };
    let number = |key: &str, value: &str| {
        value
            .parse::<u64>()
            .map_err(|_| HttpError::Invalid(format!("{key}={value} is not a non-negative integer")))
    };
    for (key, value) in url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match key.as_ref() {
            "level" => {
                let level = number("level", &value)?;
                q.level = u32::try_from(level)
                    .ok()
                    .filter(|&l| l <= MAX_LEVEL)
                    .ok_or_else(|| HttpError::NotFound(format!("level {level} does not exist")))?;
            }
            "col" => q.col = number("col", &value)?,
            "row" => q.row = number("row", &value)?,
            "t" | "z" | "c" => {
                let n = number(&key, &value)?;
                if let Some(slot) = q.named.iter_mut().find(|(k, _)| *k == key) {
                    slot.1 = n;
                }
            }
            "sel" => {
                let (axis, index) = value
                    .split_once(':')
                    .ok_or_else(|| HttpError::Invalid(format!("sel={value} is not AXIS:INDEX")))?;
                q.sel.push((
                    number("sel axis", axis)? as usize,
                    number("sel index", index)?,
                ));
            }
            "reduction_method" => q.method = Some(value.into_owned()),
            "fmt" => q.fmt = Some(value.into_owned()),
            _ => {}
        }
    }
    Ok(q)
}

/// The index chosen on every axis outside the plane: `t`/`z`/`c` where the labels name
/// the axis, `sel` where they do not, 0 elsewhere; each checked against its axis.
fn selection(
    tensor: &Tensor,
    plane: &Plane,
    q: &TileQuery,
) -> Result<Vec<(usize, u64)>, HttpError> {
    let shape = tensor.shape();
    let named = named_axes(&tensor.dim_labels, plane);
    let mut chosen: Vec<Option<u64>> = vec![None; shape.len()];
    for ((name, axis), (_, index)) in named.iter().zip(&q.named) {
        match axis {
            Some(axis) => chosen[*axis] = Some(*index),
            None if *index != 0 => {
                return Err(HttpError::Invalid(format!(
                    "{name}={index}: '{}' has no {name} axis (its axes are {:?})",
                    tensor.array_id, tensor.dim_labels
                )));
            }
            None => {}
        }
    }
    for &(axis, index) in &q.sel {
        let free = axis < shape.len()
            && !plane.contains(axis)
            && named.iter().all(|(_, n)| *n != Some(axis));
        if !free || q.sel.iter().filter(|(a, _)| *a == axis).count() > 1 {
            return Err(HttpError::Invalid(format!(
                "sel={axis}:{index}: axis {axis} is not one sel may choose on '{}' (it must \
                 exist, lie outside the plane, not be named by t/z/c, and be chosen once)",
                tensor.array_id
            )));
        }
        chosen[axis] = Some(index);
    }
    let mut out = Vec::new();
    for (axis, &dim) in shape.iter().enumerate() {
        if plane.contains(axis) {
            continue;
        }
        let index = chosen[axis].unwrap_or(0);
        if index >= dim {
            return Err(HttpError::Invalid(format!(
                "index {index} on axis {axis} ({}) of '{}' is outside its {dim} elements",
                tensor.dim_labels.get(axis).map_or("", String::as_str),
                tensor.array_id
            )));
        }
        out.push((axis, index));
    }
    Ok(out)
}

/// How a level is read: the scale hint and method sent down the request path, and the
/// decimation left to do here.
fn level_read(
    state: &ServiceState,
    tensor: &Tensor,
    plane: &Plane,
    scale: u64,
) -> (Vec<i64>, String, u64) {
    if scale == 1 {
        return (Vec::new(), String::new(), 1);
    }
    let mut hint = vec![1u64; tensor.shape().len()];
    hint[plane.y] = scale;
    hint[plane.x] = scale;
    let as_i64 = hint.iter().map(|&f| f as i64).collect();
    match tensor.source.scaling() {
        Scaling::FullOnly { .. } => (Vec::new(), String::new(), scale),
        Scaling::Native { levels } if levels.iter().any(|l| l.factors == hint) => {
            (as_i64, "precompute".to_string(), 1)
        }
        Scaling::Computed
            if state
                .pyramid()
                .levels(tensor.shape(), &tensor.dim_labels)
                .contains(&hint) =>
        {
            (as_i64, state.pyramid().method().name().to_string(), 1)
        }
        _ => (as_i64, "nearest".to_string(), 1),
    }
}

/// `GET /api/tile/{array_id}?level=&col=&row=&t=&z=&c=&sel=`.
pub async fn tile(
    State(api): State<Arc<Api>>,
    Path(array_id): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    match serve_tile(&api.state, &array_id, &uri, &headers).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    }
}

async fn serve_tile(
    state: &ServiceState,
    array_id: &str,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Response, HttpError> {
    let q = parse_query(uri)?;
    if let Some(fmt) = q.fmt.as_deref().filter(|f| *f != "raw") {
        return Err(HttpError::Gone(format!(
            "fmt={fmt}: tiles are served raw only; apply contrast and colour in the client"
        )));
    }
    if let Some(method) = q
        .method
        .as_deref()
        .filter(|m| !matches!(*m, "" | "nearest" | "decimate"))
    {
        return Err(HttpError::Gone(format!(
            "reduction_method={method} on a tile: tiles are read from the server's pyramid; \
             use POST /api/slice to choose a reduction"
        )));
    }
    let (tensor, versioned) = resolve(state, array_id)?;
    let grid = Grid::of(&tensor)?;
    let level = grid.levels.get(q.level as usize).copied().ok_or_else(|| {
        HttpError::NotFound(format!(
            "level {} does not exist ('{}' has {}: 0..{})",
            q.level,
            tensor.array_id,
            grid.levels.len(),
            grid.levels.len() - 1
        ))
    })?;
    if q.col >= level.cols || q.row >= level.rows {
        return Err(HttpError::NotFound(format!(
            "tile ({},{}) is outside level {} ({}x{} tiles)",
            q.col, q.row, level.level, level.cols, level.rows
        )));
    }
    let chosen = selection(&tensor, &grid.plane, &q)?;
    let (scale_hint, method, residual) = level_read(state, &tensor, &grid.plane, level.scale);
    let identity = format!(
        "{}|{}|{}|{}|{}|{:?}|{}|{}",
        tensor.array_id,
        hex(&plan::version_bytes(tensor.version)),
        level.level,
        q.col,
        q.row,
        chosen,
        grid.edge,
        method
    );
    let etag = hex(ring::digest::digest(&ring::digest::SHA256, identity.as_bytes()).as_ref())[..32]
        .to_string();
    let codings = encoding::accepted(
        headers
            .get(header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok()),
    );
    let cache_control = if versioned { IMMUTABLE } else { REVALIDATE };
    let mut common = HeaderMap::new();
    common.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(cache_control),
    );
    common.insert(
        header::VARY,
        HeaderValue::from_static("Authorization, Accept-Encoding"),
    );
    for (name, value) in [
        ("x-tile-size", grid.edge.to_string()),
        ("x-tile-level", level.level.to_string()),
        ("x-tile-col", q.col.to_string()),
        ("x-tile-row", q.row.to_string()),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            common.insert(name, value);
        }
    }
    if let Some(held) = matching_etag(headers, &etag) {
        let mut response = StatusCode::NOT_MODIFIED.into_response();
        response.headers_mut().extend(common);
        if let Ok(value) = HeaderValue::from_str(&held) {
            response.headers_mut().insert(header::ETAG, value);
        }
        return Ok(response);
    }
    let step = level.scale * grid.edge;
    let shape = tensor.shape();
    let mut start: Vec<u64> = vec![0; shape.len()];
    let mut stop: Vec<u64> = shape.to_vec();
    let (y, x) = (grid.plane.y, grid.plane.x);
    start[y] = q.row * step;
    stop[y] = (start[y] + step).min(shape[y]);
    start[x] = q.col * step;
    stop[x] = (start[x] + step).min(shape[x]);
    for &(axis, index) in &chosen {
        start[axis] = index;
        stop[axis] = index + 1;
    }
    let ask = Ask {
        start,
        stop,
        scale_hint,
        method,
    };
    let mut answer = read::read(state, tensor.clone(), &ask).await?;
    if residual > 1 {
        let mut steps = vec![1u64; shape.len()];
        steps[y] = residual;
        steps[x] = residual;
        let (bytes, shape) = read::subsample(
            &answer.bytes,
            &answer.shape,
            &steps,
            tensor.source.dtype().itemsize,
        );
        answer = read::Answer { bytes, shape };
    }
    let mut response = raw_response(&tensor, answer, &codings, Some(&etag));
    response.headers_mut().extend(common);
    Ok(response)
}

/// The ETag of the representation `If-None-Match` holds, if it names this tile (any of its
/// encodings).
fn matching_etag(headers: &HeaderMap, etag: &str) -> Option<String> {
    let held = headers.get(header::IF_NONE_MATCH)?.to_str().ok()?;
    held.split(',')
        .map(str::trim)
        .find(|tag| {
            let bare = tag.trim_start_matches("W/").trim_matches('"');
            bare == etag
                || bare
                    .strip_prefix(etag)
                    .is_some_and(|rest| rest.starts_with('-'))
        })
        .map(str::to_string)
}

/// Raw bytes with the sidecar's headers (`X-Shape`, `X-Dtype`, `X-Dim-Labels`), encoded
/// when the client accepts an encoding that pays; `etag` gets the coding appended, since
/// each encoding is its own representation.
pub fn raw_response(
    tensor: &Tensor,
    answer: read::Answer,
    codings: &[Coding],
    etag: Option<&str>,
) -> Response {
    let shape = answer
        .shape
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let encoded = encoding::encode(&answer.bytes, codings);
    let (coding, body) = match encoded {
        Some((coding, bytes)) => (Some(coding), bytes),
        None => (None, answer.bytes),
    };
    let mut response = (StatusCode::OK, body).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    for (name, value) in [
        ("x-shape", shape),
        ("x-dtype", dtype_name(tensor)),
        ("x-dim-labels", tensor.dim_labels.join(",")),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            h.insert(name, value);
        }
    }
    if let Some(coding) = coding {
        h.insert(
            header::CONTENT_ENCODING,
            HeaderValue::from_static(coding.name()),
        );
    }
    if let Some(etag) = etag {
        let tag = match coding {
            Some(coding) => format!("\"{etag}-{}\"", coding.name()),
            None => format!("\"{etag}\""),
        };
        if let Ok(value) = HeaderValue::from_str(&tag) {
            h.insert(header::ETAG, value);
        }
    }
    response
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn labels(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_plane_is_the_last_two_axes_or_the_two_before_trailing_samples() {
        let p = Plane::of(&labels(&["z", "y", "x"]), &[5, 64, 64]);
        assert_eq!((p.y, p.x, p.s), (1, 2, None));
        let p = Plane::of(&labels(&["y", "x", "c"]), &[64, 64, 3]);
        assert_eq!((p.y, p.x, p.s), (0, 1, Some(2)));
        // Three channels first are a stack, not colour.
        let p = Plane::of(&labels(&["c", "y", "x"]), &[3, 64, 64]);
        assert_eq!((p.y, p.x, p.s), (1, 2, None));
    }

    #[test]
    fn an_etag_matches_its_encoded_representations_only() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::IF_NONE_MATCH,
            HeaderValue::from_static("\"abc-zstd\""),
        );
        assert_eq!(
            matching_etag(&headers, "abc").as_deref(),
            Some("\"abc-zstd\"")
        );
        assert!(matching_etag(&headers, "ab").is_none());
    }
}
