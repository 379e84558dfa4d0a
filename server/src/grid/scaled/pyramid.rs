//! The pyramid a descriptor advertises: level 0 and at most two computed levels, by the
//! reference server's policy, so a viewer sees the same levels from either server.
//!
//! * **The 2-D level** halves X and Y (by `downscale_factor`) until the plane fits
//!   `plane_max_pixels` and X and Y each fit `threshold`. An axis already at or below
//!   the floor `min(pixel_budget_cubic_root, threshold)` is not halved further.
//! * **The 3-D level** continues from the 2-D one and also halves Z until the volume
//!   `X·Y·Z` fits `pixel_budget_cubic_root³` (a tensor without a Z axis counts Z as 1).
//!
//! Each is emitted only if it shrinks something. Y and X are the axes labelled `y` and
//! `x`, else the last two; Z is the axis labelled `z` (never a guess: an unlabelled
//! leading axis may be time or channel). Extents are `ceil(dim / scale)`. A factor never
//! exceeds its axis length, so every advertised level is a valid `scale_hint`.

use crate::grid::scaled::Method;
use crate::grid::{AxisRole, normalize_label};

/// The knobs of the policy (the `[pyramid]` table of the config file).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyramidPolicy {
    /// The method advertised for computed levels.
    pub method: Method,
    /// The largest X or Y extent of the 2-D level.
    pub threshold: u64,
    /// The factor one step multiplies the scale by (at least 2).
    pub downscale_factor: u64,
    /// The cube root of the 3-D level's voxel budget.
    pub pixel_budget_cubic_root: u64,
    /// The largest X·Y of the 2-D level.
    pub plane_max_pixels: u64,
}

impl Default for PyramidPolicy {
    fn default() -> Self {
        Self {
            method: Method::Nearest,
            threshold: 4096,
            downscale_factor: 2,
            pixel_budget_cubic_root: 448,
            plane_max_pixels: 4_000_000,
        }
    }
}

impl PyramidPolicy {
    /// The method advertised for computed levels.
    pub fn method(&self) -> Method {
        self.method
    }

    /// The scale factors of each level, level 0 (all ones) first, coarsest last.
    pub fn levels(&self, shape: &[u64], dim_labels: &[String]) -> Vec<Vec<u64>> {
        let rank = shape.len();
        let mut levels = vec![vec![1; rank]];
        if rank < 2 {
            return levels;
        }
        let role_index = |role: AxisRole| {
            dim_labels
                .iter()
                .position(|label| normalize_label(label) == Some(role))
        };
        let (y, x) = match (role_index(AxisRole::Y), role_index(AxisRole::X)) {
            (Some(y), Some(x)) if y != x => (y, x),
            _ => (rank - 2, rank - 1),
        };
        let z = role_index(AxisRole::Depth).filter(|&z| z != y && z != x);
        let factor = self.downscale_factor.max(2);
        let floor = self.pixel_budget_cubic_root.min(self.threshold);
        let extent = |axis: usize, s: u64| shape[axis].div_ceil(s);
        // One step on an axis: multiply while its extent is above the floor, never past
        // the axis length.
        let step = |axis: usize, s: u64| {
            if extent(axis, s) > floor {
                s.saturating_mul(factor).min(shape[axis].max(1))
            } else {
                s
            }
        };
        let vector = |sx: u64, sy: u64, sz: u64| {
            let mut v = vec![1; rank];
            v[x] = sx;
            v[y] = sy;
            if let Some(z) = z {
                v[z] = sz;
            }
            v
        };

        let (mut sx, mut sy) = (1u64, 1u64);
        loop {
            let (lx, ly) = (extent(x, sx), extent(y, sy));
            if lx.saturating_mul(ly) <= self.plane_max_pixels
                && lx <= self.threshold
                && ly <= self.threshold
            {
                break;
            }
            let (nx, ny) = (step(x, sx), step(y, sy));
            if (nx, ny) == (sx, sy) {
                break;
            }
            (sx, sy) = (nx, ny);
        }
        if (sx, sy) != (1, 1) {
            levels.push(vector(sx, sy, 1));
        }

        let budget = self.pixel_budget_cubic_root.saturating_pow(3);
        let (mut tx, mut ty, mut tz) = (sx, sy, 1u64);
        loop {
            let lz = z.map_or(1, |z| extent(z, tz));
            let volume = extent(x, tx)
                .saturating_mul(extent(y, ty))
                .saturating_mul(lz);
            if volume <= budget {
                break;
            }
            let next = (step(x, tx), step(y, ty), z.map_or(tz, |z| step(z, tz)));
            if next == (tx, ty, tz) {
                break;
            }
            (tx, ty, tz) = next;
        }
        if (tx, ty, tz) != (sx, sy, 1) {
            levels.push(vector(tx, ty, tz));
        }
        levels
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grid::default_dim_labels;

    fn levels(shape: &[u64]) -> Vec<Vec<u64>> {
        PyramidPolicy::default().levels(shape, &default_dim_labels(shape))
    }

    #[test]
    fn small_planes_get_level_zero_only() {
        assert_eq!(levels(&[512, 512]), vec![vec![1, 1]]);
        assert_eq!(levels(&[2000, 2000]), vec![vec![1, 1]]);
        assert_eq!(levels(&[1000]), vec![vec![1]]);
    }

    #[test]
    fn a_large_plane_gets_the_two_d_level() {
        // 8192² halved twice is 2048² = 4.19 Mpx, still over 4,000,000: a third halving.
        assert_eq!(levels(&[8192, 8192]), vec![vec![1, 1], vec![8, 8]]);
        // 5032² is 25.3 Mpx: one halving leaves 2516² = 6.3 Mpx, two leave 1258².
        assert_eq!(levels(&[5032, 5032]), vec![vec![1, 1], vec![4, 4]]);
        // Only the long axis is halved once the short one is under the floor.
        assert_eq!(levels(&[300, 100_000]), vec![vec![1, 1], vec![1, 32]]);
    }

    #[test]
    fn a_large_volume_gets_both_levels_and_z_is_halved_only_in_three_d() {
        assert_eq!(
            levels(&[1024, 4096, 4096]),
            vec![vec![1, 1, 1], vec![1, 4, 4], vec![4, 16, 16]]
        );
        // A volume whose plane fits gets only the 3-D level.
        assert_eq!(
            levels(&[1000, 1000, 1000]),
            vec![vec![1, 1, 1], vec![4, 4, 4]]
        );
        // An unlabelled leading axis is never scaled: rank 4 is c z y x.
        assert_eq!(
            levels(&[3, 512, 1024, 1024]),
            vec![vec![1, 1, 1, 1], vec![1, 2, 2, 2]]
        );
    }
}
