//! One catalog query on a thread of its own.
//!
//! Untrusted SQL can build very deep expression trees (`1 + 1 + … + 1` parses
//! without recursion but is planned, printed, compared and dropped recursively),
//! and overflowing a stack aborts the whole process. So every query is planned,
//! run and dropped on a dedicated thread with a large stack ([`STACK_BYTES`],
//! ample for the longest SQL text accepted), driven by a current-thread runtime
//! that enforces the time bound. This also keeps heavy queries off the Flight
//! service's runtime workers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use arrow_schema::Schema;
use datafusion::common::DataFusionError;
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::physical_plan::{ExecutionPlan, execute_stream};
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use super::{CatalogError, CatalogLimits, QueryAnswer, Snapshot, WorkerError, guard, session};

/// Stack of a catalog worker thread. Only the pages a query touches are used.
const STACK_BYTES: usize = 64 << 20;

/// Everything one query needs, owned so it can move to its thread.
pub(super) struct Job {
    /// The registry as the tables show it.
    pub snapshot: Snapshot,
    /// The SQL text.
    pub sql: String,
    /// The bounds.
    pub limits: CatalogLimits,
    /// The catalog's shared memory pool.
    pub memory: Arc<dyn MemoryPool>,
}

/// The answer of a worker, delivered once.
type AnswerRx = oneshot::Receiver<Result<QueryAnswer, CatalogError>>;

/// Starts `job` on a new worker thread that holds `permit` until it ends.
pub(super) fn spawn(job: Job, permit: OwnedSemaphorePermit) -> Result<AnswerRx, CatalogError> {
    let (answer_tx, answer_rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("tessera-catalog".to_string())
        .stack_size(STACK_BYTES)
        .spawn(move || {
            let answer = job.run();
            drop(permit);
            // If the caller went away (the client cancelled), the answer is dropped.
            let _ = answer_tx.send(answer);
        })
        .map_err(WorkerError::Thread)?;
    Ok(answer_rx)
}

impl Job {
    /// Runs the query to completion or to its time bound.
    fn run(self) -> Result<QueryAnswer, CatalogError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(WorkerError::Runtime)?;
        let timeout = self.limits.timeout;
        runtime.block_on(async {
            match tokio::time::timeout(timeout, self.execute()).await {
                Ok(answer) => answer,
                Err(_elapsed) => Err(CatalogError::TimedOut(timeout)),
            }
        })
    }

    async fn execute(&self) -> Result<QueryAnswer, CatalogError> {
        let limits = &self.limits;
        let started = Instant::now();
        let runtime = session::runtime(self.memory.clone())?;
        let ctx = session::context(&runtime, &self.snapshot)?;
        let state = ctx.state();
        let dialect = state.config().options().sql_parser.dialect;
        let statement = state.sql_to_statement(&self.sql, &dialect)?;
        // Refused by its size before the SQL planner and the optimiser, whose passes over a
        // deep tree took a minute for 14 KB of `1 + 1 + …`.
        guard::check_statement_depth(&statement, guard::MAX_EXPR_DEPTH)?;
        let plan = state.statement_to_plan(statement).await?;
        session::sql_options().verify_plan(&plan)?;
        // Refused by its size before the optimiser, whose passes over a deep tree took a
        // minute for 14 KB of `1 + 1 + …`.
        guard::check_depth(&plan, guard::MAX_EXPR_DEPTH)?;
        let list_len = guard::max_literal_list_len(&plan).max(self.snapshot.max_list_len());
        let plan = guard::cap_functions(plan)?;
        let frame = ctx.execute_logical_plan(plan).await?;
        // One row past the bound tells a complete answer from a cut one; the limit
        // is pushed into the plan, so a huge join stops producing early.
        let frame = frame.limit(0, Some(limits.max_rows.saturating_add(1)))?;
        let task = Arc::new(frame.task_ctx());
        let plan = frame.create_physical_plan().await?;
        let bounds = Bounds {
            leaf_rows: self.snapshot.max_table_rows(),
            list_len,
            max: limits.max_join_rows,
        };
        bound_rows(&plan, &bounds)?;
        // Every operator stops at the deadline (checked at each batch it pulls) and at the
        // row bound, so a query the estimate let through still ends on time.
        let budget = Arc::new(guard::Budget {
            deadline: started + limits.timeout,
            timeout: limits.timeout,
            max_rows: limits.max_join_rows,
        });
        let plan = guard::guard_plan(plan, &budget)?;
        let mut stream = execute_stream(plan, task)?;
        let schema = stream.schema();

        let mut batches = Vec::new();
        let (mut rows, mut bytes, mut truncated) = (0usize, 0usize, false);
        while let Some(batch) = stream.next().await {
            // An operator stopped at the deadline reports it as its own error: the caller
            // sees the same timeout whichever check fired first.
            let batch = match batch {
                Ok(batch) => batch,
                Err(_) if Instant::now() > budget.deadline => {
                    return Err(CatalogError::TimedOut(limits.timeout));
                }
                Err(e) => return Err(e.into()),
            };
            if Instant::now() > budget.deadline {
                return Err(CatalogError::TimedOut(limits.timeout));
            }
            let size = batch.get_array_memory_size();
            let mut keep = batch.num_rows().min(limits.max_rows - rows);
            let room_bytes = limits.max_bytes.saturating_sub(bytes);
            if size > room_bytes {
                // Cut in proportion to the bytes left (sizes of slices are not exact).
                let fit = batch.num_rows() as u128 * room_bytes as u128 / size.max(1) as u128;
                keep = keep.min(usize::try_from(fit).unwrap_or(usize::MAX));
            }
            truncated = keep < batch.num_rows();
            if keep > 0 {
                batches.push(batch.slice(0, keep));
                rows += keep;
                bytes += size;
            }
            if truncated {
                break;
            }
        }
        drop(stream);

        let mut metadata = HashMap::from([
            ("returned_rows".to_string(), rows.to_string()),
            (
                "truncated".to_string(),
                if truncated { "True" } else { "False" }.to_string(),
            ),
        ]);
        if !truncated {
            metadata.insert("total_rows".to_string(), rows.to_string());
        }
        let schema = Arc::new(Schema::new_with_metadata(schema.fields().clone(), metadata));
        let batches = batches
            .into_iter()
            .map(|batch| batch.with_schema(schema.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(DataFusionError::from)?;
        Ok(QueryAnswer {
            schema,
            batches,
            returned_rows: rows,
            truncated,
        })
    }
}

/// What [`bound_rows`] assumes of a query's inputs.
struct Bounds {
    /// Rows of the largest catalog table: what one scan produces at most.
    leaf_rows: u64,
    /// Longest list one `unnest` may spread into rows: the longest list of the tables or
    /// built by a literal or function call of the query.
    list_len: u64,
    /// The refusal threshold ([`CatalogLimits::max_join_rows`]).
    max: u64,
}

/// Upper bound of the rows `plan` produces, refusing it when a step may produce more than
/// `bounds.max` rows. Joins count as the product of their inputs whatever their condition
/// (an equality on a non-unique column multiplies rows as a cross join does; a 1:1 join
/// is not proven), `unnest` as its input times the longest list. The deadline stops such
/// work too (every operator is guarded, `guard.rs`), but only after it has held a worker
/// for the whole time bound: refusing it at once keeps the worker for other clients. A leaf
/// produces at most `bounds.leaf_rows` rows; other operators at most what their inputs do.
fn bound_rows(plan: &Arc<dyn ExecutionPlan>, bounds: &Bounds) -> Result<u128, CatalogError> {
    let children = plan.children();
    if children.is_empty() {
        return Ok(u128::from(bounds.leaf_rows.max(1)));
    }
    let inputs = children
        .into_iter()
        .map(|child| bound_rows(child, bounds))
        .collect::<Result<Vec<u128>, _>>()?;
    let estimated = match plan.name() {
        "CrossJoinExec"
        | "NestedLoopJoinExec"
        | "HashJoinExec"
        | "SortMergeJoinExec"
        | "SymmetricHashJoinExec"
        | "PiecewiseMergeJoinExec" => inputs.iter().fold(1u128, |acc, n| acc.saturating_mul(*n)),
        "UnnestExec" => inputs
            .iter()
            .max()
            .copied()
            .unwrap_or(1)
            .saturating_mul(u128::from(bounds.list_len.max(1))),
        "UnionExec" | "InterleaveExec" => inputs.iter().sum(),
        _ => inputs.into_iter().max().unwrap_or(1),
    };
    if estimated > u128::from(bounds.max) {
        return Err(CatalogError::TooExpensive {
            estimated,
            max: bounds.max,
        });
    }
    Ok(estimated)
}
