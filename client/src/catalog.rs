//! The catalog's `sources` table, read with a catalog query (DoGet of
//! `TensorTicket{catalog_query{sql}}`): what a server refused to serve, and why.

use arrow_array::{Array, RecordBatch, StringArray, StringViewArray};
use arrow_flight::Ticket;
use arrow_flight::decode::FlightRecordBatchStream;
use futures::TryStreamExt;
use tessera_proto::ticket::catalog_ticket;

use crate::client::Client;
use crate::error::ClientError;

/// The query behind [`Client::refused_sources`].
const REFUSED_SQL: &str = "SELECT source_id, source_url, unresolved_reason FROM sources \
                           WHERE NOT is_resolved ORDER BY source_id";

/// A source file the server found but does not serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedSource {
    /// The id it would have had.
    pub source_id: String,
    /// Its `file://` URL.
    pub source_url: String,
    /// Why it is not served.
    pub reason: String,
}

impl Client {
    /// Runs a catalog SQL query and returns its batches.
    pub async fn query(&self, sql: &str) -> Result<Vec<RecordBatch>, ClientError> {
        let call = || format!("catalog query '{sql}'");
        let ticket = Ticket {
            ticket: catalog_ticket(sql).into(),
        };
        let messages: Vec<_> = self
            .flight()
            .do_get(self.request(ticket))
            .await
            .map_err(|s| ClientError::rpc(call(), s))?
            .into_inner()
            .try_collect()
            .await
            .map_err(|s| ClientError::rpc(call(), s))?;
        FlightRecordBatchStream::new_from_flight_data(futures::stream::iter(
            messages.into_iter().map(Ok),
        ))
        .try_collect()
        .await
        .map_err(|e| ClientError::ActionReply {
            action: call(),
            reason: e.to_string(),
        })
    }

    /// The source files the server refused (the `sources` rows with `is_resolved` false),
    /// with their reasons, ordered by id.
    pub async fn refused_sources(&self) -> Result<Vec<RefusedSource>, ClientError> {
        let mut refused = Vec::new();
        for batch in self.query(REFUSED_SQL).await? {
            let column = |i: usize| text_column(&batch, i);
            let (ids, urls, reasons) = (column(0)?, column(1)?, column(2)?);
            for row in 0..batch.num_rows() {
                refused.push(RefusedSource {
                    source_id: ids[row].clone(),
                    source_url: urls[row].clone(),
                    reason: reasons[row].clone(),
                });
            }
        }
        Ok(refused)
    }
}

/// Column `i` of `batch` as strings (Utf8 or Utf8View; nulls become empty).
fn text_column(batch: &RecordBatch, i: usize) -> Result<Vec<String>, ClientError> {
    let bad = |reason: String| ClientError::ActionReply {
        action: "catalog query of refused sources".to_string(),
        reason,
    };
    let column = batch
        .columns()
        .get(i)
        .ok_or_else(|| bad(format!("the answer has no column {i}")))?;
    let any = column.as_any();
    let text = |value: Option<&str>| value.unwrap_or_default().to_string();
    if let Some(array) = any.downcast_ref::<StringArray>() {
        Ok(array.iter().map(text).collect())
    } else if let Some(array) = any.downcast_ref::<StringViewArray>() {
        Ok(array.iter().map(text).collect())
    } else {
        Err(bad(format!(
            "column {i} is {}, not text",
            column.data_type()
        )))
    }
}
