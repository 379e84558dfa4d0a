//! Malformed and forged tickets get clear errors (never a panic, never bytes
//! outside the tensor), and the server keeps serving afterwards.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use arrow_flight::Ticket;
use tessera_e2e::*;
use tessera_server::Region;
use tessera_server::config::Size;
use tessera_server::{ChunkId, ContentVersion};
use tessera_server::{Method, Scale};

async fn forged_and_malformed_tickets_get_errors_and_the_server_keeps_serving(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(64 * 64, 3);
    write_npy(&dir.path().join("a.npy"), "|u1", &[64, 64], &data);
    write_npy(&dir.path().join("b.npy"), "|u1", &[8, 8], &data[..64]);
    let server = TestServer::start_on(grid, vec![dir.path().to_path_buf()], |c| {
        c.chunks.chunk_target = Size::bytes(grid.chunk_target_for(1024))
    })
    .await;
    let mut client = server.client().await;
    let info = client
        .get_flight_info(read_descriptor("a", None))
        .await
        .unwrap();
    let good = info.endpoint[1].ticket.clone().unwrap();

    // Garbage, an empty ticket, and a truncated real one.
    let mut cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![0xff, 0x00, 0x13], "malformed"),
        (Vec::new(), "malformed"),
        (good.ticket[..good.ticket.len() - 3].to_vec(), "malformed"),
    ];
    // A real id with its bounds moved off the grid / outside the tensor / to absurd sizes.
    let id = ChunkId::decode(&good.ticket[2..]).unwrap();
    let forge = |array_id: &str, version: ContentVersion, start: Vec<u64>, stop: Vec<u64>| {
        ChunkId::new(array_id, version, Region { start, stop }).unwrap()
    };
    let (start, stop) = (id.region().start.clone(), id.region().stop.clone());
    let shifted = forge(
        "a",
        id.version(),
        vec![start[0] + 1, start[1]],
        vec![stop[0] + 1, stop[1]],
    );
    let outside = forge("a", id.version(), vec![60, 0], vec![80, 64]);
    let absurd = forge(
        "a",
        id.version(),
        vec![0, 0],
        vec![u64::MAX / 2, u64::MAX / 2],
    );
    let other = forge("b", id.version(), start.clone(), stop.clone());
    let unknown = forge("nope", id.version(), start.clone(), stop.clone());
    let ContentVersion::File(mut file) = id.version() else {
        panic!("a chunk of a .npy file carries a file's content version");
    };
    file.mtime_ns -= 1;
    let older = ContentVersion::File(file);
    let old = forge("a", older, start.clone(), stop.clone());
    // Scaled ids: an unscaled cell claimed at scale 2 (not a cell of the scaled read grid),
    // a factor over the axis length, and area of nothing stranger than u8 but off-grid.
    let scaled = |cell: ChunkId, factors: Vec<u64>| {
        let scale = Scale::new(factors, Method::Area).unwrap();
        ChunkId::scaled("a", cell.version(), cell.region().clone(), scale).unwrap()
    };
    let off_grid = scaled(shifted.clone(), vec![2, 2]);
    let over_axis = scaled(
        forge("a", id.version(), vec![0, 0], vec![64, 64]),
        vec![65, 1],
    );
    for (forged, what) in [
        (off_grid, "not a chunk"),
        (over_axis, "does not fit"),
        (shifted, "not a chunk"),
        (outside, "not a chunk"),
        (absurd, "not a chunk"),
        (other, "another version"),
        (unknown, "unknown array id"),
        (old, "another version"),
    ] {
        cases.push((tessera_proto::ticket::chunk_ticket(&forged.encode()), what));
    }
    for (ticket, expect) in cases {
        let err = client.do_get(Ticket::new(ticket.clone())).await;
        let status = match err {
            Ok(stream) => {
                use futures::TryStreamExt;
                status_of(stream.try_collect::<Vec<_>>().await.unwrap_err())
            }
            Err(e) => status_of(e),
        };
        assert_eq!(status.code(), tonic::Code::Unknown, "{}", status.message());
        assert!(
            status.message().contains(expect),
            "{expect:?} not in {:?}",
            status.message()
        );
        // chunk_locate refuses the same way.
        let err = client
            .do_action(arrow_flight::Action::new("chunk_locate", ticket))
            .await
            .err()
            .map(status_of);
        if let Some(status) = err {
            assert_eq!(status.code(), tonic::Code::Unknown);
        }
    }

    // Still serving.
    let (bytes, _, _) = chunk_parts(&fetch_chunk(&mut client, good).await);
    assert!(!bytes.is_empty());
    server.stop().await;
}

on_both_grids!(forged_and_malformed_tickets_get_errors_and_the_server_keeps_serving);
