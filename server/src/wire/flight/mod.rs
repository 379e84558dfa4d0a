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
mod catalog_query;
pub mod chunk_get;
pub mod plan;
pub mod put;
pub mod roi;

use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::flight_service_server::FlightService;
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
    flight_descriptor::DescriptorType,
};
use futures::Stream;
use prost::Message;
use tessera_proto::pb::TensorReadOption;
use tessera_proto::ticket::decode_flight_request;
use tonic::{Request, Response, Status, Streaming};

use crate::catalog;
use crate::error::{Fault, NotServed, RequestError, ServiceError, ServiceResult};
use crate::grid::chunk_id::ChunkId;
use crate::grid::route::Route;
use crate::grid::scaled::pyramid::PyramidPolicy;
use crate::source::registry::Tensor;
use crate::source::sources::check_array_id_len;
use crate::state::ServiceState;
use crate::unread::{Connection, Held};
use crate::wire::listener::Peer;
use plan::Planned;

/// A boxed response stream.
pub(crate) type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The SQL of a catalog ticket, decoded by the chunk route ([`chunk_get::ChunkGet`]) and
/// handed to [`TesseraFlight::do_get`] as a request extension.
#[derive(Clone, Debug)]
pub struct CatalogSql(pub String);

/// The `roi_read` of a ROI ticket, decoded by the chunk route ([`chunk_get::ChunkGet`]) and
/// handed to [`TesseraFlight::do_get`] as a request extension.
#[derive(Clone, Debug)]
pub struct RoiReadTicket(pub tessera_proto::pb::RoiRead);

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

    /// Whether `request`'s peer is on loopback, and the route of its plans.
    fn route_of<T>(&self, request: &Request<T>) -> (bool, Route) {
        let loopback = Peer::of(request.extensions()).is_some_and(Peer::is_loopback);
        (loopback, self.state.read_path().plan_route(loopback))
    }

    /// A reply of `bytes` in the ledger of unread replies, as its connection's (chunk replies
    /// are registered by [`chunk_get`]).
    fn held(
        &self,
        connection: Option<Arc<Connection>>,
        bytes: u64,
        stream: BoxStream<FlightData>,
    ) -> BoxStream<FlightData> {
        let hold = connection.map(|c| self.state.unread().hold(&c, bytes));
        Box::pin(Held::new(stream, hold))
    }

    /// Starts decoding the end chunks of a plan just answered, if its tensor is cold
    /// ([`crate::chunks::ChunkService::read_ahead_plan`], decision 0022).
    fn read_ahead(&self, ends: Option<(Arc<Tensor>, ChunkId, ChunkId)>) {
        if let Some((tensor, first, last)) = ends {
            self.state.chunks().read_ahead_plan(&tensor, first, last);
        }
    }

    /// Plans a whole-tensor read of `tensor` at full resolution under the id the client
    /// used (a bare path descriptor, a ListFlights entry), on the grid of `route`.
    fn plan_whole(&self, tensor: &Tensor, array_id: &str, route: Route) -> ServiceResult<Planned> {
        let request = TensorReadOption {
            array_id: array_id.to_string(),
            ..Default::default()
        };
        self.plan(tensor, &request, route)
    }

    /// Plans `request` of `tensor` on the grid of `route`, with the ROI ticket of a tensor
    /// that takes annotations.
    fn plan(
        &self,
        tensor: &Tensor,
        request: &TensorReadOption,
        route: Route,
    ) -> ServiceResult<Planned> {
        let roi_ticket = if tensor.source.held_chunks().is_none() {
            roi::ticket(&self.state, tensor)
        } else {
            Vec::new()
        };
        plan::plan(
            tensor,
            request,
            &request.encode_to_vec(),
            route,
            self.state.pyramid(),
            roi_ticket,
        )
    }

    /// Plans the read a descriptor asks for, on the grid of `route` (or of what the cache
    /// holds, for a loopback peer: [`ServiceState::route_for`]); with the tensor and the end
    /// chunks of a full-resolution plan of a served tensor.
    fn plan_descriptor(
        &self,
        descriptor: &FlightDescriptor,
        (loopback, route): (bool, Route),
    ) -> ServiceResult<(FlightInfo, PlanEnds)> {
        match descriptor.r#type() {
            DescriptorType::Cmd => {
                let request = decode_flight_request(&descriptor.cmd)
                    .map_err(|e| malformed_command(&descriptor.cmd, e))?;
                let read_path = self.state.read_path();
                let mut tensor = read_path.tensor(&request.array_id)?;
                let mut request = request;
                if let Some((level, level_request)) = plan::native_level(&tensor, &request)? {
                    if let Some(level) = level {
                        tensor = read_path.tensor(&level)?;
                    }
                    request = level_request;
                }
                let route = read_path.route_for(&tensor, loopback, route);
                let planned = self.plan(&tensor, &request, route)?;
                Ok(with_ends(tensor, planned))
            }
            DescriptorType::Path => {
                let [name] = descriptor.path.as_slice() else {
                    return Err(RequestError::PathLength {
                        len: descriptor.path.len(),
                    }
                    .into());
                };
                check_array_id_len(name)?;
                if let Some(schema) = catalog::table_schema(name) {
                    return Ok((catalog_query::table_flight_info(name, &schema)?, None));
                }
                let read_path = self.state.read_path();
                let tensor = read_path.tensor(name)?;
                let route = read_path.route_for(&tensor, loopback, route);
                let mut planned = self.plan_whole(&tensor, name, route)?;
                planned.info = planned.info.with_descriptor(descriptor.clone());
                Ok(with_ends(tensor, planned))
            }
            DescriptorType::Unknown => Err(RequestError::UntypedDescriptor.into()),
        }
    }
}

/// The end chunks of a plan of a served tensor, with that tensor, for read-ahead.
type PlanEnds = Option<(Arc<Tensor>, ChunkId, ChunkId)>;

/// A plan's FlightInfo, and its end chunks with `tensor`.
fn with_ends(tensor: Arc<Tensor>, planned: Planned) -> (FlightInfo, PlanEnds) {
    let ends = planned.ends.map(|(first, last)| (tensor, first, last));
    (planned.info, ends)
}

/// The ListFlights entry of a READY upload: its descriptor and schema without endpoints
/// (an upload's grid may have far more cells than a listing should carry; a generic tool
/// plans it with GetFlightInfo of the entry's PATH descriptor).
fn plan_listed(tensor: &Tensor, pyramid: &PyramidPolicy) -> ServiceResult<FlightInfo> {
    let request = TensorReadOption {
        array_id: tensor.array_id.clone(),
        fields: Some(Default::default()),
        ..Default::default()
    };
    let route = Route::Socket;
    let planned = plan::plan(
        tensor,
        &request,
        &request.encode_to_vec(),
        route,
        pyramid,
        Vec::new(),
    )?;
    Ok(planned.info)
}

/// The refusal of a CMD descriptor that is not a `FlightRequest`. A bare array id there
/// (pyarrow's `FlightDescriptor.for_command(b"zstack")`) is the common mistake: the
/// message shows the PATH form that names a tensor by id.
fn malformed_command(cmd: &[u8], err: tessera_proto::ProtoError) -> RequestError {
    let bare_id = std::str::from_utf8(cmd).ok().filter(|text| {
        !text.is_empty()
            && text.len() <= 256
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c))
    });
    match bare_id {
        Some(id) => RequestError::BareIdCommand {
            array_id: id.to_string(),
        },
        None => RequestError::MalformedCommand {
            source: Arc::new(err),
        },
    }
}

/// What ListFlights lists for `criteria`: the served tensors (empty criteria), or the
/// catalog's tables (`catalog`), never both, so a generic tool's listing holds only arrays.
fn listing_of(criteria: &[u8]) -> ServiceResult<Listing> {
    match criteria {
        b"" => Ok(Listing::Tensors),
        b"catalog" => Ok(Listing::CatalogTables),
        other => Err(RequestError::ListCriteria {
            criteria: String::from_utf8_lossy(&other[..other.len().min(64)]).into_owned(),
        }
        .into()),
    }
}

/// The two listings of ListFlights.
enum Listing {
    Tensors,
    CatalogTables,
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
        request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        let (_, route) = self.route_of(&request);
        if let Listing::CatalogTables = listing_of(&request.get_ref().expression)? {
            return Ok(Response::new(once(catalog_query::table_flight_infos()?)));
        }
        let tensors: Vec<Arc<Tensor>> = self.state.sources().read().tensors().cloned().collect();
        let mut infos = Vec::with_capacity(tensors.len());
        for tensor in tensors {
            let info = self
                .plan_whole(&tensor, &tensor.array_id, route)?
                .info
                .with_descriptor(FlightDescriptor::new_path(vec![tensor.array_id.clone()]));
            infos.push(info);
        }
        for upload in self.state.ready_uploads() {
            let tensor = upload.tensor();
            let info = plan_listed(&tensor, self.state.pyramid())?
                .with_descriptor(FlightDescriptor::new_path(vec![tensor.array_id.clone()]));
            infos.push(info);
        }
        Ok(Response::new(once(infos)))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let route = self.route_of(&request);
        let (info, ends) = self.plan_descriptor(request.get_ref(), route)?;
        self.read_ahead(ends);
        Ok(Response::new(info))
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        let route = self.route_of(&request);
        let descriptor = request.into_inner();
        let (info, ends) = self.plan_descriptor(&descriptor, route)?;
        self.read_ahead(ends);
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
        let (info, _) = self.plan_descriptor(request.get_ref(), (false, Route::Socket))?;
        Ok(Response::new(SchemaResult {
            schema: info.schema,
        }))
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        // The chunk route in front decoded the ticket: chunks it answered itself, a catalog
        // query it hands on with its SQL, a ROI read with its RoiRead.
        let peer = Peer::of(request.extensions());
        let connection = peer.map(|peer| Arc::clone(&peer.connection));
        // Tables go zstd-compressed to peers `--wire-compression` says (docs/decisions/0039).
        let (options, encoding) = self
            .state
            .chunks()
            .wire_bodies()
            .table_options(peer.is_some_and(Peer::is_loopback));
        if let Some(RoiReadTicket(read)) = request.extensions().get::<RoiReadTicket>().cloned() {
            let (stream, bytes) = roi::read(&self.state, read, options).await?;
            self.state
                .metrics()
                .record_table_reply("roi", encoding.label());
            return Ok(Response::new(self.held(connection, bytes, stream)));
        }
        let Some(CatalogSql(sql)) = request.extensions().get::<CatalogSql>().cloned() else {
            return Err(ServiceError::from(Fault::NoChunkRoute).into());
        };
        let answer = self.state.catalog_query(&sql).await?;
        let bytes = answer.bytes();
        let stream = Box::pin(catalog_query::flight_data(answer, options));
        self.state
            .metrics()
            .record_table_reply("catalog", encoding.label());
        Ok(Response::new(self.held(connection, bytes, stream)))
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        let stream = put::run(&self.state, request.into_inner()).await?;
        Ok(Response::new(stream))
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(ServiceError::from(NotServed::DoExchange).into())
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let loopback = Peer::of(request.extensions()).is_some_and(Peer::is_loopback);
        let action = request.into_inner();
        let stream = match actions::run(&self.state, &action.r#type, &action.body, loopback).await?
        {
            actions::Reply::One(body) => once(vec![arrow_flight::Result::new(body)]),
            actions::Reply::Stream(stream) => stream,
        };
        Ok(Response::new(stream))
    }

    async fn list_actions(
        &self,
        _request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        Ok(Response::new(once(actions::action_types())))
    }
}
