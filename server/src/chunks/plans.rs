//! The regions recent plans asked for, so that read-ahead stays inside what a reader planned.
//!
//! Read-ahead (`readahead.rs`) guesses the next cells from the grid walk alone. For a reader
//! of a whole tensor that is right; a viewer that plans a window of a large plane (one or
//! four tiles) asks for exactly the cells of its plan, and cells ahead on the grid are
//! decodes nobody waits for, competing with the window's own. Each plan's region is kept
//! here (the last [`REMEMBERED_PLANS`] of them); a request's read-ahead goes only to cells
//! inside the most recent plan of its tensor that holds the requested cell. A cell no
//! remembered plan holds (a plan forgotten, a ticket kept from an earlier process) reads
//! ahead on the whole grid as before.

use std::collections::VecDeque;

use parking_lot::Mutex;

use crate::content_version::ContentVersion;
use crate::grid::Region;
use crate::grid::chunk_id::ChunkId;

/// How many plans are remembered: enough for a few hundred readers planning at once.
const REMEMBERED_PLANS: usize = 256;

/// The regions of the most recent plans, newest first.
#[derive(Debug, Default)]
pub(super) struct RecentPlans {
    plans: Mutex<VecDeque<Plan>>,
}

#[derive(Debug, PartialEq)]
struct Plan {
    array_id: String,
    version: ContentVersion,
    region: Region,
}

impl RecentPlans {
    /// Remembers the plan whose first cell is `first` and last cell `last` (C order): the
    /// region from one's start to the other's stop.
    pub(super) fn record(&self, first: &ChunkId, last: &ChunkId) {
        let plan = Plan {
            array_id: first.array_id().to_string(),
            version: first.version(),
            region: Region::new(first.region().start.clone(), last.region().stop.clone()),
        };
        let mut plans = self.plans.lock();
        plans.retain(|kept| kept != &plan);
        plans.push_front(plan);
        plans.truncate(REMEMBERED_PLANS);
    }

    /// The region of the most recent plan of `id`'s tensor that holds `id`'s cell.
    pub(super) fn holding(&self, id: &ChunkId) -> Option<Region> {
        self.plans
            .lock()
            .iter()
            .find(|plan| {
                plan.array_id == id.array_id()
                    && plan.version == id.version()
                    && plan.region.contains(id.region())
            })
            .map(|plan| plan.region.clone())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::content_version::FileVersion;

    fn chunk(array_id: &str, start: &[u64], stop: &[u64]) -> ChunkId {
        let version = ContentVersion::File(FileVersion {
            dev: 1,
            ino: 2,
            size: 3,
            mtime_ns: 4,
        });
        ChunkId::new(
            array_id,
            version,
            Region::new(start.to_vec(), stop.to_vec()),
        )
        .unwrap()
    }

    #[test]
    fn the_newest_plan_holding_the_cell_bounds_it() {
        let plans = RecentPlans::default();
        plans.record(&chunk("a", &[0, 0], &[4, 4]), &chunk("a", &[4, 4], &[8, 8]));
        plans.record(&chunk("a", &[0, 4], &[4, 8]), &chunk("a", &[0, 4], &[4, 8]));
        let inside = chunk("a", &[0, 4], &[4, 8]);
        assert_eq!(
            plans.holding(&inside).unwrap(),
            Region::new(vec![0, 4], vec![4, 8])
        );
        let older = chunk("a", &[4, 0], &[8, 4]);
        assert_eq!(
            plans.holding(&older).unwrap(),
            Region::new(vec![0, 0], vec![8, 8])
        );
        assert!(plans.holding(&chunk("b", &[0, 4], &[4, 8])).is_none());
    }

    #[test]
    fn only_the_newest_plans_are_kept() {
        let plans = RecentPlans::default();
        let first = chunk("old", &[0], &[1]);
        plans.record(&first, &first);
        for i in 0..REMEMBERED_PLANS as u64 {
            let cell = chunk("new", &[i], &[i + 1]);
            plans.record(&cell, &cell);
        }
        assert!(plans.holding(&first).is_none());
        assert!(plans.holding(&chunk("new", &[0], &[1])).is_some());
    }
}
