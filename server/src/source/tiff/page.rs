//! One page's geometry: its size, samples, dtype, codec, and how it is cut into strips or
//! tiles (chunky or planar), checked against the file before anything is read from it.

use super::decode::Codec;
use super::ifd::{Directory, tag};
use crate::source::npy::{ByteOrder, Dtype, Kind};

/// Largest decoded strip or tile accepted (bytes): a chunk is decoded whole, so this bounds
/// what one decode allocates.
pub const MAX_CHUNK_BYTES: u64 = 256 << 20;

/// A page's layout, as its tags declare it.
#[derive(Clone, Debug, PartialEq)]
pub struct Page {
    /// Width in pixels.
    pub width: u64,
    /// Height in pixels.
    pub height: u64,
    /// Samples per pixel.
    pub samples: u64,
    /// Samples stored in separate planes (PlanarConfiguration 2).
    pub planar: bool,
    /// The element type, in the file's byte order.
    pub dtype: Dtype,
    /// The codec of its strips or tiles.
    pub codec: Codec,
    /// Predictor: 1 none, 2 horizontal, 3 floating point.
    pub predictor: u16,
    /// A strip's or tile's width (a strip: the page's width).
    pub chunk_width: u64,
    /// A strip's or tile's height (a strip: its rows).
    pub chunk_height: u64,
    /// Tiles (else strips).
    pub tiled: bool,
    /// Where each strip or tile starts, plane by plane.
    pub offsets: Vec<u64>,
    /// Each strip's or tile's stored bytes.
    pub byte_counts: Vec<u64>,
    /// Shared JPEG tables (JPEGTables), prepended to each JPEG chunk.
    pub jpeg_tables: Option<Vec<u8>>,
}

/// Why a page cannot be laid out: a message, and whether it is an unsupported compression
/// or sample kind (named) rather than a malformed page.
#[derive(Debug, PartialEq)]
pub enum PageError {
    /// The tags contradict each other or the file.
    Malformed(String),
    /// A compression that is not read, by name.
    Compression(String),
    /// Samples that are not served.
    Samples(String),
}

impl Page {
    /// The page `dir` describes in a file of `size` bytes, `little`-endian.
    pub fn from_directory(dir: &Directory, little: bool, size: u64) -> Result<Page, PageError> {
        let bad = PageError::Malformed;
        let width = dir
            .uint(tag::WIDTH)
            .ok_or_else(|| bad("no ImageWidth".into()))?;
        let height = dir
            .uint(tag::HEIGHT)
            .ok_or_else(|| bad("no ImageLength".into()))?;
        if width == 0 || height == 0 || width > 1 << 24 || height > 1 << 24 {
            return Err(bad(format!(
                "its dimensions {width} x {height} are absurd (0 or over 2^24)"
            )));
        }
        if dir.uint(tag::IMAGE_DEPTH).is_some_and(|d| d > 1) {
            return Err(PageError::Samples("volumetric (ImageDepth) tiles".into()));
        }
        let samples = dir.uint(tag::SAMPLES).unwrap_or(1);
        if samples == 0 || samples > 64 {
            return Err(bad(format!("{samples} samples per pixel")));
        }
        let bits = dir.uints(tag::BITS).unwrap_or(&[1]);
        let bits0 = bits.first().copied().unwrap_or(1);
        if bits.iter().any(|&b| b != bits0) {
            return Err(PageError::Samples(format!(
                "samples of different bit depths {bits:?}"
            )));
        }
        let format = dir.uints(tag::SAMPLE_FORMAT).unwrap_or(&[1]);
        let format0 = format.first().copied().unwrap_or(1);
        if format.iter().any(|&f| f != format0) {
            return Err(PageError::Samples(format!(
                "samples of different formats {format:?}"
            )));
        }
        let dtype = dtype_of(bits0, format0, little)?;
        let codec =
            Codec::of(dir.uint(tag::COMPRESSION).unwrap_or(1)).map_err(PageError::Compression)?;
        let predictor = dir.uint(tag::PREDICTOR).unwrap_or(1) as u16;
        match (predictor, dtype.kind) {
            (1, _) | (2, Kind::Int | Kind::UInt) | (3, Kind::Float) => {}
            (p, _) => {
                return Err(PageError::Samples(format!(
                    "predictor {p} on {} samples",
                    dtype.numpy_str()
                )));
            }
        }
        if codec == Codec::Jpeg && dtype.itemsize != 1 {
            return Err(PageError::Samples(format!(
                "{}-bit JPEG samples (8-bit JPEG only)",
                dtype.itemsize * 8
            )));
        }
        let planar = dir.uint(tag::PLANAR).unwrap_or(1) == 2 && samples > 1;
        let tiled = dir.uint(tag::TILE_WIDTH).is_some();
        let (chunk_width, chunk_height, offsets, counts) = if tiled {
            let tw = dir.uint(tag::TILE_WIDTH).unwrap_or(0);
            let th = dir
                .uint(tag::TILE_HEIGHT)
                .ok_or_else(|| bad("TileWidth without TileLength".into()))?;
            (
                tw,
                th,
                dir.uints(tag::TILE_OFFSETS),
                dir.uints(tag::TILE_BYTES),
            )
        } else {
            let rows = dir.uint(tag::ROWS_PER_STRIP).unwrap_or(height).min(height);
            (
                width,
                rows,
                dir.uints(tag::STRIP_OFFSETS),
                dir.uints(tag::STRIP_BYTES),
            )
        };
        if chunk_width == 0 || chunk_height == 0 || chunk_width > 1 << 24 || chunk_height > 1 << 24
        {
            return Err(bad(format!(
                "its strips or tiles of {chunk_width} x {chunk_height} are absurd"
            )));
        }
        let page = Page {
            width,
            height,
            samples,
            planar,
            dtype,
            codec,
            predictor,
            chunk_width,
            chunk_height,
            tiled,
            offsets: offsets
                .ok_or_else(|| bad("no strip or tile offsets".into()))?
                .to_vec(),
            byte_counts: counts
                .ok_or_else(|| bad("no strip or tile byte counts".into()))?
                .to_vec(),
            jpeg_tables: dir.bytes(tag::JPEG_TABLES).map(<[u8]>::to_vec),
        };
        let chunk_bytes = page.chunk_bytes();
        if chunk_bytes > MAX_CHUNK_BYTES {
            return Err(bad(format!(
                "one strip or tile decodes to {chunk_bytes} bytes, over the limit of {MAX_CHUNK_BYTES}"
            )));
        }
        let expected = page.chunk_count();
        if page.offsets.len() as u64 != expected || page.byte_counts.len() as u64 != expected {
            return Err(bad(format!(
                "it lists {} offsets and {} byte counts where its geometry has {expected} {}",
                page.offsets.len(),
                page.byte_counts.len(),
                if tiled { "tiles" } else { "strips" }
            )));
        }
        for (i, (&at, &len)) in page.offsets.iter().zip(&page.byte_counts).enumerate() {
            if at.checked_add(len).is_none_or(|end| end > size) {
                return Err(bad(format!(
                    "its {} {i} (offset {at}, {len} bytes) lies past the end of the file ({size} bytes): truncated",
                    if tiled { "tile" } else { "strip" }
                )));
            }
        }
        Ok(page)
    }

    /// Chunks across, chunks down.
    pub fn grid(&self) -> (u64, u64) {
        (
            self.width.div_ceil(self.chunk_width),
            self.height.div_ceil(self.chunk_height),
        )
    }

    /// Planes: the samples when planar, else one.
    pub fn planes(&self) -> u64 {
        if self.planar { self.samples } else { 1 }
    }

    /// Samples interleaved in one chunk's pixels.
    pub fn chunk_samples(&self) -> u64 {
        if self.planar { 1 } else { self.samples }
    }

    /// How many strips or tiles the page has.
    pub fn chunk_count(&self) -> u64 {
        let (across, down) = self.grid();
        across * down * self.planes()
    }

    /// Bytes one whole strip or tile decodes to.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_width
            .saturating_mul(self.chunk_height)
            .saturating_mul(self.chunk_samples())
            .saturating_mul(self.dtype.itemsize as u64)
    }

    /// Rows of chunk row `down` that hold image rows (the last strip may be short).
    pub fn rows_in(&self, down: u64) -> u64 {
        self.chunk_height
            .min(self.height - down * self.chunk_height)
    }

    /// The page's shape without pages: `[y, x]`, `[y, x, s]` (chunky) or `[s, y, x]`
    /// (planar).
    pub fn shape(&self) -> Vec<u64> {
        match (self.samples, self.planar) {
            (1, _) => vec![self.height, self.width],
            (s, false) => vec![self.height, self.width, s],
            (s, true) => vec![s, self.height, self.width],
        }
    }

    /// The extent the grids fit, per axis of [`Page::shape`]: one tile, or a strip's rows
    /// by the full width; an uncompressed strip is read row by row, so one row.
    pub fn native_chunk(&self) -> Vec<u64> {
        let rows = if !self.tiled && self.codec == Codec::None {
            1
        } else {
            self.chunk_height.min(self.height)
        };
        let cols = self.chunk_width.min(self.width);
        match (self.samples, self.planar) {
            (1, _) => vec![rows, cols],
            (s, false) => vec![rows, cols, s],
            (_, true) => vec![1, rows, cols],
        }
    }

    /// Whether `other` has this page's shape, dtype and layout kind (pages of one tensor).
    pub fn same_shape(&self, other: &Page) -> bool {
        self.shape() == other.shape() && self.dtype == other.dtype
    }
}

/// The dtype of samples of `bits` bits in `format` (1 uint, 2 int, 3 float).
fn dtype_of(bits: u64, format: u64, little: bool) -> Result<Dtype, PageError> {
    let kind = match format {
        1 | 4 => Kind::UInt,
        2 => Kind::Int,
        3 => Kind::Float,
        5 => return Err(PageError::Samples("complex integer samples".into())),
        6 => return Err(PageError::Samples("complex float samples".into())),
        f => return Err(PageError::Samples(format!("sample format {f}"))),
    };
    let order = if little {
        ByteOrder::Little
    } else {
        ByteOrder::Big
    };
    bits.is_multiple_of(8)
        .then(|| Dtype::new(kind, (bits / 8) as usize, order))
        .flatten()
        .ok_or_else(|| {
            PageError::Samples(format!(
                "{bits}-bit samples (8, 16, 32 and 64-bit samples are served)"
            ))
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::source::tiff::ifd::Value;

    fn dir(tags: &[(u16, Vec<u64>)]) -> Directory {
        let mut d = Directory::default();
        for (t, v) in tags {
            d.tags.insert(*t, Value::Uints(v.clone()));
        }
        d
    }

    #[test]
    fn tiles_strips_and_planes_are_counted_and_checked() {
        let tiled = dir(&[
            (tag::WIDTH, vec![100]),
            (tag::HEIGHT, vec![70]),
            (tag::BITS, vec![16]),
            (tag::TILE_WIDTH, vec![32]),
            (tag::TILE_HEIGHT, vec![32]),
            (tag::TILE_OFFSETS, vec![0; 12]),
            (tag::TILE_BYTES, vec![1; 12]),
        ]);
        let page = Page::from_directory(&tiled, true, 1000).unwrap();
        assert_eq!(page.grid(), (4, 3));
        assert_eq!(page.shape(), vec![70, 100]);
        assert_eq!(page.native_chunk(), vec![32, 32]);
        assert_eq!(page.chunk_bytes(), 32 * 32 * 2);
        assert_eq!(page.dtype.numpy_str(), "<u2");

        let mut short = tiled.clone();
        short
            .tags
            .insert(tag::TILE_OFFSETS, Value::Uints(vec![0; 11]));
        let err = Page::from_directory(&short, true, 1000).unwrap_err();
        assert!(
            matches!(&err, PageError::Malformed(m) if m.contains("11 offsets")),
            "{err:?}"
        );

        let past = Page::from_directory(&tiled, true, 0).unwrap_err();
        assert!(matches!(&past, PageError::Malformed(m) if m.contains("past the end")));

        let planar = dir(&[
            (tag::WIDTH, vec![10]),
            (tag::HEIGHT, vec![5]),
            (tag::BITS, vec![8, 8, 8]),
            (tag::SAMPLES, vec![3]),
            (tag::PLANAR, vec![2]),
            (tag::ROWS_PER_STRIP, vec![2]),
            (tag::STRIP_OFFSETS, vec![0; 9]),
            (tag::STRIP_BYTES, vec![20; 9]),
        ]);
        let page = Page::from_directory(&planar, false, 1000).unwrap();
        assert_eq!(page.shape(), vec![3, 5, 10]);
        assert_eq!(page.rows_in(2), 1);
        assert_eq!(page.native_chunk(), vec![1, 1, 10]);
    }

    #[test]
    fn absurd_sizes_and_odd_samples_are_refused_by_name() {
        let huge = dir(&[
            (tag::WIDTH, vec![1 << 30]),
            (tag::HEIGHT, vec![1]),
            (tag::STRIP_OFFSETS, vec![0]),
            (tag::STRIP_BYTES, vec![0]),
        ]);
        assert!(matches!(
            Page::from_directory(&huge, true, 10),
            Err(PageError::Malformed(m)) if m.contains("absurd")
        ));
        let odd = dir(&[
            (tag::WIDTH, vec![8]),
            (tag::HEIGHT, vec![1]),
            (tag::BITS, vec![12]),
            (tag::STRIP_OFFSETS, vec![0]),
            (tag::STRIP_BYTES, vec![0]),
        ]);
        assert!(matches!(
            Page::from_directory(&odd, true, 10),
            Err(PageError::Samples(m)) if m.contains("12-bit")
        ));
        let j2k = dir(&[
            (tag::WIDTH, vec![8]),
            (tag::HEIGHT, vec![1]),
            (tag::BITS, vec![8]),
            (tag::COMPRESSION, vec![34712]),
            (tag::STRIP_OFFSETS, vec![0]),
            (tag::STRIP_BYTES, vec![0]),
        ]);
        assert_eq!(
            Page::from_directory(&j2k, true, 10),
            Err(PageError::Compression("JPEG 2000".into()))
        );
    }
}
