//! Cross-origin requests (CORS) to the HTTP API, off unless origins are configured
//! (`--http-cors-origin ORIGIN`, repeatable; `TESSERA_HTTP_CORS_ORIGINS`; the file's
//! `http_cors_origins`).
//!
//! Off, no response carries `Access-Control-*` headers, so a browser lets only pages this
//! server serves (its own origin: the viewer) read the answers. On, a request whose
//! `Origin` is listed (or any origin, with `*`) is answered with
//! `Access-Control-Allow-Origin` and the tile and slice headers exposed; a preflight
//! (`OPTIONS` with `Access-Control-Request-Method`) from a listed origin is answered 204
//! before the token check (a browser sends a preflight without credentials), and one from
//! an unlisted origin 403, naming the setting. The token is still checked on the request
//! that follows.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{Api, json_response};

/// The methods a cross-origin page may use.
const ALLOW_METHODS: &str = "GET, POST";
/// The request headers a cross-origin page may send: the token (both forms), a slice's
/// JSON body and the ETag revalidation.
const ALLOW_HEADERS: &str = "authorization, x-biopb-token, content-type, if-none-match";
/// The response headers a cross-origin page may read besides the safelisted ones.
const EXPOSE_HEADERS: &str = "etag, x-shape, x-dtype, x-dim-labels, x-tile-size, x-tile-level, \
                              x-tile-col, x-tile-row, x-scale-hint";
/// How long a browser may keep a preflight's answer, in seconds.
const MAX_AGE_SECONDS: &str = "600";

/// A configured origin that is not one.
#[derive(Debug, thiserror::Error)]
#[error(
    "http_cors_origins entry {origin:?} is not an origin: {why} (write scheme://host[:port], \
     e.g. https://viewer.example.org:8443, or * for any)"
)]
pub struct BadOrigin {
    origin: String,
    why: &'static str,
}

/// The origins whose pages may call the HTTP API; none: CORS is off.
#[derive(Clone, Debug, Default)]
pub struct CorsOrigins {
    any: bool,
    /// Each origin lowercased, as browsers send it.
    origins: Vec<String>,
}

impl CorsOrigins {
    /// The origins of `list`: `*`, or `http://` or `https://` then a host and an optional
    /// port, nothing after (no path, not even `/`).
    pub fn parse(list: &[String]) -> Result<Self, BadOrigin> {
        let mut out = Self::default();
        for origin in list {
            let bad = |why| BadOrigin {
                origin: origin.clone(),
                why,
            };
            if origin == "*" {
                out.any = true;
                continue;
            }
            let lower = origin.to_ascii_lowercase();
            let rest = lower
                .strip_prefix("https://")
                .or_else(|| lower.strip_prefix("http://"))
                .ok_or_else(|| bad("it must start with http:// or https://"))?;
            if rest.is_empty() {
                return Err(bad("it names no host"));
            }
            if rest.contains(['/', '?', '#']) {
                return Err(bad(
                    "an origin has no path, query or fragment, not even a final /",
                ));
            }
            if rest.contains('@') || rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(bad("it holds characters an origin cannot"));
            }
            if HeaderValue::from_str(&lower).is_err() {
                return Err(bad("it is not a valid header value"));
            }
            out.origins.push(lower);
        }
        Ok(out)
    }

    /// No origin configured: no CORS headers at all.
    pub fn is_off(&self) -> bool {
        !self.any && self.origins.is_empty()
    }

    /// Whether a page from `origin` may read the answers.
    fn allows(&self, origin: &HeaderValue) -> bool {
        self.any
            || origin.to_str().is_ok_and(|o| {
                self.origins
                    .iter()
                    .any(|allowed| allowed.eq_ignore_ascii_case(o))
            })
    }

    /// The `Access-Control-Allow-Origin` answered to `origin`.
    fn allow_origin(&self, origin: &HeaderValue) -> HeaderValue {
        if self.any {
            HeaderValue::from_static("*")
        } else {
            origin.clone()
        }
    }
}

/// The middleware: preflights answered here, other requests passed on and their answers
/// marked.
pub async fn cors(State(api): State<Arc<Api>>, request: Request, next: Next) -> Response {
    let cors = &api.cors;
    if cors.is_off() {
        return next.run(request).await;
    }
    let Some(origin) = request.headers().get(header::ORIGIN).cloned() else {
        let mut response = next.run(request).await;
        vary_on_origin(response.headers_mut(), false);
        return response;
    };
    let allowed = cors.allows(&origin);
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    if preflight {
        let mut response = if allowed {
            let mut response = StatusCode::NO_CONTENT.into_response();
            let headers = response.headers_mut();
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_ORIGIN,
                cors.allow_origin(&origin),
            );
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static(ALLOW_METHODS),
            );
            headers.insert(
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                HeaderValue::from_static(ALLOW_HEADERS),
            );
            headers.insert(
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from_static(MAX_AGE_SECONDS),
            );
            response
        } else {
            let shown = String::from_utf8_lossy(origin.as_bytes()).into_owned();
            json_response(
                StatusCode::FORBIDDEN,
                &serde_json::json!({
                    "detail": format!(
                        "origin {shown:?} may not call this API from a browser: it is not in \
                         the server's --http-cors-origin list"
                    )
                }),
            )
        };
        vary_on_origin(response.headers_mut(), true);
        return response;
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    if allowed {
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            cors.allow_origin(&origin),
        );
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(EXPOSE_HEADERS),
        );
    }
    vary_on_origin(headers, false);
    response
}

/// Answers differ by origin (and, for a preflight, by what it asks), so caches must key on
/// it.
fn vary_on_origin(headers: &mut HeaderMap, preflight: bool) {
    headers.append(header::VARY, HeaderValue::from_static("origin"));
    if preflight {
        headers.append(
            header::VARY,
            HeaderValue::from_static(
                "access-control-request-method, access-control-request-headers",
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(list: &[&str]) -> Result<CorsOrigins, BadOrigin> {
        CorsOrigins::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn origins_are_scheme_host_and_port_only() {
        let cors = parse(&["https://Viewer.Example.org:8443", "http://127.0.0.1:3000"])
            .map_err(|e| e.to_string());
        let Ok(cors) = cors else {
            panic!("{cors:?}");
        };
        assert!(!cors.is_off());
        assert!(cors.allows(&HeaderValue::from_static("https://viewer.example.org:8443")));
        assert!(cors.allows(&HeaderValue::from_static("http://127.0.0.1:3000")));
        assert!(!cors.allows(&HeaderValue::from_static("http://127.0.0.1:3001")));
        assert!(!cors.allows(&HeaderValue::from_static("https://viewer.example.org")));
        assert!(parse(&[]).is_ok_and(|c| c.is_off()));
        assert!(parse(&["*"]).is_ok_and(|c| c.allows(&HeaderValue::from_static("null"))));
        for (bad, why) in [
            ("viewer.example.org", "http:// or https://"),
            ("https://", "no host"),
            ("https://viewer.example.org/", "not even a final /"),
            ("https://viewer.example.org/app", "no path"),
            ("ftp://viewer.example.org", "http:// or https://"),
            ("https://user@viewer.example.org", "characters"),
        ] {
            let err = parse(&[bad]).map(|_| ()).map_err(|e| e.to_string());
            assert!(
                err.as_ref()
                    .is_err_and(|e| e.contains(why) && e.contains(bad)),
                "{bad}: {err:?}"
            );
        }
    }
}
