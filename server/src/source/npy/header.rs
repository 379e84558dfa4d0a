//! The `.npy` preamble and header, read by a fixed grammar and never evaluated.
//!
//! Preamble: the magic `\x93NUMPY`, two version bytes, then the header length as a
//! little-endian u16 (version 1.0) or u32 (2.0 and 3.0). The header is a Python dict literal
//! padded with spaces and ending in `\n`; this module accepts exactly the dicts numpy writes:
//!
//! ```text
//! header := ws '{' ws [ entry ( ws ',' ws entry )* ws [','] ] ws '}' ws     (ends in '\n')
//! entry  := key ws ':' ws value           key := 'descr' | 'fortran_order' | 'shape', once each
//! descr  := quoted dtype string           fortran_order := True | False
//! shape  := '(' ws ')' | '(' ws dim ws ',' ws ')' | '(' dim (ws ',' ws dim)+ ws [','] ws ')'
//! dim    := a decimal integer without sign, suffix or leading zero
//! ```
//!
//! Strings take single or double quotes and hold printable ASCII without escapes.

use std::path::{Path, PathBuf};

use super::dtype::{Dtype, is_object_descr};
use super::error::{NpyError, fmt_shape};
use super::limits::Limits;

/// The six bytes every `.npy` file begins with.
pub(crate) const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Total of magic, version and length field, plus the header, must be a multiple of this.
const ALIGNMENT: usize = 16;

/// Longest excerpt of offending header text quoted in an error.
const SNIPPET_LEN: usize = 48;

/// Longest excerpt of a structured dtype quoted in an error.
const STRUCTURED_SNIPPET_LEN: usize = 160;

/// What a `.npy` header declares, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Format version: (1, 0), (2, 0) or (3, 0).
    pub version: (u8, u8),
    /// Element type, with the byte order the file states.
    pub dtype: Dtype,
    /// Whether the payload is in Fortran (column-major) order.
    pub fortran_order: bool,
    /// The array's shape: rank 1 or more, zero-length axes allowed.
    pub shape: Vec<u64>,
    /// Byte offset of the payload from the start of the file.
    pub data_offset: u64,
    /// Payload length in bytes: the product of `shape` times the item size.
    pub data_len: u64,
}

impl Header {
    /// Number of elements (the product of the shape).
    pub fn element_count(&self) -> u64 {
        // `data_len` is exactly count * itemsize, and itemsize is never zero.
        self.data_len / self.dtype.itemsize as u64
    }

    /// Whether the payload bytes are laid out as the C-order array: true for C order, and for
    /// Fortran order when at most one axis is longer than 1 (the two layouts then coincide).
    pub fn is_c_layout(&self) -> bool {
        !self.fortran_order || self.shape.iter().filter(|&&d| d > 1).count() <= 1
    }
}

/// Parses the preamble and header at the start of a `.npy` file. Pure: no I/O.
///
/// `prefix` is the beginning of the file; when it is too short to decide,
/// [`NpyError::TruncatedHeader`] says how many bytes are `needed`. Nothing is allocated from
/// what the header declares. Checks run in this order: magic, version, header length bound,
/// object dtype (by name, before anything else in the header), encoding, alignment, grammar,
/// dtype, shape and sizes against `limits`. The payload is not looked at.
pub fn parse_header(prefix: &[u8], limits: &Limits) -> Result<Header, NpyError> {
    parse_prefix(prefix, limits, None)
}

/// [`parse_header`] with errors naming `file`.
pub(crate) fn parse_prefix(
    prefix: &[u8],
    limits: &Limits,
    file: Option<&Path>,
) -> Result<Header, NpyError> {
    let owned = || file.map(Path::to_path_buf);
    let truncated = |needed: usize| NpyError::TruncatedHeader {
        file: owned(),
        needed: needed as u64,
        present: prefix.len() as u64,
    };

    let seen = prefix.len().min(MAGIC.len());
    if prefix[..seen] != MAGIC[..seen] {
        return Err(NpyError::BadMagic {
            file: owned(),
            found: escape(&prefix[..prefix.len().min(8)]),
        });
    }
    let (major, minor) = match prefix {
        [_, _, _, _, _, _, major, minor, ..] => (*major, *minor),
        _ => return Err(truncated(8)),
    };
    let len_field = match (major, minor) {
        (1, 0) => 2,
        (2, 0) | (3, 0) => 4,
        _ => {
            return Err(NpyError::UnsupportedVersion {
                file: owned(),
                major,
                minor,
            });
        }
    };
    let fixed = 8 + len_field;
    let header_len = match prefix.get(8..fixed) {
        Some(&[a, b]) => u64::from(u16::from_le_bytes([a, b])),
        Some(&[a, b, c, d]) => u64::from(u32::from_le_bytes([a, b, c, d])),
        _ => return Err(truncated(fixed)),
    };
    if header_len > limits.max_header_len as u64 {
        return Err(NpyError::HeaderTooLong {
            file: owned(),
            len: header_len,
            limit: limits.max_header_len,
        });
    }
    // Bounded by `max_header_len` just above, so it fits.
    let total = fixed + header_len as usize;
    let text = prefix.get(fixed..total).ok_or_else(|| truncated(total))?;

    if let Some(descr) = find_object_descr(text) {
        return Err(NpyError::ObjectDtype {
            file: owned(),
            descr,
        });
    }
    if major == 3
        && let Err(err) = std::str::from_utf8(text)
    {
        return Err(NpyError::HeaderEncoding {
            file: owned(),
            reason: format!(
                "a version 3.0 header must be UTF-8; byte {} of the header is not",
                err.valid_up_to()
            ),
        });
    }
    if !total.is_multiple_of(ALIGNMENT) {
        return Err(NpyError::MisalignedHeader {
            file: owned(),
            prefix_len: total as u64,
        });
    }
    if text.last() != Some(&b'\n') {
        return Err(NpyError::HeaderSyntax {
            file: owned(),
            reason: format!(
                "the header must end with a newline, it ends with {}",
                escape(&text[text.len().saturating_sub(8)..])
            ),
        });
    }

    let fields = Parser { text, pos: 0, file }.dict()?;
    let dtype = Dtype::parse_for(fields.descr, file)?;
    let (data_len, shape) = checked_sizes(&fields, &dtype, limits, file)?;
    let data_offset = total as u64;
    let in_address_space = data_offset
        .checked_add(data_len)
        .is_some_and(|end| usize::try_from(end).is_ok());
    if !in_address_space {
        return Err(NpyError::SizeOverflow {
            file: owned(),
            shape: fields.shape_text.to_owned(),
        });
    }
    Ok(Header {
        version: (major, minor),
        dtype,
        fortran_order: fields.fortran_order,
        shape,
        data_offset,
        data_len,
    })
}

/// Checks the shape's sizes and returns (payload bytes, shape).
///
/// Besides the element count and byte size, the product of the axes with zero-length axes
/// counted as 1 must fit in u64 and usize: it bounds every stride, even of an empty array.
fn checked_sizes(
    fields: &Fields<'_>,
    dtype: &Dtype,
    limits: &Limits,
    file: Option<&Path>,
) -> Result<(u64, Vec<u64>), NpyError> {
    let owned = || file.map(Path::to_path_buf);
    let shape = &fields.shape;
    if shape.is_empty() {
        return Err(NpyError::ScalarShape { file: owned() });
    }
    let overflow = || NpyError::SizeOverflow {
        file: owned(),
        shape: fields.shape_text.to_owned(),
    };
    let itemsize = dtype.itemsize as u64;
    let span = shape
        .iter()
        .try_fold(itemsize, |acc, &d| acc.checked_mul(d.max(1)))
        .filter(|&span| usize::try_from(span).is_ok())
        .ok_or_else(overflow)?;
    let elements = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    let bytes = elements.checked_mul(itemsize).ok_or_else(overflow)?;
    debug_assert!(bytes <= span);
    let exceeded = |what, value, limit| NpyError::LimitExceeded {
        file: owned(),
        what,
        value,
        limit,
        shape: fmt_shape(shape),
    };
    if elements > limits.max_elements {
        return Err(exceeded("element count", elements, limits.max_elements));
    }
    if bytes > limits.max_bytes {
        return Err(exceeded("byte size", bytes, limits.max_bytes));
    }
    Ok((bytes, shape.clone()))
}

/// Finds a `descr` entry whose value is the object dtype, however malformed the rest is.
fn find_object_descr(text: &[u8]) -> Option<String> {
    const KEY: &[u8] = b"descr";
    let mut from = 0;
    while let Some(rel) = text.get(from..)?.windows(KEY.len()).position(|w| w == KEY) {
        let at = from + rel;
        from = at + KEY.len();
        let Some(&quote) = at.checked_sub(1).and_then(|i| text.get(i)) else {
            continue;
        };
        if !matches!(quote, b'\'' | b'"') || text.get(from) != Some(&quote) {
            continue;
        }
        let mut i = skip_ws(text, from + 1);
        if text.get(i) != Some(&b':') {
            continue;
        }
        i = skip_ws(text, i + 1);
        let Some(&open) = text.get(i) else { continue };
        if !matches!(open, b'\'' | b'"') {
            continue;
        }
        let value = &text[i + 1..];
        let Some(len) = value.iter().position(|&b| b == open) else {
            continue;
        };
        if let Ok(descr) = std::str::from_utf8(&value[..len])
            && is_object_descr(descr)
        {
            return Some(descr.to_owned());
        }
    }
    None
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn skip_ws(text: &[u8], mut i: usize) -> usize {
    while text.get(i).copied().is_some_and(is_ws) {
        i += 1;
    }
    i
}

/// Bytes shown quoted, one char per byte, e.g. `"\u{89}PNG\r\n"`.
fn escape(bytes: &[u8]) -> String {
    let text: String = bytes.iter().map(|&b| char::from(b)).collect();
    format!("\"{}\"", printable(&text))
}

/// Text with printable ASCII kept as is and everything else escaped.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c.to_string()
            } else {
                c.escape_debug().to_string()
            }
        })
        .collect()
}

/// The length of the bracketed text at the start of `text` (up to and including the bracket
/// that closes the first one, quotes respected), or all of it when unclosed.
fn bracketed_len(text: &[u8]) -> usize {
    let mut depth = 0usize;
    let mut quote = None;
    for (i, &b) in text.iter().enumerate() {
        match (quote, b) {
            (Some(q), _) if b == q => quote = None,
            (Some(_), _) => {}
            (None, b'\'' | b'"') => quote = Some(b),
            (None, b'[' | b'(' | b'{') => depth += 1,
            (None, b']' | b')' | b'}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            (None, _) => {}
        }
    }
    text.len()
}

/// The values of the three keys, as found.
struct Fields<'t> {
    descr: &'t str,
    fortran_order: bool,
    shape: Vec<u64>,
    shape_text: &'t str,
}

/// A cursor over the header text.
struct Parser<'t, 'f> {
    text: &'t [u8],
    pos: usize,
    file: Option<&'f Path>,
}

impl<'t> Parser<'t, '_> {
    fn owned(&self) -> Option<PathBuf> {
        self.file.map(Path::to_path_buf)
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        self.pos = skip_ws(self.text, self.pos);
    }

    /// What the header holds from the cursor on, quoted for an error.
    fn found(&self) -> String {
        self.quoted(usize::MAX, SNIPPET_LEN)
    }

    /// The next `len` bytes of the header (at most what is left), quoted; when that is more
    /// than `limit` bytes, the first `limit` and an ellipsis.
    fn quoted(&self, len: usize, limit: usize) -> String {
        let rest = self.text.get(self.pos..).unwrap_or_default();
        let rest = &rest[..rest.len().min(len)];
        if rest.iter().all(|&b| is_ws(b)) {
            return "the end of the header".to_owned();
        }
        let end = rest.len().min(limit);
        let shown = String::from_utf8_lossy(&rest[..end]);
        let more = if end < rest.len() { "..." } else { "" };
        format!("`{}`{more}", printable(&shown))
    }

    fn syntax(&self, reason: String) -> NpyError {
        NpyError::HeaderSyntax {
            file: self.owned(),
            reason,
        }
    }

    fn expect(&mut self, byte: u8, context: &str) -> Result<(), NpyError> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.syntax(format!(
                "expected '{}' {context}, found {}",
                char::from(byte),
                self.found()
            )))
        }
    }

    /// A quoted string of printable ASCII without escapes.
    fn string(&mut self, what: &str) -> Result<&'t str, NpyError> {
        let Some(quote @ (b'\'' | b'"')) = self.peek() else {
            return Err(self.syntax(format!("expected {what}, found {}", self.found())));
        };
        let start = self.pos + 1;
        let mut i = start;
        loop {
            match self.text.get(i) {
                Some(&b) if b == quote => break,
                Some(0x20..=0x7e) if self.text[i] != b'\\' => i += 1,
                _ => {
                    return Err(self.syntax(format!(
                        "{what} must be a closed quoted string of printable ASCII without \
                         escapes, found {}",
                        self.found()
                    )));
                }
            }
        }
        let value = std::str::from_utf8(&self.text[start..i])
            .map_err(|_| self.syntax(format!("{what} is not ASCII")))?;
        self.pos = i + 1;
        Ok(value)
    }

    /// A run of identifier characters (letters, digits, `_`, `.`), which ends a token.
    fn word(&mut self) -> &'t [u8] {
        let start = self.pos;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        {
            self.pos += 1;
        }
        &self.text[start..self.pos]
    }

    fn dict(mut self) -> Result<Fields<'t>, NpyError> {
        let mut descr = None;
        let mut fortran_order = None;
        let mut shape = None;
        self.skip_ws();
        self.expect(b'{', "(the header must be a dict literal)")?;
        loop {
            self.skip_ws();
            if self.peek() == Some(b'}') {
                self.pos += 1;
                break;
            }
            let key = self.string("a quoted key")?;
            self.skip_ws();
            self.expect(b':', &format!("after the key '{key}'"))?;
            self.skip_ws();
            let duplicate = match key {
                "descr" => descr.replace(self.descr()?).is_some(),
                "fortran_order" => fortran_order.replace(self.boolean()?).is_some(),
                "shape" => shape.replace(self.shape()?).is_some(),
                other => {
                    return Err(NpyError::UnknownKey {
                        file: self.owned(),
                        key: other.to_owned(),
                    });
                }
            };
            if duplicate {
                return Err(NpyError::DuplicateKey {
                    file: self.owned(),
                    key: key.to_owned(),
                });
            }
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    break;
                }
                _ => {
                    return Err(self.syntax(format!(
                        "expected ',' or '}}' after the value of '{key}', found {}",
                        self.found()
                    )));
                }
            }
        }
        self.skip_ws();
        if self.pos != self.text.len() {
            return Err(self.syntax(format!(
                "expected only padding after the closing '}}', found {}",
                self.found()
            )));
        }
        let missing = |key| NpyError::MissingKey {
            file: self.owned(),
            key,
        };
        let descr = descr.ok_or_else(|| missing("descr"))?;
        let fortran_order = fortran_order.ok_or_else(|| missing("fortran_order"))?;
        let (shape, shape_text) = shape.ok_or_else(|| missing("shape"))?;
        Ok(Fields {
            descr,
            fortran_order,
            shape,
            shape_text,
        })
    }

    fn descr(&mut self) -> Result<&'t str, NpyError> {
        match self.peek() {
            Some(b'\'' | b'"') => self.string("the value of 'descr'"),
            Some(b'[') => {
                let len = bracketed_len(&self.text[self.pos..]);
                Err(NpyError::StructuredDtype {
                    file: self.owned(),
                    descr: self.quoted(len, STRUCTURED_SNIPPET_LEN),
                })
            }
            _ => Err(self.syntax(format!(
                "the value of 'descr' must be a quoted dtype string, found {}",
                self.found()
            ))),
        }
    }

    fn boolean(&mut self) -> Result<bool, NpyError> {
        let at = self.pos;
        match self.word() {
            b"True" => Ok(true),
            b"False" => Ok(false),
            _ => {
                self.pos = at;
                Err(self.syntax(format!(
                    "the value of 'fortran_order' must be True or False, found {}",
                    self.found()
                )))
            }
        }
    }

    /// The shape tuple, with its text as written.
    fn shape(&mut self) -> Result<(Vec<u64>, &'t str), NpyError> {
        let begin = self.pos;
        if self.peek() != Some(b'(') {
            return Err(self.syntax(format!(
                "the value of 'shape' must be a tuple of non-negative integers, found {}",
                self.found()
            )));
        }
        self.pos += 1;
        let mut dims = Vec::new();
        let mut fits = true;
        let mut after_comma = false;
        loop {
            self.skip_ws();
            if self.peek() == Some(b')') {
                self.pos += 1;
                break;
            }
            let (dim, dim_fits) = self.dimension()?;
            dims.push(dim);
            fits &= dim_fits;
            after_comma = false;
            self.skip_ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    after_comma = true;
                }
                Some(b')') => {
                    self.pos += 1;
                    break;
                }
                _ => {
                    return Err(self.syntax(format!(
                        "expected ',' or ')' in the shape, found {}",
                        self.found()
                    )));
                }
            }
        }
        let text = std::str::from_utf8(&self.text[begin..self.pos])
            .map_err(|_| self.syntax("the shape is not ASCII".to_owned()))?;
        if dims.len() == 1 && !after_comma {
            return Err(self.syntax(format!(
                "shape {text} is a parenthesised integer, not a tuple (write ({},))",
                dims[0]
            )));
        }
        if !fits {
            return Err(NpyError::SizeOverflow {
                file: self.owned(),
                shape: text.to_owned(),
            });
        }
        Ok((dims, text))
    }

    /// One dimension; the flag is false when it does not fit in u64.
    fn dimension(&mut self) -> Result<(u64, bool), NpyError> {
        let at = self.pos;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let token = self.word();
        let plain = !token.is_empty()
            && token.iter().all(u8::is_ascii_digit)
            && (token == b"0" || token[0] != b'0');
        if !plain {
            self.pos = at;
            return Err(self.syntax(format!(
                "a shape dimension must be a plain decimal integer, found {}",
                self.found()
            )));
        }
        let digits = String::from_utf8_lossy(token);
        if negative {
            return Err(NpyError::NegativeDimension {
                file: self.owned(),
                value: format!("-{digits}"),
            });
        }
        Ok(match digits.parse::<u64>() {
            Ok(dim) => (dim, true),
            Err(_) => (0, false),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::source::npy::dtype::{ByteOrder, Kind};

    /// A version 1.0 file prefix holding `dict`, padded to 64 bytes.
    fn v1(dict: &str) -> Vec<u8> {
        with_version(1, dict)
    }

    fn with_version(major: u8, dict: &str) -> Vec<u8> {
        let fixed = if major == 1 { 10 } else { 12 };
        let mut text = dict.as_bytes().to_vec();
        while !(fixed + text.len() + 1).is_multiple_of(64) {
            text.push(b' ');
        }
        text.push(b'\n');
        let mut out = MAGIC.to_vec();
        out.extend([major, 0]);
        if major == 1 {
            out.extend(u16::try_from(text.len()).unwrap().to_le_bytes());
        } else {
            out.extend(u32::try_from(text.len()).unwrap().to_le_bytes());
        }
        out.extend(text);
        out
    }

    fn parse(dict: &str) -> Result<Header, NpyError> {
        parse_header(&v1(dict), &Limits::default())
    }

    #[test]
    fn numpy_headers_parse() {
        let h = parse("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }").unwrap();
        assert_eq!(h.version, (1, 0));
        assert_eq!(h.dtype.kind, Kind::Float);
        assert_eq!(h.dtype.order, ByteOrder::Little);
        assert_eq!(h.shape, vec![2, 3]);
        assert_eq!(h.data_offset, 128);
        assert_eq!(h.data_len, 48);
        assert_eq!(h.element_count(), 6);
        let h = parse("{\"shape\":(7,),\"descr\":\">i2\",\"fortran_order\":True}").unwrap();
        assert_eq!((h.shape.as_slice(), h.fortran_order), (&[7u64][..], true));
        let h =
            parse("{ 'fortran_order' : True , 'shape' : ( 0 , 4 , ) , 'descr' : '|b1' }").unwrap();
        assert_eq!((h.shape.as_slice(), h.data_len), (&[0u64, 4][..], 0));
        for major in [2, 3] {
            let bytes = with_version(
                major,
                "{'descr': '<c8', 'fortran_order': False, 'shape': (5,), }",
            );
            let h = parse_header(&bytes, &Limits::default()).unwrap();
            assert_eq!(
                (h.version, h.data_offset, h.data_len),
                ((major, 0), 128, 40)
            );
        }
    }

    #[test]
    fn short_prefixes_ask_for_more() {
        let full = v1("{'descr':'<f8','fortran_order':False,'shape':(2,3)}");
        assert_eq!(full.len(), 64);
        for (len, needed) in [(0, 8), (5, 8), (7, 8), (8, 10), (9, 10), (10, 64), (63, 64)] {
            match parse_header(&full[..len], &Limits::default()) {
                Err(NpyError::TruncatedHeader {
                    needed: n, present, ..
                }) => {
                    assert_eq!((n, present), (needed, len as u64), "len {len}");
                }
                other => panic!("len {len}: {other:?}"),
            }
        }
    }

    #[test]
    fn object_dtype_is_refused_before_anything_else() {
        let err = parse("{'bad': __import__('os'), 'descr' : \"|O\", 'shape': (-1,)").unwrap_err();
        assert!(
            matches!(err, NpyError::ObjectDtype { ref descr, .. } if descr == "|O"),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "<memory>: object dtype ('|O') is refused: its payload is a pickle"
        );
    }

    #[test]
    fn grammar_refusals() {
        let cases: &[(&str, &str)] = &[
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), 'foo': 1}",
                "UnknownKey",
            ),
            (
                "{'descr': '<f8', 'descr': '<f8', 'fortran_order': False, 'shape': (3,)}",
                "DuplicateKey",
            ),
            ("{'descr': '<f8', 'fortran_order': False}", "MissingKey"),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (-1,)}",
                "NegativeDimension",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,)}",
                "SizeOverflow",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296)}",
                "SizeOverflow",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (0, 4294967296, 4294967296)}",
                "SizeOverflow",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': ()}",
                "ScalarShape",
            ),
            (
                "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (3,)}",
                "StructuredDtype",
            ),
            (
                "{'descr': '<U7', 'fortran_order': False, 'shape': (3,)}",
                "UnsupportedDtype",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (3)}",
                "HeaderSyntax",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': [3]}",
                "HeaderSyntax",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (3L,)}",
                "HeaderSyntax",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (03,)}",
                "HeaderSyntax",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (3.0,)}",
                "HeaderSyntax",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (3,,)}",
                "HeaderSyntax",
            ),
            (
                "{'descr': '<f8', 'fortran_order': 0, 'shape': (3,)}",
                "HeaderSyntax",
            ),
            (
                "{'descr': '<f8', 'fortran_order': Falsey, 'shape': (3,)}",
                "HeaderSyntax",
            ),
            (
                "{'descr': '\\x3cf8', 'fortran_order': False, 'shape': (3,)}",
                "HeaderSyntax",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (3,)} + 1",
                "HeaderSyntax",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False 'shape': (3,)}",
                "HeaderSyntax",
            ),
            (
                "{'descr': '<f8', 'fortran_order': False, 'shape': (3,),,}",
                "HeaderSyntax",
            ),
            ("dict(descr='<f8')", "HeaderSyntax"),
            (
                "{'descr': __import__('os').system('true'), 'fortran_order': False}",
                "HeaderSyntax",
            ),
        ];
        for (dict, expected) in cases {
            let err = parse(dict).unwrap_err();
            let name = format!("{err:?}");
            assert!(
                name.starts_with(expected),
                "{dict}: expected {expected}, got {err}"
            );
        }
    }

    #[test]
    fn refusals_say_what_they_held() {
        let err = parse("{'descr': __import__('os').system('true'), 'shape': (3,)}").unwrap_err();
        assert!(
            err.to_string().contains("`__import__('os').system('true')"),
            "{err}"
        );
        let err =
            parse("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), 'foo': 1}").unwrap_err();
        assert_eq!(err.to_string(), "<memory>: header key 'foo' is not allowed");
        let err = parse("{'descr': '<f8', 'fortran_order': False, 'shape': (2, -1)}").unwrap_err();
        assert_eq!(err.to_string(), "<memory>: shape dimension -1 is negative");
        let err =
            parse("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296)}")
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            "<memory>: byte size of shape (4294967296, 4294967296) overflows u64"
        );
    }

    #[test]
    fn preamble_refusals() {
        let good = v1("{'descr':'<f8','fortran_order':False,'shape':(3,)}");
        assert_eq!(good.len(), 64);
        let limits = Limits::default();
        let mut bad = good.clone();
        bad[1] = b'X';
        assert!(matches!(
            parse_header(&bad, &limits),
            Err(NpyError::BadMagic { .. })
        ));
        let mut bad = good.clone();
        bad[6] = 9;
        let err = parse_header(&bad, &limits).unwrap_err();
        assert_eq!(
            err.to_string(),
            "<memory>: unknown .npy version 9.0 (1.0, 2.0 and 3.0 are read)"
        );
        let mut bad = good.clone();
        bad[7] = 1;
        assert!(matches!(
            parse_header(&bad, &limits),
            Err(NpyError::UnsupportedVersion { .. })
        ));
        let mut huge = MAGIC.to_vec();
        huge.extend([2, 0]);
        huge.extend((1u32 << 31).to_le_bytes());
        let err = parse_header(&huge, &limits).unwrap_err();
        assert_eq!(
            err.to_string(),
            "<memory>: header length 2147483648 exceeds the limit of 65536 bytes"
        );
        let small = Limits::default().with_max_header_len(32);
        assert!(matches!(
            parse_header(&good, &small),
            Err(NpyError::HeaderTooLong { len: 54, .. })
        ));
        let mut bad = good.clone();
        bad[63] = b' ';
        assert!(matches!(
            parse_header(&bad, &limits),
            Err(NpyError::HeaderSyntax { .. })
        ));
        let mut bad = good.clone();
        bad[8] -= 1;
        assert!(matches!(
            parse_header(&bad, &limits),
            Err(NpyError::MisalignedHeader { prefix_len: 63, .. })
        ));
    }

    #[test]
    fn sixteen_byte_alignment_is_accepted() {
        let dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }";
        let mut text = dict.as_bytes().to_vec();
        while !(10 + text.len() + 1).is_multiple_of(16) {
            text.push(b' ');
        }
        text.push(b'\n');
        let mut bytes = MAGIC.to_vec();
        bytes.extend([1, 0]);
        bytes.extend(u16::try_from(text.len()).unwrap().to_le_bytes());
        bytes.extend(text);
        assert_eq!(bytes.len() % 64, 16);
        let h = parse_header(&bytes, &Limits::default()).unwrap();
        assert_eq!(h.data_offset, bytes.len() as u64);
    }

    #[test]
    fn limits_are_checked() {
        let dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (10, 10), }";
        let bytes = v1(dict);
        let err = parse_header(&bytes, &Limits::default().with_max_elements(99)).unwrap_err();
        assert!(matches!(
            err,
            NpyError::LimitExceeded {
                what: "element count",
                value: 100,
                ..
            }
        ));
        let err = parse_header(&bytes, &Limits::default().with_max_bytes(799)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "<memory>: byte size 800 of shape (10, 10) exceeds the limit of 799"
        );
        assert!(parse_header(&bytes, &Limits::default().with_max_bytes(800)).is_ok());
    }

    #[test]
    fn version_three_must_be_utf8() {
        let mut bytes = with_version(
            3,
            "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
        );
        let at = bytes.len() - 2;
        bytes[at] = 0xff;
        assert!(matches!(
            parse_header(&bytes, &Limits::default()),
            Err(NpyError::HeaderEncoding { .. })
        ));
        // The same byte in a version 1.0 header is a grammar refusal, not an encoding one.
        let mut bytes = v1("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }");
        let at = bytes.len() - 2;
        bytes[at] = 0xff;
        assert!(matches!(
            parse_header(&bytes, &Limits::default()),
            Err(NpyError::HeaderSyntax { .. })
        ));
    }

    #[test]
    fn c_layout_of_fortran_files() {
        let h = parse("{'descr': '<f8', 'fortran_order': True, 'shape': (1, 5, 1), }").unwrap();
        assert!(h.is_c_layout());
        let h = parse("{'descr': '<f8', 'fortran_order': True, 'shape': (2, 5), }").unwrap();
        assert!(!h.is_c_layout());
    }
}
