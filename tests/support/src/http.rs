//! One HTTP/1.1 request through hyper's client, for the tests of the `/metrics` endpoint.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// What a request got back.
#[derive(Debug)]
pub struct HttpReply {
    /// The status code.
    pub status: u16,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The body, as text.
    pub body: String,
}

/// Sends `METHOD PATH` to `addr` on a connection of its own and reads the whole reply.
pub async fn http_request(addr: SocketAddr, method: &str, path: &str) -> HttpReply {
    http_request_with(addr, method, path, &[]).await
}

/// [`http_request`] with extra request headers (e.g. `authorization`).
pub async fn http_request_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> HttpReply {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "tessera");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Empty::<Bytes>::new()).unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    HttpReply {
        status,
        content_type,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}
