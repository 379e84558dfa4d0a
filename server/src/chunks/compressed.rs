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
//! ```text
//!  raw chunk ─▶ rule (mode, loopback peer, labels or pixels) ─▶ raw: served as it is
//!                 │ compress
//!                 ▼
//!  kept? (chunk id, crc32c) ─▶ yes: the kept body
//!                 │ no
//!                 ▼
//!  pixels under `auto`: 4 × 64 KiB sampled, shrinks ≥ 1.25× ? ─▶ no: raw (remembered)
//!                 │ yes
//!                 ▼
//!  re-encode with ZSTD buffers ─▶ decode, compare with the raw batch ─▶ kept, served
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_buffer::Buffer;
use arrow_ipc::CompressionType;
use arrow_ipc::reader::read_record_batch;
use arrow_ipc::writer::{DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions};
use arrow_schema::{ArrowError, SchemaRef};
use bytes::Bytes;
use lru::LruCache;

use super::EncodedChunk;

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
    /// A label set (an upload under `@labels`): long runs of equal integers.
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
pub fn compress(raw: &EncodedChunk, schema: &SchemaRef) -> Result<EncodedChunk, CompressError> {
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
    verify(&batch, &compressed, schema)?;
    Ok(compressed)
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

/// How much zstd shrinks `body`, judged on [`SAMPLES`] windows spread over it.
pub fn sampled_ratio(body: &[u8]) -> f64 {
    let windows: Vec<&[u8]> = if body.len() <= SAMPLES * SAMPLE_BYTES {
        vec![body]
    } else {
        let step = (body.len() - SAMPLE_BYTES) / (SAMPLES - 1);
        (0..SAMPLES)
            .map(|i| &body[i * step..i * step + SAMPLE_BYTES])
            .collect()
    };
    let (mut raw, mut packed) = (0usize, 0usize);
    for window in windows {
        raw += window.len();
        // A window zstd cannot pack counts as not shrinking.
        packed += zstd::bulk::compress(window, ZSTD_LEVEL).map_or(window.len(), |c| c.len());
    }
    raw as f64 / packed.max(1) as f64
}

/// What is kept for one chunk's bytes.
#[derive(Clone)]
enum Kept {
    /// Its compressed message.
    Compressed(EncodedChunk),
    /// The rule judged it not worth compressing.
    Declined,
}

impl Kept {
    fn cost(&self, key: &BodyKey) -> u64 {
        let body = match self {
            Kept::Compressed(chunk) => chunk.len(),
            Kept::Declined => 0,
        };
        (body + key.0.len() + 64) as u64
    }
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
        }
    }

    /// Whether a reply to a peer may be compressed at all: not with `off`, and not to a
    /// loopback peer under `auto` (which then pays nothing, not even a checksum).
    pub fn may_compress(&self, loopback: bool) -> bool {
        match self.mode {
            WireCompression::Off => false,
            WireCompression::Auto => !loopback,
            WireCompression::Zstd => true,
        }
    }

    /// The reply body for `raw`, the chunk `chunk_id` names, of a tensor of `kind`, to a
    /// peer [`Self::may_compress`] allowed: the kept compressed body, or one compressed now,
    /// or the raw chunk when the rule declines. Compresses on the calling thread (call it
    /// on the blocking pool).
    pub fn reply(
        &self,
        chunk_id: &[u8],
        kind: TensorKind,
        raw: EncodedChunk,
    ) -> Result<(EncodedChunk, BodyEncoding), CompressError> {
        let key = BodyKey(chunk_id.to_vec(), crc32c::crc32c(&raw.body));
        match self.lookup(&key) {
            Some(Kept::Compressed(chunk)) => return Ok((chunk, BodyEncoding::Zstd)),
            Some(Kept::Declined) => return Ok((raw, BodyEncoding::Raw)),
            None => {}
        }
        let judged = self.mode == WireCompression::Auto;
        if judged && kind == TensorKind::Pixels && sampled_ratio(&raw.body) < MIN_RATIO {
            self.keep(key, Kept::Declined);
            return Ok((raw, BodyEncoding::Raw));
        }
        let compressed = compress(&raw, &self.schema)?;
        if judged && compressed.len() >= raw.len() {
            self.keep(key, Kept::Declined);
            return Ok((raw, BodyEncoding::Raw));
        }
        self.keep(key, Kept::Compressed(compressed.clone()));
        Ok((compressed, BodyEncoding::Zstd))
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
        assert!(!auto.may_compress(true));
        assert!(auto.may_compress(false));
        assert!(!WireBodies::new(WireCompression::Off, 1 << 20).may_compress(false));
        assert!(WireBodies::new(WireCompression::Zstd, 1 << 20).may_compress(true));
        let (_, enc) = auto
            .reply(b"a", TensorKind::Pixels, raw_chunk(&noise(1 << 20)))
            .unwrap();
        assert_eq!(enc, BodyEncoding::Raw);
        let (_, enc) = auto
            .reply(b"b", TensorKind::Pixels, raw_chunk(&labels(1 << 20)))
            .unwrap();
        assert_eq!(enc, BodyEncoding::Zstd);
        let (_, enc) = auto
            .reply(b"c", TensorKind::Labels, raw_chunk(&labels(1 << 20)))
            .unwrap();
        assert_eq!(enc, BodyEncoding::Zstd);
        // Labels whose bytes do not shrink at all stay raw under auto, not under zstd.
        let (_, enc) = auto
            .reply(b"d", TensorKind::Labels, raw_chunk(&noise(1 << 16)))
            .unwrap();
        assert_eq!(enc, BodyEncoding::Raw);
        let zstd = WireBodies::new(WireCompression::Zstd, 64 << 20);
        let (_, enc) = zstd
            .reply(b"d", TensorKind::Pixels, raw_chunk(&noise(1 << 16)))
            .unwrap();
        assert_eq!(enc, BodyEncoding::Zstd);
    }

    #[test]
    fn kept_bodies_stay_under_the_budget_and_follow_the_raw_bytes() {
        let bodies = WireBodies::new(WireCompression::Zstd, 48 << 10);
        for i in 0..40u8 {
            let data = noise(8 << 10);
            let (chunk, _) = bodies
                .reply(&[i], TensorKind::Pixels, raw_chunk(&data))
                .unwrap();
            assert!(bodies.held_bytes() <= 48 << 10, "{}", bodies.held_bytes());
            assert!(chunk.body.len() > 8 << 10);
        }
        assert!(bodies.held_bytes() > 32 << 10);
        // The same chunk id with other raw bytes is another entry: never the old body.
        let first = labels(8 << 10);
        let (a, _) = bodies
            .reply(b"same", TensorKind::Labels, raw_chunk(&first))
            .unwrap();
        let other = noise(8 << 10);
        let (b, _) = bodies
            .reply(b"same", TensorKind::Labels, raw_chunk(&other))
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
        let (_, enc) = small
            .reply(b"big", TensorKind::Pixels, raw_chunk(&noise(8 << 10)))
            .unwrap();
        assert_eq!(enc, BodyEncoding::Zstd);
        assert_eq!(small.held_bytes(), 0);
    }
}
