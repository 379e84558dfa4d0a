//! Hostile input against the real `tessera` process: requests above the size limit are
//! refused, and an absurdly long array id gets a short error naming the id limit. The server
//! keeps serving throughout. (Forged tickets: forged_tickets_are_refused.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use arrow_flight::{FlightDescriptor, Ticket};
use prost::Message;
use tessera_e2e::connect::stalled_flight_service;
use tessera_e2e::process::ServerProcess;
use tessera_e2e::*;
use tessera_proto::pb::{FlightRequest, TensorReadOption, flight_request};

/// The request-size limit of the server (daemon.rs MAX_DECODE_BYTES).
const LIMIT: usize = 16 << 20;

fn command(array_id: String) -> FlightDescriptor {
    FlightDescriptor::new_cmd(
        FlightRequest {
            request: Some(flight_request::Request::TensorRead(TensorReadOption {
                array_id,
                ..Default::default()
            })),
        }
        .encode_to_vec(),
    )
}

async fn still_serves(server: &ServerProcess, data: &[u8]) {
    let mut client = server.client().await;
    let info = client
        .get_flight_info(read_descriptor("small", None))
        .await
        .unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    assert_eq!(chunk_parts(&fetch_chunk(&mut client, ticket).await).0, data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_are_refused_with_bounded_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let small = pattern(4096, 1);
    write_npy(&dir.path().join("small.npy"), "|u1", &[4096], &small);
    // 16 chunks of 1 MiB.
    let shape = [16u64, 1 << 20];
    let big = pattern((shape[0] * shape[1]) as usize, 2);
    write_npy(&dir.path().join("big.npy"), "|u1", &shape, &big);
    let mut server = ServerProcess::serve_cached(dir.path(), cache.path(), None, "1MiB");

    // A GetFlightInfo command above the limit is refused before it is decoded.
    let mut raw = stalled_flight_service(server.url()).await;
    let err = raw
        .get_flight_info(command("x".repeat(LIMIT + 1024)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
    assert!(err.message().contains("too large"), "{}", err.message());
    // A ticket above the limit too.
    let err = raw
        .do_get(Ticket::new(vec![7u8; LIMIT + 1]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
    // Just under the limit: decoded, refused by the id's length (1024 bytes at most, see
    // over_long_array_ids_are_refused_by_length.rs), with a short message.
    let err = raw
        .get_flight_info(command("y".repeat(LIMIT - 1024)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unknown, "{err:?}");
    assert!(
        err.message().len() < 1 << 10,
        "an error echoes none of an over-long id ({} bytes)",
        err.message().len()
    );
    assert!(
        err.message().contains("over the limit of 1024 bytes"),
        "{}",
        err.message()
    );
    still_serves(&server, &small).await;

    assert!(server.is_running());
    assert!(server.terminate().success());
}
