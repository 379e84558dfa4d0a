//! The catalog tables as Arrow record batches, built from a snapshot of the registry.
//!
//! * `sources`: one row per source file, served or refused, in `source_id` order,
//!   with exactly the columns and types biopb clients read (protocol §2.3).
//! * `tensors`: one row per served tensor, with the serving details (chunk grid,
//!   byte size, path, content version) that `sources` leaves out.
//! * `rois`: one row per stored ROI annotation, streamed from the annotation store page by
//!   page while a query scans it (`catalog/rois.rs`).
//!
//! READY uploads (`<source_id>/@fields/<name>`) are tensors of their source: rows of
//! `tensors`, and entries of their source's `sources.tensors` (the `scratch` source gets a
//! row of its own while it holds any).

use std::sync::{Arc, LazyLock};

use arrow_array::builder::{Int64Builder, ListBuilder, StringBuilder};
use arrow_array::{
    ArrayRef, BooleanArray, Int64Array, ListArray, RecordBatch, StringArray, StructArray,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{ArrowError, DataType, Field, Fields, Schema, SchemaRef};

use crate::rois::Annotations;
use crate::rois::db::StoredRoi;
use crate::source::registry::{Refused, Registry, Tensor};
use crate::uploads::SCRATCH_SOURCE_ID;

/// Name of the table of sources.
pub const SOURCES: &str = "sources";
/// Name of the table of tensors.
pub const TENSORS: &str = "tensors";
/// Name of the table of ROI annotations.
pub const ROIS: &str = "rois";
/// Every catalog table, in the order ListFlights reports them.
pub const TABLES: [&str; 2] = [SOURCES, TENSORS];

/// The columns of a source's row every biopb reader decodes (the client's
/// `SOURCE_ROW_COLUMNS`): what `resolve` answers.
pub const SOURCE_ROW_COLUMNS: [&str; 5] = [
    "source_id",
    "source_url",
    "source_type",
    "is_resolved",
    "tensors",
];

/// The only source type Tessera serves.
const SOURCE_TYPE: &str = "npy";

/// A READY upload as the catalog lists it.
#[derive(Clone, Debug)]
pub struct UploadRow {
    /// `<source_id>/@fields/<name>`.
    pub array_id: String,
    /// The source it was added to.
    pub source_id: String,
    /// Axis labels.
    pub dim_labels: Vec<String>,
    /// Shape.
    pub shape: Vec<u64>,
    /// Its grid's chunk shape.
    pub chunk_shape: Vec<u64>,
    /// numpy dtype string.
    pub dtype: String,
    /// Payload bytes.
    pub nbytes: u64,
    /// Where its bytes are kept.
    pub path: String,
    /// Content version, as the hex of `tensors.content_version`.
    pub content_version: String,
}

/// What the catalog tables are built from: the served tensors and refused files
/// of the registry at one moment, and the READY uploads.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    tensors: Vec<Arc<Tensor>>,
    refused: Vec<Refused>,
    rois: Option<Arc<Annotations>>,
    /// Annotations stored when the snapshot was taken.
    rois_rows: u64,
    uploads: Vec<UploadRow>,
    /// The server takes uploads (`--writable`), so the `scratch` source is listed even
    /// while empty, as biopb's is.
    scratch: bool,
}

/// One stored annotation: its tensor, its id and its record.
pub type RoiRow = (String, String, StoredRoi);

impl Snapshot {
    /// Adds the READY uploads.
    pub fn with_uploads(mut self, uploads: Vec<UploadRow>) -> Snapshot {
        self.uploads = uploads;
        self
    }

    /// Lists the `scratch` source even with no upload on it (a writable server).
    pub fn with_scratch(mut self, served: bool) -> Snapshot {
        self.scratch = served;
        self
    }

    /// Every tensor row: the sources' tensors and the uploads, in `array_id` order.
    fn tensor_rows(&self) -> Vec<UploadRow> {
        let mut rows: Vec<UploadRow> = self
            .tensors
            .iter()
            .map(|t| UploadRow {
                array_id: t.array_id.clone(),
                source_id: t.source_id.clone(),
                dim_labels: t.dim_labels.clone(),
                shape: t.shape().to_vec(),
                chunk_shape: t.grid.chunk_shape().to_vec(),
                dtype: t.dtype_str(),
                nbytes: t
                    .shape()
                    .iter()
                    .product::<u64>()
                    .saturating_mul(t.itemsize()),
                path: t.source.path().display().to_string(),
                content_version: content_version(t),
            })
            .chain(self.uploads.iter().cloned())
            .collect();
        rows.sort_by(|a, b| a.array_id.cmp(&b.array_id));
        rows
    }

    /// Copies what the catalog needs out of `registry` (cheap: `Arc` clones).
    pub fn of(registry: &Registry) -> Snapshot {
        Snapshot {
            tensors: registry.tensors().cloned().collect(),
            refused: registry.refused().cloned().collect(),
            rois: None,
            rois_rows: 0,
            uploads: Vec::new(),
            scratch: false,
        }
    }

    /// The snapshot whose `rois` table reads `annotations`, which hold `rows` annotations
    /// now (nothing is read until a query scans the table).
    pub fn with_rois(mut self, annotations: Arc<Annotations>, rows: u64) -> Snapshot {
        self.rois = Some(annotations);
        self.rois_rows = rows;
        self
    }

    /// The annotations the `rois` table reads (`None`: an empty table).
    pub fn rois(&self) -> Option<&Arc<Annotations>> {
        self.rois.as_ref()
    }

    /// The one source `id` of `registry` (nothing when there is none).
    pub fn of_source(registry: &Registry, id: &str) -> Snapshot {
        Snapshot {
            tensors: registry.get(id).cloned().into_iter().collect(),
            refused: registry.refused_source(id).cloned().into_iter().collect(),
            rois: None,
            rois_rows: 0,
            uploads: Vec::new(),
            scratch: false,
        }
    }

    /// Rows of the largest catalog table (`sources` has one per source, resolved or not;
    /// `tensors` one per tensor): an upper bound for what one table scan produces.
    pub fn max_table_rows(&self) -> u64 {
        ((self.tensors.len() + self.refused.len() + 2 * self.uploads.len()) as u64)
            .max(self.rois_rows)
    }

    /// Longest list a catalog table holds: a tensor's `shape`, `dim_labels` or chunk shape,
    /// or the tensors of one source in `sources.tensors`. An upper bound for what `unnest`
    /// of a table column spreads one row into.
    pub fn max_list_len(&self) -> u64 {
        let mut per_source = std::collections::HashMap::<&str, u64>::new();
        let mut longest = 1u64;
        for t in &self.tensors {
            let count = per_source.entry(t.source_id.as_str()).or_default();
            *count += 1;
            longest = longest
                .max(*count)
                .max(t.shape().len() as u64)
                .max(t.dim_labels.len() as u64);
        }
        for u in &self.uploads {
            let count = per_source.entry(u.source_id.as_str()).or_default();
            *count += 1;
            longest = longest
                .max(*count)
                .max(u.shape.len() as u64)
                .max(u.dim_labels.len() as u64);
        }
        longest
    }
}

fn list_of(item: DataType) -> DataType {
    DataType::List(Arc::new(Field::new_list_field(item, true)))
}

/// The fields of one element of `sources.tensors`.
fn tensor_struct_fields() -> Fields {
    Fields::from(vec![
        Field::new("array_id", DataType::Utf8, false),
        Field::new("dim_labels", list_of(DataType::Utf8), false),
        Field::new("shape", list_of(DataType::Int64), false),
        Field::new("dtype", DataType::Utf8, false),
    ])
}

static SOURCES_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("source_id", DataType::Utf8, false),
        Field::new("source_url", DataType::Utf8, false),
        Field::new("source_type", DataType::Utf8, false),
        Field::new("is_resolved", DataType::Boolean, false),
        Field::new(
            "tensors",
            list_of(DataType::Struct(tensor_struct_fields())),
            false,
        ),
        Field::new("metadata_json", DataType::Utf8, true),
        Field::new("unresolved_reason", DataType::Utf8, true),
    ]))
});

static TENSORS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("array_id", DataType::Utf8, false),
        Field::new("source_id", DataType::Utf8, false),
        Field::new("dim_labels", list_of(DataType::Utf8), false),
        Field::new("shape", list_of(DataType::Int64), false),
        Field::new("chunk_shape", list_of(DataType::Int64), false),
        Field::new("dtype", DataType::Utf8, false),
        Field::new("nbytes", DataType::Int64, false),
        Field::new("path", DataType::Utf8, false),
        Field::new("content_version", DataType::Utf8, false),
    ]))
});

/// The Arrow schema of the `sources` table.
pub fn sources_schema() -> SchemaRef {
    SOURCES_SCHEMA.clone()
}

/// The Arrow schema of the `rois` table.
pub fn rois_schema() -> SchemaRef {
    ROIS_SCHEMA.clone()
}

/// The Arrow schema of the `tensors` table.
pub fn tensors_schema() -> SchemaRef {
    TENSORS_SCHEMA.clone()
}

/// The schema of the catalog table called `name`, if there is one.
pub fn table_schema(name: &str) -> Option<SchemaRef> {
    match name {
        SOURCES => Some(sources_schema()),
        TENSORS => Some(tensors_schema()),
        _ => None,
    }
}

/// One `sources` row before it becomes columns.
struct SourceRow<'a> {
    source_id: &'a str,
    url: String,
    tensor: Option<&'a Tensor>,
    reason: Option<&'a str>,
}

/// Rows of the `rois` table (annotations by tensor then id). `geometry` is
/// `biopb.image.ROI` as proto3 JSON, `plane` the pins as a JSON object (axis → index),
/// `drawn_against_version` lowercase hex.
pub fn rois_batch(rows: &[RoiRow]) -> Result<RecordBatch, ArrowError> {
    let text = |f: &dyn Fn(&RoiRow) -> String| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(rows.iter().map(f)))
    };
    let int = |f: &dyn Fn(&StoredRoi) -> i64| -> ArrayRef {
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| f(&r.2))))
    };
    let version: StringArray = rows
        .iter()
        .map(|r| {
            r.2.drawn_against_version
                .as_ref()
                .map(|v| v.iter().map(|b| format!("{b:02x}")).collect::<String>())
        })
        .collect();
    RecordBatch::try_new(
        ROIS_SCHEMA.clone(),
        vec![
            text(&|r| r.1.clone()),
            text(&|r| r.0.clone()),
            text(&|r| r.2.set_name.clone()),
            text(&|r| r.2.label.clone()),
            text(&|r| r.2.shape.clone()),
            text(&|r| r.2.geometry.clone()),
            text(&|r| {
                serde_json::Value::Object(
                    r.2.plane
                        .iter()
                        .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
                        .collect(),
                )
                .to_string()
            }),
            text(&|r| r.2.props_json.clone()),
            Arc::new(version),
            int(&|r| r.rev),
            int(&|r| r.created_ms),
            int(&|r| r.updated_ms),
        ],
    )
}

static ROIS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    let text = |name| Field::new(name, DataType::Utf8, false);
    let int = |name| Field::new(name, DataType::Int64, false);
    Arc::new(Schema::new(vec![
        text("roi_id"),
        text("array_id"),
        text("set_name"),
        text("label"),
        text("shape"),
        text("geometry"),
        text("plane"),
        text("props_json"),
        Field::new("drawn_against_version", DataType::Utf8, true),
        int("rev"),
        int("created_at_unix_ms"),
        int("updated_at_unix_ms"),
    ]))
});

/// The `sources` table: served and refused files (and `scratch` while it holds uploads)
/// merged in `source_id` order.
pub fn sources_batch(snapshot: &Snapshot) -> Result<RecordBatch, ArrowError> {
    let mut rows: Vec<SourceRow<'_>> = snapshot
        .tensors
        .iter()
        .map(|t| SourceRow {
            source_id: &t.source_id,
            url: t.source_url(),
            tensor: Some(t),
            reason: None,
        })
        .chain(snapshot.refused.iter().map(|r| SourceRow {
            source_id: &r.source_id,
            url: r.source_url(),
            tensor: None,
            reason: Some(&r.reason),
        }))
        .collect();
    let scratch_served = rows.iter().any(|r| r.source_id == SCRATCH_SOURCE_ID);
    if !scratch_served
        && (snapshot.scratch
            || snapshot
                .uploads
                .iter()
                .any(|u| u.source_id == SCRATCH_SOURCE_ID))
    {
        rows.push(SourceRow {
            source_id: SCRATCH_SOURCE_ID,
            url: format!("{SCRATCH_SOURCE_ID}://"),
            tensor: None,
            reason: None,
        });
    }
    rows.sort_by(|a, b| a.source_id.cmp(b.source_id));

    // Each row's tensors: its own (a served file), then the uploads added to it.
    let per_row: Vec<Vec<UploadRow>> = rows
        .iter()
        .map(|r| {
            let own = r.tensor.map(|t| UploadRow {
                array_id: t.array_id.clone(),
                source_id: t.source_id.clone(),
                dim_labels: t.dim_labels.clone(),
                shape: t.shape().to_vec(),
                chunk_shape: Vec::new(),
                dtype: t.dtype_str(),
                nbytes: 0,
                path: String::new(),
                content_version: String::new(),
            });
            let served = r.tensor.is_some() || r.source_id == SCRATCH_SOURCE_ID;
            own.into_iter()
                .chain(
                    snapshot
                        .uploads
                        .iter()
                        .filter(|u| served && u.source_id == r.source_id)
                        .cloned(),
                )
                .collect()
        })
        .collect();
    let listed: Vec<&UploadRow> = per_row.iter().flatten().collect();
    let elements = StructArray::try_new(
        tensor_struct_fields(),
        vec![
            strings(listed.iter().map(|t| t.array_id.as_str())),
            string_lists(listed.iter().map(|t| t.dim_labels.as_slice())),
            int_lists(listed.iter().map(|t| dims(&t.shape))),
            strings(listed.iter().map(|t| t.dtype.as_str())),
        ],
        None,
    )?;
    let tensors = ListArray::try_new(
        Arc::new(Field::new_list_field(
            DataType::Struct(tensor_struct_fields()),
            true,
        )),
        OffsetBuffer::from_lengths(per_row.iter().map(Vec::len)),
        Arc::new(elements),
        None,
    )?;

    let columns: Vec<ArrayRef> = vec![
        strings(rows.iter().map(|r| r.source_id)),
        strings(rows.iter().map(|r| r.url.as_str())),
        strings(rows.iter().map(|r| {
            if r.tensor.is_none() && r.reason.is_none() {
                SCRATCH_SOURCE_ID
            } else {
                SOURCE_TYPE
            }
        })),
        Arc::new(BooleanArray::from_iter(
            rows.iter().map(|r| Some(r.reason.is_none())),
        )),
        Arc::new(tensors),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|r| r.tensor.map(|t| t.metadata_json())),
        )),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.reason))),
    ];
    RecordBatch::try_new(sources_schema(), columns)
}

/// The `tensors` table: one row per served tensor and READY upload, in `array_id` order.
pub fn tensors_batch(snapshot: &Snapshot) -> Result<RecordBatch, ArrowError> {
    let tensors = snapshot.tensor_rows();
    let columns: Vec<ArrayRef> = vec![
        strings(tensors.iter().map(|t| t.array_id.as_str())),
        strings(tensors.iter().map(|t| t.source_id.as_str())),
        string_lists(tensors.iter().map(|t| t.dim_labels.as_slice())),
        int_lists(tensors.iter().map(|t| dims(&t.shape))),
        int_lists(tensors.iter().map(|t| dims(&t.chunk_shape))),
        strings(tensors.iter().map(|t| t.dtype.as_str())),
        Arc::new(Int64Array::from_iter_values(
            tensors
                .iter()
                .map(|t| i64::try_from(t.nbytes).unwrap_or(i64::MAX)),
        )),
        strings(tensors.iter().map(|t| t.path.as_str())),
        strings(tensors.iter().map(|t| t.content_version.as_str())),
    ];
    RecordBatch::try_new(tensors_schema(), columns)
}

fn strings<'a>(values: impl Iterator<Item = &'a str>) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(values))
}

fn string_lists<'a>(lists: impl Iterator<Item = &'a [String]>) -> ArrayRef {
    let mut builder = ListBuilder::new(StringBuilder::new());
    for list in lists {
        for value in list {
            builder.values().append_value(value);
        }
        builder.append(true);
    }
    Arc::new(builder.finish())
}

fn int_lists(lists: impl Iterator<Item = Vec<i64>>) -> ArrayRef {
    let mut builder = ListBuilder::new(Int64Builder::new());
    for list in lists {
        builder.values().append_slice(&list);
        builder.append(true);
    }
    Arc::new(builder.finish())
}

/// Dimensions as SQL BIGINTs. The reader's limits keep them far below `i64::MAX`;
/// a larger one would saturate rather than wrap.
fn dims(values: &[u64]) -> Vec<i64> {
    values
        .iter()
        .map(|&v| i64::try_from(v).unwrap_or(i64::MAX))
        .collect()
}

/// The content version as lowercase hex of the 32 bytes `TensorDescriptor.content_version`
/// carries: device, inode, size and mtime in nanoseconds, each big-endian.
fn content_version(tensor: &Tensor) -> String {
    version_hex(tensor.version)
}

/// A content version as the lowercase hex of `tensors.content_version`.
pub fn version_hex(v: crate::grid::chunk_id::ContentVersion) -> String {
    use std::fmt::Write;
    v.descriptor_bytes()
        .iter()
        .fold(String::with_capacity(64), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn empty_snapshot_gives_empty_tables_with_the_declared_schemas() {
        let snapshot = Snapshot::default();
        let sources = sources_batch(&snapshot).unwrap();
        assert_eq!(sources.num_rows(), 0);
        assert_eq!(sources.schema(), sources_schema());
        let tensors = tensors_batch(&snapshot).unwrap();
        assert_eq!(tensors.num_rows(), 0);
        assert_eq!(tensors.schema(), tensors_schema());
    }

    #[test]
    fn uploads_are_tensors_of_their_source_and_scratch_gets_a_row() {
        let upload = UploadRow {
            array_id: "scratch/@fields/a".to_string(),
            source_id: "scratch".to_string(),
            dim_labels: vec!["x".to_string()],
            shape: vec![10],
            chunk_shape: vec![5],
            dtype: "<u2".to_string(),
            nbytes: 20,
            path: "/state/uploads/data/1".to_string(),
            content_version: "00".to_string(),
        };
        let orphan = UploadRow {
            array_id: "gone/@fields/b".to_string(),
            source_id: "gone".to_string(),
            ..upload.clone()
        };
        let snapshot = Snapshot::default().with_uploads(vec![upload, orphan]);
        let sources = sources_batch(&snapshot).unwrap();
        assert_eq!(sources.num_rows(), 1);
        let tensors = sources
            .column(4)
            .as_any()
            .downcast_ref::<ListArray>()
            .unwrap();
        assert_eq!(tensors.value_length(0), 1);
        assert_eq!(tensors_batch(&snapshot).unwrap().num_rows(), 2);
    }

    #[test]
    fn refused_files_are_unresolved_rows_with_their_reason() {
        let snapshot = Snapshot {
            tensors: Vec::new(),
            rois: None,
            rois_rows: 0,
            refused: vec![Refused {
                source_id: "bad".to_string(),
                path: "/data/bad.npy".into(),
                reason: "dtype '>c32' is not supported".to_string(),
                after_change: false,
                origin: Default::default(),
            }],
            uploads: Vec::new(),
            scratch: false,
        };
        let batch = sources_batch(&snapshot).unwrap();
        assert_eq!(batch.num_rows(), 1);
        let column = |name: &str| batch.column_by_name(name).unwrap().clone();
        let resolved = column("is_resolved");
        let resolved = resolved.as_any().downcast_ref::<BooleanArray>().unwrap();
        assert!(!resolved.value(0));
        let reason = column("unresolved_reason");
        let reason = reason.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(reason.value(0), "dtype '>c32' is not supported");
        let tensors = column("tensors");
        let tensors = tensors.as_any().downcast_ref::<ListArray>().unwrap();
        assert_eq!(tensors.value_length(0), 0);
        assert!(column("metadata_json").is_null(0));
        let url = column("source_url");
        let url = url.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(url.value(0), "file:///data/bad.npy");
    }
}
