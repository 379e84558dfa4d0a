//! Health speaks protocol 3; unknown ids carry the `extra_info` the biopb client
//! turns into ValueError; unknown actions say "Unknown action"; bad slices and
//! scale hints are refused with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tessera_e2e::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_carry_codes_clients_understand() {
    let dir = tempfile::tempdir().unwrap();
    write_npy(&dir.path().join("x.npy"), "<f8", &[4, 4], &pattern(128, 7));
    let server = TestServer::start(vec![dir.path().to_path_buf()]).await;
    let mut client = server.client().await;

    let health = action_json(&mut client, "health", Vec::new()).await;
    assert_eq!(health["protocol"], 3);
    assert_eq!(health["status"], "SERVING");
    assert_eq!(health["source_count"], 1);
    assert!(health.get("ticket_stubs").is_none());

    let status = status_of(
        client
            .get_flight_info(read_descriptor("nope", None))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert_eq!(extra_info(&status).unwrap()["code"], "NOT_FOUND");
    assert_eq!(status.metadata().get("x-arrow-status").unwrap(), "5");

    let status = status_of(
        client
            .get_flight_info(read_descriptor("x/field", None))
            .await
            .unwrap_err(),
    );
    assert_eq!(extra_info(&status).unwrap()["reason"], "unknown_field");

    let status = status_of(
        client
            .get_flight_info(read_descriptor("x", Some((&[0, 0], &[5, 4]))))
            .await
            .unwrap_err(),
    );
    assert_eq!(extra_info(&status).unwrap()["code"], "INVALID_ARGUMENT");
    assert!(status.message().contains("axis 0"), "{}", status.message());

    let status = status_of(
        client
            .do_action(arrow_flight::Action::new("frobnicate", Vec::new()))
            .await
            .err()
            .unwrap(),
    );
    assert_eq!(status.code(), tonic::Code::Unknown);
    assert!(status.message().contains("Unknown action: frobnicate"));

    let status = status_of(
        client
            .get_flight_info(arrow_flight::FlightDescriptor::new_cmd(vec![
                0x0a, 0x03, b'i', b'm', b'g',
            ]))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        status.code(),
        tonic::Code::Unknown,
        "an old FlightCmd envelope is refused clearly"
    );
    server.stop().await;
}
