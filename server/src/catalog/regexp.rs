//! `regexp_extract(string, pattern[, group[, options]])`: DuckDB's function, which
//! biopb clients send themselves (the napari Tensor Browser finds its dropped roots with
//! `SELECT DISTINCT regexp_extract(source_url, '^dnd://[^\\/]+') AS root FROM sources …`).
//!
//! DataFusion has no such function, so DuckDB's meaning is registered under its name:
//! the first match of `pattern` in `string`, or its capture group `group` (0, the whole
//! match, by default); the empty string when nothing matches or the group took no part in
//! the match; NULL when `string` or `pattern` is NULL. `group` must be a constant between
//! 0 and the pattern's number of groups. `options` are DuckDB's letters: `c` case
//! sensitive (the default), `i` case insensitive, `l` the pattern is a literal string,
//! `m`/`n`/`p` newline sensitive (`.` does not match a newline: the default), `s` not
//! newline sensitive (`.` matches a newline); whitespace is ignored. The struct form (a
//! list of group names instead of a group number) is not offered. Patterns are Rust
//! `regex` syntax, which like DuckDB's RE2 has no look-around or back-references and
//! matches in linear time.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, StringArray};
use arrow_schema::DataType;
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature,
    Volatility,
};
use regex::{Regex, RegexBuilder};

/// Largest compiled pattern, in bytes: a catalog query's pattern is a few dozen
/// characters; this stops `a{1000}{1000}` from taking the worker's memory.
const MAX_PATTERN_BYTES: usize = 1 << 20;

/// The `regexp_extract` scalar function.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct RegexpExtract {
    signature: Signature,
}

impl RegexpExtract {
    /// The function, ready to register.
    pub fn udf() -> ScalarUDF {
        use DataType::{Int64, Utf8};
        ScalarUDF::new_from_impl(RegexpExtract {
            signature: Signature::one_of(
                vec![
                    TypeSignature::Exact(vec![Utf8, Utf8]),
                    TypeSignature::Exact(vec![Utf8, Utf8, Int64]),
                    TypeSignature::Exact(vec![Utf8, Utf8, Int64, Utf8]),
                ],
                Volatility::Immutable,
            ),
        })
    }
}

impl ScalarUDFImpl for RegexpExtract {
    fn name(&self) -> &str {
        "regexp_extract"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        match arg_types {
            [_, _] | [_, _, DataType::Int64] | [_, _, DataType::Int64, _] => Ok(DataType::Utf8),
            other => plan_err!(
                "regexp_extract takes (string, pattern[, group[, options]]), got {other:?}"
            ),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let all_scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let (text, pattern, group, options) = match args.args.as_slice() {
            [t, p] => (t, p, None, None),
            [t, p, g] => (t, p, Some(g), None),
            [t, p, g, o] => (t, p, Some(g), Some(o)),
            _ => return exec_err!("regexp_extract takes 2 to 4 arguments"),
        };
        let group = match group {
            None => 0,
            Some(ColumnarValue::Scalar(ScalarValue::Int64(Some(g)))) => *g,
            Some(ColumnarValue::Scalar(ScalarValue::Int64(None))) => {
                return Ok(null_result(all_scalar, rows));
            }
            Some(_) => return exec_err!("regexp_extract: the group must be a constant"),
        };
        let group = usize::try_from(group)
            .map_err(|_| exec_error(format!("group {group} is out of range")))?;
        let options = match options {
            None => Options::default(),
            Some(ColumnarValue::Scalar(ScalarValue::Utf8(Some(o)))) => Options::parse(o)?,
            Some(ColumnarValue::Scalar(ScalarValue::Utf8(None))) => Options::default(),
            Some(_) => return exec_err!("regexp_extract: the options must be a constant"),
        };

        let texts = text.to_array(rows)?;
        let texts = strings(&texts)?;
        let out: StringArray = match pattern {
            ColumnarValue::Scalar(ScalarValue::Utf8(Some(p))) => {
                let re = compile(p, options, group)?;
                texts
                    .iter()
                    .map(|t| t.map(|t| extract(&re, t, group)))
                    .collect()
            }
            ColumnarValue::Scalar(_) => return Ok(null_result(all_scalar, rows)),
            ColumnarValue::Array(patterns) => {
                let patterns = strings(patterns)?;
                let mut last: Option<(&str, Regex)> = None;
                let mut out = Vec::with_capacity(rows);
                for (t, p) in texts.iter().zip(patterns.iter()) {
                    let (Some(t), Some(p)) = (t, p) else {
                        out.push(None);
                        continue;
                    };
                    let re = match last.take() {
                        Some((prev, re)) if prev == p => re,
                        _ => compile(p, options, group)?,
                    };
                    out.push(Some(extract(&re, t, group)));
                    last = Some((p, re));
                }
                out.into_iter().collect()
            }
        };
        let out: ArrayRef = Arc::new(out);
        Ok(if all_scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
        } else {
            ColumnarValue::Array(out)
        })
    }
}

/// DuckDB's regex option letters, as they apply to an extraction.
#[derive(Clone, Copy, Debug, Default)]
struct Options {
    case_insensitive: bool,
    literal: bool,
    dot_matches_newline: bool,
}

impl Options {
    fn parse(letters: &str) -> Result<Options> {
        let mut options = Options::default();
        for letter in letters.chars() {
            match letter {
                'c' => options.case_insensitive = false,
                'i' => options.case_insensitive = true,
                'l' => options.literal = true,
                'm' | 'n' | 'p' => options.dot_matches_newline = false,
                's' => options.dot_matches_newline = true,
                ' ' | '\t' | '\n' => {}
                'g' => {
                    return exec_err!(
                        "regexp_extract: option 'g' (global replace) is only for regexp_replace"
                    );
                }
                other => {
                    return exec_err!(
                        "regexp_extract: unknown option '{other}' (known: c, i, l, m, n, p, s)"
                    );
                }
            }
        }
        Ok(options)
    }
}

fn compile(pattern: &str, options: Options, group: usize) -> Result<Regex> {
    let source = if options.literal {
        regex::escape(pattern)
    } else {
        pattern.to_owned()
    };
    let re = RegexBuilder::new(&source)
        .case_insensitive(options.case_insensitive)
        .dot_matches_new_line(options.dot_matches_newline)
        .size_limit(MAX_PATTERN_BYTES)
        .dfa_size_limit(MAX_PATTERN_BYTES)
        .build()
        .map_err(|e| exec_error(format!("pattern '{pattern}' is refused: {e}")))?;
    let groups = re.captures_len() - 1;
    if group > groups {
        return Err(exec_error(format!(
            "group {group} is out of range: pattern '{pattern}' has {groups} group(s)"
        )));
    }
    Ok(re)
}

fn extract(re: &Regex, text: &str, group: usize) -> String {
    let found = if group == 0 {
        re.find(text).map(|m| m.as_str())
    } else {
        re.captures(text)
            .and_then(|c| c.get(group).map(|m| m.as_str()))
    };
    found.unwrap_or_default().to_owned()
}

fn strings(array: &ArrayRef) -> Result<&StringArray> {
    match array.as_string_opt::<i32>() {
        Some(strings) => Ok(strings),
        None => exec_err!("regexp_extract takes strings, got {}", array.data_type()),
    }
}

fn null_result(all_scalar: bool, rows: usize) -> ColumnarValue {
    if all_scalar {
        ColumnarValue::Scalar(ScalarValue::Utf8(None))
    } else {
        ColumnarValue::Array(Arc::new(StringArray::new_null(rows)))
    }
}

fn exec_error(message: String) -> datafusion::common::DataFusionError {
    datafusion::common::DataFusionError::Execution(format!("regexp_extract: {message}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn run(
        text: Option<&str>,
        pattern: &str,
        group: Option<i64>,
        options: Option<&str>,
    ) -> Result<Option<String>> {
        let text_array: ArrayRef = Arc::new(StringArray::from(vec![text, Some("x")]));
        let mut args = vec![
            ColumnarValue::Array(text_array),
            ColumnarValue::Scalar(ScalarValue::Utf8(Some(pattern.to_owned()))),
        ];
        // Options come fourth: a call with options names the group too (0 by default).
        if group.is_some() || options.is_some() {
            let g = group.unwrap_or(0);
            args.push(ColumnarValue::Scalar(ScalarValue::Int64(Some(g))));
        }
        if let Some(o) = options {
            args.push(ColumnarValue::Scalar(ScalarValue::Utf8(Some(o.to_owned()))));
        }
        let arg_fields = args
            .iter()
            .map(|a| Arc::new(arrow_schema::Field::new("a", a.data_type(), true)))
            .collect();
        let out = RegexpExtract::udf().invoke_with_args(ScalarFunctionArgs {
            args,
            arg_fields,
            number_rows: 2,
            return_field: Arc::new(arrow_schema::Field::new("r", DataType::Utf8, true)),
            config_options: Arc::new(datafusion::config::ConfigOptions::default()),
        })?;
        let ColumnarValue::Array(out) = out else {
            panic!("an array argument gives an array")
        };
        let out = out.as_string::<i32>();
        Ok(out.is_valid(0).then(|| out.value(0).to_owned()))
    }

    #[test]
    fn the_match_a_group_or_the_empty_string() {
        let url = "dnd://scans/day1/a.npy";
        assert_eq!(
            run(Some(url), r"^dnd://[^\\/]+", None, None)
                .unwrap()
                .unwrap(),
            "dnd://scans"
        );
        assert_eq!(
            run(Some(url), r"dnd://([^/]+)/(\w+)", Some(2), None)
                .unwrap()
                .unwrap(),
            "day1"
        );
        assert_eq!(
            run(Some("file:///a"), r"^dnd://[^\\/]+", None, None)
                .unwrap()
                .unwrap(),
            ""
        );
        // A group that takes no part in the match is empty too.
        assert_eq!(
            run(Some("ab"), "a(x)?b", Some(1), None).unwrap().unwrap(),
            ""
        );
        assert_eq!(run(None, "a", None, None).unwrap(), None);
    }

    #[test]
    fn options_follow_duckdb_letters() {
        assert_eq!(
            run(Some("ABC"), "b", None, Some("i")).unwrap().unwrap(),
            "B"
        );
        assert_eq!(run(Some("ABC"), "b", None, Some("c")).unwrap().unwrap(), "");
        assert_eq!(
            run(Some("a.c abc"), "a.c", None, Some("l"))
                .unwrap()
                .unwrap(),
            "a.c"
        );
        assert_eq!(run(Some("a\nb"), "a.b", None, None).unwrap().unwrap(), "");
        assert_eq!(
            run(Some("a\nb"), "a.b", None, Some("s")).unwrap().unwrap(),
            "a\nb"
        );
        assert_eq!(
            run(Some("a\nb"), "a.b", None, Some("s n"))
                .unwrap()
                .unwrap(),
            ""
        );
    }

    #[test]
    fn refusals_name_what_and_why() {
        let e = run(Some("a"), "(a)", Some(2), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("group 2 is out of range"), "{e}");
        let e = run(Some("a"), "(", None, None).unwrap_err().to_string();
        assert!(e.contains("pattern '(' is refused"), "{e}");
        let e = run(Some("a"), "a", None, Some("g"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("only for regexp_replace"), "{e}");
    }
}
