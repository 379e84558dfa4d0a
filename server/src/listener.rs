//! The accept loop: admits at most a configured number of connections, drops peers that do
//! not start speaking within the handshake timeout, and backs off instead of spinning when
//! the process runs out of descriptors. Each connection is registered with the ledger of
//! unread replies ([`crate::pins`]), which can close it: its reads and writes then fail and
//! hyper drops it with every stream on it.
//!
//! Without it an idle TCP connection that never sends the HTTP/2 preface was held forever,
//! and with the descriptor limit reached tonic's loop retried `accept` at once, at 100 % CPU,
//! while new clients timed out (issue 14).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{Connected, TcpConnectInfo, TlsConnectInfo};

use crate::metrics::{Metrics, OpenConnection};
use crate::pins::{Connection, Pins};

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
    /// Connections held open at once; beyond it new ones are closed as they arrive.
    pub max_connections: usize,
    /// Time a new connection has to send its first bytes (the HTTP/2 preface or TLS hello).
    pub handshake_timeout: Duration,
}

/// The accepted connections of `listener` under `admission`, ready for tonic's
/// `serve_with_incoming`, each counted in `metrics` while it is open. The stream never
/// yields an error: failures of `accept` are logged and retried (with backoff when
/// descriptors run out).
pub fn incoming(
    listener: TcpListener,
    admission: Admission,
    pins: Arc<Pins>,
    metrics: Metrics,
) -> impl Stream<Item = Result<Admitted, io::Error>> {
    let slots = Arc::new(Semaphore::new(admission.max_connections.max(1)));
    futures::stream::unfold(
        (listener, slots, pins, metrics, BACKOFF_START, 0u64),
        move |(listener, slots, pins, metrics, mut backoff, mut turned_away)| async move {
            loop {
                let stream = match listener.accept().await {
                    Ok((stream, _)) => stream,
                    Err(err) if out_of_resources(&err) => {
                        tracing::warn!(error = %err, pause = ?backoff, "accept failed for lack of resources; pausing");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(BACKOFF_CAP);
                        continue;
                    }
                    Err(err) => {
                        tracing::debug!(error = %err, "accept failed");
                        continue;
                    }
                };
                backoff = BACKOFF_START;
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    // Closed at once: the peer sees a reset, not a hang.
                    turned_away += 1;
                    if turned_away.is_power_of_two() {
                        tracing::warn!(
                            max_connections = admission.max_connections,
                            turned_away,
                            "connection limit reached; closing new connections"
                        );
                    }
                    drop(stream);
                    continue;
                };
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::warn!(error = %e, "cannot set TCP_NODELAY on an accepted connection");
                }
                let connection = pins.connect(stream.peer_addr().ok());
                let admitted = Admitted {
                    stream,
                    connection,
                    _open: metrics.connection_opened(),
                    _slot: permit,
                    handshake: Some(Box::pin(tokio::time::sleep_until(
                        Instant::now() + admission.handshake_timeout,
                    ))),
                    received: 0,
                };
                return Some((
                    Ok(admitted),
                    (listener, slots, pins, metrics, backoff, turned_away),
                ));
            }
        },
    )
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
    _open: OpenConnection,
    _slot: OwnedSemaphorePermit,
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
        self.tcp.remote_addr().is_some_and(|addr| match addr.ip() {
            std::net::IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
            ip => ip.is_loopback(),
        })
    }
}

impl Connected for Admitted {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Self::ConnectInfo {
        Peer {
            tcp: self.stream.connect_info(),
            connection: Arc::clone(&self.connection),
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

impl AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.connection.register_reader(cx.waker());
        if self.connection.is_closing() {
            return Poll::Ready(Err(closed_by_server()));
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
        if self.connection.is_closing() {
            return Poll::Ready(Err(closed_by_server()));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.connection.register_writer(cx.waker());
        if self.connection.is_closing() {
            return Poll::Ready(Err(closed_by_server()));
        }
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
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
