//! Flight connections the tests open to a server, in-process or spawned.

use arrow_flight::FlightClient;
use arrow_flight::flight_service_client::FlightServiceClient;
use tonic::transport::Channel;

/// The decode limit of test clients: above the 64 MiB chunk cap.
const MAX_DECODE: usize = 128 << 20;
/// The encode limit of raw test clients: room for requests over the server's 16 MiB limit.
const MAX_ENCODE: usize = 64 << 20;

/// A Flight client on its own connection to `url` (`http://ADDR`).
pub async fn flight_client(url: String) -> FlightClient {
    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    FlightClient::new_from_inner(
        FlightServiceClient::new(channel).max_decoding_message_size(MAX_DECODE),
    )
}

/// A raw Flight service client on its own connection to `url` whose receive windows are
/// 64 KiB, so a server cannot finish a chunk stream the test does not read: the reply
/// stays queued on the server.
pub async fn stalled_flight_service(url: String) -> FlightServiceClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .initial_stream_window_size(64 << 10)
        .initial_connection_window_size(64 << 10)
        .connect()
        .await
        .unwrap();
    FlightServiceClient::new(channel)
        .max_decoding_message_size(MAX_DECODE)
        .max_encoding_message_size(MAX_ENCODE)
}
