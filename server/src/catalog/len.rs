//! `len(list)`: DuckDB's list length, which biopb clients send themselves
//! (`SELECT len(tensors) AS tensor_count FROM sources WHERE …`).
//!
//! DataFusion spells it `array_length`/`cardinality`, whose results differ in type
//! (UInt64) and in edge cases, so the DuckDB meaning is registered under its own
//! name: the number of elements as BIGINT, 0 for an empty list, NULL for NULL.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, Int64Array, OffsetSizeTrait};
use arrow_schema::DataType;
use datafusion::common::{Result, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// The `len` scalar function over lists.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ListLen {
    signature: Signature,
}

impl ListLen {
    /// The function, ready to register.
    pub fn udf() -> ScalarUDF {
        ScalarUDF::new_from_impl(ListLen {
            signature: Signature::array(Volatility::Immutable),
        })
    }
}

impl ScalarUDFImpl for ListLen {
    fn name(&self) -> &str {
        "len"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types {
            [DataType::List(_) | DataType::LargeList(_) | DataType::Null] => Ok(DataType::Int64),
            other => plan_err!("len() takes one list argument, got {other:?}"),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let [arg] = args.args.as_slice() else {
            return exec_err!("len() takes exactly one argument");
        };
        let array = arg.to_array(rows)?;
        let lengths: ArrayRef = match array.data_type() {
            DataType::List(_) => Arc::new(lengths(array.as_list::<i32>())),
            DataType::LargeList(_) => Arc::new(lengths(array.as_list::<i64>())),
            DataType::Null => Arc::new(Int64Array::new_null(array.len())),
            other => return exec_err!("len() takes a list, got {other}"),
        };
        Ok(match arg {
            ColumnarValue::Scalar(_) => ColumnarValue::Scalar(
                datafusion::common::ScalarValue::try_from_array(&lengths, 0)?,
            ),
            ColumnarValue::Array(_) => ColumnarValue::Array(lengths),
        })
    }
}

fn lengths<O: OffsetSizeTrait>(list: &arrow_array::GenericListArray<O>) -> Int64Array {
    let values = list
        .offsets()
        .windows(2)
        .map(|w| (w[1] - w[0]).as_usize() as i64);
    Int64Array::new(values.collect(), list.nulls().cloned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use arrow_array::ListArray;
    use arrow_array::types::Int32Type;
    use arrow_schema::Field;
    use datafusion::config::ConfigOptions;

    #[test]
    fn counts_elements_keeps_nulls_and_empty_is_zero() {
        let list = ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
            Some(vec![Some(1), Some(2), None]),
            None,
            Some(vec![]),
        ]);
        let field = Arc::new(Field::new("l", list.data_type().clone(), true));
        let out = ListLen::udf()
            .invoke_with_args(ScalarFunctionArgs {
                args: vec![ColumnarValue::Array(Arc::new(list))],
                arg_fields: vec![field],
                number_rows: 3,
                return_field: Arc::new(Field::new("len", DataType::Int64, true)),
                config_options: Arc::new(ConfigOptions::default()),
            })
            .unwrap();
        let ColumnarValue::Array(out) = out else {
            panic!("an array argument gives an array")
        };
        let out = out.as_primitive::<arrow_array::types::Int64Type>();
        assert_eq!(out.value(0), 3);
        assert!(out.is_null(1));
        assert_eq!(out.value(2), 0);
    }
}
