//! ListFlights gives generic Flight tools one FlightInfo per tensor (path
//! descriptor, stamped schema, endpoints) and nothing else; criteria `catalog` lists the
//! catalog's tables instead; a PATH GetFlightInfo plans a tensor.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use arrow_flight::FlightDescriptor;
use arrow_flight::flight_descriptor::DescriptorType;
use futures::TryStreamExt;
use tessera_e2e::*;
use tessera_server::config::Size;

async fn list_flights_names_every_tensor_with_its_plan(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let a = pattern(40 * 30 * 2, 11);
    write_npy(&dir.path().join("a.npy"), "<i2", &[40, 30], &a);
    write_npy(&dir.path().join("b.npy"), "|u1", &[5], &[9, 8, 7, 6, 5]);
    let server = TestServer::start_on(grid, vec![dir.path().to_path_buf()], |c| {
        c.chunks.chunk_target = Size::bytes(grid.chunk_target_for(600))
    })
    .await;
    let mut client = server.client().await;

    let infos = list_all_flights(&mut client).await;
    let tensor_infos: Vec<_> = infos
        .iter()
        .filter(|i| {
            !i.endpoint.is_empty()
                && i.flight_descriptor
                    .as_ref()
                    .is_some_and(|d| d.path.len() == 1 && (d.path[0] == "a" || d.path[0] == "b"))
        })
        .collect();
    assert_eq!(tensor_infos.len(), 2, "one FlightInfo per tensor");
    assert_eq!(infos.len(), 2, "tensors only: no catalog table among them");

    // The catalog's tables are listed on request, apart from the tensors.
    let tables: Vec<_> = client
        .list_flights(bytes::Bytes::from_static(b"catalog"))
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let names: Vec<_> = tables
        .iter()
        .map(|i| i.flight_descriptor.as_ref().unwrap().path.join("/"))
        .collect();
    assert_eq!(names, ["sources", "tensors"]);
    for info in &tensor_infos {
        let desc = info.flight_descriptor.as_ref().unwrap();
        assert_eq!(desc.r#type(), DescriptorType::Path);
        let schema = (*info).clone().try_decode_schema().unwrap();
        assert_eq!(
            schema
                .metadata()
                .get("chunk_wire_protocol")
                .map(String::as_str),
            Some("2")
        );
    }

    // A PATH descriptor plans the whole tensor; its chunks reassemble the source.
    let info = client
        .get_flight_info(FlightDescriptor::new_path(vec!["a".to_string()]))
        .await
        .unwrap();
    let endpoints = endpoint_bounds(&info);
    assert_eq!(endpoints.len(), 4, "600-byte cells of 2,400 bytes");
    let mut assembled = Vec::new();
    for (_, _, ticket) in endpoints {
        let (bytes, _, _) = chunk_parts(&fetch_chunk(&mut client, ticket).await);
        assembled.extend_from_slice(&bytes);
    }
    assert_eq!(
        assembled, a,
        "row chunks of a C-order tensor concatenate to the source"
    );
    server.stop().await;
}

on_both_grids!(list_flights_names_every_tensor_with_its_plan);
