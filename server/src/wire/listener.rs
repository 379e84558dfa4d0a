//! The accept loop: admits at most a configured number of connections (and of one peer),
//! closes the connection idle longest when a new one finds every seat taken, drops peers
//! that do not start speaking within the handshake timeout, and backs off instead of
//! spinning when the process runs out of descriptors. Each connection is registered with
//! the ledger of unread replies ([`crate::unread`]), which can close it: its reads and writes
//! then fail and hyper drops it with every stream on it.
//!
//! Without it an idle TCP connection that never sends the HTTP/2 preface was held forever,
//! and with the descriptor limit reached tonic's loop retried `accept` at once, at 100 % CPU,
//! while new clients timed out (issue 14); HTTP/2 connections that only answer PINGs held
//! every slot for good (issue 28).

mod calls;
mod link_rate;
mod roster;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

pub use calls::CountCalls;
pub use link_rate::{LinkRate, LinkRates};
pub use roster::{Activity, CallInFlight, NoSeat, Roster, Seat, SeatLimits};

use crate::metrics::{Metrics, OpenConnection};
use crate::unread::{Connection, UnreadReplies};

/// Bytes a client sends first on a plain HTTP/2 connection (the connection preface); a TLS
/// client's hello is longer. A connection counts as started once this many bytes arrived.
const PREFACE_BYTES: usize = 24;
/// First pause after `accept` fails for lack of descriptors or memory; doubled up to the cap.
const BACKOFF_START: Duration = Duration::from_millis(5);
/// Longest pause between `accept` retries.
const BACKOFF_CAP: Duration = Duration::from_secs(1);

/// Limits of the accept loop.
#[derive(Clone, Copy, Debug)]
pub struct Admission {
    /// Connections held open at once, by one peer, and when an idle one makes room.
    pub seats: SeatLimits,
    /// Time a new connection has to send its first bytes (the HTTP/2 preface or TLS hello).
    pub handshake_timeout: Duration,
}

/// A listener's `accept`, retried on failure: with a pause, doubling up to a second, when
/// the process is out of descriptors or memory (where retrying at once would spin).
pub struct Acceptor {
    listener: TcpListener,
    backoff: Duration,
}

impl Acceptor {
    /// Accepts on `listener`.
    pub fn new(listener: TcpListener) -> Self {
        Self {
            listener,
            backoff: BACKOFF_START,
        }
    }

    /// The address bound.
    pub fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// The next accepted connection (never an error: failures are logged and retried).
    pub async fn accept(&mut self) -> TcpStream {
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) => {
                    self.backoff = BACKOFF_START;
                    return stream;
                }
                Err(err) if out_of_resources(&err) => {
                    tracing::warn!(error = %err, pause = ?self.backoff, "accept failed for lack of resources; pausing");
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(BACKOFF_CAP);
                }
                Err(err) => tracing::debug!(error = %err, "accept failed"),
            }
        }
    }
}

/// Counts the connections a listener closed at once for want of a slot, and says so in
/// the log once per doubling of the count.
#[derive(Debug, Default)]
pub struct TurnedAway {
    count: u64,
}

impl TurnedAway {
    /// Notes one more; `log` writes the line when the count reaches a power of two.
    pub fn note(&mut self, log: impl FnOnce(u64)) {
        self.count += 1;
        if self.count.is_power_of_two() {
            log(self.count);
        }
    }
}

/// The accepted connections of `listener` under `admission`, ready for tonic's
/// `serve_with_incoming`, each counted in `metrics` while it is open. The stream never
/// yields an error: failures of `accept` are logged and retried (with backoff when
/// descriptors run out).
pub fn incoming(
    listener: TcpListener,
    admission: Admission,
    unread: Arc<UnreadReplies>,
    metrics: Metrics,
) -> impl Stream<Item = Result<Admitted, io::Error>> {
    let roster = Roster::new(admission.seats);
    let rates = Arc::new(LinkRates::default());
    futures::stream::unfold(
        (
            Acceptor::new(listener),
            roster,
            unread,
            metrics,
            TurnedAway::default(),
        ),
        move |(mut acceptor, roster, unread, metrics, mut turned_away)| {
            let rates = Arc::clone(&rates);
            async move {
                loop {
                    let stream = acceptor.accept().await;
                    let peer = stream.peer_addr().ok();
                    let seat = match roster.seat(peer.map(|p| p.ip())) {
                        Ok(seat) => seat,
                        Err(why) => {
                            // Closed at once: the peer sees a reset, not a hang.
                            turned_away
                                .note(|count| refusal_line(&admission.seats, why, peer, count));
                            drop(stream);
                            continue;
                        }
                    };
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::warn!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
                    }
                    let connection = unread.connect(peer);
                    let link = rates
                        .connection(peer.map(|p| p.ip()), peer.is_some_and(|p| is_loopback(&p)));
                    let admitted = Admitted {
                        stream,
                        connection,
                        link,
                        _open: metrics.connection_opened(),
                        seat,
                        handshake: Some(Box::pin(tokio::time::sleep_until(
                            Instant::now() + admission.handshake_timeout,
                        ))),
                        received: 0,
                    };
                    return Some((
                        Ok(admitted),
                        (acceptor, roster, unread, metrics, turned_away),
                    ));
                }
            }
        },
    )
}

/// The warning written when new connections are refused (once per doubling of `count`).
fn refusal_line(limits: &SeatLimits, why: NoSeat, peer: Option<std::net::SocketAddr>, count: u64) {
    match why {
        NoSeat::Full => tracing::warn!(
            max_connections = limits.max_connections,
            turned_away = count,
            "connection limit reached, no connection idle for {:?} to close; closing new \
             connections (raise --max-connections)",
            limits.reclaim_idle_after
        ),
        NoSeat::PeerFull => tracing::warn!(
            peer = ?peer.map(|p| p.ip()),
            max_connections_per_peer = limits.max_per_peer,
            turned_away = count,
            "a peer holds its share of connections, none idle for {:?}; closing its new \
             connections (raise --max-connections-per-peer)",
            limits.reclaim_idle_after
        ),
    }
}

/// `accept` errors that mean "not now" for the whole process rather than one bad peer.
fn out_of_resources(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// An admitted connection: holds its slot until dropped and fails its reads once the
/// handshake timeout passes before the peer sent its first bytes.
pub struct Admitted {
    stream: TcpStream,
    connection: Arc<Connection>,
    /// The delivery rate its replies reach (`--wire-compression auto`).
    link: Arc<LinkRate>,
    _open: OpenConnection,
    seat: Seat,
    /// Running until the first bytes arrived; `None` after.
    handshake: Option<Pin<Box<Sleep>>>,
    received: usize,
}

/// What tonic puts in each request's extensions: the TCP addresses and the connection's
/// entry in the ledger of unread replies.
#[derive(Clone, Debug)]
pub struct Peer {
    /// Local and remote addresses.
    pub tcp: TcpConnectInfo,
    /// The connection's ledger entry.
    pub connection: Arc<Connection>,
    /// The connection's calls in flight, as its seat's roster counts them.
    pub activity: Arc<Activity>,
    /// The delivery rate measured on the connection.
    pub link: Arc<LinkRate>,
}

impl Peer {
    /// The peer of a request, from its extensions (a plain or a TLS connection).
    pub fn of(extensions: &tonic::codegen::http::Extensions) -> Option<&Peer> {
        extensions.get::<Peer>().or_else(|| {
            extensions
                .get::<TlsConnectInfo<Peer>>()
                .map(TlsConnectInfo::get_ref)
        })
    }

    /// Whether the peer connected from a loopback address (`127.0.0.0/8`, `::1`, or an
    /// IPv4-mapped loopback address), i.e. it shares this machine's files.
    pub fn is_loopback(&self) -> bool {
        self.tcp
            .remote_addr()
            .is_some_and(|addr| is_loopback(&addr))
    }
}

/// Whether `addr` is a loopback address (`127.0.0.0/8`, `::1`, or an IPv4-mapped loopback
/// address).
fn is_loopback(addr: &std::net::SocketAddr) -> bool {
    match addr.ip() {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
        ip => ip.is_loopback(),
    }
}

impl Connected for Admitted {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Self::ConnectInfo {
        Peer {
            tcp: self.stream.connect_info(),
            connection: Arc::clone(&self.connection),
            activity: Arc::clone(self.seat.activity()),
            link: Arc::clone(&self.link),
        }
    }
}

/// The error a closed connection's I/O fails with.
fn closed_by_server() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "closed by the server: its replies stalled (see the server log)",
    )
}

/// The error the I/O of a connection closed to make room fails with.
fn reclaimed() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "closed by the server: idle while a new connection needed its slot",
    )
}

impl Admitted {
    /// Why this connection's I/O must fail now, if it must.
    fn closed(&self) -> Option<io::Error> {
        if self.connection.is_closing() {
            Some(closed_by_server())
        } else if self.seat.activity().is_reclaimed() {
            Some(reclaimed())
        } else {
            None
        }
    }
}

impl AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.connection.register_reader(cx.waker());
        self.seat.activity().register_reader(cx.waker());
        if let Some(err) = self.closed() {
            return Poll::Ready(Err(err));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        let this = &mut *self;
        if let Some(deadline) = this.handshake.as_mut() {
            this.received += buf.filled().len() - before;
            if this.received >= PREFACE_BYTES {
                this.handshake = None;
            } else if polled.is_pending() && deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer sent no HTTP/2 preface within the handshake timeout",
                )));
            }
        }
        polled
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.connection.register_writer(cx.waker());
        self.seat.activity().register_writer(cx.waker());
        if let Some(err) = self.closed() {
            return Poll::Ready(Err(err));
        }
        let written = Pin::new(&mut self.stream).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.link.wrote(&self.stream);
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.connection.register_writer(cx.waker());
        self.seat.activity().register_writer(cx.waker());
        if let Some(err) = self.closed() {
            return Poll::Ready(Err(err));
        }
        let written = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.link.wrote(&self.stream);
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
