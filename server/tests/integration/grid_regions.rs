//! Snapping requests to the grid, enumerating cells, validating cells, and
//! the `Region` helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::grid_support::indices;
use proptest::prelude::*;
use tessera_server::{ChunkGrid, GridError, Region, element_range};

fn r(start: &[u64], stop: &[u64]) -> Region {
    Region::new(start.to_vec(), stop.to_vec())
}

#[test]
fn worked_example_of_the_protocol() {
    // biopb-protocol.md §2.4: 64×64 |u1, 16×16 grid, slice [3,5]..[40,50].
    let g = ChunkGrid::with_chunk_shape(&[64, 64], 1, &[16, 16]).unwrap();
    let request = r(&[3, 5], &[40, 50]);
    let realized = g.snap(&request).unwrap();
    assert_eq!(realized, r(&[0, 0], &[48, 64]));
    assert_eq!(realized.shape(), [48, 64]);
    let cells: Vec<Region> = g.cells(&request).unwrap().collect();
    assert_eq!(cells.len(), 12);
    assert_eq!(cells[0], r(&[0, 0], &[16, 16]));
    assert_eq!(cells[1], r(&[0, 16], &[16, 32]));
    assert_eq!(cells[4], r(&[16, 0], &[32, 16]));
    assert_eq!(cells[11], r(&[32, 48], &[48, 64]));
    assert_eq!(g.cells(&realized).unwrap().collect::<Vec<_>>(), cells);
    // Endpoint bounds relative to the realized start.
    let relative = cells[11].relative_to(&realized).unwrap();
    assert_eq!(relative, r(&[32, 48], &[48, 64]));
}

#[test]
fn snapping_clamps_to_the_shape() {
    let g = ChunkGrid::with_chunk_shape(&[10, 7], 4, &[4, 3]).unwrap();
    assert_eq!(g.grid_dims(), [3, 3]);
    assert_eq!(g.snap(&r(&[5, 6], &[9, 7])).unwrap(), r(&[4, 6], &[10, 7]));
    assert_eq!(g.snap(&r(&[8, 0], &[10, 1])).unwrap(), r(&[8, 0], &[10, 3]));
    let cells: Vec<Region> = g.cells(&r(&[5, 6], &[9, 7])).unwrap().collect();
    assert_eq!(cells, [r(&[4, 6], &[8, 7]), r(&[8, 6], &[10, 7])]);
    // Oversized chunk extents are clamped to the axis.
    let g = ChunkGrid::with_chunk_shape(&[10, 7], 4, &[100, 3]).unwrap();
    assert_eq!(g.chunk_shape(), [10, 3]);
}

#[test]
fn region_refusals_name_the_axis() {
    let g = ChunkGrid::with_chunk_shape(&[64, 64], 1, &[16, 16]).unwrap();
    let cases = [
        (
            r(&[0], &[4]),
            "region Region { start: [0], stop: [4] } has 1 axes but the tensor has 2",
        ),
        (r(&[0, 5], &[4, 3]), "region start 5 > stop 3 on axis 1"),
        (
            r(&[0, 0], &[65, 3]),
            "region stop 65 exceeds the length 64 of axis 0",
        ),
        (
            r(&[0, 9], &[4, 9]),
            "region selects no element on axis 1 (start == stop == 9); zero-extent slices \
             are refused unless the axis itself has length 0",
        ),
    ];
    for (region, message) in cases {
        assert_eq!(g.snap(&region).unwrap_err().to_string(), message);
        assert_eq!(g.cells(&region).unwrap_err().to_string(), message);
    }
    assert!(matches!(
        g.snap(&r(&[0, 0], &[1])).unwrap_err(),
        GridError::RegionRank { rank: 2, .. }
    ));
}

#[test]
fn explicit_chunk_shape_refusals() {
    let e = ChunkGrid::with_chunk_shape(&[64, 64], 1, &[16]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "chunk shape [16] has 1 axes but the tensor has 2"
    );
    let e = ChunkGrid::with_chunk_shape(&[64, 64], 1, &[16, 0]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "chunk shape [16, 0] has extent 0 on axis 1: every extent must be at least 1"
    );
    let e = ChunkGrid::with_chunk_shape(&[8192, 8192], 2, &[4097, 8192]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "chunk shape [4097, 8192] is 67125248 bytes, over the chunk cap of 67108864 bytes (64 MiB)"
    );
    // Exactly 64 MiB is allowed.
    let g = ChunkGrid::with_chunk_shape(&[8192, 8192], 2, &[4096, 8192]).unwrap();
    assert_eq!(g.chunk_bytes(2), 64 << 20);
    assert_eq!(
        ChunkGrid::with_chunk_shape(&[], 1, &[]).unwrap_err(),
        GridError::RankZero
    );
    // An empty tensor keeps its single whole chunk.
    let g = ChunkGrid::with_chunk_shape(&[4, 0], 1, &[2, 2]).unwrap();
    assert_eq!(g.chunk_shape(), [4, 0]);
    assert_eq!(g.num_chunks(), 1);
}

#[test]
fn empty_axes_in_requests() {
    let g = ChunkGrid::plan(&[0, 5], 4, false, 8).unwrap();
    // A zero-length axis can only be requested as [0, 0).
    let realized = g.snap(&r(&[0, 1], &[0, 3])).unwrap();
    assert_eq!(realized, r(&[0, 0], &[0, 5]));
    let cells: Vec<Region> = g.cells(&r(&[0, 1], &[0, 3])).unwrap().collect();
    assert_eq!(cells, [r(&[0, 0], &[0, 5])]);
    assert!(g.is_cell(&r(&[0, 0], &[0, 5])));
    assert!(!g.is_cell(&r(&[0, 0], &[0, 3])));
    assert!(!g.is_cell(&r(&[0, 0], &[1, 5])));
    assert_eq!(
        g.snap(&r(&[0, 2], &[0, 2])).unwrap_err(),
        GridError::RegionEmpty { axis: 1, at: 2 }
    );
}

#[test]
fn forged_cells_are_rejected() {
    let g = ChunkGrid::with_chunk_shape(&[10, 7], 1, &[4, 3]).unwrap();
    assert!(g.is_cell(&r(&[8, 6], &[10, 7])));
    assert!(g.is_cell(&r(&[0, 0], &[4, 3])));
    for forged in [
        r(&[8, 6], &[12, 9]),  // not clipped to the shape
        r(&[1, 0], &[5, 3]),   // start off the grid
        r(&[0, 0], &[2, 3]),   // a partial cell
        r(&[0, 0], &[8, 3]),   // two cells
        r(&[12, 0], &[12, 3]), // beyond the tensor
        r(&[0, 0], &[4, 0]),   // reversed
        r(&[0], &[4]),         // wrong rank
        r(&[0, 0], &[4]),      // ragged
        r(&[u64::MAX - 1, 0], &[u64::MAX, 3]),
    ] {
        assert!(!g.is_cell(&forged), "{forged:?}");
    }
    // An empty box at the far edge, on the grid, is not a cell.
    let g = ChunkGrid::with_chunk_shape(&[8, 6], 1, &[4, 3]).unwrap();
    assert!(g.is_cell(&r(&[4, 3], &[8, 6])));
    assert!(!g.is_cell(&r(&[8, 0], &[8, 3])));
    assert!(!g.is_cell(&r(&[0, 6], &[4, 6])));
}

#[test]
fn region_helpers() {
    let a = r(&[2, 3], &[5, 9]);
    assert_eq!(a.rank(), 2);
    assert_eq!(a.shape(), [3, 6]);
    assert_eq!(a.num_elements(), Some(18));
    assert!(!a.is_empty());
    assert!(r(&[2, 3], &[2, 9]).is_empty());
    assert_eq!(r(&[2, 3], &[2, 9]).num_elements(), Some(0));
    assert_eq!(r(&[0, 0], &[u64::MAX, 3]).num_elements(), None);
    assert_eq!(Region::whole(&[4, 5]), r(&[0, 0], &[4, 5]));
    assert!(Region::whole(&[5, 9]).contains(&a));
    assert!(!a.contains(&Region::whole(&[5, 9])));
    assert!(!a.contains(&r(&[2], &[5])));
    assert_eq!(
        a.relative_to(&r(&[1, 1], &[6, 9])),
        Some(r(&[1, 2], &[4, 8]))
    );
    assert_eq!(a.relative_to(&r(&[3, 0], &[6, 9])), None);
}

#[test]
fn element_ranges() {
    let shape = [4, 5, 6];
    // Rows 2..4 of plane 1: one run in C order.
    assert_eq!(
        element_range(&r(&[1, 2, 0], &[2, 4, 6]), &shape, false),
        Some(42..54)
    );
    // A column block is not contiguous in C order.
    assert_eq!(
        element_range(&r(&[1, 2, 0], &[2, 4, 3]), &shape, false),
        None
    );
    // Mirrored for Fortran order: axis 0 fastest.
    assert_eq!(
        element_range(&r(&[0, 0, 2], &[4, 5, 3]), &shape, true),
        Some(40..60)
    );
    assert_eq!(
        element_range(&r(&[0, 0, 2], &[4, 5, 3]), &shape, false),
        None
    );
    // A single element, an empty region, and refusals.
    assert_eq!(
        element_range(&r(&[3, 4, 5], &[4, 5, 6]), &shape, false),
        Some(119..120)
    );
    assert_eq!(
        element_range(&r(&[1, 2, 3], &[1, 4, 6]), &shape, false),
        Some(45..45)
    );
    assert_eq!(
        element_range(&r(&[0, 0, 0], &[4, 5, 7]), &shape, false),
        None
    );
    assert_eq!(element_range(&r(&[0, 0], &[4, 5]), &shape, false), None);
}

fn grid_and_region() -> impl Strategy<Value = (ChunkGrid, Region)> {
    prop::collection::vec((1u64..=12, 1u64..=14), 1..=4).prop_flat_map(|axes| {
        let shape: Vec<u64> = axes.iter().map(|a| a.0).collect();
        let chunk: Vec<u64> = axes.iter().map(|a| a.1).collect();
        let grid = ChunkGrid::with_chunk_shape(&shape, 1, &chunk).unwrap();
        let bounds: Vec<_> = shape
            .iter()
            .map(|&d| (0..d).prop_flat_map(move |s| (Just(s), s + 1..=d)))
            .collect();
        (Just(grid), bounds).prop_map(|(grid, b)| {
            let region = Region::new(
                b.iter().map(|x| x.0).collect(),
                b.iter().map(|x| x.1).collect(),
            );
            (grid, region)
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// The snapped region contains the request, lies on the grid, and is
    /// tiled exactly once by the cells, each a genuine grid cell.
    #[test]
    fn cells_tile_the_snapped_region((grid, request) in grid_and_region()) {
        let shape = grid.shape().to_vec();
        let chunk = grid.chunk_shape().to_vec();
        let snapped = grid.snap(&request).unwrap();
        prop_assert!(snapped.contains(&request));
        for a in 0..shape.len() {
            prop_assert_eq!(snapped.start[a] % chunk[a], 0);
            prop_assert!(snapped.stop[a] % chunk[a] == 0 || snapped.stop[a] == shape[a]);
            prop_assert!(snapped.start[a] + chunk[a] > request.start[a]);
            prop_assert!(snapped.stop[a] < request.stop[a] + chunk[a]);
        }
        let ext = snapped.shape();
        let mut seen = vec![0u8; snapped.num_elements().unwrap() as usize];
        let mut count = 0usize;
        for cell in grid.cells(&request).unwrap() {
            count += 1;
            prop_assert!(grid.is_cell(&cell));
            let rel = cell.relative_to(&snapped).unwrap();
            for idx in indices(&rel) {
                let flat = (0..idx.len()).fold(0u64, |acc, a| acc * ext[a] + idx[a]);
                seen[flat as usize] += 1;
            }
            // Shifted or stretched copies are not cells.
            for (a, &c) in chunk.iter().enumerate() {
                if c > 1 {
                    let mut shifted = cell.clone();
                    shifted.start[a] += 1;
                    shifted.stop[a] += 1;
                    prop_assert!(!grid.is_cell(&shifted));
                }
                let mut longer = cell.clone();
                longer.stop[a] += 1;
                prop_assert!(!grid.is_cell(&longer));
                let mut shorter = cell.clone();
                shorter.stop[a] -= 1;
                prop_assert!(!grid.is_cell(&shorter));
            }
        }
        let expected: u64 = (0..shape.len())
            .map(|a| snapped.stop[a].div_ceil(chunk[a]) - snapped.start[a] / chunk[a])
            .product();
        prop_assert_eq!(count as u64, expected);
        prop_assert!(seen.iter().all(|&n| n == 1));
        let via_request: Vec<Region> = grid.cells(&request).unwrap().collect();
        let via_snapped: Vec<Region> = grid.cells(&snapped).unwrap().collect();
        prop_assert_eq!(via_snapped, via_request);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// `cell_at` walks the cells of the whole tensor in the order `cells` yields
    /// them, `cell_index` maps each back to its position, and both refuse what is
    /// past the end or not a cell.
    #[test]
    fn cell_positions_follow_c_order((grid, _request) in grid_and_region()) {
        let whole = Region::new(vec![0; grid.shape().len()], grid.shape().to_vec());
        let cells: Vec<Region> = grid.cells(&whole).unwrap().collect();
        prop_assert_eq!(cells.len() as u64, grid.num_chunks());
        for (i, cell) in cells.iter().enumerate() {
            prop_assert_eq!(grid.cell_at(i as u64), Some(cell.clone()));
            prop_assert_eq!(grid.cell_index(cell), Some(i as u64));
        }
        prop_assert_eq!(grid.cell_at(grid.num_chunks()), None);
        prop_assert_eq!(grid.cell_index(&whole).is_some(), cells.len() == 1);
    }
}
