//! The request path: from an array id to the tensor a plan is cut from, and from a chunk
//! ticket to the chunk's bytes, whatever kind of source the tensor has.
//!
//! ```text
//!  array id ──▶ tensor():  `<source>/@fields/<name>` → the uploads, else the sources
//!                 │          (one resolution; the plan and the chunk routes share it)
//!  chunk ticket ──▶ chunk(): decode the id, resolve its tensor
//!                 │
//!                 ▼ tensor.source.held_chunks()
//!        Some: the source keeps its chunks encoded (an upload) ─▶ read or located there,
//!              after the source checks the ticket names one of them
//!        None: the id is checked against the tensor (version, a cell of a grid, the
//!              scale) ─▶ the chunk service decodes it once and serves it from the store
//! ```
//!
//! Nothing here asks which format a source is: a new format implements
//! [`Source`](crate::source::Source) and is served by this path as it is.

use std::sync::Arc;

use crate::chunks::{
    BodyEncoding, ChunkService, EncodedChunk, LocateOutcome, PeerLink, TensorKind, Unlocatable,
};
use crate::error::{Fault, RequestError, ServiceError, ServiceResult};
use crate::grid::chunk_id::ChunkId;
use crate::grid::route::{Route, RoutePlanner};
use crate::metrics::Metrics;
use crate::source::npy::Kind;
use crate::source::registry::Tensor;
use crate::source::sources::{LookupError, Sources};
use crate::source::{HeldLocation, SourceError};
use crate::uploads::{SCRATCH_SOURCE_ID, UploadError, Uploads, is_label_set, is_upload_id};

/// The request path over the service's collaborators (built by
/// [`ServiceState::read_path`](crate::state::ServiceState::read_path); cheap).
pub struct ReadPath<'a> {
    sources: &'a Sources,
    uploads: Option<&'a Arc<Uploads>>,
    chunks: &'a Arc<ChunkService>,
    routes: &'a RoutePlanner,
    metrics: &'a Metrics,
}

/// Who asks for a tensor, which decides how an upload that is not there is refused: a plan
/// names an unknown source, a chunk ticket one that is no upload (the words of the upload
/// calls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Asker {
    Plan,
    Chunk,
}

impl<'a> ReadPath<'a> {
    /// The request path over these collaborators.
    pub fn new(
        sources: &'a Sources,
        uploads: Option<&'a Arc<Uploads>>,
        chunks: &'a Arc<ChunkService>,
        routes: &'a RoutePlanner,
        metrics: &'a Metrics,
    ) -> Self {
        ReadPath {
            sources,
            uploads,
            chunks,
            routes,
            metrics,
        }
    }

    /// The tensor a plan of `array_id` is cut from: an upload (at any state: a producer plans
    /// its writes while it is PENDING) or a served source, reopened first if its file changed.
    pub fn tensor(&self, array_id: &str) -> ServiceResult<Arc<Tensor>> {
        self.tensor_for(array_id, Asker::Plan)
    }

    fn tensor_for(&self, array_id: &str, asker: Asker) -> ServiceResult<Arc<Tensor>> {
        let unknown = || ServiceError::from(LookupError::UnknownSource(array_id.to_string()));
        if !is_upload_id(array_id) {
            return match self.sources.resolve(array_id) {
                // The scratch source is served wherever uploads are kept, before any upload;
                // its default tensor is its first READY upload.
                Err(LookupError::UnknownSource(_)) if array_id == SCRATCH_SOURCE_ID => {
                    let uploads = self.uploads.ok_or_else(unknown)?;
                    let prefix = format!("{SCRATCH_SOURCE_ID}/");
                    uploads
                        .ready()
                        .into_iter()
                        .filter(|u| u.array_id().starts_with(&prefix))
                        .min_by_key(|u| u.array_id())
                        .map(|u| Arc::new(u.tensor()))
                        .ok_or_else(|| {
                            LookupError::NoTensorsYet(SCRATCH_SOURCE_ID.to_string()).into()
                        })
                }
                resolved => Ok(resolved?),
            };
        }
        let uploads = self.uploads.ok_or_else(unknown)?;
        match (uploads.get(array_id), asker) {
            (Some(upload), _) => Ok(Arc::new(upload.tensor())),
            (None, Asker::Plan) => Err(unknown()),
            (None, Asker::Chunk) => Err(UploadError::invalid(
                "read",
                format!("the ticket names '{array_id}', which is not an upload"),
            )
            .into()),
        }
    }

    /// The grid a plan for a peer on loopback (or not) is cut on (see [`crate::grid::route`]).
    pub fn plan_route(&self, loopback: bool) -> Route {
        self.routes.route(loopback, self.chunks.mappable())
    }

    /// The grid of a plan of `tensor` for a peer whose route is `route`: a loopback peer
    /// planned on the socket grid reads the coarse grid instead while only that one is
    /// cached, and the fine grid is filled in the background meanwhile
    /// (`chunks/regrid.rs`, docs/decisions/0023).
    pub fn route_for(&self, tensor: &Arc<Tensor>, loopback: bool, route: Route) -> Route {
        let chunks = self.chunks;
        if route == Route::Socket
            && loopback
            && chunks.mappable()
            && tensor.mapped_grid != tensor.grid
            && !chunks.ends_cached(tensor, &tensor.grid)
            && chunks.ends_cached(tensor, &tensor.mapped_grid)
        {
            chunks.fill_grid(tensor, &tensor.grid);
            return Route::Mapped;
        }
        route
    }

    /// A client asked where a chunk lives (`chunk_locate`): loopback plans may map again.
    pub fn note_locate(&self) {
        self.routes.note_locate();
    }

    /// The chunk id a ticket carries and the tensor it names.
    fn chunk(&self, chunk_id: &[u8]) -> ServiceResult<(Arc<Tensor>, ChunkId)> {
        let id =
            ChunkId::decode(chunk_id).map_err(|source| RequestError::ChunkTicket { source })?;
        let tensor = self.tensor_for(id.array_id(), Asker::Chunk)?;
        Ok((tensor, id))
    }

    /// Where the chunk a ticket names lives in a segment file (`chunk_locate`), decoding
    /// it first if it is cold, or why the client should use `do_get` instead.
    pub async fn locate_chunk(&self, chunk_id: &[u8]) -> ServiceResult<LocateOutcome> {
        let (tensor, id) = self.chunk(chunk_id)?;
        if tensor.source.held_chunks().is_some() {
            let array_id = id.array_id().to_string();
            return Ok(match held(tensor, id, |held, id| held.locate(id)).await? {
                HeldLocation::Located(location) => {
                    self.chunks.count_served(true);
                    LocateOutcome::Located(location)
                }
                HeldLocation::NeverSent => {
                    LocateOutcome::UseDoGet(Unlocatable::NeverSent { array_id })
                }
            });
        }
        check_decoded_chunk(&tensor, &id)?;
        Ok(self.chunks.locate(&tensor, &id).await?)
    }

    /// The IPC message of the chunk a ticket names, decoding it first if it is cold;
    /// counted as served by do_get. A loopback peer reading a chunk only the mapped grid
    /// has is a local client that does not map: later loopback plans use the fine grid.
    pub async fn encoded_chunk(
        &self,
        chunk_id: &[u8],
        loopback: bool,
    ) -> ServiceResult<EncodedChunk> {
        let (tensor, id) = self.chunk(chunk_id)?;
        self.encoded(tensor, id, loopback).await
    }

    /// The `do_get` reply of the chunk a ticket names: its IPC message as stored, or with
    /// its buffers zstd-compressed when `--wire-compression`'s rule says so for this peer
    /// (its address and measured delivery rate) and tensor (docs/decisions/0039). A chunk
    /// whose compression fails is sent raw.
    pub async fn wire_chunk(
        &self,
        chunk_id: &[u8],
        link: PeerLink,
    ) -> ServiceResult<(EncodedChunk, BodyEncoding)> {
        let (tensor, id) = self.chunk(chunk_id)?;
        let wire = Arc::clone(self.chunks.wire_bodies());
        // Label sets, and integer tensors the operator names as labels.
        let labels = is_label_set(id.array_id())
            || (matches!(tensor.source.dtype().kind, Kind::Int | Kind::UInt)
                && wire.label_tensors().names(id.array_id()));
        let kind = if labels {
            TensorKind::Labels
        } else {
            TensorKind::Pixels
        };
        let loopback = link.loopback;
        // Decided before anything is looked up: a reply the rule cannot compress for this
        // peer takes the `off` path (no checksum, no blocking-pool hop).
        let array_id = wire
            .may_compress(id.array_id(), kind, link)
            .then(|| id.array_id().to_string());
        let raw = self.encoded(tensor, id, loopback).await?;
        let (chunk, encoding) = if let Some(array_id) = array_id {
            let key = chunk_id.to_vec();
            let fallback = raw.clone();
            let rate = link.delivery_rate;
            let replied = {
                let wire = Arc::clone(&wire);
                tokio::task::spawn_blocking(move || {
                    let reply = wire.reply(&array_id, &key, kind, raw.clone(), rate);
                    (reply, array_id, key, raw)
                })
                .await
            };
            match replied {
                Ok((Ok((chunk, encoding, later)), array_id, key, raw)) => {
                    if later {
                        // Compressed after this reply, for the next (one at a time).
                        tokio::task::spawn_blocking(move || {
                            wire.compress_later(&array_id, &key, kind, raw)
                        });
                    }
                    (chunk, encoding)
                }
                Ok((Err(err), ..)) => {
                    tracing::error!(error = %err, "a chunk reply is sent raw: its zstd body failed");
                    (fallback, BodyEncoding::Raw)
                }
                Err(err) => {
                    tracing::error!(error = %err, "a chunk reply is sent raw: compressing it failed");
                    (fallback, BodyEncoding::Raw)
                }
            }
        } else {
            (raw, BodyEncoding::Raw)
        };
        self.metrics
            .record_do_get_body(encoding.label(), chunk.body.len() as u64);
        Ok((chunk, encoding))
    }

    /// The IPC message of `tensor`'s chunk `id`, as [`Self::encoded_chunk`] says.
    async fn encoded(
        &self,
        tensor: Arc<Tensor>,
        id: ChunkId,
        loopback: bool,
    ) -> ServiceResult<EncodedChunk> {
        if tensor.source.held_chunks().is_some() {
            let chunk = held(tensor, id, |held, id| held.read(id)).await?;
            let chunk = EncodedChunk {
                header: chunk.header,
                body: chunk.body,
            };
            self.metrics.record_do_get_bytes(chunk.len() as u64);
            self.chunks.count_served(false);
            return Ok(chunk);
        }
        check_decoded_chunk(&tensor, &id)?;
        let fine_cell = match id.scale() {
            None => tensor.grid.is_cell(id.region()),
            Some(scale) => tensor.grid.scaled(scale.factors()).is_cell(id.region()),
        };
        if loopback && !fine_cell {
            self.routes.note_local_socket_read();
        }
        let chunk = self.chunks.encoded(&tensor, &id).await?;
        self.metrics.record_do_get_bytes(chunk.len() as u64);
        Ok(chunk)
    }
}

/// Runs `ask` on the chunks `tensor`'s source holds, on the blocking pool (they are read
/// from a segment store).
async fn held<T: Send + 'static>(
    tensor: Arc<Tensor>,
    id: ChunkId,
    ask: impl FnOnce(&dyn crate::source::HeldChunks, &ChunkId) -> Result<T, SourceError>
    + Send
    + 'static,
) -> ServiceResult<T> {
    tokio::task::spawn_blocking(move || match tensor.source.held_chunks() {
        Some(held) => ask(held, &id).map_err(ServiceError::from),
        None => Err(Fault::HeldChunksGone {
            array_id: id.array_id().to_string(),
        }
        .into()),
    })
    .await
    .map_err(|e| Fault::Task {
        what: "reading a held chunk",
        source: Arc::new(e),
    })?
}

/// Checks a chunk id against the tensor whose chunks the chunk service decodes: its
/// content version current, its region a cell of one of the grids (for a scaled chunk, of
/// a grid enlarged by the scale, which must fit the tensor and not ask 'area' of bools).
fn check_decoded_chunk(tensor: &Tensor, id: &ChunkId) -> ServiceResult<()> {
    if id.version() != tensor.version {
        return Err(RequestError::TicketStale {
            array_id: id.array_id().to_string(),
        }
        .into());
    }
    let is_chunk = match id.scale() {
        None => tensor.grid_of(id.region()).is_some(),
        Some(scale) => {
            if !scale.fits(tensor.shape()) {
                return Err(RequestError::TicketScale {
                    factors: scale.factors().to_vec(),
                    array_id: id.array_id().to_string(),
                    shape: tensor.shape().to_vec(),
                }
                .into());
            }
            if tensor.source.dtype().check_scale(scale).is_err() {
                return Err(RequestError::TicketAreaOfBool {
                    array_id: id.array_id().to_string(),
                }
                .into());
            }
            tensor
                .scaled_grid_of(id.region(), scale.factors())
                .is_some()
        }
    };
    if !is_chunk {
        return Err(RequestError::TicketNotACell {
            start: id.region().start.clone(),
            stop: id.region().stop.clone(),
            array_id: id.array_id().to_string(),
        }
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::path::Path;

    use tessera_proto::pb::TensorReadOption;

    use super::*;
    use crate::chunks::MemoryStore;
    use crate::content_version::{ContentVersion, FileVersion};
    use crate::grid::ChunkGrid;
    use crate::source::npy::Dtype;
    use crate::source::origin::Origin;
    use crate::source::registry::{OpenOptions, Registry};
    use crate::source::{Source, SourceError};

    /// A second kind of source, known only to this test: a C-order `u1` array in memory.
    #[derive(Debug)]
    struct InMemory {
        shape: Vec<u64>,
        dtype: Dtype,
        bytes: Vec<u8>,
    }

    impl Source for InMemory {
        fn format(&self) -> &'static str {
            "memory"
        }

        fn path(&self) -> &Path {
            Path::new("/nonexistent/in-memory")
        }

        fn shape(&self) -> &[u64] {
            &self.shape
        }

        fn dtype(&self) -> &Dtype {
            &self.dtype
        }

        fn version(&self) -> ContentVersion {
            ContentVersion::File(FileVersion {
                dev: 1,
                ino: 2,
                size: self.bytes.len() as u64,
                mtime_ns: 3,
            })
        }

        fn read_region(
            &self,
            start: &[u64],
            stop: &[u64],
            out: &mut [u8],
        ) -> Result<(), SourceError> {
            // Rank 2: one run per row.
            let (cols, width) = (self.shape[1] as usize, (stop[1] - start[1]) as usize);
            for (i, row) in (start[0]..stop[0]).enumerate() {
                let from = row as usize * cols + start[1] as usize;
                out[i * width..(i + 1) * width].copy_from_slice(&self.bytes[from..from + width]);
            }
            Ok(())
        }
    }

    fn tensor() -> Arc<Tensor> {
        let source = InMemory {
            shape: vec![4, 6],
            dtype: Dtype::parse("|u1").unwrap(),
            bytes: (0..24).collect(),
        };
        // Cells of two rows (12 bytes).
        let grid = ChunkGrid::plan(&source.shape, 1, false, 12).unwrap();
        Arc::new(Tensor {
            array_id: "mem".to_string(),
            source_id: "mem".to_string(),
            version: source.version(),
            dim_labels: vec!["y".to_string(), "x".to_string()],
            mapped_grid: grid.clone(),
            grid,
            origin: Origin::Configured,
            meta: Default::default(),
            source: Arc::new(source),
        })
    }

    #[tokio::test]
    async fn a_source_of_another_kind_is_planned_and_read_by_the_request_path_as_it_is() {
        let registry = Registry::default().with_tensor(tensor());
        let sources = Sources::new(registry, OpenOptions::with_target(12));
        let store = MemoryStore::new(1 << 20, "a test".to_string()).unwrap();
        let chunks = Arc::new(ChunkService::new(Arc::new(store), 1 << 20, 2));
        let (routes, metrics) = (RoutePlanner::default(), Metrics::default());
        let path = ReadPath::new(&sources, None, &chunks, &routes, &metrics);

        let tensor = path.tensor("mem").unwrap();
        let request = TensorReadOption {
            array_id: "mem".to_string(),
            ..Default::default()
        };
        let planned = crate::wire::flight::plan::plan(
            &tensor,
            &request,
            &[],
            Route::Socket,
            &Default::default(),
            Vec::new(),
        )
        .unwrap();
        assert_eq!(planned.info.endpoint.len(), 2);

        let ticket = &planned.info.endpoint[1].ticket.as_ref().unwrap().ticket;
        let tessera_proto::ticket::TicketPayload::ChunkId(chunk_id) =
            tessera_proto::ticket::decode_ticket(ticket).unwrap()
        else {
            panic!("a plan's endpoint carries a chunk ticket");
        };
        let chunk = path.encoded_chunk(&chunk_id, false).await.unwrap();
        let data = &chunk.body[8..20];
        assert_eq!(data, (12..24).collect::<Vec<u8>>().as_slice());
    }
}
