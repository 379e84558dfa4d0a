//! The catalog on the Flight wire: query answers as Arrow IPC `FlightData`, and
//! the catalog tables as `FlightInfo`s for PATH descriptors and ListFlights.

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::{FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, Ticket};
use arrow_ipc::writer::IpcWriteOptions;
use arrow_schema::Schema;
use futures::{Stream, StreamExt};
use tonic::Status;

use crate::catalog::QueryAnswer;
use crate::catalog::tables::{TABLES, table_schema};
use crate::error::{Fault, ServiceError, ServiceResult};

/// The answer as a Flight stream: the schema message (with the row-count
/// metadata, sent even when there are no rows), then the batches, split by the
/// encoder into messages of about 2 MiB, written with `options` (zstd buffers or not).
pub fn flight_data(
    answer: QueryAnswer,
    options: IpcWriteOptions,
) -> impl Stream<Item = Result<FlightData, Status>> + Send + 'static {
    let batches = futures::stream::iter(answer.batches.into_iter().map(Ok));
    FlightDataEncoderBuilder::new()
        .with_options(options)
        .with_schema(answer.schema)
        .build(batches)
        .map(|item| {
            item.map_err(|e| {
                Status::from(ServiceError::from(Fault::encode_stream(
                    "a catalog answer",
                    e,
                )))
            })
        })
}

/// `batch` as the bytes of an Arrow IPC stream (schema message, the batch, end marker):
/// the `source_row` of a `resolve` reply.
pub fn ipc_stream(batch: &arrow_array::RecordBatch) -> ServiceResult<Vec<u8>> {
    let encode = |e| ServiceError::from(Fault::encode("a catalog row", e));
    let mut out = Vec::new();
    let mut writer =
        arrow_ipc::writer::StreamWriter::try_new(&mut out, &batch.schema()).map_err(encode)?;
    writer.write(batch).map_err(encode)?;
    writer.finish().map_err(encode)?;
    drop(writer);
    Ok(out)
}

/// The `FlightInfo` of catalog table `name`, whose schema is `schema`: descriptor PATH
/// `[name]`, the schema, one endpoint whose ticket runs `SELECT * FROM <name>`, and unknown
/// totals (-1).
pub fn table_flight_info(name: &str, schema: &Schema) -> ServiceResult<FlightInfo> {
    let ticket = tessera_proto::ticket::catalog_ticket(&format!("SELECT * FROM {name}"));
    Ok(FlightInfo::new()
        .try_with_schema(schema)
        .map_err(|e| ServiceError::from(Fault::encode(format!("the schema of '{name}'"), e)))?
        .with_descriptor(FlightDescriptor::new_path(vec![name.to_string()]))
        .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket)))
        .with_total_records(-1)
        .with_total_bytes(-1))
}

/// The `FlightInfo`s of every catalog table, for ListFlights.
pub fn table_flight_infos() -> ServiceResult<Vec<FlightInfo>> {
    TABLES
        .iter()
        .filter_map(|name| Some((name, table_schema(name)?)))
        .map(|(name, schema)| table_flight_info(name, &schema))
        .collect()
}
