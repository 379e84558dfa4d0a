//! The seats of the accept loop: how many connections are open, from which peer, and which
//! of them have had no call in flight for longest.
//!
//! A connection holds a [`Seat`] from accept until hyper drops it. When every seat is
//! taken (`--max-connections`), or the new connection's peer holds all of its own
//! (`--max-connections-per-peer`), the connection idle longest (no call in flight) is
//! closed to make room, provided it has been idle at least `--reclaim-idle-after`; else
//! the new connection is refused. Without it, 512 HTTP/2 connections that answer PINGs
//! and send nothing else held every slot for good (issue 28, item 10).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use parking_lot::Mutex;

/// How many connections may be held, by whom, and when an idle one may be closed for a
/// new one.
#[derive(Clone, Copy, Debug)]
pub struct SeatLimits {
    /// Connections held open at once.
    pub max_connections: usize,
    /// Connections one peer address may hold at once.
    pub max_per_peer: usize,
    /// A connection with no call in flight for at least this long may be closed when a new
    /// connection finds no free seat.
    pub reclaim_idle_after: Duration,
}

/// Why a new connection got no seat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoSeat {
    /// Every seat is taken by a connection with a call in flight or idle for less than
    /// the reclaim time.
    Full,
    /// The peer holds its share, none of it reclaimable.
    PeerFull,
}

/// The seats of one listener.
pub struct Roster {
    limits: SeatLimits,
    epoch: Instant,
    seats: Mutex<Seats>,
    reclaimed: AtomicU64,
}

#[derive(Default)]
struct Seats {
    taken: usize,
    per_peer: HashMap<IpAddr, usize>,
    live: HashMap<u64, Arc<Activity>>,
    next_id: u64,
}

/// One seated connection as the roster sees it: its calls in flight, since when it has
/// had none, and whether it was closed to make room.
#[derive(Debug)]
pub struct Activity {
    id: u64,
    peer: Option<IpAddr>,
    epoch: Instant,
    calls: AtomicUsize,
    /// Milliseconds after `epoch` when the last call ended (or the connection opened).
    idle_since_ms: AtomicU64,
    reclaimed: AtomicBool,
    reader: AtomicWaker,
    writer: AtomicWaker,
}

/// A connection's seat, given back when it is dropped.
pub struct Seat {
    roster: Arc<Roster>,
    activity: Arc<Activity>,
}

impl Roster {
    /// An empty roster enforcing `limits`.
    pub fn new(limits: SeatLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            epoch: Instant::now(),
            seats: Mutex::new(Seats::default()),
            reclaimed: AtomicU64::new(0),
        })
    }

    /// Connections closed so far to make room for new ones.
    #[cfg(test)]
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed.load(Ordering::Relaxed)
    }

    /// A seat for a new connection from `peer`, closing the longest idle connection (of
    /// the same peer when the peer is at its cap) if that is what makes room.
    pub fn seat(self: &Arc<Self>, peer: Option<IpAddr>) -> Result<Seat, NoSeat> {
        let peer = peer.map(canonical);
        let mut seats = self.seats.lock();
        let peer_full = peer.is_some_and(|ip| {
            seats.per_peer.get(&ip).copied().unwrap_or(0) >= self.limits.max_per_peer
        });
        if peer_full {
            let victim = self.longest_idle(&seats, peer).ok_or(NoSeat::PeerFull)?;
            self.reclaim(&mut seats, &victim, "its peer holds all its connections");
        } else if seats.taken >= self.limits.max_connections {
            let victim = self.longest_idle(&seats, None).ok_or(NoSeat::Full)?;
            self.reclaim(&mut seats, &victim, "every connection slot is taken");
        }
        let id = seats.next_id;
        seats.next_id += 1;
        let activity = Arc::new(Activity {
            id,
            peer,
            epoch: self.epoch,
            calls: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(millis_since(self.epoch)),
            reclaimed: AtomicBool::new(false),
            reader: AtomicWaker::new(),
            writer: AtomicWaker::new(),
        });
        seats.taken += 1;
        if let Some(ip) = peer {
            *seats.per_peer.entry(ip).or_insert(0) += 1;
        }
        seats.live.insert(id, Arc::clone(&activity));
        Ok(Seat {
            roster: Arc::clone(self),
            activity,
        })
    }

    /// The connection (of `peer` only, if given) with no call in flight for longest, if
    /// that is at least the reclaim time.
    fn longest_idle(&self, seats: &Seats, peer: Option<IpAddr>) -> Option<Arc<Activity>> {
        let now = millis_since(self.epoch);
        let least = u64::try_from(self.limits.reclaim_idle_after.as_millis()).unwrap_or(u64::MAX);
        seats
            .live
            .values()
            .filter(|a| peer.is_none() || a.peer == peer)
            .filter_map(|a| a.idle_for_ms(now).map(|idle| (idle, a)))
            .filter(|(idle, _)| *idle >= least)
            .max_by_key(|(idle, _)| *idle)
            .map(|(_, a)| Arc::clone(a))
    }

    /// Gives `victim`'s seat up at once and closes its connection.
    fn reclaim(&self, seats: &mut Seats, victim: &Activity, why: &str) {
        let idle = Duration::from_millis(
            victim
                .idle_for_ms(millis_since(self.epoch))
                .unwrap_or_default(),
        );
        victim.reclaimed.store(true, Ordering::Release);
        self.release(seats, victim);
        victim.reader.wake();
        victim.writer.wake();
        let reclaimed = self.reclaimed.fetch_add(1, Ordering::Relaxed) + 1;
        // One line per doubling: a flood of new connections must not flood the log.
        if reclaimed.is_power_of_two() {
            tracing::warn!(
                peer = ?victim.peer,
                idle = ?idle,
                reclaimed,
                max_connections = self.limits.max_connections,
                max_connections_per_peer = self.limits.max_per_peer,
                "closing a connection with no call in flight to make room for a new one: {why} \
                 (raise --max-connections or --max-connections-per-peer, or \
                 --reclaim-idle-after to keep idle connections longer)"
            );
        }
    }

    fn release(&self, seats: &mut Seats, activity: &Activity) {
        if seats.live.remove(&activity.id).is_none() {
            return;
        }
        seats.taken = seats.taken.saturating_sub(1);
        if let Some(ip) = activity.peer
            && let Some(count) = seats.per_peer.get_mut(&ip)
        {
            *count = count.saturating_sub(1);
            if *count == 0 {
                seats.per_peer.remove(&ip);
            }
        }
    }
}

impl Activity {
    /// Notes a call starting on this connection; the call is in flight until the returned
    /// guard is dropped.
    pub fn call(self: &Arc<Self>) -> CallInFlight {
        self.calls.fetch_add(1, Ordering::AcqRel);
        CallInFlight {
            activity: Arc::clone(self),
        }
    }

    /// Whether the connection was closed to make room for another.
    pub fn is_reclaimed(&self) -> bool {
        self.reclaimed.load(Ordering::Acquire)
    }

    /// Registers the task reading the connection, woken when it is reclaimed.
    pub fn register_reader(&self, waker: &std::task::Waker) {
        self.reader.register(waker);
    }

    /// Registers the task writing the connection, woken when it is reclaimed.
    pub fn register_writer(&self, waker: &std::task::Waker) {
        self.writer.register(waker);
    }

    /// Milliseconds without a call in flight, or `None` while one is.
    fn idle_for_ms(&self, now_ms: u64) -> Option<u64> {
        if self.reclaimed.load(Ordering::Acquire) || self.calls.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(now_ms.saturating_sub(self.idle_since_ms.load(Ordering::Acquire)))
    }
}

/// A call in flight on a connection (see [`Activity::call`]).
pub struct CallInFlight {
    activity: Arc<Activity>,
}

impl Drop for CallInFlight {
    fn drop(&mut self) {
        let activity = &self.activity;
        activity
            .idle_since_ms
            .store(millis_since(activity.epoch), Ordering::Release);
        activity.calls.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Seat {
    /// The connection's activity record.
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut seats = self.roster.seats.lock();
        self.roster.release(&mut seats, &self.activity);
    }
}

/// Milliseconds from `epoch` to now.
fn millis_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The address a peer is counted under: an IPv4-mapped IPv6 address as its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn roster(max: usize, per_peer: usize, idle: Duration) -> Arc<Roster> {
        Roster::new(SeatLimits {
            max_connections: max,
            max_per_peer: per_peer,
            reclaim_idle_after: idle,
        })
    }

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([127, 0, 0, last]))
    }

    #[test]
    fn a_full_roster_refuses_until_a_seat_is_given_back() {
        let roster = roster(2, 2, Duration::from_secs(3600));
        let a = roster.seat(ip(1)).unwrap();
        let _b = roster.seat(ip(2)).unwrap();
        assert_eq!(roster.seat(ip(3)).err(), Some(NoSeat::Full));
        drop(a);
        assert!(roster.seat(ip(3)).is_ok());
    }

    #[test]
    fn the_longest_idle_connection_makes_room_but_busy_ones_do_not() {
        let roster = roster(2, 2, Duration::ZERO);
        let older = roster.seat(ip(1)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let busy = roster.seat(ip(2)).unwrap();
        let call = busy.activity().call();
        let newcomer = roster.seat(ip(3)).unwrap();
        assert!(older.activity().is_reclaimed());
        assert!(!busy.activity().is_reclaimed());
        // Both left are busy now: no room.
        let _also_busy = newcomer.activity().call();
        assert_eq!(roster.seat(ip(4)).err(), Some(NoSeat::Full));
        drop(call);
        assert!(roster.seat(ip(4)).is_ok());
        assert!(busy.activity().is_reclaimed());
        // A reclaimed seat dropped later is not given back twice.
        drop(older);
        drop(busy);
        assert_eq!(roster.reclaimed(), 2);
    }

    #[test]
    fn a_peer_at_its_cap_reclaims_its_own_idle_connections_only() {
        let roster = roster(10, 2, Duration::from_secs(3600));
        let _a = roster.seat(ip(1)).unwrap();
        let _b = roster.seat(ip(1)).unwrap();
        assert_eq!(roster.seat(ip(1)).err(), Some(NoSeat::PeerFull));
        assert!(roster.seat(ip(2)).is_ok());

        let roster = self::roster(10, 1, Duration::ZERO);
        let other = roster.seat(ip(2)).unwrap();
        let own = roster.seat(ip(1)).unwrap();
        let _again = roster.seat(ip(1)).unwrap();
        assert!(own.activity().is_reclaimed());
        assert!(!other.activity().is_reclaimed());
    }

    #[test]
    fn mapped_addresses_count_as_their_ipv4_peer() {
        let roster = roster(10, 1, Duration::from_secs(3600));
        let _v4 = roster.seat(ip(1)).unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert_eq!(roster.seat(Some(mapped)).err(), Some(NoSeat::PeerFull));
    }
}
