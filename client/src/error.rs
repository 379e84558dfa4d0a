//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong talking to a server or writing results.
/// Every message names what failed and why.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The location string could not be understood.
    #[error("location '{location}' is not usable: {reason}")]
    InvalidLocation {
        /// The location as given.
        location: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A TLS location without a CA certificate to check the server against.
    #[error(
        "location '{location}' uses TLS: give the server's CA certificate (PEM) to check \
         it against"
    )]
    TlsNeedsCa {
        /// The location as given.
        location: String,
    },
    /// The CA certificate file cannot be read.
    #[error("cannot read the CA certificate {path}: {source}")]
    TlsCa {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The token cannot travel in a gRPC header.
    #[error("token is not usable in an 'authorization' header: {reason}")]
    InvalidToken {
        /// Why it was refused.
        reason: String,
    },
    /// The TCP/HTTP2 connection could not be opened.
    #[error(
        "cannot connect to '{location}': {}; is a Tessera server running there?",
        root_cause(source)
    )]
    Connect {
        /// The location dialed.
        location: String,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The server serves no tensor of that id.
    #[error("no tensor '{array_id}' on {location}")]
    NoSuchTensor {
        /// The id asked for.
        array_id: String,
        /// The location asked.
        location: String,
        /// The server's refusal.
        #[source]
        status: Box<tonic::Status>,
    },
    /// A Flight call returned an error status.
    #[error("{call} failed: {}{}", status_text(status), auth_hint(status))]
    Rpc {
        /// The call, e.g. `"GetFlightInfo of 'img'"`.
        call: String,
        /// The gRPC status the server (or transport) sent.
        status: Box<tonic::Status>,
    },
    /// The server speaks a Flight protocol this client does not.
    #[error(
        "server at '{location}' speaks biopb Flight protocol {found}, but tessera-client \
         speaks 2 and 3; upgrade the server (or use a client matching it)"
    )]
    IncompatibleProtocol {
        /// The location dialed.
        location: String,
        /// What the health reply said (or "1 (no 'protocol' key)").
        found: String,
    },
    /// The plan schema lacks `chunk_wire_protocol = "2"`.
    #[error(
        "plan of '{array_id}' has chunk wire protocol {found}, but tessera-client reads \
         only chunk_wire_protocol \"2\""
    )]
    WireProtocol {
        /// The array planned.
        array_id: String,
        /// What the schema metadata held.
        found: String,
    },
    /// The GetFlightInfo reply is malformed or inconsistent.
    #[error("plan of '{array_id}' is unusable: {reason}")]
    BadPlan {
        /// The array planned.
        array_id: String,
        /// What is wrong.
        reason: String,
    },
    /// The endpoints do not tile the planned region exactly once.
    #[error("plan of '{array_id}' does not tile its region: {reason}")]
    Tiling {
        /// The array planned.
        array_id: String,
        /// The gap, overlap or out-of-range chunk found.
        reason: String,
    },
    /// A region (text or bounds) was refused.
    #[error("region refused: {reason}")]
    Region {
        /// Why.
        reason: String,
    },
    /// A chunk's batch does not match what the plan promised.
    #[error("chunk {chunk} is unusable: {reason}")]
    BadChunk {
        /// The chunk's bounds in the plan frame, e.g. `[0, 16]..[16, 32]`.
        chunk: String,
        /// What is wrong.
        reason: String,
    },
    /// A numpy dtype string this client cannot size.
    #[error("dtype '{dtype}' is not supported: {reason}")]
    Dtype {
        /// The dtype string.
        dtype: String,
        /// Why.
        reason: String,
    },
    /// An action reply was not the JSON expected.
    #[error("{action} reply is not the expected JSON: {reason}")]
    ActionReply {
        /// The action, e.g. `"health"`.
        action: String,
        /// What was wrong.
        reason: String,
    },
    /// A local file could not be read or written.
    #[error("{what} '{}': {source}", path.display())]
    Io {
        /// What was being done, e.g. `"writing .npy"`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The output would not fit in memory on this platform.
    #[error("output of shape {shape:?} with {itemsize} bytes per element does not fit in memory")]
    TooLarge {
        /// Shape of the output.
        shape: Vec<u64>,
        /// Bytes per element.
        itemsize: usize,
    },
}

/// The server's message without the Arrow Flight detail suffix (`. Detail: Failed`) and,
/// for the catch-all UNKNOWN code, without the code; other codes are named.
fn status_text(status: &tonic::Status) -> String {
    let message = status.message();
    let message = match message.rfind(". Detail: ") {
        Some(at) => &message[..at],
        None => message,
    };
    match status.code() {
        tonic::Code::Unknown => message.to_string(),
        code => format!("{message} ({code:?})"),
    }
}

/// The innermost cause of `err`: the OS error of a refused connection rather than the
/// layers ("transport error", "tcp connect error") that wrap it.
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

fn auth_hint(status: &tonic::Status) -> &'static str {
    match status.code() {
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
            " (the server wants a token)"
        }
        tonic::Code::Unavailable => " (is the server running and reachable at that address?)",
        _ => "",
    }
}

impl ClientError {
    /// A failed RPC named `call`.
    pub(crate) fn rpc(call: impl Into<String>, status: tonic::Status) -> Self {
        Self::Rpc {
            call: call.into(),
            status: Box::new(status),
        }
    }

    /// `status` from GetFlightInfo of `array_id` at `location`: [`ClientError::NoSuchTensor`]
    /// when the server classified it as an unknown id (`extra_info` code `NOT_FOUND`,
    /// reason `unknown_source` or `unknown_field`), else [`ClientError::Rpc`].
    pub(crate) fn planning(array_id: &str, location: &str, status: tonic::Status) -> Self {
        let unknown_id = serde_json::from_slice::<serde_json::Value>(status.details())
            .ok()
            .is_some_and(|info| {
                info["code"] == "NOT_FOUND"
                    && matches!(
                        info["reason"].as_str(),
                        Some("unknown_source" | "unknown_field")
                    )
            });
        if unknown_id {
            Self::NoSuchTensor {
                array_id: array_id.to_string(),
                location: location.to_string(),
                status: Box::new(status),
            }
        } else {
            Self::rpc(format!("GetFlightInfo of '{array_id}'"), status)
        }
    }

    /// Whether the server refused the call for a missing or wrong token.
    pub fn wants_token(&self) -> bool {
        self.status().is_some_and(|status| {
            matches!(
                status.code(),
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            )
        })
    }

    /// The gRPC status inside an [`ClientError::Rpc`], if that is what this is.
    pub fn status(&self) -> Option<&tonic::Status> {
        match self {
            Self::Rpc { status, .. } | Self::NoSuchTensor { status, .. } => Some(status),
            _ => None,
        }
    }
}
