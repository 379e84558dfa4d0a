//! The rate each connection delivers reply bytes to its peer, for `--wire-compression
//! auto` (docs/decisions/0039).
//!
//! The kernel measures it: every ACK gives TCP a delivery rate sample (bytes newly
//! delivered over the interval they took), flagged when the sender had too little to send
//! for the sample to say anything about the path. A connection's writes read that sample
//! through `TCP_INFO` at most every [`SAMPLE_EVERY`], once [`MIN_ACKED`] bytes were
//! acknowledged (past the first round trips of slow start), and keep a moving average of
//! the samples not limited by the server. So the rate covers the link, the peer's receive
//! window and its reading, whatever is slowest, and nothing is measured while the server
//! has nothing to send. Each peer address's latest estimate is remembered for
//! [`REMEMBER_FOR`], so a client that opens a new connection per read (biopb's does) starts
//! from what its last one measured; a connection with neither is unmeasured (`None`: the
//! rule sends raw). Loopback peers are never measured (never compressed under `auto`).

use std::net::IpAddr;
use std::num::NonZeroUsize;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lru::LruCache;
use parking_lot::Mutex;

use crate::sys;

/// Least time between two `TCP_INFO` reads of one connection.
const SAMPLE_EVERY: Duration = Duration::from_millis(5);
/// Bytes the peer must have acknowledged before samples count.
const MIN_ACKED: u64 = 1 << 20;
/// Weight of a new sample in a connection's moving average.
const SAMPLE_WEIGHT: f64 = 0.2;
/// How long a peer address's last estimate seeds its new connections.
const REMEMBER_FOR: Duration = Duration::from_secs(600);
/// Peer addresses remembered (least recently measured forgotten first).
const PEERS_REMEMBERED: usize = 4096;

/// The estimates of every peer address, shared by a listener's connections.
pub struct LinkRates {
    peers: Mutex<LruCache<IpAddr, (f64, Instant)>>,
}

impl Default for LinkRates {
    fn default() -> Self {
        Self {
            peers: Mutex::new(LruCache::new(
                NonZeroUsize::new(PEERS_REMEMBERED).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }
}

impl LinkRates {
    /// The measurement of a new connection from `peer` (`None`: unknown), unmeasured when
    /// the peer is on loopback.
    pub fn connection(self: &Arc<Self>, peer: Option<IpAddr>, loopback: bool) -> Arc<LinkRate> {
        Arc::new(LinkRate {
            peer: peer.filter(|_| !loopback),
            rates: Arc::clone(self),
            state: Mutex::new(State::default()),
        })
    }

    fn remembered(&self, peer: IpAddr) -> Option<f64> {
        let peers = self.peers.lock();
        peers
            .peek(&peer)
            .filter(|(_, at)| at.elapsed() < REMEMBER_FOR)
            .map(|(rate, _)| *rate)
    }

    fn remember(&self, peer: IpAddr, rate: f64) {
        self.peers.lock().put(peer, (rate, Instant::now()));
    }
}

/// One connection's measured delivery rate.
pub struct LinkRate {
    /// The peer's address; `None` for a loopback or unknown peer (never measured).
    peer: Option<IpAddr>,
    rates: Arc<LinkRates>,
    state: Mutex<State>,
}

impl std::fmt::Debug for LinkRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkRate")
            .field("peer", &self.peer)
            .field("estimate", &self.state.lock().estimate)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct State {
    /// The moving average of samples, bytes per second.
    estimate: Option<f64>,
    last_read: Option<Instant>,
}

impl LinkRate {
    /// The connection's estimate, or its peer's last one; bytes per second.
    pub fn estimate(&self) -> Option<f64> {
        let peer = self.peer?;
        self.state
            .lock()
            .estimate
            .or_else(|| self.rates.remembered(peer))
    }

    /// Called after bytes were written to `socket`: reads its `TCP_INFO` if the last read
    /// is [`SAMPLE_EVERY`] old.
    pub fn wrote(&self, socket: &impl AsFd) {
        let Some(peer) = self.peer else {
            return;
        };
        let now = Instant::now();
        {
            let mut state = self.state.lock();
            if state
                .last_read
                .is_some_and(|at| now.duration_since(at) < SAMPLE_EVERY)
            {
                return;
            }
            state.last_read = Some(now);
        }
        if let Some(info) = sys::tcp_delivery(socket)
            && let Some(rate) = self.note(info)
        {
            self.rates.remember(peer, rate);
        }
    }

    /// Folds one `TCP_INFO` reading into the estimate; the new estimate if it counted.
    fn note(&self, info: sys::TcpDelivery) -> Option<f64> {
        if info.app_limited || info.bytes_acked < MIN_ACKED || info.delivery_rate == 0 {
            return None;
        }
        let sample = info.delivery_rate as f64;
        let mut state = self.state.lock();
        let estimate = state
            .estimate
            .map_or(sample, |old| old + SAMPLE_WEIGHT * (sample - old));
        state.estimate = Some(estimate);
        Some(estimate)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::net::Ipv4Addr;

    use super::*;

    fn reading(rate: u64, acked: u64, app_limited: bool) -> sys::TcpDelivery {
        sys::TcpDelivery {
            bytes_acked: acked,
            delivery_rate: rate,
            app_limited,
        }
    }

    #[test]
    fn samples_limited_by_the_server_or_too_early_do_not_count() {
        let rates = Arc::new(LinkRates::default());
        let peer = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let link = rates.connection(Some(peer), false);
        assert_eq!(link.estimate(), None);
        assert_eq!(link.note(reading(100, 10, false)), None);
        assert_eq!(link.note(reading(100, 2 << 20, true)), None);
        assert_eq!(link.note(reading(0, 2 << 20, false)), None);
        assert_eq!(link.estimate(), None);
        assert_eq!(link.note(reading(1000, 2 << 20, false)), Some(1000.0));
        assert_eq!(link.note(reading(2000, 3 << 20, false)), Some(1200.0));
        assert_eq!(link.estimate(), Some(1200.0));
    }

    #[test]
    fn a_new_connection_starts_from_its_peers_last_estimate() {
        let rates = Arc::new(LinkRates::default());
        let peer = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        rates.remember(peer, 5e6);
        assert_eq!(rates.connection(Some(peer), false).estimate(), Some(5e6));
        let other = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3));
        assert_eq!(rates.connection(Some(other), false).estimate(), None);
        // A loopback peer is never measured nor seeded.
        let local = rates.connection(Some(peer), true);
        assert_eq!(local.estimate(), None);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let socket = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        local.wrote(&socket);
        assert!(local.state.lock().last_read.is_none());
    }
}
