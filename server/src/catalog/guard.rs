//! Bounds a catalog query's work, not only its answer.
//!
//! * Before optimising: the logical plan's expressions may be at most [`MAX_EXPR_DEPTH`]
//!   deep (a 14 KB `1 + 1 + … + 1` kept a worker busy for about a minute in the
//!   optimiser, long after its client had been told it timed out), and every scalar
//!   function is put under the output size check of `capped.rs`.
//! * Before running: every operator of the physical plan is wrapped in a [`GuardExec`]
//!   whose stream stops the query with an error once the deadline has passed or once
//!   that operator has produced more than the row bound. Every operator pulls its input
//!   through such a stream, so even an aggregate folding a huge input inside one poll
//!   checks the deadline at every input batch.

use std::fmt;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arrow_array::RecordBatch;
use arrow_schema::{DataType, SchemaRef};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{BinaryExpr, Expr, LogicalPlan, Operator, cast};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, replace_children_if_necessary,
};
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, Visit, Visitor};
use futures::Stream;

use super::capped::{Capped, StringConcat};

/// Deepest expression tree a catalog query may hold. The catalog's own queries are a few
/// levels deep; a flat chain of `+` or `AND` is as deep as it is long.
pub const MAX_EXPR_DEPTH: usize = 256;

/// Refuses `plan` when one of its expressions (subqueries included) is deeper than `max`.
pub fn check_depth(plan: &LogicalPlan, max: usize) -> Result<()> {
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|expr| {
            if expr_depth(expr) > max {
                return Err(too_deep(max));
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(TreeNodeRecursion::Continue)
    })?;
    Ok(())
}

/// Refuses a parsed statement whose expressions nest deeper than `max`, before the SQL
/// planner, which itself took more than the time bound for 14 KB of `1 + 1 + …`.
pub fn check_statement_depth(statement: &DfStatement, max: usize) -> Result<()> {
    struct Depth {
        now: usize,
        max: usize,
    }
    impl Visitor for Depth {
        type Break = usize;
        fn pre_visit_expr(&mut self, _expr: &SqlExpr) -> ControlFlow<usize> {
            self.now += 1;
            if self.now > self.max {
                ControlFlow::Break(self.now)
            } else {
                ControlFlow::Continue(())
            }
        }
        fn post_visit_expr(&mut self, _expr: &SqlExpr) -> ControlFlow<usize> {
            self.now -= 1;
            ControlFlow::Continue(())
        }
    }
    let DfStatement::Statement(statement) = statement else {
        return Ok(());
    };
    let mut depth = Depth { now: 0, max };
    if let ControlFlow::Break(_) = statement.visit(&mut depth) {
        return Err(too_deep(max));
    }
    Ok(())
}

fn too_deep(max: usize) -> DataFusionError {
    DataFusionError::Plan(format!(
        "an expression of the query is more than {max} levels deep, more than a catalog \
         query may have; write it shorter"
    ))
}

fn expr_depth(expr: &Expr) -> usize {
    let mut deepest = 0;
    let _ = expr.apply_children(|child| {
        deepest = deepest.max(expr_depth(child));
        Ok(TreeNodeRecursion::Continue)
    });
    deepest + 1
}

/// The longest list a literal or a function call of `plan` could build from its own
/// arguments (`make_array(1, …, 10)`, `[1, 2, 3]`), for the bound of `unnest`.
pub fn max_literal_list_len(plan: &LogicalPlan) -> u64 {
    let mut longest = 0u64;
    let _ = plan.apply_with_subqueries(|node| {
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                match e {
                    Expr::ScalarFunction(f) => longest = longest.max(f.args.len() as u64),
                    Expr::Literal(ScalarValue::List(list), _) => {
                        longest = longest.max(list.values().len() as u64)
                    }
                    _ => {}
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })?;
        Ok(TreeNodeRecursion::Continue)
    });
    longest
}

/// Puts every scalar function of `plan` (subqueries included) under the size check of
/// `capped.rs`, including those the SQL planner builds itself (`[a, b]` is `make_array`,
/// `l1 || l2` on lists is `array_concat`), and turns `a || b` on strings (a binary
/// operator in DataFusion, with no bound on its output) into the checked
/// `string_concat(CAST(a AS VARCHAR), CAST(b AS VARCHAR))`. Column names stay.
pub fn cap_functions(plan: LogicalPlan) -> Result<LogicalPlan> {
    let string_concat = Arc::new(StringConcat::udf());
    plan.transform_up_with_subqueries(|node| {
        let names = NamePreserver::new(&node);
        let node = node.map_expressions(|expr| {
            let saved = names.save(&expr);
            let rewritten = expr.transform_up(|e| match e {
                Expr::BinaryExpr(BinaryExpr {
                    left,
                    op: Operator::StringConcat,
                    right,
                }) => Ok(Transformed::yes(string_concat.call(vec![
                    cast(*left, DataType::Utf8),
                    cast(*right, DataType::Utf8),
                ]))),
                Expr::ScalarFunction(ScalarFunction { func, args }) => {
                    let func = Arc::new(Capped::wrap(func.as_ref().clone()));
                    Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction {
                        func,
                        args,
                    })))
                }
                other => Ok(Transformed::no(other)),
            })?;
            Ok(rewritten.update_data(|e| saved.restore(e)))
        })?;
        if node.transformed {
            node.map_data(|plan| plan.recompute_schema())
        } else {
            Ok(node)
        }
    })
    .map(|t| t.data)
}

/// What every operator of one query is held to.
#[derive(Debug)]
pub struct Budget {
    /// When the query must have ended.
    pub deadline: Instant,
    /// The query's time bound (for the message).
    pub timeout: Duration,
    /// Most rows one operator may produce.
    pub max_rows: u64,
}

/// Wraps every operator of `plan` in a [`GuardExec`] held to `budget`.
pub fn guard_plan(
    plan: Arc<dyn ExecutionPlan>,
    budget: &Arc<Budget>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let children = plan
        .children()
        .into_iter()
        .map(|child| guard_plan(child.clone(), budget))
        .collect::<Result<Vec<_>>>()?;
    let plan = if children.is_empty() {
        plan
    } else {
        replace_children_if_necessary(plan, children)?
    };
    Ok(Arc::new(GuardExec {
        input: plan,
        budget: budget.clone(),
    }))
}

/// An operator that passes its input's batches through, failing once the deadline has
/// passed or its input has produced more rows than allowed.
#[derive(Debug)]
pub struct GuardExec {
    input: Arc<dyn ExecutionPlan>,
    budget: Arc<Budget>,
}

impl DisplayAs for GuardExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "GuardExec")
    }
}

impl ExecutionPlan for GuardExec {
    fn name(&self) -> &str {
        "GuardExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(
                "GuardExec has one child".to_string(),
            ));
        }
        Ok(Arc::new(GuardExec {
            input: children.swap_remove(0),
            budget: self.budget.clone(),
        }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Ok(Box::pin(GuardStream {
            input: self.input.execute(partition, context)?,
            budget: self.budget.clone(),
            rows: 0,
        }))
    }
}

struct GuardStream {
    input: SendableRecordBatchStream,
    budget: Arc<Budget>,
    rows: u64,
}

impl Stream for GuardStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if Instant::now() > self.budget.deadline {
            return Poll::Ready(Some(Err(DataFusionError::ResourcesExhausted(format!(
                "query ran longer than {:?} and was stopped; narrow it with WHERE or LIMIT",
                self.budget.timeout
            )))));
        }
        let polled = Pin::new(&mut self.input).poll_next(cx);
        if let Poll::Ready(Some(Ok(batch))) = &polled {
            self.rows = self.rows.saturating_add(batch.num_rows() as u64);
            if self.rows > self.budget.max_rows {
                return Poll::Ready(Some(Err(DataFusionError::ResourcesExhausted(format!(
                    "a step of the query produced more than {} rows and was stopped; \
                     narrow it with WHERE (join on equal columns) or LIMIT",
                    self.budget.max_rows
                )))));
            }
        }
        polled
    }
}

impl RecordBatchStream for GuardStream {
    fn schema(&self) -> SchemaRef {
        self.input.schema()
    }
}
