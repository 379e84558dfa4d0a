//! Decoding one strip or tile: its codec (none, LZW, Deflate, PackBits, Zstandard, 8-bit
//! JPEG) into a buffer of at most the bytes its geometry declares — a stream that would
//! give more is a decompression bomb and refused, never grown into — then the predictor
//! undone (horizontal differencing, or the floating-point byte-plane predictor).

use std::io::Read;

/// A strip's or tile's compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    /// 1: stored.
    None,
    /// 5: LZW.
    Lzw,
    /// 8 or 32946: Deflate (zlib).
    Deflate,
    /// 32773: PackBits.
    PackBits,
    /// 50000 or 34926: Zstandard.
    Zstd,
    /// 7: JPEG (8-bit, baseline or progressive).
    Jpeg,
}

impl Codec {
    /// The codec of TIFF compression number `code`, or the name of one that is not read.
    pub fn of(code: u64) -> Result<Codec, String> {
        Ok(match code {
            1 => Codec::None,
            5 => Codec::Lzw,
            8 | 32946 => Codec::Deflate,
            32773 => Codec::PackBits,
            50000 | 34926 => Codec::Zstd,
            7 => Codec::Jpeg,
            other => {
                return Err(match other {
                    2 => "CCITT modified Huffman (fax)".into(),
                    3 | 4 => "CCITT fax".into(),
                    6 => "old-style JPEG".into(),
                    33003 | 33004 | 33005 | 34712 => "JPEG 2000".into(),
                    34887 => "LERC".into(),
                    34925 => "LZMA".into(),
                    50001 | 34927 => "WebP".into(),
                    50002 | 52546 => "JPEG XL".into(),
                    n => format!("compression {n}"),
                });
            }
        })
    }
}

/// Why a chunk did not decode.
#[derive(Debug, PartialEq)]
pub enum DecodeError {
    /// It would give more than the declared bytes.
    Bomb,
    /// Anything else, said.
    Failed(String),
}

/// What a chunk must decode to.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    /// The most bytes it may give (a whole strip or tile).
    pub declared: usize,
    /// The fewest it must give (the rows of the image it holds).
    pub needed: usize,
    /// JPEG: the components its pixels have.
    pub samples: usize,
}

/// Decodes `raw` (one chunk's stored bytes, `tables` the JPEGTables) with `codec`.
pub fn decode(
    codec: Codec,
    raw: &[u8],
    tables: Option<&[u8]>,
    expect: Expect,
) -> Result<Vec<u8>, DecodeError> {
    let out = match codec {
        Codec::None => raw[..raw.len().min(expect.declared)].to_vec(),
        Codec::Lzw => lzw(raw, expect.declared)?,
        Codec::Deflate => bounded_read(flate2::read::ZlibDecoder::new(raw), expect.declared)?,
        Codec::PackBits => packbits(raw, expect.declared)?,
        Codec::Zstd => {
            let decoder = zstd::stream::read::Decoder::new(raw)
                .map_err(|e| DecodeError::Failed(format!("zstd: {e}")))?;
            bounded_read(decoder, expect.declared)?
        }
        Codec::Jpeg => jpeg(raw, tables, expect)?,
    };
    if out.len() < expect.needed {
        return Err(DecodeError::Failed(format!(
            "it decodes to {} bytes, fewer than the {} its rows hold",
            out.len(),
            expect.needed
        )));
    }
    Ok(out)
}

/// Reads `reader` to its end into at most `declared` bytes; more is a bomb.
fn bounded_read(mut reader: impl Read, declared: usize) -> Result<Vec<u8>, DecodeError> {
    let mut out = vec![0u8; declared];
    let mut got = 0;
    while got < declared {
        match reader.read(&mut out[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(DecodeError::Failed(e.to_string())),
        }
    }
    if got == declared {
        let mut probe = [0u8; 1];
        if matches!(reader.read(&mut probe), Ok(n) if n > 0) {
            return Err(DecodeError::Bomb);
        }
    }
    out.truncate(got);
    Ok(out)
}

fn lzw(raw: &[u8], declared: usize) -> Result<Vec<u8>, DecodeError> {
    let mut decoder = weezl::decode::Decoder::with_tiff_size_switch(weezl::BitOrder::Msb, 8);
    let mut out = vec![0u8; declared];
    let mut consumed = 0;
    let mut got = 0;
    loop {
        let result = decoder.decode_bytes(&raw[consumed..], &mut out[got..]);
        consumed += result.consumed_in;
        got += result.consumed_out;
        match result.status {
            Ok(weezl::LzwStatus::Done) => break,
            Ok(weezl::LzwStatus::Ok) if got == declared => {
                let mut probe = [0u8; 1];
                let more = decoder.decode_bytes(&raw[consumed..], &mut probe);
                if more.consumed_out > 0 {
                    return Err(DecodeError::Bomb);
                }
                break;
            }
            Ok(weezl::LzwStatus::Ok) => {}
            // The input ended without an end code: tolerated, as writers omit it.
            Ok(weezl::LzwStatus::NoProgress) => break,
            Err(e) => return Err(DecodeError::Failed(format!("LZW: {e}"))),
        }
    }
    out.truncate(got);
    Ok(out)
}

/// PackBits (Apple's run-length code): a header byte n, then n+1 literal bytes (n < 128),
/// or one byte repeated 257-n times (n > 128); 128 is skipped.
fn packbits(raw: &[u8], declared: usize) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::with_capacity(declared);
    let mut i = 0;
    while i < raw.len() {
        let n = raw[i] as i8;
        i += 1;
        let (len, literal) = match n {
            0..=127 => (n as usize + 1, true),
            -127..=-1 => ((1 - n as isize) as usize, false),
            _ => continue,
        };
        if out.len() + len > declared {
            return Err(DecodeError::Bomb);
        }
        if literal {
            let end = i + len;
            let Some(bytes) = raw.get(i..end) else {
                return Err(DecodeError::Failed("PackBits: a run past the end".into()));
            };
            out.extend_from_slice(bytes);
            i = end;
        } else {
            let Some(&byte) = raw.get(i) else {
                return Err(DecodeError::Failed("PackBits: a run past the end".into()));
            };
            out.resize(out.len() + len, byte);
            i += 1;
        }
    }
    Ok(out)
}

fn jpeg(raw: &[u8], tables: Option<&[u8]>, expect: Expect) -> Result<Vec<u8>, DecodeError> {
    // JPEGTables is a stream of tables (SOI, tables, EOI); each chunk a stream whose tables
    // may be left out (SOI, frame, scans, EOI): the tables go in after the chunk's SOI.
    let joined;
    let stream = match tables {
        Some(t) if t.len() >= 4 && raw.len() >= 2 => {
            joined = [&raw[..2], &t[2..t.len() - 2], &raw[2..]].concat();
            &joined[..]
        }
        _ => raw,
    };
    let colour = if expect.samples == 1 {
        zune_core::colorspace::ColorSpace::Luma
    } else {
        zune_core::colorspace::ColorSpace::RGB
    };
    let options = zune_core::options::DecoderOptions::default().jpeg_set_out_colorspace(colour);
    let mut decoder = zune_jpeg::JpegDecoder::new_with_options(
        zune_core::bytestream::ZCursor::new(stream),
        options,
    );
    decoder
        .decode_headers()
        .map_err(|e| DecodeError::Failed(format!("JPEG: {e:?}")))?;
    let size = decoder
        .output_buffer_size()
        .ok_or_else(|| DecodeError::Failed("JPEG: no frame".into()))?;
    if size > expect.declared {
        return Err(DecodeError::Bomb);
    }
    let mut out = vec![0u8; size];
    decoder
        .decode_into(&mut out)
        .map_err(|e| DecodeError::Failed(format!("JPEG: {e:?}")))?;
    Ok(out)
}

/// Undoes `predictor` on a decoded chunk of `rows` rows of `width` pixels of `samples`
/// samples of `itemsize` bytes in the file's byte order (`little`).
pub fn undo_predictor(
    predictor: u16,
    data: &mut [u8],
    rows: usize,
    width: usize,
    samples: usize,
    itemsize: usize,
    little: bool,
) {
    let row_bytes = width * samples * itemsize;
    if row_bytes == 0 {
        return;
    }
    for row in data.chunks_exact_mut(row_bytes).take(rows) {
        match predictor {
            2 => horizontal(row, samples, itemsize, little),
            3 => floating(row, width * samples, itemsize, little),
            _ => return,
        }
    }
}

/// Horizontal differencing: each sample is stored as its difference from the same sample
/// of the pixel before it (wrapping integer arithmetic).
fn horizontal(row: &mut [u8], samples: usize, itemsize: usize, little: bool) {
    let stride = samples * itemsize;
    match itemsize {
        1 => {
            for i in stride..row.len() {
                row[i] = row[i].wrapping_add(row[i - stride]);
            }
        }
        _ => {
            let mut i = stride;
            while i + itemsize <= row.len() {
                let prev = read_uint(&row[i - stride..i - stride + itemsize], little);
                let cur = read_uint(&row[i..i + itemsize], little);
                write_uint(&mut row[i..i + itemsize], cur.wrapping_add(prev), little);
                i += itemsize;
            }
        }
    }
}

/// The floating-point predictor: the row's bytes were split into byte planes (most
/// significant first) and byte-differenced; sum the bytes back, then gather each value's
/// bytes from the planes in the file's order.
fn floating(row: &mut [u8], count: usize, itemsize: usize, little: bool) {
    for i in 1..row.len() {
        row[i] = row[i].wrapping_add(row[i - 1]);
    }
    let planes = row.to_vec();
    for value in 0..count {
        for byte in 0..itemsize {
            let significance = planes[byte * count + value];
            let at = if little { itemsize - 1 - byte } else { byte };
            row[value * itemsize + at] = significance;
        }
    }
}

fn read_uint(bytes: &[u8], little: bool) -> u64 {
    super::ifd::decode(bytes, little)
}

fn write_uint(bytes: &mut [u8], value: u64, little: bool) {
    let n = bytes.len();
    for (i, b) in bytes.iter_mut().enumerate() {
        let shift = if little { i } else { n - 1 - i } * 8;
        *b = (value >> shift) as u8;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::Write;

    fn expect(declared: usize) -> Expect {
        Expect {
            declared,
            needed: declared,
            samples: 1,
        }
    }

    #[test]
    fn a_stream_decoding_past_its_declared_size_is_a_bomb() {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(&vec![7u8; 1 << 20]).unwrap();
        let bomb = z.finish().unwrap();
        assert_eq!(
            decode(Codec::Deflate, &bomb, None, expect(4096)),
            Err(DecodeError::Bomb)
        );
        let fits = decode(Codec::Deflate, &bomb, None, expect(1 << 20)).unwrap();
        assert_eq!(fits.len(), 1 << 20);
        let zst = zstd::bulk::compress(&vec![1u8; 100_000], 3).unwrap();
        assert_eq!(
            decode(Codec::Zstd, &zst, None, expect(1000)),
            Err(DecodeError::Bomb)
        );
        // A PackBits run of 128 bytes into 16 declared.
        assert_eq!(
            decode(Codec::PackBits, &[0x81, 9], None, expect(16)),
            Err(DecodeError::Bomb)
        );
    }

    #[test]
    fn packbits_and_predictors_round_trip() {
        let out = packbits(&[0xFE, 0xAA, 0x02, 0x80, 0x00, 0x2A, 0x80], 100).unwrap();
        assert_eq!(out, [0xAA, 0xAA, 0xAA, 0x80, 0x00, 0x2A]);

        // u16 big-endian values 1, 3, 6 stored as differences 1, 2, 3.
        let mut row = vec![0, 1, 0, 2, 0, 3];
        undo_predictor(2, &mut row, 1, 3, 1, 2, false);
        assert_eq!(row, [0, 1, 0, 3, 0, 6]);

        // f32 little-endian: 1.0 and 2.0 as byte planes (MSB first), then differenced.
        let values = [1.0f32, 2.0];
        let be: Vec<[u8; 4]> = values.iter().map(|v| v.to_be_bytes()).collect();
        let mut planes: Vec<u8> = (0..4).flat_map(|b| be.iter().map(move |v| v[b])).collect();
        for i in (1..planes.len()).rev() {
            planes[i] = planes[i].wrapping_sub(planes[i - 1]);
        }
        undo_predictor(3, &mut planes, 1, 2, 1, 4, true);
        let got: Vec<f32> = planes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got, values);
    }

    #[test]
    fn unread_compressions_are_named() {
        assert_eq!(Codec::of(34712), Err("JPEG 2000".to_string()));
        assert_eq!(Codec::of(8), Ok(Codec::Deflate));
    }
}
