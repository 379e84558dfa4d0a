//! The TIFF container: the header, and the image file directories (IFDs) of the main chain
//! and of their SubIFDs, read with positional reads and bounded before anything is
//! allocated. Every offset and value array is checked against the file's size; a directory
//! reached twice (a circular chain) is refused.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::FileExt;
use std::path::Path;

use super::error::TiffError;

/// Most pages (main-chain directories) a file may have.
pub const MAX_PAGES: usize = 1 << 20;
/// Most entries one directory may have.
const MAX_ENTRIES: u64 = 4096;
/// Longest tag value array read (bytes): a longer one (an image description of gigabytes)
/// is refused.
const MAX_VALUE_BYTES: u64 = 64 << 20;

/// The tags the reader uses; others are skipped without reading their values.
pub mod tag {
    /// ImageWidth.
    pub const WIDTH: u16 = 256;
    /// ImageLength.
    pub const HEIGHT: u16 = 257;
    /// BitsPerSample.
    pub const BITS: u16 = 258;
    /// Compression.
    pub const COMPRESSION: u16 = 259;
    /// PhotometricInterpretation.
    pub const PHOTOMETRIC: u16 = 262;
    /// ImageDescription.
    pub const DESCRIPTION: u16 = 270;
    /// StripOffsets.
    pub const STRIP_OFFSETS: u16 = 273;
    /// SamplesPerPixel.
    pub const SAMPLES: u16 = 277;
    /// RowsPerStrip.
    pub const ROWS_PER_STRIP: u16 = 278;
    /// StripByteCounts.
    pub const STRIP_BYTES: u16 = 279;
    /// PlanarConfiguration.
    pub const PLANAR: u16 = 284;
    /// Predictor.
    pub const PREDICTOR: u16 = 317;
    /// TileWidth.
    pub const TILE_WIDTH: u16 = 322;
    /// TileLength.
    pub const TILE_HEIGHT: u16 = 323;
    /// TileOffsets.
    pub const TILE_OFFSETS: u16 = 324;
    /// TileByteCounts.
    pub const TILE_BYTES: u16 = 325;
    /// SubIFDs.
    pub const SUBIFDS: u16 = 330;
    /// SampleFormat.
    pub const SAMPLE_FORMAT: u16 = 339;
    /// JPEGTables.
    pub const JPEG_TABLES: u16 = 347;
    /// ImageDepth (SGI volumetric tiles): refused.
    pub const IMAGE_DEPTH: u16 = 32997;

    /// Whether the reader reads this tag's values.
    pub fn is_read(tag: u16) -> bool {
        matches!(
            tag,
            WIDTH
                | HEIGHT
                | BITS
                | COMPRESSION
                | PHOTOMETRIC
                | DESCRIPTION
                | STRIP_OFFSETS
                | SAMPLES
                | ROWS_PER_STRIP
                | STRIP_BYTES
                | PLANAR
                | PREDICTOR
                | TILE_WIDTH
                | TILE_HEIGHT
                | TILE_OFFSETS
                | TILE_BYTES
                | SUBIFDS
                | SAMPLE_FORMAT
                | JPEG_TABLES
                | IMAGE_DEPTH
        )
    }
}

/// A tag's values as read.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Unsigned integers (BYTE, SHORT, LONG, LONG8, IFD, IFD8).
    Uints(Vec<u64>),
    /// Bytes (UNDEFINED) or text (ASCII, without its terminating NULs).
    Bytes(Vec<u8>),
    /// A type the reader does not use.
    Other,
}

/// One image file directory: the tags read, and where the chain goes next.
#[derive(Clone, Debug, Default)]
pub struct Directory {
    /// The tags read, by number.
    pub tags: BTreeMap<u16, Value>,
    /// The next directory's offset (0: none).
    pub next: u64,
}

impl Directory {
    /// The unsigned values of `tag`, if it has any.
    pub fn uints(&self, tag: u16) -> Option<&[u64]> {
        match self.tags.get(&tag) {
            Some(Value::Uints(v)) => Some(v),
            _ => None,
        }
    }

    /// The first unsigned value of `tag`.
    pub fn uint(&self, tag: u16) -> Option<u64> {
        self.uints(tag).and_then(|v| v.first().copied())
    }

    /// The bytes of `tag` (UNDEFINED or ASCII).
    pub fn bytes(&self, tag: u16) -> Option<&[u8]> {
        match self.tags.get(&tag) {
            Some(Value::Bytes(v)) => Some(v),
            _ => None,
        }
    }
}

/// A file's header: classic or BigTIFF, byte order, first directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// BigTIFF (8-byte offsets).
    pub big: bool,
    /// Little-endian (`II`).
    pub little: bool,
    /// The first directory's offset.
    pub first: u64,
}

/// Positional reads of one file of known size, in its byte order.
pub struct Reader<'a> {
    file: &'a std::fs::File,
    path: &'a Path,
    size: u64,
    header: Header,
}

/// The main chain's directories, each with its SubIFDs' directories.
#[derive(Debug)]
pub struct Walk {
    /// Every page (main-chain directory) in order, with its SubIFDs in order.
    pub pages: Vec<(Directory, Vec<Directory>)>,
}

/// Reads the header of `file` (`size` bytes).
pub fn read_header(file: &std::fs::File, path: &Path, size: u64) -> Result<Header, TiffError> {
    let mut head = [0u8; 16];
    let got = fill(file, path, &mut head, 0)?;
    let head = &head[..got];
    let not_tiff = || TiffError::NotTiff {
        path: path.to_path_buf(),
        found: head[..head.len().min(4)].to_vec(),
    };
    let little = match head.get(..2) {
        Some(b"II") => true,
        Some(b"MM") => false,
        _ => return Err(not_tiff()),
    };
    let u16_at = |i: usize| head.get(i..i + 2).map(|b| decode(b, little));
    let past = |what: &str| TiffError::PastEnd {
        path: path.to_path_buf(),
        what: what.to_string(),
        size,
    };
    match u16_at(2) {
        Some(42) => {
            let first = head
                .get(4..8)
                .map(|b| decode(b, little))
                .ok_or_else(|| past("the header"))?;
            Ok(Header {
                big: false,
                little,
                first,
            })
        }
        Some(43) => {
            if u16_at(4) != Some(8) || u16_at(6) != Some(0) {
                return Err(not_tiff());
            }
            let first = head
                .get(8..16)
                .map(|b| decode(b, little))
                .ok_or_else(|| past("the BigTIFF header"))?;
            Ok(Header {
                big: true,
                little,
                first,
            })
        }
        _ => Err(not_tiff()),
    }
}

impl<'a> Reader<'a> {
    /// A reader of `file` (`size` bytes) laid out as `header` says.
    pub fn new(file: &'a std::fs::File, path: &'a Path, size: u64, header: Header) -> Self {
        Reader {
            file,
            path,
            size,
            header,
        }
    }

    fn past(&self, what: String) -> TiffError {
        TiffError::PastEnd {
            path: self.path.to_path_buf(),
            what,
            size: self.size,
        }
    }

    /// Reads `len` bytes at `offset`, refusing a range past the end before allocating.
    fn read(&self, offset: u64, len: u64, what: &str) -> Result<Vec<u8>, TiffError> {
        let end = offset.checked_add(len);
        if end.is_none_or(|end| end > self.size) {
            return Err(self.past(format!("{what} (offset {offset}, {len} bytes)")));
        }
        let mut buf = vec![0; len as usize];
        let got = fill(self.file, self.path, &mut buf, offset)?;
        if got < buf.len() {
            return Err(self.past(format!("{what} (offset {offset}, {len} bytes)")));
        }
        Ok(buf)
    }

    /// Reads the directory at `offset`.
    pub fn directory(&self, offset: u64) -> Result<Directory, TiffError> {
        let little = self.header.little;
        let (count_len, entry_len, next_len) = if self.header.big {
            (8, 20, 8)
        } else {
            (2, 12, 4)
        };
        let what = format!("the directory at offset {offset}");
        let count = decode(&self.read(offset, count_len, &what)?, little);
        if count > MAX_ENTRIES {
            return Err(TiffError::TooLarge {
                path: self.path.to_path_buf(),
                what: format!("a directory of {count} entries"),
                limit: MAX_ENTRIES,
            });
        }
        let table = self.read(offset + count_len, count * entry_len + next_len, &what)?;
        let mut tags = BTreeMap::new();
        let value_len = if self.header.big { 8 } else { 4 };
        for entry in table[..(count * entry_len) as usize].chunks_exact(entry_len as usize) {
            let tag_id = decode(&entry[0..2], little) as u16;
            if !tag::is_read(tag_id) {
                continue;
            }
            let kind = decode(&entry[2..4], little) as u16;
            let (n, field) = if self.header.big {
                (decode(&entry[4..12], little), &entry[12..20])
            } else {
                (decode(&entry[4..8], little), &entry[8..12])
            };
            let Some(size) = type_size(kind) else {
                tags.insert(tag_id, Value::Other);
                continue;
            };
            let total = n.checked_mul(size).filter(|&t| t <= MAX_VALUE_BYTES);
            let Some(total) = total else {
                return Err(TiffError::TooLarge {
                    path: self.path.to_path_buf(),
                    what: format!("tag {tag_id} with {n} values"),
                    limit: MAX_VALUE_BYTES,
                });
            };
            let raw = if total <= value_len {
                field[..total as usize].to_vec()
            } else {
                let at = decode(field, little);
                self.read(at, total, &format!("the values of tag {tag_id}"))?
            };
            tags.insert(tag_id, parse_value(kind, size, &raw, little));
        }
        let next = decode(&table[(count * entry_len) as usize..], little);
        Ok(Directory { tags, next })
    }

    /// Walks the main chain from the header, and each page's SubIFDs, refusing a directory
    /// reached twice.
    pub fn walk(&self) -> Result<Walk, TiffError> {
        let mut seen = HashSet::new();
        let mut visit = |offset: u64| {
            if seen.insert(offset) {
                Ok(())
            } else {
                Err(TiffError::Cycle {
                    path: self.path.to_path_buf(),
                    offset,
                })
            }
        };
        let mut pages = Vec::new();
        let mut next = self.header.first;
        while next != 0 {
            if pages.len() >= MAX_PAGES {
                return Err(TiffError::TooLarge {
                    path: self.path.to_path_buf(),
                    what: format!("more than {MAX_PAGES} pages"),
                    limit: MAX_PAGES as u64,
                });
            }
            visit(next)?;
            let dir = self.directory(next)?;
            let mut subs = Vec::new();
            for &sub in dir.uints(tag::SUBIFDS).unwrap_or_default() {
                visit(sub)?;
                subs.push(self.directory(sub)?);
            }
            next = dir.next;
            pages.push((dir, subs));
        }
        if pages.is_empty() {
            return Err(self.past("the first directory (offset 0)".to_string()));
        }
        Ok(Walk { pages })
    }
}

/// Bytes per value of a TIFF field type; `None` for types the reader does not know.
fn type_size(kind: u16) -> Option<u64> {
    Some(match kind {
        1 | 2 | 6 | 7 => 1,
        3 | 8 => 2,
        4 | 9 | 11 | 13 => 4,
        5 | 10 | 12 | 16 | 17 | 18 => 8,
        _ => return None,
    })
}

fn parse_value(kind: u16, size: u64, raw: &[u8], little: bool) -> Value {
    match kind {
        1 | 3 | 4 | 13 | 16 | 18 => Value::Uints(
            raw.chunks_exact(size as usize)
                .map(|b| decode(b, little))
                .collect(),
        ),
        2 => {
            let end = raw.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            Value::Bytes(raw[..end].to_vec())
        }
        7 => Value::Bytes(raw.to_vec()),
        _ => Value::Other,
    }
}

/// An unsigned integer of 1 to 8 bytes in the given byte order.
pub fn decode(bytes: &[u8], little: bool) -> u64 {
    let mut v = 0u64;
    if little {
        for &b in bytes.iter().rev() {
            v = (v << 8) | u64::from(b);
        }
    } else {
        for &b in bytes {
            v = (v << 8) | u64::from(b);
        }
    }
    v
}

/// Reads into `buf` at `offset` until it is full or the file ends; the bytes read.
fn fill(
    file: &std::fs::File,
    path: &Path,
    buf: &mut [u8],
    offset: u64,
) -> Result<usize, TiffError> {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(TiffError::Io {
                    path: path.to_path_buf(),
                    what: "read",
                    source,
                });
            }
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Write;

    /// A classic little-endian file of directories at the given offsets, each with one
    /// ImageWidth entry and pointing at `next[i]`.
    fn file_with(dirs: &[(u64, u64)]) -> tempfile::NamedTempFile {
        let mut bytes = vec![0u8; 256];
        bytes[..4].copy_from_slice(b"II*\0");
        bytes[4..8].copy_from_slice(&(dirs[0].0 as u32).to_le_bytes());
        for &(at, next) in dirs {
            let at = at as usize;
            bytes[at..at + 2].copy_from_slice(&1u16.to_le_bytes());
            bytes[at + 2..at + 4].copy_from_slice(&256u16.to_le_bytes());
            bytes[at + 4..at + 6].copy_from_slice(&3u16.to_le_bytes());
            bytes[at + 6..at + 10].copy_from_slice(&1u32.to_le_bytes());
            bytes[at + 10..at + 12].copy_from_slice(&7u16.to_le_bytes());
            bytes[at + 14..at + 18].copy_from_slice(&(next as u32).to_le_bytes());
        }
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(&bytes).unwrap();
        file
    }

    fn walk(file: &tempfile::NamedTempFile) -> Result<Walk, TiffError> {
        let f = file.as_file();
        let size = f.metadata().unwrap().len();
        let header = read_header(f, file.path(), size)?;
        Reader::new(f, file.path(), size, header).walk()
    }

    #[test]
    fn a_chain_is_walked_and_a_circular_one_refused() {
        let ok = walk(&file_with(&[(16, 64), (64, 0)])).unwrap();
        assert_eq!(ok.pages.len(), 2);
        assert_eq!(ok.pages[1].0.uint(tag::WIDTH), Some(7));
        let err = walk(&file_with(&[(16, 64), (64, 16)])).unwrap_err();
        assert!(matches!(err, TiffError::Cycle { offset: 16, .. }), "{err}");
        let own = walk(&file_with(&[(16, 16)])).unwrap_err();
        assert!(own.to_string().contains("form a cycle"), "{own}");
    }

    #[test]
    fn offsets_past_the_end_and_foreign_magic_are_refused() {
        let err = walk(&file_with(&[(16, 4000)])).unwrap_err();
        assert!(matches!(err, TiffError::PastEnd { .. }), "{err}");
        let mut other = tempfile::NamedTempFile::new().unwrap();
        other.write_all(b"\x93NUMPY\x01\x00").unwrap();
        assert!(matches!(walk(&other), Err(TiffError::NotTiff { .. })));
    }
}
