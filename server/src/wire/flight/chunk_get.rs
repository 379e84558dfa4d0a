//! DoGet of a chunk ticket, answered without copying the chunk.
//!
//! tonic's generated server encodes every reply message into its own buffer: for a chunk
//! that is a memcpy of up to 64 MiB into freshly faulted pages, and private memory held for
//! as long as the client takes to read the reply. This route answers the DoGet of a chunk
//! ticket itself, with a response body made of `Bytes`: a few hundred bytes of framing (the
//! gRPC message prefix and FlightData's fields up to the length of `data_body`), then the
//! chunk's body, a slice of the segment's mapping (or of the memory cache). h2 writes large
//! data frames straight from those `Bytes`, so the chunk goes from the page cache to the
//! socket with no copy in user space, and a client that stops reading pins mapped pages, not
//! server memory. The token was checked once, in front of every route
//! ([`super::auth::Authenticated`]). The chunk's body goes out in pieces of 1 MiB, each a slice of the same
//! bytes that keeps the reply registered in the ledger of unread replies ([`crate::unread`])
//! while h2 still queues it, so a peer that stops reading is seen and its connection closed.
//! Every other call, and DoGet of a catalog or ROI ticket, goes to the tonic
//! service unchanged. The bytes on the wire are exactly those tonic would send (pinned by
//! the tests below against prost's encoding). A reply whose buffers `--wire-compression`
//! compresses (docs/decisions/0039) takes the same route: its message is the compressed one,
//! a body of its own kept in memory instead of a slice of the segment.
//!
//! ```text
//!  client                    ChunkGet                           ServiceState
//!    │ DoGet(Ticket) ─────────▶ read the request (≤ limit);
//!    │                          Ticket → chunk id ─────────────────▶ resolve, decode if cold
//!    │                                                   ◀────────── header + body (Bytes)
//!    │ ◀─ HEADERS 200 application/grpc
//!    │ ◀─ DATA [prefix|FlightData{schema}]
//!    │ ◀─ DATA [prefix|FlightData{data_header, data_body length}] [chunk body, zero-copy]
//!    │ ◀─ HEADERS grpc-status: 0
//!  (a catalog ticket is handed to the tonic service with the request bytes read and its
//!   decoded SQL as a request extension, a roi_read likewise with its RoiRead; malformed and
//!   unknown tickets are refused here, and so is every ticket but a sealed roi_read of a
//!   call whose token was refused: see `super::auth::TokenRefused`)
//! ```

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow_flight::{FlightData, Ticket};
use bytes::{BufMut, Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame, SizeHint};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};
use tessera_proto::ticket::{TicketPayload, decode_ticket};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;

use super::auth::{DO_GET_PATH, TokenRefused};
use super::{CatalogSql, RoiReadTicket};
use crate::chunks::{EncodedChunk, PeerLink};
use crate::error::{NotServed, RequestError, ServiceError};
use crate::state::ServiceState;
use crate::unread::Hold;
use crate::wire::listener::Peer;

/// Largest DoGet request read from a call without a valid token (a sealed ROI ticket is a
/// few hundred bytes).
const UNAUTHENTICATED_REQUEST_BYTES: usize = 64 << 10;
/// FlightData's `data_header` field number.
const DATA_HEADER_FIELD: u32 = 2;
/// FlightData's `data_body` field number.
const DATA_BODY_FIELD: u32 = 1000;
/// Length of a gRPC message prefix: compressed flag and big-endian length.
const GRPC_PREFIX: usize = 5;

/// Wraps the Flight service: DoGet of chunk tickets is answered here, every other call by
/// `inner`.
#[derive(Clone)]
pub struct ChunkGet<S> {
    inner: S,
    state: Arc<ServiceState>,
    max_request_bytes: usize,
}

impl<S> ChunkGet<S> {
    /// Serves chunk DoGets from `state`, refusing requests over `max_request_bytes` (the
    /// tonic service's decoding limit, so both routes refuse the same requests).
    pub fn new(inner: S, state: Arc<ServiceState>, max_request_bytes: usize) -> Self {
        Self {
            inner,
            state,
            max_request_bytes,
        }
    }
}

impl<S: NamedService> NamedService for ChunkGet<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, R> tonic::codegen::Service<http::Request<Body>> for ChunkGet<S>
where
    S: tonic::codegen::Service<http::Request<Body>, Response = http::Response<R>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    R: HttpBody<Data = Bytes> + Send + 'static,
    R::Error: Into<tonic::codegen::StdError>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != DO_GET_PATH {
            let call = self.inner.call(request);
            return Box::pin(async move { Ok(call.await?.map(Body::new)) });
        }
        // The ready service answers a forwarded call; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let state = Arc::clone(&self.state);
        let limit = self.max_request_bytes;
        Box::pin(async move {
            match dispatch(&state, limit, request).await {
                Dispatched::Answer(response) => Ok(response),
                Dispatched::Forward(request) => Ok(inner.call(request).await?.map(Body::new)),
            }
        })
    }
}

/// What the dispatcher does with a DoGet.
enum Dispatched {
    /// Answered here (a chunk, or a refusal).
    Answer(http::Response<Body>),
    /// A catalog ticket: for the tonic service, with the request bytes already read and the
    /// SQL in the extensions.
    Forward(http::Request<Body>),
}

async fn dispatch(state: &ServiceState, limit: usize, request: http::Request<Body>) -> Dispatched {
    let (mut parts, body) = request.into_parts();
    let token_refused = parts.extensions.remove::<TokenRefused>();
    let peer = Peer::of(&parts.extensions);
    let connection = peer.map(|peer| Arc::clone(&peer.connection));
    let link = PeerLink {
        loopback: peer.is_some_and(Peer::is_loopback),
        delivery_rate: peer.and_then(|peer| peer.link.estimate()),
    };
    // A call without a valid token may carry a ROI ticket only, which is small: it may not make
    // the server read more than that.
    let limit = if token_refused.is_some() {
        limit.min(UNAUTHENTICATED_REQUEST_BYTES)
    } else {
        limit
    };
    // Without a valid token, whatever is wrong with the request, the answer is the token's
    // refusal.
    let refuse = |status: Status| match &token_refused {
        Some(TokenRefused(refusal)) => Status::from(refusal.clone()).into_http(),
        None => status.into_http(),
    };
    let bytes = match read_request(body, limit).await {
        Ok(bytes) => bytes,
        Err(status) => return Dispatched::Answer(refuse(status)),
    };
    let ticket = match single_message(&bytes).and_then(|m| {
        Ticket::decode(m)
            .map_err(|e| Status::invalid_argument(format!("malformed Ticket message: {e}")))
    }) {
        Ok(ticket) => ticket,
        Err(status) => return Dispatched::Answer(refuse(status)),
    };
    let payload = decode_ticket(&ticket.ticket);
    if let Some(TokenRefused(refusal)) = token_refused {
        // A call without a valid token reads nothing but a sealed ROI ticket's annotations
        // (the seal is checked before the read).
        if !matches!(&payload, Ok(TicketPayload::RoiRead(read)) if read.grant.is_some()) {
            return Dispatched::Answer(Status::from(refusal).into_http());
        }
    }
    let chunk_id = match payload {
        Ok(TicketPayload::ChunkId(id)) => id,
        Ok(TicketPayload::RoiRead(read)) => {
            parts.extensions.insert(RoiReadTicket(read));
            let body = Body::new(Frames::new(vec![bytes], None));
            return Dispatched::Forward(http::Request::from_parts(parts, body));
        }
        Ok(TicketPayload::CatalogQuery(sql)) => {
            parts.extensions.insert(CatalogSql(sql));
            let body = Body::new(Frames::new(vec![bytes], None));
            return Dispatched::Forward(http::Request::from_parts(parts, body));
        }
        Ok(TicketPayload::Other(arm)) => {
            let refusal = ServiceError::from(NotServed::TicketKind {
                arm: arm.to_string(),
            });
            return Dispatched::Answer(Status::from(refusal).into_http());
        }
        Err(e) => {
            let refusal = ServiceError::from(RequestError::MalformedTicket {
                source: Arc::new(e),
            });
            return Dispatched::Answer(Status::from(refusal).into_http());
        }
    };
    match state.read_path().wire_chunk(&chunk_id, link).await {
        Ok((chunk, _encoding)) => {
            // Replies on connections of the accept loop are registered in the state's ledger
            // while the peer has not read them.
            let hold = connection
                .map(|connection| state.unread().hold(&connection, chunk.body.len() as u64));
            Dispatched::Answer(chunk_response(state.chunks().schema_header(), chunk, hold))
        }
        Err(e) => Dispatched::Answer(Status::from(e).into_http()),
    }
}

/// Reads a request body of at most `limit` bytes.
async fn read_request(mut body: Body, limit: usize) -> Result<Bytes, Status> {
    let mut buf = BytesMut::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame =
            frame.map_err(|e| Status::cancelled(format!("reading the request failed: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit + GRPC_PREFIX {
                return Err(Status::out_of_range(format!(
                    "request too large: its message is over the server's limit of {limit} bytes"
                )));
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf.freeze())
}

/// The one uncompressed gRPC message a DoGet request carries.
fn single_message(bytes: &[u8]) -> Result<&[u8], Status> {
    let Some((prefix, rest)) = bytes.split_first_chunk::<GRPC_PREFIX>() else {
        return Err(Status::invalid_argument(format!(
            "DoGet request of {} bytes holds no gRPC message",
            bytes.len()
        )));
    };
    if prefix[0] != 0 {
        return Err(Status::unimplemented(
            "compressed requests are not accepted: send DoGet uncompressed",
        ));
    }
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if rest.len() != len {
        return Err(Status::invalid_argument(format!(
            "DoGet request must carry exactly one message: {len} bytes announced, {} sent",
            rest.len()
        )));
    }
    Ok(rest)
}

/// The reply: the schema message, then the chunk's record batch message, then status OK.
/// With a `hold`, the body goes out in pieces that keep it registered.
fn chunk_response(
    schema_header: Bytes,
    chunk: EncodedChunk,
    hold: Option<Arc<Hold>>,
) -> http::Response<Body> {
    let schema = FlightData::new().with_data_header(schema_header);
    let mut first = BytesMut::with_capacity(GRPC_PREFIX + schema.encoded_len());
    put_prefix(&mut first, schema.encoded_len());
    // Writing into a BytesMut with room for the message cannot fail.
    schema.encode_raw(&mut first);
    let batch_prefix = batch_prefix(&chunk.header, chunk.body.len());
    let mut frames = vec![first.freeze(), batch_prefix];
    match &hold {
        Some(hold) => frames.extend(hold.pieces(&chunk.body)),
        None if !chunk.body.is_empty() => frames.push(chunk.body),
        None => {}
    }
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let body = Frames::new(frames, Some(trailers)).with_hold(hold);
    let mut response = http::Response::new(Body::new(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// Everything of a FlightData message `{data_header: header, data_body: <body_len bytes>}`
/// that precedes the body, with its gRPC message prefix: prost's field order and encoding.
fn batch_prefix(header: &[u8], body_len: usize) -> Bytes {
    let header_field = bytes_field_len(DATA_HEADER_FIELD, header.len());
    let body_field = if body_len == 0 {
        0
    } else {
        bytes_field_len(DATA_BODY_FIELD, body_len)
    };
    let mut out = BytesMut::with_capacity(GRPC_PREFIX + header_field + body_field - body_len);
    put_prefix(&mut out, header_field + body_field);
    if !header.is_empty() {
        encode_key(DATA_HEADER_FIELD, WireType::LengthDelimited, &mut out);
        encode_varint(header.len() as u64, &mut out);
        out.put_slice(header);
    }
    if body_len > 0 {
        encode_key(DATA_BODY_FIELD, WireType::LengthDelimited, &mut out);
        encode_varint(body_len as u64, &mut out);
    }
    out.freeze()
}

/// Encoded length of a non-empty bytes field (proto3 omits empty ones).
fn bytes_field_len(field: u32, len: usize) -> usize {
    if len == 0 {
        return 0;
    }
    prost::encoding::key_len(field) + encoded_len_varint(len as u64) + len
}

/// The gRPC message prefix: not compressed, then the length (big-endian u32; chunks are far
/// below 4 GiB).
fn put_prefix(out: &mut BytesMut, message_len: usize) {
    out.put_u8(0);
    out.put_u32(message_len as u32);
}

/// An HTTP body of ready `Bytes`, then optional trailers.
struct Frames {
    data: VecDeque<Bytes>,
    trailers: Option<http::HeaderMap>,
    /// The reply's registration: each frame asked for is progress.
    hold: Option<Arc<Hold>>,
}

impl Frames {
    fn new(data: Vec<Bytes>, trailers: Option<http::HeaderMap>) -> Self {
        Self {
            data: data.into(),
            trailers,
            hold: None,
        }
    }

    fn with_hold(mut self, hold: Option<Arc<Hold>>) -> Self {
        self.hold = hold;
        self
    }
}

impl HttpBody for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(hold) = &this.hold {
            hold.progress();
        }
        if let Some(data) = this.data.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.iter().map(|d| d.len() as u64).sum())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// tonic's framing of a prost-encoded FlightData.
    fn tonic_frame(header: &[u8], body: &[u8]) -> Vec<u8> {
        let fd = FlightData::new()
            .with_data_header(Bytes::copy_from_slice(header))
            .with_data_body(Bytes::copy_from_slice(body));
        let msg = fd.encode_to_vec();
        let mut out = vec![0u8];
        out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        out.extend_from_slice(&msg);
        out
    }

    #[test]
    fn prefix_plus_body_is_what_tonic_sends_at_edge_sizes() {
        for header_len in [1usize, 127, 128, 300, 16_384] {
            for body_len in [0usize, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152] {
                let header = vec![0xA5; header_len];
                let body = vec![0x3C; body_len];
                let mut ours = batch_prefix(&header, body_len).to_vec();
                ours.extend_from_slice(&body);
                assert!(
                    ours == tonic_frame(&header, &body),
                    "header {header_len}, body {body_len}"
                );
            }
        }
        let body = vec![0x3C; (64 << 20) + 7];
        let mut ours = batch_prefix(b"header", body.len()).to_vec();
        ours.extend_from_slice(&body);
        assert!(ours == tonic_frame(b"header", &body), "the largest chunk");
    }

    #[test]
    fn pinned_vector() {
        // 00 | len 9 | key(2, LEN) 1 'H' | key(1000, LEN) = c2 3e, 3 | "xyz"
        let mut ours = batch_prefix(b"H", 3).to_vec();
        ours.extend_from_slice(b"xyz");
        assert_eq!(
            ours,
            [
                0, 0, 0, 0, 9, 0x12, 1, b'H', 0xc2, 0x3e, 3, b'x', b'y', b'z'
            ]
        );
    }

    #[test]
    fn requests_must_be_one_uncompressed_message() {
        assert!(single_message(&[0, 0, 0]).is_err());
        assert_eq!(single_message(&[0, 0, 0, 0, 2, 7, 8]).unwrap(), &[7, 8]);
        let compressed = single_message(&[1, 0, 0, 0, 0]).unwrap_err();
        assert_eq!(compressed.code(), tonic::Code::Unimplemented);
        let short = single_message(&[0, 0, 0, 0, 3, 7]).unwrap_err();
        assert!(
            short.message().contains("3 bytes announced, 1 sent"),
            "{short}"
        );
        let extra = single_message(&[0, 0, 0, 0, 1, 7, 0, 0, 0, 0, 0]).unwrap_err();
        assert_eq!(extra.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn frames_yield_data_then_trailers() {
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let mut body = Frames::new(
            vec![Bytes::from_static(b"ab"), Bytes::from_static(b"c")],
            Some(trailers),
        );
        assert_eq!(body.size_hint().exact(), Some(3));
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut seen = Vec::new();
        while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) {
            match frame.into_data() {
                Ok(d) => seen.push(d.to_vec()),
                Err(f) => seen.push(
                    f.into_trailers().unwrap()["grpc-status"]
                        .as_bytes()
                        .to_vec(),
                ),
            }
        }
        assert_eq!(seen, vec![b"ab".to_vec(), b"c".to_vec(), b"0".to_vec()]);
        assert!(body.is_end_stream());
    }
}
