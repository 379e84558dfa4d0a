//! Live directories: a polling rescan keeps the registry in step with the disk.
//!
//! Every `interval` the watcher lists the configured paths again and stats each
//! `.npy` found (device, inode, size, mtime). A file counts as *settled* once its
//! stat is the same on two consecutive polls, so files still being written are
//! not opened half-done. When a settled file is new or differs from what the
//! registry holds, or a served file is gone, the registry is rebuilt (unchanged
//! entries are kept as they are, so their chunk ids stay valid) and swapped in.
//!
//! Polling is used rather than file-system notifications: it needs no extra
//! dependency, works on network file systems, and a missed event cannot leave
//! the registry stale for longer than one interval.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::content_version::FileVersion;
use crate::source::origin::Origin;
use crate::source::registry::{Discovery, OpenOptions, Registry, SourceSpec, identity_at};
use crate::state::ServiceState;

/// Default time between two rescans.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// The polling state between two rescans.
pub struct Watcher {
    sources: Vec<SourceSpec>,
    options: OpenOptions,
    interval: Duration,
    /// What each file found looked like at the previous poll.
    previous: HashMap<PathBuf, FileVersion>,
    /// The listing problems last logged, so each is logged once.
    problems: Vec<String>,
}

impl Watcher {
    /// A watcher over `sources`, opening files with `options`, polling every `interval`.
    pub fn new(sources: Vec<SourceSpec>, options: OpenOptions, interval: Duration) -> Self {
        Self {
            sources,
            options,
            interval: interval.max(Duration::from_millis(10)),
            previous: HashMap::new(),
            problems: Vec::new(),
        }
    }

    /// Polls until the task is dropped or aborted.
    pub async fn run(mut self, state: Arc<ServiceState>) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            state.scan_status().begin();
            let snapshot = state.registry_snapshot();
            let polled = tokio::task::spawn_blocking(move || {
                let next = self.poll(&snapshot);
                (self, next)
            })
            .await;
            let next = match polled {
                Ok((watcher, next)) => {
                    self = watcher;
                    next
                }
                Err(err) => {
                    tracing::error!(error = %err, "directory rescan failed; live updates stop");
                    state.scan_status().finish();
                    return;
                }
            };
            if let Some(next) = next {
                tracing::debug!(sources = next.len(), "registry updated from disk");
                state.replace_registry(next);
                let tree_state = state.clone();
                // The catalog tree of the new set, built off the request path.
                let _ = tokio::task::spawn_blocking(move || tree_state.catalog_tree()).await;
            }
            state.scan_status().finish();
        }
    }

    /// One rescan (blocking): the new registry, if anything settled changed.
    pub fn poll(&mut self, registry: &Registry) -> Option<Registry> {
        let found = Discovery::run(&self.sources);
        if found.problems != self.problems {
            for problem in found.problems.iter().filter(|p| !self.problems.contains(p)) {
                tracing::warn!("{problem}");
            }
            self.problems = found.problems.clone();
        }
        let now: HashMap<PathBuf, FileVersion> = found
            .paths()
            .filter_map(|p| identity_at(p).map(|id| (p.to_path_buf(), id)))
            .collect();
        let unsettled: HashSet<PathBuf> = found
            .paths()
            .filter(|p| match now.get(*p) {
                Some(id) => self.previous.get(*p) != Some(id),
                None => true,
            })
            .map(Path::to_path_buf)
            .collect();
        let held = held_identities(registry);
        let settled_changed = now
            .iter()
            .any(|(path, id)| !unsettled.contains(path) && held.get(path) != Some(id));
        // Every path the registry knows, including refused files with no identity (one
        // that vanished under a request was refused then, with nothing to identify it by).
        // A folder that could not be listed hides nothing that was removed.
        let gone = |path: &Path| !now.contains_key(path) && !found.unseen(path);
        let removed = held.keys().any(|path| gone(path))
            || registry
                .refused()
                .any(|r| !r.origin.is_dropped() && gone(&r.path));
        self.previous = now;
        if !(settled_changed || removed) {
            return None;
        }
        Some(registry.rebuild(&found, |p| unsettled.contains(p), &self.options))
    }
}

/// What the registry holds for each path: the identity the file had when opened
/// (or refused).
fn held_identities(registry: &Registry) -> HashMap<PathBuf, FileVersion> {
    // Runtime and upstream sources are not on the configured paths; the rescan leaves
    // them alone.
    let mut held: HashMap<PathBuf, FileVersion> = registry
        .tensors()
        .filter(|t| t.origin == Origin::Configured)
        .filter_map(|t| Some((t.source.path().to_path_buf(), t.version.file()?)))
        .collect();
    for refused in registry
        .refused()
        .filter(|r| r.origin == Origin::Configured)
    {
        if let Some(id) = registry.refused_identity(&refused.source_id) {
            held.insert(refused.path.clone(), id);
        }
    }
    held
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::source::registry::tests::npy;

    fn options() -> OpenOptions {
        OpenOptions::with_target(1 << 20)
    }

    #[test]
    fn new_files_wait_one_poll_then_serve_and_removal_drops_them() {
        let dir = tempfile::tempdir().unwrap();
        npy(&dir.path().join("a.npy"), &[3], &[1, 2, 3]);
        let specs = vec![SourceSpec::from(dir.path().to_path_buf())];
        let (registry, _) = Registry::scan(&specs, &options());
        assert_eq!(registry.len(), 1);
        let a = registry.get("a").unwrap().clone();
        let mut watcher = Watcher::new(specs, options(), Duration::from_secs(1));

        assert!(watcher.poll(&registry).is_none(), "nothing changed");
        npy(&dir.path().join("b.npy"), &[2], &[4, 5]);
        assert!(
            watcher.poll(&registry).is_none(),
            "a file seen once is not settled yet"
        );
        let registry = watcher.poll(&registry).unwrap();
        assert!(registry.get("b").is_some());
        assert!(
            Arc::ptr_eq(registry.get("a").unwrap(), &a),
            "an unchanged source is kept, not reopened"
        );
        assert!(watcher.poll(&registry).is_none());

        std::fs::remove_file(dir.path().join("b.npy")).unwrap();
        let registry = watcher.poll(&registry).unwrap();
        assert!(registry.get("b").is_none());
        assert!(registry.get("a").is_some());
    }
}
