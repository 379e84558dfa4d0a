//! Downsampled (scaled) reads: what a `scale_hint` asks for, how one scaled chunk is
//! computed from the source, and the pyramid a descriptor advertises.
//!
//! * [`Scale`] is a validated request: one positive factor per axis (none above its axis
//!   length, at least one above 1) and a [`Method`].
//! * [`reduce`] computes one scaled chunk tile by tile from the source, with the reference
//!   server's semantics bit for bit (`nearest`: strided pick; `area`: staged means).
//! * [`pyramid`] is the reference's policy for the levels a descriptor advertises.
//!
//! A scaled chunk is named by the block of the source it reduces (absolute base
//! coordinates) plus the scale and method (see [`crate::grid::chunk_id`]), so it is a cache
//! entry of its own, served by `chunk_locate` and `do_get` like any other chunk.

pub mod pyramid;

use std::fmt;

/// How a scaled read reduces a block of `scale` elements per axis to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// A strided pick, `a[::s0, ::s1, …]`: the first element of every block, bit-exact.
    Nearest,
    /// The block mean: edge-replicated to whole blocks, averaged one axis at a time, last
    /// axis first (see [`reduce`]).
    Area,
}

/// The method names a client may send (aliases included), for refusals.
pub const METHOD_NAMES: &str =
    "'nearest' (aliases 'stride', 'decimate'; the default) and 'area' (alias 'mean')";

impl Method {
    /// The canonical name, as the pyramid advertises it.
    pub fn name(self) -> &'static str {
        match self {
            Method::Nearest => "nearest",
            Method::Area => "area",
        }
    }

    /// The byte naming this method inside a chunk id (the reference's codes).
    pub fn code(self) -> u8 {
        match self {
            Method::Nearest => 1,
            Method::Area => 2,
        }
    }

    /// The method a chunk id byte names.
    pub fn from_code(code: u8) -> Option<Method> {
        match code {
            1 => Some(Method::Nearest),
            2 => Some(Method::Area),
            _ => None,
        }
    }

    /// Parses a requested method name (case-insensitive, surrounding spaces ignored);
    /// empty means the default, `nearest`. `linear` (deprecated) reads as `area`.
    /// `precompute` asks for a native on-disk level, which a `.npy` never has: refused
    /// like an unknown name, naming the methods that are available.
    pub fn parse(name: &str) -> Result<Method, ScaleError> {
        let lower = name.trim().to_ascii_lowercase();
        match lower.as_str() {
            "" | "nearest" | "stride" | "decimate" => Ok(Method::Nearest),
            "area" | "mean" => Ok(Method::Area),
            "linear" => {
                // Once per window: every request of an old client says it.
                match crate::metrics::quiet::admit("reduction_method linear") {
                    Some(held_back) => tracing::warn!(
                        held_back,
                        "reduction_method 'linear' is deprecated and no longer supported; using 'area'"
                    ),
                    None => tracing::debug!(
                        "reduction_method 'linear' is deprecated and no longer supported; using 'area'"
                    ),
                }
                Ok(Method::Area)
            }
            "precompute" | "precomputed" => Err(ScaleError::Precompute {
                method: name.to_string(),
            }),
            _ => Err(ScaleError::UnknownMethod {
                method: name.to_string(),
            }),
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a `scale_hint` / `reduction_method` pair was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScaleError {
    /// The hint has another number of values than the tensor has axes.
    #[error("scale_hint {hint:?} has {} values, but the tensor has {rank} axes", hint.len())]
    Rank {
        /// The hint as sent.
        hint: Vec<i64>,
        /// The tensor's rank.
        rank: usize,
    },
    /// A factor is zero or negative.
    #[error(
        "scale_hint {hint:?} has {value} on axis {axis}: every factor must be a positive integer (1 = untouched)"
    )]
    NotPositive {
        /// The hint as sent.
        hint: Vec<i64>,
        /// The offending axis.
        axis: usize,
        /// Its factor.
        value: i64,
    },
    /// A factor exceeds its axis length.
    #[error(
        "scale_hint {hint:?} has {value} on axis {axis}, whose length is {dim}: a factor may not exceed the axis length"
    )]
    OverAxis {
        /// The hint as sent.
        hint: Vec<i64>,
        /// The offending axis.
        axis: usize,
        /// Its factor.
        value: i64,
        /// The axis length.
        dim: u64,
    },
    /// `precompute` names a native on-disk level, which a `.npy` source has none of.
    #[error(
        "reduction_method '{method}' asks for a precomputed on-disk level, and this source stores none; the methods available are {METHOD_NAMES}"
    )]
    Precompute {
        /// The method as sent.
        method: String,
    },
    /// A method nobody knows.
    #[error("unknown reduction_method '{method}'; the methods available are {METHOD_NAMES}")]
    UnknownMethod {
        /// The method as sent.
        method: String,
    },
    /// `area` of a bool tensor: a mean of booleans is not a boolean.
    #[error(
        "reduction_method 'area' cannot reduce the bool tensor (dtype '{dtype}'): a mean of booleans is not a boolean; use 'nearest'"
    )]
    AreaOfBool {
        /// The tensor's dtype.
        dtype: String,
    },
}

/// A validated downsampling request: one factor per axis, at least one above 1.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Scale {
    factors: Vec<u64>,
    method: Method,
}

impl Scale {
    /// A scale from factors already known valid for some tensor (each ≥ 1, at least one
    /// above 1); `None` when every factor is 1 or one is 0.
    pub fn new(factors: Vec<u64>, method: Method) -> Option<Scale> {
        let valid = factors.iter().all(|&f| f >= 1) && factors.iter().any(|&f| f > 1);
        valid.then_some(Scale { factors, method })
    }

    /// Validates a request's `scale_hint` and `reduction_method` against a tensor of
    /// `shape`: `Ok(None)` for a full-resolution read (no hint, or all ones), the scale
    /// otherwise. The method is checked even when the read is not scaled, except that
    /// `precompute` at full resolution names level 0, which is native.
    pub fn from_request(
        shape: &[u64],
        hint: &[i64],
        method: &str,
    ) -> Result<Option<Scale>, ScaleError> {
        let scaled = !hint.is_empty() && hint.iter().any(|&s| s != 1);
        let method = match Method::parse(method) {
            Ok(method) => method,
            Err(ScaleError::Precompute { .. }) if !scaled => Method::Nearest,
            Err(err) => return Err(err),
        };
        if hint.is_empty() {
            return Ok(None);
        }
        if hint.len() != shape.len() {
            return Err(ScaleError::Rank {
                hint: hint.to_vec(),
                rank: shape.len(),
            });
        }
        let mut factors = Vec::with_capacity(hint.len());
        for (axis, (&value, &dim)) in hint.iter().zip(shape).enumerate() {
            if value < 1 {
                return Err(ScaleError::NotPositive {
                    hint: hint.to_vec(),
                    axis,
                    value,
                });
            }
            if value as u64 > dim && value != 1 {
                return Err(ScaleError::OverAxis {
                    hint: hint.to_vec(),
                    axis,
                    value,
                    dim,
                });
            }
            factors.push(value as u64);
        }
        Ok(Scale::new(factors, method))
    }

    /// Checks the scale is valid for a tensor of `shape` (as a decoded chunk id must be).
    pub fn fits(&self, shape: &[u64]) -> bool {
        self.factors.len() == shape.len()
            && self
                .factors
                .iter()
                .zip(shape)
                .all(|(&f, &dim)| f == 1 || f <= dim)
    }

    /// The factor per axis.
    pub fn factors(&self) -> &[u64] {
        &self.factors
    }

    /// The reduction method.
    pub fn method(&self) -> Method {
        self.method
    }

    /// The reduced extent of `extent` base elements per axis: `ceil(extent / scale)`.
    pub fn reduced(&self, extent: &[u64]) -> Vec<u64> {
        extent
            .iter()
            .zip(&self.factors)
            .map(|(&e, &s)| e.div_ceil(s))
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn methods_and_aliases_parse_and_the_rest_are_refused_by_name() {
        for (name, method) in [
            ("", Method::Nearest),
            ("nearest", Method::Nearest),
            (" Stride ", Method::Nearest),
            ("decimate", Method::Nearest),
            ("area", Method::Area),
            ("MEAN", Method::Area),
            ("linear", Method::Area),
        ] {
            assert_eq!(Method::parse(name), Ok(method), "{name}");
        }
        let err = Method::parse("bicubic").unwrap_err().to_string();
        assert!(
            err.contains("'bicubic'") && err.contains("'nearest'") && err.contains("'area'"),
            "{err}"
        );
        let err = Method::parse("precomputed").unwrap_err().to_string();
        assert!(
            err.contains("precomputed") && err.contains("'nearest'"),
            "{err}"
        );
    }

    #[test]
    fn bad_hints_are_refused_naming_the_value_and_the_axis() {
        let shape = [10, 20];
        let err = |hint: &[i64]| {
            Scale::from_request(&shape, hint, "")
                .unwrap_err()
                .to_string()
        };
        assert!(err(&[2]).contains("1 values, but the tensor has 2 axes"));
        assert!(err(&[2, 0]).contains("0 on axis 1"));
        assert!(err(&[-3, 1]).contains("-3 on axis 0"));
        let over = err(&[1, 21]);
        assert!(
            over.contains("21 on axis 1") && over.contains("length is 20"),
            "{over}"
        );
        assert!(
            Scale::from_request(&shape, &[2, 2], "precompute")
                .unwrap_err()
                .to_string()
                .contains("precompute")
        );
    }

    #[test]
    fn trivial_hints_are_full_resolution_reads() {
        let shape = [10, 20];
        assert_eq!(Scale::from_request(&shape, &[], ""), Ok(None));
        assert_eq!(Scale::from_request(&shape, &[1, 1], "area"), Ok(None));
        assert_eq!(Scale::from_request(&shape, &[1, 1], "precompute"), Ok(None));
        assert!(Scale::from_request(&shape, &[1, 1], "cubic").is_err());
        let scale = Scale::from_request(&shape, &[10, 3], "mean")
            .unwrap()
            .unwrap();
        assert_eq!(scale.factors(), &[10, 3]);
        assert_eq!(scale.method(), Method::Area);
        assert_eq!(scale.reduced(&[10, 20]), vec![1, 7]);
    }
}
