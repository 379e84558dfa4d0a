//! Server addresses: a Flight location string parsed into its scheme, host and whether it is loopback.

use std::net::IpAddr;

use crate::error::ClientError;

/// A server address: a Flight location (`grpc://host:port`) parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAddress {
    /// The location as the caller wrote it.
    pub original: String,
    /// The `http://host:port` URI tonic dials.
    pub uri: String,
    /// The host, without IPv6 brackets.
    pub host: String,
    /// Whether the location asks for TLS (`grpc+tls://`, `grpcs://`, `https://`).
    pub tls: bool,
}

impl ServerAddress {
    /// Parses `grpc://host:port`, `grpc+tcp://host:port`, `http://host:port` or a bare
    /// `host:port` (plaintext), and `grpc+tls://`, `grpcs://` or `https://` (TLS).
    pub fn parse(location: &str) -> Result<ServerAddress, ClientError> {
        let invalid = |reason: &str| ClientError::InvalidLocation {
            location: location.to_string(),
            reason: reason.to_string(),
        };
        let trimmed = location.trim();
        let (rest, tls) = match trimmed.split_once("://") {
            None => (trimmed, false),
            Some((scheme, rest)) => match scheme.to_ascii_lowercase().as_str() {
                "grpc" | "grpc+tcp" | "http" => (rest, false),
                "grpc+tls" | "grpcs" | "https" => (rest, true),
                other => {
                    return Err(invalid(&format!(
                        "scheme '{other}' is not one of grpc://, grpc+tcp://, http://, \
                         grpc+tls://, grpcs://, https://"
                    )));
                }
            },
        };
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(invalid("expected host:port after the scheme"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && !port.contains(']') => (host, port),
            _ => return Err(invalid("no port given (expected host:port)")),
        };
        if port.parse::<u16>().is_err() {
            return Err(invalid(&format!("port '{port}' is not a number 0-65535")));
        }
        let bare_host = host.trim_start_matches('[').trim_end_matches(']');
        if bare_host.contains(':') && !host.starts_with('[') {
            return Err(invalid(
                "an IPv6 host must be written in brackets, e.g. [::1]:8815",
            ));
        }
        Ok(ServerAddress {
            original: location.to_string(),
            uri: format!("{}://{host}:{port}", if tls { "https" } else { "http" }),
            host: bare_host.to_string(),
            tls,
        })
    }

    /// Whether the host is this machine: `localhost`, `127.0.0.0/8` or `::1`.
    /// Only then can segment paths the server names be opened here.
    pub fn is_loopback(&self) -> bool {
        if self.host.eq_ignore_ascii_case("localhost") {
            return true;
        }
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V4(v4)) => v4.is_loopback(),
            Ok(IpAddr::V6(v6)) => v6.is_loopback(),
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn plaintext_schemes_parse() {
        for text in [
            "grpc://127.0.0.1:8815",
            "grpc+tcp://127.0.0.1:8815",
            "http://127.0.0.1:8815/",
            "127.0.0.1:8815",
        ] {
            let location = ServerAddress::parse(text).unwrap();
            assert_eq!(location.uri, "http://127.0.0.1:8815", "{text}");
            assert_eq!(location.host, "127.0.0.1");
        }
        let v6 = ServerAddress::parse("grpc://[::1]:9000").unwrap();
        assert_eq!(v6.uri, "http://[::1]:9000");
        assert_eq!(v6.host, "::1");
    }

    #[test]
    fn tls_schemes_dial_https_and_junk_is_refused_with_reasons() {
        for text in ["grpc+tls://host:1", "grpcs://host:1", "https://host:1"] {
            let location = ServerAddress::parse(text).unwrap();
            assert!(location.tls, "{text}");
            assert_eq!(location.uri, "https://host:1");
        }
        assert!(!ServerAddress::parse("grpc://host:1").unwrap().tls);
        let err = ServerAddress::parse("ftp://host:1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("scheme 'ftp'"), "{err}");
        let err = ServerAddress::parse("grpc://host").unwrap_err().to_string();
        assert!(err.contains("no port"), "{err}");
        let err = ServerAddress::parse("grpc://host:99999")
            .unwrap_err()
            .to_string();
        assert!(err.contains("99999"), "{err}");
    }

    #[test]
    fn loopback_hosts_are_recognised() {
        for (text, expected) in [
            ("grpc://localhost:1", true),
            ("grpc://127.0.0.1:1", true),
            ("grpc://127.3.2.1:1", true),
            ("grpc://[::1]:1", true),
            ("grpc://10.0.0.1:1", false),
            ("grpc://example.org:1", false),
            ("grpc://0.0.0.0:1", false),
        ] {
            assert_eq!(
                ServerAddress::parse(text).unwrap().is_loopback(),
                expected,
                "{text}"
            );
        }
    }
}
