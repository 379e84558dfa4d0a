//! Chunk views: the bytes of one chunk with its shape and dtype, and how
//! they are pulled out of a chunk record batch (chunk wire protocol 2).

use arrow_array::cast::AsArray;
use arrow_array::types::{Int32Type, Int64Type};
use arrow_array::{Array, RecordBatch};
use arrow_buffer::Buffer;
use arrow_schema::DataType;
use tessera_proto::consts::{COLUMN_DATA, COLUMN_DTYPE, COLUMN_SHAPE};

/// How a chunk reached this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkOrigin {
    /// A zero-copy view into a mapped segment file; the mapping lives as long
    /// as the view.
    Mapped,
    /// Read through a mapping, but copied out because the pin limit was
    /// reached; no segment stays mapped for it.
    MappedCopy,
    /// Received over the socket with DoGet.
    Socket,
}

/// One chunk's C-order bytes, read-only, with its shape and numpy dtype.
///
/// A [`ChunkOrigin::Mapped`] view keeps its segment mapped (and counted
/// against the pin limit) until the last clone of it is dropped; the bytes
/// stay valid even after the server evicts and unlinks the segment.
#[derive(Debug, Clone)]
pub struct ChunkView {
    data: Buffer,
    shape: Vec<u64>,
    dtype: String,
    origin: ChunkOrigin,
}

impl ChunkView {
    /// The chunk's raw bytes, C order, in the byte order its dtype says.
    pub fn bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// The chunk's shape.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// The numpy dtype string, e.g. `"<u2"`.
    pub fn dtype(&self) -> &str {
        &self.dtype
    }

    /// How the chunk was obtained.
    pub fn origin(&self) -> ChunkOrigin {
        self.origin
    }

    /// A copy of this view whose bytes live in a fresh heap allocation.
    pub(crate) fn copied(&self, origin: ChunkOrigin) -> ChunkView {
        ChunkView {
            data: Buffer::from_vec(self.bytes().to_vec()),
            shape: self.shape.clone(),
            dtype: self.dtype.clone(),
            origin,
        }
    }

    /// Keeps exactly the first `len` bytes (numpy reads `prod(shape)` items
    /// from the start of the value buffer and ignores any rest).
    pub(crate) fn truncated(mut self, len: usize) -> ChunkView {
        self.data = self.data.slice_with_length(0, len);
        self
    }
}

/// Pulls row 0 of a chunk batch (`data` Binary/LargeBinary, `shape` list of
/// integers, `dtype` Utf8/LargeUtf8) into a view sharing the batch's buffer.
pub(crate) fn view_from_batch(
    batch: &RecordBatch,
    origin: ChunkOrigin,
) -> Result<ChunkView, String> {
    if batch.num_rows() == 0 {
        return Err("the chunk batch has no rows".to_string());
    }
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .ok_or_else(|| format!("the chunk batch has no '{name}' column"))
    };
    let data = column(COLUMN_DATA)?;
    let data = match data.data_type() {
        DataType::Binary => {
            let a = data.as_binary::<i32>();
            let (start, end) = (a.value_offsets()[0], a.value_offsets()[1]);
            slice(a.values(), start as usize, end as usize)?
        }
        DataType::LargeBinary => {
            let a = data.as_binary::<i64>();
            let (start, end) = (a.value_offsets()[0], a.value_offsets()[1]);
            slice(a.values(), start as usize, end as usize)?
        }
        other => return Err(format!("'{COLUMN_DATA}' is {other}, not Binary")),
    };
    let shape_column = column(COLUMN_SHAPE)?;
    let items = match shape_column.data_type() {
        DataType::List(_) => shape_column.as_list::<i32>().value(0),
        DataType::LargeList(_) => shape_column.as_list::<i64>().value(0),
        other => return Err(format!("'{COLUMN_SHAPE}' is {other}, not a list")),
    };
    let shape: Vec<i64> = match items.data_type() {
        DataType::Int64 => items.as_primitive::<Int64Type>().values().to_vec(),
        DataType::Int32 => items
            .as_primitive::<Int32Type>()
            .values()
            .iter()
            .map(|&v| i64::from(v))
            .collect(),
        other => return Err(format!("'{COLUMN_SHAPE}' items are {other}, not integers")),
    };
    let shape = shape
        .iter()
        .map(|&d| u64::try_from(d).map_err(|_| format!("shape {shape:?} has a negative axis")))
        .collect::<Result<Vec<u64>, String>>()?;
    let dtype_column = column(COLUMN_DTYPE)?;
    let dtype = match dtype_column.data_type() {
        DataType::Utf8 => dtype_column.as_string::<i32>().value(0).to_string(),
        DataType::LargeUtf8 => dtype_column.as_string::<i64>().value(0).to_string(),
        other => return Err(format!("'{COLUMN_DTYPE}' is {other}, not Utf8")),
    };
    Ok(ChunkView {
        data,
        shape,
        dtype,
        origin,
    })
}

fn slice(values: &Buffer, start: usize, end: usize) -> Result<Buffer, String> {
    if start > end || end > values.len() {
        return Err(format!(
            "'{COLUMN_DATA}' offsets [{start}, {end}) fall outside its {}-byte buffer",
            values.len()
        ));
    }
    Ok(values.slice_with_length(start, end - start))
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use arrow_array::builder::{Int64Builder, ListBuilder};
    use arrow_array::{BinaryArray, StringArray};
    use std::sync::Arc;

    /// A one-row chunk batch in the served schema.
    pub(crate) fn chunk_batch(data: &[u8], shape: &[i64], dtype: &str) -> RecordBatch {
        let mut shapes = ListBuilder::new(Int64Builder::new()).with_field(Arc::new(
            arrow_schema::Field::new_list_field(DataType::Int64, true),
        ));
        shapes.values().append_slice(shape);
        shapes.append(true);
        RecordBatch::try_new(
            Arc::new(tessera_proto::chunk_schema()),
            vec![
                Arc::new(BinaryArray::from_vec(vec![data])),
                Arc::new(shapes.finish()),
                Arc::new(StringArray::from(vec![dtype])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn batch_columns_become_a_view() {
        let batch = chunk_batch(&[1, 2, 3, 4, 5, 6], &[2, 3], "|u1");
        let view = view_from_batch(&batch, ChunkOrigin::Socket).unwrap();
        assert_eq!(view.bytes(), &[1, 2, 3, 4, 5, 6]);
        assert_eq!(view.shape(), &[2, 3]);
        assert_eq!(view.dtype(), "|u1");
        assert_eq!(view.origin(), ChunkOrigin::Socket);
        assert_eq!(view.clone().truncated(4).bytes(), &[1, 2, 3, 4]);
        let copy = view.copied(ChunkOrigin::MappedCopy);
        assert_eq!(copy.bytes(), view.bytes());
        assert_ne!(copy.bytes().as_ptr(), view.bytes().as_ptr());
    }

    #[test]
    fn missing_columns_are_named() {
        let batch = chunk_batch(&[1], &[1], "|u1");
        let without = batch.project(&[0, 2]).unwrap();
        let err = view_from_batch(&without, ChunkOrigin::Socket).unwrap_err();
        assert!(err.contains("'shape'"), "{err}");
    }
}
