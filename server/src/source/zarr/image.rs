//! An OME-Zarr image (NGFF 0.4 or 0.5) as one [`Source`]: its first dataset is the tensor,
//! every dataset a native level of its pyramid; axes give the labels, the `scale`
//! transforms and axis units the physical scale, `omero` the channel names.
//!
//! The image is generic over where its datasets live ([`Dataset`]): a store on disk
//! ([`ZarrArray`]) or an object store (`objstore::zarr::ZarrObject`); what it makes of the
//! metadata is the same for both.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::array::ZarrArray;
use super::error::ZarrError;
use super::node::ImageMeta;
use super::version::Snapshot;
use crate::content_version::ContentVersion;
use crate::source::abstraction::{NativeLevel, Scaling, Source, SourceError};
use crate::source::meta::canonical;
use crate::source::npy::{Dtype, Limits};

/// A dataset of an OME-Zarr image, as the image reads it. The image's version, residence
/// and change check are its first dataset's, which knows the store they belong to.
pub trait Dataset: Send + Sync + std::fmt::Debug {
    /// The dataset's shape.
    fn shape(&self) -> &[u64];
    /// Its element type (native byte order).
    fn dtype(&self) -> &Dtype;
    /// The extent of its chunks (or shards).
    fn native_chunk(&self) -> &[u64];
    /// The keys of `metadata_json` it adds (Zarr format, chunks, attributes).
    fn metadata(&self) -> Map<String, Value>;
    /// Reads `start..stop` into `out` (C order).
    fn read(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), SourceError>;
    /// Starts reading the files a read of `start..stop` touches ([`Source::prefetch`]).
    fn prefetch(&self, _start: &[u64], _stop: &[u64]) {}
    /// The content version of the whole image the dataset belongs to.
    fn image_version(&self) -> ContentVersion;
    /// Whether the image's bytes are on this machine.
    fn is_resident(&self) -> bool;
    /// Refuses when the image is no longer the version opened.
    fn check_image(&self) -> Result<(), SourceError>;
}

/// An opened OME-Zarr image, its datasets of type `D`.
#[derive(Debug)]
pub struct OmeImage<D = ZarrArray> {
    root: PathBuf,
    level0: D,
    labels: Option<Vec<String>>,
    levels: Vec<NativeLevel>,
    physical: Option<(Vec<f64>, Vec<String>)>,
    meta: ImageMeta,
}

impl OmeImage<ZarrArray> {
    /// Opens the image group at `root` (a directory) whose metadata is `meta`.
    pub fn open(root: &Path, meta: ImageMeta, limits: &Limits) -> Result<Self, ZarrError> {
        let snapshot = Arc::new(Snapshot::take(root)?);
        OmeImage::build(root, meta, |path| {
            ZarrArray::open(
                &root.join(path),
                snapshot.clone(),
                format!("{path}/"),
                limits,
            )
        })
    }
}

/// The dataset paths an image's `multiscales` lists, refused when there are none, one has
/// no path, or one leaves the image; `root` names the image in the refusal.
pub fn dataset_paths(root: &Path, multiscales: &Value) -> Result<Vec<String>, ZarrError> {
    let refuse = |why: String| ZarrError::Ome {
        path: root.to_path_buf(),
        why,
    };
    let paths: Vec<String> = multiscales
        .get("datasets")
        .and_then(Value::as_array)
        .filter(|d| !d.is_empty())
        .ok_or_else(|| refuse("it lists no datasets".to_string()))?
        .iter()
        .map(|d| d.get("path").and_then(Value::as_str).map(str::to_string))
        .collect::<Option<_>>()
        .ok_or_else(|| refuse("a dataset has no path".to_string()))?;
    if paths.iter().any(|p| p.contains("..") || p.starts_with('/')) {
        return Err(refuse(format!(
            "a dataset path leaves the image: {paths:?}"
        )));
    }
    Ok(paths)
}

impl<D: Dataset> OmeImage<D> {
    /// The image at `root` whose metadata is `meta`, each dataset opened by `open` (given
    /// its path within the image); refused by name when the datasets do not make one
    /// pyramid (another rank or dtype than the first).
    pub fn build<E: From<ZarrError>>(
        root: &Path,
        meta: ImageMeta,
        mut open: impl FnMut(&str) -> Result<D, E>,
    ) -> Result<Self, E> {
        let refuse = |why: String| ZarrError::Ome {
            path: root.to_path_buf(),
            why,
        };
        let paths = dataset_paths(root, &meta.multiscales)?;
        let level0 = open(&paths[0])?;
        let base = level0.shape().to_vec();
        let mut levels = Vec::with_capacity(paths.len());
        for path in &paths {
            let level = if *path == paths[0] {
                None
            } else {
                Some(open(path)?)
            };
            let shape = level.as_ref().map_or(base.clone(), |l| l.shape().to_vec());
            if shape.len() != base.len() {
                return Err(refuse(format!(
                    "dataset '{path}' has {} axes where '{}' has {}",
                    shape.len(),
                    paths[0],
                    base.len()
                ))
                .into());
            }
            if level.as_ref().is_some_and(|l| l.dtype() != level0.dtype()) {
                return Err(refuse(format!(
                    "dataset '{path}' has another dtype than '{}'",
                    paths[0]
                ))
                .into());
            }
            levels.push(NativeLevel {
                path: path.clone(),
                factors: factors(&base, &shape),
                shape,
            });
        }
        let labels = axis_names(&meta.multiscales).filter(|n| n.len() == base.len());
        let datasets = meta
            .multiscales
            .get("datasets")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let physical = physical_scale(&meta.multiscales, datasets, base.len());
        Ok(OmeImage {
            root: root.to_path_buf(),
            level0,
            labels,
            levels,
            physical,
            meta,
        })
    }
}

/// Per-axis integer factors of a level against the base: the rounded ratio of the shapes
/// (at least 1), which stays right when NGFF `scale` values are physical sizes.
fn factors(base: &[u64], level: &[u64]) -> Vec<u64> {
    base.iter()
        .zip(level)
        .map(|(&b, &l)| {
            if l == 0 {
                1
            } else {
                ((b as f64 / l as f64).round() as u64).max(1)
            }
        })
        .collect()
}

/// The axis names (NGFF 0.4+: objects with `name`; 0.3: plain strings).
pub(super) fn axis_names(multiscales: &Value) -> Option<Vec<String>> {
    multiscales
        .get("axes")?
        .as_array()?
        .iter()
        .map(|a| match a {
            Value::String(s) => Some(s.clone()),
            other => other.get("name")?.as_str().map(str::to_string),
        })
        .collect()
}

/// The first dataset's `scale` (times a `scale` of the whole multiscales, when given), with
/// each axis's unit, length units in micrometres.
fn physical_scale(
    multiscales: &Value,
    datasets: &[Value],
    rank: usize,
) -> Option<(Vec<f64>, Vec<String>)> {
    let scale_of = |transforms: Option<&Value>| -> Option<Vec<f64>> {
        transforms?
            .as_array()?
            .iter()
            .find(|t| t.get("type").and_then(Value::as_str) == Some("scale"))?
            .get("scale")?
            .as_array()?
            .iter()
            .map(Value::as_f64)
            .collect()
    };
    let mut scale = scale_of(datasets.first()?.get("coordinateTransformations"))?;
    if scale.len() != rank {
        return None;
    }
    if let Some(global) = scale_of(multiscales.get("coordinateTransformations"))
        && global.len() == rank
    {
        for (s, g) in scale.iter_mut().zip(global) {
            *s *= g;
        }
    }
    let units: Vec<String> = match multiscales.get("axes").and_then(Value::as_array) {
        Some(axes) if axes.len() == rank => axes
            .iter()
            .map(|a| {
                a.get("unit")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            })
            .collect(),
        _ => vec![String::new(); rank],
    };
    Some(
        scale
            .iter()
            .zip(&units)
            .map(|(&size, unit)| canonical(size, unit))
            .unzip(),
    )
}

impl<D: Dataset> Source for OmeImage<D> {
    fn format(&self) -> &'static str {
        "ome-zarr"
    }

    fn path(&self) -> &Path {
        &self.root
    }

    fn shape(&self) -> &[u64] {
        self.level0.shape()
    }

    fn dtype(&self) -> &Dtype {
        self.level0.dtype()
    }

    fn native_chunk(&self) -> Option<Vec<u64>> {
        Some(self.level0.native_chunk().to_vec())
    }

    fn version(&self) -> ContentVersion {
        self.level0.image_version()
    }

    fn dim_labels(&self) -> Option<Vec<String>> {
        self.labels.clone()
    }

    fn physical_scale(&self) -> Option<(Vec<f64>, Vec<String>)> {
        self.physical.clone()
    }

    fn format_metadata(&self) -> Map<String, Value> {
        let mut map = self.level0.metadata();
        map.insert("ngff_version".into(), json!(self.meta.version));
        map.insert("multiscales".into(), self.meta.multiscales.clone());
        if let Some(omero) = &self.meta.omero {
            let names: Vec<Value> = omero
                .get("channels")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|c| c.get("label").cloned().unwrap_or(Value::Null))
                .collect();
            if !names.is_empty() {
                map.insert("channel_names".into(), Value::Array(names));
            }
            map.insert("omero".into(), omero.clone());
        }
        map
    }

    fn scaling(&self) -> Scaling {
        if self.levels.len() < 2 {
            return Scaling::Computed;
        }
        Scaling::Native {
            levels: self.levels.clone(),
        }
    }

    fn is_resident(&self) -> bool {
        self.level0.is_resident()
    }

    fn read_region(&self, start: &[u64], stop: &[u64], out: &mut [u8]) -> Result<(), SourceError> {
        self.level0.read(start, stop, out)
    }

    fn prefetch(&self, start: &[u64], stop: &[u64]) {
        self.level0.prefetch(start, stop);
    }

    fn check_unchanged(&self) -> Result<(), SourceError> {
        self.level0.check_image()
    }
}
