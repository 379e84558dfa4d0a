//! The memory budget of scaled decodes: every scaled chunk computed at once reserves what
//! its computation may hold ([`crate::chunks::reduce::decode_bytes`]) before it starts,
//! and gives it back when the computation ends (not when its caller leaves), so the
//! decodes running together never hold more than the budget.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Default budget of all scaled decodes together (`--max-scaled-decode-memory`).
pub const DEFAULT_MAX_SCALED_DECODE_BYTES: u64 = 512 << 20;

/// Reservations are counted in KiB, so one fits a semaphore's `u32` acquire.
const UNIT: u64 = 1 << 10;

/// Bytes that decodes may reserve, all together.
pub struct DecodeBudget {
    permits: Arc<Semaphore>,
    max_bytes: u64,
}

/// A reservation: returned to the budget when dropped.
pub struct Reserved {
    _permit: OwnedSemaphorePermit,
}

/// Why a reservation was refused.
#[derive(Debug, thiserror::Error)]
pub enum BudgetError {
    /// One decode needs more than the whole budget.
    #[error("needs {needed} bytes, more than the whole budget of {max} bytes")]
    OverBudget {
        /// Bytes asked for.
        needed: u64,
        /// The budget.
        max: u64,
    },
    /// The budget was closed (the server is stopping).
    #[error("the decode budget is closed")]
    Closed,
}

impl DecodeBudget {
    /// A budget of `max_bytes` (rounded down to whole KiB).
    pub fn new(max_bytes: u64) -> Self {
        let units = usize::try_from(max_bytes / UNIT)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Self {
            permits: Arc::new(Semaphore::new(units)),
            max_bytes,
        }
    }

    /// Reserves `bytes`, waiting while other decodes hold too much of the budget; refused
    /// at once when `bytes` is over the whole budget.
    pub async fn reserve(&self, bytes: u64) -> Result<Reserved, BudgetError> {
        let over = BudgetError::OverBudget {
            needed: bytes,
            max: self.max_bytes,
        };
        let units = bytes.div_ceil(UNIT);
        if units > (self.max_bytes / UNIT) {
            return Err(over);
        }
        let units = u32::try_from(units).map_err(|_| over)?;
        let permit = self
            .permits
            .clone()
            .acquire_many_owned(units)
            .await
            .map_err(|_| BudgetError::Closed)?;
        Ok(Reserved { _permit: permit })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn reservations_wait_for_room_and_oversized_ones_are_refused() {
        let budget = Arc::new(DecodeBudget::new(10 << 20));
        assert!(matches!(
            budget.reserve(11 << 20).await,
            Err(BudgetError::OverBudget { .. })
        ));
        let first = budget.reserve(6 << 20).await.unwrap();
        let wait = std::time::Duration::from_millis(100);
        assert!(
            tokio::time::timeout(wait, budget.reserve(6 << 20))
                .await
                .is_err(),
            "6 + 6 MiB is over a 10 MiB budget: the second waits"
        );
        drop(first);
        budget.reserve(6 << 20).await.unwrap();
    }
}
