//! Shared fixture for end-to-end tests: a real Tessera server on `127.0.0.1:0`,
//! served on a tokio task and stopped through a oneshot, plus Flight helpers (plans, chunk
//! batches, actions, status details). The binary as a child process, Flight connections and
//! `.npy` fixtures come from `tessera-test-support`, re-exported here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod located;

pub use tessera_test_support::{
    connect, pattern, process, region_bytes, skip_unless_ci, write_npy, write_npy_ordered,
};

use std::net::SocketAddr;
use std::path::PathBuf;

use arrow_array::{Array, BinaryArray, RecordBatch, StringArray};
use arrow_flight::{Action, FlightClient, FlightDescriptor, FlightInfo, Ticket};
use futures::TryStreamExt;
use prost::Message;
use prost_types::FieldMask;
use tessera_proto::pb::{FlightRequest, SliceHint, TensorReadOption, flight_request};
use tessera_server::Daemon;
use tessera_server::LoopbackPlans;
use tessera_server::config::{Settings, Size};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The grid a scenario's plans are cut on (docs/decisions/0015): read scenarios run on
/// both (`on_both_grids!`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grid {
    /// The fine grid (`chunk_target`), which socket readers get; the coarse grid is off.
    Fine,
    /// The coarse grid clients that map get: loopback plans pinned to it
    /// (`loopback_plans = "mapped"`), its cells up to [`COARSE_FACTOR`] times the scenario's
    /// chunk target (the fine grid stays configured beside it, as in a daemon).
    Coarse,
}

impl Grid {
    /// The `chunk_target` that makes this grid's target `cell` bytes: scenarios that
    /// count chunks get the same cells on both grids.
    pub fn chunk_target_for(self, cell: u64) -> u64 {
        match self {
            Grid::Fine => cell,
            Grid::Coarse => cell / COARSE_FACTOR,
        }
    }

    /// `tessera serve` flags for a server process whose plans on this grid have a
    /// `cell`-byte target: `--chunk-target`, and on the coarse grid `--mapped-chunk-target`
    /// and `--loopback-plans mapped` (the harness's environment turns the coarse grid off).
    pub fn serve_flags(self, cell: u64) -> Vec<std::ffi::OsString> {
        let mut flags = vec![
            "--chunk-target".into(),
            self.chunk_target_for(cell).to_string().into(),
        ];
        if self == Grid::Coarse {
            flags.extend([
                "--mapped-chunk-target".into(),
                cell.to_string().into(),
                "--loopback-plans".into(),
                "mapped".into(),
            ]);
        }
        flags
    }
}

/// How many times larger the coarse grid's target is than the fine one in scenarios (the
/// daemon's defaults are 8 and 64 MiB; fixtures are small, so a smaller factor keeps
/// several coarse cells per tensor).
pub const COARSE_FACTOR: u64 = 4;

/// Runs each named scenario, an `async fn(Grid)`, as two tests, `NAME::fine` and
/// `NAME::coarse`, on a runtime of two worker threads (`workers = N;` first for another
/// count).
#[macro_export]
macro_rules! on_both_grids {
    (workers = $workers:literal; $($scenario:ident),+ $(,)?) => {$(
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = $workers)]
            async fn fine() {
                super::$scenario($crate::Grid::Fine).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = $workers)]
            async fn coarse() {
                super::$scenario($crate::Grid::Coarse).await
            }
        }
    )+};
    ($($scenario:ident),+ $(,)?) => {
        $crate::on_both_grids!(workers = 2; $($scenario),+);
    };
}

/// A running server and what it needs to stay alive.
pub struct TestServer {
    /// The bound address.
    pub addr: SocketAddr,
    /// The grid its loopback plans are cut on.
    pub grid: Grid,
    /// Its fine grid's chunk target.
    pub chunk_target: u64,
    /// The parent of the cache and state directories (removed when the server is dropped, unless
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

    /// Starts a server on `paths`, letting `configure` adjust the configuration; plans on
    /// the fine grid.
    pub async fn start_with(
        paths: Vec<PathBuf>,
        configure: impl FnOnce(&mut Settings),
    ) -> TestServer {
        Self::start_on(Grid::Fine, paths, configure).await
    }

    /// Starts a server on `paths` whose plans are cut on `grid`, letting `configure` adjust
    /// the configuration first (its `chunk_target` is the fine grid's).
    pub async fn start_on(
        grid: Grid,
        paths: Vec<PathBuf>,
        configure: impl FnOnce(&mut Settings),
    ) -> TestServer {
        let cache_dir = tempfile::tempdir().unwrap();
        let mut config = Settings::new(
            paths,
            "127.0.0.1:0".parse().unwrap(),
            cache_dir.path().join("cache"),
        );
        // A state directory of its own: a shared one would hand its lock and its book of
        // source ids to whichever server of a parallel run came first.
        config.writes.state_dir = cache_dir.path().join("state");
        // The fine grid alone, unless the scenario runs on the coarse grid of loopback reads
        // that map (docs/decisions/0015), set below once the scenario chose its target.
        config.chunks.mapped_chunk_target = Size::bytes(0);
        configure(&mut config);
        if grid == Grid::Coarse {
            config.chunks.mapped_chunk_target =
                Size::bytes((config.chunks.chunk_target.get() * COARSE_FACTOR).min(64 << 20));
            config.chunks.loopback_plans = LoopbackPlans::Mapped;
        }
        let chunk_target = config.chunks.chunk_target.get();
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
            grid,
            chunk_target,
            cache_dir: Some(cache_dir),
            metrics_addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Asserts that `info`'s plan is cut on this server's grid
    /// ([`assert_planned_on`]).
    pub fn assert_planned_on_its_grid(&self, info: &FlightInfo) {
        assert_planned_on(self.grid, self.chunk_target, info);
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

/// A GetFlightInfo descriptor for a downsampled read of `array_id` (`scale_hint`,
/// `reduction_method`), with the `endpoints` mask.
pub fn scaled_descriptor(array_id: &str, scale: &[i64], method: &str) -> FlightDescriptor {
    let request = FlightRequest {
        request: Some(flight_request::Request::TensorRead(TensorReadOption {
            array_id: array_id.to_string(),
            scale_hint: scale.to_vec(),
            reduction_method: method.to_string(),
            fields: Some(FieldMask {
                paths: vec!["endpoints".to_string()],
            }),
            ..Default::default()
        })),
    };
    FlightDescriptor::new_cmd(request.encode_to_vec())
}

/// Asserts that `info`'s plan is cut on `grid` of a server whose fine grid's target is
/// `chunk_target`: on the fine grid no cell holds more than the target; on the coarse grid
/// some cell does when the read does.
pub fn assert_planned_on(grid: Grid, chunk_target: u64, info: &FlightInfo) {
    let desc =
        tessera_proto::pb::TensorDescriptor::decode(info.flight_descriptor.clone().unwrap().cmd)
            .unwrap();
    let item: u64 = desc.dtype[2..].parse().unwrap();
    let read: u64 = desc.shape.iter().map(|&d| d as u64).product::<u64>() * item;
    let largest = endpoint_bounds(info)
        .iter()
        .map(|(start, stop, _)| {
            start
                .iter()
                .zip(stop)
                .map(|(a, b)| (b - a) as u64)
                .product::<u64>()
                * item
        })
        .max()
        .unwrap_or(0);
    match grid {
        Grid::Fine => assert!(
            largest <= chunk_target.max(item),
            "a fine plan has a {largest}-byte cell over the {} target",
            chunk_target
        ),
        Grid::Coarse => assert!(
            read <= chunk_target || largest > chunk_target,
            "a coarse plan of {read} bytes has no cell over the fine target {} \
             (largest {largest})",
            chunk_target
        ),
    }
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

/// The server's `cache_stats` answer.
pub async fn cache_stats(client: &mut FlightClient) -> serde_json::Value {
    action_json(client, "cache_stats", Vec::new()).await
}

/// Waits (up to 20 s) until the cache holds `entries` chunks, as background decodes land;
/// returns the stats of that moment.
pub async fn wait_for_entries(client: &mut FlightClient, entries: u64) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let stats = cache_stats(client).await;
        if stats["total_entries"] == entries {
            return stats;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "cache never reached {entries} entries: {stats}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Every FlightInfo ListFlights answers for an empty criteria.
pub async fn list_all_flights(client: &mut FlightClient) -> Vec<FlightInfo> {
    client
        .list_flights(bytes::Bytes::new())
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
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
