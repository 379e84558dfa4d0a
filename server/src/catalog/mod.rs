//! The SQL catalog: `DoGet(TensorTicket{catalog_query{sql}})` runs a SELECT over the
//! `sources`, `tensors` and `rois` tables with DataFusion and streams the result back.
//!
//! ```text
//!  registry ──Snapshot::of──▶ Snapshot ──tables──▶ sources, tensors (MemTables)
//!  annotation store ─────────────────────rois.rs──▶ rois (read page by page when scanned)
//!                                                        │
//!  sql ──▶ locked-down SessionContext (session.rs) ──▶ plan + LIMIT max_rows+1
//!                                                        │ stream, stop at the bounds
//!                                                        ▼
//!                         QueryAnswer{schema + returned_rows/total_rows/truncated, batches}
//! ```
//!
//! The tables are built from the registry at query time, so they always show
//! what is served now. Every query is bounded: SQL text length, result rows and
//! bytes (the answer is then cut and says `truncated = "True"`), wall time, and
//! DataFusion memory. Anything but a query (DDL, DML, `COPY`, `SET`, file or URL
//! table functions, tables outside the catalog) is refused with the reason.

mod capped;
mod guard;
mod len;
mod regexp;
mod rois;
mod session;
pub mod tables;
pub mod tree;
mod worker;

use std::sync::Arc;
use std::time::Duration;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use datafusion::common::DataFusionError;
use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool};
use tokio::sync::Semaphore;

pub use tables::{Snapshot, table_schema};

/// Bounds on one catalog query.
#[derive(Clone, Debug)]
pub struct CatalogLimits {
    /// Longest SQL text accepted, in bytes.
    pub max_sql_bytes: usize,
    /// Most rows an answer carries; more are cut and the answer says `truncated`.
    pub max_rows: usize,
    /// Most bytes (Arrow memory size) an answer carries; cut likewise.
    pub max_bytes: usize,
    /// Longest a query may plan and run before it is abandoned.
    pub timeout: Duration,
    /// Memory DataFusion may use for all concurrent catalog queries together.
    pub memory_bytes: usize,
    /// How many queries run at once (each on its own thread); more wait their turn.
    pub workers: usize,
    /// Most rows a join (any kind: a 1:1 join is not proven), an `unnest` or any other
    /// step of a plan may produce: estimated before the plan runs (refused at once, so it
    /// holds no worker) and counted while it runs (stopped there).
    pub max_join_rows: u64,
}

impl Default for CatalogLimits {
    fn default() -> Self {
        Self {
            max_sql_bytes: 16 << 10,
            max_rows: 100_000,
            max_bytes: 64 << 20,
            timeout: Duration::from_secs(10),
            memory_bytes: 256 << 20,
            workers: 2,
            max_join_rows: 10_000_000,
        }
    }
}

/// Why a catalog query produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The SQL text is longer than [`CatalogLimits::max_sql_bytes`].
    #[error("SQL text is {len} bytes, more than the {max} bytes a catalog query may have")]
    TooLong {
        /// Length of the text sent.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The query did not finish within [`CatalogLimits::timeout`].
    #[error("query ran longer than {0:?} and was stopped; narrow it with WHERE or LIMIT")]
    TimedOut(Duration),
    /// The plan multiplies tables into more rows than [`CatalogLimits::max_join_rows`]
    /// (a cross product or a join without an equality), refused before it runs.
    #[error(
        "the query would combine tables into about {estimated} rows, more than the \
         {max} a catalog query may; narrow it with WHERE (join on equal columns) or LIMIT"
    )]
    TooExpensive {
        /// Estimated rows of the largest cross product in the plan.
        estimated: u128,
        /// The limit.
        max: u64,
    },
    /// Every worker stayed busy for the whole [`CatalogLimits::timeout`].
    #[error("the catalog stayed busy for {0:?} with other queries; try again")]
    Busy(Duration),
    /// A worker thread could not start or ended without an answer.
    #[error(transparent)]
    Worker(#[from] WorkerError),
    /// DataFusion refused the SQL (parse, planning, DDL/DML, unknown table or
    /// function) or failed while running it.
    #[error("{0}")]
    Engine(#[from] DataFusionError),
}

/// Why a catalog worker gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// Its thread could not start.
    #[error("starting a catalog worker: {0}")]
    Thread(#[source] std::io::Error),
    /// Its runtime could not start.
    #[error("starting a catalog runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The pool of workers is closed (the server is stopping).
    #[error("no catalog worker: {0}")]
    Closed(#[source] tokio::sync::AcquireError),
    /// The worker ended without sending its answer.
    #[error("the catalog worker stopped without an answer")]
    Stopped,
}

/// The result of one catalog query, bounded, ready to stream.
#[derive(Debug)]
pub struct QueryAnswer {
    /// The result schema, with `returned_rows`, `truncated` and (when the result
    /// is complete) `total_rows` in its metadata.
    pub schema: SchemaRef,
    /// The rows, at most [`CatalogLimits::max_rows`].
    pub batches: Vec<RecordBatch>,
    /// How many rows `batches` hold.
    pub returned_rows: usize,
    /// Whether rows were cut by a bound.
    pub truncated: bool,
}

impl QueryAnswer {
    /// Bytes the answer's batches hold (Arrow memory), what it pins until it is sent.
    pub fn bytes(&self) -> u64 {
        self.batches
            .iter()
            .map(|b| b.get_array_memory_size() as u64)
            .sum()
    }
}

/// The SQL catalog engine: limits, the memory pool all queries share, and the
/// permits of its worker threads.
#[derive(Debug)]
pub struct Catalog {
    limits: CatalogLimits,
    memory: Arc<dyn MemoryPool>,
    workers: Arc<Semaphore>,
}

impl Catalog {
    /// A catalog with `limits`.
    pub fn new(limits: CatalogLimits) -> Catalog {
        let memory = Arc::new(GreedyMemoryPool::new(limits.memory_bytes));
        let workers = Arc::new(Semaphore::new(limits.workers.max(1)));
        Catalog {
            limits,
            memory,
            workers,
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> &CatalogLimits {
        &self.limits
    }

    /// Runs `sql` over the catalog tables of `snapshot`, within the limits, on a
    /// worker thread of its own (see `worker.rs`).
    pub async fn query(&self, snapshot: &Snapshot, sql: &str) -> Result<QueryAnswer, CatalogError> {
        if sql.len() > self.limits.max_sql_bytes {
            return Err(CatalogError::TooLong {
                len: sql.len(),
                max: self.limits.max_sql_bytes,
            });
        }
        let permit =
            tokio::time::timeout(self.limits.timeout, self.workers.clone().acquire_owned())
                .await
                .map_err(|_elapsed| CatalogError::Busy(self.limits.timeout))?
                .map_err(WorkerError::Closed)?;
        let job = worker::Job {
            snapshot: snapshot.clone(),
            sql: sql.to_string(),
            limits: self.limits.clone(),
            memory: self.memory.clone(),
        };
        // The worker bounds its own time too, but only where the engine yields; this bound
        // answers the client on time whatever the worker does (it ends on its own).
        let answer = tokio::time::timeout(self.limits.timeout, worker::spawn(job, permit)?)
            .await
            .map_err(|_elapsed| CatalogError::TimedOut(self.limits.timeout))?
            .map_err(|_dropped| WorkerError::Stopped)??;
        // Debug, not info: clients (the biopb client's own lookups included) query the
        // catalog on every `ls` and describe, which would flood an operator's log.
        tracing::debug!(
            sql,
            returned_rows = answer.returned_rows,
            truncated = answer.truncated,
            "catalog query answered"
        );
        Ok(answer)
    }
}
