//! An array id longer than any chunk ticket can carry (1024 bytes, `MAX_ARRAY_ID_BYTES` in
//! server/src/grid/chunk_id.rs) is refused by its length against the real `tessera` process: UNKNOWN
//! with the biopb `INVALID_ARGUMENT` extra_info, a short message naming the length and the
//! limit, and none of the id echoed. GetFlightInfo commands and path descriptors, GetSchema,
//! DoGet tickets and `chunk_locate` are all checked. A symlink to a non-`.npy` file outside
//! the served directory is refused without quoting its bytes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use arrow_flight::{Action, FlightDescriptor, Ticket};
use prost::Message;
use tessera_e2e::connect::stalled_flight_service;
use tessera_e2e::process::ServerProcess;
use tessera_e2e::*;
use tessera_proto::pb::{FlightRequest, TensorReadOption, flight_request};

/// The bound the server enforces on array ids.
const LIMIT: usize = 1024;

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

/// A chunk ticket (chunk id format 1, see server/src/grid/chunk_id.rs) carrying `id` as its array id.
fn chunk_ticket(id: &[u8]) -> Vec<u8> {
    let mut chunk_id = b"TS\x01".to_vec();
    chunk_id.extend_from_slice(&(id.len() as u16).to_be_bytes());
    chunk_id.extend_from_slice(id);
    chunk_id.extend_from_slice(&[0; 32]);
    chunk_id.push(1);
    chunk_id.extend_from_slice(&0u64.to_be_bytes());
    chunk_id.extend_from_slice(&1u64.to_be_bytes());
    tessera_proto::ticket::chunk_ticket(&chunk_id)
}

/// UNKNOWN, classified as a bad request, under 1 KiB, naming `limit`, quoting none of `echo`.
fn assert_refused_by_length(status: &tonic::Status, limit: &str, echo: &str) {
    assert_eq!(status.code(), tonic::Code::Unknown, "{status:?}");
    let message = status.message();
    assert!(message.len() < 1024, "{} bytes: {message}", message.len());
    assert!(message.contains(limit), "{message}");
    assert!(!message.contains(echo), "{message}");
    let info: serde_json::Value = serde_json::from_slice(status.details()).unwrap();
    assert_eq!(info["code"], "INVALID_ARGUMENT", "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_long_array_ids_are_refused_by_length_with_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let small = pattern(64, 3);
    write_npy(&dir.path().join("small.npy"), "|u1", &[64], &small);
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(
        outside.path().join("passwd"),
        b"root:x:0:0:root:/root:/bin/sh\n",
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path().join("passwd"), dir.path().join("pw.npy")).unwrap();
    let mut server = ServerProcess::serve_cached(dir.path(), cache.path(), None, "1MiB");
    let mut client = server.client().await;

    // 1 MiB ids of characters gRPC percent-encodes: echoed, they made a status too large
    // for the client's header limit (INTERNAL). `%` takes 3 bytes in grpc-message.
    let huge = "%".repeat(1 << 20);
    let fragment = "%".repeat(64);
    let status = status_of(
        client
            .get_flight_info(command(huge.clone()))
            .await
            .unwrap_err(),
    );
    assert_refused_by_length(&status, "1024", &fragment);
    assert!(
        status.message().contains("1048576 bytes"),
        "{}",
        status.message()
    );

    // Path descriptors (GetFlightInfo and GetSchema) and the `source/field` form.
    let status = status_of(
        client
            .get_flight_info(FlightDescriptor::new_path(vec![huge.clone()]))
            .await
            .unwrap_err(),
    );
    assert_refused_by_length(&status, "1024", &fragment);
    let status = status_of(
        client
            .get_schema(FlightDescriptor::new_path(vec![huge.clone()]))
            .await
            .unwrap_err(),
    );
    assert_refused_by_length(&status, "1024", &fragment);
    let status = status_of(
        client
            .get_flight_info(command(format!("small/{huge}")))
            .await
            .unwrap_err(),
    );
    assert_refused_by_length(&status, "1024", &fragment);
    // Several path elements: counted, not echoed.
    let status = status_of(
        client
            .get_flight_info(FlightDescriptor::new_path(vec![huge.clone(), huge.clone()]))
            .await
            .unwrap_err(),
    );
    assert_refused_by_length(&status, "exactly one", &fragment);

    // Just over and at the limit: the first by length, the second as an unknown source.
    let status = status_of(
        client
            .get_flight_info(command("q".repeat(LIMIT + 1)))
            .await
            .unwrap_err(),
    );
    assert_refused_by_length(&status, "1024", &"q".repeat(64));
    assert!(
        status.message().contains("1025 bytes"),
        "{}",
        status.message()
    );
    let status = status_of(
        client
            .get_flight_info(command("q".repeat(LIMIT)))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert_eq!(extra_info(&status).unwrap()["code"], "NOT_FOUND");

    // DoGet tickets and chunk_locate carry ids in chunk ids, refused by the same bound.
    let mut raw = stalled_flight_service(server.url()).await;
    let ticket = chunk_ticket(&[b'%'; 60_000]);
    let status = raw.do_get(Ticket::new(ticket.clone())).await.unwrap_err();
    assert_refused_by_length(&status, "1024", &fragment);
    let status = status_of(
        client
            .do_action(Action::new("chunk_locate", ticket))
            .await
            .err()
            .unwrap(),
    );
    assert_refused_by_length(&status, "1024", &fragment);

    // A symlink to a file outside the served directory: refused, nothing of it quoted.
    let status = status_of(
        client
            .get_flight_info(read_descriptor("pw", None))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert!(
        status.message().contains("symbolic link"),
        "{}",
        status.message()
    );
    assert!(!status.message().contains("root"), "{}", status.message());
    assert!(
        server.log().iter().all(|line| !line.contains("root:x")),
        "the log quotes the link's target"
    );

    // The server kept serving throughout.
    let info = client
        .get_flight_info(read_descriptor("small", None))
        .await
        .unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    assert_eq!(
        chunk_parts(&fetch_chunk(&mut client, ticket).await).0,
        small
    );
    assert!(server.is_running());
    assert!(server.terminate().success());
}
