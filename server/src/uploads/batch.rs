//! A DoPut chunk as bytes: the record batches the client sent (one column `data` of the
//! tensor's element type, one value per element in C order) checked against the cell
//! they claim to fill, and their values as the raw little-endian bytes the store keeps.

use arrow_array::{Array, BooleanArray, RecordBatch};
use arrow_buffer::Buffer;
use arrow_schema::DataType;

use crate::source::npy::{ByteOrder, Dtype, Kind};

/// The Arrow type a chunk of `dtype` travels as, or why none does.
pub fn arrow_type(dtype: &Dtype) -> Result<DataType, String> {
    if dtype.order == ByteOrder::Big {
        return Err(format!(
            "dtype '{0}' is big-endian: Arrow carries little-endian values, so declare '<{1}' \
             and upload the array as that",
            dtype.numpy_str(),
            &dtype.numpy_str()[1..]
        ));
    }
    Ok(match (dtype.kind, dtype.itemsize) {
        (Kind::Bool, 1) => DataType::Boolean,
        (Kind::Int, 1) => DataType::Int8,
        (Kind::Int, 2) => DataType::Int16,
        (Kind::Int, 4) => DataType::Int32,
        (Kind::Int, 8) => DataType::Int64,
        (Kind::UInt, 1) => DataType::UInt8,
        (Kind::UInt, 2) => DataType::UInt16,
        (Kind::UInt, 4) => DataType::UInt32,
        (Kind::UInt, 8) => DataType::UInt64,
        (Kind::Float, 2) => DataType::Float16,
        (Kind::Float, 4) => DataType::Float32,
        (Kind::Float, 8) => DataType::Float64,
        _ => {
            return Err(format!(
                "dtype '{}' cannot be uploaded: the biopb client sends chunks as Arrow \
                 primitive arrays, which have no {} type",
                dtype.numpy_str(),
                dtype.numpy_str()
            ));
        }
    })
}

/// The values of `batches` as byte buffers (concatenated, the chunk's bytes), after
/// checking they are one `data` column of `dtype` without nulls holding exactly
/// `elements` values.
pub fn chunk_bytes(
    batches: &[RecordBatch],
    dtype: &Dtype,
    elements: u64,
) -> Result<Vec<Buffer>, String> {
    let want = arrow_type(dtype)?;
    let mut out = Vec::with_capacity(batches.len());
    let mut seen: u64 = 0;
    for batch in batches {
        if batch.num_columns() != 1 {
            return Err(format!(
                "a chunk batch has exactly one column 'data'; this one has {}",
                batch.num_columns()
            ));
        }
        let column = batch.column(0);
        if column.data_type() != &want {
            return Err(format!(
                "the chunk's 'data' column is {}, but the tensor's dtype '{}' travels as {want}",
                column.data_type(),
                dtype.numpy_str()
            ));
        }
        if column.null_count() > 0 {
            return Err(format!(
                "the chunk's 'data' column has {} nulls; a tensor has a value in every element",
                column.null_count()
            ));
        }
        seen += column.len() as u64;
        if seen > elements {
            break;
        }
        if column.is_empty() {
            continue;
        }
        if let Some(bools) = column.as_any().downcast_ref::<BooleanArray>() {
            let bytes: Vec<u8> = bools.values().iter().map(u8::from).collect();
            out.push(Buffer::from_vec(bytes));
            continue;
        }
        let data = column.to_data();
        let Some(values) = data.buffers().first() else {
            return Err("the chunk's 'data' column has no values buffer".to_string());
        };
        let item = dtype.itemsize;
        let (start, len) = (data.offset() * item, data.len() * item);
        if values.len() < start + len {
            return Err("the chunk's 'data' column is shorter than its length says".to_string());
        }
        out.push(values.slice_with_length(start, len));
    }
    if seen != elements {
        return Err(format!(
            "the chunk holds {seen} values, but its cell has {elements} elements"
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use arrow_array::{Float32Array, UInt16Array};
    use std::sync::Arc;

    fn batch(column: Arc<dyn Array>) -> RecordBatch {
        RecordBatch::try_from_iter([("data", column)]).unwrap()
    }

    #[test]
    fn values_become_little_endian_bytes_and_mismatches_are_named() {
        let u2 = Dtype::parse("<u2").unwrap();
        let full = UInt16Array::from(vec![1u16, 2, 3, 4]);
        let sliced = batch(Arc::new(full.slice(1, 3)));
        let bytes = chunk_bytes(&[sliced], &u2, 3).unwrap();
        let flat: Vec<u8> = bytes.iter().flat_map(|b| b.to_vec()).collect();
        assert_eq!(flat, vec![2, 0, 3, 0, 4, 0]);

        let b = batch(Arc::new(UInt16Array::from(vec![1u16, 2])));
        assert!(
            chunk_bytes(std::slice::from_ref(&b), &u2, 3)
                .unwrap_err()
                .contains("3 elements")
        );
        let f4 = Dtype::parse("<f4").unwrap();
        assert!(chunk_bytes(&[b], &f4, 2).unwrap_err().contains("Float32"));
        let nulls = batch(Arc::new(Float32Array::from(vec![Some(1.0), None])));
        assert!(chunk_bytes(&[nulls], &f4, 2).unwrap_err().contains("nulls"));
        let bools = batch(Arc::new(BooleanArray::from(vec![true, false, true])));
        let b1 = Dtype::parse("|b1").unwrap();
        let bytes = chunk_bytes(&[bools], &b1, 3).unwrap();
        assert_eq!(bytes[0].to_vec(), vec![1, 0, 1]);
        assert!(arrow_type(&Dtype::parse(">u2").unwrap()).is_err());
        assert!(arrow_type(&Dtype::parse("<c8").unwrap()).is_err());
    }
}
