//! A sliced plan is realized on the chunk grid; bounds are relative to the
//! realized start; cropping as the biopb client does yields the requested region.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use prost::Message;
use tessera_e2e::*;
use tessera_proto::pb::TensorDescriptor;
use tessera_server::config::Size;

async fn slices_are_realized_on_the_grid_and_crop_to_the_request(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let shape = [7u64, 64, 90];
    let data = pattern(7 * 64 * 90 * 4, 2);
    write_npy(&dir.path().join("f.npy"), ">f4", &shape, &data);
    let server = TestServer::start_on(grid, vec![dir.path().join("f.npy")], |c| {
        c.chunks.chunk_target = Size::bytes(8_000)
    })
    .await;
    let mut client = server.client().await;

    for (start, stop) in [
        (vec![1i64, 3, 5], vec![6i64, 40, 50]),
        (vec![0, 0, 0], vec![7, 64, 90]),
        (vec![6, 63, 89], vec![7, 64, 90]),
        (vec![2, 10, 0], vec![3, 11, 90]),
    ] {
        let info = client
            .get_flight_info(read_descriptor("f", Some((&start, &stop))))
            .await
            .unwrap();
        let desc = TensorDescriptor::decode(info.flight_descriptor.clone().unwrap().cmd).unwrap();
        let real = desc
            .slice_hint
            .clone()
            .expect("a sliced read reports its realized region");
        for axis in 0..3 {
            assert!(real.start[axis] <= start[axis] && real.stop[axis] >= stop[axis]);
            assert_eq!(desc.shape[axis], real.stop[axis] - real.start[axis]);
        }
        assert_eq!(desc.dtype, ">f4");
        server.assert_planned_on_its_grid(&info);
        let realized: Vec<u64> = desc.shape.iter().map(|&d| d as u64).collect();
        let endpoints = endpoint_bounds(&info);
        let boxes: Vec<_> = endpoints
            .iter()
            .map(|(a, b, _)| (a.clone(), b.clone()))
            .collect();
        assert_tiles(&realized, &boxes);

        // Assemble the realized region from the chunks, then crop like the client.
        let total: u64 = realized.iter().product();
        let mut assembled = vec![0u8; total as usize * 4];
        for (cs, ce, ticket) in endpoints {
            let (bytes, _, _) = chunk_parts(&fetch_chunk(&mut client, ticket).await);
            let cs: Vec<u64> = cs.iter().map(|&v| v as u64).collect();
            let ce: Vec<u64> = ce.iter().map(|&v| v as u64).collect();
            scatter(&mut assembled, &realized, 4, &cs, &ce, &bytes);
        }
        let crop_start: Vec<u64> = (0..3).map(|a| (start[a] - real.start[a]) as u64).collect();
        let crop_stop: Vec<u64> = (0..3).map(|a| (stop[a] - real.start[a]) as u64).collect();
        let got = region_bytes(&assembled, &realized, 4, &crop_start, &crop_stop);
        let s: Vec<u64> = start.iter().map(|&v| v as u64).collect();
        let e: Vec<u64> = stop.iter().map(|&v| v as u64).collect();
        assert_eq!(
            got,
            region_bytes(&data, &shape, 4, &s, &e),
            "slice {start:?}..{stop:?}"
        );
    }
    server.stop().await;
}

/// Writes a chunk's C-order bytes into its box of a C-order array.
fn scatter(dst: &mut [u8], shape: &[u64], item: usize, start: &[u64], stop: &[u64], src: &[u8]) {
    let row = (stop[2] - start[2]) as usize * item;
    let mut at = 0;
    for i in start[0]..stop[0] {
        for j in start[1]..stop[1] {
            let off = ((i * shape[1] + j) * shape[2] + start[2]) as usize * item;
            dst[off..off + row].copy_from_slice(&src[at..at + row]);
            at += row;
        }
    }
}

on_both_grids!(slices_are_realized_on_the_grid_and_crop_to_the_request);
