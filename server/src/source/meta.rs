//! Operator-supplied metadata and physical scale of a source.
//!
//! A `.npy` file carries neither, so an operator supplies them: per configured path in
//! `[[source]]` (`physical_scale`, `physical_unit`, `metadata` or `metadata_file`), and
//! per file in an optional sidecar `NAME.json` beside `NAME.npy`:
//!
//! ```json
//! {"physical_scale": [2.0, 0.1, 0.1], "physical_unit": ["µm", "um", "nm"],
//!  "metadata": {"objective": "60x", "channel": "GFP"}}
//! ```
//!
//! Every key is optional and no other key is allowed. `physical_unit` is one unit for every
//! axis or one per axis. The sidecar's scale and unit replace the configured ones; its
//! `metadata` keys are added to the configured ones (the sidecar's win). Length units are
//! canonicalised to micrometres the way the biopb reference server does (`um`, `micron`,
//! `nm`, `mm`, … → `µm`, the size converted); other units (`s`, `px`) are kept as written.
//! An axis of scale 0 has no physical size and no unit.
//!
//! A sidecar that cannot be read or parsed, or a scale that does not fit the tensor, is
//! refused by name: the tensor still serves, without what the refused part supplied, and
//! the reason is reported under `metadata_error` in its `metadata_json`.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

use std::os::unix::fs::OpenOptionsExt;

use crate::content_version::FileVersion;
use crate::source::confine::Confine;

/// Largest sidecar read, in bytes.
pub const MAX_SIDECAR_BYTES: u64 = 1 << 20;

/// Keys of `metadata_json` Tessera writes itself (and `path`, which it no longer sends:
/// `source_url` says where a source is); supplied metadata may not use them.
pub const RESERVED_KEYS: [&str; 11] = [
    "format",
    "path",
    "npy_version",
    "fortran_order",
    "dtype",
    "shape",
    "chunk_shape",
    "mapped_chunk_shape",
    "physical_scale",
    "physical_unit",
    "metadata_error",
];

/// One unit for every axis, or one per axis.
#[derive(Clone, Debug, PartialEq, Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum Units {
    /// The same unit on every axis.
    One(String),
    /// A unit per axis.
    PerAxis(Vec<String>),
}

/// What an operator supplies for a source, in `[[source]]` or a sidecar.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Supplied {
    /// Size of one element along each axis.
    pub physical_scale: Option<Vec<f64>>,
    /// Unit of each size.
    pub physical_unit: Option<Units>,
    /// Free-form metadata, reported in `metadata_json`.
    pub metadata: Option<Map<String, Value>>,
}

impl Supplied {
    /// Whether nothing is supplied.
    pub fn is_empty(&self) -> bool {
        self.physical_scale.is_none() && self.physical_unit.is_none() && self.metadata.is_none()
    }

    /// Refuses metadata keys Tessera writes itself, naming them.
    pub fn check_keys(&self) -> Result<(), String> {
        let taken: Vec<&str> = self
            .metadata
            .iter()
            .flat_map(|m| m.keys())
            .filter(|k| RESERVED_KEYS.contains(&k.as_str()))
            .map(String::as_str)
            .collect();
        if taken.is_empty() {
            return Ok(());
        }
        Err(format!(
            "metadata keys {taken:?} are written by Tessera itself; use other names"
        ))
    }

    /// `self` with `over`'s scale and unit in place of its own and `over`'s metadata
    /// keys added.
    fn overlaid(&self, over: &Supplied) -> Supplied {
        let mut metadata = self.metadata.clone();
        if let Some(extra) = &over.metadata {
            let merged = metadata.get_or_insert_with(Map::new);
            for (k, v) in extra {
                merged.insert(k.clone(), v.clone());
            }
        }
        Supplied {
            physical_scale: over
                .physical_scale
                .clone()
                .or_else(|| self.physical_scale.clone()),
            physical_unit: over
                .physical_unit
                .clone()
                .or_else(|| self.physical_unit.clone()),
            metadata,
        }
    }
}

/// A source's metadata as served: the same in `metadata_json`, the descriptor's
/// `physical_scale`/`physical_unit`, `get_source_metadata` and the catalog.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceMeta {
    /// Physical size of one element per axis (empty: not known).
    pub physical_scale: Vec<f64>,
    /// Unit per axis, aligned with `physical_scale`.
    pub physical_unit: Vec<String>,
    /// Supplied free-form metadata.
    pub metadata: Map<String, Value>,
    /// Why a sidecar or the supplied scale was refused.
    pub error: Option<String>,
    /// The sidecar's identity when it was read (`None`: there was none), so a changed
    /// sidecar is read again.
    pub sidecar: Option<FileVersion>,
}

/// Micrometres per unit for the length units the reference server canonicalises.
fn micrometres_per(unit: &str) -> Option<f64> {
    Some(match unit.trim().to_lowercase().as_str() {
        "nm" | "nanometer" | "nanometre" | "nanometers" | "nanometres" => 1e-3,
        "um" | "µm" | "μm" | "micron" | "microns" | "micrometer" | "micrometre" | "micrometers"
        | "micrometres" => 1.0,
        "mm" | "millimeter" | "millimetre" | "millimeters" | "millimetres" => 1e3,
        "cm" | "centimeter" | "centimetre" | "centimeters" | "centimetres" => 1e4,
        "m" | "meter" | "metre" | "meters" | "metres" => 1e6,
        "in" | "inch" | "inches" | "\"" => 25400.0,
        _ => return None,
    })
}

/// The canonical micrometre sign (U+00B5), as the reference server and OME write it.
pub const MICRON: &str = "µm";

/// `(size, unit)` with a length unit converted to micrometres; other units kept as written.
pub fn canonical(size: f64, unit: &str) -> (f64, String) {
    match micrometres_per(unit) {
        Some(factor) => (size * factor, MICRON.to_string()),
        None => (size, unit.trim().to_string()),
    }
}

/// Scale and units checked against a tensor of `rank` axes and canonicalised.
fn physical(supplied: &Supplied, rank: usize) -> Result<(Vec<f64>, Vec<String>), String> {
    let Some(scale) = &supplied.physical_scale else {
        if supplied.physical_unit.is_some() {
            return Err("physical_unit is given without physical_scale".to_string());
        }
        return Ok((Vec::new(), Vec::new()));
    };
    if scale.len() != rank {
        return Err(format!(
            "physical_scale {scale:?} has {} values, but the tensor has {rank} axes",
            scale.len()
        ));
    }
    if let Some(bad) = scale.iter().find(|v| !v.is_finite() || **v < 0.0) {
        return Err(format!(
            "physical_scale value {bad} is not a finite size of 0 or more"
        ));
    }
    let units: Vec<String> = match &supplied.physical_unit {
        None => vec![String::new(); rank],
        Some(Units::One(unit)) => vec![unit.clone(); rank],
        Some(Units::PerAxis(units)) if units.len() == rank => units.clone(),
        Some(Units::PerAxis(units)) => {
            return Err(format!(
                "physical_unit {units:?} names {} units, but the tensor has {rank} axes",
                units.len()
            ));
        }
    };
    Ok(scale
        .iter()
        .zip(&units)
        .map(|(&size, unit)| {
            if size == 0.0 {
                (0.0, String::new())
            } else {
                canonical(size, unit)
            }
        })
        .unzip())
}

/// The sidecar of `npy`: `NAME.json` beside `NAME.npy`.
pub fn sidecar_path(npy: &Path) -> PathBuf {
    npy.with_extension("json")
}

/// Reads and parses the sidecar at `path`, bounded in size; `None` when there is none (no
/// regular file there). Opened without blocking (a FIFO swapped in answers at once) and
/// judged on the opened descriptor: a regular file, where `confine` allows.
fn read_sidecar(
    path: &Path,
    confine: Option<&Confine>,
) -> Option<(FileVersion, Result<Supplied, String>)> {
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return None,
        Err(err) => {
            let identity = FileVersion::of(&std::fs::metadata(path).ok()?);
            return Some((identity, Err(format!("cannot be read: {err}"))));
        }
    };
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let identity = FileVersion::of(&meta);
    let parsed = confine
        .map_or(Ok(()), |c| c.check(&file))
        .and_then(|()| parse_sidecar(file));
    Some((identity, parsed))
}

/// Parses an opened sidecar, bounded in size.
fn parse_sidecar(file: std::fs::File) -> Result<Supplied, String> {
    use std::io::Read;
    let mut text = Vec::new();
    file.take(MAX_SIDECAR_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| format!("cannot be read: {e}"))?;
    if text.len() as u64 > MAX_SIDECAR_BYTES {
        return Err(format!("is larger than {MAX_SIDECAR_BYTES} bytes"));
    }
    let supplied: Supplied =
        serde_json::from_slice(&text).map_err(|e| format!("is not a valid sidecar: {e}"))?;
    supplied.check_keys()?;
    Ok(supplied)
}

/// The identity of the sidecar of `npy` now (`None`: there is no regular file there).
pub fn sidecar_identity(npy: &Path) -> Option<FileVersion> {
    let meta = std::fs::metadata(sidecar_path(npy)).ok()?;
    meta.is_file().then(|| FileVersion::of(&meta))
}

/// The metadata of the `rank`-axis tensor at `npy`: `configured` overlaid with its sidecar,
/// which must lie where `confine` allows.
pub fn load(
    npy: &Path,
    rank: usize,
    configured: Option<&Supplied>,
    confine: Option<&Confine>,
) -> SourceMeta {
    let base = configured.cloned().unwrap_or_default();
    let path = sidecar_path(npy);
    let read = read_sidecar(&path, confine);
    let sidecar = read.as_ref().map(|(identity, _)| *identity);
    let mut error = None;
    let supplied = match read {
        None => base,
        Some((_, Ok(own))) => base.overlaid(&own),
        Some((_, Err(why))) => {
            let why = format!("sidecar {} {why}", path.display());
            tracing::warn!(npy = %npy.display(), reason = %why, "metadata sidecar refused");
            error = Some(why);
            base
        }
    };
    let (physical_scale, physical_unit) = match physical(&supplied, rank) {
        Ok(scale) => scale,
        Err(why) => {
            tracing::warn!(npy = %npy.display(), reason = %why, "physical scale refused");
            let why = format!("physical scale refused: {why}");
            error = Some(match error {
                Some(first) => format!("{first}; {why}"),
                None => why,
            });
            (Vec::new(), Vec::new())
        }
    };
    SourceMeta {
        physical_scale,
        physical_unit,
        metadata: supplied.metadata.unwrap_or_default(),
        error,
        sidecar,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn length_units_become_micrometres() {
        assert_eq!(canonical(0.5, "um"), (0.5, MICRON.to_string()));
        assert_eq!(canonical(2.0, "micron"), (2.0, MICRON.to_string()));
        assert_eq!(canonical(100.0, "nm"), (0.1, MICRON.to_string()));
        assert_eq!(canonical(1.0, "mm"), (1000.0, MICRON.to_string()));
        assert_eq!(canonical(3.0, "μm"), (3.0, MICRON.to_string()));
        assert_eq!(canonical(0.25, "s"), (0.25, "s".to_string()));
    }

    #[test]
    fn a_fifo_sidecar_is_passed_over_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("a.json");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Read on a thread: a blocking open of a FIFO with no writer never returns.
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(read_sidecar(&path, None).map(|(_, parsed)| parsed));
        });
        let read = rx.recv_timeout(std::time::Duration::from_secs(10));
        if read.is_err() {
            // Let the blocked open return, so the thread ends.
            let _ = std::fs::OpenOptions::new().write(true).open(&fifo);
        }
        assert!(
            matches!(read, Ok(None)),
            "a FIFO is no sidecar, and is not waited for: {read:?}"
        );
    }

    #[test]
    fn sidecars_overlay_the_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let npy = dir.path().join("a.npy");
        let configured = Supplied {
            physical_scale: Some(vec![1.0, 1.0]),
            physical_unit: Some(Units::One("um".into())),
            metadata: Some(serde_json::from_str(r#"{"lab": "x", "stain": "dapi"}"#).unwrap()),
        };
        let meta = load(&npy, 2, Some(&configured), None);
        assert_eq!(meta.physical_unit, [MICRON, MICRON]);
        assert!(meta.error.is_none());

        std::fs::write(
            dir.path().join("a.json"),
            r#"{"physical_scale": [0, 100], "physical_unit": ["", "nm"], "metadata": {"stain": "gfp"}}"#,
        )
        .unwrap();
        let meta = load(&npy, 2, Some(&configured), None);
        assert_eq!(meta.physical_scale, [0.0, 0.1]);
        assert_eq!(meta.physical_unit, ["", MICRON]);
        assert_eq!(meta.metadata["stain"], "gfp");
        assert_eq!(meta.metadata["lab"], "x");
        assert!(meta.sidecar.is_some());
    }

    #[test]
    fn malformed_sidecars_are_refused_by_name_and_keep_the_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let npy = dir.path().join("b.npy");
        let configured = Supplied {
            physical_scale: Some(vec![2.0]),
            ..Default::default()
        };
        for text in [
            "{not json",
            r#"{"physical_scale": [1], "colour": 3}"#,
            r#"{"metadata": {"dtype": "mine"}}"#,
        ] {
            std::fs::write(dir.path().join("b.json"), text).unwrap();
            let meta = load(&npy, 1, Some(&configured), None);
            let error = meta.error.unwrap();
            assert!(error.contains("b.json"), "{error}");
            assert_eq!(meta.physical_scale, [2.0], "{text}");
        }
    }

    #[test]
    fn a_scale_of_the_wrong_rank_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let supplied = Supplied {
            physical_scale: Some(vec![1.0, 2.0, 3.0]),
            ..Default::default()
        };
        let meta = load(&dir.path().join("c.npy"), 2, Some(&supplied), None);
        assert!(meta.physical_scale.is_empty());
        assert!(meta.error.unwrap().contains("3 values"));
    }
}
