//! The closed set of element types served from `.npy` files.

use std::path::Path;

use super::error::NpyError;
use crate::grid::scaled::{Method, Scale, ScaleError};

/// The byte order of a dtype, carried as the file states it (never converted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ByteOrder {
    /// Least significant byte first (`<`).
    Little,
    /// Most significant byte first (`>`).
    Big,
    /// One-byte types, which have no order (`|`).
    NotApplicable,
}

/// The kind of a dtype: numpy's type character.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `b`: booleans, one byte each.
    Bool,
    /// `i`: signed integers.
    Int,
    /// `u`: unsigned integers.
    UInt,
    /// `f`: IEEE 754 floats (half, single, double).
    Float,
    /// `c`: complex numbers, a pair of floats.
    Complex,
}

impl Kind {
    fn code(self) -> char {
        match self {
            Kind::Bool => 'b',
            Kind::Int => 'i',
            Kind::UInt => 'u',
            Kind::Float => 'f',
            Kind::Complex => 'c',
        }
    }

    fn from_code(code: char) -> Option<Kind> {
        match code {
            'b' => Some(Kind::Bool),
            'i' => Some(Kind::Int),
            'u' => Some(Kind::UInt),
            'f' => Some(Kind::Float),
            'c' => Some(Kind::Complex),
            _ => None,
        }
    }

    fn supports(self, itemsize: usize) -> bool {
        match self {
            Kind::Bool => itemsize == 1,
            Kind::Int | Kind::UInt => matches!(itemsize, 1 | 2 | 4 | 8),
            Kind::Float => matches!(itemsize, 2 | 4 | 8),
            Kind::Complex => matches!(itemsize, 8 | 16),
        }
    }
}

/// A supported element type: `b1`, `i1`–`i8`, `u1`–`u8`, `f2`–`f8`, `c8`, `c16`, with its order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dtype {
    /// The kind.
    pub kind: Kind,
    /// Bytes per element.
    pub itemsize: usize,
    /// Byte order; [`ByteOrder::NotApplicable`] exactly when `itemsize == 1`.
    pub order: ByteOrder,
}

/// The host's byte order, which `=` (native) stands for.
const HOST_ORDER: ByteOrder = if cfg!(target_endian = "little") {
    ByteOrder::Little
} else {
    ByteOrder::Big
};

/// Whether a dtype string names numpy's object dtype (`O`, `|O`, `<O8`, ...).
pub(crate) fn is_object_descr(descr: &str) -> bool {
    let rest = descr.strip_prefix(['<', '>', '|', '=']).unwrap_or(descr);
    rest.strip_prefix('O')
        .is_some_and(|size| size.bytes().all(|b| b.is_ascii_digit()))
}

impl Dtype {
    /// The dtype of `itemsize`-byte elements of `kind` in `order` (not applicable for one
    /// byte), or `None` when that size of that kind is not served.
    pub fn new(kind: Kind, itemsize: usize, order: ByteOrder) -> Option<Dtype> {
        kind.supports(itemsize).then_some(Dtype {
            kind,
            itemsize,
            order: if itemsize == 1 {
                ByteOrder::NotApplicable
            } else {
                order
            },
        })
    }

    /// Refuses a scale whose method cannot reduce elements of this dtype: `area` of a bool
    /// tensor (a mean of booleans is not a boolean). The one check of it, for plans and for
    /// chunk tickets alike.
    pub fn check_scale(&self, scale: &Scale) -> Result<(), ScaleError> {
        if scale.method() == Method::Area && self.kind == Kind::Bool {
            return Err(ScaleError::AreaOfBool {
                dtype: self.numpy_str(),
            });
        }
        Ok(())
    }

    /// The dtype string numpy uses for it (`arr.dtype.str`): `<u2`, `>i2`, `|u1`, `|b1`, `<c8`.
    pub fn numpy_str(&self) -> String {
        let order = match self.order {
            ByteOrder::Little => '<',
            ByteOrder::Big => '>',
            ByteOrder::NotApplicable => '|',
        };
        format!("{order}{}{}", self.kind.code(), self.itemsize)
    }

    /// Parses a dtype string of the supported set.
    ///
    /// The string must start with a byte-order character: `<` and `>` are kept, `=` (native)
    /// becomes the host's explicit order, and one-byte types always get
    /// [`ByteOrder::NotApplicable`]. Like numpy, `|` on a multi-byte type means native.
    /// The object dtype is refused as [`NpyError::ObjectDtype`]; anything else outside the set
    /// as [`NpyError::UnsupportedDtype`].
    pub fn parse(descr: &str) -> Result<Dtype, NpyError> {
        Self::parse_for(descr, None)
    }

    pub(crate) fn parse_for(descr: &str, file: Option<&Path>) -> Result<Dtype, NpyError> {
        if is_object_descr(descr) {
            return Err(NpyError::ObjectDtype {
                file: file.map(Path::to_path_buf),
                descr: descr.to_owned(),
            });
        }
        let unsupported = || NpyError::UnsupportedDtype {
            file: file.map(Path::to_path_buf),
            descr: descr.to_owned(),
        };
        let mut chars = descr.chars();
        let order = match chars.next() {
            Some('<') => ByteOrder::Little,
            Some('>') => ByteOrder::Big,
            Some('=' | '|') => HOST_ORDER,
            _ => return Err(unsupported()),
        };
        let kind = chars
            .next()
            .and_then(Kind::from_code)
            .ok_or_else(unsupported)?;
        let size = chars.as_str();
        if size.is_empty() || !size.bytes().all(|b| b.is_ascii_digit()) || size.starts_with('0') {
            return Err(unsupported());
        }
        let itemsize: usize = size.parse().map_err(|_| unsupported())?;
        Dtype::new(kind, itemsize, order).ok_or_else(unsupported)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn every_supported_dtype_round_trips() {
        let sizes: [(char, &[usize]); 5] = [
            ('b', &[1]),
            ('i', &[1, 2, 4, 8]),
            ('u', &[1, 2, 4, 8]),
            ('f', &[2, 4, 8]),
            ('c', &[8, 16]),
        ];
        for (code, list) in sizes {
            for &size in list {
                let orders: &[char] = if size == 1 { &['|'] } else { &['<', '>'] };
                for &order in orders {
                    let text = format!("{order}{code}{size}");
                    let dtype = Dtype::parse(&text).unwrap();
                    assert_eq!(dtype.numpy_str(), text);
                    assert_eq!(dtype.itemsize, size);
                }
            }
        }
    }

    #[test]
    fn orders_are_normalised() {
        let native = if cfg!(target_endian = "little") {
            "<"
        } else {
            ">"
        };
        assert_eq!(
            Dtype::parse("=u2").unwrap().numpy_str(),
            format!("{native}u2")
        );
        assert_eq!(
            Dtype::parse("|f8").unwrap().numpy_str(),
            format!("{native}f8")
        );
        assert_eq!(Dtype::parse("<u1").unwrap().numpy_str(), "|u1");
        assert_eq!(Dtype::parse(">b1").unwrap().order, ByteOrder::NotApplicable);
        assert_eq!(Dtype::parse(">i2").unwrap().order, ByteOrder::Big);
    }

    #[test]
    fn objects_are_refused_by_name() {
        for descr in ["|O", "<O", ">O", "O", "|O8"] {
            assert!(
                matches!(Dtype::parse(descr), Err(NpyError::ObjectDtype { .. })),
                "{descr}"
            );
        }
    }

    #[test]
    fn everything_else_is_unsupported() {
        for descr in [
            "",
            "<",
            "f8",
            "<U7",
            "<f16",
            "<c32",
            "<i3",
            "<i08",
            "<b2",
            "<M8[ns]",
            "|V8",
            "<f8 ",
            "<i+4",
            "|S3",
            "<u",
            "<i99999999999999999999999",
        ] {
            let err = Dtype::parse(descr).unwrap_err();
            assert!(
                matches!(err, NpyError::UnsupportedDtype { .. }),
                "{descr}: {err}"
            );
            assert!(err.to_string().contains(&format!("'{descr}'")));
        }
    }
}
