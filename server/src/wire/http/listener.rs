//! The accept loop of the HTTP API: the Flight listener's `accept` with backoff
//! ([`Acceptor`]) and at most `--http-max-connections` connections at once (more are
//! closed as they arrive, with a warning). Connections are kept alive between requests, as
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

use crate::wire::listener::{Acceptor, TurnedAway};

/// Bounds of the HTTP API.
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    /// Connections held at once.
    pub max_connections: usize,
    /// Longest one request may take.
    pub timeout: Duration,
}

/// The HTTP listener: capped.
pub struct HttpListener {
    acceptor: Acceptor,
    slots: Arc<Semaphore>,
    max_connections: usize,
    turned_away: TurnedAway,
}

impl HttpListener {
    /// Accepts on `listener` within `limits`.
    pub fn new(listener: TcpListener, limits: HttpLimits) -> Self {
        Self {
            acceptor: Acceptor::new(listener),
            slots: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            max_connections: limits.max_connections,
            turned_away: TurnedAway::default(),
        }
    }

    /// The address bound.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.acceptor.local_addr()
    }
}

impl axum::serve::Listener for HttpListener {
    type Io = Held;
    type Addr = Option<SocketAddr>;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
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
            return (
                Held {
                    stream,
                    _slot: slot,
                },
                peer,
            );
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.acceptor.local_addr().map(Some)
    }
}

/// An HTTP connection: holds its slot until dropped.
pub struct Held {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl AsyncRead for Held {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Held {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
