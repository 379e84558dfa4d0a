//! `chunk_locate` answers a segment path, offset, length and inode; the bytes
//! there are one IPC message that decodes to the chunk. A memory cache answers
//! `available: false` at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Cursor;
use std::os::unix::fs::MetadataExt;

use arrow_ipc::reader::StreamReader;
use tessera_e2e::*;
use tessera_server::config::Size;

async fn located_bytes_are_the_chunk_message(grid: Grid) {
    let dir = tempfile::tempdir().unwrap();
    let shape = [3u64, 50, 40];
    let data = pattern(3 * 50 * 40 * 8, 5);
    write_npy(&dir.path().join("c.npy"), "<c8", &shape, &data);
    let server = TestServer::start_on(grid, vec![dir.path().to_path_buf()], |c| {
        c.chunks.chunk_target = Size::bytes(8_000)
    })
    .await;
    let mut client = server.client().await;
    let info = client
        .get_flight_info(read_descriptor("c", None))
        .await
        .unwrap();
    server.assert_planned_on_its_grid(&info);
    assert!(info.endpoint.len() >= 2);
    for (start, stop, ticket) in endpoint_bounds(&info) {
        let v = action_json(&mut client, "chunk_locate", ticket.ticket.to_vec()).await;
        assert_eq!(v["available"], true, "{v}");
        assert_eq!(v["format_version"], 1);
        let path = v["segment_path"].as_str().unwrap();
        assert!(std::path::Path::new(path).is_absolute());
        let offset = v["byte_offset"].as_u64().unwrap() as usize;
        let length = v["byte_length"].as_u64().unwrap() as usize;
        let file = std::fs::read(path).unwrap();
        assert_eq!(
            std::fs::metadata(path).unwrap().ino(),
            v["generation_id"].as_u64().unwrap()
        );
        assert!(offset > 0, "the schema occupies the start of the file");
        assert_eq!(&file[offset..offset + 4], &[0xff; 4], "continuation marker");

        // Stream = schema message from offset 0 + this one message.
        let schema_len = 8 + u32::from_le_bytes(file[4..8].try_into().unwrap()) as usize;
        let mut stream = file[..schema_len].to_vec();
        stream.extend_from_slice(&file[offset..offset + length]);
        let batch = StreamReader::try_new(Cursor::new(stream), None)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        let (bytes, chunk_shape, dtype) = chunk_parts(&batch);
        let s: Vec<u64> = start.iter().map(|&v| v as u64).collect();
        let e: Vec<u64> = stop.iter().map(|&v| v as u64).collect();
        assert_eq!(bytes, region_bytes(&data, &shape, 8, &s, &e));
        assert_eq!(
            chunk_shape,
            start
                .iter()
                .zip(&stop)
                .map(|(a, b)| b - a)
                .collect::<Vec<_>>()
        );
        assert_eq!(dtype, "<c8");
        // The payload is 64-byte aligned in the file, for aligned zero-copy views.
        let data_col = batch.column_by_name("data").unwrap().to_data();
        assert_eq!(data_col.buffers()[1].len(), bytes.len());
        let needle = &file[offset..offset + length];
        let at = needle
            .windows(bytes.len().min(64))
            .position(|w| w == &bytes[..bytes.len().min(64)])
            .unwrap();
        assert_eq!((offset + at) % 64, 0, "payload alignment");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_cache_answers_unavailable_and_still_serves_do_get() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(1000, 6);
    write_npy(&dir.path().join("m.npy"), "<i2", &[500], &data);
    let server = TestServer::start_with(vec![dir.path().to_path_buf()], |c| {
        c.cache.kind = tessera_server::config::CacheKind::Memory
    })
    .await;
    let mut client = server.client().await;
    let info = client
        .get_flight_info(read_descriptor("m", None))
        .await
        .unwrap();
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let v = action_json(&mut client, "chunk_locate", ticket.ticket.to_vec()).await;
    assert_eq!(v["available"], false);
    let (bytes, _, dtype) = chunk_parts(&fetch_chunk(&mut client, ticket).await);
    assert_eq!(bytes, data);
    assert_eq!(dtype, "<i2");
    let stats = action_json(&mut client, "cache_stats", Vec::new()).await;
    assert_eq!(stats["backend"], "memory");
    server.stop().await;
}

on_both_grids!(located_bytes_are_the_chunk_message);
