//! Bounded property test of the catalog's SQL text (the CI counterpart of the `catalog_sql`
//! fuzz target): statements built from the catalog's own vocabulary, hostile ones included,
//! are answered or refused with a reason, within the time bound and the row bound, and the
//! engine still answers a plain query afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use proptest::prelude::*;
use tessera_e2e::*;
use tessera_server::{Catalog, CatalogLimits, Snapshot};
use tessera_server::{OpenOptions, Registry};

const WORDS: &[&str] = &[
    "SELECT",
    "FROM",
    "WHERE",
    "JOIN",
    "CROSS JOIN",
    "ON",
    "GROUP BY",
    "ORDER BY",
    "LIMIT",
    "UNION ALL",
    "WITH",
    "AS",
    "AND",
    "OR",
    "NOT",
    "COUNT(*)",
    "sources",
    "tensors",
    "t",
    "array_id",
    "dtype",
    "shape",
    "shape[1]",
    "nbytes",
    "path",
    "source_id",
    "is_resolved",
    "unresolved_reason",
    "unnest(shape)",
    "*",
    "=",
    "<",
    ">",
    "||",
    "1",
    "-1",
    "9223372036854775807",
    "NULL",
    "'x'",
    "CAST(nbytes AS VARCHAR)",
    "(",
    ")",
    ",",
    "generate_series(1, 100000000)",
    "range(1000000000)",
    "read_csv('/etc/passwd')",
    "COPY",
    "CREATE TABLE",
    "DROP TABLE tensors",
    "SET",
    ";",
    "'",
    "\"",
];

/// Expressions for the structured statements: columns of both tables, literals at edges,
/// and functions a hostile client would try (huge series, file readers).
const EXPRS: &[&str] = &[
    "*",
    "array_id",
    "dtype",
    "nbytes",
    "shape",
    "shape[1]",
    "path",
    "source_id",
    "is_resolved",
    "unresolved_reason",
    "COUNT(*)",
    "1",
    "-1",
    "9223372036854775807",
    "NULL",
    "'x'",
    "nbytes * 9223372036854775807",
    "CAST(nbytes AS VARCHAR)",
    "array_id || path",
    "unnest(shape)",
    "length(path)",
    "generate_series(1, 100000000)",
    "range(1000000000)",
    "read_csv('/etc/passwd')",
];
const TABLES: &[&str] = &[
    "tensors",
    "sources",
    "tensors t CROSS JOIN tensors u",
    "tensors t JOIN sources s ON true",
    "(SELECT * FROM tensors UNION ALL SELECT * FROM tensors)",
    "generate_series(1, 1000000000)",
    "read_parquet('/etc/passwd')",
    "information_schema.tables",
];
const OPS: &[&str] = &["=", "<", ">", "<>", "LIKE", "+", "/"];

fn statement() -> impl Strategy<Value = String> {
    let expr = proptest::sample::select(EXPRS);
    let structured = (
        proptest::collection::vec(expr.clone(), 1..4),
        proptest::sample::select(TABLES),
        proptest::option::of((expr.clone(), proptest::sample::select(OPS), expr.clone())),
        proptest::option::of(expr),
        proptest::option::of(0u64..5_000_000),
    )
        .prop_map(|(cols, table, filter, order, limit)| {
            let mut sql = format!("SELECT {} FROM {table}", cols.join(", "));
            if let Some((a, op, b)) = filter {
                sql += &format!(" WHERE {a} {op} {b}");
            }
            if let Some(o) = order {
                sql += &format!(" ORDER BY {o}");
            }
            if let Some(n) = limit {
                sql += &format!(" LIMIT {n}");
            }
            sql
        });
    // Free word salad: mostly parse errors, sometimes something odd that parses.
    let salad =
        proptest::collection::vec(proptest::sample::select(WORDS), 1..24).prop_map(|w| w.join(" "));
    prop_oneof![1 => salad, 3 => structured]
}

fn registry(dir: &std::path::Path) -> Registry {
    for i in 0..6u64 {
        write_npy(
            &dir.join(format!("t{i}.npy")),
            "<u2",
            &[4, 2],
            &pattern(16, i),
        );
    }
    std::fs::write(dir.join("bad.npy"), b"not a numpy file").unwrap();
    let options = OpenOptions::with_target(8 << 20);
    Registry::scan(&[dir.to_path_buf().into()], &options).0
}

#[test]
fn generated_sql_is_answered_or_refused_within_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = Snapshot::of(&registry(dir.path()));
    let limits = CatalogLimits {
        max_rows: 50,
        timeout: Duration::from_secs(5),
        ..CatalogLimits::default()
    };
    let catalog = Catalog::new(limits.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let answered = std::sync::atomic::AtomicU32::new(0);
    proptest!(config, |(sql in statement())| {
        let started = Instant::now();
        let result = runtime.block_on(catalog.query(&snapshot, &sql));
        prop_assert!(
            started.elapsed() < limits.timeout + Duration::from_secs(5),
            "{sql:?} took {:?}", started.elapsed()
        );
        match result {
            Ok(answer) => {
                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                prop_assert!(answer.returned_rows <= limits.max_rows, "{sql:?}");
            }
            Err(e) => prop_assert!(!e.to_string().is_empty(), "{sql:?}: an empty refusal"),
        }
    });
    let answered = answered.into_inner();
    eprintln!("{answered} of 96 generated statements answered, the rest refused");
    assert!(
        answered > 0,
        "the generator reaches execution, not only parse errors"
    );
    let answer = runtime
        .block_on(catalog.query(&snapshot, "SELECT count(*) AS n FROM tensors"))
        .unwrap();
    assert_eq!(answer.returned_rows, 1);
}
