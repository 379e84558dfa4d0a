//! A server that predates chunk_locate answers it with "Unknown action": the
//! client probes once, marks the location unsupported and uses DoGet from
//! then on. The server here is a tiny in-test Flight service that only does
//! health, GetFlightInfo and DoGet.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow_array::builder::{Int64Builder, ListBuilder};
use arrow_array::{BinaryArray, RecordBatch, StringArray};
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaResult, Ticket,
};
use futures::Stream;
use prost::Message;
use tessera_client::{Client, ClientOptions, Region};
use tessera_proto::pb::{ChunkBounds, TensorDescriptor};
use tessera_proto::ticket::{TicketPayload, chunk_ticket, decode_ticket};
use tonic::{Request, Response, Status, Streaming};

const CHUNK: usize = 250;
const CHUNKS: usize = 4;

type Boxed<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[derive(Clone)]
struct OldServer {
    data: Arc<Vec<u8>>,
    locate_calls: Arc<AtomicUsize>,
    do_gets: Arc<AtomicUsize>,
}

fn unsupported<T>() -> Result<T, Status> {
    Err(Status::unknown("not supported by this test server"))
}

fn chunk_batch(data: &[u8]) -> RecordBatch {
    let mut shapes = ListBuilder::new(Int64Builder::new()).with_field(Arc::new(
        arrow_schema::Field::new_list_field(arrow_schema::DataType::Int64, true),
    ));
    shapes.values().append_value(data.len() as i64);
    shapes.append(true);
    RecordBatch::try_new(
        Arc::new(tessera_proto::chunk_schema()),
        vec![
            Arc::new(BinaryArray::from_vec(vec![data])),
            Arc::new(shapes.finish()),
            Arc::new(StringArray::from(vec!["|u1"])),
        ],
    )
    .unwrap()
}

#[tonic::async_trait]
impl FlightService for OldServer {
    type HandshakeStream = Boxed<HandshakeResponse>;
    type ListFlightsStream = Boxed<FlightInfo>;
    type DoGetStream = Boxed<FlightData>;
    type DoPutStream = Boxed<PutResult>;
    type DoActionStream = Boxed<arrow_flight::Result>;
    type ListActionsStream = Boxed<ActionType>;
    type DoExchangeStream = Boxed<FlightData>;

    async fn handshake(
        &self,
        _: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        unsupported()
    }
    async fn list_flights(
        &self,
        _: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        unsupported()
    }
    async fn get_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let descriptor = TensorDescriptor {
            array_id: "old".to_string(),
            shape: vec![(CHUNK * CHUNKS) as i64],
            chunk_shape: vec![CHUNK as i64],
            dtype: "|u1".to_string(),
            ..Default::default()
        };
        let mut info = FlightInfo::new()
            .try_with_schema(&tessera_proto::plan_schema())
            .unwrap()
            .with_descriptor(FlightDescriptor::new_cmd(descriptor.encode_to_vec()));
        for i in 0..CHUNKS {
            let bounds = ChunkBounds {
                start: vec![(i * CHUNK) as i64],
                stop: vec![((i + 1) * CHUNK) as i64],
            };
            info = info.with_endpoint(
                FlightEndpoint::new()
                    .with_ticket(Ticket::new(chunk_ticket(&[i as u8 + 1])))
                    .with_app_metadata(bounds.encode_to_vec()),
            );
        }
        Ok(Response::new(info))
    }
    async fn poll_flight_info(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        unsupported()
    }
    async fn get_schema(
        &self,
        _: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        unsupported()
    }
    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        self.do_gets.fetch_add(1, Ordering::SeqCst);
        let TicketPayload::ChunkId(id) = decode_ticket(&request.into_inner().ticket).unwrap()
        else {
            return unsupported();
        };
        let i = id[0] as usize - 1;
        let batch = chunk_batch(&self.data[i * CHUNK..(i + 1) * CHUNK]);
        let frames = arrow_flight::utils::batches_to_flight_data(
            &tessera_proto::chunk_schema(),
            vec![batch],
        )
        .unwrap();
        Ok(Response::new(Box::pin(futures::stream::iter(
            frames.into_iter().map(Ok),
        ))))
    }
    async fn do_put(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        unsupported()
    }
    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        let action = request.into_inner();
        match action.r#type.as_str() {
            "health" => {
                let body = br#"{"status": "SERVING", "protocol": 3}"#.to_vec();
                let result = arrow_flight::Result { body: body.into() };
                Ok(Response::new(Box::pin(futures::stream::iter([Ok(result)]))))
            }
            other => {
                if other == "chunk_locate" {
                    self.locate_calls.fetch_add(1, Ordering::SeqCst);
                }
                Err(Status::unknown(format!("Unknown action: {other}")))
            }
        }
    }
    async fn list_actions(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        unsupported()
    }
    async fn do_exchange(
        &self,
        _: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        unsupported()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_action_stops_probing_after_the_first() {
    let data: Vec<u8> = (0..CHUNK * CHUNKS).map(|i| (i * 31 % 256) as u8).collect();
    let service = OldServer {
        data: Arc::new(data.clone()),
        locate_calls: Arc::new(AtomicUsize::new(0)),
        do_gets: Arc::new(AtomicUsize::new(0)),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| stream);
        Some((accepted, listener))
    });
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(FlightServiceServer::new(service.clone()))
            .serve_with_incoming(incoming),
    );

    let options = ClientOptions::default()
        .with_mmap(true)
        .with_concurrency(1)
        .with_copy_cache_bytes(0);
    let client = Client::connect(&format!("grpc://{addr}"), options)
        .await
        .unwrap();
    assert!(
        client.local_stats().fast_path,
        "a loopback location tries the fast path"
    );
    let whole = client.read("old", None).await.unwrap();
    assert_eq!(whole.bytes, data);
    assert_eq!(
        service.locate_calls.load(Ordering::SeqCst),
        1,
        "one probe, then DoGet"
    );
    assert_eq!(service.do_gets.load(Ordering::SeqCst), CHUNKS);
    let stats = client.local_stats();
    assert!(!stats.locate_supported, "{stats:?}");
    assert_eq!(stats.socket_chunks, CHUNKS as u64, "{stats:?}");

    // A second read (no copy cache, so every chunk is fetched again) never probes.
    let region = Region::new(vec![100], vec![900]);
    let part = client.read("old", Some(&region)).await.unwrap();
    assert_eq!(part.bytes, data[100..900]);
    assert_eq!(service.locate_calls.load(Ordering::SeqCst), 1);
    assert_eq!(service.do_gets.load(Ordering::SeqCst), 2 * CHUNKS);

    // Concurrent fetches may race a few probes in before the flag is set, never more
    // than one per fetch slot.
    let calls_before = service.locate_calls.load(Ordering::SeqCst);
    let wide = Client::connect(
        &format!("grpc://{addr}"),
        ClientOptions::default().with_mmap(true).with_concurrency(4),
    )
    .await
    .unwrap();
    assert_eq!(wide.read("old", None).await.unwrap().bytes, data);
    let probes = service.locate_calls.load(Ordering::SeqCst) - calls_before;
    assert!((1..=4).contains(&probes), "{probes} probes");
    server.abort();
}
