//! The Arrow Flight service speaking the biopb tensor protocol (Flight protocol 3,
//! chunk wire protocol 2).
//!
//! ```text
//!  client                                   Tessera
//!    │ DoAction health ───────────────────────▶ {"protocol":3,"status":"SERVING",…}
//!    │ GetFlightInfo CMD FlightRequest{tensor_read} ─▶ plan: schema stamped
//!    │                                          │  chunk_wire_protocol=2, flight_protocol=3;
//!    │ ◀──────────── FlightInfo ────────────────┘  one endpoint per chunk (ticket + bounds)
//!    │
//!    │ loopback:  DoAction chunk_locate(ticket) ─▶ decode+append if cold, then
//!    │ ◀───────── {segment_path, byte_offset, byte_length, generation_id}
//!    │            client mmaps the segment and reads the IPC message in place
//!    │
//!    │ otherwise: DoGet(ticket) ──────────────▶ decode+append if cold, then
//!    │ ◀───────── schema message, one record batch (slices of the mapped segment)
//! ```

pub mod actions;
pub mod auth;
pub mod chunk_get;
pub mod plan;

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
    flight_descriptor::DescriptorType,
};
use futures::Stream;
use parking_lot::RwLock;
use prost::Message;
use tessera_proto::pb::TensorReadOption;
use tessera_proto::ticket::decode_flight_request;
use tonic::{Request, Response, Status, Streaming};

use crate::catalog::{self, Catalog, CatalogLimits};
use crate::chunk_id::{ChunkId, MAX_ARRAY_ID_BYTES};
use crate::chunks::{ChunkService, EncodedChunk};
use crate::error::{ServiceError, ServiceResult};
use crate::metrics::Metrics;
use crate::pins::{PinLimits, Pins};
use crate::source::registry::{OpenOptions, Refused, Registry, Tensor, identity_at};
use crate::source::watch::ScanStatus;

/// A boxed response stream.
type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Everything the service shares between calls.
pub struct ServiceState {
    registry: RwLock<Registry>,
    open_options: OpenOptions,
    chunks: Arc<ChunkService>,
    started: Instant,
    scan: ScanStatus,
    catalog: Catalog,
    pins: Arc<Pins>,
    metrics: Metrics,
}

impl ServiceState {
    /// State over an already scanned registry.
    pub fn new(registry: Registry, open_options: OpenOptions, chunks: Arc<ChunkService>) -> Self {
        Self {
            registry: RwLock::new(registry),
            open_options,
            chunks,
            started: Instant::now(),
            scan: ScanStatus::default(),
            catalog: Catalog::new(CatalogLimits::default()),
            pins: Pins::new(PinLimits::default()),
            metrics: Metrics::default(),
        }
    }

    /// Sets the caps on bytes held by unread chunk replies (defaults: [`PinLimits::default`]).
    pub fn with_pin_limits(mut self, limits: PinLimits) -> Self {
        self.pins = Pins::new(limits);
        self
    }

    /// Records served bytes in `metrics` (by default in a handle of its own, which nobody
    /// scrapes); the daemon passes the one it serves on `/metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The metrics this service records into.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The ledger of bytes held by unread chunk replies.
    pub fn pins(&self) -> &Arc<Pins> {
        &self.pins
    }

    /// Whether the sources are being rescanned and when the last scan finished.
    pub fn scan_status(&self) -> &ScanStatus {
        &self.scan
    }

    /// A copy of the registry (cheap: tensors are shared), for a rescan to compare against.
    pub fn registry_snapshot(&self) -> Registry {
        self.registry.read().clone()
    }

    /// Swaps in a rescanned registry.
    pub fn replace_registry(&self, registry: Registry) {
        *self.registry.write() = registry;
    }

    /// The registry as the SQL catalog shows it, after reopening any served source
    /// whose file changed on disk (one `stat` per source).
    pub fn catalog_snapshot(&self) -> catalog::Snapshot {
        let stale: Vec<String> = self
            .registry
            .read()
            .tensors()
            .filter(|t| t.file.check_unchanged().is_err())
            .map(|t| t.array_id.clone())
            .collect();
        for array_id in stale {
            // A source that no longer opens moves to the refused list; that is
            // what the catalog should show, so the error needs no other handling.
            if let Err(err) = self.resolve(&array_id) {
                tracing::debug!(%array_id, %err, "changed source refused on reopen");
            }
        }
        catalog::Snapshot::of(&self.registry.read())
    }

    /// Runs a catalog SQL query over the current registry.
    pub async fn catalog_query(&self, sql: &str) -> ServiceResult<catalog::QueryAnswer> {
        let snapshot = self.catalog_snapshot();
        Ok(self.catalog.query(&snapshot, sql).await?)
    }

    /// The chunk service (for shutdown).
    pub fn chunks(&self) -> &Arc<ChunkService> {
        &self.chunks
    }

    /// How many sources are served.
    pub fn source_count(&self) -> usize {
        self.registry.read().len()
    }

    /// Resolves an array id (`source` or `source/field`) to its tensor, reopening
    /// the source first if its file changed on disk since it was opened.
    pub fn resolve(&self, array_id: &str) -> ServiceResult<Arc<Tensor>> {
        check_array_id_len(array_id)?;
        let (source_id, field) = match array_id.split_once('/') {
            Some((s, f)) => (s, Some(f)),
            None => (array_id, None),
        };
        let tensor = {
            let registry = self.registry.read();
            match registry.get(source_id) {
                Some(t) => t.clone(),
                None => {
                    let Some(refused) = registry.refused_source(source_id) else {
                        return Err(ServiceError::UnknownSource(array_id.to_string()));
                    };
                    let refused = refused.clone();
                    let changed =
                        identity_at(&refused.path) != registry.refused_identity(source_id);
                    drop(registry);
                    self.retry_refused(refused, changed)?
                }
            }
        };
        if let Some(field) = field.filter(|f| !f.is_empty()) {
            return Err(ServiceError::UnknownField {
                array_id: array_id.to_string(),
                source_id: source_id.to_string(),
                field: field.to_string(),
            });
        }
        if tensor.file.check_unchanged().is_ok() {
            return Ok(tensor);
        }
        self.reopen(&tensor)
    }

    /// A refused source: opened again when its file changed since it was refused (fixed or
    /// restored), else refused with its reason. A source refused when it was first opened
    /// is bad input (`InvalidArgument`); one that broke after being served is `Unavailable`.
    fn retry_refused(&self, refused: Refused, changed: bool) -> ServiceResult<Arc<Tensor>> {
        let id = refused.source_id.clone();
        let refused = if changed {
            let mut registry = self.registry.write();
            registry.reopen(&id, &refused.path, &self.open_options);
            match registry.get(&id) {
                Some(t) => {
                    tracing::info!(source_id = %id, path = %refused.path.display(), "refused source readable again");
                    return Ok(t.clone());
                }
                None => registry.refused_source(&id).cloned().unwrap_or(refused),
            }
        } else {
            refused
        };
        Err(if refused.after_change {
            ServiceError::Unavailable(format!(
                "source '{id}' changed on disk and can no longer be read: {}",
                refused.reason
            ))
        } else {
            ServiceError::InvalidArgument(format!(
                "source '{id}' is not served: {}",
                refused.reason
            ))
        })
    }

    fn reopen(&self, stale: &Arc<Tensor>) -> ServiceResult<Arc<Tensor>> {
        let path = stale.file.path().to_path_buf();
        if let Err(busy) = stale.file.check_no_writer() {
            return Err(ServiceError::Unavailable(format!(
                "source '{}' is being written; plan the read again when the write is done ({busy})",
                stale.source_id
            )));
        }
        tracing::info!(source_id = %stale.source_id, path = %path.display(), "source changed on disk; reopening");
        let mut registry = self.registry.write();
        registry.reopen(&stale.source_id, &path, &self.open_options);
        match registry.get(&stale.source_id) {
            Some(t) => Ok(t.clone()),
            None => Err(ServiceError::Unavailable(format!(
                "source '{}' changed on disk and can no longer be read: {}",
                stale.source_id,
                registry
                    .refused_source(&stale.source_id)
                    .map(|r| r.reason.as_str())
                    .unwrap_or("unknown reason")
            ))),
        }
    }

    /// Decodes and validates a chunk id from a ticket: the tensor must exist, the
    /// content version must be current, and the region must be one grid cell.
    pub fn resolve_chunk(&self, chunk_id: &[u8]) -> ServiceResult<(Arc<Tensor>, ChunkId)> {
        let id = ChunkId::decode(chunk_id)
            .map_err(|e| ServiceError::InvalidArgument(format!("malformed chunk ticket: {e}")))?;
        let tensor = self.resolve(id.array_id())?;
        if id.version() != tensor.version {
            return Err(ServiceError::Stale(format!(
                "chunk of '{}' was planned against another version of the source; plan the read again",
                id.array_id()
            )));
        }
        if !tensor.grid.is_cell(id.region()) {
            return Err(ServiceError::InvalidArgument(format!(
                "chunk ticket region {:?}..{:?} is not a chunk of '{}'",
                id.region().start,
                id.region().stop,
                id.array_id()
            )));
        }
        Ok((tensor, id))
    }

    /// The IPC message of the chunk a ticket names, decoding it first if it is cold;
    /// counted as served by do_get.
    pub async fn encoded_chunk(&self, chunk_id: &[u8]) -> ServiceResult<EncodedChunk> {
        let (tensor, id) = self.resolve_chunk(chunk_id)?;
        let chunk = self.chunks.encoded(&tensor, &id).await?;
        self.metrics.record_do_get_bytes(chunk.len() as u64);
        Ok(chunk)
    }

    /// Paths of served sources (for logs and tests).
    pub fn source_paths(&self) -> Vec<PathBuf> {
        self.registry
            .read()
            .tensors()
            .map(|t| t.file.path().to_path_buf())
            .collect()
    }
}

/// Refuses an array id longer than any id a chunk ticket can carry
/// ([`MAX_ARRAY_ID_BYTES`]) by its length alone, without quoting it: such an id names no
/// source, and echoing it would turn a request into a large status.
fn check_array_id_len(array_id: &str) -> ServiceResult<()> {
    if array_id.len() <= MAX_ARRAY_ID_BYTES {
        return Ok(());
    }
    Err(ServiceError::InvalidArgument(format!(
        "array id is {} bytes, over the limit of {MAX_ARRAY_ID_BYTES} bytes",
        array_id.len()
    )))
}

/// The SQL of a catalog ticket, decoded by the chunk route ([`chunk_get::ChunkGet`]) and
/// handed to [`TesseraFlight::do_get`] as a request extension.
#[derive(Clone, Debug)]
pub struct CatalogSql(pub String);

/// The Flight service. Its `do_get` answers the catalog tickets [`chunk_get::ChunkGet`]
/// hands on; chunk tickets never reach it.
#[derive(Clone)]
pub struct TesseraFlight {
    state: Arc<ServiceState>,
}

impl TesseraFlight {
    /// A service over `state`.
    pub fn new(state: Arc<ServiceState>) -> Self {
        Self { state }
    }

    fn plan_descriptor(&self, descriptor: &FlightDescriptor) -> ServiceResult<FlightInfo> {
        match descriptor.r#type() {
            DescriptorType::Cmd => {
                let request = decode_flight_request(&descriptor.cmd).map_err(|e| {
                    ServiceError::InvalidArgument(format!("malformed GetFlightInfo command: {e}"))
                })?;
                let tensor = self.state.resolve(&request.array_id)?;
                plan::plan(&tensor, &request, &request.encode_to_vec())
            }
            DescriptorType::Path => {
                let [name] = descriptor.path.as_slice() else {
                    return Err(ServiceError::InvalidArgument(format!(
                        "a path descriptor must hold exactly one array id, this one holds {}",
                        descriptor.path.len()
                    )));
                };
                check_array_id_len(name)?;
                if let Some(info) = catalog::wire::table_flight_info(name)? {
                    return Ok(info);
                }
                let tensor = self.state.resolve(name)?;
                let request = TensorReadOption {
                    array_id: name.clone(),
                    ..Default::default()
                };
                let info = plan::plan(&tensor, &request, &request.encode_to_vec())?;
                Ok(info.with_descriptor(descriptor.clone()))
            }
            DescriptorType::Unknown => Err(ServiceError::InvalidArgument(
                "flight descriptor has no type (neither CMD nor PATH)".to_string(),
            )),
        }
    }
}

fn once<T: Send + 'static>(items: Vec<T>) -> BoxStream<T> {
    Box::pin(futures::stream::iter(items.into_iter().map(Ok)))
}

#[tonic::async_trait]
impl FlightService for TesseraFlight {
    type HandshakeStream = BoxStream<HandshakeResponse>;
    type ListFlightsStream = BoxStream<FlightInfo>;
    type DoGetStream = BoxStream<FlightData>;
    type DoPutStream = BoxStream<PutResult>;
    type DoExchangeStream = BoxStream<FlightData>;
    type DoActionStream = BoxStream<arrow_flight::Result>;
    type ListActionsStream = BoxStream<ActionType>;

    async fn handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        // No handshake is needed: tokens travel as `authorization: Bearer` headers.
        Ok(Response::new(once(Vec::new())))
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        let tensors: Vec<Arc<Tensor>> = self.state.registry.read().tensors().cloned().collect();
        let mut infos = catalog::wire::table_flight_infos()?;
        infos.reserve(tensors.len());
        for tensor in tensors {
            let request = TensorReadOption {
                array_id: tensor.array_id.clone(),
                ..Default::default()
            };
            let info = plan::plan(&tensor, &request, &request.encode_to_vec())?
                .with_descriptor(FlightDescriptor::new_path(vec![tensor.array_id.clone()]));
            infos.push(info);
        }
        Ok(Response::new(once(infos)))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        Ok(Response::new(self.plan_descriptor(request.get_ref())?))
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        let descriptor = request.into_inner();
        let info = self.plan_descriptor(&descriptor)?;
        Ok(Response::new(
            PollInfo::new().with_info(info).with_descriptor(descriptor),
        ))
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        // The plan's schema (a catalog table's for `["sources"]`/`["tensors"]`),
        // already in the IPC form GetSchema returns.
        let info = self.plan_descriptor(request.get_ref())?;
        Ok(Response::new(SchemaResult {
            schema: info.schema,
        }))
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        // The chunk route in front decoded the ticket: chunks it answered itself, a catalog
        // query it hands on with its SQL.
        let Some(CatalogSql(sql)) = request.extensions().get::<CatalogSql>().cloned() else {
            return Err(ServiceError::Internal(
                "DoGet reached the Flight service without the chunk route that decodes its ticket"
                    .to_string(),
            )
            .into());
        };
        let answer = self.state.catalog_query(&sql).await?;
        Ok(Response::new(Box::pin(catalog::wire::flight_data(answer))))
    }

    async fn do_put(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        Err(ServiceError::Unsupported(
            "DoPut is not supported: Tessera serves read-only sources".to_string(),
        )
        .into())
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(ServiceError::Unsupported("DoExchange is not supported by Tessera".to_string()).into())
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let action = request.into_inner();
        let body = actions::run(&self.state, &action.r#type, &action.body).await?;
        Ok(Response::new(once(vec![arrow_flight::Result::new(body)])))
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        Ok(Response::new(once(actions::action_types())))
    }
}
