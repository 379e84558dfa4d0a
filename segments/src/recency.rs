//! `DIR/recency`: per-segment last-use counters, so eviction order survives a restart.
//!
//! Text, one `segment_id last_use` pair per line. The counters come from one logical clock
//! that every append, locate and read advances; a segment missing from the file counts as
//! never used (evicted first, lowest id first).

use std::collections::HashMap;
use std::path::Path;

const FILE: &str = "recency";

/// Parses recency text into `id -> last_use` (malformed lines are ignored).
pub(crate) fn parse(text: &str) -> HashMap<u64, u64> {
    text.lines()
        .filter_map(|line| {
            let (id, last) = line.split_once(' ')?;
            Some((id.trim().parse().ok()?, last.trim().parse().ok()?))
        })
        .collect()
}

/// Reads `dir/recency` (empty when absent or unreadable: recency is advisory).
pub(crate) fn load(dir: &Path) -> HashMap<u64, u64> {
    std::fs::read_to_string(dir.join(FILE))
        .map(|t| parse(&t))
        .unwrap_or_default()
}

/// Writes `dir/recency` atomically from `(id, last_use)` pairs.
pub(crate) fn save(dir: &Path, pairs: &[(u64, u64)], mode: u32) -> std::io::Result<()> {
    let text: String = pairs.iter().map(|(id, t)| format!("{id} {t}\n")).collect();
    Ok(crate::layout::write_atomic(
        dir,
        FILE,
        text.as_bytes(),
        mode,
    )?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn round_trip_and_garbage_tolerated() {
        let tmp = tempfile::tempdir().unwrap();
        save(tmp.path(), &[(3, 10), (12, 4)], 0o600).unwrap();
        let map = load(tmp.path());
        assert_eq!(map.get(&3), Some(&10));
        assert_eq!(map.get(&12), Some(&4));
        assert_eq!(parse("x y\n5 6\n7\n").len(), 1);
    }
}
