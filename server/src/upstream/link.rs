//! The link to one upstream tensor server: Flight calls over one lazily connected channel
//! (reconnected by tonic after the upstream comes back), the upstream's token on each.
//!
//! Three calls are made: ListFlights (which tensors), GetFlightInfo with the `endpoints`,
//! `pyramid` and `metadata_json` fields (what one tensor is and its chunk grid: one
//! endpoint per upstream chunk, its bounds in `app_metadata`), and DoGet of one chunk
//! ticket, as the upstream planned it (the ticket is forwarded verbatim).

use std::future::Future;
use std::time::Duration;

use arrow_array::{Array, BinaryArray};
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::error::FlightError;
use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Criteria, FlightDescriptor, FlightInfo, Ticket};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use tessera_proto::consts::{
    AUTHORIZATION_HEADER, CHUNK_WIRE_PROTOCOL_KEY, COLUMN_DATA, MASK_ENDPOINTS, MASK_METADATA_JSON,
    MASK_PYRAMID,
};
use tessera_proto::pb::{ChunkBounds, TensorDescriptor, TensorReadOption};
use tessera_proto::ticket::{catalog_ticket, flight_request};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::grid::Region;
use crate::upstream::address::UpstreamAddress;
use crate::upstream::error::UpstreamError;

/// The largest message accepted from the upstream: a chunk of at most 64 MiB and its framing.
const MAX_MESSAGE_BYTES: usize = 80 << 20;

/// How long one call to the upstream may take before it counts as unreachable.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long dialling the upstream may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the upstream says one tensor is.
#[derive(Clone, Debug)]
pub struct Described {
    /// Its descriptor (shape, dtype, labels, metadata, physical scale, pyramid, version).
    pub descriptor: TensorDescriptor,
    /// Its chunks as the upstream cut them: bounds and the ticket to fetch each with.
    pub chunks: Vec<UpstreamChunk>,
}

/// One chunk of an upstream tensor.
#[derive(Clone, Debug)]
pub struct UpstreamChunk {
    /// Its box in the tensor.
    pub region: Region,
    /// The upstream's ticket for it (forwarded verbatim).
    pub ticket: Bytes,
}

/// The link to one upstream.
#[derive(Clone, Debug)]
pub struct Link {
    address: UpstreamAddress,
    flight: FlightServiceClient<Channel>,
    auth: Option<MetadataValue<Ascii>>,
    runtime: tokio::runtime::Handle,
}

impl Link {
    /// A link to `address` (dialled on first use), sending `token` when given and trusting
    /// `ca_pem` for `grpc+tls://`. Must be called on the runtime that will run its calls.
    pub fn new(
        address: UpstreamAddress,
        token: Option<&str>,
        ca_pem: Option<&[u8]>,
    ) -> Result<Link, UpstreamError> {
        let bad = |why: String| UpstreamError::Address {
            address: address.base.clone(),
            why,
        };
        let mut endpoint = Endpoint::from_shared(address.endpoint())
            .map_err(|e| bad(e.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .tcp_nodelay(true);
        if address.tls {
            let mut tls = ClientTlsConfig::new();
            if let Some(pem) = ca_pem {
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            endpoint = endpoint.tls_config(tls).map_err(|e| bad(e.to_string()))?;
        }
        let auth = token
            .map(|t| {
                format!("Bearer {t}")
                    .parse::<MetadataValue<Ascii>>()
                    .map_err(|_| {
                        UpstreamError::Credentials(
                            "the upstream token is not a valid header value".to_string(),
                        )
                    })
            })
            .transpose()?;
        let flight = FlightServiceClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Link {
            address,
            flight,
            auth,
            runtime: tokio::runtime::Handle::current(),
        })
    }

    /// The upstream's address.
    pub fn address(&self) -> &UpstreamAddress {
        &self.address
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(auth) = &self.auth {
            request
                .metadata_mut()
                .insert(AUTHORIZATION_HEADER, auth.clone());
        }
        request
    }

    fn error(&self, call: &'static str, array_id: &str, status: tonic::Status) -> UpstreamError {
        UpstreamError::of_status(&self.address.base, call, array_id, status)
    }

    /// Runs `future` on the link's runtime and waits for it, from any thread (the chunk
    /// service reads sources on blocking threads); `None` when the runtime is stopping.
    pub fn wait<F>(&self, future: F) -> Option<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let task = self.runtime.spawn(future);
        match futures::executor::block_on(task) {
            Ok(output) => Some(output),
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(_) => None,
        }
    }

    /// The error of a call cut short because this server is stopping.
    pub fn stopping(&self) -> UpstreamError {
        UpstreamError::Unreachable {
            upstream: self.address.base.clone(),
            status: Box::new(tonic::Status::unavailable("this server is stopping")),
        }
    }

    /// The ids of the tensors the upstream lists (ListFlights entries whose schema carries
    /// the chunk wire protocol stamp), sorted.
    pub async fn list(&self) -> Result<Vec<String>, UpstreamError> {
        let infos = match self.list_flights().await {
            Ok(infos) => infos,
            Err(err @ UpstreamError::Unreachable { .. }) => return Err(err),
            // An upstream whose ListFlights fails (biopb's server 0.13.0 under duckdb 2)
            // may still answer its catalog.
            Err(err) => {
                tracing::debug!(upstream = %self.address.base, %err, "listing through the catalog instead");
                Vec::new()
            }
        };
        let mut ids: Vec<String> = infos
            .iter()
            .filter(|info| {
                arrow_ipc::convert::try_schema_from_ipc_buffer(&info.schema)
                    .is_ok_and(|s| s.metadata().contains_key(CHUNK_WIRE_PROTOCOL_KEY))
            })
            .filter_map(|info| {
                let descriptor = info.flight_descriptor.as_ref()?;
                match descriptor.r#type() {
                    DescriptorType::Path => Some(descriptor.path.join("/")),
                    DescriptorType::Cmd => TensorDescriptor::decode(descriptor.cmd.clone())
                        .ok()
                        .map(|d| d.array_id),
                    DescriptorType::Unknown => None,
                }
            })
            .collect();
        if ids.is_empty() {
            // biopb's server lists catalog tables only: its tensors are its catalog's sources.
            ids = self.catalog_source_ids().await?;
        }
        ids.sort();
        ids.dedup();
        Ok(ids)
    }

    /// Every entry the upstream's ListFlights answers.
    async fn list_flights(&self) -> Result<Vec<FlightInfo>, UpstreamError> {
        let mut flight = self.flight.clone();
        flight
            .list_flights(self.request(Criteria::default()))
            .await
            .map_err(|s| self.error("ListFlights", "", s))?
            .into_inner()
            .try_collect()
            .await
            .map_err(|s| self.error("ListFlights", "", s))
    }

    /// Every `source_id` of the upstream's `sources` catalog table, read a page at a time
    /// (keyset paging: a server capping a query's rows never hides the rest).
    async fn catalog_source_ids(&self) -> Result<Vec<String>, UpstreamError> {
        const PAGE: usize = 1000;
        let mut ids: Vec<String> = Vec::new();
        loop {
            let after = ids
                .last()
                .map(|last| format!(" WHERE source_id > '{}'", last.replace('\'', "''")))
                .unwrap_or_default();
            let sql =
                format!("SELECT source_id FROM sources{after} ORDER BY source_id LIMIT {PAGE}");
            let page = self.catalog_column(&sql, "source_id").await?;
            let done = page.len() < PAGE;
            ids.extend(page);
            if done {
                return Ok(ids);
            }
        }
    }

    /// The string column `column` of the catalog query `sql`'s answer.
    async fn catalog_column(&self, sql: &str, column: &str) -> Result<Vec<String>, UpstreamError> {
        let ticket = Ticket {
            ticket: catalog_ticket(sql).into(),
        };
        let mut flight = self.flight.clone();
        let stream = flight
            .do_get(self.request(ticket))
            .await
            .map_err(|s| self.error("DoGet", "sources", s))?
            .into_inner();
        let batches: Vec<_> = FlightRecordBatchStream::new_from_flight_data(
            stream.map_err(|s| FlightError::Tonic(Box::new(s))),
        )
        .try_collect()
        .await
        .map_err(|e| match e {
            FlightError::Tonic(status) => self.error("DoGet", "sources", *status),
            other => UpstreamError::BadReply {
                upstream: self.address.base.clone(),
                array_id: "sources".to_string(),
                why: format!("the catalog answer does not decode: {other}"),
            },
        })?;
        let mut out = Vec::new();
        for batch in &batches {
            let Some(values) = batch.column_by_name(column) else {
                continue;
            };
            use arrow_array::cast::AsArray;
            if let Some(v) = values.as_string_opt::<i32>() {
                out.extend(v.iter().flatten().map(String::from));
            } else if let Some(v) = values.as_string_opt::<i64>() {
                out.extend(v.iter().flatten().map(String::from));
            } else if let Some(v) = values.as_string_view_opt() {
                out.extend(v.iter().flatten().map(String::from));
            } else {
                return Err(UpstreamError::BadReply {
                    upstream: self.address.base.clone(),
                    array_id: "sources".to_string(),
                    why: format!(
                        "the catalog's {column} column is {}, not text",
                        values.data_type()
                    ),
                });
            }
        }
        Ok(out)
    }

    /// What the upstream says tensor `array_id` is, and its chunks.
    pub async fn describe(&self, array_id: &str) -> Result<Described, UpstreamError> {
        self.plan(array_id, None).await
    }

    /// What the upstream says the stored level of tensor `array_id` with `factors` is,
    /// and its chunks (a `precompute` plan of that level).
    pub async fn describe_level(
        &self,
        array_id: &str,
        factors: &[u64],
    ) -> Result<Described, UpstreamError> {
        self.plan(array_id, Some(factors)).await
    }

    /// The upstream's plan of the whole tensor `array_id`, at full resolution or at the
    /// stored level of `factors`.
    async fn plan(
        &self,
        array_id: &str,
        factors: Option<&[u64]>,
    ) -> Result<Described, UpstreamError> {
        let mut read = TensorReadOption {
            array_id: array_id.to_string(),
            fields: Some(Default::default()),
            ..Default::default()
        };
        if let Some(factors) = factors {
            read.scale_hint = factors.iter().map(|&f| f as i64).collect();
            read.reduction_method = "precompute".to_string();
        }
        if let Some(fields) = read.fields.as_mut() {
            fields.paths = [MASK_ENDPOINTS, MASK_PYRAMID, MASK_METADATA_JSON]
                .map(String::from)
                .to_vec();
        }
        let descriptor = FlightDescriptor::new_cmd(flight_request(read));
        let mut flight = self.flight.clone();
        let info = flight
            .get_flight_info(self.request(descriptor))
            .await
            .map_err(|s| self.error("GetFlightInfo", array_id, s))?
            .into_inner();
        let bad = |why: String| UpstreamError::BadReply {
            upstream: self.address.base.clone(),
            array_id: array_id.to_string(),
            why,
        };
        let cmd = info
            .flight_descriptor
            .as_ref()
            .map(|d| d.cmd.clone())
            .filter(|cmd| !cmd.is_empty())
            .ok_or_else(|| bad("the plan carries no TensorDescriptor".to_string()))?;
        let descriptor = TensorDescriptor::decode(cmd)
            .map_err(|e| bad(format!("the plan's descriptor does not decode: {e}")))?;
        let mut chunks = Vec::with_capacity(info.endpoint.len());
        for (index, endpoint) in info.endpoint.iter().enumerate() {
            let ticket = endpoint
                .ticket
                .as_ref()
                .map(|t| t.ticket.clone())
                .filter(|t| !t.is_empty())
                .ok_or_else(|| bad(format!("endpoint {index} has no ticket")))?;
            let bounds = ChunkBounds::decode(endpoint.app_metadata.clone())
                .map_err(|e| bad(format!("endpoint {index} carries no chunk bounds: {e}")))?;
            let unsigned = |v: &[i64]| -> Result<Vec<u64>, UpstreamError> {
                v.iter()
                    .map(|&x| u64::try_from(x))
                    .collect::<Result<_, _>>()
                    .map_err(|_| bad(format!("endpoint {index} has negative bounds")))
            };
            chunks.push(UpstreamChunk {
                region: Region::new(unsigned(&bounds.start)?, unsigned(&bounds.stop)?),
                ticket,
            });
        }
        chunks.sort_by(|a, b| a.region.start.cmp(&b.region.start));
        Ok(Described { descriptor, chunks })
    }

    /// The bytes (C order) of the upstream chunk `ticket` names, of tensor `array_id`: the
    /// received message's own buffer, not a copy of it.
    pub async fn fetch(&self, array_id: &str, ticket: Bytes) -> Result<ChunkBytes, UpstreamError> {
        let mut flight = self.flight.clone();
        let stream = flight
            .do_get(self.request(Ticket { ticket }))
            .await
            .map_err(|s| self.error("DoGet", array_id, s))?
            .into_inner();
        let mut batches = FlightRecordBatchStream::new_from_flight_data(
            stream.map_err(|s| FlightError::Tonic(Box::new(s))),
        );
        let bad = |why: String| UpstreamError::BadReply {
            upstream: self.address.base.clone(),
            array_id: array_id.to_string(),
            why,
        };
        let batch = match batches.next().await {
            Some(Ok(batch)) => batch,
            Some(Err(FlightError::Tonic(status))) => {
                return Err(self.error("DoGet", array_id, *status));
            }
            Some(Err(e)) => return Err(bad(format!("the chunk does not decode: {e}"))),
            None => return Err(bad("the chunk stream is empty".to_string())),
        };
        let data = batch
            .column_by_name(COLUMN_DATA)
            .and_then(|c| c.as_any().downcast_ref::<BinaryArray>())
            .filter(|c| c.len() == 1)
            .ok_or_else(|| bad("the chunk batch has no one-row binary data column".to_string()))?;
        Ok(ChunkBytes(data.clone()))
    }
}

/// The bytes of one fetched upstream chunk, held in the buffer they were received into
/// (a one-row binary column; each copy of 8 MiB chunks costs a node at link rate a tenth of
/// a core).
#[derive(Debug)]
pub struct ChunkBytes(BinaryArray);

impl ChunkBytes {
    /// The chunk's bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.0.value(0)
    }
}
