//! Scalar functions whose output size is checked against a cap.
//!
//! DataFusion's memory pool accounts for operators' buffers, not for what a scalar
//! function allocates: nine CTEs each repeating the previous string ten times asked for
//! 3 GB at once and aborted the process. So every scalar function of a catalog session
//! is wrapped: functions that can build more than the sum of their inputs (`concat`,
//! `replace`, `regexp_replace`, list builders, the `||` operator rewritten to
//! [`StringConcat`]) have their output size bounded from their inputs *before* they run,
//! and every function's output is measured after it ran. A value may be at most
//! [`MAX_VALUE_BYTES`], one function's output for a batch at most [`MAX_OUTPUT_BYTES`];
//! past either the query fails with an error naming the function and the cap. Since every
//! input was itself checked, no step allocates more than a small multiple of the caps.

use std::sync::Arc;

use arrow_array::builder::StringBuilder;
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef};
use arrow_schema::{DataType, FieldRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::simplify::{ExprSimplifyResult, SimplifyContext};
use datafusion::logical_expr::sort_properties::{ExprProperties, SortProperties};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};

/// Largest value (string, binary, list) a catalog expression may produce.
pub const MAX_VALUE_BYTES: usize = 1 << 20;
/// Largest output of one function call over one batch.
pub const MAX_OUTPUT_BYTES: usize = 32 << 20;

/// How a function's output size is bounded before it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Growth {
    /// At most a small multiple of its inputs: measured after it ran.
    Measured,
    /// At most the sum of its inputs (`concat`, `make_array`, …): checked before.
    Sum,
    /// `replace(s, from, to)` / `regexp_replace(s, pattern, to)`: `to` may be inserted at
    /// every position of `s`, so up to `len(s) × len(to)`: checked before.
    Replace,
    /// `repeat(s, n)`, `lpad`/`rpad(s, n[, fill])`, `array_repeat(x, n)`,
    /// `array_resize(l, n[, x])`: the size is the count argument: checked before.
    Counted,
}

fn growth(name: &str) -> Growth {
    match name {
        "concat" | "concat_ws" | "overlay" | "make_array" | "array_concat" | "array_append"
        | "array_prepend" | "array_cat" | "list_concat" | "named_struct" | "struct"
        | "make_map" | "map" | "string_concat" => Growth::Sum,
        "replace" | "regexp_replace" => Growth::Replace,
        "repeat" | "lpad" | "rpad" | "array_repeat" | "list_repeat" | "array_resize"
        | "list_resize" => Growth::Counted,
        _ => Growth::Measured,
    }
}

/// `inner`, its output size checked.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Capped {
    inner: ScalarUDF,
    growth: Growth,
}

impl Capped {
    /// `inner` wrapped, ready to register.
    pub fn wrap(inner: ScalarUDF) -> ScalarUDF {
        let growth = growth(inner.name());
        ScalarUDF::new_from_impl(Capped { inner, growth })
    }

    fn imp(&self) -> &Arc<dyn ScalarUDFImpl> {
        self.inner.inner()
    }
}

/// Largest value and total bytes of an argument over `rows` rows.
fn sizes(arg: &ColumnarValue, rows: usize) -> (usize, usize) {
    match arg {
        ColumnarValue::Scalar(value) => {
            let size = scalar_bytes(value);
            (size, size.saturating_mul(rows.max(1)))
        }
        ColumnarValue::Array(array) => array_sizes(array),
    }
}

fn scalar_bytes(value: &ScalarValue) -> usize {
    match value {
        ScalarValue::Utf8(s) | ScalarValue::LargeUtf8(s) | ScalarValue::Utf8View(s) => {
            s.as_ref().map_or(0, String::len)
        }
        ScalarValue::Binary(b) | ScalarValue::LargeBinary(b) | ScalarValue::BinaryView(b) => {
            b.as_ref().map_or(0, Vec::len)
        }
        other => other.size(),
    }
}

fn array_sizes(array: &ArrayRef) -> (usize, usize) {
    let max_of = |lengths: &mut dyn Iterator<Item = usize>| lengths.max().unwrap_or(0);
    let total = array.get_array_memory_size();
    let largest = match array.data_type() {
        DataType::Utf8 => max_of(
            &mut array
                .as_string::<i32>()
                .iter()
                .map(|v| v.map_or(0, str::len)),
        ),
        DataType::LargeUtf8 => max_of(
            &mut array
                .as_string::<i64>()
                .iter()
                .map(|v| v.map_or(0, str::len)),
        ),
        DataType::Utf8View => {
            max_of(&mut array.as_string_view().iter().map(|v| v.map_or(0, str::len)))
        }
        DataType::Binary => max_of(
            &mut array
                .as_binary::<i32>()
                .iter()
                .map(|v| v.map_or(0, <[u8]>::len)),
        ),
        DataType::LargeBinary => max_of(
            &mut array
                .as_binary::<i64>()
                .iter()
                .map(|v| v.map_or(0, <[u8]>::len)),
        ),
        DataType::List(_) => {
            let list = array.as_list::<i32>();
            let per_item = list.values().get_array_memory_size() / list.values().len().max(1);
            let longest = list
                .offsets()
                .windows(2)
                .map(|w| (w[1] - w[0]) as usize)
                .max();
            longest.unwrap_or(0).saturating_mul(per_item.max(1))
        }
        DataType::LargeList(_) => {
            let list = array.as_list::<i64>();
            let per_item = list.values().get_array_memory_size() / list.values().len().max(1);
            let longest = list
                .offsets()
                .windows(2)
                .map(|w| (w[1] - w[0]) as usize)
                .max();
            longest.unwrap_or(0).saturating_mul(per_item.max(1))
        }
        _ => total / array.len().max(1),
    };
    (largest, total)
}

fn too_big(name: &str, what: &str, bytes: usize, cap: usize) -> DataFusionError {
    DataFusionError::ResourcesExhausted(format!(
        "{name}() would produce {what} of about {bytes} bytes, more than the {cap} bytes \
         a catalog query may build"
    ))
}

/// The largest count a `repeat`-like argument asks for (0 when it is not a number).
fn max_count(arg: &ColumnarValue) -> usize {
    use datafusion::arrow::array::types::Int64Type;
    let largest = match arg {
        ColumnarValue::Scalar(v) => match v.cast_to(&DataType::Int64) {
            Ok(ScalarValue::Int64(Some(n))) => n,
            _ => 0,
        },
        ColumnarValue::Array(a) => datafusion::arrow::compute::cast(a, &DataType::Int64)
            .ok()
            .and_then(|a| datafusion::arrow::compute::max(a.as_primitive::<Int64Type>()))
            .unwrap_or(0),
    };
    usize::try_from(largest).unwrap_or(0)
}

/// Refuses a call whose output could pass the caps, from the sizes of its arguments.
fn check_before(name: &str, growth: Growth, args: &[ColumnarValue], rows: usize) -> Result<()> {
    let sizes: Vec<(usize, usize)> = args.iter().map(|a| sizes(a, rows)).collect();
    let (value, total) = match growth {
        Growth::Measured => return Ok(()),
        Growth::Sum => sizes.iter().fold((0usize, 0usize), |(v, t), (sv, st)| {
            (v.saturating_add(*sv), t.saturating_add(*st))
        }),
        Growth::Replace => {
            let s = sizes.first().map_or(0, |s| s.0);
            let to = sizes.get(2).map_or(0, |s| s.0);
            // Every position of `s` may take `to`, whose back-references expand to at
            // most `s` in all.
            let value = s
                .saturating_add(1)
                .saturating_mul(to.saturating_add(1))
                .saturating_mul(2)
                .saturating_add(s);
            (value, value.saturating_mul(rows.max(1)))
        }
        Growth::Counted => {
            let count = args.get(1).map_or(0, max_count);
            let item = match name {
                // A character is at most four bytes; the fill (or the string) is repeated.
                "lpad" | "rpad" => 4usize,
                "repeat" => sizes.first().map_or(0, |s| s.0),
                // A list element: its value (the repeated one, or the padding) and offsets.
                _ => sizes
                    .iter()
                    .map(|s| s.0)
                    .max()
                    .unwrap_or(0)
                    .saturating_add(8),
            };
            let first = sizes.first().map_or(0, |s| s.0);
            let value = count.saturating_mul(item.max(1)).saturating_add(first);
            (value, value.saturating_mul(rows.max(1)))
        }
    };
    if value > MAX_VALUE_BYTES {
        return Err(too_big(name, "a value", value, MAX_VALUE_BYTES));
    }
    if total > MAX_OUTPUT_BYTES {
        return Err(too_big(name, "a batch", total, MAX_OUTPUT_BYTES));
    }
    Ok(())
}

/// Refuses an output that passed the caps anyway (functions measured after they ran).
fn check_after(name: &str, out: &ColumnarValue) -> Result<()> {
    let (value, total) = match out {
        ColumnarValue::Scalar(v) => (scalar_bytes(v), 0),
        ColumnarValue::Array(a) => array_sizes(a),
    };
    if value > MAX_VALUE_BYTES {
        return Err(too_big(name, "a value", value, MAX_VALUE_BYTES));
    }
    if total > MAX_OUTPUT_BYTES {
        return Err(too_big(name, "a batch", total, MAX_OUTPUT_BYTES));
    }
    Ok(())
}

impl ScalarUDFImpl for Capped {
    fn name(&self) -> &str {
        self.imp().name()
    }

    fn aliases(&self) -> &[String] {
        self.imp().aliases()
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        self.imp().schema_name(args)
    }

    fn signature(&self) -> &Signature {
        self.imp().signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.imp().return_type(arg_types)
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        self.imp().with_updated_config(config).map(Capped::wrap)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.imp().return_field_from_args(args)
    }

    fn is_strict(&self) -> bool {
        self.imp().is_strict()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let name = self.imp().name().to_string();
        let rows = args.number_rows;
        check_before(&name, self.growth, &args.args, rows)?;
        let out = self.imp().invoke_with_args(args)?;
        check_after(&name, &out)?;
        Ok(out)
    }

    fn simplify(&self, args: Vec<Expr>, info: &SimplifyContext) -> Result<ExprSimplifyResult> {
        // A simplified call of a size-checked function would be the unwrapped original.
        if self.growth == Growth::Measured {
            self.imp().simplify(args, info)
        } else {
            Ok(ExprSimplifyResult::Original(args))
        }
    }

    fn short_circuits(&self) -> bool {
        self.imp().short_circuits()
    }

    fn conditional_arguments<'a>(
        &self,
        args: &'a [Expr],
    ) -> Option<(Vec<&'a Expr>, Vec<&'a Expr>)> {
        self.imp().conditional_arguments(args)
    }

    fn output_ordering(&self, inputs: &[ExprProperties]) -> Result<SortProperties> {
        self.imp().output_ordering(inputs)
    }

    fn preserves_lex_ordering(&self, inputs: &[ExprProperties]) -> Result<bool> {
        self.imp().preserves_lex_ordering(inputs)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.imp().coerce_types(arg_types)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.imp().documentation()
    }
}

/// `a || b` over strings (NULL when either is NULL), for the rewrite in `guard.rs`.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct StringConcat {
    signature: Signature,
}

impl StringConcat {
    /// The function, wrapped in its size check.
    pub fn udf() -> ScalarUDF {
        Capped::wrap(ScalarUDF::new_from_impl(StringConcat {
            signature: Signature::exact(
                vec![DataType::Utf8, DataType::Utf8],
                Volatility::Immutable,
            ),
        }))
    }
}

impl ScalarUDFImpl for StringConcat {
    fn name(&self) -> &str {
        "string_concat"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let [left, right] = arrays.as_slice() else {
            return Err(DataFusionError::Execution(
                "string_concat takes two arguments".to_string(),
            ));
        };
        let (left, right) = (left.as_string::<i32>(), right.as_string::<i32>());
        let mut out = StringBuilder::new();
        // `values_to_arrays` gave both the same length (scalars repeated).
        for i in 0..left.len().min(right.len()) {
            if left.is_null(i) || right.is_null(i) {
                out.append_null();
            } else {
                let mut value = String::with_capacity(left.value(i).len() + right.value(i).len());
                value.push_str(left.value(i));
                value.push_str(right.value(i));
                out.append_value(value);
            }
        }
        let out: ArrayRef = Arc::new(out.finish());
        if scalar {
            Ok(ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?))
        } else {
            Ok(ColumnarValue::Array(out))
        }
    }
}
