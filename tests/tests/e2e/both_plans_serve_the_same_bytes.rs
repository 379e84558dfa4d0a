//! A loopback client with a mappable file cache gets a plan on the coarse grid; a loopback
//! client that reads such a chunk over DoGet moves later loopback plans to the fine grid
//! (once its cells are cached: until then the coarse cells serve), and the next
//! `chunk_locate` moves them back.
//! Both plans of the same tensor, through `chunk_locate` and through DoGet, give the
//! source's bytes (docs/decisions/0015).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use prost::Message;
use tessera_e2e::located::{Located, decode_located};
use tessera_e2e::*;
use tessera_proto::pb::TensorDescriptor;
use tessera_server::config::Size;

const SHAPE: [u64; 3] = [12, 256, 256];

fn chunk_shape(info: &arrow_flight::FlightInfo) -> Vec<i64> {
    TensorDescriptor::decode(info.flight_descriptor.clone().unwrap().cmd)
        .unwrap()
        .chunk_shape
}

fn bounds(start: &[i64], stop: &[i64]) -> (Vec<u64>, Vec<u64>) {
    (
        start.iter().map(|&v| v as u64).collect(),
        stop.iter().map(|&v| v as u64).collect(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coarse_and_fine_plans_serve_the_same_bytes_by_both_routes() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(12 * 256 * 256 * 2, 9);
    write_npy(&dir.path().join("vol.npy"), "<u2", &SHAPE, &data);
    // Planes are 128 KiB: the fine grid cuts one plane per chunk, the mapped grid four.
    let server = TestServer::start_with(vec![dir.path().to_path_buf()], |c| {
        c.chunks.chunk_target = Size::bytes(128 << 10);
        c.chunks.mapped_chunk_target = Size::bytes(512 << 10);
    })
    .await;
    let mut client = server.client().await;
    let expect = |start: &[i64], stop: &[i64]| {
        let (s, e) = bounds(start, stop);
        region_bytes(&data, &SHAPE, 2, &s, &e)
    };

    // A loopback peer and a file cache: the coarse grid.
    let coarse = client
        .get_flight_info(read_descriptor("vol", None))
        .await
        .unwrap();
    assert_eq!(chunk_shape(&coarse), vec![4, 256, 256]);
    let coarse_cells = endpoint_bounds(&coarse);
    assert_eq!(coarse_cells.len(), 3);
    let boxes: Vec<_> = coarse_cells
        .iter()
        .map(|(a, b, _)| (a.clone(), b.clone()))
        .collect();
    assert_tiles(&SHAPE, &boxes);
    for (start, stop, ticket) in &coarse_cells {
        let v = action_json(&mut client, "chunk_locate", ticket.ticket.to_vec()).await;
        let located = Located::from_json(&v).expect("a coarse chunk is locatable");
        let segment = std::fs::read(&located.path).unwrap();
        let (bytes, shape, _) = chunk_parts(&decode_located(&segment, &located));
        assert_eq!(bytes, expect(start, stop), "mapped {start:?}..{stop:?}");
        assert_eq!(shape, vec![4, 256, 256]);
    }
    // Still planned coarse: locating is what mapping clients do.
    let again = client
        .get_flight_info(read_descriptor("vol", None))
        .await
        .unwrap();
    assert_eq!(chunk_shape(&again), vec![4, 256, 256]);

    // A loopback client reading a coarse chunk over the socket: it does not map.
    let (start, stop, ticket) = &coarse_cells[1];
    let (bytes, _, _) = chunk_parts(&fetch_chunk(&mut client, ticket.clone()).await);
    assert_eq!(bytes, expect(start, stop), "coarse over DoGet");

    // Only the coarse cells are cached: that reader is planned on them (served from the
    // cache at once) while the fine cells are decoded in the background; once they are
    // in, its plans move to the fine grid (docs/decisions/0023).
    let warm = client
        .get_flight_info(read_descriptor("vol", None))
        .await
        .unwrap();
    assert_eq!(
        chunk_shape(&warm),
        vec![4, 256, 256],
        "the grid the cache holds"
    );
    for (start, stop, ticket) in endpoint_bounds(&warm) {
        let (bytes, _, _) = chunk_parts(&fetch_chunk(&mut client, ticket).await);
        assert_eq!(
            bytes,
            expect(&start, &stop),
            "coarse over DoGet {start:?}..{stop:?}"
        );
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let fine = loop {
        let info = client
            .get_flight_info(read_descriptor("vol", None))
            .await
            .unwrap();
        if chunk_shape(&info) == [1, 256, 256] {
            break info;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "plans never moved to the fine grid"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let stats = action_json(&mut client, "cache_stats", Vec::new()).await;
    assert_eq!(stats["total_entries"], 3 + 12, "both grids cached: {stats}");
    assert_eq!(
        stats["recuts"], 12,
        "the fine cells were cut from the cached coarse chunks (decision 0024): {stats}"
    );
    let misses = stats["misses"].clone();
    let fine_cells = endpoint_bounds(&fine);
    assert_eq!(fine_cells.len(), 12);
    for (start, stop, ticket) in fine_cells {
        let (bytes, shape, _) = chunk_parts(&fetch_chunk(&mut client, ticket).await);
        assert_eq!(bytes, expect(&start, &stop), "fine {start:?}..{stop:?}");
        assert_eq!(shape, vec![1, 256, 256]);
    }
    let stats = action_json(&mut client, "cache_stats", Vec::new()).await;
    assert_eq!(
        stats["misses"], misses,
        "the fine cells were decoded ahead: {stats}"
    );

    // A slice on the fine plan snaps to fine cells only.
    let sliced = client
        .get_flight_info(read_descriptor("vol", Some((&[5, 0, 0], &[6, 256, 256]))))
        .await
        .unwrap();
    let sliced = endpoint_bounds(&sliced);
    assert_eq!(sliced.len(), 1);

    // A client that maps again (it locates a chunk) gets the coarse grid back.
    let v = action_json(&mut client, "chunk_locate", sliced[0].2.ticket.to_vec()).await;
    assert_eq!(v["available"], true, "{v}");
    let back = client
        .get_flight_info(read_descriptor("vol", None))
        .await
        .unwrap();
    assert_eq!(chunk_shape(&back), vec![4, 256, 256]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_cache_plans_every_read_on_the_fine_grid() {
    let dir = tempfile::tempdir().unwrap();
    write_npy(
        &dir.path().join("vol.npy"),
        "<u2",
        &SHAPE,
        &pattern(12 * 256 * 256 * 2, 3),
    );
    let server = TestServer::start_with(vec![dir.path().to_path_buf()], |c| {
        c.chunks.chunk_target = Size::bytes(128 << 10);
        c.chunks.mapped_chunk_target = Size::bytes(512 << 10);
        c.cache.kind = tessera_server::config::CacheKind::Memory;
    })
    .await;
    let mut client = server.client().await;
    let info = client
        .get_flight_info(read_descriptor("vol", None))
        .await
        .unwrap();
    assert_eq!(
        chunk_shape(&info),
        vec![1, 256, 256],
        "nothing to map: socket grid"
    );
    server.stop().await;
}
