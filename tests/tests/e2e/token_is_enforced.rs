//! With a token set, every call needs `authorization: Bearer <token>`; without
//! one, the server refuses to listen beyond loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tessera_e2e::*;
use tessera_server::config::Settings;
use tessera_server::{Daemon, DaemonError};

const TOKEN: &str = "s3cret-token_0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_need_the_token() {
    let dir = tempfile::tempdir().unwrap();
    write_npy(&dir.path().join("t.npy"), "|u1", &[4], &[1, 2, 3, 4]);
    let server = TestServer::start_with(vec![dir.path().to_path_buf()], |c| {
        c.listener.token = Some(TOKEN.to_string())
    })
    .await;

    let mut anonymous = server.client().await;
    let status = status_of(
        anonymous
            .get_flight_info(read_descriptor("t", None))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    // GetSchema (of a tensor, and of a catalog table) is gated like every other call.
    for descriptor in [
        arrow_flight::FlightDescriptor::new_path(vec!["t".to_string()]),
        arrow_flight::FlightDescriptor::new_path(vec!["sources".to_string()]),
        read_descriptor("t", None),
    ] {
        let status = status_of(anonymous.get_schema(descriptor).await.unwrap_err());
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status}");
    }
    let mut wrong = server.client_with_token("s3cret-token_0123456780").await;
    let status = status_of(
        wrong
            .get_flight_info(read_descriptor("t", None))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let status = status_of(
        wrong
            .do_action(arrow_flight::Action::new("chunk_locate", Vec::new()))
            .await
            .err()
            .unwrap(),
    );
    assert_eq!(
        status.code(),
        tonic::Code::Unauthenticated,
        "chunk_locate reveals paths: gated"
    );

    let mut right = server.client_with_token(TOKEN).await;
    let info = right
        .get_flight_info(read_descriptor("t", None))
        .await
        .unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let (bytes, _, _) = chunk_parts(&fetch_chunk(&mut right, ticket).await);
    assert_eq!(bytes, vec![1, 2, 3, 4]);
    server.stop().await;
}

#[tokio::test]
async fn public_listen_without_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = Settings::new(
        Vec::new(),
        "0.0.0.0:0".parse().unwrap(),
        dir.path().join("c"),
    );
    let err = Daemon::bind(&config).await.err().expect("refused");
    assert!(matches!(err, DaemonError::ExposedWithoutToken(_)));
    assert!(err.to_string().contains("--token"), "{err}");

    let mut bad = Settings::new(
        Vec::new(),
        "127.0.0.1:0".parse().unwrap(),
        dir.path().join("c"),
    );
    bad.listener.token = Some("short".to_string());
    assert!(matches!(
        Daemon::bind(&bad).await.err(),
        Some(DaemonError::BadToken(_))
    ));
}
