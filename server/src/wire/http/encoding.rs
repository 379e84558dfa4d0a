//! `Content-Encoding` of raw tile and slice bytes: `zstd` or `gzip` when the client accepts
//! one and it saves at least a tenth of the bytes, else the bytes as they are. Fast levels:
//! the encoding is paid per request, in the request's task.

use std::io::Write;

/// The encodings offered, most preferred first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coding {
    /// RFC 8878 zstd, level 1.
    Zstd,
    /// gzip, level 1.
    Gzip,
}

impl Coding {
    /// Its `Content-Encoding` token.
    pub fn name(self) -> &'static str {
        match self {
            Coding::Zstd => "zstd",
            Coding::Gzip => "gzip",
        }
    }
}

/// The codings an `Accept-Encoding` value allows, most preferred first (a `;q=0` entry is
/// refused).
pub fn accepted(header: Option<&str>) -> Vec<Coding> {
    let Some(header) = header else {
        return Vec::new();
    };
    let allows = |name: &str| {
        header.split(',').any(|part| {
            let mut pieces = part.split(';').map(str::trim);
            pieces.next().is_some_and(|n| n.eq_ignore_ascii_case(name))
                && !pieces.any(|p| p.replace(' ', "") == "q=0")
        })
    };
    [Coding::Zstd, Coding::Gzip]
        .into_iter()
        .filter(|c| allows(c.name()))
        .collect()
}

/// `bytes` in the first of `codings` that saves a tenth, or `None` to send them as they are.
pub fn encode(bytes: &[u8], codings: &[Coding]) -> Option<(Coding, Vec<u8>)> {
    if bytes.len() < 256 {
        return None;
    }
    let coding = *codings.first()?;
    let encoded = match coding {
        Coding::Zstd => zstd::bulk::compress(bytes, 1).ok()?,
        Coding::Gzip => {
            let mut encoder = flate2::write::GzEncoder::new(
                Vec::with_capacity(bytes.len() / 2),
                flate2::Compression::fast(),
            );
            encoder.write_all(bytes).ok()?;
            encoder.finish().ok()?
        }
    };
    (encoded.len() < bytes.len() - bytes.len() / 10).then_some((coding, encoded))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn accept_encoding_is_read_by_token_and_q_zero_refuses() {
        assert_eq!(
            accepted(Some("gzip, deflate, br, zstd")),
            vec![Coding::Zstd, Coding::Gzip]
        );
        assert_eq!(accepted(Some("zstd;q=0, gzip")), vec![Coding::Gzip]);
        assert!(accepted(None).is_empty());
    }

    #[test]
    fn compressible_bytes_are_encoded_and_round_trip() {
        let bytes = vec![7u8; 4096];
        let (coding, encoded) = encode(&bytes, &[Coding::Zstd]).unwrap();
        assert_eq!(coding, Coding::Zstd);
        assert_eq!(zstd::bulk::decompress(&encoded, 4096).unwrap(), bytes);
    }
}
