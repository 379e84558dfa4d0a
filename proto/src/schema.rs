//! Arrow schemas of chunk batches and of read plans.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_schema::{DataType, Field, Schema};

use crate::consts::{
    CHUNK_WIRE_PROTOCOL_KEY, CHUNK_WIRE_PROTOCOL_VERSION_STR, COLUMN_DATA, COLUMN_DTYPE,
    COLUMN_SHAPE, FLIGHT_PROTOCOL_KEY, FLIGHT_PROTOCOL_VERSION_STR,
};

/// Schema of one chunk batch (chunk wire protocol 2), used by DoGet streams
/// and segment files: `data` (`Binary`, the raw C-order bytes), `shape`
/// (`List<Int64>`, list item named `item` and nullable as Arrow's default) and
/// `dtype` (Utf8, a numpy dtype string). The three columns are never null.
pub fn chunk_schema() -> Schema {
    Schema::new(vec![
        Field::new(COLUMN_DATA, DataType::Binary, false),
        Field::new(
            COLUMN_SHAPE,
            DataType::List(Arc::new(Field::new_list_field(DataType::Int64, true))),
            false,
        ),
        Field::new(COLUMN_DTYPE, DataType::Utf8, false),
    ])
}

/// Schema returned by GetFlightInfo: [`chunk_schema`] stamped with
/// `chunk_wire_protocol = "2"` and `flight_protocol = "3"`, which the client
/// checks before it reads any chunk.
pub fn plan_schema() -> Schema {
    let metadata = HashMap::from([
        (
            CHUNK_WIRE_PROTOCOL_KEY.to_owned(),
            CHUNK_WIRE_PROTOCOL_VERSION_STR.to_owned(),
        ),
        (
            FLIGHT_PROTOCOL_KEY.to_owned(),
            FLIGHT_PROTOCOL_VERSION_STR.to_owned(),
        ),
    ]);
    chunk_schema().with_metadata(metadata)
}
