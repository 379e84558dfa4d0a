//! Shared helper of the `grid_*` tests.

use tessera_server::Region;

/// Every index of a region, in C order.
pub fn indices(region: &Region) -> Vec<Vec<u64>> {
    let mut out = vec![vec![]];
    for (s, e) in region.start.iter().zip(&region.stop) {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                (*s..*e).map(move |i| {
                    let mut p = prefix.clone();
                    p.push(i);
                    p
                })
            })
            .collect();
    }
    out
}
