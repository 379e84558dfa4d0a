//! JSON shapes of the action replies and the plan schema stamp.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use tessera_proto::{
    ActionBody, CHUNK_LOCATE_FORMAT_VERSION, CacheBackend, CacheStats, ChunkLocateReply,
    ChunkLocation, FLIGHT_PROTOCOL_VERSION, Health, ProtoError, chunk_schema, plan_schema,
};

fn health(external_location: Option<String>) -> Health {
    Health {
        status: "SERVING".to_owned(),
        protocol: FLIGHT_PROTOCOL_VERSION,
        source_count: 2,
        uptime_seconds: 1.5,
        writable: false,
        metadata_db_enabled: true,
        annotations_persisted: true,
        full_scan_in_progress: false,
        last_full_scan_finished_at: None,
        registration_pending: 0,
        catalog_generation: Some("1764856000000.7.0".to_owned()),
        server: "tessera".to_owned(),
        version: "0.1.0".to_owned(),
        external_location,
        cache_degraded: None,
    }
}

fn as_json(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap()
}

#[test]
fn health_says_protocol_3_and_never_ticket_stubs() {
    for external in [None, Some("grpc://10.0.0.1:8815".to_owned())] {
        let value = as_json(&health(external).to_body().unwrap());
        assert_eq!(value["protocol"], json!(3));
        assert_eq!(value["status"], json!("SERVING"));
        assert!(value.get("ticket_stubs").is_none(), "{value}");
        // The napari Tensor Browser polls these two to know when to re-list.
        assert_eq!(value["registration_pending"], json!(0));
        assert_eq!(value["catalog_generation"], json!("1764856000000.7.0"));
    }
}

#[test]
fn health_omits_external_location_when_unset() {
    let value = as_json(&health(None).to_body().unwrap());
    assert!(value.get("external_location").is_none(), "{value}");
    assert_eq!(value["last_full_scan_finished_at"], Value::Null);
    let value = as_json(&health(Some("grpc://h:1".to_owned())).to_body().unwrap());
    assert_eq!(value["external_location"], json!("grpc://h:1"));
}

#[test]
fn health_round_trips() {
    let sent = health(Some("grpc://h:1".to_owned()));
    assert_eq!(Health::from_body(&sent.to_body().unwrap()).unwrap(), sent);
}

#[test]
fn located_chunk_has_exactly_the_client_keys() {
    let reply = ChunkLocateReply::located("/cache/segments/seg_0001.arrow", 512, 4096, 77);
    let value = as_json(&reply.to_body().unwrap());
    assert_eq!(
        value,
        json!({
            "available": true,
            "format_version": 1,
            "segment_path": "/cache/segments/seg_0001.arrow",
            "byte_offset": 512,
            "byte_length": 4096,
            "generation_id": 77,
        })
    );
    assert_eq!(
        ChunkLocateReply::from_body(&reply.to_body().unwrap()).unwrap(),
        reply
    );
}

#[test]
fn unavailable_chunk_says_available_false_and_why() {
    let reply = ChunkLocateReply::unavailable("memory cache");
    let value = as_json(&reply.to_body().unwrap());
    assert_eq!(value, json!({"available": false, "reason": "memory cache"}));
}

#[test]
fn bare_unavailable_reply_decodes() {
    let reply = ChunkLocateReply::from_body(br#"{"available": false}"#).unwrap();
    assert_eq!(reply, ChunkLocateReply::Unavailable { reason: None });
    let value = serde_json::to_value(&reply).unwrap();
    assert_eq!(value, json!({"available": false}));
}

#[test]
fn located_reply_without_format_version_reads_as_version_1() {
    let body = br#"{"available":true,"segment_path":"/s","byte_offset":8,"byte_length":9,"generation_id":3}"#;
    let reply = ChunkLocateReply::from_body(body).unwrap();
    assert_eq!(
        reply,
        ChunkLocateReply::Located(ChunkLocation {
            format_version: CHUNK_LOCATE_FORMAT_VERSION,
            segment_path: "/s".to_owned(),
            byte_offset: 8,
            byte_length: 9,
            generation_id: 3,
        })
    );
}

#[test]
fn located_reply_missing_a_key_is_refused_naming_it() {
    let body = br#"{"available":true,"segment_path":"/s","byte_offset":8,"byte_length":9}"#;
    let err = ChunkLocateReply::from_body(body).unwrap_err();
    assert!(
        matches!(
            err,
            ProtoError::Json {
                action: "chunk_locate",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("'generation_id'"), "{err}");
}

#[test]
fn cache_stats_has_reference_and_tessera_keys() {
    let stats = CacheStats {
        total_entries: 1,
        total_bytes: 2,
        max_entries: 3,
        max_bytes: 4,
        hits: 5,
        misses: 6,
        evictions: 7,
        pending_waits: 8,
        ref_held_evictions_skipped: 9,
        oversized_skips: 10,
        unlinked_bytes: 11,
        segments: 12,
        locates: 13,
        do_gets: 14,
        budget_waits: 15,
        budget_overruns: 16,
        read_aheads: 17,
        recuts: 22,
        pinned_bytes: 18,
        stalled_connections_closed: 19,
        write_failures: 20,
        disk_full_events: 21,
        disk_ceiling_bytes: None,
        writes_paused: None,
        backend: CacheBackend::File,
    };
    let value = as_json(&stats.to_body().unwrap());
    let keys: Vec<&str> = value
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let mut expected = vec![
        "total_entries",
        "total_bytes",
        "max_entries",
        "max_bytes",
        "hits",
        "misses",
        "evictions",
        "pending_waits",
        "ref_held_evictions_skipped",
        "oversized_skips",
        "unlinked_bytes",
        "segments",
        "locates",
        "do_gets",
        "budget_waits",
        "budget_overruns",
        "read_aheads",
        "recuts",
        "pinned_bytes",
        "stalled_connections_closed",
        "write_failures",
        "disk_full_events",
        "backend",
    ];
    expected.sort_unstable();
    let mut keys = keys;
    keys.sort_unstable();
    assert_eq!(keys, expected);
    assert_eq!(value["backend"], json!("file"));
    assert_eq!(
        CacheStats::from_body(&stats.to_body().unwrap()).unwrap(),
        stats
    );
    // A full disk adds the ceiling and the pause, and both survive the round trip.
    let full = CacheStats {
        disk_ceiling_bytes: Some(1 << 20),
        writes_paused: Some("No space left on device".to_owned()),
        ..stats
    };
    let value = as_json(&full.to_body().unwrap());
    assert_eq!(value["disk_ceiling_bytes"], json!(1 << 20));
    assert_eq!(
        CacheStats::from_body(&full.to_body().unwrap()).unwrap(),
        full
    );
    let memory = serde_json::to_value(CacheBackend::Memory).unwrap();
    assert_eq!(memory, json!("memory"));
}

#[test]
fn health_body_that_is_not_json_names_the_action() {
    let err = Health::from_body(b"not json").unwrap_err();
    assert!(err.to_string().starts_with("health action body"), "{err}");
}

#[test]
fn plan_schema_is_chunk_schema_stamped_with_both_versions() {
    let plan = plan_schema();
    assert_eq!(
        plan.metadata()
            .get("chunk_wire_protocol")
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(
        plan.metadata().get("flight_protocol").map(String::as_str),
        Some("3")
    );
    assert_eq!(plan.metadata().len(), 2);
    assert_eq!(plan.fields(), chunk_schema().fields());
}

#[test]
fn chunk_schema_columns_are_data_shape_dtype() {
    use arrow_schema::{DataType, Field};
    use std::sync::Arc;
    let schema = chunk_schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["data", "shape", "dtype"]);
    assert_eq!(schema.field(0).data_type(), &DataType::Binary);
    assert_eq!(
        schema.field(1).data_type(),
        &DataType::List(Arc::new(Field::new("item", DataType::Int64, true)))
    );
    assert_eq!(schema.field(2).data_type(), &DataType::Utf8);
    assert!(schema.metadata().is_empty());
}
