//! Shared fixture for end-to-end tests: a real Tessera server on `127.0.0.1:0`,
//! served on a tokio task and stopped through a oneshot, plus a Flight client
//! configured for 64 MiB chunks and helpers to write `.npy` files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod connect;
pub mod located;
pub mod process;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use arrow_array::{Array, BinaryArray, RecordBatch, StringArray};
use arrow_flight::{Action, FlightClient, FlightDescriptor, FlightInfo, Ticket};
use futures::TryStreamExt;
use prost::Message;
use prost_types::FieldMask;
use tessera_proto::pb::{FlightRequest, SliceHint, TensorReadOption, flight_request};
use tessera_server::config::ServeConfig;
use tessera_server::daemon::Daemon;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running server and what it needs to stay alive.
pub struct TestServer {
    /// The bound address.
    pub addr: SocketAddr,
    /// The cache directory's parent (removed when the server is dropped, unless
    /// [`TestServer::stop_keeping_cache`] took it).
    cache_dir: Option<tempfile::TempDir>,
    /// The `/metrics` address, when the configuration asked for one.
    pub metrics_addr: Option<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Starts a server on `paths` with default settings.
    pub async fn start(paths: Vec<PathBuf>) -> TestServer {
        Self::start_with(paths, |_| {}).await
    }

    /// Starts a server on `paths`, letting `configure` adjust the configuration.
    pub async fn start_with(
        paths: Vec<PathBuf>,
        configure: impl FnOnce(&mut ServeConfig),
    ) -> TestServer {
        let cache_dir = tempfile::tempdir().unwrap();
        let mut config = ServeConfig::new(
            paths,
            "127.0.0.1:0".parse().unwrap(),
            cache_dir.path().join("cache"),
        );
        configure(&mut config);
        let daemon = Daemon::bind(&config).await.expect("server starts");
        let addr = daemon.local_addr().unwrap();
        let metrics_addr = daemon.metrics_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            daemon
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .expect("server runs");
        });
        TestServer {
            addr,
            cache_dir: Some(cache_dir),
            metrics_addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// `grpc://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A Flight client with the decode limit raised above the 64 MiB chunk cap.
    pub async fn client(&self) -> FlightClient {
        connect::flight_client(self.url()).await
    }

    /// A client that sends `authorization: Bearer <token>`.
    pub async fn client_with_token(&self, token: &str) -> FlightClient {
        let mut client = self.client().await;
        client
            .add_header("authorization", &format!("Bearer {token}"))
            .unwrap();
        client
    }

    /// Stops the server and waits for it to finish.
    pub async fn stop(mut self) {
        self.shut_down().await;
    }

    /// Stops the server (sealing its segments) and hands over its cache directory's parent
    /// (the cache is its `cache` subdirectory), which would otherwise be deleted with the
    /// server, for inspection after the stop.
    pub async fn stop_keeping_cache(mut self) -> tempfile::TempDir {
        self.shut_down().await;
        self.cache_dir
            .take()
            .expect("the cache directory is kept until the server drops")
    }

    async fn shut_down(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Writes a C-order little-endian `.npy` (version 1.0) with `descr` and `shape`.
pub fn write_npy(path: &Path, descr: &str, shape: &[u64], data: &[u8]) {
    write_npy_ordered(path, descr, shape, false, data);
}

/// Writes a `.npy` with explicit order; `data` must already be in that order.
pub fn write_npy_ordered(path: &Path, descr: &str, shape: &[u64], fortran: bool, data: &[u8]) {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_text = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let fortran = if fortran { "True" } else { "False" };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape_text}, }}");
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::new();
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

/// Deterministic pseudo-random bytes (xorshift64*), so failures reproduce.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        out.extend_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A GetFlightInfo descriptor for `array_id`, with an optional slice and the `endpoints` mask.
pub fn read_descriptor(array_id: &str, slice: Option<(&[i64], &[i64])>) -> FlightDescriptor {
    let request = FlightRequest {
        request: Some(flight_request::Request::TensorRead(TensorReadOption {
            array_id: array_id.to_string(),
            slice_hint: slice.map(|(start, stop)| SliceHint {
                start: start.to_vec(),
                stop: stop.to_vec(),
            }),
            fields: Some(FieldMask {
                paths: vec!["endpoints".to_string()],
            }),
            ..Default::default()
        })),
    };
    FlightDescriptor::new_cmd(request.encode_to_vec())
}

/// Every record batch a do_get of `ticket` returns.
pub async fn fetch_batches(client: &mut FlightClient, ticket: Ticket) -> Vec<RecordBatch> {
    client
        .do_get(ticket)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// The one-row chunk batch a do_get returns.
pub async fn fetch_chunk(client: &mut FlightClient, ticket: Ticket) -> RecordBatch {
    let batches = fetch_batches(client, ticket).await;
    assert_eq!(batches.len(), 1, "exactly one batch per chunk");
    assert_eq!(batches[0].num_rows(), 1, "exactly one row per chunk");
    batches.into_iter().next().unwrap()
}

/// The raw `data` bytes, `shape` and `dtype` of a chunk batch.
pub fn chunk_parts(batch: &RecordBatch) -> (Vec<u8>, Vec<i64>, String) {
    let data = batch
        .column_by_name("data")
        .unwrap()
        .as_any()
        .downcast_ref::<BinaryArray>()
        .unwrap();
    assert_eq!(
        data.value_offsets()[0],
        0,
        "value starts at byte 0 of its buffer"
    );
    let shape_list = batch
        .column_by_name("shape")
        .unwrap()
        .as_any()
        .downcast_ref::<arrow_array::ListArray>()
        .unwrap();
    let shape_values = shape_list.value(0);
    let shape = shape_values
        .as_any()
        .downcast_ref::<arrow_array::Int64Array>()
        .unwrap()
        .values()
        .to_vec();
    let dtype = batch
        .column_by_name("dtype")
        .unwrap()
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap()
        .value(0)
        .to_string();
    (data.value(0).to_vec(), shape, dtype)
}

/// Runs an action and parses its single JSON result.
pub async fn action_json(
    client: &mut FlightClient,
    kind: &str,
    body: Vec<u8>,
) -> serde_json::Value {
    let results: Vec<bytes::Bytes> = client
        .do_action(Action::new(kind, body))
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    serde_json::from_slice(&results[0]).unwrap()
}

/// The C-order bytes of `region` of a C-order array of `shape` with `itemsize`.
pub fn region_bytes(
    data: &[u8],
    shape: &[u64],
    itemsize: usize,
    start: &[u64],
    stop: &[u64],
) -> Vec<u8> {
    let rank = shape.len();
    let mut out = Vec::new();
    let mut idx: Vec<u64> = start.to_vec();
    if start.iter().zip(stop).any(|(a, b)| a >= b) {
        return out;
    }
    let row = (stop[rank - 1] - start[rank - 1]) as usize * itemsize;
    loop {
        let mut offset = 0u64;
        for axis in 0..rank {
            offset = offset * shape[axis] + idx[axis];
        }
        let at = offset as usize * itemsize;
        out.extend_from_slice(&data[at..at + row]);
        // Advance all but the last axis, odometer style.
        let mut axis = rank - 1;
        loop {
            if axis == 0 {
                return out;
            }
            axis -= 1;
            idx[axis] += 1;
            if idx[axis] < stop[axis] {
                break;
            }
            idx[axis] = start[axis];
        }
    }
}

/// Decoded `ChunkBounds` of every endpoint of a plan, with its ticket.
pub fn endpoint_bounds(info: &FlightInfo) -> Vec<(Vec<i64>, Vec<i64>, Ticket)> {
    info.endpoint
        .iter()
        .map(|e| {
            let b = tessera_proto::pb::ChunkBounds::decode(e.app_metadata.clone()).unwrap();
            (b.start, b.stop, e.ticket.clone().unwrap())
        })
        .collect()
}

/// The chunks of a whole read of `array_id` as the server plans them: bounds and ticket.
pub async fn planned_chunks(
    client: &mut FlightClient,
    array_id: &str,
) -> Vec<(Vec<i64>, Vec<i64>, Ticket)> {
    let info = client
        .get_flight_info(read_descriptor(array_id, None))
        .await
        .unwrap();
    endpoint_bounds(&info)
}

/// The gRPC status inside a Flight client error (panics on any other kind of error).
pub fn status_of(err: arrow_flight::error::FlightError) -> tonic::Status {
    match err {
        arrow_flight::error::FlightError::Tonic(status) => *status,
        other => panic!("expected a gRPC status, got {other}"),
    }
}

/// The `extra_info` JSON carried in a status's details, if any.
pub fn extra_info(status: &tonic::Status) -> Option<serde_json::Value> {
    if status.details().is_empty() {
        None
    } else {
        serde_json::from_slice(status.details()).ok()
    }
}

/// Marks every element of each `[start, stop)` box in a grid of `shape` and
/// asserts that the boxes cover it exactly once.
pub fn assert_tiles(shape: &[u64], boxes: &[(Vec<i64>, Vec<i64>)]) {
    let total: u64 = shape.iter().product();
    let mut seen = vec![0u8; total as usize];
    for (start, stop) in boxes {
        let extent: Vec<u64> = start
            .iter()
            .zip(stop)
            .map(|(a, b)| (b - a) as u64)
            .collect();
        let count: u64 = extent.iter().product();
        for linear in 0..count {
            // Unravel `linear` inside the box, then ravel into the whole grid.
            let mut rest = linear;
            let mut offset = 0u64;
            let mut stride = 1u64;
            let mut coords = vec![0u64; shape.len()];
            for axis in (0..shape.len()).rev() {
                coords[axis] = rest % extent[axis] + start[axis] as u64;
                rest /= extent[axis];
            }
            for axis in (0..shape.len()).rev() {
                offset += coords[axis] * stride;
                stride *= shape[axis];
            }
            seen[offset as usize] += 1;
        }
    }
    assert!(
        seen.iter().all(|&c| c == 1),
        "chunks must tile the region exactly once"
    );
}

/// A scenario that cannot run on this machine: skipped with `reason` on a workstation,
/// a failure under CI (`CI=true`), where every scenario must run.
pub fn skip_unless_ci(reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("CI=true, so this scenario must run, but: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}
