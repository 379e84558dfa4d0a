//! The `[[source]]` tables of the config file: paths with an id, axis labels, a physical
//! scale and metadata, checked when the file is read.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use crate::source::meta::{Supplied, Units};
use crate::source::registry::{SourceOptions, sanitize};

/// One `[[source]]` table of the config file.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SourceFile {
    /// A `.npy` file or a directory scanned recursively.
    pub path: PathBuf,
    /// Id of the file, or id prefix of the directory's files.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Axis labels replacing the defaults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dim_labels: Option<Vec<String>>,
    /// Size of one element along each axis.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub physical_scale: Option<Vec<f64>>,
    /// Unit of the sizes: one for every axis, or one per axis.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub physical_unit: Option<Units>,
    /// Free-form metadata reported in `metadata_json`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<toml::Table>,
    /// A JSON file holding an object of free-form metadata (instead of `metadata`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata_file: Option<PathBuf>,
}

/// The file's `sources = [...]` list then its `[[source]]` tables, with their
/// options checked: ids of `[A-Za-z0-9._-]`, non-empty distinct labels.
pub fn file_sources(
    plain: Vec<PathBuf>,
    tables: Vec<SourceFile>,
) -> Result<(Vec<PathBuf>, BTreeMap<PathBuf, SourceOptions>), ConfigError> {
    let mut paths = plain;
    let mut options = BTreeMap::new();
    for table in tables {
        let shown = table.path.display();
        if let Some(id) = &table.id
            && (id.is_empty() || sanitize(id) != *id)
        {
            return Err(ConfigError::Invalid(format!(
                "[[source]] {shown}: id '{id}' must be non-empty and use only A-Z a-z 0-9 . _ -"
            )));
        }
        if let Some(labels) = &table.dim_labels {
            let distinct: std::collections::BTreeSet<&String> = labels.iter().collect();
            if labels.iter().any(String::is_empty) || distinct.len() != labels.len() {
                return Err(ConfigError::Invalid(format!(
                    "[[source]] {shown}: dim_labels {labels:?} must be non-empty and distinct"
                )));
            }
        }
        if paths.contains(&table.path) {
            return Err(ConfigError::Invalid(format!(
                "source {shown} is listed twice"
            )));
        }
        let supplied = supplied_of(&table)?;
        paths.push(table.path.clone());
        options.insert(
            table.path,
            SourceOptions {
                id: table.id,
                dim_labels: table.dim_labels,
                supplied: (!supplied.is_empty()).then(|| std::sync::Arc::new(supplied)),
            },
        );
    }
    Ok((paths, options))
}

/// The physical scale and metadata a `[[source]]` table supplies, checked: metadata from
/// `metadata` or `metadata_file` (not both), an object whose keys Tessera does not write.
fn supplied_of(table: &SourceFile) -> Result<Supplied, ConfigError> {
    let shown = table.path.display();
    let metadata = match (&table.metadata, &table.metadata_file) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::Invalid(format!(
                "[[source]] {shown}: give metadata or metadata_file, not both"
            )));
        }
        (Some(inline), None) => {
            let value = serde_json::to_value(inline)
                .map_err(|e| ConfigError::Invalid(format!("[[source]] {shown}: metadata: {e}")))?;
            value.as_object().cloned()
        }
        (None, Some(file)) => {
            let text = std::fs::read(file).map_err(|source| ConfigError::Read {
                path: file.clone(),
                source,
            })?;
            let value: serde_json::Value =
                serde_json::from_slice(&text).map_err(|e| ConfigError::Parse {
                    path: file.clone(),
                    message: format!("metadata_file of [[source]] {shown}: {e}"),
                })?;
            match value {
                serde_json::Value::Object(map) => Some(map),
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "[[source]] {shown}: metadata_file {} must hold a JSON object",
                        file.display()
                    )));
                }
            }
        }
        (None, None) => None,
    };
    let supplied = Supplied {
        physical_scale: table.physical_scale.clone(),
        physical_unit: table.physical_unit.clone(),
        metadata,
    };
    supplied
        .check_keys()
        .map_err(|why| ConfigError::Invalid(format!("[[source]] {shown}: {why}")))?;
    if let Some(bad) = supplied
        .physical_scale
        .iter()
        .flatten()
        .find(|v| !v.is_finite() || **v < 0.0)
    {
        return Err(ConfigError::Invalid(format!(
            "[[source]] {shown}: physical_scale value {bad} is not a finite size of 0 or more"
        )));
    }
    if supplied.physical_unit.is_some() && supplied.physical_scale.is_none() {
        return Err(ConfigError::Invalid(format!(
            "[[source]] {shown}: physical_unit needs physical_scale"
        )));
    }
    Ok(supplied)
}
