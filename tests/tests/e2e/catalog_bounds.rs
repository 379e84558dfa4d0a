//! The catalog engine's bounds, driven directly with small limits: SQL length,
//! rows, bytes, wall time, and hostile expressions that must not crash the server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tessera_e2e::*;
use tessera_server::{Catalog, CatalogError, CatalogLimits, Snapshot};
use tessera_server::{OpenOptions, Registry};

/// A registry of `n` tiny tensors.
fn registry(dir: &std::path::Path, n: u64) -> Registry {
    for i in 0..n {
        write_npy(
            &dir.join(format!("t{i:02}.npy")),
            "|u1",
            &[4],
            &pattern(4, i),
        );
    }
    let options = OpenOptions::with_target(8 << 20);
    let (registry, problems) = Registry::scan(&[dir.to_path_buf().into()], &options);
    assert!(problems.is_empty(), "{problems:?}");
    registry
}

#[tokio::test]
async fn rows_are_cut_at_the_bound_and_the_answer_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = Snapshot::of(&registry(dir.path(), 5));
    let catalog = Catalog::new(CatalogLimits {
        max_rows: 7,
        ..CatalogLimits::default()
    });
    let answer = catalog
        .query(&snapshot, "SELECT a.array_id FROM tensors a, tensors b")
        .await
        .unwrap();
    assert_eq!(answer.returned_rows, 7);
    assert!(answer.truncated);
    let rows: usize = answer.batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 7);
    let meta = answer.schema.metadata();
    assert_eq!(meta["returned_rows"], "7");
    assert_eq!(meta["truncated"], "True");
    assert!(!meta.contains_key("total_rows"));

    // Exactly at the bound is complete, not truncated.
    let catalog = Catalog::new(CatalogLimits {
        max_rows: 25,
        ..CatalogLimits::default()
    });
    let answer = catalog
        .query(&snapshot, "SELECT a.array_id FROM tensors a, tensors b")
        .await
        .unwrap();
    assert_eq!((answer.returned_rows, answer.truncated), (25, false));
    assert_eq!(answer.schema.metadata()["total_rows"], "25");
}

#[tokio::test]
async fn bytes_are_bounded_too() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = Snapshot::of(&registry(dir.path(), 10));
    let catalog = Catalog::new(CatalogLimits {
        max_bytes: 64 << 10,
        ..CatalogLimits::default()
    });
    let answer = catalog
        .query(&snapshot, "SELECT * FROM tensors a, tensors b, tensors c")
        .await
        .unwrap();
    assert!(answer.truncated);
    assert!(answer.returned_rows < 1000, "{}", answer.returned_rows);
}

#[tokio::test]
async fn a_huge_cross_product_is_refused_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = Snapshot::of(&registry(dir.path(), 12));
    let catalog = Catalog::new(CatalogLimits::default());
    // 12^9 ≈ 5.2e9 joined rows to fold. The join operator produces rows without yielding,
    // so no deadline could stop it once started: the plan is refused instead, at once.
    let started = std::time::Instant::now();
    let err = catalog
        .query(
            &snapshot,
            "SELECT max(a.nbytes + b.nbytes + c.nbytes + d.nbytes + e.nbytes + f.nbytes \
             + g.nbytes + h.nbytes + i.nbytes) FROM tensors a, tensors b, tensors c, \
             tensors d, tensors e, tensors f, tensors g, tensors h, tensors i",
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, CatalogError::TooExpensive { estimated, .. } if estimated > 10_000_000),
        "{err}"
    );
    assert!(err.to_string().contains("narrow it"), "{err}");
    assert!(
        started.elapsed() < CatalogLimits::default().timeout,
        "refused only after {:?}",
        started.elapsed()
    );
    // A join on equal columns over the same tables is fine.
    let answer = catalog
        .query(
            &snapshot,
            "SELECT count(*) AS n FROM tensors a JOIN tensors b ON a.array_id = b.array_id",
        )
        .await
        .unwrap();
    assert_eq!(answer.returned_rows, 1);
}

#[tokio::test]
async fn a_query_past_its_time_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = Snapshot::of(&registry(dir.path(), 12));
    // Planning alone takes longer than a millisecond.
    let catalog = Catalog::new(CatalogLimits {
        timeout: Duration::from_millis(1),
        ..CatalogLimits::default()
    });
    let err = catalog
        .query(
            &snapshot,
            "SELECT a.array_id FROM tensors a, tensors b, tensors c",
        )
        .await
        .unwrap_err();
    assert!(matches!(err, CatalogError::TimedOut(_)), "{err}");
    assert!(err.to_string().contains("narrow it"), "{err}");
}

#[tokio::test]
async fn overlong_and_deeply_nested_sql_is_refused_without_crashing() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = Snapshot::of(&registry(dir.path(), 1));
    let catalog = Catalog::new(CatalogLimits::default());

    let long = format!("SELECT '{}'", "x".repeat(20_000));
    let err = catalog.query(&snapshot, &long).await.unwrap_err();
    assert!(matches!(err, CatalogError::TooLong { .. }), "{err}");

    let nested = format!("SELECT {}1{}", "(".repeat(5_000), ")".repeat(5_000));
    let err = catalog.query(&snapshot, &nested).await.unwrap_err();
    assert!(
        err.to_string().to_lowercase().contains("recursion"),
        "{err}"
    );

    // A flat chain as long as the bound allows parses without recursion but builds
    // an 8,000-level tree; it overflowed a 2 MiB stack before queries got their
    // own thread, aborting the process.
    // Since issue 14 it is refused by its depth right after parsing (planning it kept a
    // worker busy for about a minute).
    let chain = format!("SELECT 1{}", "+1".repeat(8_000));
    assert!(chain.len() <= CatalogLimits::default().max_sql_bytes);
    let started = std::time::Instant::now();
    let err = catalog.query(&snapshot, &chain).await.unwrap_err();
    assert!(err.to_string().contains("levels deep"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // Whatever that answered, the engine still works.
    let answer = catalog.query(&snapshot, "SELECT 1 AS one").await.unwrap();
    assert_eq!(answer.returned_rows, 1);
}

#[tokio::test]
async fn a_query_the_gate_lets_through_still_frees_its_worker_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = Snapshot::of(&registry(dir.path(), 12));
    // No row gate, one worker: only the deadline can stop the 12^9-row fold, and the next
    // query gets the worker only once the first has really stopped.
    let timeout = Duration::from_millis(500);
    let catalog = Catalog::new(CatalogLimits {
        max_join_rows: u64::MAX,
        workers: 1,
        timeout,
        ..CatalogLimits::default()
    });
    let started = std::time::Instant::now();
    let err = catalog
        .query(
            &snapshot,
            "SELECT max(a.nbytes + b.nbytes + c.nbytes + d.nbytes + e.nbytes + f.nbytes \
             + g.nbytes + h.nbytes + i.nbytes) FROM tensors a, tensors b, tensors c, \
             tensors d, tensors e, tensors f, tensors g, tensors h, tensors i",
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ran longer than"), "{err}");
    let answer = catalog
        .query(&snapshot, "SELECT count(*) FROM tensors")
        .await
        .unwrap();
    assert_eq!(answer.returned_rows, 1);
    assert!(
        started.elapsed() < timeout * 4,
        "the worker was held for {:?}",
        started.elapsed()
    );
}
