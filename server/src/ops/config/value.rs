//! Typed setting values: a [`Size`] in bytes, a [`Duration`], a pyramid [`Reduction`] and
//! the [`ExternalLocation`] `health` advertises,
//! each parsed once where it enters (a flag, an environment variable or a config file key)
//! by one parser, and printed back in the form that parser reads.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tessera_proto::units::{format_duration, format_size, parse_duration, parse_size};

use super::ConfigError;
use crate::grid::scaled::Method;

/// A number of bytes, written `123`, `64MiB`, `4GiB`, `500MB` or `1.5GiB` (binary and
/// decimal units, case-insensitive; [`tessera_proto::units::parse_size`], which the client
/// reads sizes with too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct Size(u64);

impl Size {
    /// `bytes` bytes.
    pub const fn bytes(bytes: u64) -> Size {
        Size(bytes)
    }

    /// The number of bytes.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl FromStr for Size {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Size, ConfigError> {
        parse_size(text)
            .map(Size)
            .ok_or_else(|| ConfigError::Size(text.to_string()))
    }
}

impl TryFrom<String> for Size {
    type Error = ConfigError;

    fn try_from(text: String) -> Result<Size, ConfigError> {
        text.parse()
    }
}

impl From<Size> for String {
    fn from(size: Size) -> String {
        size.to_string()
    }
}

impl fmt::Display for Size {
    /// The largest binary unit that divides the size exactly (`8MiB`), else bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_size(self.0))
    }
}

/// Where the HTTP API listens: an address, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub enum HttpListen {
    /// No HTTP API.
    Off,
    /// Listen on this address.
    At(std::net::SocketAddr),
}

impl FromStr for HttpListen {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<HttpListen, ConfigError> {
        if text.eq_ignore_ascii_case("off") {
            return Ok(HttpListen::Off);
        }
        text.parse().map(HttpListen::At).map_err(|_| {
            ConfigError::Invalid(format!(
                "http_listen {text:?} is neither an address (127.0.0.1:8817) nor `off`"
            ))
        })
    }
}

impl TryFrom<String> for HttpListen {
    type Error = ConfigError;

    fn try_from(text: String) -> Result<HttpListen, ConfigError> {
        text.parse()
    }
}

impl From<HttpListen> for String {
    fn from(listen: HttpListen) -> String {
        listen.to_string()
    }
}

impl fmt::Display for HttpListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpListen::Off => f.write_str("off"),
            HttpListen::At(addr) => write!(f, "{addr}"),
        }
    }
}

/// A time span, written `2s`, `500ms`, `1.5s`, `1m`, `1h` or a bare number of seconds; zero
/// is refused ([`tessera_proto::units::parse_duration`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct Duration(std::time::Duration);

impl Duration {
    /// The span `span`.
    pub const fn of(span: std::time::Duration) -> Duration {
        Duration(span)
    }

    /// The span.
    pub const fn get(self) -> std::time::Duration {
        self.0
    }
}

impl From<std::time::Duration> for Duration {
    fn from(span: std::time::Duration) -> Duration {
        Duration(span)
    }
}

impl FromStr for Duration {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Duration, ConfigError> {
        parse_duration(text).map(Duration).ok_or_else(|| {
            if is_zero_duration(text) {
                ConfigError::Invalid(format!(
                    "duration '{text}' is zero, and this setting needs a span above zero: \
                     use e.g. 2s, 500ms, 1m"
                ))
            } else {
                ConfigError::Invalid(format!(
                    "duration '{text}' is not understood: use e.g. 2s, 500ms, 1m"
                ))
            }
        })
    }
}

/// Whether `text` is a zero span in one of the forms durations are written in (`0`, `0s`,
/// `0.0ms`), which [`parse_duration`] refuses as a duration.
fn is_zero_duration(text: &str) -> bool {
    let text = text.trim();
    let number = text
        .trim_end_matches(|c: char| c.is_ascii_alphabetic())
        .trim();
    let unit = text[number.len()..].trim();
    matches!(unit, "" | "s" | "ms" | "m" | "min" | "h")
        && number.parse::<f64>().is_ok_and(|n| n == 0.0)
}

/// A lifetime cap: a [`Duration`], or `0` for none (written back as `0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cap(Option<std::time::Duration>);

impl Cap {
    /// The cap `span`.
    pub const fn of(span: std::time::Duration) -> Cap {
        Cap(Some(span))
    }

    /// The cap; `None` when it is off.
    pub const fn get(self) -> Option<std::time::Duration> {
        self.0
    }
}

impl FromStr for Cap {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Cap, ConfigError> {
        if is_zero_duration(text) {
            return Ok(Cap(None));
        }
        parse_duration(text).map(|d| Cap(Some(d))).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "duration '{text}' is not understood: use e.g. 24h, 90m, or 0 for no cap"
            ))
        })
    }
}

impl TryFrom<String> for Cap {
    type Error = ConfigError;

    fn try_from(text: String) -> Result<Cap, ConfigError> {
        text.parse()
    }
}

impl From<Cap> for String {
    fn from(cap: Cap) -> String {
        cap.to_string()
    }
}

impl fmt::Display for Cap {
    /// The span as a [`Duration`] is written, or `0` for no cap.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(span) => f.write_str(&format_duration(span)),
            None => f.write_str("0"),
        }
    }
}

impl TryFrom<String> for Duration {
    type Error = ConfigError;

    fn try_from(text: String) -> Result<Duration, ConfigError> {
        text.parse()
    }
}

impl From<Duration> for String {
    fn from(duration: Duration) -> String {
        duration.to_string()
    }
}

impl fmt::Display for Duration {
    /// Whole seconds (`2s`), else milliseconds (`500ms`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_duration(self.0))
    }
}

/// The reduction method the pyramid advertises for computed levels: `nearest` or `area`
/// (case-insensitive, surrounding blanks ignored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct Reduction(pub Method);

impl FromStr for Reduction {
    type Err = ConfigError;

    fn from_str(name: &str) -> Result<Reduction, ConfigError> {
        match name.trim().to_ascii_lowercase().as_str() {
            "nearest" => Ok(Reduction(Method::Nearest)),
            "area" => Ok(Reduction(Method::Area)),
            _ => Err(ConfigError::Invalid(format!(
                "pyramid method '{name}' is not one of nearest, area"
            ))),
        }
    }
}

impl TryFrom<String> for Reduction {
    type Error = ConfigError;

    fn try_from(name: String) -> Result<Reduction, ConfigError> {
        name.parse()
    }
}

impl From<Reduction> for String {
    fn from(method: Reduction) -> String {
        method.0.name().to_string()
    }
}

/// The address other machines dial this server at (`--external-location`), which `health`
/// answers as `external_location`: a `grpc`, `grpc+tcp`, `grpc+tls` or `grpcs` URL with a
/// host and a port and nothing else. The scheme is kept as written: a TLS-terminating
/// proxy in front of a plain server is advertised `grpc+tls://` on purpose.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct ExternalLocation(String);

/// The schemes a Flight client dials.
const FLIGHT_SCHEMES: [&str; 4] = ["grpc", "grpc+tcp", "grpc+tls", "grpcs"];

impl ExternalLocation {
    /// What a server listening on `listen` advertises when no location is configured: the
    /// listen address when it is one IP other than loopback (`grpc+tls://` with `tls`);
    /// none for loopback, which no other machine can dial, and for the unspecified address
    /// (`0.0.0.0`, `::`), which names no interface (docs/decisions/0034).
    pub fn of_listen(listen: SocketAddr, tls: bool) -> Option<ExternalLocation> {
        let ip = listen.ip();
        if ip.is_loopback() || ip.is_unspecified() {
            return None;
        }
        let scheme = if tls { "grpc+tls" } else { "grpc" };
        Some(ExternalLocation(format!("{scheme}://{listen}")))
    }

    /// The URL.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for ExternalLocation {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<ExternalLocation, ConfigError> {
        let refuse = |why: &str| {
            ConfigError::Invalid(format!(
                "external_location '{text}' {why}: give the URL other machines dial this server \
                 at, e.g. grpc://node7.example.org:8815 (grpc+tls:// when clients use TLS)"
            ))
        };
        let url =
            url::Url::parse(text.trim()).map_err(|e| refuse(&format!("is not a URL ({e})")))?;
        if !FLIGHT_SCHEMES.contains(&url.scheme()) {
            return Err(refuse(&format!(
                "has scheme '{}', not one of {}",
                url.scheme(),
                FLIGHT_SCHEMES.join(", ")
            )));
        }
        let host = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| refuse("has no host"))?;
        if host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok_and(|ip| ip.is_unspecified())
        {
            return Err(refuse(
                "names the unspecified address, which no client can dial",
            ));
        }
        if url.port().is_none() {
            return Err(refuse("has no port"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(refuse("carries credentials"));
        }
        if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
            return Err(refuse(
                "has a path, query or fragment; only scheme://host:port is dialled",
            ));
        }
        Ok(ExternalLocation(
            text.trim().trim_end_matches('/').to_string(),
        ))
    }
}

impl TryFrom<String> for ExternalLocation {
    type Error = ConfigError;

    fn try_from(text: String) -> Result<ExternalLocation, ConfigError> {
        text.parse()
    }
}

impl From<ExternalLocation> for String {
    fn from(location: ExternalLocation) -> String {
        location.0
    }
}

impl fmt::Display for ExternalLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn external_locations_are_flight_urls_with_a_host_and_port() {
        for good in [
            "grpc://node7.example.org:8815",
            "grpc+tls://10.1.2.3:443",
            "grpcs://[fd00::7]:8815/",
            "grpc+tcp://h:1",
        ] {
            let location: ExternalLocation = good.parse().unwrap();
            assert_eq!(location.as_str(), good.trim_end_matches('/'));
        }
        for (bad, why) in [
            ("node7:8815", "scheme 'node7'"),
            ("http://node7:8815", "scheme 'http'"),
            ("grpc://node7", "no port"),
            ("grpc://0.0.0.0:8815", "unspecified"),
            ("grpc://[::]:8815", "unspecified"),
            ("grpc://u:p@node7:8815", "credentials"),
            ("grpc://node7:8815/data", "path"),
            ("grpc://:8815", "external_location"),
            ("not a url", "is not a URL"),
        ] {
            let message = bad.parse::<ExternalLocation>().unwrap_err().to_string();
            assert!(message.contains(why), "{bad}: {message}");
            assert!(message.contains(bad), "{bad}: {message}");
        }
    }

    #[test]
    fn a_listen_address_is_advertised_only_when_other_machines_can_dial_it() {
        let of = |addr: &str, tls| {
            ExternalLocation::of_listen(addr.parse().unwrap(), tls).map(String::from)
        };
        assert_eq!(
            of("10.0.0.5:8815", false).as_deref(),
            Some("grpc://10.0.0.5:8815")
        );
        assert_eq!(
            of("10.0.0.5:8815", true).as_deref(),
            Some("grpc+tls://10.0.0.5:8815")
        );
        assert_eq!(
            of("[fd00::5]:9", false).as_deref(),
            Some("grpc://[fd00::5]:9")
        );
        assert_eq!(of("127.0.0.1:8815", false), None);
        assert_eq!(of("[::1]:8815", false), None);
        assert_eq!(of("0.0.0.0:8815", false), None);
        assert_eq!(of("[::]:8815", true), None);
    }

    #[test]
    fn sizes_read_every_spelling_and_print_what_they_read() {
        for (text, bytes) in [
            ("64MiB", 64 << 20),
            ("1GiB", 1 << 30),
            ("4gib", 4 << 30),
            ("500MB", 500_000_000),
            ("1.5GiB", 3 << 29),
            ("512 MiB", 512 << 20),
            ("1024", 1024),
            ("0", 0),
        ] {
            let size: Size = text.parse().unwrap();
            assert_eq!(size.get(), bytes, "{text}");
            assert_eq!(size.to_string().parse::<Size>().unwrap(), size, "{text}");
        }
        assert_eq!(Size::bytes(8 << 20).to_string(), "8MiB");
    }

    #[test]
    fn bad_sizes_are_refused_with_the_text_and_the_units() {
        for text in ["lots", "12XB", "-1", "", "MiB"] {
            let err = text.parse::<Size>().unwrap_err().to_string();
            assert_eq!(
                err,
                format!(
                    "size '{text}' is not understood: use bytes or a unit such as 64MiB, \
                     4GiB, 500MB"
                )
            );
        }
    }

    #[test]
    fn durations_read_every_spelling_and_refuse_zero_and_nonsense() {
        for (text, millis) in [
            ("2s", 2000),
            ("500ms", 500),
            ("1.5s", 1500),
            ("1m", 60_000),
            ("1min", 60_000),
            ("1h", 3_600_000),
            ("3", 3000),
        ] {
            let span: Duration = text.parse().unwrap();
            assert_eq!(span.get().as_millis(), millis, "{text}");
            assert_eq!(
                span.to_string().parse::<Duration>().unwrap(),
                span,
                "{text}"
            );
        }
        for text in ["2 fortnights", "soon", ""] {
            let err = text.parse::<Duration>().unwrap_err().to_string();
            assert_eq!(
                err,
                format!("duration '{text}' is not understood: use e.g. 2s, 500ms, 1m")
            );
        }
        for text in ["0s", "0", "0ms", "0.0h"] {
            let err = text.parse::<Duration>().unwrap_err().to_string();
            assert!(err.contains(&format!("duration '{text}' is zero")), "{err}");
            assert!(!err.contains("not understood"), "{err}");
        }
    }

    #[test]
    fn a_cap_is_a_duration_or_zero_for_none() {
        assert_eq!(
            "24h".parse::<Cap>().unwrap().get(),
            Some(std::time::Duration::from_secs(86_400))
        );
        for off in ["0", "0s", "0h"] {
            let cap: Cap = off.parse().unwrap();
            assert_eq!(cap.get(), None, "{off}");
            assert_eq!(cap.to_string(), "0");
            assert_eq!(cap.to_string().parse::<Cap>().unwrap(), cap);
        }
        let err = "soon".parse::<Cap>().unwrap_err().to_string();
        assert!(err.contains("or 0 for no cap"), "{err}");
    }

    #[test]
    fn config_files_read_sizes_and_durations_with_the_same_parser() {
        #[derive(Deserialize, Serialize)]
        struct Keys {
            size: Size,
            span: Duration,
        }
        let keys: Keys = toml::from_str("size = \"64MiB\"\nspan = \"250ms\"\n").unwrap();
        assert_eq!(keys.size.get(), 64 << 20);
        assert_eq!(keys.span.get().as_millis(), 250);
        assert_eq!(
            toml::to_string(&keys).unwrap(),
            "size = \"64MiB\"\nspan = \"250ms\"\n"
        );
        let err = toml::from_str::<Keys>("size = \"lots\"\nspan = \"1s\"\n")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("size 'lots' is not understood"), "{err}");
        let err = toml::from_str::<Keys>("size = \"1\"\nspan = \"never\"\n")
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("duration 'never' is not understood"), "{err}");
    }

    #[test]
    fn reductions_are_nearest_or_area() {
        assert_eq!(" Area ".parse::<Reduction>().unwrap().0, Method::Area);
        assert_eq!(String::from(Reduction(Method::Nearest)), "nearest");
        let err = "bicubic".parse::<Reduction>().unwrap_err().to_string();
        assert_eq!(err, "pyramid method 'bicubic' is not one of nearest, area");
    }
}
