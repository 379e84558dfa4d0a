//! One tensor of an upstream tensor server, served as a [`Source`]: it describes itself as
//! the upstream described it, and reads a region by fetching the upstream chunks it
//! overlaps (each fetched once however many readers wait for it) and copying their parts
//! into the caller's buffer. The chunk service then keeps the cell in the local cache like
//! any other source's, so later reads never cross the link.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use serde_json::{Map, Value};

use crate::content_version::{ContentVersion, FileVersion};
use crate::grid::Region;
use crate::source::abstraction::{NativeLevel, Scaling};
use crate::source::npy::Dtype;
use crate::source::{Source, SourceError, SourceErrorKind};
use crate::upstream::error::UpstreamError;
use crate::upstream::link::{ChunkBytes, Described, Link, UpstreamChunk};

/// Keys of the upstream's `metadata_json` this server writes itself for the local tensor.
const OWN_KEYS: [&str; 7] = [
    "format",
    "dtype",
    "shape",
    "chunk_shape",
    "mapped_chunk_shape",
    "physical_scale",
    "physical_unit",
];

/// The result of one fetch of an upstream chunk, shared by every reader that waited for it.
type Fetched = Result<Arc<ChunkBytes>, Arc<UpstreamError>>;

/// One upstream tensor.
#[derive(Debug)]
pub struct UpstreamTensor {
    link: Link,
    /// The upstream's id of the tensor.
    upstream_id: String,
    /// `grpc://host:port/ID`: the registry's path and the `source_url`.
    path: PathBuf,
    shape: Vec<u64>,
    dtype: Dtype,
    labels: Vec<String>,
    metadata: Map<String, Value>,
    physical: Option<(Vec<f64>, Vec<String>)>,
    chunks: Vec<UpstreamChunk>,
    chunk_shape: Vec<u64>,
    version: FileVersion,
    /// The stored levels the upstream advertises below full resolution, each read from
    /// the upstream's own level (never reduced here: its bytes are the upstream's).
    levels: Vec<Level>,
    /// Fetches in flight, by chunk index: a second reader of a chunk waits for the first.
    in_flight: Mutex<HashMap<usize, Arc<OnceLock<Fetched>>>>,
}

/// A stored level of an upstream tensor, as the upstream planned it.
#[derive(Debug)]
pub struct DescribedLevel {
    /// Its factors per axis against full resolution (its `scale_hint`).
    pub factors: Vec<u64>,
    /// The upstream's `precompute` plan of the whole level.
    pub described: Described,
}

/// A stored level served under the tensor's id and its place in the pyramid (`<id>.1`).
#[derive(Debug)]
struct Level {
    path: String,
    factors: Vec<u64>,
    tensor: Arc<UpstreamTensor>,
}

/// The factors of the stored levels below full resolution that `descriptor` advertises
/// (`native: true`), in its order: each is planned on the upstream as its own tensor.
pub fn stored_levels(descriptor: &tessera_proto::pb::TensorDescriptor) -> Vec<Vec<u64>> {
    descriptor
        .pyramid
        .iter()
        .filter(|level| level.native && level.scale_hint.len() == descriptor.shape.len())
        .filter(|level| level.scale_hint.iter().all(|&f| f >= 1))
        .filter(|level| level.scale_hint.iter().any(|&f| f > 1))
        .map(|level| level.scale_hint.iter().map(|&f| f as u64).collect())
        .collect()
}

impl UpstreamTensor {
    /// The tensor `described` says upstream tensor `upstream_id` is, with its stored
    /// `levels`; refused when its dtype is not served, its chunks (or a level's) do not
    /// tile its shape, or a level is not the shape the upstream advertised.
    pub fn new(
        link: Link,
        upstream_id: &str,
        described: Described,
        levels: Vec<DescribedLevel>,
    ) -> Result<UpstreamTensor, UpstreamError> {
        let base = PathBuf::from(link.address().url_of(upstream_id));
        let advertised = described.descriptor.pyramid.clone();
        let mut served = Vec::with_capacity(levels.len());
        for (index, level) in levels.into_iter().enumerate() {
            let path = (index + 1).to_string();
            let shape = level.described.descriptor.shape.clone();
            let expected = advertised
                .iter()
                .find(|l| {
                    l.scale_hint
                        .iter()
                        .map(|&f| f as u64)
                        .eq(level.factors.iter().copied())
                })
                .map(|l| l.shape.clone());
            if expected.as_ref().is_some_and(|e| *e != shape) {
                return Err(UpstreamError::BadReply {
                    upstream: link.address().base.clone(),
                    array_id: upstream_id.to_string(),
                    why: format!(
                        "its level {:?} is advertised as shape {expected:?} but planned as {shape:?}",
                        level.factors
                    ),
                });
            }
            let mut level_path = base.clone().into_os_string();
            level_path.push(format!(".{path}"));
            let tensor = Self::build(
                link.clone(),
                upstream_id,
                PathBuf::from(level_path),
                level.described,
                Vec::new(),
            )?;
            served.push(Level {
                path,
                factors: level.factors,
                tensor: Arc::new(tensor),
            });
        }
        Self::build(link, upstream_id, base, described, served)
    }

    fn build(
        link: Link,
        upstream_id: &str,
        path: PathBuf,
        described: Described,
        levels: Vec<Level>,
    ) -> Result<UpstreamTensor, UpstreamError> {
        let Described { descriptor, chunks } = described;
        let bad = |why: String| UpstreamError::BadReply {
            upstream: link.address().base.clone(),
            array_id: upstream_id.to_string(),
            why,
        };
        let shape: Vec<u64> = descriptor
            .shape
            .iter()
            .map(|&v| u64::try_from(v))
            .collect::<Result<_, _>>()
            .map_err(|_| bad(format!("negative shape {:?}", descriptor.shape)))?;
        let dtype = Dtype::parse(&descriptor.dtype)
            .map_err(|e| bad(format!("dtype '{}' is not served: {e}", descriptor.dtype)))?;
        check_tiling(&shape, &chunks).map_err(bad)?;
        let chunk_shape = chunks
            .first()
            .map_or_else(|| shape.clone(), |c| c.region.shape());
        let mut metadata = match serde_json::from_str::<Value>(&descriptor.metadata_json) {
            Ok(Value::Object(map)) => map,
            _ => Map::new(),
        };
        let upstream_format = metadata.get("format").cloned();
        metadata.retain(|key, _| !OWN_KEYS.contains(&key.as_str()));
        metadata.insert("upstream".to_string(), link.address().base.clone().into());
        metadata.insert("upstream_id".to_string(), upstream_id.into());
        if let Some(format) = upstream_format {
            metadata.insert("upstream_format".to_string(), format);
        }
        let physical = (!descriptor.physical_scale.is_empty()
            && descriptor.physical_scale.len() == shape.len())
        .then(|| {
            (
                descriptor.physical_scale.clone(),
                descriptor.physical_unit.clone(),
            )
        });
        let size = shape
            .iter()
            .try_fold(dtype.itemsize as u64, |acc, &n| acc.checked_mul(n))
            .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
        let version = FileVersion::upstream(digest(&descriptor, &chunks, &levels), size);
        let labels = descriptor.dim_labels.clone();
        Ok(UpstreamTensor {
            link,
            upstream_id: upstream_id.to_string(),
            path,
            shape,
            dtype,
            labels,
            metadata,
            physical,
            chunks,
            chunk_shape,
            version,
            levels,
            in_flight: Mutex::default(),
        })
    }

    /// The bytes of upstream chunk `index`: fetched over the link, or awaited from the
    /// reader already fetching it.
    fn chunk(&self, index: usize) -> Fetched {
        let slot = self.in_flight.lock().entry(index).or_default().clone();
        let fetched = slot
            .get_or_init(|| {
                let link = self.link.clone();
                let id = self.upstream_id.clone();
                let ticket = self.chunks[index].ticket.clone();
                tracing::debug!(upstream = %link.address().base, array_id = %id, index, "fetching an upstream chunk");
                self.link
                    .wait(async move { link.fetch(&id, ticket).await })
                    .unwrap_or_else(|| Err(self.link.stopping()))
                    .map(Arc::new)
                    .map_err(Arc::new)
            })
            .clone();
        let mut in_flight = self.in_flight.lock();
        if in_flight
            .get(&index)
            .is_some_and(|held| Arc::ptr_eq(held, &slot))
        {
            in_flight.remove(&index);
        }
        fetched
    }
}

/// A digest of what the upstream says the tensor is: any change of its content version,
/// shape, dtype, any chunk id or any stored level's version changes it.
fn digest(
    descriptor: &tessera_proto::pb::TensorDescriptor,
    chunks: &[UpstreamChunk],
    levels: &[Level],
) -> u128 {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for level in levels {
        for f in &level.factors {
            ctx.update(&f.to_be_bytes());
        }
        let v = level.tensor.version;
        ctx.update(&v.ino.to_be_bytes());
        ctx.update(&v.mtime_ns.to_be_bytes());
    }
    ctx.update(descriptor.dtype.as_bytes());
    for v in &descriptor.shape {
        ctx.update(&v.to_be_bytes());
    }
    if let Some(version) = &descriptor.content_version {
        ctx.update(&(version.len() as u64).to_be_bytes());
        ctx.update(version);
    }
    for chunk in chunks {
        ctx.update(&(chunk.ticket.len() as u64).to_be_bytes());
        ctx.update(&chunk.ticket);
    }
    let out = ctx.finish();
    let mut word = [0u8; 16];
    word.copy_from_slice(&out.as_ref()[..16]);
    u128::from_be_bytes(word)
}

/// Checks that the chunks lie inside `shape` and cover as many elements as it has (the
/// upstream's plan of the whole tensor).
fn check_tiling(shape: &[u64], chunks: &[UpstreamChunk]) -> Result<(), String> {
    let whole = Region::whole(shape);
    let mut covered: u64 = 0;
    for chunk in chunks {
        if chunk.region.rank() != shape.len() || !whole.contains(&chunk.region) {
            return Err(format!(
                "chunk {:?}..{:?} lies outside the shape {shape:?}",
                chunk.region.start, chunk.region.stop
            ));
        }
        covered = covered.saturating_add(chunk.region.num_elements().unwrap_or(u64::MAX));
    }
    let total = whole.num_elements().unwrap_or(u64::MAX);
    if covered != total && total != 0 {
        return Err(format!(
            "its chunks cover {covered} elements of the {total} of shape {shape:?}"
        ));
    }
    Ok(())
}

/// Copies the part `part` (absolute bounds) of a chunk holding `chunk` (C order) into
/// `out`, which holds `target` (C order).
fn copy_part(
    chunk: &Region,
    bytes: &[u8],
    target: &Region,
    part: &Region,
    itemsize: usize,
    out: &mut [u8],
) {
    let rank = part.rank();
    let strides = |r: &Region| {
        let mut s = vec![itemsize; rank];
        for a in (0..rank.saturating_sub(1)).rev() {
            s[a] = s[a + 1] * (r.stop[a + 1] - r.start[a + 1]) as usize;
        }
        s
    };
    let (from_strides, to_strides) = (strides(chunk), strides(target));
    let row = if rank == 0 {
        itemsize
    } else {
        (part.stop[rank - 1] - part.start[rank - 1]) as usize * itemsize
    };
    let outer: Vec<u64> = part.shape()[..rank.saturating_sub(1)].to_vec();
    let rows: u64 = outer.iter().product();
    let mut index = vec![0u64; outer.len()];
    for _ in 0..rows {
        let (mut from, mut to) = (0usize, 0usize);
        for a in 0..rank {
            let at = part.start[a] + index.get(a).copied().unwrap_or(0);
            from += (at - chunk.start[a]) as usize * from_strides[a];
            to += (at - target.start[a]) as usize * to_strides[a];
        }
        out[to..to + row].copy_from_slice(&bytes[from..from + row]);
        for a in (0..index.len()).rev() {
            index[a] += 1;
            if index[a] < outer[a] {
                break;
            }
            index[a] = 0;
        }
    }
}

impl Source for UpstreamTensor {
    fn format(&self) -> &'static str {
        "upstream"
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn shape(&self) -> &[u64] {
        &self.shape
    }

    fn dtype(&self) -> &Dtype {
        &self.dtype
    }

    fn native_chunk(&self) -> Option<Vec<u64>> {
        Some(self.chunk_shape.clone())
    }

    fn cells_are_native(&self) -> bool {
        true
    }

    fn version(&self) -> ContentVersion {
        ContentVersion::File(self.version)
    }

    fn dim_labels(&self) -> Option<Vec<String>> {
        (self.labels.len() == self.shape.len()).then(|| self.labels.clone())
    }

    fn format_metadata(&self) -> Map<String, Value> {
        self.metadata.clone()
    }

    fn physical_scale(&self) -> Option<(Vec<f64>, Vec<String>)> {
        self.physical.clone()
    }

    fn scaling(&self) -> Scaling {
        if self.levels.is_empty() {
            return Scaling::Computed;
        }
        let full = NativeLevel {
            path: "0".to_string(),
            factors: vec![1; self.shape.len()],
            shape: self.shape.clone(),
        };
        let stored = self.levels.iter().map(|l| NativeLevel {
            path: l.path.clone(),
            factors: l.factors.clone(),
            shape: l.tensor.shape.clone(),
        });
        Scaling::Native {
            levels: std::iter::once(full).chain(stored).collect(),
        }
    }

    fn level(&self, path: &str) -> Option<Arc<dyn Source>> {
        self.levels
            .iter()
            .find(|l| l.path == path)
            .map(|l| l.tensor.clone() as Arc<dyn Source>)
    }

    fn is_resident(&self) -> bool {
        false
    }

    fn waits_on_link(&self) -> bool {
        true
    }

    fn read_region(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), SourceError> {
        let target = Region::new(start.to_vec(), stop.to_vec());
        let itemsize = self.dtype.itemsize;
        let expected = target
            .num_elements()
            .and_then(|n| usize::try_from(n).ok())
            .and_then(|n| n.checked_mul(itemsize));
        if expected != Some(out.len()) {
            return Err(SourceError::new(
                SourceErrorKind::Refused,
                format!(
                    "region {start:?}..{stop:?} of upstream tensor '{}' does not fit a buffer of {} bytes",
                    self.upstream_id,
                    out.len()
                ),
            ));
        }
        for (index, chunk) in self.chunks.iter().enumerate() {
            let Some(part) = chunk.region.intersect(&target) else {
                continue;
            };
            if part.is_empty() {
                continue;
            }
            let fetched = self.chunk(index).map_err(|e| e.to_source_error())?;
            let bytes = fetched.as_slice();
            let want = chunk
                .region
                .num_elements()
                .and_then(|n| usize::try_from(n).ok())
                .map(|n| n * itemsize);
            if want != Some(bytes.len()) {
                return Err(UpstreamError::BadReply {
                    upstream: self.link.address().base.clone(),
                    array_id: self.upstream_id.clone(),
                    why: format!(
                        "chunk {:?}..{:?} came with {} bytes",
                        chunk.region.start,
                        chunk.region.stop,
                        bytes.len()
                    ),
                }
                .to_source_error());
            }
            copy_part(&chunk.region, bytes, &target, &part, itemsize, out);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_of_a_chunk_lands_at_its_place_in_the_target() {
        // A 2x4 chunk at (2, 0) of u8 values r*10 + c, the target rows 1..4, cols 1..3.
        let chunk = Region::new(vec![2, 0], vec![4, 4]);
        let bytes: Vec<u8> = (2..4u8)
            .flat_map(|r| (0..4u8).map(move |c| r * 10 + c))
            .collect();
        let target = Region::new(vec![1, 1], vec![4, 3]);
        let part = chunk.intersect(&target).unwrap_or_else(|| target.clone());
        let mut out = vec![0u8; 6];
        copy_part(&chunk, &bytes, &target, &part, 1, &mut out);
        assert_eq!(out, [0, 0, 21, 22, 31, 32]);
    }
}
