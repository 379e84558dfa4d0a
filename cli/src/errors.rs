//! How a failed command reads on stderr: one line, each cause once, and the next step when
//! there is an obvious one (`tessera ls` for an unknown id, `--cache-dir` for a cache
//! directory in use).

use tessera_client::ClientError;

/// `err` and its causes on one line, joined by `: `. A cause whose text an earlier one
/// already contains is left out, and the chain stops at a [`ClientError`], whose message is
/// complete (a connection failure names its OS error, not the transport layers around it).
pub fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        if let Some(client) = cause.downcast_ref::<ClientError>() {
            if let Some(hint) = client_hint(client) {
                line.push_str("; ");
                line.push_str(&hint);
            }
            break;
        }
    }
    line
}

/// What to do about a client failure, when the message alone does not say: the flags and
/// environment variables of these commands, never the Rust calls behind them.
fn client_hint(err: &ClientError) -> Option<String> {
    match err {
        ClientError::NoSuchTensor { location, .. } => {
            Some(format!("`tessera ls {location}` lists them"))
        }
        ClientError::TlsNeedsCa { .. } => {
            Some("pass it with --tls-ca FILE (or TESSERA_TLS_CA=FILE)".to_string())
        }
        ClientError::Connect { location, .. } if location.starts_with("grpc://") => Some(format!(
            "if that server uses TLS, use {} (with --tls-ca FILE)",
            location.replacen("grpc://", "grpcs://", 1)
        )),
        _ if err.wants_token() => {
            Some("pass the token with --token TOKEN (or TESSERA_TOKEN=TOKEN)".to_string())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer: {0}")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn causes_already_in_the_message_are_not_repeated() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let err = anyhow::Error::new(Outer(io)).context("cannot start");
        assert_eq!(one_line(&err), "cannot start: outer: no such file");
    }
}
