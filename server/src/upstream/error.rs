//! What can go wrong with an upstream tensor server, and what a request does about it.

use crate::source::{SourceError, SourceErrorKind};

/// Why an upstream could not be used.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The address is not one of an upstream.
    #[error("upstream address '{address}' is refused: {why}")]
    Address {
        /// The address as written.
        address: String,
        /// Why.
        why: String,
    },
    /// The upstream's token or CA file could not be read, or the token is no header value.
    #[error("upstream credentials refused: {0}")]
    Credentials(String),
    /// The upstream cannot be reached now (down, or the link is).
    #[error("upstream {upstream} is unreachable: {status}")]
    Unreachable {
        /// The upstream's address.
        upstream: String,
        /// What the call got.
        status: Box<tonic::Status>,
    },
    /// The upstream no longer serves what was planned (its tensor changed or went away).
    #[error(
        "upstream {upstream} no longer serves this chunk of '{array_id}' (it changed): {status}"
    )]
    Changed {
        /// The upstream's address.
        upstream: String,
        /// The upstream's id of the tensor.
        array_id: String,
        /// What the call got.
        status: Box<tonic::Status>,
    },
    /// The upstream refused a call for another reason.
    #[error("upstream {upstream} refused {call} of '{array_id}': {status}")]
    Refused {
        /// The upstream's address.
        upstream: String,
        /// The call.
        call: &'static str,
        /// The upstream's id of the tensor.
        array_id: String,
        /// What the call got.
        status: Box<tonic::Status>,
    },
    /// The upstream answered something this server cannot use.
    #[error("upstream {upstream} sent a bad reply for '{array_id}': {why}")]
    BadReply {
        /// The upstream's address.
        upstream: String,
        /// The upstream's id of the tensor.
        array_id: String,
        /// What is wrong with it.
        why: String,
    },
}

impl UpstreamError {
    /// An error of `call` for `array_id` from the `status` the upstream answered.
    pub fn of_status(
        upstream: &str,
        call: &'static str,
        array_id: &str,
        status: tonic::Status,
    ) -> UpstreamError {
        use tonic::Code;
        let upstream = upstream.to_string();
        let status = Box::new(status);
        // UNKNOWN is two things: the code biopb's servers (and this one) refuse a request
        // with, sent by the upstream in its trailers; and what tonic makes of a transport
        // failure it cannot name, which keeps that failure as its source.
        let answered = std::error::Error::source(&*status).is_none();
        match status.code() {
            Code::Unknown if !answered => UpstreamError::Unreachable { upstream, status },
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                UpstreamError::Unreachable { upstream, status }
            }
            Code::NotFound | Code::FailedPrecondition if call == "DoGet" => {
                UpstreamError::Changed {
                    upstream,
                    array_id: array_id.to_string(),
                    status,
                }
            }
            _ => UpstreamError::Refused {
                upstream,
                call,
                array_id: array_id.to_string(),
                status,
            },
        }
    }

    /// What a request does about it: an unreachable upstream is UNAVAILABLE, a changed
    /// one a stale chunk (plan again).
    pub fn kind(&self) -> SourceErrorKind {
        match self {
            UpstreamError::Unreachable { .. } => SourceErrorKind::Unreachable,
            UpstreamError::Changed { .. } => SourceErrorKind::Changed,
            _ => SourceErrorKind::Failed,
        }
    }

    /// The error as the chunk service sees it, its message kept.
    pub fn to_source_error(&self) -> SourceError {
        SourceError::new(self.kind(), self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(status: tonic::Status) -> SourceErrorKind {
        UpstreamError::of_status("grpc://origin:8815", "GetFlightInfo", "a", status).kind()
    }

    #[test]
    fn an_answered_unknown_is_a_refusal_and_a_nameless_transport_failure_is_not() {
        // What biopb's server answers for a source it cannot plan (its `scratch`).
        assert_eq!(
            class(tonic::Status::unknown("scratch has no tensors yet")),
            SourceErrorKind::Failed
        );
        let broken = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "connection reset");
        assert_eq!(
            class(tonic::Status::from_error(Box::new(broken))),
            SourceErrorKind::Unreachable
        );
        assert_eq!(
            class(tonic::Status::unavailable("tcp connect error")),
            SourceErrorKind::Unreachable
        );
    }
}
