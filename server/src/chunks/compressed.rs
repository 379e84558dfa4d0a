//! Chunk replies with zstd-compressed buffers, for peers on other machines
//! (`--wire-compression`, docs/decisions/0039).
//!
//! A chunk's record batch message is re-encoded with Arrow IPC buffer compression (ZSTD,
//! each buffer on its own; a buffer zstd does not shrink is written raw, its uncompressed
//! length written as -1, as the format allows), then decoded again and compared with the
//! raw batch: a body that does not give back exactly the raw bytes is never served. Kept
//! bodies live in memory, least recently used dropped first past `--wire-compression-memory`,
//! keyed by the chunk id and the crc32c of the raw body, so a kept body is only ever
//! served for the bytes it was made from. The raw chunk (the store's mapping) is untouched.
//!
//! Under `auto` a pixel chunk goes compressed only to a peer whose link is slower than what
//! compression would deliver ([`pays`]): the delivery rate measured on the peer's connection
//! (the wire's `TCP_INFO` samples, handed in as [`PeerLink`]) against the chunk's sampled
//! ratio, the measured compression throughput (nothing when a body is kept) and the
//! measured decode throughput (the client's cost, judged by the server's own checking
//! decode). No measurement yet: raw. Label sets always go compressed to peers off loopback.
//! Before any of that, [`WireBodies::may_compress`] sends a pixel reply by the `off` path
//! (no checksum, no lookup, no blocking-pool hop) to a peer not measured yet, or one too
//! fast for even a kept body of the best ratio the tensor showed so far (its [`Ceiling`]).
//! Table replies (catalog answers, ROI reads) follow [`WireBodies::table_options`]: zstd
//! buffers to every peer off loopback under `auto`, no rate rule.
//!
//! ```text
//!  raw chunk ─▶ may_compress (mode, loopback peer, rate, tensor's ceiling) ─▶ raw, as `off`
//!                 │ may compress
//!                 ▼
//!  kept? (chunk id, crc32c) ─▶ declined (does not shrink) ─▶ raw
//!                 │         ─▶ compressed body: labels, or pays at this link rate ─▶ it
//!                 │ no / sampled only
//!                 ▼
//!  pixels under `auto`: 4 × 64 KiB sampled (ratio, speeds), shrinks ≥ 1.25× ? ─▶ no: raw
//!                 │ yes: pays at this link rate? ─▶ no: raw (the sample kept)
//!                 ▼
//!  re-encode with ZSTD buffers ─▶ decode, compare with the raw batch ─▶ kept, served
//!                                 (both timed: the throughputs the rule uses)
//! ```

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::CompressionType;
use arrow_ipc::reader::read_record_batch;
use arrow_ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions};
use arrow_schema::{ArrowError, SchemaRef};
use bytes::Bytes;
use lru::LruCache;

use super::EncodedChunk;
use super::label_tensors::LabelTensors;

/// Default of `--wire-compression-memory`: the bytes of compressed bodies kept.
pub const DEFAULT_WIRE_COMPRESSION_MEMORY: u64 = 256 << 20;
/// The zstd level of compressed bodies and of the sample: the fast end.
const ZSTD_LEVEL: i32 = 1;
/// Windows of the body sampled to judge a pixel chunk.
const SAMPLES: usize = 4;
/// Bytes of one sampled window.
const SAMPLE_BYTES: usize = 64 << 10;
/// A pixel chunk is compressed when its sample shrinks at least this much.
const MIN_RATIO: f64 = 1.25;
/// Compressing must be expected to deliver a pixel chunk at least this much sooner than
/// sending it raw (room for the measurements' noise).
const MARGIN: f64 = 1.15;
/// A whole chunk's compression (re-encode, checking decode, compare) against zstd alone on
/// the sample: the sample's throughput times this is the estimate until a whole chunk was
/// compressed (measured: 0.4–0.6 on microscopy-like u16).
const SAMPLE_TO_WHOLE: f64 = 0.5;
/// Weight of a new measurement in the throughputs' moving averages.
const SPEED_WEIGHT: f64 = 0.25;
/// Tensors whose [`Ceiling`] is remembered (least recently asked forgotten first).
const CEILINGS_REMEMBERED: usize = 4096;

/// When chunk replies carry zstd-compressed buffers (`wire_compression`,
/// `--wire-compression`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum WireCompression {
    /// Peers on other machines: label sets always, pixels when a sample shrinks; loopback
    /// peers get the raw reply.
    #[default]
    Auto,
    /// Never: every reply is the raw chunk.
    Off,
    /// Every peer, loopback included, every chunk.
    Zstd,
}

/// What a chunk's tensor holds, as the rule sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorKind {
    /// A label set (an upload under `@labels`, or an integer tensor `--label-tensors`
    /// names): long runs of equal integers.
    Labels,
    /// Anything else.
    Pixels,
}

/// How a reply's body is encoded (the `encoding` label of the body bytes metric).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyEncoding {
    /// The chunk as it is stored.
    Raw,
    /// Its buffers zstd-compressed by Arrow IPC.
    Zstd,
}

impl BodyEncoding {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            BodyEncoding::Raw => "raw",
            BodyEncoding::Zstd => "zstd",
        }
    }
}

/// Why a chunk could not be given a compressed body (it is then served raw).
#[derive(Debug, thiserror::Error)]
pub enum CompressError {
    /// The chunk's header is not a record batch message.
    #[error("the chunk's header is not an Arrow IPC record batch message")]
    NotABatch,
    /// Arrow refused to decode or encode it.
    #[error("{what} failed")]
    Arrow {
        /// The step that failed.
        what: &'static str,
        /// Arrow's error.
        #[source]
        source: ArrowError,
    },
    /// The compressed body decodes to other bytes than the raw chunk.
    #[error("the zstd body decodes to other bytes than the raw chunk")]
    Mismatch,
}

/// The record batch of an encoded chunk, its buffers slices of the body where aligned.
fn batch_of(chunk: &EncodedChunk, schema: &SchemaRef) -> Result<RecordBatch, CompressError> {
    let message =
        arrow_ipc::root_as_message(&chunk.header).map_err(|_| CompressError::NotABatch)?;
    let batch = message
        .header_as_record_batch()
        .ok_or(CompressError::NotABatch)?;
    read_record_batch(
        &Buffer::from(chunk.body.clone()),
        batch,
        Arc::clone(schema),
        &HashMap::new(),
        None,
        &message.version(),
    )
    .map_err(|source| CompressError::Arrow {
        what: "decoding the chunk's record batch",
        source,
    })
}

/// The chunk re-encoded with zstd buffers, checked to decode back to exactly the raw batch.
#[cfg(test)]
fn compress(raw: &EncodedChunk, schema: &SchemaRef) -> Result<EncodedChunk, CompressError> {
    compress_timed(raw, schema).map(|(chunk, _, _)| chunk)
}

/// [`compress`], with the time spent encoding and the time spent checking (decoding).
fn compress_timed(
    raw: &EncodedChunk,
    schema: &SchemaRef,
) -> Result<(EncodedChunk, Duration, Duration), CompressError> {
    let start = Instant::now();
    let batch = batch_of(raw, schema)?;
    let arrow = |what| move |source| CompressError::Arrow { what, source };
    let options = IpcWriteOptions::default()
        .try_with_compression(Some(CompressionType::ZSTD))
        .and_then(|o| o.try_with_compression_level(Some(ZSTD_LEVEL)))
        .map_err(arrow("choosing zstd buffer compression"))?;
    let (_, encoded) = IpcDataGenerator::default()
        .encode(
            &batch,
            &mut DictionaryTracker::new(false),
            &options,
            &mut IpcWriteContext::default(),
        )
        .map_err(arrow("re-encoding the chunk with zstd buffers"))?;
    let compressed = EncodedChunk {
        header: Bytes::from(encoded.ipc_message),
        body: Bytes::from(encoded.arrow_data),
    };
    let encoding = start.elapsed();
    let start = Instant::now();
    verify(&batch, &compressed, schema)?;
    Ok((compressed, encoding, start.elapsed()))
}

/// Refuses a compressed chunk that does not decode to exactly `raw`.
fn verify(
    raw: &RecordBatch,
    compressed: &EncodedChunk,
    schema: &SchemaRef,
) -> Result<(), CompressError> {
    let decoded = batch_of(compressed, schema)?;
    if &decoded == raw {
        Ok(())
    } else {
        Err(CompressError::Mismatch)
    }
}

/// What zstd does to a sample of a chunk's body.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Raw bytes over packed bytes.
    pub ratio: f64,
    /// Raw bytes zstd packed per second.
    pub compress_rate: f64,
    /// Raw bytes zstd unpacked per second.
    pub decode_rate: f64,
}

/// How much zstd shrinks `body` and how fast, judged on [`SAMPLES`] windows spread over it.
pub fn sample(body: &[u8]) -> Sample {
    let windows: Vec<&[u8]> = if body.len() <= SAMPLES * SAMPLE_BYTES {
        vec![body]
    } else {
        let step = (body.len() - SAMPLE_BYTES) / (SAMPLES - 1);
        (0..SAMPLES)
            .map(|i| &body[i * step..i * step + SAMPLE_BYTES])
            .collect()
    };
    let (mut raw, mut packed) = (0usize, 0usize);
    let (mut packing, mut unpacking) = (Duration::ZERO, Duration::ZERO);
    for window in windows {
        raw += window.len();
        let start = Instant::now();
        // A window zstd cannot pack counts as not shrinking.
        let Ok(frame) = zstd::bulk::compress(window, ZSTD_LEVEL) else {
            packed += window.len();
            continue;
        };
        packing += start.elapsed();
        packed += frame.len();
        let start = Instant::now();
        let _ = zstd::bulk::decompress(&frame, window.len());
        unpacking += start.elapsed();
    }
    Sample {
        ratio: raw as f64 / packed.max(1) as f64,
        compress_rate: raw as f64 / packing.as_secs_f64().max(1e-6),
        decode_rate: raw as f64 / unpacking.as_secs_f64().max(1e-6),
    }
}

/// What the rule knows of the peer a reply goes to.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PeerLink {
    /// The peer connected from a loopback address (it shares this machine).
    pub loopback: bool,
    /// The rate its connection delivers reply bytes, measured (or remembered for its
    /// address), bytes per second; `None` before any measurement.
    pub delivery_rate: Option<f64>,
}

/// What compressing one chunk costs and gains, as the rule estimates it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Costs {
    /// Raw bytes over compressed bytes.
    pub ratio: f64,
    /// Raw bytes per second the server compresses (and checks), or `None` when the body is
    /// kept already (no cost).
    pub compress_rate: Option<f64>,
    /// Raw bytes per second the peer decodes.
    pub decode_rate: f64,
}

/// Whether a pixel chunk is expected to reach a peer whose connection delivers
/// `delivery_rate` bytes per second sooner compressed than raw, by at least [`MARGIN`].
/// Per raw byte, raw costs `1 / rate`; compressed costs the slower of compressing it and
/// sending the smaller body (the client keeps several chunks in flight, so one chunk's
/// compression overlaps another's sending) plus the peer's decoding. Without a measured
/// rate, no.
pub fn pays(delivery_rate: Option<f64>, costs: Costs) -> bool {
    let Some(rate) = delivery_rate.filter(|r| r.is_finite() && *r > 0.0) else {
        return false;
    };
    if costs.ratio <= 1.0 {
        return false;
    }
    let raw = 1.0 / rate;
    let send = 1.0 / (rate * costs.ratio);
    let compress = costs.compress_rate.map_or(0.0, |c| 1.0 / c.max(1.0));
    let packed = send.max(compress) + 1.0 / costs.decode_rate.max(1.0);
    packed * MARGIN < raw
}

/// Moving averages of the throughputs measured on whole chunks.
#[derive(Clone, Copy, Debug, Default)]
struct Speeds {
    /// Raw bytes per second compressed and checked.
    compress: Option<f64>,
    /// Raw bytes per second decoded by the check.
    decode: Option<f64>,
}

impl Speeds {
    fn note(&mut self, raw_bytes: usize, compressing: Duration, decoding: Duration) {
        let blend = |old: Option<f64>, new: f64| {
            Some(old.map_or(new, |old| old + SPEED_WEIGHT * (new - old)))
        };
        let bytes = raw_bytes as f64;
        self.compress = blend(
            self.compress,
            bytes / (compressing + decoding).as_secs_f64().max(1e-6),
        );
        self.decode = blend(self.decode, bytes / decoding.as_secs_f64().max(1e-6));
    }
}

/// What is kept for one chunk's bytes.
#[derive(Clone)]
enum Kept {
    /// Its compressed message and how much smaller it is.
    Compressed(EncodedChunk, f64),
    /// Its sample shrinks enough, but no peer's link made compressing it pay yet.
    Sampled(Sample),
    /// Its sample does not shrink enough (or its compressed body was no smaller).
    Declined,
}

impl Kept {
    fn cost(&self, key: &BodyKey) -> u64 {
        let body = match self {
            Kept::Compressed(chunk, _) => chunk.len(),
            Kept::Sampled(_) | Kept::Declined => 0,
        };
        (body + key.0.len() + 64) as u64
    }
}

/// The most compression could gain on one tensor's pixel chunks judged so far: the best
/// ratio any of them showed (sampled or compressed; 1 for those declined) and the fastest
/// decode any of them was measured at (a sample's zstd-only rate, above what the rule
/// credits, or the measured whole-chunk one). A peer whose rate makes even a kept body of
/// that ratio not pay gets the tensor's chunks raw without a lookup ([`WireBodies::may_compress`]).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Ceiling {
    ratio: f64,
    decode: f64,
}

/// A chunk id and the crc32c of the raw body it names.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct BodyKey(Vec<u8>, u32);

/// The kept entries and the bytes they hold.
struct Held {
    entries: LruCache<BodyKey, Kept>,
    bytes: u64,
}

/// The rule of `--wire-compression` and the compressed bodies it keeps, bounded by
/// `--wire-compression-memory`.
pub struct WireBodies {
    mode: WireCompression,
    budget: u64,
    schema: SchemaRef,
    held: Mutex<Held>,
    speeds: Mutex<Speeds>,
    labels: LabelTensors,
    /// Each tensor's [`Ceiling`], by array id.
    ceilings: Mutex<LruCache<String, Ceiling>>,
    /// A [`WireBodies::compress_later`] is running.
    later: AtomicBool,
}

impl std::fmt::Debug for WireBodies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireBodies")
            .field("mode", &self.mode)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl Default for WireBodies {
    fn default() -> Self {
        Self::new(WireCompression::default(), DEFAULT_WIRE_COMPRESSION_MEMORY)
    }
}

impl WireBodies {
    /// The rule `mode`, keeping at most `budget` bytes of compressed bodies.
    pub fn new(mode: WireCompression, budget: u64) -> Self {
        Self {
            mode,
            budget,
            schema: Arc::new(tessera_segments::ipc::schema()),
            held: Mutex::new(Held {
                entries: LruCache::unbounded(),
                bytes: 0,
            }),
            speeds: Mutex::new(Speeds::default()),
            labels: LabelTensors::default(),
            ceilings: Mutex::new(LruCache::new(
                NonZeroUsize::new(CEILINGS_REMEMBERED).unwrap_or(NonZeroUsize::MIN),
            )),
            later: AtomicBool::new(false),
        }
    }

    /// Names the tensors the operator says are labels (`--label-tensors`).
    pub fn with_label_tensors(mut self, labels: LabelTensors) -> Self {
        self.labels = labels;
        self
    }

    /// The tensors the operator says are labels.
    pub fn label_tensors(&self) -> &LabelTensors {
        &self.labels
    }

    /// Whether a reply of a chunk of `tensor` (of `kind`) to a peer may be compressed at
    /// all; when not, the caller sends the raw chunk as `off` does: no lookup, no checksum,
    /// no blocking-pool hop, nothing compressed after it. Never with `off`, always with
    /// `zstd`. Under `auto`: never to a loopback peer; always for labels; for pixels, not
    /// while the peer's rate is unmeasured (the rule would send raw) nor when the rate is
    /// so high that a kept body of the best ratio any of the tensor's chunks showed would
    /// not pay (nor, then, would compressing one now: it costs more). A tensor none of
    /// whose chunks was judged yet may be compressed (its first replies sample it).
    pub fn may_compress(&self, tensor: &str, kind: TensorKind, link: PeerLink) -> bool {
        match self.mode {
            WireCompression::Off => false,
            WireCompression::Zstd => true,
            WireCompression::Auto if link.loopback => false,
            WireCompression::Auto if kind == TensorKind::Labels => true,
            WireCompression::Auto => {
                if link.delivery_rate.is_none() {
                    return false;
                }
                let Some(ceiling) = self.ceiling(tensor) else {
                    return true;
                };
                let decode = self
                    .speeds()
                    .decode
                    .map_or(ceiling.decode, |d| d.max(ceiling.decode));
                pays(
                    link.delivery_rate,
                    Costs {
                        ratio: ceiling.ratio,
                        compress_rate: None,
                        decode_rate: decode,
                    },
                )
            }
        }
    }

    /// The IPC options of a table reply (a catalog answer, a ROI read) to a peer, and the
    /// encoding they give: its buffers zstd-compressed never under `off`, always under
    /// `zstd`, and under `auto` to every peer not on loopback (tables are small and their
    /// ids, paths and geometry shrink well: no rate rule, docs/decisions/0039 item 11).
    pub fn table_options(&self, loopback: bool) -> (IpcWriteOptions, BodyEncoding) {
        let compress = match self.mode {
            WireCompression::Off => false,
            WireCompression::Auto => !loopback,
            WireCompression::Zstd => true,
        };
        if !compress {
            return (IpcWriteOptions::default(), BodyEncoding::Raw);
        }
        match IpcWriteOptions::default()
            .try_with_compression(Some(CompressionType::ZSTD))
            .and_then(|o| o.try_with_compression_level(Some(ZSTD_LEVEL)))
        {
            Ok(options) => (options, BodyEncoding::Zstd),
            Err(err) => {
                tracing::error!(error = %err, "a table reply is sent raw: zstd buffer compression is not available");
                (IpcWriteOptions::default(), BodyEncoding::Raw)
            }
        }
    }

    /// `tensor`'s ceiling, if any of its pixel chunks was judged.
    fn ceiling(&self, tensor: &str) -> Option<Ceiling> {
        self.ceilings.lock().ok()?.get(tensor).copied()
    }

    /// Raises `tensor`'s ceiling to a chunk judged at `ratio`, credited with `decode`.
    fn raise_ceiling(&self, tensor: &str, ratio: f64, decode: f64) {
        let Ok(mut ceilings) = self.ceilings.lock() else {
            return;
        };
        let raised = match ceilings.get(tensor) {
            Some(old) => Ceiling {
                ratio: old.ratio.max(ratio),
                decode: old.decode.max(decode),
            },
            None => Ceiling { ratio, decode },
        };
        if ceilings.get(tensor) != Some(&raised) {
            ceilings.put(tensor.to_string(), raised);
        }
    }

    /// The reply body for `raw`, the chunk `chunk_id` of `tensor` names, of a tensor of
    /// `kind`, to a peer [`Self::may_compress`] allowed whose connection delivers
    /// `delivery_rate` bytes per second (if measured): the kept compressed body, or one
    /// compressed now, or the raw chunk when the rule declines; `true` third when a kept body
    /// would pay on this link though compressing it now does not ([`Self::compress_later`]).
    /// Under `auto` a pixel chunk judged raises the tensor's ceiling. Compresses on the
    /// calling thread (call it on the blocking pool).
    pub fn reply(
        &self,
        tensor: &str,
        chunk_id: &[u8],
        kind: TensorKind,
        raw: EncodedChunk,
        delivery_rate: Option<f64>,
    ) -> Result<(EncodedChunk, BodyEncoding, bool), CompressError> {
        let key = BodyKey(chunk_id.to_vec(), crc32c::crc32c(&raw.body));
        let judged = self.mode == WireCompression::Auto && kind == TensorKind::Pixels;
        let speeds = self.speeds();
        let sampled = match self.lookup(&key) {
            Some(Kept::Declined) => {
                if judged {
                    self.raise_ceiling(tensor, 1.0, 0.0);
                }
                return Ok((raw, BodyEncoding::Raw, false));
            }
            Some(Kept::Compressed(chunk, ratio)) => {
                let costs = Costs {
                    ratio,
                    compress_rate: None,
                    decode_rate: speeds.decode.unwrap_or(f64::INFINITY),
                };
                if judged {
                    self.raise_ceiling(tensor, ratio, costs.decode_rate);
                }
                return Ok(if !judged || pays(delivery_rate, costs) {
                    (chunk, BodyEncoding::Zstd, false)
                } else {
                    (raw, BodyEncoding::Raw, false)
                });
            }
            Some(Kept::Sampled(sampled)) => Some(sampled),
            None => None,
        };
        if judged {
            let sampled = sampled.unwrap_or_else(|| sample(&raw.body));
            if sampled.ratio < MIN_RATIO {
                self.raise_ceiling(tensor, 1.0, 0.0);
                self.keep(key, Kept::Declined);
                return Ok((raw, BodyEncoding::Raw, false));
            }
            let costs = Costs {
                ratio: sampled.ratio,
                compress_rate: Some(
                    speeds
                        .compress
                        .unwrap_or(sampled.compress_rate * SAMPLE_TO_WHOLE),
                ),
                decode_rate: speeds
                    .decode
                    .unwrap_or(sampled.decode_rate * SAMPLE_TO_WHOLE),
            };
            // The sample's own decode rate, not the half the rule credits: zstd alone on a
            // window outruns a whole chunk's decode, so a later measured one stays below it
            // and an estimate taken while the server was busy does not shut the tensor out.
            self.raise_ceiling(
                tensor,
                costs.ratio,
                sampled.decode_rate.max(costs.decode_rate),
            );
            if !pays(delivery_rate, costs) {
                self.keep(key, Kept::Sampled(sampled));
                // Not now, but a kept body would pay on this link: compress it after this
                // reply, for the next.
                let later = pays(
                    delivery_rate,
                    Costs {
                        compress_rate: None,
                        ..costs
                    },
                );
                return Ok((raw, BodyEncoding::Raw, later));
            }
        }
        let (chunk, encoding) = self.compress_and_keep(tensor, key, kind, raw)?;
        Ok((chunk, encoding, false))
    }

    /// Compresses a chunk [`Self::reply`] sent raw but asked to be compressed later, and
    /// keeps its body for the next reply; one at a time (another asked meanwhile is left for
    /// a later reply to ask again), so the server spends at most one blocking thread on it.
    pub fn compress_later(
        &self,
        tensor: &str,
        chunk_id: &[u8],
        kind: TensorKind,
        raw: EncodedChunk,
    ) {
        if self
            .later
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        let key = BodyKey(chunk_id.to_vec(), crc32c::crc32c(&raw.body));
        if let Err(err) = self.compress_and_keep(tensor, key, kind, raw) {
            tracing::warn!(error = %err, "compressing a chunk for later replies failed; it is sent raw");
        }
        self.later.store(false, Ordering::Release);
    }

    /// Compresses `raw`, notes the throughputs (pixels only) and keeps the body (or the
    /// verdict, under `auto`, when it is no smaller).
    fn compress_and_keep(
        &self,
        tensor: &str,
        key: BodyKey,
        kind: TensorKind,
        raw: EncodedChunk,
    ) -> Result<(EncodedChunk, BodyEncoding), CompressError> {
        let (compressed, compressing, decoding) = compress_timed(&raw, &self.schema)?;
        // Label sets pack far faster than pixels: only pixels' throughputs judge pixels.
        if kind == TensorKind::Pixels
            && let Ok(mut speeds) = self.speeds.lock()
        {
            speeds.note(raw.body.len(), compressing, decoding);
        }
        if self.mode == WireCompression::Auto && compressed.len() >= raw.len() {
            self.keep(key, Kept::Declined);
            return Ok((raw, BodyEncoding::Raw));
        }
        let ratio = raw.len() as f64 / compressed.len().max(1) as f64;
        if self.mode == WireCompression::Auto && kind == TensorKind::Pixels {
            let decode = self.speeds().decode.unwrap_or(f64::INFINITY);
            self.raise_ceiling(tensor, ratio, decode);
        }
        self.keep(key, Kept::Compressed(compressed.clone(), ratio));
        Ok((compressed, BodyEncoding::Zstd))
    }

    /// The throughputs measured so far.
    fn speeds(&self) -> Speeds {
        self.speeds.lock().map_or(Speeds::default(), |s| *s)
    }

    /// Bytes of kept bodies now.
    #[cfg(test)]
    fn held_bytes(&self) -> u64 {
        self.held.lock().map_or(0, |held| held.bytes)
    }

    fn lookup(&self, key: &BodyKey) -> Option<Kept> {
        let mut held = self.held.lock().ok()?;
        held.entries.get(key).cloned()
    }

    /// Keeps `kept` under `key`, dropping the least recently used past the budget; one
    /// larger than the whole budget is not kept.
    fn keep(&self, key: BodyKey, kept: Kept) {
        let cost = kept.cost(&key);
        if cost > self.budget {
            return;
        }
        let Ok(mut held) = self.held.lock() else {
            return;
        };
        if let Some(old) = held.entries.put(key.clone(), kept) {
            held.bytes -= old.cost(&key);
        }
        held.bytes += cost;
        while held.bytes > self.budget {
            match held.entries.pop_lru() {
                Some((key, old)) => held.bytes -= old.cost(&key),
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use arrow_array::{BinaryArray, ListArray, StringArray};

    use super::*;

    /// A raw chunk message of `data` in the segment schema (one row, no compression).
    fn raw_chunk(data: &[u8]) -> EncodedChunk {
        let shape = ListArray::from_iter_primitive::<arrow_array::types::Int64Type, _, _>([Some(
            [Some(data.len() as i64)],
        )]);
        let batch = RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(BinaryArray::from_vec(vec![data])),
                Arc::new(shape),
                Arc::new(StringArray::from(vec!["|u1"])),
                Arc::new(BinaryArray::from_vec(vec![b"chunk id".as_slice()])),
            ],
        )
        .unwrap();
        let (_, encoded) = IpcDataGenerator::default()
            .encode(
                &batch,
                &mut DictionaryTracker::new(false),
                &IpcWriteOptions::default(),
                &mut IpcWriteContext::default(),
            )
            .unwrap();
        EncodedChunk {
            header: Bytes::from(encoded.ipc_message),
            body: Bytes::from(encoded.arrow_data),
        }
    }

    fn schema() -> SchemaRef {
        Arc::new(tessera_segments::ipc::schema())
    }

    /// Labels-like bytes: long runs of few values.
    fn labels(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i / 5000 % 7) as u8).collect()
    }

    /// Bytes zstd cannot shrink (xorshift).
    fn noise(len: usize) -> Vec<u8> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// The uncompressed lengths the compressed message's buffers carry (-1: stored raw).
    fn prefixes(chunk: &EncodedChunk) -> Vec<i64> {
        let message = arrow_ipc::root_as_message(&chunk.header).unwrap();
        let batch = message.header_as_record_batch().unwrap();
        assert!(batch.compression().is_some(), "not a compressed message");
        batch
            .buffers()
            .unwrap()
            .iter()
            .filter(|b| b.length() >= 8)
            .map(|b| {
                let at = b.offset() as usize;
                i64::from_le_bytes(chunk.body[at..at + 8].try_into().unwrap())
            })
            .collect()
    }

    #[test]
    fn labels_round_trip_smaller() {
        let data = labels(4 << 20);
        let raw = raw_chunk(&data);
        let compressed = compress(&raw, &schema()).unwrap();
        assert!(
            compressed.body.len() * 20 < raw.body.len(),
            "{}",
            compressed.body.len()
        );
        let batch = batch_of(&compressed, &schema()).unwrap();
        let values = batch
            .column(0)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        assert!(values.value(0) == data.as_slice());
        assert!(prefixes(&compressed).contains(&(data.len() as i64)));
    }

    #[test]
    fn noise_is_kept_raw_with_length_minus_one() {
        let data = noise(1 << 20);
        let raw = raw_chunk(&data);
        let compressed = compress(&raw, &schema()).unwrap();
        assert!(
            prefixes(&compressed).iter().all(|&p| p == -1),
            "{:?}",
            prefixes(&compressed)
        );
        let batch = batch_of(&compressed, &schema()).unwrap();
        let values = batch
            .column(0)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        assert!(values.value(0) == data.as_slice());
    }

    #[test]
    fn verification_refuses_a_body_that_decodes_to_other_bytes() {
        let data = noise(4096);
        let raw = raw_chunk(&data);
        let compressed = compress(&raw, &schema()).unwrap();
        // The values buffer is stored raw (-1): flip one of its bytes.
        let message = arrow_ipc::root_as_message(&compressed.header).unwrap();
        let values = message
            .header_as_record_batch()
            .unwrap()
            .buffers()
            .unwrap()
            .get(2);
        let mut body = compressed.body.to_vec();
        body[values.offset() as usize + 8 + 100] ^= 1;
        let corrupted = EncodedChunk {
            header: compressed.header.clone(),
            body: Bytes::from(body),
        };
        let batch = batch_of(&raw, &schema()).unwrap();
        assert!(matches!(
            verify(&batch, &corrupted, &schema()),
            Err(CompressError::Mismatch)
        ));
        assert!(verify(&batch, &compressed, &schema()).is_ok());
        // A broken zstd frame does not decode at all.
        let packed = compress(&raw_chunk(&labels(1 << 20)), &schema()).unwrap();
        let mut body = packed.body.to_vec();
        let at = body.len() / 2;
        body[at..at + 64].fill(0xAB);
        let broken = EncodedChunk {
            header: packed.header.clone(),
            body: Bytes::from(body),
        };
        let batch = batch_of(&raw_chunk(&labels(1 << 20)), &schema()).unwrap();
        assert!(verify(&batch, &broken, &schema()).is_err());
    }

    #[test]
    fn the_rule_follows_the_mode_the_peer_and_the_sample() {
        let auto = WireBodies::new(WireCompression::Auto, 64 << 20);
        let remote = PeerLink {
            loopback: false,
            delivery_rate: Some(1e6),
        };
        let local = PeerLink {
            loopback: true,
            ..remote
        };
        let pixels = TensorKind::Pixels;
        assert!(!auto.may_compress("t", pixels, local));
        assert!(auto.may_compress("t", pixels, remote));
        let off = WireBodies::new(WireCompression::Off, 1 << 20);
        assert!(!off.may_compress("t", TensorKind::Labels, remote));
        let zstd = WireBodies::new(WireCompression::Zstd, 1 << 20);
        assert!(zstd.may_compress("t", pixels, local));
        let slow = Some(1e6);
        let (_, enc, _) = auto
            .reply(
                "t",
                b"a",
                TensorKind::Pixels,
                raw_chunk(&noise(1 << 20)),
                slow,
            )
            .unwrap();
        assert_eq!(enc, BodyEncoding::Raw);
        let (_, enc, _) = auto
            .reply(
                "t",
                b"b",
                TensorKind::Pixels,
                raw_chunk(&labels(1 << 20)),
                slow,
            )
            .unwrap();
        assert_eq!(enc, BodyEncoding::Zstd);
        // Labels go compressed whatever the link, measured or not.
        for rate in [None, Some(1e13)] {
            let (_, enc, _) = auto
                .reply(
                    "t",
                    b"c",
                    TensorKind::Labels,
                    raw_chunk(&labels(1 << 20)),
                    rate,
                )
                .unwrap();
            assert_eq!(enc, BodyEncoding::Zstd);
        }
        // Labels whose bytes do not shrink at all stay raw under auto, not under zstd.
        let (_, enc, _) = auto
            .reply(
                "t",
                b"d",
                TensorKind::Labels,
                raw_chunk(&noise(1 << 16)),
                slow,
            )
            .unwrap();
        assert_eq!(enc, BodyEncoding::Raw);
        let zstd = WireBodies::new(WireCompression::Zstd, 64 << 20);
        let (_, enc, _) = zstd
            .reply(
                "t",
                b"d",
                TensorKind::Pixels,
                raw_chunk(&noise(1 << 16)),
                None,
            )
            .unwrap();
        assert_eq!(enc, BodyEncoding::Zstd);
    }

    #[test]
    fn kept_bodies_stay_under_the_budget_and_follow_the_raw_bytes() {
        let bodies = WireBodies::new(WireCompression::Zstd, 48 << 10);
        for i in 0..40u8 {
            let data = noise(8 << 10);
            let (chunk, _, _) = bodies
                .reply("t", &[i], TensorKind::Pixels, raw_chunk(&data), None)
                .unwrap();
            assert!(bodies.held_bytes() <= 48 << 10, "{}", bodies.held_bytes());
            assert!(chunk.body.len() > 8 << 10);
        }
        assert!(bodies.held_bytes() > 32 << 10);
        // The same chunk id with other raw bytes is another entry: never the old body.
        let first = labels(8 << 10);
        let (a, _, _) = bodies
            .reply("t", b"same", TensorKind::Labels, raw_chunk(&first), None)
            .unwrap();
        let other = noise(8 << 10);
        let (b, _, _) = bodies
            .reply("t", b"same", TensorKind::Labels, raw_chunk(&other), None)
            .unwrap();
        assert_ne!(a.body, b.body);
        let batch = batch_of(&b, &schema()).unwrap();
        let values = batch
            .column(0)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        assert!(values.value(0) == other.as_slice());
        // One body larger than the whole budget is served, not kept.
        let small = WireBodies::new(WireCompression::Zstd, 1024);
        let (_, enc, _) = small
            .reply(
                "t",
                b"big",
                TensorKind::Pixels,
                raw_chunk(&noise(8 << 10)),
                None,
            )
            .unwrap();
        assert_eq!(enc, BodyEncoding::Zstd);
        assert_eq!(small.held_bytes(), 0);
    }

    const MIB: f64 = (1 << 20) as f64;

    #[test]
    fn the_rate_rule_compresses_on_slow_links_only() {
        // Microscopy-like u16: 1.7×, compressing 210 MiB/s, decoding 1500 MiB/s.
        let fresh = Costs {
            ratio: 1.7,
            compress_rate: Some(210.0 * MIB),
            decode_rate: 1500.0 * MIB,
        };
        let kept = Costs {
            compress_rate: None,
            ..fresh
        };
        let gbit = 1e9 / 8.0;
        for costs in [fresh, kept] {
            assert!(pays(Some(gbit), costs), "1 Gbit/s: {costs:?}");
            assert!(!pays(Some(10.0 * gbit), costs), "10 Gbit/s: {costs:?}");
            assert!(!pays(Some(40.0 * gbit), costs), "loopback-like: {costs:?}");
            // Nothing measured yet: raw.
            assert!(!pays(None, costs));
            assert!(!pays(Some(0.0), costs));
            assert!(!pays(Some(f64::NAN), costs));
        }
        // A kept body pays on a faster link than one still to be compressed.
        assert!(pays(Some(2.5 * gbit), kept));
        assert!(!pays(Some(2.5 * gbit), fresh));
        // Compression slower than the link never pays, however well it packs.
        let slow_packer = Costs {
            ratio: 5.0,
            compress_rate: Some(50.0 * MIB),
            decode_rate: 1500.0 * MIB,
        };
        assert!(!pays(Some(gbit), slow_packer));
        assert!(pays(Some(20.0 * MIB), slow_packer));
        // A peer that decodes slower than the link: raw.
        let slow_decoder = Costs {
            decode_rate: 100.0 * MIB,
            ..kept
        };
        assert!(!pays(Some(gbit), slow_decoder));
        // Barely shrinking: the margin keeps it raw.
        let barely = Costs { ratio: 1.1, ..kept };
        assert!(!pays(Some(gbit), barely));
    }

    #[test]
    fn a_kept_body_follows_each_peers_rate() {
        let auto = WireBodies::new(WireCompression::Auto, 64 << 20);
        let data = labels(1 << 20);
        // No measurement: raw, and the sample is remembered (no body kept).
        let (_, enc, _) = auto
            .reply("t", b"p", TensorKind::Pixels, raw_chunk(&data), None)
            .unwrap();
        assert_eq!(enc, BodyEncoding::Raw);
        assert_eq!(auto.held_bytes(), b"p".len() as u64 + 64);
        // A fast link: still raw.
        let (_, enc, _) = auto
            .reply("t", b"p", TensorKind::Pixels, raw_chunk(&data), Some(1e13))
            .unwrap();
        assert_eq!(enc, BodyEncoding::Raw);
        // A slow one: compressed and kept.
        let (slow, enc, _) = auto
            .reply("t", b"p", TensorKind::Pixels, raw_chunk(&data), Some(1e6))
            .unwrap();
        assert_eq!(enc, BodyEncoding::Zstd);
        assert!(auto.held_bytes() > 64);
        // The kept body goes to the next slow peer, never to a fast one.
        let (again, enc, _) = auto
            .reply("t", b"p", TensorKind::Pixels, raw_chunk(&data), Some(2e6))
            .unwrap();
        assert_eq!(enc, BodyEncoding::Zstd);
        assert_eq!(again.body, slow.body);
        let (raw, enc, _) = auto
            .reply("t", b"p", TensorKind::Pixels, raw_chunk(&data), Some(1e13))
            .unwrap();
        assert_eq!(enc, BodyEncoding::Raw);
        assert_eq!(raw.body, raw_chunk(&data).body);
    }

    #[test]
    fn a_fast_peer_takes_the_off_path_once_the_tensor_is_judged() {
        let auto = WireBodies::new(WireCompression::Auto, 64 << 20);
        let peer = |delivery_rate| PeerLink {
            loopback: false,
            delivery_rate,
        };
        let pixels = TensorKind::Pixels;
        // Unmeasured: raw without a lookup (the rule would send it raw).
        assert!(!auto.may_compress("micro", pixels, peer(None)));
        // Measured, nothing of the tensor judged yet: the rule samples it.
        assert!(auto.may_compress("micro", pixels, peer(Some(1e13))));
        let data = labels(1 << 20);
        let (_, enc, later) = auto
            .reply("micro", b"m", pixels, raw_chunk(&data), Some(1e13))
            .unwrap();
        assert_eq!((enc, later), (BodyEncoding::Raw, false));
        // Judged: a fast peer goes raw without a lookup, a slow one still gets the rule.
        assert!(!auto.may_compress("micro", pixels, peer(Some(1e13))));
        assert!(auto.may_compress("micro", pixels, peer(Some(1e6))));
        // Another tensor is judged on its own.
        assert!(auto.may_compress("other", pixels, peer(Some(1e13))));
        // A tensor whose chunks do not shrink: raw without a lookup for every peer.
        auto.reply("noise", b"n", pixels, raw_chunk(&noise(1 << 20)), Some(1e6))
            .unwrap();
        assert!(!auto.may_compress("noise", pixels, peer(Some(1e3))));
        // Labels always get the rule; loopback never does.
        assert!(auto.may_compress("noise", TensorKind::Labels, peer(None)));
        let local = PeerLink {
            loopback: true,
            delivery_rate: Some(1e3),
        };
        assert!(!auto.may_compress("micro", TensorKind::Labels, local));
        // A faster decode measured later lifts the ceiling: fast path is withdrawn where a
        // kept body would now pay.
        let boundary = (3..=13)
            .map(|e| 10f64.powi(e))
            .find(|&rate| !auto.may_compress("micro", pixels, peer(Some(rate))))
            .unwrap();
        auto.speeds.lock().unwrap().decode = Some(1e15);
        assert!(auto.may_compress("micro", pixels, peer(Some(boundary))));
    }

    #[test]
    fn the_off_path_is_taken_only_where_the_rule_sends_raw() {
        // Whatever the rate, a reply the fast path would have sent raw is raw through the
        // rule too, with nothing compressed after it.
        for (name, data) in [("labels-like", labels(1 << 20)), ("noise", noise(1 << 20))] {
            let auto = WireBodies::new(WireCompression::Auto, 64 << 20);
            auto.reply(
                name,
                b"first",
                TensorKind::Pixels,
                raw_chunk(&data),
                Some(1e6),
            )
            .unwrap();
            for e in 0..=28 {
                let rate = 10f64.powf(3.0 + e as f64 / 2.5);
                let link = PeerLink {
                    loopback: false,
                    delivery_rate: Some(rate),
                };
                if auto.may_compress(name, TensorKind::Pixels, link) {
                    continue;
                }
                for chunk in [b"first".as_slice(), b"second"] {
                    let (_, enc, later) = auto
                        .reply(
                            name,
                            chunk,
                            TensorKind::Pixels,
                            raw_chunk(&data),
                            Some(rate),
                        )
                        .unwrap();
                    assert_eq!((enc, later), (BodyEncoding::Raw, false), "{name} at {rate}");
                }
            }
        }
    }

    #[test]
    fn tables_go_compressed_to_peers_off_loopback_under_auto() {
        let compressed = |mode, loopback| {
            let (options, encoding) = WireBodies::new(mode, 1 << 20).table_options(loopback);
            let yes = encoding == BodyEncoding::Zstd;
            // What the options write: a batch message whose header names zstd, or none.
            let batch = batch_of(&raw_chunk(&labels(1 << 16)), &schema()).unwrap();
            let (_, encoded) = IpcDataGenerator::default()
                .encode(
                    &batch,
                    &mut DictionaryTracker::new(false),
                    &options,
                    &mut IpcWriteContext::default(),
                )
                .unwrap();
            let message = arrow_ipc::root_as_message(&encoded.ipc_message).unwrap();
            let codec = message.header_as_record_batch().unwrap().compression();
            assert_eq!(
                codec.map(|c| c.codec()),
                yes.then_some(CompressionType::ZSTD)
            );
            yes
        };
        assert!(compressed(WireCompression::Auto, false));
        assert!(!compressed(WireCompression::Auto, true));
        assert!(!compressed(WireCompression::Off, false));
        assert!(compressed(WireCompression::Zstd, true));
    }

    #[test]
    fn the_sample_measures_ratio_and_speed() {
        let packed = sample(&labels(1 << 20));
        assert!(packed.ratio > 20.0, "{packed:?}");
        assert!(packed.compress_rate > 0.0 && packed.decode_rate > 0.0);
        let noisy = sample(&noise(1 << 20));
        assert!(noisy.ratio < MIN_RATIO, "{noisy:?}");
    }

    #[test]
    fn a_chunk_too_slow_to_compress_now_is_compressed_for_the_next_reply() {
        let auto = WireBodies::new(WireCompression::Auto, 64 << 20);
        // Injected measurements: compressing at 1 MB/s, decoding at 1 TB/s.
        *auto.speeds.lock().unwrap() = Speeds {
            compress: Some(1e6),
            decode: Some(1e12),
        };
        let data = labels(1 << 20);
        let link = Some(5e6);
        let (_, enc, later) = auto
            .reply("t", b"q", TensorKind::Pixels, raw_chunk(&data), link)
            .unwrap();
        assert_eq!((enc, later), (BodyEncoding::Raw, true));
        // A fast link asks for nothing later.
        let (_, _, later) = auto
            .reply("t", b"q", TensorKind::Pixels, raw_chunk(&data), Some(1e13))
            .unwrap();
        assert!(!later);
        auto.compress_later("t", b"q", TensorKind::Pixels, raw_chunk(&data));
        let (chunk, enc, later) = auto
            .reply("t", b"q", TensorKind::Pixels, raw_chunk(&data), link)
            .unwrap();
        assert_eq!((enc, later), (BodyEncoding::Zstd, false));
        let batch = batch_of(&chunk, &schema()).unwrap();
        let values = batch
            .column(0)
            .as_any()
            .downcast_ref::<BinaryArray>()
            .unwrap();
        assert!(values.value(0) == data.as_slice());
        // While one runs, another is not started.
        auto.later.store(true, Ordering::Release);
        auto.compress_later("t", b"r", TensorKind::Pixels, raw_chunk(&noise(1 << 16)));
        assert!(
            auto.lookup(&BodyKey(
                b"r".to_vec(),
                crc32c::crc32c(&raw_chunk(&noise(1 << 16)).body)
            ))
            .is_none()
        );
    }
}
