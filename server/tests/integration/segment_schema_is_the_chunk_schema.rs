//! The schema segments are written with is the chunk schema of the protocol plus the trailing
//! `key` column: the DoGet route sends the segment's schema message as is, and the biopb
//! client reads `data`, `shape` and `dtype` by name and type. Two crates spell it (the
//! segment store uses nothing of ours); this ties them.

use arrow_schema::{DataType, Field};
use tessera_proto::chunk_schema;

#[test]
fn segment_schema_less_its_key_is_the_chunk_schema() {
    let segment = tessera_segments::ipc::schema();
    let fields = segment.fields();
    let (key, columns) = fields
        .split_last()
        .unwrap_or_else(|| panic!("the segment schema has no columns"));
    assert_eq!(key.as_ref(), &Field::new("key", DataType::Binary, false));
    let protocol = chunk_schema();
    assert_eq!(columns, &protocol.fields()[..]);
    assert_eq!(segment.metadata(), protocol.metadata());
}
