//! Annotations cost the server memory in proportion to what one call needs, not to what is
//! stored or what a hostile put sends (issue 28, items 5 and 7), measured as the peak RSS of
//! a `tessera serve` child process:
//!
//! * SQL reads the `rois` table from the annotation store page by page, inside the catalog's
//!   memory pool, and only when a query scans it. Before, any SQL whose text held "rois"
//!   (`SELECT 'rois'` too) loaded every annotation into a table first: a `count(*)` over
//!   1.2 GB of annotations peaked at 4.1 GiB.
//! * An annotation's size is checked before its geometry is parsed. Before, parsing a refused
//!   2.6 MB polygon took over 100 MB, and 24 concurrent puts of one peaked at 2.76 GiB.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::{FlightClient, FlightDescriptor, PutResult, Ticket};
use futures::TryStreamExt;
use prost::Message;
use tessera_e2e::process::{ServerProcess, status_bytes};
use tessera_e2e::*;
use tessera_proto::image_pb::RoiPutResult;
use tessera_proto::pb::{PutCommand, RoiPut, put_command};
use tessera_server::StoredRoi;
use tessera_server::rows;

/// A new annotation (the server mints its id) with `geometry` and `props` as its text.
pub(crate) fn new_roi(geometry: &str, props: &str) -> (String, StoredRoi) {
    let record = StoredRoi {
        set_name: String::new(),
        label: "cell".to_string(),
        shape: String::new(),
        geometry: geometry.to_string(),
        plane: BTreeMap::new(),
        props_json: props.to_string(),
        drawn_against_version: None,
        rev: 0,
        created_ms: 0,
        updated_ms: 0,
    };
    (String::new(), record)
}

/// Sends `rois` to tensor `array_id` in one `roi_put` DoPut, as ROI rows.
pub(crate) async fn put_rois(
    client: &mut FlightClient,
    array_id: &str,
    rois: &[(String, StoredRoi)],
) -> Result<RoiPutResult, tonic::Status> {
    let command = PutCommand {
        command: Some(put_command::Command::RoiPut(RoiPut {
            array_id: array_id.to_string(),
            check_rev: false,
        })),
    };
    let batch = rows::to_batch(rows::schema(false, &[]), array_id, rois).unwrap();
    let stream = FlightDataEncoderBuilder::new()
        .with_flight_descriptor(Some(FlightDescriptor::new_cmd(command.encode_to_vec())))
        .build(futures::stream::iter([Ok(batch)]));
    let replies: Vec<PutResult> = match client.do_put(stream).await {
        Ok(replies) => replies.try_collect().await.map_err(status_of)?,
        Err(e) => return Err(status_of(e)),
    };
    Ok(RoiPutResult::decode(replies[0].app_metadata.clone()).unwrap())
}

/// How far the peak RSS of `pid` rose over its RSS while `work` ran (the peak is reset
/// first through `/proc/PID/clear_refs`).
pub(crate) async fn peak_rise<T>(pid: u32, work: impl std::future::Future<Output = T>) -> (u64, T) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let before = status_bytes(pid, "VmRSS:");
    let out = work.await;
    let peak = status_bytes(pid, "VmHWM:");
    (peak.saturating_sub(before), out)
}

/// The answer of catalog query `sql`, as one batch.
async fn query(client: &mut FlightClient, sql: &str) -> Vec<arrow_array::RecordBatch> {
    let ticket = Ticket::new(tessera_proto::ticket::catalog_ticket(sql));
    fetch_batches(client, ticket).await
}

/// A server of tensors `a0` … `a3`, tiny (the annotations are what is large), with a cache
/// directory of its own; the directories go with it.
fn serve() -> (ServerProcess, [tempfile::TempDir; 2]) {
    let dir = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    for i in 0..4 {
        write_npy(&dir.path().join(format!("a{i}.npy")), "|u1", &[8], &[0; 8]);
    }
    let server = ServerProcess::spawn(&[
        dir.path().as_os_str(),
        "--cache-dir".as_ref(),
        cache.path().as_os_str(),
    ]);
    (server, [dir, cache])
}

const POINT: &str = r#"{"point": {"x": 1, "y": 2}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_reads_annotations_page_by_page_inside_the_pool() {
    let (server, _dirs) = serve();
    let mut client = server.client().await;
    // 2,800 annotations of 60 KB each (168 MB stored), in puts of 400 over four tensors.
    let props = format!(r#"{{"note": "{}"}}"#, "n".repeat(60_000));
    let batch: Vec<_> = (0..400).map(|_| new_roi(POINT, &props)).collect();
    for i in 0..7 {
        let done = put_rois(&mut client, &format!("a{}", i % 4), &batch)
            .await
            .unwrap();
        assert_eq!(done.stored.len(), 400);
    }
    let pid = server.pid();

    // The first query starts the catalog's worker and session machinery: not measured.
    query(&mut client, "SELECT 'warm' AS word").await;
    // A query that does not scan the table reads no annotation.
    let (rise, answer) = peak_rise(pid, query(&mut client, "SELECT 'rois' AS word")).await;
    assert_eq!(answer.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    eprintln!("SELECT 'rois': peak RSS rose {} MiB", rise >> 20);
    assert!(
        rise < 16 << 20,
        "SELECT 'rois' raised the peak RSS by {} MiB: it read the annotations",
        rise >> 20
    );

    // A scan of every annotation holds about a page at a time.
    let sql = "SELECT count(*) AS n, max(length(props_json)) AS longest FROM rois";
    let (rise, answer) = peak_rise(pid, query(&mut client, sql)).await;
    eprintln!(
        "count(*) over 168 MB of annotations: peak RSS rose {} MiB",
        rise >> 20
    );
    let batch = &answer[0];
    let n = batch
        .column(0)
        .as_any()
        .downcast_ref::<arrow_array::Int64Array>();
    assert_eq!(n.unwrap().value(0), 2800);
    let longest = batch
        .column(1)
        .as_any()
        .downcast_ref::<arrow_array::Int32Array>();
    assert_eq!(longest.unwrap().value(0), props.len() as i32);
    assert!(
        rise < 96 << 20,
        "a scan of 168 MB of annotations raised the peak RSS by {} MiB",
        rise >> 20
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_geometries_are_refused_before_they_are_parsed() {
    let (server, _dirs) = serve();
    // A 2.6 MB polygon of 120,000 points, far over the 64 KiB an annotation may be.
    let points: Vec<String> = (0..120_000)
        .map(|i| format!(r#"{{"x": {}.5, "y": {}.25}}"#, i % 1000, i / 1000))
        .collect();
    let polygon = format!(r#"{{"polygon": {{"points": [{}]}}}}"#, points.join(","));
    assert!(polygon.len() > 2_500_000);
    let rows = vec![new_roi(&polygon, "")];
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(server.client().await);
    }
    let puts = clients
        .iter_mut()
        .map(|client| put_rois(client, "a0", &rows));
    let (rise, outcomes) = peak_rise(server.pid(), futures::future::join_all(puts)).await;
    eprintln!(
        "6 puts of a 2.6 MB polygon: peak RSS rose {} MiB",
        rise >> 20
    );
    for outcome in outcomes {
        let status = outcome.expect_err("an oversized annotation is refused");
        assert!(status.message().contains("max_roi_bytes"), "{status}");
    }
    assert!(
        rise < 128 << 20,
        "6 refused puts of a 2.6 MB polygon raised the peak RSS by {} MiB",
        rise >> 20
    );
}
