//! A whole-tensor plan: stamped schema, echoed id, endpoints that tile the tensor,
//! and every chunk's bytes equal to the source region.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use prost::Message;
use tessera_e2e::*;
use tessera_proto::pb::TensorDescriptor;
use tessera_server::config::Size;

async fn whole_tensor_plan_tiles_and_serves_exact_bytes(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let shape = [5u64, 300, 200];
    let data = pattern(5 * 300 * 200 * 2, 1);
    write_npy(&dir.path().join("vol.npy"), "<u2", &shape, &data);
    // A small target forces many chunks, including a split inside the planes.
    let server = TestServer::start_on(grid, vec![dir.path().to_path_buf()], |c| {
        c.chunks.chunk_target = Size::bytes(50_000)
    })
    .await;
    let mut client = server.client().await;

    let info = client
        .get_flight_info(read_descriptor("vol", None))
        .await
        .unwrap();
    let schema = info.clone().try_decode_schema().unwrap();
    assert_eq!(
        schema
            .metadata()
            .get("chunk_wire_protocol")
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(
        schema.metadata().get("flight_protocol").map(String::as_str),
        Some("3")
    );
    let desc = TensorDescriptor::decode(info.flight_descriptor.clone().unwrap().cmd).unwrap();
    assert_eq!(desc.array_id, "vol");
    assert_eq!(desc.shape, vec![5, 300, 200]);
    assert_eq!(desc.dtype, "<u2");
    assert!(
        desc.slice_hint.is_none(),
        "an unsliced read at the origin has no slice_hint"
    );

    server.assert_planned_on_its_grid(&info);
    let endpoints = endpoint_bounds(&info);
    assert!(
        endpoints.len() > 2,
        "expected several chunks, got {}",
        endpoints.len()
    );
    let boxes: Vec<_> = endpoints
        .iter()
        .map(|(a, b, _)| (a.clone(), b.clone()))
        .collect();
    assert_tiles(&shape, &boxes);

    for (start, stop, ticket) in endpoints {
        let batch = fetch_chunk(&mut client, ticket).await;
        let (bytes, chunk_shape, dtype) = chunk_parts(&batch);
        let s: Vec<u64> = start.iter().map(|&v| v as u64).collect();
        let e: Vec<u64> = stop.iter().map(|&v| v as u64).collect();
        let expect_shape: Vec<i64> = start.iter().zip(&stop).map(|(a, b)| b - a).collect();
        assert_eq!(chunk_shape, expect_shape);
        assert_eq!(dtype, "<u2");
        assert_eq!(
            bytes,
            region_bytes(&data, &shape, 2, &s, &e),
            "chunk {start:?}..{stop:?}"
        );
    }
    server.stop().await;
}

on_both_grids!(whole_tensor_plan_tiles_and_serves_exact_bytes);
