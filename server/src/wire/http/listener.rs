//! The accept loop of the HTTP API: the Flight listener's `accept` with backoff
//! ([`Acceptor`]) and at most `--http-max-connections` connections at once (more are
//! closed as they arrive, with a warning). Beside `--tls-cert` every connection is HTTPS:
//! handshakes run as their own tasks, each bounded by [`HANDSHAKE_TIMEOUT`], so a slow or
//! silent client never holds up the others. Connections are kept alive between requests, as
//! a viewer fetching tiles wants; each request is bounded in time by the router.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::wire::listener::{Acceptor, TurnedAway};
use crate::wire::tls::HANDSHAKE_TIMEOUT;

/// Bounds of the HTTP API.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    /// Connections held at once.
    pub max_connections: usize,
    /// Longest one request may take.
    pub timeout: Duration,
}

/// The HTTP listener: capped, and HTTPS when it has an acceptor.
pub struct HttpListener {
    gate: Gate,
    tls: Option<TlsAcceptor>,
    /// HTTPS handshakes under way; a finished one is a connection to hand to the server.
    handshakes: JoinSet<Option<(Held, Option<SocketAddr>)>>,
}

impl HttpListener {
    /// Accepts on `listener` within `limits`; every connection is HTTPS through `tls` when
    /// one is given.
    pub fn new(listener: TcpListener, limits: HttpLimits, tls: Option<TlsAcceptor>) -> Self {
        Self {
            gate: Gate {
                acceptor: Acceptor::new(listener),
                slots: Arc::new(Semaphore::new(limits.max_connections.max(1))),
                max_connections: limits.max_connections,
                turned_away: TurnedAway::default(),
            },
            tls,
            handshakes: JoinSet::new(),
        }
    }

    /// The address bound.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.gate.acceptor.local_addr()
    }

    /// `https` when connections are HTTPS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }
}

/// The TCP side: accepts and holds a slot for each connection.
struct Gate {
    acceptor: Acceptor,
    slots: Arc<Semaphore>,
    max_connections: usize,
    turned_away: TurnedAway,
}

impl Gate {
    /// The next TCP connection there is a slot for; the others are closed with a warning.
    async fn admit(&mut self) -> (TcpStream, OwnedSemaphorePermit, Option<SocketAddr>) {
        loop {
            let stream = self.acceptor.accept().await;
            let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
                let max = self.max_connections;
                self.turned_away.note(|count| {
                    tracing::warn!(
                        http_max_connections = max,
                        turned_away = count,
                        "http connection limit reached; closing new connections \
                         (raise --http-max-connections)"
                    );
                });
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let peer = stream.peer_addr().ok();
            return (stream, slot, peer);
        }
    }
}

/// The TLS handshake of one connection, within [`HANDSHAKE_TIMEOUT`]; `None` when it
/// failed (logged at debug: a port scan or a plain-HTTP client is not the server's fault).
async fn handshake(
    tls: TlsAcceptor,
    stream: TcpStream,
    slot: OwnedSemaphorePermit,
    peer: Option<SocketAddr>,
) -> Option<(Held, Option<SocketAddr>)> {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
        Ok(Ok(stream)) => Some((
            Held {
                stream: Stream::Tls(Box::new(stream)),
                _slot: slot,
            },
            peer,
        )),
        Ok(Err(err)) => {
            tracing::debug!(?peer, error = %err, "https handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(?peer, timeout = ?HANDSHAKE_TIMEOUT, "https handshake timed out");
            None
        }
    }
}

impl axum::serve::Listener for HttpListener {
    type Io = Held;
    type Addr = Option<SocketAddr>;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let Some(tls) = self.tls.clone() else {
            let (stream, slot, peer) = self.gate.admit().await;
            let held = Held {
                stream: Stream::Plain(stream),
                _slot: slot,
            };
            return (held, peer);
        };
        loop {
            tokio::select! {
                (stream, slot, peer) = self.gate.admit() => {
                    self.handshakes.spawn(handshake(tls.clone(), stream, slot, peer));
                }
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(connection)) = done {
                        return connection;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.gate.acceptor.local_addr().map(Some)
    }
}

/// The byte stream of one connection.
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// An HTTP connection: holds its slot until dropped.
pub struct Held {
    stream: Stream,
    _slot: OwnedSemaphorePermit,
}

impl AsyncRead for Held {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Held {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
