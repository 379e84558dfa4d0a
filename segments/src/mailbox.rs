//! The maintenance mailbox: rotated segments waiting to be sealed, and requests for an
//! eviction pass, handed from appends to whichever thread does the maintenance.

use std::sync::atomic::Ordering;

use parking_lot::{Condvar, Mutex};

use crate::options::MaintenanceWaker;
use crate::segment::Active;

#[derive(Debug, Default)]
struct State {
    seal_queue: Vec<Active>,
    wake: bool,
    stop: bool,
}

/// Work queued for maintenance, and the signal to the thread that does it.
#[derive(Debug, Default)]
pub(crate) struct Mailbox {
    state: Mutex<State>,
    cv: Condvar,
    /// The owner's worker to signal instead of a thread of the store's own.
    shared: Option<MaintenanceWaker>,
}

impl Mailbox {
    /// A mailbox whose work is signalled to the owner's worker (`None`: the store's thread).
    pub(crate) fn new(shared: Option<MaintenanceWaker>) -> Mailbox {
        Mailbox {
            shared,
            ..Mailbox::default()
        }
    }

    /// Whether a worker of the owner does the work (no thread of the store's own).
    pub(crate) fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    fn signal(&self) {
        self.cv.notify_one();
        if let Some(wake) = &self.shared {
            (wake.0)();
        }
    }

    /// Hands a rotated segment over for sealing.
    pub(crate) fn queue_seal(&self, active: Active) {
        active.seg.retired.store(true, Ordering::Release);
        self.state.lock().seal_queue.push(active);
        self.signal();
    }

    /// Asks for an eviction pass.
    pub(crate) fn wake(&self) {
        self.state.lock().wake = true;
        self.signal();
    }

    /// Asks the thread to finish queued work and exit.
    pub(crate) fn stop(&self) {
        self.state.lock().stop = true;
        self.cv.notify_one();
    }

    /// The work queued now, without waiting (`None`: nothing to do).
    pub(crate) fn take(&self) -> Option<Vec<Active>> {
        let mut st = self.state.lock();
        if st.seal_queue.is_empty() && !st.wake {
            return None;
        }
        st.wake = false;
        Some(std::mem::take(&mut st.seal_queue))
    }

    /// Waits for work; `None` when stopped with nothing left to do.
    pub(crate) fn next(&self) -> Option<Vec<Active>> {
        let mut st = self.state.lock();
        loop {
            if !st.seal_queue.is_empty() || st.wake {
                st.wake = false;
                return Some(std::mem::take(&mut st.seal_queue));
            }
            if st.stop {
                return None;
            }
            self.cv.wait(&mut st);
        }
    }
}
