//! Bytes held for peers by replies they have not read (chunks, and the catalog answers and
//! ROI listings tonic encodes, [`Held`]), and the connections closed to take them back
//! (docs/decisions/0012).
//!
//! A DoGet reply holds its chunk's body, a slice of a segment mapping or of the memory cache,
//! until the peer has taken it: an evicted segment stays on disk, and a memory-cache chunk in
//! RAM, for as long as some reply still holds it. A peer that opens many streams and never
//! reads (a zero HTTP/2 window) once pinned 4 GiB of evicted segments against a 64 MiB budget
//! (issue 14). Here every reply registers its bytes while any piece of it is alive (in the
//! reply body or queued in h2), and notes progress each time hyper asks it for the next
//! piece, which hyper does only after the peer's window took the previous one.
//!
//! HTTP/2 gives the server no handle on one stream from outside the task that writes it, so
//! what is reclaimed is the connection: closing it fails every stream on it, drops their
//! queued pieces and with them the held bytes. The peer sees its calls fail with UNAVAILABLE and
//! reconnects; the server log names the peer, the bytes it held and why it was closed.
//!
//! ```text
//!  reply piece polled ──▶ Hold::progress          (per reply: last progress)
//!  reply created      ──▶ UnreadReplies::hold ──▶ over a cap? ──▶ reclaim now
//!  every second       ──▶ UnreadReplies::reclaim:
//!      a reply idle ≥ stream idle timeout                      → close its connection
//!      a connection over its cap, a reply idle ≥ STALL_AFTER   → close it
//!      all replies over the total cap                          → close the connection
//!                                                               with the oldest stall first
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::task::AtomicWaker;
use parking_lot::Mutex;

/// A reply not polled for this long counts as stalled when a cap is passed.
pub const STALL_AFTER: Duration = Duration::from_secs(2);
/// Size of the pieces a reply body hands to hyper; progress is seen once per piece.
pub const PIECE_BYTES: usize = 1 << 20;
/// Default cap on bytes held by the replies of all connections.
pub const DEFAULT_MAX_PINNED_BYTES: u64 = 1 << 30;
/// Default cap on bytes held by the replies of one connection.
pub const DEFAULT_MAX_CONNECTION_PINNED_BYTES: u64 = 512 << 20;
/// Default time a reply may go without progress before its connection is closed.
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Caps on what unread replies may hold.
#[derive(Clone, Copy, Debug)]
pub struct UnreadLimits {
    /// Bytes held by all replies; past it, stalled connections are closed.
    pub max_bytes: u64,
    /// Bytes held by the replies of one connection; past it, the connection is closed once
    /// one of its replies has stalled.
    pub max_connection_bytes: u64,
    /// A reply that makes no progress for this long has its connection closed.
    pub stream_idle_timeout: Duration,
}

impl Default for UnreadLimits {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_MAX_PINNED_BYTES,
            max_connection_bytes: DEFAULT_MAX_CONNECTION_PINNED_BYTES,
            stream_idle_timeout: DEFAULT_STREAM_IDLE_TIMEOUT,
        }
    }
}

/// The ledger of bytes held by unread replies, over all connections.
pub struct UnreadReplies {
    limits: UnreadLimits,
    held: AtomicU64,
    closed: AtomicU64,
    next_id: AtomicU64,
    connections: Mutex<HashMap<u64, Weak<Connection>>>,
}

/// What the ledger reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnreadStats {
    /// Bytes held by replies now.
    pub held_bytes: u64,
    /// Connections closed because their replies stalled.
    pub closed_connections: u64,
}

impl UnreadReplies {
    /// An empty ledger enforcing `limits`.
    pub fn new(limits: UnreadLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            held: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            connections: Mutex::new(HashMap::new()),
        })
    }

    /// Registers an accepted connection from `peer`.
    pub fn connect(&self, peer: Option<SocketAddr>) -> Arc<Connection> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(Connection {
            id,
            peer,
            held: AtomicU64::new(0),
            replies: Mutex::new(HashMap::new()),
            next_reply: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            reader: AtomicWaker::new(),
            writer: AtomicWaker::new(),
        });
        let mut connections = self.connections.lock();
        connections.retain(|_, c| c.strong_count() > 0);
        connections.insert(id, Arc::downgrade(&connection));
        connection
    }

    /// Registers a reply of `bytes` on `connection`; it is held until the returned hold and
    /// every piece made from it are dropped. Passing a cap reclaims at once.
    pub fn hold(self: &Arc<Self>, connection: &Arc<Connection>, bytes: u64) -> Arc<Hold> {
        let id = connection.next_reply.fetch_add(1, Ordering::Relaxed);
        connection.replies.lock().insert(id, Instant::now());
        let on_connection = connection.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let total = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let hold = Arc::new(Hold {
            unread: Arc::clone(self),
            connection: Arc::clone(connection),
            id,
            bytes,
        });
        if total > self.limits.max_bytes || on_connection > self.limits.max_connection_bytes {
            self.reclaim(Instant::now());
        }
        hold
    }

    /// Bytes held and connections closed so far.
    pub fn stats(&self) -> UnreadStats {
        UnreadStats {
            held_bytes: self.held.load(Ordering::Relaxed),
            closed_connections: self.closed.load(Ordering::Relaxed),
        }
    }

    /// Closes the connections whose replies stalled past a limit (see the module docs).
    pub fn reclaim(&self, now: Instant) {
        let live: Vec<Arc<Connection>> = {
            let mut connections = self.connections.lock();
            connections.retain(|_, c| c.strong_count() > 0);
            connections.values().filter_map(Weak::upgrade).collect()
        };
        let mut open: Vec<(Duration, Arc<Connection>)> = Vec::new();
        let mut remaining = self.held.load(Ordering::Relaxed);
        for connection in live {
            if connection.is_closing() {
                remaining = remaining.saturating_sub(connection.held_bytes());
                continue;
            }
            let Some(idle) = connection.longest_idle(now) else {
                continue;
            };
            let held = connection.held_bytes();
            let why = if idle >= self.limits.stream_idle_timeout {
                Some(format!(
                    "a reply made no progress for {:.0?} (stream idle timeout {:?})",
                    idle, self.limits.stream_idle_timeout
                ))
            } else if held > self.limits.max_connection_bytes && idle >= STALL_AFTER {
                Some(format!(
                    "its unread replies hold {held} bytes, over the per-connection cap of {} bytes, and one made no progress for {idle:.0?}",
                    self.limits.max_connection_bytes
                ))
            } else {
                None
            };
            match why {
                Some(why) => {
                    remaining = remaining.saturating_sub(held);
                    self.close(&connection, &why);
                }
                None if idle >= STALL_AFTER => open.push((idle, connection)),
                None => {}
            }
        }
        // Over the total cap: the longest stalled first.
        open.sort_by_key(|(idle, _)| std::cmp::Reverse(*idle));
        for (idle, connection) in open {
            if remaining <= self.limits.max_bytes {
                break;
            }
            let held = connection.held_bytes();
            remaining = remaining.saturating_sub(held);
            self.close(
                &connection,
                &format!(
                    "unread replies of all peers hold more than the cap of {} bytes, and this peer's ({held} bytes) made no progress for {idle:.0?}",
                    self.limits.max_bytes
                ),
            );
        }
    }

    fn close(&self, connection: &Connection, why: &str) {
        if connection.close() {
            self.closed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                peer = ?connection.peer,
                held_bytes = connection.held_bytes(),
                replies = connection.replies.lock().len(),
                "closing a connection: {why}; its calls fail with UNAVAILABLE"
            );
        }
    }

    /// Runs [`UnreadReplies::reclaim`] every second (or more often for short idle timeouts), forever.
    pub async fn run_reaper(self: Arc<Self>) {
        let period = (self.limits.stream_idle_timeout / 4)
            .clamp(Duration::from_millis(100), Duration::from_secs(1));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.reclaim(Instant::now());
        }
    }
}

/// One accepted connection as the ledger sees it; its I/O fails once it is closed.
pub struct Connection {
    id: u64,
    peer: Option<SocketAddr>,
    held: AtomicU64,
    /// Live replies: when each last made progress.
    replies: Mutex<HashMap<u64, Instant>>,
    next_reply: AtomicU64,
    closing: AtomicBool,
    reader: AtomicWaker,
    writer: AtomicWaker,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("id", &self.id)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Whether the ledger closed this connection.
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Bytes held by this connection's replies.
    pub fn held_bytes(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Registers the task reading the connection, woken when it is closed.
    pub fn register_reader(&self, waker: &std::task::Waker) {
        self.reader.register(waker);
    }

    /// Registers the task writing the connection, woken when it is closed.
    pub fn register_writer(&self, waker: &std::task::Waker) {
        self.writer.register(waker);
    }

    /// Marks the connection closed and wakes its tasks; `false` if it already was.
    fn close(&self) -> bool {
        if self.closing.swap(true, Ordering::AcqRel) {
            return false;
        }
        self.reader.wake();
        self.writer.wake();
        true
    }

    /// How long the reply that went longest without progress has waited.
    fn longest_idle(&self, now: Instant) -> Option<Duration> {
        self.replies
            .lock()
            .values()
            .min()
            .map(|&last| now.saturating_duration_since(last))
    }
}

/// One reply's registration; released when the last piece made from it is dropped.
pub struct Hold {
    unread: Arc<UnreadReplies>,
    connection: Arc<Connection>,
    id: u64,
    bytes: u64,
}

impl Hold {
    /// Notes that the peer took data of this reply.
    pub fn progress(&self) {
        if let Some(last) = self.connection.replies.lock().get_mut(&self.id) {
            *last = Instant::now();
        }
    }

    /// `bytes` cut into pieces of at most [`PIECE_BYTES`], each keeping this hold alive
    /// (no copy: every piece is a slice of `bytes`).
    pub fn pieces(self: &Arc<Self>, bytes: &Bytes) -> Vec<Bytes> {
        (0..bytes.len())
            .step_by(PIECE_BYTES)
            .map(|start| {
                let end = (start + PIECE_BYTES).min(bytes.len());
                Bytes::from_owner(Piece {
                    bytes: bytes.slice(start..end),
                    _hold: Arc::clone(self),
                })
            })
            .collect()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.connection.replies.lock().remove(&self.id);
        self.connection
            .held
            .fetch_sub(self.bytes, Ordering::Relaxed);
        self.unread.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// A reply made of messages (a catalog answer, a ROI listing: tonic encodes them) registered
/// in the ledger: it holds its bytes until it ends or is dropped, and every poll for the next
/// message is progress. hyper polls a reply body only when the peer's window has room, so a
/// peer that stops reading stops the polls, and its connection is closed like that of an
/// unread chunk reply.
pub struct Held<S> {
    inner: S,
    hold: Option<Arc<Hold>>,
}

impl<S> Held<S> {
    /// `inner`, registered by `hold` (`None`: a reply outside the accept loop's connections).
    pub fn new(inner: S, hold: Option<Arc<Hold>>) -> Self {
        Self { inner, hold }
    }
}

impl<S: futures::Stream + Unpin> futures::Stream for Held<S> {
    type Item = S::Item;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<S::Item>> {
        if let Some(hold) = &self.hold {
            hold.progress();
        }
        let polled = std::pin::Pin::new(&mut self.inner).poll_next(cx);
        if let std::task::Poll::Ready(None) = polled {
            self.hold = None;
        }
        polled
    }
}

/// A slice of a reply's body that keeps the reply registered while h2 still queues it.
struct Piece {
    bytes: Bytes,
    _hold: Arc<Hold>,
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn limits(max: u64, per_connection: u64, idle: Duration) -> UnreadLimits {
        UnreadLimits {
            max_bytes: max,
            max_connection_bytes: per_connection,
            stream_idle_timeout: idle,
        }
    }

    #[test]
    fn pieces_hold_until_the_last_is_dropped() {
        let unread = UnreadReplies::new(UnreadLimits::default());
        let connection = unread.connect(None);
        let body = Bytes::from(vec![7u8; PIECE_BYTES * 2 + 5]);
        let hold = unread.hold(&connection, body.len() as u64);
        let pieces = hold.pieces(&body);
        assert_eq!(pieces.len(), 3);
        assert_eq!(pieces.concat(), body.to_vec());
        drop(hold);
        assert_eq!(unread.stats().held_bytes, body.len() as u64);
        let last = pieces.into_iter().last().unwrap();
        assert_eq!(unread.stats().held_bytes, body.len() as u64);
        drop(last);
        assert_eq!(unread.stats().held_bytes, 0);
        assert_eq!(connection.held_bytes(), 0);
    }

    #[test]
    fn idle_replies_close_their_connection_only() {
        let unread = UnreadReplies::new(limits(u64::MAX, u64::MAX, Duration::from_secs(5)));
        let stalled = unread.connect(None);
        let reading = unread.connect(None);
        let _a = unread.hold(&stalled, 10);
        let b = unread.hold(&reading, 10);
        let later = Instant::now() + Duration::from_secs(6);
        unread.reclaim(Instant::now());
        assert!(!stalled.is_closing());
        // The reading connection's reply progressed after the check time's origin.
        *reading.replies.lock().get_mut(&b.id).unwrap() = later;
        unread.reclaim(later);
        assert!(stalled.is_closing());
        assert!(!reading.is_closing());
        assert_eq!(unread.stats().closed_connections, 1);
    }

    #[test]
    fn over_the_connection_cap_a_stalled_connection_is_closed() {
        let unread = UnreadReplies::new(limits(u64::MAX, 100, Duration::from_secs(600)));
        let connection = unread.connect(None);
        let _a = unread.hold(&connection, 60);
        let _b = unread.hold(&connection, 60);
        // Over its cap, but nothing has stalled yet.
        assert!(!connection.is_closing());
        unread.reclaim(Instant::now() + STALL_AFTER);
        assert!(connection.is_closing());
    }

    #[test]
    fn over_the_total_cap_the_longest_stalled_go_first() {
        let unread = UnreadReplies::new(limits(100, u64::MAX, Duration::from_secs(600)));
        let old = unread.connect(None);
        let _a = unread.hold(&old, 60);
        let new = unread.connect(None);
        let b = unread.hold(&new, 60);
        let now = Instant::now() + STALL_AFTER * 3;
        *new.replies.lock().get_mut(&b.id).unwrap() = now - STALL_AFTER;
        unread.reclaim(now);
        assert!(old.is_closing(), "the longest stall is closed");
        assert!(
            !new.is_closing(),
            "closing one brought the total under the cap"
        );
    }
}
