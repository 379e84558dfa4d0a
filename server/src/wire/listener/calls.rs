//! The tower wrapper that tells the [`super::Roster`] which connections have calls in
//! flight: a call counts from its request until its reply body is dropped (sent, failed or
//! cancelled), so a connection streaming a long reply is never taken for an idle one.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;

use super::CallInFlight;
use super::Peer;

/// Counts every call of `inner` as in flight on its connection while it runs.
#[derive(Clone, Debug)]
pub struct CountCalls<S> {
    inner: S,
}

impl<S> CountCalls<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S: NamedService> NamedService for CountCalls<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tonic::codegen::Service<http::Request<B>> for CountCalls<S>
where
    S: tonic::codegen::Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let in_flight = Peer::of(request.extensions()).map(|peer| peer.activity.call());
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = call.await?;
            Ok(match in_flight {
                Some(in_flight) => response.map(|body| {
                    Body::new(Counted {
                        body,
                        _in_flight: in_flight,
                    })
                }),
                None => response,
            })
        })
    }
}

/// A reply body that keeps its call counted until it is dropped.
struct Counted {
    body: Body,
    _in_flight: CallInFlight,
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
