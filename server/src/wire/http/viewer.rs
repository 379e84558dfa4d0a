//! The viewer page at `/`: one HTML file, one script and one stylesheet, embedded in the
//! binary (`viewer/`), nothing fetched from elsewhere. The page holds no data: it is served
//! without a token and asks the API (with the token the user gives it) for everything.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::HttpError;

const INDEX: &str = include_str!("viewer/index.html");
const SCRIPT: &str = include_str!("viewer/viewer.js");
const STYLE: &str = include_str!("viewer/viewer.css");

/// The headers every asset carries: revalidated (the binary may change under the URL) and
/// kept to this origin.
fn asset_response(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data: blob:; style-src 'self'",
            ),
        ],
        body,
    )
        .into_response()
}

/// `GET /`.
pub async fn page() -> Response {
    asset_response("text/html; charset=utf-8", INDEX)
}

/// `GET /viewer/{file}`.
pub async fn asset(Path(file): Path<String>) -> Response {
    match file.as_str() {
        "viewer.js" => asset_response("text/javascript; charset=utf-8", SCRIPT),
        "viewer.css" => asset_response("text/css; charset=utf-8", STYLE),
        _ => HttpError::NotFound(format!("no viewer asset {file}")).into_response(),
    }
}
