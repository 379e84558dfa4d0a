//! A DataFusion session that can see the catalog tables and nothing else.
//!
//! Locked down by construction rather than by filtering SQL text:
//! * no table functions (`read_parquet`, `read_csv`, `generate_series`, …), no file
//!   formats, no table factories (so no `CREATE EXTERNAL TABLE` target), no URL
//!   tables (`SELECT * FROM '/etc/passwd'`); `information_schema` describes the catalog's
//!   own tables (`SHOW TABLES`, `SHOW COLUMNS FROM tensors`, docs/decisions/0002);
//! * an object store registry that holds no store and refuses every URL, so even a
//!   path we did not think of cannot reach a file system;
//! * no disk manager (nothing spills to temporary files) and a shared memory pool;
//! * [`SQLOptions`] refuse DDL, DML (`INSERT`, `COPY`) and statements (`SET`, …)
//!   before anything is planned for execution.

use std::sync::Arc;

use datafusion::catalog::MemTable;
use datafusion::common::config::Dialect;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::SessionStateDefaults;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::execution::object_store::ObjectStoreRegistry;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::object_store::ObjectStore;
use datafusion::prelude::{SQLOptions, SessionConfig, SessionContext};

use super::len::ListLen;
use super::regexp::RegexpExtract;
use super::tables::{self, Snapshot};

/// Scalar functions left out of the catalog: lists whose length is set by an argument
/// (`SELECT range(1e10)` would be 80 GB). The other functions that size their output
/// from an argument (`repeat`, `lpad`, `array_repeat`, …) are checked against a cap
/// before they run (`capped.rs`, applied to each plan by `guard::cap_functions`).
const UNBOUNDED_OUTPUT: [&str; 2] = ["range", "generate_series"];

/// The runtime of one catalog query: the catalog's shared memory pool, no
/// spilling, no object stores.
pub fn runtime(memory: Arc<dyn MemoryPool>) -> Result<Arc<RuntimeEnv>> {
    RuntimeEnvBuilder::new()
        .with_memory_pool(memory)
        .with_disk_manager_builder(
            DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled),
        )
        .with_object_store_registry(Arc::new(NoObjectStores))
        .build_arc()
}

/// What user SQL may be: queries only.
pub fn sql_options() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

/// A fresh session over `snapshot`: the `sources` and `tensors` tables, the built-in
/// scalar, aggregate and window functions, and DuckDB's `len` and `regexp_extract`.
pub fn context(runtime: &Arc<RuntimeEnv>, snapshot: &Snapshot) -> Result<SessionContext> {
    let mut config = SessionConfig::new()
        .with_target_partitions(1)
        .with_information_schema(true);
    let options = config.options_mut();
    // The reference server runs DuckDB and its clients write DuckDB SQL.
    options.sql_parser.dialect = Dialect::DuckDB;
    // Plain Utf8 results for `CAST(… AS VARCHAR)`: every Arrow reader knows it.
    options.sql_parser.map_string_types_to_utf8view = false;

    let mut scalar = SessionStateDefaults::default_scalar_functions();
    scalar.retain(|f| !UNBOUNDED_OUTPUT.contains(&f.name()));
    scalar.push(Arc::new(ListLen::udf()));
    scalar.push(Arc::new(RegexpExtract::udf()));
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime.clone())
        .with_expr_planners(SessionStateDefaults::default_expr_planners())
        .with_scalar_functions(scalar)
        .with_aggregate_functions(SessionStateDefaults::default_aggregate_functions())
        .with_window_functions(SessionStateDefaults::default_window_functions())
        .build();
    let ctx = SessionContext::new_with_state(state);

    for (name, batch) in [
        (tables::SOURCES, tables::sources_batch(snapshot)?),
        (tables::TENSORS, tables::tensors_batch(snapshot)?),
    ] {
        let table = MemTable::try_new(batch.schema(), vec![vec![batch]])?;
        ctx.register_table(name, Arc::new(table))?;
    }
    // Annotations are many and large: read from their store only while a query scans them.
    let rois = super::rois::table(snapshot.rois().cloned())?;
    ctx.register_table(tables::ROIS, Arc::new(rois))?;
    Ok(ctx)
}

/// An object store registry with no stores that refuses every URL.
#[derive(Debug)]
struct NoObjectStores;

impl ObjectStoreRegistry for NoObjectStores {
    fn register_store(
        &self,
        _url: &url::Url,
        _store: Arc<dyn ObjectStore>,
    ) -> Option<Arc<dyn ObjectStore>> {
        None
    }

    fn get_store(&self, url: &url::Url) -> Result<Arc<dyn ObjectStore>> {
        Err(DataFusionError::Plan(format!(
            "the catalog reads no files or URLs ('{url}' refused)"
        )))
    }
}
