//! `catalog_children` on a catalog of 100,000 sources: every level answers correctly, and
//! the time of each is measured and printed (the target is ≤ 50 ms a level; run with
//! `--nocapture` to read it). No assertion on time: a loaded machine must not fail a test.

use std::time::{Duration, Instant};

use tessera_server::{CATALOG_TREE_MAX_LIMIT as MAX_LIMIT, TreeIndex};

/// 100 plates × 100 wells × 10 fields under one deep root, as a screen is laid out: each
/// source's path segments and id.
fn screen() -> Vec<(Vec<String>, String)> {
    let mut sources = Vec::with_capacity(100_000);
    for plate in 0..100 {
        for well in 0..100 {
            for field in 0..10 {
                let parts = ["srv", "data", "screens", "2026"]
                    .iter()
                    .map(|s| s.to_string())
                    .chain([
                        format!("plate{plate:03}"),
                        format!("well{well:03}"),
                        format!("field{field}.npy"),
                    ])
                    .collect();
                sources.push((parts, format!("p{plate}.w{well}.f{field}")));
            }
        }
    }
    sources
}

/// The best of a few runs of `f`, and its last answer.
fn timed<T>(mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut answer = None;
    for _ in 0..5 {
        let started = Instant::now();
        answer = Some(f());
        best = best.min(started.elapsed());
    }
    match answer {
        Some(answer) => (best, answer),
        None => unreachable!("five runs give an answer"),
    }
}

#[test]
fn one_level_of_100_000_sources() {
    let sources = screen();
    let started = Instant::now();
    let tree = TreeIndex::build(sources);
    let built = started.elapsed();
    assert_eq!(tree.len(), 100_000);

    let (top_time, top) = timed(|| tree.children("", 2000));
    assert_eq!(top.folders.len(), 1);
    assert_eq!(top.folders[0].name, "srv/data/screens/2026");

    let (plates_time, plates) = timed(|| tree.children("srv/data/screens/2026", 2000));
    assert_eq!(plates.folders.len(), 100);
    assert!(!plates.truncated);

    let (wells_time, wells) = timed(|| tree.children("srv/data/screens/2026/plate042", 2000));
    assert_eq!(wells.folders.len(), 100);
    assert_eq!(
        wells.folders[7].key,
        "srv/data/screens/2026/plate042/well007"
    );

    let (fields_time, fields) =
        timed(|| tree.children("srv/data/screens/2026/plate042/well007", 2000));
    assert_eq!(fields.sources.len(), 10);
    assert_eq!(fields.sources[3].source_id, "p42.w7.f3");

    // The worst case: one flat folder of 100,000 sources, listed in full.
    let flat = TreeIndex::build((0..100_000).map(|i| {
        (
            vec!["flat".to_string(), format!("s{i:06}.npy")],
            format!("s{i}"),
        )
    }));
    let (flat_time, level) = timed(|| flat.children("flat", MAX_LIMIT));
    assert_eq!(level.sources.len(), 100_000);
    assert!(!level.truncated);

    println!(
        "catalog_children over 100,000 sources (best of 5): build {built:?}; top {top_time:?}; \
         100 plates {plates_time:?}; 100 wells {wells_time:?}; 10 fields {fields_time:?}; \
         flat folder of 100,000 listed whole {flat_time:?} (target <= 50ms a level)"
    );
}
