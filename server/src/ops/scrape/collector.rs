//! The figures read from the service state at scrape time, as a `prometheus-client`
//! [`Collector`]: the chunk cache's counters and fill, the bytes held by unread replies,
//! the sources served and the state of their scans.

use std::fmt;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use tessera_proto::json::CacheBackend;

use crate::state::ServiceState;

/// Reads the service state on every scrape (register it with a
/// [`prometheus_client::registry::Registry`]).
pub struct StateCollector {
    state: Arc<ServiceState>,
}

impl StateCollector {
    /// A collector over `state`.
    pub fn new(state: Arc<ServiceState>) -> Self {
        Self { state }
    }
}

impl fmt::Debug for StateCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateCollector").finish_non_exhaustive()
    }
}

/// One counter (`_total` is appended by the encoder).
fn counter(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

/// One gauge without labels.
fn gauge<N: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: N,
) -> fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let state = &self.state;
        let stats = state.chunks().stats();
        let backend = match stats.backend {
            CacheBackend::File => "file",
            CacheBackend::Memory => "memory",
        };
        let info = ConstGauge::new(1i64);
        let mut family = encoder.encode_descriptor(
            "tessera_cache_info",
            "The chunk cache backend in use.",
            None,
            info.metric_type(),
        )?;
        info.encode(family.encode_family(&[("backend", backend)])?)?;
        for (name, help, value) in [
            ("hits", "Cache lookups that found the chunk.", stats.hits),
            ("misses", "Cache lookups that did not.", stats.misses),
            (
                "evictions",
                "Chunks evicted to stay in budget.",
                stats.evictions,
            ),
            (
                "pending_waits",
                "Callers that waited for another caller's decode of the same chunk.",
                stats.pending_waits,
            ),
            (
                "locates",
                "Chunks handed out by chunk_locate.",
                stats.locates,
            ),
            ("do_gets", "Chunks requested over do_get.", stats.do_gets),
            (
                "budget_waits",
                "Cache appends that waited for eviction (cache over budget by a segment).",
                stats.budget_waits,
            ),
            (
                "budget_overruns",
                "Cache appends admitted over budget because eviction stalled.",
                stats.budget_overruns,
            ),
            (
                "read_aheads",
                "Chunks queued for decoding ahead of a sequential reader.",
                stats.read_aheads,
            ),
            (
                "recuts",
                "Chunks written from cached chunks of the tensor's other grid, not the source.",
                stats.recuts,
            ),
            (
                "write_failures",
                "Cache appends that failed (the chunk was served from memory).",
                stats.write_failures,
            ),
            (
                "disk_full",
                "Cache appends that failed because the filesystem was full.",
                stats.disk_full_events,
            ),
        ] {
            counter(&mut encoder, &format!("tessera_cache_{name}"), help, value)?;
        }
        gauge(
            &mut encoder,
            "tessera_cache_writes_paused",
            "1 while cache appends are paused after failures (chunks served from memory).",
            i64::from(stats.writes_paused.is_some()),
        )?;
        if let Some(ceiling) = stats.disk_ceiling_bytes {
            gauge(
                &mut encoder,
                "tessera_cache_disk_ceiling_bytes",
                "Bytes the cache evicts down to while its filesystem is full.",
                ceiling,
            )?;
        }
        let unread = state.unread().stats();
        gauge(
            &mut encoder,
            "tessera_pinned_bytes",
            "Bytes of chunk replies their peers have not read yet.",
            unread.held_bytes,
        )?;
        counter(
            &mut encoder,
            "tessera_stalled_connections_closed",
            "Connections closed because their unread replies stalled.",
            unread.closed_connections,
        )?;
        gauge(
            &mut encoder,
            "tessera_cache_bytes",
            "Bytes held by the cache.",
            stats.total_bytes,
        )?;
        gauge(
            &mut encoder,
            "tessera_cache_max_bytes",
            "Cache budget in bytes.",
            stats.max_bytes,
        )?;
        gauge(
            &mut encoder,
            "tessera_cache_entries",
            "Chunks held by the cache.",
            stats.total_entries,
        )?;
        gauge(
            &mut encoder,
            "tessera_sources",
            "Sources served.",
            state.source_count(),
        )?;
        let scan = state.scan_status();
        gauge(
            &mut encoder,
            "tessera_full_scan_in_progress",
            "1 while the sources are being rescanned.",
            i64::from(scan.in_progress()),
        )?;
        if let Some(at) = scan.last_finished_at() {
            gauge(
                &mut encoder,
                "tessera_last_full_scan_finished_timestamp_seconds",
                "Unix time the last full scan of the sources finished.",
                at,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use prometheus_client::registry::Registry;

    use super::*;

    fn state() -> Arc<ServiceState> {
        super::super::test_state(&crate::metrics::Metrics::new())
    }

    fn text(state: &Arc<ServiceState>) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(StateCollector::new(state.clone())));
        let mut out = String::new();
        crate::metrics::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn state_figures_keep_their_names_types_and_help() {
        let state = state();
        let out = text(&state);
        for line in [
            "# HELP tessera_cache_info The chunk cache backend in use.\n",
            "# TYPE tessera_cache_info gauge\n",
            "tessera_cache_info{backend=\"memory\"} 1\n",
            "# HELP tessera_cache_hits_total Cache lookups that found the chunk.\n",
            "# TYPE tessera_cache_hits_total counter\n",
            "tessera_cache_hits_total 0\n",
            "# TYPE tessera_cache_disk_full_total counter\n",
            "# TYPE tessera_stalled_connections_closed_total counter\n",
            "tessera_stalled_connections_closed_total 0\n",
            "# TYPE tessera_pinned_bytes gauge\n",
            "tessera_pinned_bytes 0\n",
            "tessera_cache_writes_paused 0\n",
            "tessera_cache_max_bytes 1048576\n",
            "# TYPE tessera_sources gauge\n",
            "tessera_sources 0\n",
            "tessera_full_scan_in_progress 0\n",
        ] {
            assert!(out.contains(line), "{line:?} missing from:\n{out}");
        }
        // Absent until known.
        assert!(!out.contains("tessera_last_full_scan_finished_timestamp_seconds"));
        assert!(!out.contains("tessera_cache_disk_ceiling_bytes"));
    }

    #[test]
    fn scan_state_is_read_at_scrape_time() {
        let state = state();
        state.scan_status().begin();
        assert!(text(&state).contains("tessera_full_scan_in_progress 1\n"));
        state.scan_status().finish();
        let out = text(&state);
        assert!(out.contains("tessera_full_scan_in_progress 0\n"), "{out}");
        let at: f64 = out
            .lines()
            .find_map(|l| l.strip_prefix("tessera_last_full_scan_finished_timestamp_seconds "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(at > 1.6e9, "{out}");
    }
}
