//! The client: connection, plans, chunk fetches (mmap fast path or DoGet),
//! and assembled reads.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, Criteria, FlightDescriptor, FlightInfo, Ticket};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use prost_types::FieldMask;
use tessera_proto::consts::{
    ACTION_CACHE_STATS, ACTION_CHUNK_LOCATE, ACTION_HEALTH, AUTHORIZATION_HEADER, BEARER_PREFIX,
    MASK_ENDPOINTS, MASK_PYRAMID, UNKNOWN_ACTION_PREFIX,
};
use tessera_proto::json::{ActionBody, CacheStats, ChunkLocateReply, ChunkLocation};
use tessera_proto::pb::{SliceHint, TensorDescriptor, TensorReadOption};
use tessera_proto::ticket::flight_request;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::address::ServerAddress;
use crate::assemble::scatter;
use crate::cache::ChunkCache;
use crate::chunk::{ChunkOrigin, ChunkView, view_from_batch};
use crate::error::ClientError;
use crate::health::ServerHealth;
use crate::ipc::{StreamMessage, batch_at, stream_message};
use crate::options::ClientOptions;
use crate::pins::{InodeKey, PinLedger};
use crate::plan::{Plan, PlannedChunk, plan_from_info, reply_descriptor};

/// A downsampled read: one factor per axis (1 = untouched) and the server's reduction
/// method (`nearest`, `area`; empty means the server's default, `nearest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadScale {
    /// The factor per axis.
    pub factors: Vec<u64>,
    /// The reduction method's name.
    pub method: String,
}
use crate::region::Region;

/// gRPC decode limit: above the 64 MiB chunk cap, like biopb's 80 MiB.
pub const MAX_MESSAGE_BYTES: usize = 80 << 20;
/// HTTP/2 max frame size the client advertises (measured fastest).
pub const H2_MAX_FRAME_BYTES: u32 = 1 << 20;
/// HTTP/2 initial stream window.
pub const H2_STREAM_WINDOW_BYTES: u32 = 16 << 20;
/// HTTP/2 initial connection window.
pub const H2_CONNECTION_WINDOW_BYTES: u32 = 32 << 20;

/// An assembled read: C-order bytes of the requested region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayData {
    /// Shape of the region read.
    pub shape: Vec<u64>,
    /// The numpy dtype string, as served.
    pub dtype: String,
    /// C-order bytes, in the byte order `dtype` says.
    pub bytes: Vec<u8>,
}

/// What the server says about one tensor (GetFlightInfo without endpoints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The tensor's array id.
    pub array_id: String,
    /// Its full shape.
    pub shape: Vec<u64>,
    /// Its numpy dtype string.
    pub dtype: String,
    /// Axis labels, possibly empty.
    pub dim_labels: Vec<String>,
    /// The server's chunk grid.
    pub chunk_shape: Vec<u64>,
}

/// This client's own counters and cache sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalStats {
    /// Whether the mmap fast path applies (enabled and the location is loopback).
    pub fast_path: bool,
    /// Whether the server still counts as knowing `chunk_locate`.
    pub locate_supported: bool,
    /// `chunk_locate` calls made.
    pub locate_probes: u64,
    /// Chunks handed out as zero-copy views of a mapped segment.
    pub mapped_chunks: u64,
    /// Chunks read through a mapping but copied out (pin limit reached).
    pub mapped_copies: u64,
    /// Chunks received with DoGet.
    pub socket_chunks: u64,
    /// Chunk requests answered from this client's cache.
    pub cache_hits: u64,
    /// Views alive in the weak tier.
    pub live_views: usize,
    /// Copies held by the strong tier.
    pub cached_copies: usize,
    /// Bytes held by the strong tier.
    pub cached_copy_bytes: u64,
    /// Summed on-disk size of the distinct segments mapped now.
    pub pinned_bytes: u64,
    /// Distinct segments mapped now.
    pub pinned_segments: usize,
}

#[derive(Default)]
struct Counters {
    locate_probes: AtomicU64,
    mapped: AtomicU64,
    mapped_copies: AtomicU64,
    socket: AtomicU64,
    cache_hits: AtomicU64,
}

struct Inner {
    address: ServerAddress,
    flight: FlightServiceClient<Channel>,
    auth: Option<MetadataValue<Ascii>>,
    options: ClientOptions,
    fast_path: bool,
    locate_supported: AtomicBool,
    ledger: Arc<PinLedger>,
    cache: ChunkCache,
    counters: Counters,
}

/// A connection to a Tessera (or biopb tensor Flight) server. Cheap to clone;
/// clones share the connection, caches and mapped segments.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn describe_mask() -> FieldMask {
    FieldMask { paths: Vec::new() }
}

impl Client {
    /// Connects to `location` (`grpc://host:port`, `grpc+tcp://`, `http://`; or
    /// `grpc+tls://`, `grpcs://`, `https://` with [`ClientOptions::with_tls_ca_pem`]), then
    /// checks the server's `health` protocol (2 or 3).
    pub async fn connect(location: &str, options: ClientOptions) -> Result<Client, ClientError> {
        let parsed = ServerAddress::parse(location)?;
        let auth = options
            .token
            .as_deref()
            .map(|token| {
                MetadataValue::try_from(format!("{BEARER_PREFIX}{token}")).map_err(|e| {
                    ClientError::InvalidToken {
                        reason: e.to_string(),
                    }
                })
            })
            .transpose()?;
        let endpoint = Endpoint::from_shared(parsed.uri.clone())
            .map_err(|e| ClientError::InvalidLocation {
                location: location.to_string(),
                reason: e.to_string(),
            })?
            .max_frame_size(H2_MAX_FRAME_BYTES)
            .initial_stream_window_size(H2_STREAM_WINDOW_BYTES)
            .initial_connection_window_size(H2_CONNECTION_WINDOW_BYTES)
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(10));
        let endpoint = if parsed.tls {
            let pem = options
                .tls_ca_pem
                .as_ref()
                .ok_or_else(|| ClientError::TlsNeedsCa {
                    location: location.to_string(),
                })?;
            endpoint
                .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
                .map_err(|source| ClientError::Connect {
                    location: location.to_string(),
                    source,
                })?
        } else {
            endpoint
        };
        let channel = endpoint
            .connect()
            .await
            .map_err(|source| ClientError::Connect {
                location: location.to_string(),
                source,
            })?;
        let flight = FlightServiceClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES);
        let fast_path = options.mmap && parsed.is_loopback();
        let client = Client {
            inner: Arc::new(Inner {
                address: parsed,
                flight,
                auth,
                fast_path,
                locate_supported: AtomicBool::new(true),
                ledger: PinLedger::new(options.pin_limit),
                cache: ChunkCache::new(options.copy_cache_bytes),
                counters: Counters::default(),
                options,
            }),
        };
        client.health().await?.check_protocol(location)?;
        Ok(client)
    }

    /// The location as given to [`Client::connect`].
    pub fn location(&self) -> &str {
        &self.inner.address.original
    }

    /// The options in force.
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    pub(crate) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(auth) = &self.inner.auth {
            request
                .metadata_mut()
                .insert(AUTHORIZATION_HEADER, auth.clone());
        }
        request
    }

    pub(crate) fn flight(&self) -> FlightServiceClient<Channel> {
        self.inner.flight.clone()
    }

    /// Runs an action and returns its first result body (`None`: empty stream).
    pub(crate) async fn action(
        &self,
        kind: &str,
        body: Vec<u8>,
    ) -> Result<Option<Bytes>, tonic::Status> {
        let action = Action {
            r#type: kind.to_string(),
            body: body.into(),
        };
        let mut results = self
            .flight()
            .do_action(self.request(action))
            .await?
            .into_inner();
        Ok(results.message().await?.map(|r| r.body))
    }

    /// Calls the `health` action.
    pub async fn health(&self) -> Result<ServerHealth, ClientError> {
        let body = self
            .action(ACTION_HEALTH, Vec::new())
            .await
            .map_err(|s| ClientError::rpc(format!("health check of '{}'", self.location()), s))?;
        Ok(ServerHealth::from_body(body.as_deref()))
    }

    /// Calls the `cache_stats` action: the server's chunk cache counters.
    pub async fn cache_stats(&self) -> Result<CacheStats, ClientError> {
        let body = self
            .action(ACTION_CACHE_STATS, Vec::new())
            .await
            .map_err(|s| ClientError::rpc("DoAction cache_stats", s))?
            .ok_or_else(|| ClientError::ActionReply {
                action: ACTION_CACHE_STATS.to_string(),
                reason: "the reply stream was empty".to_string(),
            })?;
        CacheStats::from_body(&body).map_err(|e| ClientError::ActionReply {
            action: ACTION_CACHE_STATS.to_string(),
            reason: e.to_string(),
        })
    }

    /// Calls `chunk_locate` for `chunk`: the server decodes it into its file cache first if it
    /// is cold, and answers where it lives, or why it cannot say (memory cache, refused
    /// append). What `tessera warm` fills a server's cache with.
    pub async fn locate(&self, chunk: &PlannedChunk) -> Result<ChunkLocateReply, ClientError> {
        let reply_error = |reason: String| ClientError::ActionReply {
            action: ACTION_CHUNK_LOCATE.to_string(),
            reason,
        };
        let body = self
            .action(ACTION_CHUNK_LOCATE, chunk.ticket.clone())
            .await
            .map_err(|s| ClientError::rpc(format!("chunk_locate of chunk {}", chunk.bounds), s))?
            .ok_or_else(|| reply_error("the reply stream was empty".to_string()))?;
        ChunkLocateReply::from_body(&body).map_err(|e| reply_error(e.to_string()))
    }

    async fn flight_info(
        &self,
        array_id: &str,
        region: Option<&Region>,
        scale: Option<&ReadScale>,
        mask: FieldMask,
    ) -> Result<FlightInfo, ClientError> {
        let read = TensorReadOption {
            array_id: array_id.to_string(),
            slice_hint: region.map(|r| SliceHint {
                start: r.start.iter().map(|&v| v as i64).collect(),
                stop: r.stop.iter().map(|&v| v as i64).collect(),
            }),
            scale_hint: scale
                .map_or_else(Vec::new, |s| s.factors.iter().map(|&f| f as i64).collect()),
            reduction_method: scale.map_or_else(String::new, |s| s.method.clone()),
            fields: Some(mask),
        };
        let descriptor = FlightDescriptor::new_cmd(flight_request(read));
        Ok(self
            .flight()
            .get_flight_info(self.request(descriptor))
            .await
            .map_err(|s| ClientError::planning(array_id, self.location(), s))?
            .into_inner())
    }

    /// Describes one tensor (GetFlightInfo with an empty field mask).
    pub async fn describe(&self, array_id: &str) -> Result<TensorInfo, ClientError> {
        let info = self
            .flight_info(array_id, None, None, describe_mask())
            .await?;
        let descriptor = reply_descriptor(&info, array_id)?;
        tensor_info(descriptor, array_id)
    }

    /// Lists the served tensors: the names from ListFlights (PATH
    /// descriptors, or CMD descriptors holding a `TensorDescriptor`), each
    /// then described with GetFlightInfo. Sorted by array id.
    pub async fn list(&self) -> Result<Vec<TensorInfo>, ClientError> {
        let infos: Vec<FlightInfo> = self
            .flight()
            .list_flights(self.request(Criteria::default()))
            .await
            .map_err(|s| ClientError::rpc("ListFlights", s))?
            .into_inner()
            .try_collect()
            .await
            .map_err(|s| ClientError::rpc("ListFlights", s))?;
        let mut names = Vec::with_capacity(infos.len());
        for info in &infos {
            // Other servers may list catalog tables beside the tensors; only tensors carry
            // the chunk wire protocol stamp on their schema.
            if !crate::plan::is_tensor_info(info) {
                continue;
            }
            let Some(descriptor) = &info.flight_descriptor else {
                continue;
            };
            match descriptor.r#type() {
                DescriptorType::Path => names.push(descriptor.path.join("/")),
                DescriptorType::Cmd => {
                    if let Ok(d) = TensorDescriptor::decode(descriptor.cmd.clone()) {
                        names.push(d.array_id);
                    }
                }
                DescriptorType::Unknown => {}
            }
        }
        names.sort();
        names.dedup();
        futures::stream::iter(names.iter().map(|name| self.describe(name)))
            .buffered(self.inner.options.concurrency)
            .try_collect()
            .await
    }

    /// Plans a read of `array_id` (the whole tensor, or `region` of it) with
    /// GetFlightInfo and the `endpoints` mask; checks the wire protocol stamp
    /// and that the endpoints tile the realized region.
    pub async fn plan(&self, array_id: &str, region: Option<&Region>) -> Result<Plan, ClientError> {
        self.plan_scaled(array_id, region, None).await
    }

    /// The pyramid levels the server advertises for `array_id` (level 0 first), each as
    /// the scale of a read of it.
    pub async fn pyramid(&self, array_id: &str) -> Result<Vec<ReadScale>, ClientError> {
        let mask = FieldMask {
            paths: vec![MASK_PYRAMID.to_string()],
        };
        let info = self.flight_info(array_id, None, None, mask).await?;
        let descriptor = reply_descriptor(&info, array_id)?;
        descriptor
            .pyramid
            .iter()
            .map(|level| {
                let factors = level
                    .scale_hint
                    .iter()
                    .map(|&f| {
                        u64::try_from(f).map_err(|_| ClientError::BadPlan {
                            array_id: array_id.to_string(),
                            reason: format!(
                                "pyramid level scale {:?} is negative",
                                level.scale_hint
                            ),
                        })
                    })
                    .collect::<Result<Vec<u64>, ClientError>>()?;
                Ok(ReadScale {
                    factors,
                    method: level.reduction_method.clone(),
                })
            })
            .collect()
    }

    /// Plans a downsampled read: like [`Client::plan`], with the server reducing the
    /// tensor by `scale` (`region` stays in full-resolution coordinates; the plan's crop
    /// is the corresponding window of the reduced tensor).
    pub async fn plan_scaled(
        &self,
        array_id: &str,
        region: Option<&Region>,
        scale: Option<&ReadScale>,
    ) -> Result<Plan, ClientError> {
        let mask = FieldMask {
            paths: vec![MASK_ENDPOINTS.to_string()],
        };
        let info = self.flight_info(array_id, region, scale, mask).await?;
        let factors = scale.map_or(&[][..], |s| &s.factors[..]);
        plan_from_info(&info, array_id, region, factors)
    }

    /// Reads `array_id` (or `region` of it) into one C-order buffer.
    pub async fn read(
        &self,
        array_id: &str,
        region: Option<&Region>,
    ) -> Result<ArrayData, ClientError> {
        let plan = self.plan(array_id, region).await?;
        self.read_plan(&plan, None).await
    }

    /// Fetches the chunks of `plan` that overlap its crop, up to
    /// `concurrency` at once, scattering each into the output as it arrives.
    /// `progress`, when given, is called with (chunks done, chunks total).
    pub async fn read_plan(
        &self,
        plan: &Plan,
        mut progress: Option<&mut (dyn FnMut(usize, usize) + Send)>,
    ) -> Result<ArrayData, ClientError> {
        let size = plan
            .crop
            .num_elements()
            .and_then(|n| n.checked_mul(plan.itemsize as u64))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| ClientError::TooLarge {
                shape: plan.crop.shape(),
                itemsize: plan.itemsize,
            })?;
        let mut bytes = vec![0u8; size];
        crate::mapping::advise_huge_pages(&mut bytes);
        let needed: Vec<&PlannedChunk> = plan.needed_chunks().collect();
        let total = needed.len();
        let mut fetches = futures::stream::iter(needed.into_iter().map(|chunk| async move {
            self.fetch_chunk(plan, chunk)
                .await
                .map(|view| (chunk, view))
        }))
        .buffer_unordered(self.inner.options.concurrency);
        let mut done = 0;
        while let Some(result) = fetches.next().await {
            let (chunk, view) = result?;
            scatter(
                &mut bytes,
                &plan.crop,
                &chunk.bounds,
                view.bytes(),
                plan.itemsize,
            );
            done += 1;
            if let Some(report) = progress.as_mut() {
                report(done, total);
            }
        }
        Ok(ArrayData {
            shape: plan.output_shape(),
            dtype: plan.dtype.clone(),
            bytes,
        })
    }

    /// Fetches every chunk of `plan` that overlaps its crop and hands them
    /// out as views, in plan order (mapped views are zero-copy).
    pub async fn fetch_views(
        &self,
        plan: &Plan,
    ) -> Result<Vec<(PlannedChunk, Arc<ChunkView>)>, ClientError> {
        futures::stream::iter(plan.needed_chunks().map(|chunk| async move {
            self.fetch_chunk(plan, chunk)
                .await
                .map(|view| (chunk.clone(), view))
        }))
        .buffered(self.inner.options.concurrency)
        .try_collect()
        .await
    }

    /// One chunk of `plan`: from this client's cache, else through the mmap
    /// fast path when it applies, else with DoGet. The view is checked
    /// against the plan (shape, dtype, byte count).
    pub async fn fetch_chunk(
        &self,
        plan: &Plan,
        chunk: &PlannedChunk,
    ) -> Result<Arc<ChunkView>, ClientError> {
        if let Some(view) = self.inner.cache.get(&chunk.ticket) {
            bump(&self.inner.counters.cache_hits);
            check_chunk(plan, chunk, &view)?;
            return Ok(view);
        }
        let view = match self.try_mapped(chunk).await {
            Some(view) => view,
            None => self.do_get(chunk).await?,
        };
        let len = check_chunk(plan, chunk, &view)?;
        let view = Arc::new(view.truncated(len));
        match view.origin() {
            ChunkOrigin::Mapped => bump(&self.inner.counters.mapped),
            ChunkOrigin::MappedCopy => bump(&self.inner.counters.mapped_copies),
            ChunkOrigin::Socket => bump(&self.inner.counters.socket),
        }
        self.inner.cache.insert(&chunk.ticket, &view);
        Ok(view)
    }

    /// The fast path; `None` means "use DoGet for this chunk".
    async fn try_mapped(&self, chunk: &PlannedChunk) -> Option<ChunkView> {
        if !self.inner.fast_path || !self.inner.locate_supported.load(Ordering::Acquire) {
            return None;
        }
        bump(&self.inner.counters.locate_probes);
        let body = match self.action(ACTION_CHUNK_LOCATE, chunk.ticket.clone()).await {
            Ok(Some(body)) => body,
            Ok(None) => {
                tracing::debug!(chunk = %chunk.bounds, "chunk_locate returned no result; using DoGet");
                return None;
            }
            Err(status) => {
                if status.message().contains(UNKNOWN_ACTION_PREFIX) {
                    tracing::info!(
                        location = self.location(),
                        "server does not know chunk_locate; using DoGet from now on"
                    );
                    self.inner.locate_supported.store(false, Ordering::Release);
                } else {
                    tracing::debug!(chunk = %chunk.bounds, error = %status, "chunk_locate failed; using DoGet");
                }
                return None;
            }
        };
        let location = match ChunkLocateReply::from_body(&body) {
            Ok(ChunkLocateReply::Located(location)) => location,
            Ok(ChunkLocateReply::Unavailable { reason }) => {
                tracing::debug!(chunk = %chunk.bounds, ?reason, "chunk not locatable; using DoGet");
                return None;
            }
            Err(e) => {
                tracing::debug!(chunk = %chunk.bounds, error = %e, "chunk_locate reply unusable; using DoGet");
                return None;
            }
        };
        match self.map_chunk(&location) {
            Ok(view) => Some(view),
            Err(reason) => {
                tracing::debug!(chunk = %chunk.bounds, segment = %location.segment_path, %reason, "mapping failed; using DoGet");
                None
            }
        }
    }

    /// Maps the located segment (after checking its inode) and reads the
    /// chunk in place; over the pin limit, copies it out instead.
    fn map_chunk(&self, location: &ChunkLocation) -> Result<ChunkView, String> {
        let file = File::open(&location.segment_path).map_err(|e| format!("open: {e}"))?;
        let meta = file.metadata().map_err(|e| format!("stat: {e}"))?;
        if meta.ino() != location.generation_id {
            return Err(format!(
                "inode {} differs from generation_id {} (segment recreated)",
                meta.ino(),
                location.generation_id
            ));
        }
        let key = InodeKey {
            dev: meta.dev(),
            ino: meta.ino(),
        };
        let needed = location
            .byte_offset
            .saturating_add(location.byte_length.max(8));
        let segment = self
            .inner
            .ledger
            .acquire(&file, key, meta.size(), needed)
            .map_err(|e| format!("mmap: {e}"))?;
        let batch = batch_at(&segment, location.byte_offset)?;
        let view = view_from_batch(&batch, ChunkOrigin::Mapped)?;
        // Arrow copies a buffer it finds misaligned; only a view that really
        // points into the mapping is handed out as `Mapped`.
        let in_place = segment
            .bytes()
            .as_ptr_range()
            .contains(&view.bytes().as_ptr());
        if segment.is_pinned() && in_place {
            Ok(view)
        } else {
            Ok(view.copied(ChunkOrigin::MappedCopy))
        }
    }

    /// The chunk over the socket. The reply is decoded here rather than by
    /// arrow-flight's `FlightRecordBatchStream`, which copies every body that is not
    /// 64-byte aligned into fresh memory: the view is a slice of the received body.
    async fn do_get(&self, chunk: &PlannedChunk) -> Result<ChunkView, ClientError> {
        let call = || format!("DoGet of chunk {}", chunk.bounds);
        let bad = |reason: String| ClientError::BadChunk {
            chunk: chunk.bounds.to_string(),
            reason,
        };
        let ticket = Ticket {
            ticket: chunk.ticket.clone().into(),
        };
        let mut stream = self
            .flight()
            .do_get(self.request(ticket))
            .await
            .map_err(|s| ClientError::rpc(call(), s))?
            .into_inner();
        let mut schema = None;
        while let Some(data) = stream
            .message()
            .await
            .map_err(|s| ClientError::rpc(call(), s))?
        {
            match stream_message(&data.data_header, data.data_body, schema.as_ref()).map_err(bad)? {
                StreamMessage::Schema(s) => schema = Some(s),
                StreamMessage::Batch(batch) => {
                    return view_from_batch(&batch, ChunkOrigin::Socket).map_err(bad);
                }
                StreamMessage::Empty => {}
            }
        }
        Err(bad("the DoGet stream held no record batch".to_string()))
    }

    /// This client's counters, cache sizes and pinned segments.
    pub fn local_stats(&self) -> LocalStats {
        let counters = &self.inner.counters;
        let (live_views, cached_copies, cached_copy_bytes) = self.inner.cache.counts();
        LocalStats {
            fast_path: self.inner.fast_path,
            locate_supported: self.inner.locate_supported.load(Ordering::Acquire),
            locate_probes: counters.locate_probes.load(Ordering::Relaxed),
            mapped_chunks: counters.mapped.load(Ordering::Relaxed),
            mapped_copies: counters.mapped_copies.load(Ordering::Relaxed),
            socket_chunks: counters.socket.load(Ordering::Relaxed),
            cache_hits: counters.cache_hits.load(Ordering::Relaxed),
            live_views,
            cached_copies,
            cached_copy_bytes,
            pinned_bytes: self.inner.ledger.pinned_bytes(),
            pinned_segments: self.inner.ledger.pinned_segments(),
        }
    }
}

/// Checks a chunk view against its plan; returns the byte count to keep.
fn check_chunk(plan: &Plan, chunk: &PlannedChunk, view: &ChunkView) -> Result<usize, ClientError> {
    let bad = |reason: String| ClientError::BadChunk {
        chunk: chunk.bounds.to_string(),
        reason,
    };
    let expected = chunk.bounds.shape();
    if view.shape() != expected.as_slice() {
        return Err(bad(format!(
            "its shape is {:?}, but its bounds span {expected:?}",
            view.shape()
        )));
    }
    if view.dtype() != plan.dtype {
        return Err(bad(format!(
            "its dtype is '{}', but the plan says '{}'",
            view.dtype(),
            plan.dtype
        )));
    }
    let needed = chunk
        .bounds
        .num_elements()
        .and_then(|n| n.checked_mul(plan.itemsize as u64))
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| bad("its byte count overflows".to_string()))?;
    if view.bytes().len() < needed {
        return Err(bad(format!(
            "it holds {} bytes, but {expected:?} of '{}' needs {needed}",
            view.bytes().len(),
            plan.dtype
        )));
    }
    Ok(needed)
}

fn tensor_info(descriptor: TensorDescriptor, array_id: &str) -> Result<TensorInfo, ClientError> {
    let unsigned = |values: &[i64], what: &str| {
        values
            .iter()
            .map(|&v| {
                u64::try_from(v).map_err(|_| ClientError::BadPlan {
                    array_id: array_id.to_string(),
                    reason: format!("{what} {values:?} has a negative value"),
                })
            })
            .collect::<Result<Vec<u64>, ClientError>>()
    };
    Ok(TensorInfo {
        shape: unsigned(&descriptor.shape, "shape")?,
        chunk_shape: unsigned(&descriptor.chunk_shape, "chunk_shape")?,
        array_id: if descriptor.array_id.is_empty() {
            array_id.to_string()
        } else {
            descriptor.array_id
        },
        dtype: descriptor.dtype,
        dim_labels: descriptor.dim_labels,
    })
}
