//! The tower wrapper in front of every gRPC route: counts each call by Flight method and
//! status code in `tessera_grpc_calls_total` and logs one line per failed call.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::Code;
use tonic::codegen::http;
use tonic::server::NamedService;

use super::Metrics;

/// The Flight RPC names used as the `method` label.
const METHODS: [&str; 10] = [
    "Handshake",
    "ListFlights",
    "GetFlightInfo",
    "PollFlightInfo",
    "GetSchema",
    "DoGet",
    "DoPut",
    "DoExchange",
    "DoAction",
    "ListActions",
];

/// A gRPC service wrapper that counts every call by method and status code and
/// logs one line per failed call with its cause (the status message).
#[derive(Clone, Debug)]
pub struct Metered<S> {
    inner: S,
    metrics: Metrics,
}

impl<S> Metered<S> {
    /// Wraps `inner`, counting its calls in `metrics`.
    pub fn new(inner: S, metrics: Metrics) -> Self {
        Self { inner, metrics }
    }
}

impl<S: NamedService> NamedService for Metered<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> tonic::codegen::Service<http::Request<B>> for Metered<S>
where
    S: tonic::codegen::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    R: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = method_name(request.uri().path());
        let call = self.inner.call(request);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let result = call.await;
            if let Ok(response) = &result {
                // Failures before the first message travel as a trailers-only
                // response: the status is in the headers. Streams that started
                // end with OK (Tessera's replies never fail mid-stream).
                let status = tonic::Status::from_header_map(response.headers());
                let code = status.as_ref().map_or(Code::Ok, tonic::Status::code);
                metrics.record_call(method, code_name(code));
                if let Some(status) = status.filter(|s| s.code() != Code::Ok) {
                    log_failure(method, &status);
                }
            }
            result
        })
    }
}

/// One line per failed call: server faults at error; unavailability at warn and the
/// caller's mistakes (unknown id, bad ticket, missing token) at info, one line per method
/// and code every [`super::quiet::WINDOW`] (the rest at debug), so a client repeating a
/// refused call cannot fill the log.
fn log_failure(method: &str, status: &tonic::Status) {
    let code = code_name(status.code());
    let cause = status.message();
    if matches!(status.code(), Code::Internal | Code::DataLoss) {
        tracing::error!(method, code, cause, "call failed");
        return;
    }
    let Some(held_back) = super::quiet::admit(&format!("call failed {method} {code}")) else {
        tracing::debug!(method, code, cause, "call failed");
        return;
    };
    match status.code() {
        Code::Unavailable | Code::ResourceExhausted => {
            tracing::warn!(method, code, cause, held_back, "call failed");
        }
        _ => tracing::info!(method, code, cause, held_back, "call failed"),
    }
}

/// The canonical upper-case name of a gRPC code.
fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The Flight method named by a gRPC request path, or `unknown`.
fn method_name(path: &str) -> &'static str {
    let name = path.rsplit('/').next().unwrap_or_default();
    METHODS
        .iter()
        .find(|m| **m == name)
        .copied()
        .unwrap_or("unknown")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::convert::Infallible;

    use tonic::codegen::Service as _;

    use super::*;

    #[test]
    fn method_labels_are_bounded() {
        assert_eq!(
            method_name("/arrow.flight.protocol.FlightService/DoGet"),
            "DoGet"
        );
        assert_eq!(method_name("/evil/xyz"), "unknown");
        assert_eq!(code_name(Code::Unauthenticated), "UNAUTHENTICATED");
    }

    /// Answers every call with `grpc-status: <code>` in its headers (a trailers-only reply).
    #[derive(Clone)]
    struct Answers(Code);

    impl tonic::codegen::Service<http::Request<()>> for Answers {
        type Response = http::Response<()>;
        type Error = Infallible;
        type Future = std::future::Ready<Result<Self::Response, Infallible>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _request: http::Request<()>) -> Self::Future {
            let mut response = http::Response::new(());
            if self.0 != Code::Ok {
                let status = tonic::Status::new(self.0, "no such source");
                status
                    .add_header(response.headers_mut())
                    .expect("a valid status header");
            }
            std::future::ready(Ok(response))
        }
    }

    async fn call(service: &mut Metered<Answers>, path: &str) {
        let request = http::Request::builder().uri(path).body(()).unwrap();
        service.call(request).await.unwrap();
    }

    #[tokio::test]
    async fn calls_are_counted_by_method_and_code() {
        let metrics = Metrics::new();
        let mut ok = Metered::new(Answers(Code::Ok), metrics.clone());
        let mut refused = Metered::new(Answers(Code::Unauthenticated), metrics.clone());
        for _ in 0..3 {
            call(&mut ok, "/arrow.flight.protocol.FlightService/DoGet").await;
        }
        call(
            &mut refused,
            "/arrow.flight.protocol.FlightService/DoAction",
        )
        .await;
        call(&mut ok, "/other.Service/Nope").await;
        let mut out = String::new();
        metrics.encode(&mut out).unwrap();
        for line in [
            "tessera_grpc_calls_total{method=\"DoGet\",code=\"OK\"} 3\n",
            "tessera_grpc_calls_total{method=\"DoAction\",code=\"UNAUTHENTICATED\"} 1\n",
            "tessera_grpc_calls_total{method=\"unknown\",code=\"OK\"} 1\n",
        ] {
            assert!(out.contains(line), "{line:?} missing from:\n{out}");
        }
        assert_eq!(out.matches("tessera_grpc_calls_total{").count(), 3, "{out}");
    }
}
