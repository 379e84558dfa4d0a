//! Bearer-token authentication for every call: one tower layer, [`Authenticated`], in
//! front of every route, so each call is checked exactly once.
//!
//! Clients send `authorization: Bearer <token>` on every RPC (biopb-protocol.md §5).
//! The comparison runs in constant time so response timing reveals nothing of the token.
//!
//! One exemption, opted into with [`Authenticated::with_sealed_roi_reads`] in front of the
//! chunk route only: a DoGet without a valid token goes on to the chunk route carrying its
//! refusal ([`TokenRefused`]); the route answers that refusal for every ticket but a
//! `roi_read` carrying a sealed grant, whose seal is then checked before anything is read.

use crate::error::TokenError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use subtle::ConstantTimeEq;
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;

use crate::error::ServiceError;

/// Why a token was refused at startup.
#[derive(Debug, thiserror::Error)]
#[error("token is {0}: tokens are 16 to 128 characters of [A-Za-z0-9_-]")]
pub struct BadToken(&'static str);

/// Checks the token's form: 16–128 characters of `[A-Za-z0-9_-]`.
pub fn validate_token(token: &str) -> Result<(), BadToken> {
    if token.len() < 16 {
        return Err(BadToken("too short"));
    }
    if token.len() > 128 {
        return Err(BadToken("too long"));
    }
    if !token
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(BadToken("made of characters outside the allowed set"));
    }
    Ok(())
}

/// The HTTP path of Flight's DoGet.
pub const DO_GET_PATH: &str = "/arrow.flight.protocol.FlightService/DoGet";

/// A DoGet whose token was refused, let through to the chunk route: only a sealed ROI
/// ticket may stand in for the token; every other ticket is answered with this refusal.
#[derive(Clone, Debug)]
pub struct TokenRefused(pub ServiceError);

/// Requires `authorization: Bearer <token>` when a token is set.
#[derive(Clone)]
pub struct TokenCheck {
    expected: Option<Vec<u8>>,
}

impl TokenCheck {
    /// Checks calls against `token`; `None` lets every call through (local mode).
    pub fn new(token: Option<String>) -> Self {
        Self {
            expected: token.map(|t| format!("Bearer {t}").into_bytes()),
        }
    }

    /// Accepts or refuses one call by its request headers.
    pub fn check(&self, headers: &http::HeaderMap) -> Result<(), Status> {
        self.refusal(headers).map_or(Ok(()), |e| Err(e.into()))
    }

    /// Why one call is refused by its request headers (`None`: accepted).
    fn refusal(&self, headers: &http::HeaderMap) -> Option<ServiceError> {
        let expected = self.expected.as_ref()?;
        let Some(given) = headers.get(tessera_proto::AUTHORIZATION_HEADER) else {
            return Some(TokenError::Missing.into());
        };
        if bool::from(given.as_bytes().ct_eq(expected)) {
            None
        } else {
            Some(TokenError::Invalid.into())
        }
    }
}

/// Wraps a gRPC service: every call passes [`TokenCheck`] first, or is answered with its
/// UNAUTHENTICATED status without reaching `inner`.
#[derive(Clone)]
pub struct Authenticated<S> {
    inner: S,
    check: TokenCheck,
    sealed_roi_reads: bool,
}

impl<S> Authenticated<S> {
    /// Checks every call to `inner` with `check`.
    pub fn new(inner: S, check: TokenCheck) -> Self {
        Self {
            inner,
            check,
            sealed_roi_reads: false,
        }
    }

    /// Lets a DoGet with no valid token through to `inner` with [`TokenRefused`] in its
    /// extensions. Only for an `inner` that is the chunk route
    /// ([`super::chunk_get::ChunkGet`]), which answers that refusal unless the ticket is a
    /// sealed ROI read.
    pub fn with_sealed_roi_reads(mut self) -> Self {
        self.sealed_roi_reads = true;
        self
    }
}

impl<S: NamedService> NamedService for Authenticated<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tonic::codegen::Service<http::Request<B>> for Authenticated<S>
where
    S: tonic::codegen::Service<http::Request<B>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        match self.check.refusal(request.headers()) {
            None => Box::pin(self.inner.call(request)),
            Some(refusal) if self.sealed_roi_reads && request.uri().path() == DO_GET_PATH => {
                request.extensions_mut().insert(TokenRefused(refusal));
                Box::pin(self.inner.call(request))
            }
            Some(refusal) => Box::pin(std::future::ready(Ok(Status::from(refusal).into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_form_is_checked() {
        assert!(validate_token("abcdefghijklmnop").is_ok());
        assert!(validate_token("short").is_err());
        assert!(validate_token(&"a".repeat(129)).is_err());
        assert!(validate_token("abcdefghijklmnop!").is_err());
    }

    fn headers(authorization: &'static str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "authorization",
            http::HeaderValue::from_static(authorization),
        );
        headers
    }

    /// Answers 200, saying in a header whether the call came with a [`TokenRefused`].
    #[derive(Clone)]
    struct Marks;

    impl tonic::codegen::Service<http::Request<()>> for Marks {
        type Response = http::Response<Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<()>) -> Self::Future {
            let mut response = http::Response::new(Body::empty());
            let refused = request.extensions().get::<TokenRefused>().is_some();
            response.headers_mut().insert(
                "x-token-refused",
                http::HeaderValue::from_static(if refused { "yes" } else { "no" }),
            );
            std::future::ready(Ok(response))
        }
    }

    /// `(grpc-status of a refusal, x-token-refused of a forwarded call)`.
    async fn answer(
        service: &mut Authenticated<Marks>,
        path: &str,
        authorization: Option<&'static str>,
    ) -> (Option<String>, Option<String>) {
        use tonic::codegen::Service;
        let mut request = http::Request::new(());
        *request.uri_mut() = path.parse().unwrap_or_default();
        if let Some(value) = authorization {
            request
                .headers_mut()
                .insert("authorization", http::HeaderValue::from_static(value));
        }
        let Ok(response) = service.call(request).await;
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        (header("grpc-status"), header("x-token-refused"))
    }

    #[tokio::test]
    async fn only_do_get_passes_without_a_token_and_only_when_opted_in() {
        let check = TokenCheck::new(Some("abcdefghijklmnop".to_string()));
        let get_info = "/arrow.flight.protocol.FlightService/GetFlightInfo";
        let unauthenticated = (Some("16".to_string()), None);
        let mut plain = Authenticated::new(Marks, check.clone());
        assert_eq!(answer(&mut plain, DO_GET_PATH, None).await, unauthenticated);
        let mut sealed = Authenticated::new(Marks, check).with_sealed_roi_reads();
        let marked = |m: &str| (None, Some(m.to_string()));
        assert_eq!(answer(&mut sealed, DO_GET_PATH, None).await, marked("yes"));
        assert_eq!(
            answer(&mut sealed, DO_GET_PATH, Some("Bearer wrong-token-000")).await,
            marked("yes")
        );
        assert_eq!(
            answer(&mut sealed, DO_GET_PATH, Some("Bearer abcdefghijklmnop")).await,
            marked("no")
        );
        assert_eq!(answer(&mut sealed, get_info, None).await, unauthenticated);
        assert_eq!(
            answer(&mut sealed, get_info, Some("Bearer abcdefghijklmnop")).await,
            marked("no")
        );
    }

    #[test]
    fn wrong_and_missing_tokens_are_refused() {
        let check = TokenCheck::new(Some("abcdefghijklmnop".to_string()));
        assert!(check.check(&http::HeaderMap::new()).is_err());
        assert_eq!(
            check
                .check(&headers("Bearer abcdefghijklmnoq"))
                .err()
                .map(|s| s.code()),
            Some(tonic::Code::Unauthenticated)
        );
        assert!(check.check(&headers("Bearer abcdefghijklmnop")).is_ok());
        assert!(TokenCheck::new(None).check(&http::HeaderMap::new()).is_ok());
    }
}
