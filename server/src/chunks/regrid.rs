//! Bringing a tensor's cache onto the grid its readers use (docs/decisions/0023).
//!
//! A loopback client seen reading by DoGet is planned on the fine grid (decision 0015). On a
//! tensor whose coarse (mapped-grid) cells are cached and whose fine cells are not, that
//! plan would decode the whole tensor again before the first byte: the service plans such
//! a read on the coarse grid, which is served from the cache at once, and decodes the fine
//! cells in the background; once they are in, plans move to the fine grid.
//!
//! ```text
//!  socket plan of a loopback peer ── fine ends cached? ── yes ──▶ fine grid
//!                                         │ no
//!                                         ▼
//!                          coarse ends cached? ── no ──▶ fine grid (decoded as asked)
//!                                         │ yes
//!                                         ▼
//!             coarse grid now; fine cells decoded in the background, ends last
//! ```

use std::sync::Arc;

use super::ChunkService;
use crate::grid::ChunkGrid;
use crate::grid::chunk_id::ChunkId;
use crate::source::registry::Tensor;

impl ChunkService {
    /// Whether the first and last cells of `grid` over the whole of `tensor` are cached.
    pub fn ends_cached(&self, tensor: &Tensor, grid: &ChunkGrid) -> bool {
        let cells = grid.num_chunks();
        cells > 0
            && [0, cells - 1].into_iter().all(|index| {
                grid.cell_at(index)
                    .and_then(|cell| ChunkId::new(&tensor.array_id, tensor.version, cell).ok())
                    .is_some_and(|id| self.store.contains(&id.segment_key()))
            })
    }

    /// Decodes the cells of `grid` that are not cached yet in the background, at most a
    /// quarter of the cache's room of them, the two end cells last, so that
    /// [`ChunkService::ends_cached`] turns true once the rest is in. Returns at once;
    /// nothing starts with read-ahead off, without a file cache, or while appends fail.
    pub fn fill_grid(self: &Arc<Self>, tensor: &Arc<Tensor>, grid: &ChunkGrid) {
        let Some(room) = self.room_ahead() else {
            return;
        };
        let cells = grid.num_chunks();
        let chunk_bytes = grid.chunk_bytes(tensor.itemsize()).max(1);
        let budget = usize::try_from(room / 4 / chunk_bytes).unwrap_or(usize::MAX);
        let ends = if cells > 1 {
            vec![0, cells - 1]
        } else {
            vec![0]
        };
        let middle = (1..cells.saturating_sub(1)).take(budget.saturating_sub(ends.len()));
        for index in middle.chain(ends).take(budget) {
            let Some(cell) = grid.cell_at(index) else {
                continue;
            };
            let Ok(id) = ChunkId::new(&tensor.array_id, tensor.version, cell) else {
                continue;
            };
            if !self.is_present(&id.segment_key()) {
                self.decode_in_background(tensor, id);
            }
        }
    }
}
