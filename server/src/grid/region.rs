//! Regions of a tensor: the protocol's [`Region`] box, and where a region's elements lie in a
//! source's memory order.

use std::ops::Range;

pub use tessera_proto::region::Region;

/// The element indices this region occupies in a tensor of `shape`, when
/// they form one contiguous run in the given memory order.
///
/// Returns `None` when the region is not one contiguous run, does not lie
/// inside `[0, shape)` at the same rank, or the arithmetic overflows. An
/// empty region yields an empty range starting at its start offset.
/// Multiply by the itemsize to get the byte range in the source.
pub fn element_range(region: &Region, shape: &[u64], fortran_order: bool) -> Option<Range<u64>> {
    if !Region::whole(shape).contains(region) {
        return None;
    }
    // Work in C order: for Fortran order the fastest axis is axis 0, so
    // reversing every axis list turns it into the C-order question.
    let order: Vec<usize> = if fortran_order {
        (0..shape.len()).rev().collect()
    } else {
        (0..shape.len()).collect()
    };
    let mut offset = 0u64;
    for &a in &order {
        offset = offset.checked_mul(shape[a])?.checked_add(region.start[a])?;
    }
    let count = region.num_elements()?;
    if count > 0 {
        // After the first axis taken with an extent above 1, every faster
        // axis must be whole.
        let first_wide = order
            .iter()
            .position(|&a| region.stop[a] - region.start[a] > 1);
        if let Some(p) = first_wide {
            let all_whole = order[p + 1..]
                .iter()
                .all(|&a| region.start[a] == 0 && region.stop[a] == shape[a]);
            if !all_whole {
                return None;
            }
        }
    }
    Some(offset..offset.checked_add(count)?)
}
