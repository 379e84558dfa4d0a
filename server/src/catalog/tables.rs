//! The catalog tables as Arrow record batches, built from a snapshot of the registry.
//!
//! * `sources`: one row per source file, served or refused, in `source_id` order,
//!   with exactly the columns and types biopb clients read (protocol §2.3).
//! * `tensors`: one row per served tensor, with the serving details (chunk grid,
//!   byte size, path, content version) that `sources` leaves out.
//! * `rois`: one row per stored ROI annotation (loaded only for a query that names it).

use std::sync::{Arc, LazyLock};

use arrow_array::builder::{Int64Builder, ListBuilder, StringBuilder};
use arrow_array::{
    ArrayRef, BooleanArray, Int64Array, ListArray, RecordBatch, StringArray, StructArray,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{ArrowError, DataType, Field, Fields, Schema, SchemaRef};

use crate::rois::store::StoredRoi;
use crate::source::registry::{Refused, Registry, Tensor};

pub use crate::source::origin::file_url;

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

/// What the catalog tables are built from: the served tensors and refused files
/// of the registry at one moment.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    tensors: Vec<Arc<Tensor>>,
    refused: Vec<Refused>,
    rois: Arc<Vec<RoiRow>>,
}

/// One stored annotation: its tensor, its id and its record.
pub type RoiRow = (String, String, StoredRoi);

impl Snapshot {
    /// Copies what the catalog needs out of `registry` (cheap: `Arc` clones).
    pub fn of(registry: &Registry) -> Snapshot {
        Snapshot {
            tensors: registry.tensors().cloned().collect(),
            refused: registry.refused().cloned().collect(),
            rois: Arc::default(),
        }
    }

    /// The snapshot with the rows of the `rois` table.
    pub fn with_rois(mut self, rois: Vec<RoiRow>) -> Snapshot {
        self.rois = Arc::new(rois);
        self
    }

    /// The one source `id` of `registry` (nothing when there is none).
    pub fn of_source(registry: &Registry, id: &str) -> Snapshot {
        Snapshot {
            tensors: registry.get(id).cloned().into_iter().collect(),
            refused: registry.refused_source(id).cloned().into_iter().collect(),
            rois: Arc::default(),
        }
    }

    /// Rows of the largest catalog table (`sources` has one per source, resolved or not;
    /// `tensors` one per tensor): an upper bound for what one table scan produces.
    pub fn max_table_rows(&self) -> u64 {
        (self.tensors.len() + self.refused.len()).max(self.rois.len()) as u64
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

/// The `rois` table: every stored annotation, by tensor then id. `geometry` is
/// `biopb.image.ROI` as proto3 JSON, `plane` the pins as a JSON object (axis → index),
/// `drawn_against_version` lowercase hex.
pub fn rois_batch(snapshot: &Snapshot) -> Result<RecordBatch, ArrowError> {
    let rows = snapshot.rois.as_slice();
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

/// The `sources` table: served and refused files merged in `source_id` order.
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
    rows.sort_by(|a, b| a.source_id.cmp(b.source_id));

    let served: Vec<&Tensor> = rows.iter().filter_map(|r| r.tensor).collect();
    let elements = StructArray::try_new(
        tensor_struct_fields(),
        vec![
            strings(served.iter().map(|t| t.array_id.as_str())),
            string_lists(served.iter().map(|t| t.dim_labels.as_slice())),
            int_lists(served.iter().map(|t| dims(t.shape()))),
            strings_owned(served.iter().map(|t| t.dtype_str())),
        ],
        None,
    )?;
    let tensors = ListArray::try_new(
        Arc::new(Field::new_list_field(
            DataType::Struct(tensor_struct_fields()),
            true,
        )),
        OffsetBuffer::from_lengths(rows.iter().map(|r| usize::from(r.tensor.is_some()))),
        Arc::new(elements),
        None,
    )?;

    let columns: Vec<ArrayRef> = vec![
        strings(rows.iter().map(|r| r.source_id)),
        strings(rows.iter().map(|r| r.url.as_str())),
        strings(rows.iter().map(|_| SOURCE_TYPE)),
        Arc::new(BooleanArray::from_iter(
            rows.iter().map(|r| Some(r.tensor.is_some())),
        )),
        Arc::new(tensors),
        Arc::new(StringArray::from_iter(
            rows.iter().map(|r| r.tensor.map(|t| t.metadata_json())),
        )),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.reason))),
    ];
    RecordBatch::try_new(sources_schema(), columns)
}

/// The `tensors` table: one row per served tensor, in `array_id` order.
pub fn tensors_batch(snapshot: &Snapshot) -> Result<RecordBatch, ArrowError> {
    let tensors = &snapshot.tensors;
    let columns: Vec<ArrayRef> = vec![
        strings(tensors.iter().map(|t| t.array_id.as_str())),
        strings(tensors.iter().map(|t| t.source_id.as_str())),
        string_lists(tensors.iter().map(|t| t.dim_labels.as_slice())),
        int_lists(tensors.iter().map(|t| dims(t.shape()))),
        int_lists(tensors.iter().map(|t| dims(t.grid.chunk_shape()))),
        strings_owned(tensors.iter().map(|t| t.dtype_str())),
        Arc::new(Int64Array::from_iter_values(
            tensors.iter().map(|t| nbytes(t)),
        )),
        strings_owned(tensors.iter().map(|t| t.file.path().display().to_string())),
        strings_owned(tensors.iter().map(|t| content_version(t))),
    ];
    RecordBatch::try_new(tensors_schema(), columns)
}

fn strings<'a>(values: impl Iterator<Item = &'a str>) -> ArrayRef {
    Arc::new(StringArray::from_iter_values(values))
}

fn strings_owned(values: impl Iterator<Item = String>) -> ArrayRef {
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

/// The tensor's payload size in bytes (saturating, as [`dims`]).
fn nbytes(tensor: &Tensor) -> i64 {
    let elements = tensor.file.header().element_count();
    i64::try_from(elements.saturating_mul(tensor.itemsize())).unwrap_or(i64::MAX)
}

/// The content version as lowercase hex of the 32 bytes `TensorDescriptor.content_version`
/// carries: device, inode, size and mtime in nanoseconds, each big-endian.
fn content_version(tensor: &Tensor) -> String {
    let v = tensor.version;
    format!(
        "{:016x}{:016x}{:016x}{:016x}",
        v.dev, v.ino, v.size, v.mtime_ns as u64
    )
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
    fn refused_files_are_unresolved_rows_with_their_reason() {
        let snapshot = Snapshot {
            tensors: Vec::new(),
            rois: Arc::default(),
            refused: vec![Refused {
                source_id: "bad".to_string(),
                path: "/data/bad.npy".into(),
                reason: "dtype '>c32' is not supported".to_string(),
                after_change: false,
                origin: Default::default(),
            }],
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
