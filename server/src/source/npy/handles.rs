//! Descriptors of opened sources: held while used, at most a configured number at once
//! (`max_open_sources`), the least recently used closed first and opened again on demand.
//!
//! A served source does not pin a descriptor: a server serving more files than its
//! descriptor limit keeps serving every one of them, and keeps descriptors for connections,
//! segments and directory scans. A descriptor handed out stays open for as long as its user
//! holds it (a read or an in-kernel copy in flight), even if it is closed here meanwhile.

use std::fs::File;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

/// Default of [`set_max_open`]: descriptors held by sources at once.
pub const DEFAULT_MAX_OPEN: usize = 512;

/// The process's descriptors held by sources (descriptors are a per-process resource).
static OPEN: Mutex<Vec<Weak<Slot>>> = Mutex::new(Vec::new());
/// The most descriptors sources hold at once.
static MAX_OPEN: AtomicUsize = AtomicUsize::new(DEFAULT_MAX_OPEN);
/// Use order: a slot's last use is the clock's value then.
static CLOCK: AtomicU64 = AtomicU64::new(0);

/// Sets the most descriptors sources hold at once (at least 1).
pub fn set_max_open(max: usize) {
    MAX_OPEN.store(max.max(1), Ordering::Relaxed);
}

/// One source's descriptor, when it holds one.
#[derive(Debug, Default)]
pub struct Slot {
    file: Mutex<Option<Arc<File>>>,
    used: AtomicU64,
}

impl Slot {
    /// The descriptor, if still held, marked as just used.
    pub fn get(&self) -> Option<Arc<File>> {
        let file = self.file.lock().clone()?;
        self.used.store(tick(), Ordering::Relaxed);
        Some(file)
    }

    /// Holds `file`, closing the least recently used descriptors of other sources past the
    /// limit; the descriptor to use.
    pub fn hold(self: &Arc<Self>, file: File) -> Arc<File> {
        let file = Arc::new(file);
        self.used.store(tick(), Ordering::Relaxed);
        *self.file.lock() = Some(file.clone());
        let mut open = OPEN.lock();
        open.push(Arc::downgrade(self));
        let max = MAX_OPEN.load(Ordering::Relaxed);
        if open.len() > max {
            close_least_used(&mut open, max);
        }
        file
    }
}

fn tick() -> u64 {
    CLOCK.fetch_add(1, Ordering::Relaxed)
}

/// Drops slots that are gone or hold nothing, then closes the least recently used until at
/// most `max` hold a descriptor.
fn close_least_used(open: &mut Vec<Weak<Slot>>, max: usize) {
    let mut live: Vec<(u64, Arc<Slot>)> = open
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|slot| slot.file.lock().is_some())
        .map(|slot| (slot.used.load(Ordering::Relaxed), slot))
        .collect();
    live.sort_by_key(|(used, _)| *used);
    let excess = live.len().saturating_sub(max);
    for (_, slot) in live.drain(..excess) {
        slot.file.lock().take();
    }
    *open = live.iter().map(|(_, slot)| Arc::downgrade(slot)).collect();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_least_recently_used_descriptor_is_closed_first() {
        let mut open = Vec::new();
        let dir = tempfile::tempdir().unwrap();
        let slots: Vec<Arc<Slot>> = (0..3).map(|_| Arc::new(Slot::default())).collect();
        for (i, slot) in slots.iter().enumerate() {
            let path = dir.path().join(format!("{i}"));
            std::fs::write(&path, b"x").unwrap();
            *slot.file.lock() = Some(Arc::new(File::open(&path).unwrap()));
            slot.used.store(tick(), Ordering::Relaxed);
            open.push(Arc::downgrade(slot));
        }
        assert!(
            slots[0].get().is_some(),
            "slot 0 is now the most recently used"
        );
        close_least_used(&mut open, 2);
        assert!(slots[1].get().is_none(), "slot 1 was used least recently");
        assert!(slots[0].get().is_some() && slots[2].get().is_some());
        assert_eq!(open.len(), 2);
    }
}
