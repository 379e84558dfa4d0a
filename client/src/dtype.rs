//! Item sizes of numpy dtype strings.

use crate::error::ClientError;

/// Bytes per element of a numpy dtype string such as `<u2`, `|u1`, `>i2`,
/// `<f4`, `<c16`, `|b1`, `|S8`, `<U4` (4 bytes per character) or `<M8[ns]`.
/// Byte order is carried, never converted, so it does not matter here.
pub fn itemsize(dtype: &str) -> Result<usize, ClientError> {
    let refuse = |reason: &str| ClientError::Dtype {
        dtype: dtype.to_string(),
        reason: reason.to_string(),
    };
    let body = dtype.strip_prefix(['<', '>', '|', '=']).unwrap_or(dtype);
    let body = match body.find('[') {
        Some(at) if body.ends_with(']') => &body[..at],
        Some(_) => return Err(refuse("unclosed '[' unit")),
        None => body,
    };
    let mut chars = body.chars();
    let kind = chars
        .next()
        .ok_or_else(|| refuse("no type character after the byte order"))?;
    let digits = chars.as_str();
    let count: usize = digits
        .parse()
        .map_err(|_| refuse("expected a type character followed by a byte count"))?;
    let size = match kind {
        'b' | 'i' | 'u' | 'f' | 'c' | 'S' | 'V' | 'M' | 'm' => count,
        'U' => count
            .checked_mul(4)
            .ok_or_else(|| refuse("character count overflows"))?,
        _ => {
            return Err(refuse(&format!(
                "type character '{kind}' is not a fixed-size numpy kind"
            )));
        }
    };
    if size == 0 {
        return Err(refuse("zero-sized elements"));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn sizes_of_served_dtypes() {
        for (dtype, size) in [
            ("<u2", 2),
            ("|u1", 1),
            (">i2", 2),
            ("<f4", 4),
            ("<f8", 8),
            ("<c16", 16),
            ("|b1", 1),
            ("<U3", 12),
            ("<M8[ns]", 8),
            ("f2", 2),
        ] {
            assert_eq!(itemsize(dtype).unwrap(), size, "{dtype}");
        }
    }

    #[test]
    fn unsizable_dtypes_are_refused_by_name() {
        for dtype in ["|O", "", "<", "<q8", "<u", "<u0", "<M8[ns"] {
            let err = itemsize(dtype).unwrap_err().to_string();
            assert!(err.contains(&format!("'{dtype}'")), "{err}");
        }
    }
}
