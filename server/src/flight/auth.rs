//! Bearer-token authentication for every call.
//!
//! Clients send `authorization: Bearer <token>` on every RPC (biopb-protocol.md §5).
//! The comparison runs in constant time so response timing reveals nothing of the token.

use subtle::ConstantTimeEq;
use tonic::{Request, Status};

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

/// A tonic interceptor that requires `authorization: Bearer <token>` when a token is set.
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

    /// Accepts or refuses one call.
    pub fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else {
            return Ok(request);
        };
        let Some(given) = request.metadata().get("authorization") else {
            return Err(ServiceError::Unauthenticated(
                "missing token: send 'authorization: Bearer <token>'".to_string(),
            )
            .into());
        };
        if bool::from(given.as_bytes().ct_eq(expected)) {
            Ok(request)
        } else {
            Err(ServiceError::Unauthenticated("invalid token".to_string()).into())
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

    #[test]
    fn wrong_and_missing_tokens_are_refused() {
        let check = TokenCheck::new(Some("abcdefghijklmnop".to_string()));
        assert!(check.check(Request::new(())).is_err());
        let mut bad = Request::new(());
        bad.metadata_mut().insert(
            "authorization",
            "Bearer abcdefghijklmnoq"
                .parse()
                .unwrap_or_else(|_| unreachable!()),
        );
        assert_eq!(
            check.check(bad).err().map(|s| s.code()),
            Some(tonic::Code::Unauthenticated)
        );
        let mut good = Request::new(());
        good.metadata_mut().insert(
            "authorization",
            "Bearer abcdefghijklmnop"
                .parse()
                .unwrap_or_else(|_| unreachable!()),
        );
        assert!(check.check(good).is_ok());
        assert!(TokenCheck::new(None).check(Request::new(())).is_ok());
    }
}
