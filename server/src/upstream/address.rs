//! The address of an upstream tensor server as an operator writes it where a path would
//! go: `grpc://host:port` (every tensor the upstream serves) or `grpc://host:port/SOURCE`
//! (one of them), `grpc+tls://` for an upstream behind TLS.

use crate::upstream::error::UpstreamError;

/// The schemes of an upstream address and whether each speaks TLS.
const SCHEMES: [(&str, bool); 2] = [("grpc://", false), ("grpc+tls://", true)];

/// Whether `text` is written as an upstream address rather than a path.
pub fn is_upstream(text: &str) -> bool {
    SCHEMES.iter().any(|(scheme, _)| text.starts_with(scheme))
}

/// A parsed upstream address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamAddress {
    /// `scheme://host:port`, as logs, errors and `source_url` name the upstream.
    pub base: String,
    /// Whether the upstream is dialled with TLS.
    pub tls: bool,
    /// `host:port`.
    pub authority: String,
    /// The one upstream tensor served, when the address names one.
    pub source: Option<String>,
}

impl UpstreamAddress {
    /// Parses `text`; refuses another scheme, a missing host or port, and a path of more
    /// than one segment.
    pub fn parse(text: &str) -> Result<UpstreamAddress, UpstreamError> {
        let bad = |why: &str| UpstreamError::Address {
            address: text.to_string(),
            why: why.to_string(),
        };
        let (scheme, tls) = SCHEMES
            .iter()
            .find(|(scheme, _)| text.starts_with(scheme))
            .ok_or_else(|| bad("it must start with grpc:// or grpc+tls://"))?;
        let rest = &text[scheme.len()..];
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let Some((host, port)) = authority.rsplit_once(':') else {
            return Err(bad("it names no port (grpc://host:port)"));
        };
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad(
                "its host is empty or its port is not a number up to 65535",
            ));
        }
        let path = path.trim_end_matches('/');
        if path.contains('/') {
            return Err(bad(
                "its path names more than one source (grpc://host:port/SOURCE)",
            ));
        }
        Ok(UpstreamAddress {
            base: format!("{scheme}{authority}"),
            tls: *tls,
            authority: authority.to_string(),
            source: (!path.is_empty()).then(|| path.to_string()),
        })
    }

    /// The endpoint tonic dials (`http://host:port` or `https://host:port`).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.authority)
    }

    /// The `source_url` (and registry path) of the upstream tensor `id`.
    pub fn url_of(&self, id: &str) -> String {
        format!("{}/{id}", self.base)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn addresses_name_the_upstream_and_maybe_one_source() {
        let all = UpstreamAddress::parse("grpc://origin:8815").unwrap();
        assert_eq!(all.base, "grpc://origin:8815");
        assert_eq!(all.source, None);
        assert_eq!(all.endpoint(), "http://origin:8815");
        let one = UpstreamAddress::parse("grpc+tls://10.0.0.1:9000/cells/").unwrap();
        assert!(one.tls);
        assert_eq!(one.source.as_deref(), Some("cells"));
        assert_eq!(one.url_of("cells"), "grpc+tls://10.0.0.1:9000/cells");
        for bad in [
            "http://h:1",
            "grpc://h",
            "grpc://:1",
            "grpc://h:x",
            "grpc://h:1/a/b",
        ] {
            assert!(UpstreamAddress::parse(bad).is_err(), "{bad}");
        }
        assert!(is_upstream("grpc+tls://h:1") && !is_upstream("/data/grpc://x"));
    }
}
