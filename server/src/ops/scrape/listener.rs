//! The accept loop of the `/metrics` endpoint: the Flight listener's `accept` with backoff
//! ([`Acceptor`]), at most `--metrics-max-connections` connections at once (more are closed
//! as they arrive), and each connection closed `--metrics-timeout` after it was accepted,
//! whatever it is doing. Replies say `Connection: close`, so a scrape is one connection and
//! the timeout bounds the scrape.
//!
//! Without it 1,100 idle connections were held 45 s and more, and at a 1,024 descriptor
//! limit the Flight port stopped answering (issue 28, item 9).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::wire::listener::{Acceptor, TurnedAway};

/// Bounds of the `/metrics` listener.
#[derive(Clone, Copy, Debug)]
pub struct ScrapeLimits {
    /// Connections held at once.
    pub max_connections: usize,
    /// Longest life of one connection, from accept to close.
    pub timeout: Duration,
}

/// The `/metrics` listener: capped, each connection on a deadline.
pub struct ScrapeListener {
    acceptor: Acceptor,
    slots: Arc<Semaphore>,
    limits: ScrapeLimits,
    turned_away: TurnedAway,
}

impl ScrapeListener {
    /// Accepts on `listener` within `limits`.
    pub fn new(listener: TcpListener, limits: ScrapeLimits) -> Self {
        Self {
            acceptor: Acceptor::new(listener),
            slots: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            limits,
            turned_away: TurnedAway::default(),
        }
    }

    /// The address bound.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.acceptor.local_addr()
    }
}

impl axum::serve::Listener for ScrapeListener {
    type Io = Timed;
    type Addr = Option<SocketAddr>;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let stream = self.acceptor.accept().await;
            let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
                let max = self.limits.max_connections;
                self.turned_away.note(|count| {
                    tracing::warn!(
                        metrics_max_connections = max,
                        turned_away = count,
                        "metrics endpoint connection limit reached; closing new connections \
                         (raise --metrics-max-connections)"
                    );
                });
                drop(stream);
                continue;
            };
            let peer = stream.peer_addr().ok();
            let deadline = Box::pin(tokio::time::sleep_until(
                Instant::now() + self.limits.timeout,
            ));
            return (
                Timed {
                    stream,
                    _slot: slot,
                    deadline,
                    timeout: self.limits.timeout,
                },
                peer,
            );
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.acceptor.local_addr().map(Some)
    }
}

/// A metrics connection: holds its slot until dropped; its I/O fails once its deadline
/// has passed.
pub struct Timed {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
}

impl Timed {
    /// The timeout error once the deadline passed (registering the task to be woken then).
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        self.deadline.as_mut().poll(cx).is_ready().then(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "metrics connection open longer than --metrics-timeout ({:?})",
                    self.timeout
                ),
            )
        })
    }
}

impl AsyncRead for Timed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(err) = self.expired(cx) {
            return Poll::Ready(Err(err));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Timed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(err) = self.expired(cx) {
            return Poll::Ready(Err(err));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(err) = self.expired(cx) {
            return Poll::Ready(Err(err));
        }
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
