//! The chunk id codec: the opaque bytes inside a `TensorTicket` that name one
//! chunk, and the key of that chunk in the segment store.
//!
//! Clients treat a chunk id as opaque but key their caches on it, so one id
//! must always mean the same bytes. The id therefore carries the array id, the
//! absolute chunk bounds and the source's content version: a file changed in
//! place gets new ids. **The format is compatibility-pinned** (tests hold a
//! byte-exact vector); change it only with a new version byte.
//!
//! # Format, version 1 (all integers big-endian)
//!
//! ```text
//! offset  size        field
//! 0       2           magic 0x54 0x53 ("TS")
//! 2       1           format version = 1
//! 3       2           u16 L = byte length of the array id (1..=1024)
//! 5       L           array id, UTF-8
//! 5+L     8           u64 dev      ┐
//! 13+L    8           u64 ino      │ content version
//! 21+L    8           u64 size     │ of the source
//! 29+L    8           i64 mtime_ns ┘
//! 37+L    1           u8 N = number of axes (1..=32)
//! 38+L    8·N         u64 start per axis  ┐ absolute base coordinates,
//! 38+L+8N 8·N         u64 stop per axis   ┘ stop exclusive, start <= stop
//! ```
//!
//! Total length: `38 + L + 16·N` bytes; nothing may follow.
//!
//! # Format, version 2: a scaled chunk (docs/decisions/0018)
//!
//! Version 1's fields, with version byte 2, then:
//!
//! ```text
//! 38+L+16N 8·N        u64 scale factor per axis (each >= 1, at least one > 1)
//! 38+L+24N 1          u8 method: 0x01 nearest, 0x02 area (the reference's codes)
//! ```
//!
//! Total length: `39 + L + 24·N` bytes. The bounds are the block of the source the
//! chunk reduces (absolute base coordinates); the chunk's bytes are its reduction.
//! A full-resolution chunk is always version 1 (a version 2 id with every factor 1 is
//! refused), so every chunk has exactly one id and the ids of version 1 are unchanged.
//!
//! # Format, version 3: a chunk of an upload (docs/decisions/0019, 0028)
//!
//! Version 1's layout with version byte 3, its content version an upload's
//! ([`UploadVersion`]) in 24 bytes instead of a file's 32:
//!
//! ```text
//! 5+L     8           u64 uid         ┐ content version
//! 13+L    8           u64 size        │ of the upload
//! 21+L    8           i64 created_ns  ┘
//! 29+L    1           u8 N = number of axes (1..=32)
//! 30+L    16·N        start and stop per axis, as in version 1
//! ```
//!
//! Total length: `30 + L + 16·N` bytes. Uploads have no scaled chunks. Versions 1 and 2
//! always carry a file's version ([`FileVersion`]), so the format byte says the kind.
//! Ids of uploads minted before version 3 existed (version 1, the uid where a file's inode
//! stands) decode as a file's version, which no upload has: they are refused as tickets of
//! an earlier upload, never read as another upload's bytes.
//!
//! Decoding never panics and never allocates more than the input can back. Whether
//! the bounds name a real cell of the tensor is the grid's question
//! ([`ChunkGrid::is_cell`](crate::grid::ChunkGrid::is_cell)), not the codec's.

pub use crate::content_version::{ContentVersion, FileVersion, UploadVersion};
use crate::grid::scaled::{Method, Scale};
use crate::grid::{MAX_RANK, Region};

/// The two magic bytes every chunk id starts with: `"TS"`.
pub const MAGIC: [u8; 2] = *b"TS";

/// The format version of a full-resolution chunk id.
pub const FORMAT_VERSION: u8 = 1;

/// The format version of a scaled chunk id (version 1 plus scale and method).
pub const SCALED_FORMAT_VERSION: u8 = 2;

/// The format version of a chunk id of an upload (its version in place of a file's).
pub const UPLOAD_FORMAT_VERSION: u8 = 3;

/// The longest array id a chunk id can carry, in UTF-8 bytes.
pub const MAX_ARRAY_ID_BYTES: usize = 1024;

/// Magic, version and array-id length: the fixed bytes before the array id.
const HEADER_BYTES: usize = 5;

/// Why a chunk id was refused, when built or when decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChunkIdError {
    /// Shorter than the fixed header.
    #[error("chunk id is {len} bytes: too short for the 'TS' header ({HEADER_BYTES} bytes)")]
    TooShort {
        /// The input length.
        len: usize,
    },
    /// The magic bytes are wrong.
    #[error("chunk id does not start with the 'TS' magic (found {found:02x?})")]
    BadMagic {
        /// The first two bytes found.
        found: [u8; 2],
    },
    /// The version byte is not one we know.
    #[error("chunk id has unknown version {0}")]
    UnknownVersion(u8),
    /// The array id is empty or too long.
    #[error("chunk id array id is {0} bytes (must be 1..={MAX_ARRAY_ID_BYTES})")]
    ArrayIdLength(usize),
    /// The array id is not valid UTF-8.
    #[error("chunk id array id is not UTF-8")]
    ArrayIdNotUtf8,
    /// The input ends inside a field.
    #[error("chunk id is truncated: {field} needs {needed} bytes but {remaining} remain")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// Bytes the field needs.
        needed: usize,
        /// Bytes left in the input.
        remaining: usize,
    },
    /// No axes.
    #[error("chunk id declares 0 axes (at least 1)")]
    NoAxes,
    /// Too many axes.
    #[error("chunk id declares {0} axes (at most {MAX_RANK})")]
    TooManyAxes(usize),
    /// The bounds' start and stop lists differ in length.
    #[error("chunk id region has {starts} starts but {stops} stops")]
    RankMismatch {
        /// Length of the start list.
        starts: usize,
        /// Length of the stop list.
        stops: usize,
    },
    /// A start lies after its stop.
    #[error("chunk id has start {start} > stop {stop} on axis {axis}")]
    StartAfterStop {
        /// The offending axis.
        axis: usize,
        /// The start on that axis.
        start: u64,
        /// The stop on that axis.
        stop: u64,
    },
    /// Bytes follow the last field.
    #[error("chunk id has {0} trailing bytes")]
    Trailing(usize),
    /// A scale factor of 0.
    #[error("chunk id has scale factor 0 on axis {axis} (each factor must be at least 1)")]
    ScaleZero {
        /// The offending axis.
        axis: usize,
    },
    /// A scaled id whose factors are all 1: that chunk's id is the version 1 one.
    #[error(
        "chunk id of version 2 has every scale factor 1 (a full-resolution chunk is version 1)"
    )]
    TrivialScale,
    /// The scale has another rank than the bounds.
    #[error("chunk id scale has {scale} factors but the region has {rank} axes")]
    ScaleRank {
        /// Factors given.
        scale: usize,
        /// The region's rank.
        rank: usize,
    },
    /// A method byte no version of the codec wrote.
    #[error("chunk id has unknown reduction method code {0:#04x}")]
    UnknownMethod(u8),
    /// A scaled chunk of an upload: uploads are read at full resolution only.
    #[error("chunk id of an upload cannot be scaled (uploads are read at full resolution)")]
    ScaledUpload,
}

/// One chunk of one tensor at one content version. Built only through
/// [`ChunkId::new`] or [`ChunkId::decode`], so every value is encodable and
/// decodes back to itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChunkId {
    array_id: String,
    version: ContentVersion,
    region: Region,
    scale: Option<Scale>,
}

impl ChunkId {
    /// A chunk id, validated: array id of 1..=1024 UTF-8 bytes, 1..=32 axes,
    /// equal start and stop lengths, `start <= stop` on every axis.
    pub fn new(
        array_id: impl Into<String>,
        version: impl Into<ContentVersion>,
        region: Region,
    ) -> Result<ChunkId, ChunkIdError> {
        let array_id = array_id.into();
        let version = version.into();
        check_array_id_len(array_id.len())?;
        if region.start.len() != region.stop.len() {
            return Err(ChunkIdError::RankMismatch {
                starts: region.start.len(),
                stops: region.stop.len(),
            });
        }
        check_rank(region.start.len())?;
        check_order(&region)?;
        Ok(ChunkId {
            array_id,
            version,
            region,
            scale: None,
        })
    }

    /// A scaled chunk id: the block `region` of the source reduced by `scale`. Validated
    /// like [`ChunkId::new`], and the scale must have the region's rank.
    pub fn scaled(
        array_id: impl Into<String>,
        version: impl Into<ContentVersion>,
        region: Region,
        scale: Scale,
    ) -> Result<ChunkId, ChunkIdError> {
        let mut id = ChunkId::new(array_id, version, region)?;
        if let ContentVersion::Upload(_) = id.version {
            return Err(ChunkIdError::ScaledUpload);
        }
        if scale.factors().len() != id.region.rank() {
            return Err(ChunkIdError::ScaleRank {
                scale: scale.factors().len(),
                rank: id.region.rank(),
            });
        }
        id.scale = Some(scale);
        Ok(id)
    }

    /// The same block at another scale (`None`: full resolution), keeping the rest. An
    /// upload's chunk stays at full resolution (uploads have no scaled chunks).
    pub fn with_scale(&self, scale: Option<Scale>) -> ChunkId {
        let scale = match self.version {
            ContentVersion::File(_) => scale,
            ContentVersion::Upload(_) => None,
        };
        ChunkId {
            scale,
            ..self.clone()
        }
    }

    /// The scale and method of a scaled chunk; `None` for a full-resolution one.
    pub fn scale(&self) -> Option<&Scale> {
        self.scale.as_ref()
    }

    /// The array (tensor) id.
    pub fn array_id(&self) -> &str {
        &self.array_id
    }

    /// The source's content version.
    pub fn version(&self) -> ContentVersion {
        self.version
    }

    /// The chunk's absolute bounds in the tensor (for a scaled chunk, of the block of
    /// the source it reduces).
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// The wire bytes (see the module docs for the layout).
    pub fn encode(&self) -> Vec<u8> {
        let rank = self.region.rank();
        let mut out = Vec::with_capacity(HEADER_BYTES + self.array_id.len() + 34 + 24 * rank);
        out.extend_from_slice(&MAGIC);
        out.push(match (self.version, &self.scale) {
            (ContentVersion::Upload(_), _) => UPLOAD_FORMAT_VERSION,
            (ContentVersion::File(_), None) => FORMAT_VERSION,
            (ContentVersion::File(_), Some(_)) => SCALED_FORMAT_VERSION,
        });
        // Both narrowing conversions are bounded by the checks in `new`/`decode`.
        out.extend_from_slice(&(self.array_id.len() as u16).to_be_bytes());
        out.extend_from_slice(self.array_id.as_bytes());
        match self.version {
            ContentVersion::File(v) => {
                out.extend_from_slice(&v.dev.to_be_bytes());
                out.extend_from_slice(&v.ino.to_be_bytes());
                out.extend_from_slice(&v.size.to_be_bytes());
                out.extend_from_slice(&v.mtime_ns.to_be_bytes());
            }
            ContentVersion::Upload(v) => {
                out.extend_from_slice(&v.uid.to_be_bytes());
                out.extend_from_slice(&v.size.to_be_bytes());
                out.extend_from_slice(&v.created_ns.to_be_bytes());
            }
        }
        out.push(rank as u8);
        for v in self.region.start.iter().chain(&self.region.stop) {
            out.extend_from_slice(&v.to_be_bytes());
        }
        if let Some(scale) = &self.scale {
            for f in scale.factors() {
                out.extend_from_slice(&f.to_be_bytes());
            }
            out.push(scale.method().code());
        }
        out
    }

    /// The key of this chunk in the segment store: the encoded id.
    pub fn segment_key(&self) -> Vec<u8> {
        self.encode()
    }

    /// Parses wire bytes, refusing anything that [`ChunkId::encode`] would not
    /// have produced.
    pub fn decode(bytes: &[u8]) -> Result<ChunkId, ChunkIdError> {
        if bytes.len() < HEADER_BYTES {
            return Err(ChunkIdError::TooShort { len: bytes.len() });
        }
        let mut r = Reader { rest: bytes };
        let magic = r.array::<2>("the magic")?;
        if magic != MAGIC {
            return Err(ChunkIdError::BadMagic { found: magic });
        }
        let [format] = r.array::<1>("the version")?;
        if !(FORMAT_VERSION..=UPLOAD_FORMAT_VERSION).contains(&format) {
            return Err(ChunkIdError::UnknownVersion(format));
        }
        let id_len = usize::from(u16::from_be_bytes(r.array("the array id length")?));
        check_array_id_len(id_len)?;
        let id_bytes = r.take("the array id", id_len)?;
        let array_id = std::str::from_utf8(id_bytes)
            .map_err(|_| ChunkIdError::ArrayIdNotUtf8)?
            .to_owned();
        let version = if format == UPLOAD_FORMAT_VERSION {
            ContentVersion::Upload(UploadVersion {
                uid: u64::from_be_bytes(r.array("the content version")?),
                size: u64::from_be_bytes(r.array("the content version")?),
                created_ns: i64::from_be_bytes(r.array("the content version")?),
            })
        } else {
            ContentVersion::File(FileVersion {
                dev: u64::from_be_bytes(r.array("the content version")?),
                ino: u64::from_be_bytes(r.array("the content version")?),
                size: u64::from_be_bytes(r.array("the content version")?),
                mtime_ns: i64::from_be_bytes(r.array("the content version")?),
            })
        };
        let [rank] = r.array::<1>("the axis count")?;
        let rank = usize::from(rank);
        check_rank(rank)?;
        // Check the whole bounds block is present before allocating for it.
        let bounds = r.take("the chunk bounds", 16 * rank)?;
        let scale = if format == SCALED_FORMAT_VERSION {
            let factors = words(r.take("the scale factors", 8 * rank)?);
            let [code] = r.array::<1>("the reduction method")?;
            Some((factors, code))
        } else {
            None
        };
        if !r.rest.is_empty() {
            return Err(ChunkIdError::Trailing(r.rest.len()));
        }
        let values = words(bounds);
        let region = Region::new(values[..rank].to_vec(), values[rank..].to_vec());
        check_order(&region)?;
        let scale = match scale {
            None => None,
            Some((factors, code)) => {
                if let Some(axis) = factors.iter().position(|&f| f == 0) {
                    return Err(ChunkIdError::ScaleZero { axis });
                }
                let method = Method::from_code(code).ok_or(ChunkIdError::UnknownMethod(code))?;
                Some(Scale::new(factors, method).ok_or(ChunkIdError::TrivialScale)?)
            }
        };
        Ok(ChunkId {
            array_id,
            version,
            region,
            scale,
        })
    }
}

/// A cursor over the input that refuses reads past its end.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    /// The next `n` bytes of `field`.
    fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], ChunkIdError> {
        if self.rest.len() < n {
            return Err(ChunkIdError::Truncated {
                field,
                needed: n,
                remaining: self.rest.len(),
            });
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    /// The next `N` bytes of `field` as an array.
    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], ChunkIdError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(field, N)?);
        Ok(out)
    }
}

/// Big-endian u64 words of `bytes` (a multiple of 8 long).
fn words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|b| {
            let mut word = [0u8; 8];
            word.copy_from_slice(b);
            u64::from_be_bytes(word)
        })
        .collect()
}

/// Refuses an empty or over-long array id.
fn check_array_id_len(len: usize) -> Result<(), ChunkIdError> {
    if (1..=MAX_ARRAY_ID_BYTES).contains(&len) {
        Ok(())
    } else {
        Err(ChunkIdError::ArrayIdLength(len))
    }
}

/// Refuses a rank outside `1..=MAX_RANK`.
fn check_rank(rank: usize) -> Result<(), ChunkIdError> {
    match rank {
        0 => Err(ChunkIdError::NoAxes),
        r if r > MAX_RANK => Err(ChunkIdError::TooManyAxes(r)),
        _ => Ok(()),
    }
}

/// Refuses a region with start after stop on some axis.
fn check_order(region: &Region) -> Result<(), ChunkIdError> {
    for (axis, (&start, &stop)) in region.start.iter().zip(&region.stop).enumerate() {
        if start > stop {
            return Err(ChunkIdError::StartAfterStop { axis, start, stop });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn upload() -> UploadVersion {
        UploadVersion {
            uid: 7,
            size: 48,
            created_ns: -5,
        }
    }

    fn region() -> Region {
        Region::new(vec![0, 16], vec![16, 32])
    }

    #[test]
    fn an_upload_chunk_is_format_3_and_round_trips() {
        let id = ChunkId::new("scratch/@fields/t", upload(), region()).unwrap();
        let bytes = id.encode();
        assert_eq!(bytes[2], UPLOAD_FORMAT_VERSION);
        assert_eq!(bytes.len(), 30 + "scratch/@fields/t".len() + 16 * 2);
        let back = ChunkId::decode(&bytes).unwrap();
        assert_eq!(back, id);
        assert_eq!(back.version(), ContentVersion::Upload(upload()));
        let scale = Scale::new(vec![2, 2], Method::Nearest).unwrap();
        assert_eq!(
            ChunkId::scaled("scratch/@fields/t", upload(), region(), scale.clone()).unwrap_err(),
            ChunkIdError::ScaledUpload
        );
        assert_eq!(id.with_scale(Some(scale)), id);
    }

    #[test]
    fn an_upload_id_minted_before_format_3_reads_as_a_file_version_no_upload_has() {
        // Before format 3 an upload's id was format 1 with device 0 and its uid as inode.
        let old = ChunkId::new(
            "scratch/@fields/t",
            FileVersion {
                dev: 0,
                ino: 7,
                size: 48,
                mtime_ns: -5,
            },
            region(),
        )
        .unwrap();
        let back = ChunkId::decode(&old.encode()).unwrap();
        assert!(matches!(back.version(), ContentVersion::File(_)));
        assert_ne!(back.version(), ContentVersion::Upload(upload()));
    }

    #[test]
    fn a_truncated_upload_id_is_refused() {
        let bytes = ChunkId::new("u/@fields/t", upload(), region())
            .unwrap()
            .encode();
        for len in 0..bytes.len() {
            assert!(ChunkId::decode(&bytes[..len]).is_err(), "{len}");
        }
    }
}
