//! Single flight: concurrent requests for the same cold chunk share one decode.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::OnceCell;

/// Deduplicates concurrent computations by key: the first caller runs the work,
/// every caller that arrives while it runs awaits the same result.
pub struct Decodes<V> {
    in_flight: Mutex<HashMap<Vec<u8>, Arc<OnceCell<V>>>>,
}

impl<V: Clone> Default for Decodes<V> {
    fn default() -> Self {
        Self {
            in_flight: Mutex::new(HashMap::new()),
        }
    }
}

impl<V: Clone> Decodes<V> {
    /// Whether a run for `key` is under way.
    pub fn is_running(&self, key: &[u8]) -> bool {
        self.in_flight.lock().contains_key(key)
    }

    /// Runs `work` for `key` unless a run for the same key is already under way,
    /// in which case its result is awaited and shared. Returns the value and
    /// whether this call waited on another's run.
    pub async fn run<F, Fut>(&self, key: &[u8], work: F) -> (V, bool)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
    {
        let (cell, leader) = {
            let mut map = self.in_flight.lock();
            match map.get(key) {
                Some(cell) => (cell.clone(), false),
                None => {
                    let cell = Arc::new(OnceCell::new());
                    map.insert(key.to_vec(), cell.clone());
                    (cell, true)
                }
            }
        };
        let guard = leader.then(|| Remover { owner: self, key });
        let value = cell.get_or_init(work).await.clone();
        drop(guard);
        (value, !leader)
    }
}

/// Removes the leader's entry when its run ends, even if the future is dropped.
struct Remover<'a, V> {
    owner: &'a Decodes<V>,
    key: &'a [u8],
}

impl<V> Drop for Remover<'_, V> {
    fn drop(&mut self) {
        self.owner.in_flight.lock().remove(self.key);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_callers_share_one_run() {
        let flight = Arc::new(Decodes::<u32>::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Notify::new());
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (flight, runs, gate) = (flight.clone(), runs.clone(), gate.clone());
            tasks.push(tokio::spawn(async move {
                flight
                    .run(b"k", || async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        gate.notified().await;
                        7
                    })
                    .await
            }));
        }
        // Let every task reach the cell before the leader finishes.
        while flight.in_flight.lock().is_empty() {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        gate.notify_one();
        let mut waited = 0;
        for t in tasks {
            let (v, w) = t.await.unwrap();
            assert_eq!(v, 7);
            waited += usize::from(w);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(waited, 7);
        assert!(flight.in_flight.lock().is_empty());
    }

    #[tokio::test]
    async fn a_finished_run_is_not_cached() {
        let flight = Decodes::<u32>::default();
        assert_eq!(flight.run(b"k", || async { 1 }).await, (1, false));
        assert_eq!(flight.run(b"k", || async { 2 }).await, (2, false));
    }
}
