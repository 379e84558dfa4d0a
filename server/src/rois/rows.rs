//! The ROI row schema: how annotations travel in Arrow, both ways. A DoGet `roi_read`
//! streams these rows (with `truncated` and `sets` in the schema metadata); a `roi_put`
//! DoPut sends them; a `roi_delete` DoPut sends one `roi_id` column.

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow_array::builder::{
    BinaryBuilder, Int64Builder, MapBuilder, MapFieldNames, StringBuilder, UInt32Builder,
};
use arrow_array::{
    Array, ArrayRef, BinaryArray, Int64Array, LargeStringArray, MapArray, RecordBatch, StringArray,
    StringViewArray, UInt32Array,
};
use arrow_schema::{ArrowError, DataType, Field, Schema, SchemaRef};

use super::db::{SetCount, StoredRoi};

/// The columns of the row schema, in order.
pub const COLUMNS: [&str; 11] = [
    "roi_id",
    "array_id",
    "set_name",
    "label",
    "geometry",
    "plane",
    "props_json",
    "drawn_against_version",
    "rev",
    "created_at_unix_ms",
    "updated_at_unix_ms",
];

/// Why a stream of rows could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RowsError {
    /// A `roi_put` batch without one of the ROI row columns.
    #[error(
        "ROI rows are missing column '{name}': a roi_put stream carries the ROI row schema ({})",
        COLUMNS.join(", ")
    )]
    MissingColumn {
        /// The column.
        name: String,
    },
    /// A column of another type than the schema's.
    #[error("ROI row column '{name}' is {found}, not {expected}")]
    ColumnType {
        /// The column.
        name: String,
        /// Its type as sent.
        found: DataType,
        /// The schema's type, in words.
        expected: &'static str,
    },
    /// A `plane` map whose entries are not uint32 to uint32.
    #[error("ROI row column 'plane' must map uint32 axes to uint32 indices")]
    PlaneEntries,
    /// A `plane` pin without its index.
    #[error("ROI row {row}: plane pin of axis {axis} has no index")]
    PinWithoutIndex {
        /// The row.
        row: usize,
        /// The pinned axis.
        axis: u32,
    },
    /// A `roi_delete` batch without its `roi_id` column.
    #[error("a roi_delete stream carries one 'roi_id' column")]
    NoIdColumn,
    /// A `roi_delete` `roi_id` column that is not text.
    #[error("roi_delete column 'roi_id' is {found}, not a string")]
    IdType {
        /// Its type as sent.
        found: DataType,
    },
}

impl RowsError {
    /// Column `name` is of type `found`, where the schema has `expected`.
    fn column_type(name: &str, found: &DataType, expected: &'static str) -> RowsError {
        RowsError::ColumnType {
            name: name.to_string(),
            found: found.clone(),
            expected,
        }
    }
}

/// One annotation as a client sent it (server-assigned columns ignored).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IncomingRoi {
    /// Empty on create.
    pub roi_id: String,
    /// Empty, or the batch's tensor.
    pub array_id: String,
    /// Empty means `default`.
    pub set_name: String,
    /// The user's name for it.
    pub label: String,
    /// `biopb.image.ROI` as proto3 JSON.
    pub geometry: String,
    /// Axis → index pins.
    pub plane: BTreeMap<u32, u32>,
    /// Opaque client JSON.
    pub props_json: String,
    /// The tensor's content version when drawn.
    pub drawn_against_version: Option<Vec<u8>>,
    /// The rev the client read (compared under `check_rev`).
    pub rev: i64,
}

fn map_field_names() -> MapFieldNames {
    MapFieldNames {
        entry: "entries".to_string(),
        key: "key".to_string(),
        value: "value".to_string(),
    }
}

fn plane_type() -> DataType {
    DataType::Map(
        Arc::new(Field::new(
            "entries",
            DataType::Struct(
                vec![
                    Field::new("key", DataType::UInt32, false),
                    Field::new("value", DataType::UInt32, true),
                ]
                .into(),
            ),
            false,
        )),
        false,
    )
}

/// The row schema with `truncated` and `sets` metadata, as a `roi_read` streams it.
pub fn schema(truncated: bool, sets: &[SetCount]) -> SchemaRef {
    let sets_json = serde_json::Value::Array(
        sets.iter()
            .map(|s| {
                serde_json::json!({
                    "set_name": s.set_name,
                    "count": s.count,
                    "reserved": s.set_name.starts_with(super::RESERVED_SET_PREFIX),
                })
            })
            .collect(),
    );
    let metadata = [
        (
            "truncated".to_string(),
            if truncated { "True" } else { "False" }.to_string(),
        ),
        ("sets".to_string(), sets_json.to_string()),
    ]
    .into_iter()
    .collect();
    Arc::new(Schema::new_with_metadata(
        vec![
            Field::new("roi_id", DataType::Utf8, true),
            Field::new("array_id", DataType::Utf8, true),
            Field::new("set_name", DataType::Utf8, true),
            Field::new("label", DataType::Utf8, true),
            Field::new("geometry", DataType::Utf8, true),
            Field::new("plane", plane_type(), true),
            Field::new("props_json", DataType::Utf8, true),
            Field::new("drawn_against_version", DataType::Binary, true),
            Field::new("rev", DataType::Int64, true),
            Field::new("created_at_unix_ms", DataType::Int64, true),
            Field::new("updated_at_unix_ms", DataType::Int64, true),
        ],
        metadata,
    ))
}

/// `rois` of tensor `array_id` as one batch of `schema`.
pub fn to_batch(
    schema: SchemaRef,
    array_id: &str,
    rois: &[(String, StoredRoi)],
) -> Result<RecordBatch, ArrowError> {
    let n = rois.len();
    let strings = |f: &dyn Fn(&str, &StoredRoi) -> String| -> ArrayRef {
        let mut b = StringBuilder::with_capacity(n, n * 16);
        for (id, roi) in rois {
            b.append_value(f(id, roi));
        }
        Arc::new(b.finish())
    };
    let ints = |f: &dyn Fn(&StoredRoi) -> i64| -> ArrayRef {
        let mut b = Int64Builder::with_capacity(n);
        for (_, roi) in rois {
            b.append_value(f(roi));
        }
        Arc::new(b.finish())
    };
    let mut plane = MapBuilder::new(
        Some(map_field_names()),
        UInt32Builder::new(),
        UInt32Builder::new(),
    );
    let mut version = BinaryBuilder::new();
    for (_, roi) in rois {
        for (axis, index) in &roi.plane {
            plane.keys().append_value(*axis);
            plane.values().append_value(*index);
        }
        plane.append(true)?;
        match &roi.drawn_against_version {
            Some(v) => version.append_value(v),
            None => version.append_null(),
        }
    }
    let columns: Vec<ArrayRef> = vec![
        strings(&|id, _| id.to_string()),
        strings(&|_, _| array_id.to_string()),
        strings(&|_, r| r.set_name.clone()),
        strings(&|_, r| r.label.clone()),
        strings(&|_, r| r.geometry.clone()),
        Arc::new(plane.finish()),
        strings(&|_, r| r.props_json.clone()),
        Arc::new(version.finish()),
        ints(&|r| r.rev),
        ints(&|r| r.created_ms),
        ints(&|r| r.updated_ms),
    ];
    RecordBatch::try_new(schema, columns)
}

/// Text of a string column, whatever string layout the client chose.
struct Texts<'a>(&'a dyn Array);

impl Texts<'_> {
    fn get(&self, i: usize) -> Option<&str> {
        if self.0.is_null(i) {
            return None;
        }
        let any = self.0.as_any();
        if let Some(a) = any.downcast_ref::<StringArray>() {
            Some(a.value(i))
        } else if let Some(a) = any.downcast_ref::<LargeStringArray>() {
            Some(a.value(i))
        } else {
            any.downcast_ref::<StringViewArray>().map(|a| a.value(i))
        }
    }
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef, RowsError> {
    batch
        .column_by_name(name)
        .ok_or_else(|| RowsError::MissingColumn {
            name: name.to_string(),
        })
}

fn text_column<'a>(batch: &'a RecordBatch, name: &str) -> Result<Texts<'a>, RowsError> {
    let col = column(batch, name)?;
    match col.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null => {
            Ok(Texts(col.as_ref()))
        }
        other => Err(RowsError::column_type(name, other, "a string")),
    }
}

/// The annotations of one batch of a `roi_put` stream.
pub fn from_batch(batch: &RecordBatch) -> Result<Vec<IncomingRoi>, RowsError> {
    let roi_id = text_column(batch, "roi_id")?;
    let array_id = text_column(batch, "array_id")?;
    let set_name = text_column(batch, "set_name")?;
    let label = text_column(batch, "label")?;
    let geometry = text_column(batch, "geometry")?;
    let props = text_column(batch, "props_json")?;
    let plane_col = column(batch, "plane")?;
    let plane = match plane_col.data_type() {
        DataType::Null => None,
        _ => Some(
            plane_col
                .as_any()
                .downcast_ref::<MapArray>()
                .ok_or_else(|| {
                    RowsError::column_type("plane", plane_col.data_type(), "map<uint32, uint32>")
                })?,
        ),
    };
    let version_col = column(batch, "drawn_against_version")?;
    let version = match version_col.data_type() {
        DataType::Null => None,
        _ => Some(
            version_col
                .as_any()
                .downcast_ref::<BinaryArray>()
                .ok_or_else(|| {
                    RowsError::column_type(
                        "drawn_against_version",
                        version_col.data_type(),
                        "binary",
                    )
                })?,
        ),
    };
    let rev_col = column(batch, "rev")?;
    let rev = match rev_col.data_type() {
        DataType::Null => None,
        _ => Some(
            rev_col
                .as_any()
                .downcast_ref::<Int64Array>()
                .ok_or_else(|| RowsError::column_type("rev", rev_col.data_type(), "int64"))?,
        ),
    };
    let mut out = Vec::with_capacity(batch.num_rows());
    for i in 0..batch.num_rows() {
        let text = |t: &Texts, i| t.get(i).unwrap_or_default().to_string();
        let mut pins = BTreeMap::new();
        if let Some(plane) = plane.filter(|p| !p.is_null(i)) {
            let entries = plane.value(i);
            let keys = entries.column(0).as_any().downcast_ref::<UInt32Array>();
            let values = entries.column(1).as_any().downcast_ref::<UInt32Array>();
            let (Some(keys), Some(values)) = (keys, values) else {
                return Err(RowsError::PlaneEntries);
            };
            for j in 0..keys.len() {
                if values.is_null(j) {
                    return Err(RowsError::PinWithoutIndex {
                        row: i,
                        axis: keys.value(j),
                    });
                }
                pins.insert(keys.value(j), values.value(j));
            }
        }
        out.push(IncomingRoi {
            roi_id: text(&roi_id, i),
            array_id: text(&array_id, i),
            set_name: text(&set_name, i),
            label: text(&label, i),
            geometry: text(&geometry, i),
            plane: pins,
            props_json: text(&props, i),
            drawn_against_version: version
                .filter(|v| !v.is_null(i))
                .map(|v| v.value(i).to_vec()),
            rev: rev.filter(|r| !r.is_null(i)).map_or(0, |r| r.value(i)),
        });
    }
    Ok(out)
}

/// The ids of one batch of a `roi_delete` stream (empty ids are skipped).
pub fn ids_from_batch(batch: &RecordBatch) -> Result<Vec<String>, RowsError> {
    if batch.num_rows() == 0 {
        return Ok(Vec::new());
    }
    let ids = batch
        .column_by_name("roi_id")
        .ok_or(RowsError::NoIdColumn)?;
    if !matches!(
        ids.data_type(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    ) {
        return Err(RowsError::IdType {
            found: ids.data_type().clone(),
        });
    }
    let ids = Texts(ids.as_ref());
    Ok((0..batch.num_rows())
        .filter_map(|i| ids.get(i))
        .filter(|id| !id.is_empty())
        .map(str::to_string)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_written_for_a_list_read_back_as_a_put() -> Result<(), Box<dyn std::error::Error>> {
        let stored = StoredRoi {
            set_name: "nuclei".to_string(),
            label: "cell".to_string(),
            shape: "point".to_string(),
            geometry: r#"{"point":{"x":1.0}}"#.to_string(),
            plane: [(0, 3), (2, 7)].into_iter().collect(),
            props_json: "{}".to_string(),
            drawn_against_version: Some(vec![1, 2]),
            rev: 4,
            created_ms: 10,
            updated_ms: 11,
        };
        let sets = [SetCount {
            set_name: "nuclei".to_string(),
            count: 1,
        }];
        let batch = to_batch(
            schema(false, &sets),
            "img",
            &[("id-1".to_string(), stored.clone())],
        )?;
        assert_eq!(batch.schema().metadata()["truncated"], "False");
        assert!(batch.schema().metadata()["sets"].contains("\"count\":1"));
        let back = from_batch(&batch)?;
        assert_eq!(
            back,
            vec![IncomingRoi {
                roi_id: "id-1".to_string(),
                array_id: "img".to_string(),
                set_name: "nuclei".to_string(),
                label: "cell".to_string(),
                geometry: stored.geometry.clone(),
                plane: stored.plane.clone(),
                props_json: "{}".to_string(),
                drawn_against_version: Some(vec![1, 2]),
                rev: 4,
            }]
        );
        let only_ids = batch.project(&[0])?;
        assert_eq!(ids_from_batch(&only_ids)?, vec!["id-1".to_string()]);
        let missing = batch.project(&[0, 1])?;
        let err = from_batch(&missing)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("missing column 'set_name'"), "{err}");
        Ok(())
    }
}
