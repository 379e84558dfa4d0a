//! The chunk grid policy: table tests on the shapes of chunk-cache.md §1 and
//! property tests of cap, tiling, contiguity and balance.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::grid_support::indices;
use proptest::prelude::*;
use tessera_server::{
    ChunkGrid, DEFAULT_TARGET_CHUNK_BYTES, GridError, MAX_CHUNK_BYTES, Region, element_range,
};

const MIB: u64 = 1 << 20;

/// Plans a C-order grid and returns (chunk shape, number of chunks).
fn plan_c(shape: &[u64], itemsize: u64, target: u64) -> (Vec<u64>, u64) {
    let g = ChunkGrid::plan(shape, itemsize, false, target).unwrap();
    (g.chunk_shape().to_vec(), g.num_chunks())
}

/// True when a chunk extent has the contiguous form for the given order:
/// in C order `(1, …, 1, k, full, …, full)`, mirrored for Fortran order.
fn has_contiguous_form(shape: &[u64], chunk: &[u64], fortran_order: bool) -> bool {
    let mut axes: Vec<usize> = (0..shape.len()).collect();
    if fortran_order {
        axes.reverse();
    }
    match axes.iter().position(|&a| chunk[a] != 1) {
        None => true,
        Some(p) => axes[p + 1..].iter().all(|&a| chunk[a] == shape[a]),
    }
}

#[test]
fn reference_table_at_the_default_target() {
    assert_eq!(DEFAULT_TARGET_CHUNK_BYTES, 8 * MIB);
    let t = DEFAULT_TARGET_CHUNK_BYTES;
    // One 2048×2048 u16 plane is exactly 8 MiB: one plane per chunk.
    assert_eq!(
        plan_c(&[8, 4, 2048, 2048], 2, t),
        (vec![1, 1, 2048, 2048], 32)
    );
    // 16 MiB rows-of-planes: 8 bands of 512 whole rows.
    assert_eq!(plan_c(&[4096, 4096], 4, t), (vec![512, 4096], 8));
    // 4097 columns: bands of whole rows, balanced (8 × 456 + 448).
    assert_eq!(plan_c(&[4096, 4097], 4, t), (vec![456, 4097], 9));
    // A 900 MB plane: bands of 278 rows (107 × 278 + 254).
    assert_eq!(
        plan_c(&[3, 30000, 30000], 1, t),
        (vec![1, 278, 30000], 3 * 108)
    );
    // 1-D: the only axis is split, balanced (95 × 1041667 + 1041635).
    assert_eq!(plan_c(&[100_000_000], 8, t), (vec![1_041_667], 96));
    // 128 MiB planes: bands of 512 rows of one plane.
    assert_eq!(plan_c(&[50, 8192, 8192], 2, t), (vec![1, 512, 8192], 800));
    assert_eq!(
        plan_c(&[20, 3, 100, 2048, 2048], 2, t),
        (vec![1, 1, 1, 2048, 2048], 6000)
    );
    // Small tensors are one chunk.
    assert_eq!(plan_c(&[512, 512], 2, t), (vec![512, 512], 1));
}

#[test]
fn reference_table_at_the_cap() {
    let t = MAX_CHUNK_BYTES;
    // The reference splits the 4 channels' Y into quarters; we split T.
    assert_eq!(
        plan_c(&[8, 4, 2048, 2048], 2, t),
        (vec![2, 4, 2048, 2048], 4)
    );
    // Exactly 64 MiB is one chunk.
    assert_eq!(plan_c(&[4096, 4096], 4, t), (vec![4096, 4096], 1));
    // The reference leaves a 1-column sliver; we cut two equal row bands.
    assert_eq!(plan_c(&[4096, 4097], 4, t), (vec![2048, 4097], 2));
    // 13 × 2143 + 2141 rows instead of 14 × 2142 + 12.
    assert_eq!(
        plan_c(&[3, 30000, 30000], 1, t),
        (vec![1, 2143, 30000], 3 * 14)
    );
    // 11 × 8333334 + 8333326 instead of 12 × 8333333 + 4.
    assert_eq!(plan_c(&[100_000_000], 8, t), (vec![8_333_334], 12));
    assert_eq!(plan_c(&[50, 8192, 8192], 2, t), (vec![1, 4096, 8192], 100));
    assert_eq!(
        plan_c(&[20, 3, 100, 2048, 2048], 2, t),
        (vec![1, 1, 8, 2048, 2048], 20 * 3 * 13)
    );
    assert_eq!(plan_c(&[1000, 1000, 100], 4, t), (vec![167, 1000, 100], 6));
    assert_eq!(
        plan_c(&[100, 2048, 2048, 3], 1, t),
        (vec![5, 2048, 2048, 3], 20)
    );
    // Targets above the cap are clamped to it.
    assert_eq!(plan_c(&[4096, 4097], 4, u64::MAX), (vec![2048, 4097], 2));
}

#[test]
fn a_row_larger_than_the_target_splits_the_last_axis() {
    // One row of 10^7 f64 is 80 MB: each chunk is a run of one row.
    assert_eq!(
        plan_c(&[2, 10_000_000], 8, DEFAULT_TARGET_CHUNK_BYTES),
        (vec![1, 1_000_000], 20)
    );
}

#[test]
fn target_is_clamped_to_at_least_one_element() {
    assert_eq!(plan_c(&[3, 4], 8, 0), (vec![1, 1], 12));
    assert_eq!(plan_c(&[3, 4], 8, 1), (vec![1, 1], 12));
    assert_eq!(plan_c(&[3, 4], 8, 16), (vec![1, 2], 6));
    assert_eq!(plan_c(&[3, 4], 8, 32), (vec![1, 4], 3));
    assert_eq!(plan_c(&[3, 4], 8, 96), (vec![3, 4], 1));
}

#[test]
fn fortran_order_mirrors_the_policy() {
    let g = ChunkGrid::plan(&[8, 4, 2048, 2048], 2, true, DEFAULT_TARGET_CHUNK_BYTES).unwrap();
    assert_eq!(g.chunk_shape(), [8, 4, 2048, 64]);
    assert_eq!(g.num_chunks(), 32);
    let g = ChunkGrid::plan(&[4097, 4096], 4, true, MAX_CHUNK_BYTES).unwrap();
    assert_eq!(g.chunk_shape(), [4097, 2048]);
    // A 1-D tensor is the same in either order.
    let c = ChunkGrid::plan(&[100_000_000], 8, false, MAX_CHUNK_BYTES).unwrap();
    let f = ChunkGrid::plan(&[100_000_000], 8, true, MAX_CHUNK_BYTES).unwrap();
    assert_eq!(c, f);
}

#[test]
fn empty_tensors_are_one_whole_chunk() {
    for fortran in [false, true] {
        let g = ChunkGrid::plan(&[0, 5, 7], 4, fortran, 1).unwrap();
        assert_eq!(g.chunk_shape(), [0, 5, 7]);
        assert_eq!(g.grid_dims(), [1, 1, 1]);
        assert_eq!(g.num_chunks(), 1);
        let cells: Vec<Region> = g.cells(&Region::whole(&[0, 5, 7])).unwrap().collect();
        assert_eq!(
            cells,
            [Region::new(vec![0, 0, 0], vec![0, 5, 7])],
            "fortran={fortran}"
        );
    }
    // Even a huge empty tensor is fine.
    let g = ChunkGrid::plan(&[u64::MAX, 0, u64::MAX], 8, false, 1).unwrap();
    assert_eq!(g.num_chunks(), 1);
}

#[test]
fn plan_refusals() {
    assert_eq!(
        ChunkGrid::plan(&[], 1, false, MIB).unwrap_err(),
        GridError::RankZero
    );
    assert_eq!(
        ChunkGrid::plan(&[4], 0, false, MIB).unwrap_err(),
        GridError::ItemsizeZero
    );
    let e = ChunkGrid::plan(&[4], MAX_CHUNK_BYTES + 1, false, MIB).unwrap_err();
    assert_eq!(
        e.to_string(),
        "itemsize 67108865 exceeds the chunk cap of 67108864 bytes (64 MiB)"
    );
    // One element of exactly 64 MiB is allowed.
    assert_eq!(plan_c(&[3], MAX_CHUNK_BYTES, MIB), (vec![1], 3));
    let e = ChunkGrid::plan(&[1 << 32, 1 << 32], 2, false, MIB).unwrap_err();
    assert!(matches!(e, GridError::TooLarge { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "a tensor of shape [4294967296, 4294967296] with itemsize 2 is larger than 2^64 bytes"
    );
    let e = ChunkGrid::plan(&[1; 33], 1, false, MIB).unwrap_err();
    assert_eq!(
        e.to_string(),
        "a tensor with 33 axes is not supported: at most 32 axes"
    );
    assert!(ChunkGrid::plan(&[1; 32], 1, false, MIB).is_ok());
    assert_eq!(
        GridError::RankZero.to_string(),
        "a tensor with 0 axes (a scalar) is not supported: at least 1 axis is needed"
    );
    assert_eq!(
        GridError::ItemsizeZero.to_string(),
        "itemsize 0 is not valid: an element needs at least 1 byte"
    );
}

/// The flat index of `idx` in `shape` for the given order.
fn flat_index(idx: &[u64], shape: &[u64], fortran_order: bool) -> u64 {
    let mut axes: Vec<usize> = (0..shape.len()).collect();
    if fortran_order {
        axes.reverse();
    }
    axes.iter().fold(0, |acc, &a| acc * shape[a] + idx[a])
}

fn small_tensor() -> impl Strategy<Value = (Vec<u64>, u64, bool, u64)> {
    (
        prop::collection::vec(0u64..=9, 1..=4),
        prop::sample::select(vec![1u64, 2, 3, 4, 8, 16]),
        any::<bool>(),
        0u64..=3000,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Chunks stay within the (clamped) target and the cap, tile the tensor
    /// exactly once, and each is one contiguous run of the source.
    #[test]
    fn chunks_tile_and_are_contiguous((shape, itemsize, fortran, target) in small_tensor()) {
        let g = ChunkGrid::plan(&shape, itemsize, fortran, target).unwrap();
        prop_assert_eq!(g.shape(), &shape[..]);
        let volume: u64 = shape.iter().product();
        if volume > 0 {
            prop_assert!(g.chunk_bytes(itemsize) <= target.max(itemsize));
            prop_assert!(g.chunk_bytes(itemsize) <= MAX_CHUNK_BYTES);
            prop_assert!(has_contiguous_form(&shape, g.chunk_shape(), fortran));
        }
        let mut seen = vec![0u8; volume as usize];
        let mut count = 0u64;
        for cell in g.cells(&Region::whole(&shape)).unwrap() {
            count += 1;
            prop_assert!(g.is_cell(&cell), "{:?}", cell);
            let flats: Vec<u64> = indices(&cell)
                .iter()
                .map(|i| flat_index(i, &shape, fortran))
                .collect();
            for &f in &flats {
                seen[f as usize] += 1;
            }
            // Contiguous: the flat indices are one run.
            let lo = flats.iter().min().copied().unwrap_or(0);
            let hi = flats.iter().max().map_or(lo, |m| m + 1);
            prop_assert_eq!(hi - lo, flats.len() as u64, "{:?} not contiguous", cell);
            if volume > 0 {
                prop_assert_eq!(element_range(&cell, &shape, fortran), Some(lo..hi));
            }
        }
        prop_assert_eq!(count, g.num_chunks());
        prop_assert!(seen.iter().all(|&n| n == 1), "not tiled exactly once");
    }

    /// Along the split axis the grid has the fewest chunks the target allows,
    /// and among such grids the last chunk is as long as possible.
    #[test]
    fn splits_are_balanced(
        shape in prop::collection::vec(1u64..=5000, 1..=3),
        itemsize in prop::sample::select(vec![1u64, 2, 4, 8]),
        target in 1u64..=200_000,
    ) {
        let g = ChunkGrid::plan(&shape, itemsize, false, target).unwrap();
        let target = target.max(itemsize);
        let chunk = g.chunk_shape();
        // The split axis: the first axis not taken one index at a time, or
        // the last axis.
        let axis = chunk.iter().position(|&c| c != 1).unwrap_or(shape.len() - 1);
        let step: u64 = itemsize * shape[axis + 1..].iter().product::<u64>();
        let per = target / step;
        prop_assert!(per >= 1);
        let d = shape[axis];
        let n = d.div_ceil(chunk[axis]);
        let last = d - (n - 1) * chunk[axis];
        for k in 1..=per.min(d) {
            let nk = d.div_ceil(k);
            prop_assert!(nk >= n, "k={} gives {} chunks < {}", k, nk, n);
            if nk == n {
                prop_assert!(d - (n - 1) * k <= last);
            }
        }
    }
}
