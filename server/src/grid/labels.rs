//! Axis labels: the defaults reported for unlabelled `.npy` tensors and the
//! recognised spellings of the common axis roles.

/// The role of an axis, as recognised from a label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AxisRole {
    /// Time (`t`, `time`).
    Time,
    /// Channel (`c`, `channel`).
    Channel,
    /// Depth (`z`, `depth`).
    Depth,
    /// Rows (`y`).
    Y,
    /// Columns (`x`).
    X,
    /// Interleaved samples, e.g. RGB components (`s`, `sample`, `samples`).
    Sample,
}

impl AxisRole {
    /// The canonical one-letter label of this role (`t`, `c`, `z`, `y`, `x`, `s`).
    #[cfg(test)]
    pub fn label(self) -> &'static str {
        match self {
            AxisRole::Time => "t",
            AxisRole::Channel => "c",
            AxisRole::Depth => "z",
            AxisRole::Y => "y",
            AxisRole::X => "x",
            AxisRole::Sample => "s",
        }
    }
}

/// Recognises an axis label, ignoring ASCII case and surrounding whitespace.
///
/// `t`/`time`, `c`/`channel`, `z`/`depth`, `y`, `x` and `s`/`sample`/`samples` are
/// recognised; anything else is `None` (a label with no known role).
pub fn normalize_label(label: &str) -> Option<AxisRole> {
    let lower = label.trim().to_ascii_lowercase();
    match lower.as_str() {
        "t" | "time" => Some(AxisRole::Time),
        "c" | "channel" => Some(AxisRole::Channel),
        "z" | "depth" => Some(AxisRole::Depth),
        "y" => Some(AxisRole::Y),
        "x" => Some(AxisRole::X),
        "s" | "sample" | "samples" => Some(AxisRole::Sample),
        _ => None,
    }
}

/// The default `dim_labels` of a tensor of `shape` (`.npy` files carry no labels).
///
/// The fastest axes are spatial, slower ones are channel and time:
/// rank 1 → `x`; 2 → `y x`; 3 → `z y x`; 4 → `c z y x`; 5 → `t c z y x`;
/// rank 6 and above → `dim_0`, `dim_1`, … for the extra leading axes, then
/// `t c z y x`. Rank 0 has no labels. One exception fits how images are stored: a
/// 3-D array whose last axis has length 3 or 4 (RGB, RGBA) is `y x s`: `s` is the label
/// biopb's readers (its server's adapters, the napari Tensor Browser) take for interleaved
/// colour samples, so napari draws it as colour and puts no physical scale on it.
pub fn default_dim_labels(shape: &[u64]) -> Vec<String> {
    const TAIL: [&str; 5] = ["t", "c", "z", "y", "x"];
    if let [_, _, 3 | 4] = shape {
        return ["y", "x", "s"].map(str::to_owned).to_vec();
    }
    let rank = shape.len();
    let named = rank.min(TAIL.len());
    let extra = rank - named;
    (0..extra)
        .map(|i| format!("dim_{i}"))
        .chain(TAIL[TAIL.len() - named..].iter().map(|s| (*s).to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_by_rank() {
        assert!(default_dim_labels(&[]).is_empty());
        assert_eq!(default_dim_labels(&[9]), ["x"]);
        assert_eq!(default_dim_labels(&[9, 9]), ["y", "x"]);
        assert_eq!(default_dim_labels(&[24, 256, 256]), ["z", "y", "x"]);
        assert_eq!(default_dim_labels(&[2, 9, 9, 9]), ["c", "z", "y", "x"]);
        assert_eq!(default_dim_labels(&[2; 5]), ["t", "c", "z", "y", "x"]);
        assert_eq!(
            default_dim_labels(&[2; 7]),
            ["dim_0", "dim_1", "t", "c", "z", "y", "x"]
        );
    }

    #[test]
    fn images_with_three_or_four_trailing_samples_are_y_x_s() {
        assert_eq!(default_dim_labels(&[480, 640, 3]), ["y", "x", "s"]);
        assert_eq!(default_dim_labels(&[480, 640, 4]), ["y", "x", "s"]);
        assert_eq!(default_dim_labels(&[480, 640, 5]), ["z", "y", "x"]);
        assert_eq!(default_dim_labels(&[10, 480, 640, 3]), ["c", "z", "y", "x"]);
    }

    #[test]
    fn recognised_labels() {
        for (text, role) in [
            ("t", AxisRole::Time),
            ("TIME", AxisRole::Time),
            ("C", AxisRole::Channel),
            ("Channel", AxisRole::Channel),
            ("z", AxisRole::Depth),
            ("Depth", AxisRole::Depth),
            ("Y", AxisRole::Y),
            (" x ", AxisRole::X),
            ("S", AxisRole::Sample),
            ("sample", AxisRole::Sample),
            ("samples", AxisRole::Sample),
        ] {
            assert_eq!(normalize_label(text), Some(role), "{text:?}");
        }
        for text in ["", "dim_0", "v", "frame", "xy", "channels", "times"] {
            assert_eq!(normalize_label(text), None, "{text:?}");
        }
    }

    #[test]
    fn canonical_labels_round_trip() {
        for role in [
            AxisRole::Time,
            AxisRole::Channel,
            AxisRole::Depth,
            AxisRole::Y,
            AxisRole::X,
            AxisRole::Sample,
        ] {
            assert_eq!(normalize_label(role.label()), Some(role));
        }
    }
}
