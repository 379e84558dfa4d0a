//! The `rois` table: the annotation store read page by page while a query scans it.
//!
//! The table is a DataFusion [`StreamingTable`] of one partition whose stream reads the
//! next [`PAGE_BYTES`] of stored annotations from redb (a read transaction per page), turns
//! them into one batch and reserves that batch in the catalog's memory pool before handing
//! it on. Nothing is read for a query that does not scan the table (`SELECT 'rois'`), a scan
//! holds about one page at a time whatever the store holds, and every page passes the
//! query's deadline check (the plan's operators are guarded, `guard.rs`). Before this, any
//! SQL whose text contained "rois" loaded every annotation into a table first, outside the
//! pool: a `count(*)` over 1.2 GB of annotations peaked at 4.1 GiB.

use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;

use super::tables;
use crate::rois::Annotations;

/// Stored bytes of annotations one page (one batch) of a scan reads.
pub const PAGE_BYTES: usize = 4 << 20;
/// Most annotations one page of a scan reads.
pub const PAGE_ROWS: usize = 8192;

/// The `rois` table over `annotations` (`None`: an empty table).
pub fn table(annotations: Option<Arc<Annotations>>) -> Result<StreamingTable> {
    let partition = RoisPartition {
        schema: tables::rois_schema(),
        annotations,
    };
    StreamingTable::try_new(tables::rois_schema(), vec![Arc::new(partition)])
}

/// The one partition of the `rois` table.
#[derive(Debug)]
struct RoisPartition {
    schema: SchemaRef,
    annotations: Option<Arc<Annotations>>,
}

impl PartitionStream for RoisPartition {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let scan = Scan {
            annotations: self.annotations.clone(),
            after: None,
            reservation: MemoryConsumer::new("rois table scan").register(ctx.memory_pool()),
        };
        let pages = futures::stream::try_unfold(scan, |mut scan| async move {
            Ok(scan.next_page()?.map(|batch| (batch, scan)))
        });
        Box::pin(RecordBatchStreamAdapter::new(self.schema.clone(), pages))
    }
}

/// Where a scan is: the key of the last annotation read, and the pool's reservation of the
/// batch handed on last.
struct Scan {
    annotations: Option<Arc<Annotations>>,
    after: Option<(String, String)>,
    reservation: MemoryReservation,
}

impl Scan {
    /// The next page as a batch, reserved in the pool (`None`: the scan is done). The read
    /// is blocking: it runs on the query's own worker thread.
    fn next_page(&mut self) -> Result<Option<RecordBatch>> {
        let Some(annotations) = &self.annotations else {
            return Ok(None);
        };
        let page = annotations
            .page(self.after.as_ref(), PAGE_ROWS, PAGE_BYTES)
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        let Some((tensor, id, _)) = page.last() else {
            self.annotations = None;
            self.reservation.free();
            return Ok(None);
        };
        self.after = Some((tensor.clone(), id.clone()));
        let batch = tables::rois_batch(&page)?;
        drop(page);
        self.reservation.try_resize(batch.get_array_memory_size())?;
        Ok(Some(batch))
    }
}
