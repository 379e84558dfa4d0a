//! Why a call's token was refused (the check itself is the wire's: `wire::flight::auth`).

/// Why a call's token was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The call carried no `authorization` header.
    #[error("missing token: send 'authorization: Bearer <token>'")]
    Missing,
    /// The header is not the server's token.
    #[error("invalid token")]
    Invalid,
}
