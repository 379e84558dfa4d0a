//! The SQL catalog through the real server: every query the biopb client composes
//! returns the right rows, the catalog tables are visible to generic Flight tools,
//! and everything that is not a query over the catalog is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::Int64Type;
use arrow_array::{Array, RecordBatch};
use arrow_flight::decode::FlightRecordBatchStream;
use arrow_flight::{Criteria, FlightClient, FlightDescriptor, Ticket};
use arrow_schema::{DataType, SchemaRef};
use futures::TryStreamExt;
use tessera_e2e::*;

/// A query's schema (with its metadata) and rows.
struct Answer {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
}

impl Answer {
    fn rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }

    fn meta(&self, key: &str) -> Option<&str> {
        self.schema.metadata().get(key).map(String::as_str)
    }

    /// Column `name` of a small answer (the server sends it as one batch).
    fn column(&self, name: &str) -> arrow_array::ArrayRef {
        assert_eq!(self.batches.len(), 1, "a small answer is one batch");
        self.batches[0].column_by_name(name).unwrap().clone()
    }

    fn strings(&self, name: &str) -> Vec<Option<String>> {
        let column = self.column(name);
        let column = column.as_string::<i32>();
        column.iter().map(|v| v.map(str::to_string)).collect()
    }
}

async fn query(client: &mut FlightClient, sql: &str) -> Result<Answer, tonic::Status> {
    let ticket = Ticket::new(tessera_proto::ticket::catalog_ticket(sql));
    let mut stream: FlightRecordBatchStream = client.do_get(ticket).await.map_err(status_of)?;
    let mut batches = Vec::new();
    while let Some(batch) = stream.try_next().await.map_err(status_of)? {
        batches.push(batch);
    }
    let schema = stream.schema().expect("a schema message").clone();
    Ok(Answer { schema, batches })
}

async fn refused(client: &mut FlightClient, sql: &str) -> String {
    let status = match query(client, sql).await {
        Ok(answer) => panic!("{sql:?} must be refused, got {} rows", answer.rows()),
        Err(status) => status,
    };
    assert_eq!(status.code(), tonic::Code::Unknown, "{sql}: {status:?}");
    assert!(
        status.message().starts_with("Catalog query failed: "),
        "{sql}: {}",
        status.message()
    );
    status.message().to_string()
}

/// `alpha` (<u2, 4×6), `beta` (<f4, 3) and a malformed `broken.npy`.
fn fixture(dir: &Path) {
    write_npy(&dir.join("alpha.npy"), "<u2", &[4, 6], &pattern(48, 1));
    write_npy(&dir.join("beta.npy"), "<f4", &[3], &pattern(12, 2));
    std::fs::write(
        dir.join("broken.npy"),
        b"\x93NUMPY\x01\x00\x10\x00{'descr': '|O'}",
    )
    .unwrap();
}

fn file_url(path: &Path) -> String {
    format!("file://{}", path.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_query_the_client_sends_returns_the_right_rows() {
    let dir = tempfile::tempdir().unwrap();
    fixture(dir.path());
    let root = std::path::absolute(dir.path()).unwrap();
    let server = TestServer::start(vec![dir.path().to_path_buf()]).await;
    let mut client = server.client().await;

    // 1. The token check of biopb.tensor.Connection.
    let answer = query(&mut client, "SELECT 1 FROM sources LIMIT 0")
        .await
        .unwrap();
    assert_eq!(answer.rows(), 0);
    assert_eq!(answer.schema.fields().len(), 1);
    assert_eq!(answer.meta("returned_rows"), Some("0"));
    assert_eq!(answer.meta("truncated"), Some("False"));

    // 2. The CLI listing, with the reason column the schema advertises.
    let answer = query(
        &mut client,
        "SELECT source_id, source_url, source_type, is_resolved, tensors, unresolved_reason \
         FROM sources ORDER BY source_id",
    )
    .await
    .unwrap();
    assert_eq!(answer.meta("returned_rows"), Some("3"));
    assert_eq!(answer.meta("total_rows"), Some("3"));
    let ids: Vec<_> = answer.strings("source_id").into_iter().flatten().collect();
    assert_eq!(ids, ["alpha", "beta", "broken"]);
    assert_eq!(
        answer.strings("source_url"),
        ["alpha.npy", "beta.npy", "broken.npy"]
            .map(|f| Some(file_url(&root.join(f))))
            .to_vec()
    );
    assert_eq!(
        answer.strings("source_type"),
        vec![Some("npy".to_string()); 3]
    );
    let resolved = answer.column("is_resolved");
    let resolved: Vec<_> = resolved.as_boolean().iter().collect();
    assert_eq!(resolved, [Some(true), Some(true), Some(false)]);
    let reasons = answer.strings("unresolved_reason");
    assert!(reasons[0].is_none() && reasons[1].is_none());
    assert!(
        reasons[2].as_deref().unwrap().contains("broken.npy"),
        "{reasons:?}"
    );
    let tensors = answer.column("tensors");
    let tensors = tensors.as_list::<i32>();
    assert_eq!(
        (
            tensors.value_length(0),
            tensors.value_length(1),
            tensors.value_length(2)
        ),
        (1, 1, 0)
    );
    let alpha = tensors.value(0);
    let alpha = alpha.as_struct();
    assert_eq!(
        alpha
            .column_by_name("array_id")
            .unwrap()
            .as_string::<i32>()
            .value(0),
        "alpha"
    );
    assert_eq!(
        alpha
            .column_by_name("dtype")
            .unwrap()
            .as_string::<i32>()
            .value(0),
        "<u2"
    );
    let shape = alpha
        .column_by_name("shape")
        .unwrap()
        .as_list::<i32>()
        .value(0);
    assert_eq!(shape.as_primitive::<Int64Type>().values().to_vec(), [4, 6]);
    let labels = alpha
        .column_by_name("dim_labels")
        .unwrap()
        .as_list::<i32>()
        .value(0);
    assert_eq!(labels.len(), 2);

    // 3. get_source_metadata: the addressed row, not the first one.
    let answer = query(
        &mut client,
        "SELECT is_resolved, metadata_json FROM sources WHERE source_id = 'beta'",
    )
    .await
    .unwrap();
    assert_eq!(answer.rows(), 1);
    let meta: serde_json::Value =
        serde_json::from_str(answer.strings("metadata_json")[0].as_deref().unwrap()).unwrap();
    assert_eq!(meta["dtype"], "<f4");
    assert_eq!(meta["shape"], serde_json::json!([3]));

    // A literal with a doubled quote is one quote, and matches no source.
    let answer = query(
        &mut client,
        "SELECT is_resolved, metadata_json FROM sources WHERE source_id = 'it''s'",
    )
    .await
    .unwrap();
    assert_eq!(answer.rows(), 0);
    let answer = query(&mut client, "SELECT 'it''s' AS s").await.unwrap();
    assert_eq!(answer.strings("s"), [Some("it's".to_string())]);

    // 4. The open-ended slice probe.
    let answer = query(
        &mut client,
        "SELECT is_resolved, tensors FROM sources WHERE source_id = 'alpha'",
    )
    .await
    .unwrap();
    assert_eq!(answer.rows(), 1);
    assert_eq!(answer.column("tensors").as_list::<i32>().value_length(0), 1);

    // 5. DuckDB's len() over the tensor list.
    for (id, count) in [("alpha", 1), ("broken", 0)] {
        let sql =
            format!("SELECT len(tensors) AS tensor_count FROM sources WHERE source_id = '{id}'");
        let answer = query(&mut client, &sql).await.unwrap();
        assert_eq!(answer.schema.field(0).name(), "tensor_count");
        let column = answer.column("tensor_count");
        assert_eq!(
            column.as_primitive::<Int64Type>().values().to_vec(),
            [count]
        );
    }

    // 6. The reasons of unresolved sources.
    let answer = query(
        &mut client,
        "SELECT source_id, unresolved_reason FROM sources WHERE NOT is_resolved",
    )
    .await
    .unwrap();
    assert_eq!(answer.strings("source_id"), [Some("broken".to_string())]);

    // Struct fields of list items, 1-based list index. DataFusion spells the field access
    // `['dtype']`; DuckDB's `.dtype` after an index is not supported (a known gap).
    let answer = query(
        &mut client,
        "SELECT source_id FROM sources WHERE tensors[1]['dtype'] = '<f4'",
    )
    .await
    .unwrap();
    assert_eq!(answer.strings("source_id"), [Some("beta".to_string())]);

    // The tensors table carries the serving details.
    let answer = query(
        &mut client,
        "SELECT array_id, source_id, nbytes, dtype, path, chunk_shape, content_version \
         FROM tensors ORDER BY array_id",
    )
    .await
    .unwrap();
    assert_eq!(
        answer.strings("array_id"),
        [Some("alpha".to_string()), Some("beta".to_string())]
    );
    assert_eq!(answer.strings("source_id"), answer.strings("array_id"));
    let nbytes = answer.column("nbytes");
    assert_eq!(
        nbytes.as_primitive::<Int64Type>().values().to_vec(),
        [48, 12]
    );
    assert_eq!(
        answer.strings("path")[0].as_deref(),
        Some(root.join("alpha.npy").to_str().unwrap())
    );
    let version = answer.strings("content_version");
    assert_eq!(version[0].as_deref().unwrap().len(), 64, "32 bytes in hex");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_table_has_exactly_the_protocol_columns() {
    let dir = tempfile::tempdir().unwrap();
    fixture(dir.path());
    let server = TestServer::start(vec![dir.path().to_path_buf()]).await;
    let mut client = server.client().await;
    let answer = query(&mut client, "SELECT * FROM sources").await.unwrap();
    let columns: Vec<(&str, &DataType, bool)> = answer
        .schema
        .fields()
        .iter()
        .map(|f| (f.name().as_str(), f.data_type(), f.is_nullable()))
        .collect();
    let names: Vec<&str> = columns.iter().map(|c| c.0).collect();
    assert_eq!(
        names,
        [
            "source_id",
            "source_url",
            "source_type",
            "is_resolved",
            "tensors",
            "metadata_json",
            "unresolved_reason"
        ]
    );
    for (name, ty, _) in &columns[..3] {
        assert_eq!(**ty, DataType::Utf8, "{name}");
    }
    assert_eq!(*columns[3].1, DataType::Boolean);
    let DataType::List(item) = columns[4].1 else {
        panic!("tensors is a list: {:?}", columns[4].1)
    };
    let DataType::Struct(fields) = item.data_type() else {
        panic!("of structs: {:?}", item.data_type())
    };
    let inner: Vec<(&str, String)> = fields
        .iter()
        .map(|f| (f.name().as_str(), format!("{}", f.data_type())))
        .collect();
    assert_eq!(inner[0], ("array_id", "Utf8".to_string()));
    assert_eq!(inner[3], ("dtype", "Utf8".to_string()));
    assert!(matches!(fields[1].data_type(), DataType::List(f) if *f.data_type() == DataType::Utf8));
    assert!(
        matches!(fields[2].data_type(), DataType::List(f) if *f.data_type() == DataType::Int64)
    );
    assert_eq!((columns[5].1, columns[5].2), (&DataType::Utf8, true));
    assert_eq!((columns[6].1, columns[6].2), (&DataType::Utf8, true));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_tables_are_flights_beside_the_tensors() {
    let dir = tempfile::tempdir().unwrap();
    fixture(dir.path());
    let server = TestServer::start(vec![dir.path().to_path_buf()]).await;
    let mut client = server.client().await;

    let info = client
        .get_flight_info(FlightDescriptor::new_path(vec!["sources".to_string()]))
        .await
        .unwrap();
    let schema = info.clone().try_decode_schema().unwrap();
    assert!(schema.field_with_name("unresolved_reason").is_ok());
    assert_eq!((info.total_records, info.total_bytes), (-1, -1));
    assert_eq!(info.endpoint.len(), 1);
    let ticket = info.endpoint[0].ticket.clone().unwrap();
    let rows = fetch_batches(&mut client, ticket).await;
    assert_eq!(rows.iter().map(|b| b.num_rows()).sum::<usize>(), 3);

    let schema = client
        .get_schema(FlightDescriptor::new_path(vec!["tensors".to_string()]))
        .await
        .unwrap();
    assert!(schema.field_with_name("chunk_shape").is_ok());

    // Any other single name is still an array id.
    let info = client
        .get_flight_info(FlightDescriptor::new_path(vec!["alpha".to_string()]))
        .await
        .unwrap();
    assert!(!info.endpoint.is_empty());

    let listed: Vec<_> = client
        .list_flights(Criteria::default().expression)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let paths: Vec<String> = listed
        .iter()
        .map(|i| i.flight_descriptor.as_ref().unwrap().path.join("/"))
        .collect();
    assert_eq!(paths, ["alpha", "beta"], "ListFlights lists tensors only");
    let tables: Vec<_> = client
        .list_flights(bytes::Bytes::from_static(b"catalog"))
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let paths: Vec<String> = tables
        .iter()
        .map(|i| i.flight_descriptor.as_ref().unwrap().path.join("/"))
        .collect();
    assert_eq!(paths, ["sources", "tensors"]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_but_a_catalog_query_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    fixture(dir.path());
    let secret = dir.path().join("secret.csv");
    std::fs::write(&secret, "a,b\n1,2\n").unwrap();
    let out = dir.path().join("out.csv");
    let server = TestServer::start(vec![dir.path().join("alpha.npy")]).await;
    let mut client = server.client().await;

    let secret = secret.display();
    let out_path = out.display();
    for sql in [
        "CREATE TABLE t AS SELECT 1".to_string(),
        "CREATE VIEW v AS SELECT * FROM sources".to_string(),
        format!("CREATE EXTERNAL TABLE t STORED AS CSV LOCATION '{secret}'"),
        "INSERT INTO sources VALUES ('x')".to_string(),
        "DELETE FROM sources".to_string(),
        "DROP TABLE sources".to_string(),
        format!("COPY sources TO '{out_path}'"),
        format!("COPY (SELECT * FROM tensors) TO '{out_path}' STORED AS CSV"),
        "SET datafusion.execution.batch_size = 1".to_string(),
        "SELECT * FROM read_parquet('/etc/passwd')".to_string(),
        format!("SELECT * FROM read_csv('{secret}')"),
        format!("SELECT * FROM '{secret}'"),
        "SELECT * FROM generate_series(1, 10)".to_string(),
        // Output sized by an argument, not by the tables: 80 GB outside the memory pool.
        "SELECT range(10000000000)".to_string(),
        "SELECT unnest(generate_series(1, 10000000000))".to_string(),
        "SELECT repeat('x', 10000000000)".to_string(),
        "SELECT array_repeat(1, 10000000000)".to_string(),
        "SELECT lpad('x', 10000000000)".to_string(),
        "SELECT * FROM passwords".to_string(),
        "SELECT 1; DROP TABLE sources".to_string(),
        "SELEC nonsense".to_string(),
    ] {
        refused(&mut client, &sql).await;
    }
    assert!(!out.exists(), "COPY must write nothing");
    // The catalog still answers after the refusals.
    let answer = query(&mut client, "SELECT source_id FROM sources")
        .await
        .unwrap();
    assert_eq!(answer.strings("source_id"), [Some("alpha".to_string())]);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_cross_join_is_cut_at_the_row_bound() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..12 {
        write_npy(
            &dir.path().join(format!("t{i:02}.npy")),
            "|u1",
            &[4],
            &pattern(4, i),
        );
    }
    let server = TestServer::start(vec![dir.path().to_path_buf()]).await;
    let mut client = server.client().await;

    // 12^5 = 248,832 rows: more than the 100,000-row bound.
    let answer = query(
        &mut client,
        "SELECT a.array_id, b.array_id, c.array_id, d.array_id, e.array_id \
         FROM tensors a, tensors b, tensors c, tensors d, tensors e",
    )
    .await
    .unwrap();
    assert_eq!(answer.rows(), 100_000);
    assert_eq!(answer.meta("returned_rows"), Some("100000"));
    assert_eq!(answer.meta("truncated"), Some("True"));
    assert_eq!(answer.meta("total_rows"), None, "unknown when cut");

    // Wide rows hit the byte bound first; the answer still says so.
    let answer = query(
        &mut client,
        "SELECT * FROM tensors a, tensors b, tensors c, tensors d, tensors e, tensors f",
    )
    .await
    .unwrap();
    assert!(answer.rows() <= 100_000);
    assert_eq!(answer.meta("truncated"), Some("True"));
    assert_eq!(
        answer.meta("returned_rows"),
        Some(answer.rows().to_string().as_str())
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_follows_files_changed_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("grow.npy");
    write_npy(&path, "<u2", &[4], &pattern(8, 3));
    let server = TestServer::start(vec![path.clone()]).await;
    let mut client = server.client().await;
    let sql = "SELECT shape FROM tensors WHERE array_id = 'grow'";
    let shape = |answer: &Answer| {
        let column = answer.column("shape");
        column
            .as_list::<i32>()
            .value(0)
            .as_primitive::<Int64Type>()
            .values()
            .to_vec()
    };
    assert_eq!(shape(&query(&mut client, sql).await.unwrap()), [4]);
    // A different size changes the content version even within one mtime tick.
    write_npy(&path, "<u2", &[2, 5], &pattern(20, 4));
    assert_eq!(shape(&query(&mut client, sql).await.unwrap()), [2, 5]);
    std::fs::write(&path, b"not an npy file").unwrap();
    let answer = query(
        &mut client,
        "SELECT source_id, unresolved_reason FROM sources WHERE NOT is_resolved",
    )
    .await
    .unwrap();
    assert_eq!(answer.strings("source_id"), [Some("grow".to_string())]);
    server.stop().await;
}
