//! `tessera config check`: the effective configuration, printed as a config file.
//!
//! The output uses the config file's own keys, so it can be saved and served as
//! is, except for the token, which is never printed.

use tessera_proto::units::{format_duration, format_size};
use toml::{Table, Value};

use super::{CacheKind, LogFormat, ServeConfig};
use crate::route::LoopbackPlans;
use crate::source::meta::Units;

/// What is printed instead of the token.
pub const REDACTED: &str = "<redacted>";

fn path_value(path: &std::path::Path) -> Value {
    Value::String(path.display().to_string())
}

/// The effective configuration as TOML, token redacted.
pub fn render(config: &ServeConfig) -> String {
    let mut top = Table::new();
    top.insert("listen".into(), Value::String(config.listen.to_string()));
    if config.token.is_some() {
        top.insert("token".into(), Value::String(REDACTED.into()));
    }
    top.insert(
        "chunk_target".into(),
        Value::String(format_size(config.chunk_target)),
    );
    top.insert(
        "mapped_chunk_target".into(),
        Value::String(format_size(config.mapped_chunk_target)),
    );
    top.insert(
        "loopback_plans".into(),
        Value::String(
            match config.loopback_plans {
                LoopbackPlans::Learn => "learn",
                LoopbackPlans::Mapped => "mapped",
                LoopbackPlans::Socket => "socket",
            }
            .into(),
        ),
    );
    top.insert(
        "read_ahead".into(),
        Value::String(format_size(config.read_ahead_bytes)),
    );
    top.insert(
        "settle_window".into(),
        Value::String(format_duration(config.settle_window)),
    );
    top.insert(
        "max_connections".into(),
        Value::Integer(i64::try_from(config.max_connections).unwrap_or(i64::MAX)),
    );
    top.insert(
        "handshake_timeout".into(),
        Value::String(format_duration(config.handshake_timeout)),
    );
    let seats = config.seat_limits();
    top.insert(
        "max_connections_per_peer".into(),
        Value::Integer(i64::try_from(seats.max_per_peer).unwrap_or(i64::MAX)),
    );
    top.insert(
        "reclaim_idle_after".into(),
        Value::String(format_duration(seats.reclaim_idle_after)),
    );
    top.insert(
        "max_pinned".into(),
        Value::String(format_size(config.pins.max_bytes)),
    );
    top.insert(
        "max_pinned_per_connection".into(),
        Value::String(format_size(config.pins.max_connection_bytes)),
    );
    top.insert(
        "stream_idle_timeout".into(),
        Value::String(format_duration(config.pins.stream_idle_timeout)),
    );
    top.insert(
        "max_scaled_decode_memory".into(),
        Value::String(format_size(config.max_scaled_decode_bytes)),
    );
    top.insert("watch".into(), Value::Boolean(config.watch));
    top.insert(
        "watch_interval".into(),
        Value::String(format_duration(config.watch_interval)),
    );
    if let Some(addr) = config.metrics_listen {
        top.insert("metrics_listen".into(), Value::String(addr.to_string()));
    }
    top.insert(
        "metrics_max_connections".into(),
        Value::Integer(i64::try_from(config.metrics_limits.max_connections).unwrap_or(i64::MAX)),
    );
    top.insert(
        "metrics_timeout".into(),
        Value::String(format_duration(config.metrics_limits.timeout)),
    );
    let log_format = match config.log_format {
        LogFormat::Text => "text",
        LogFormat::Json => "json",
    };
    top.insert("log_format".into(), Value::String(log_format.into()));
    top.insert(
        "add_source_roots".into(),
        Value::Array(config.runtime.roots.iter().map(|r| path_value(r)).collect()),
    );
    top.insert(
        "add_source_max_files".into(),
        Value::Integer(i64::try_from(config.runtime.max_files).unwrap_or(i64::MAX)),
    );
    top.insert("writable".into(), Value::Boolean(config.writable));
    top.insert("state_dir".into(), path_value(&config.state_dir));
    top.insert(
        "upload_max_ttl".into(),
        Value::String(format_duration(config.upload_max_ttl)),
    );
    top.insert(
        "max_upload_cells".into(),
        Value::Integer(i64::try_from(config.upload_limits.max_cells).unwrap_or(i64::MAX)),
    );
    top.insert(
        "max_upload_bytes_in_flight".into(),
        Value::String(format_size(config.upload_limits.max_bytes_in_flight)),
    );
    top.insert(
        "max_upload_bytes_in_flight_per_upload".into(),
        Value::String(format_size(
            config.upload_limits.max_bytes_in_flight_per_upload,
        )),
    );
    for (key, value) in [
        ("upload_max_count", config.upload_limits.max_uploads),
        ("upload_open_stores", config.upload_limits.open_stores),
    ] {
        top.insert(
            key.into(),
            Value::Integer(i64::try_from(value).unwrap_or(i64::MAX)),
        );
    }
    top.insert(
        "follow_links_outside".into(),
        Value::Boolean(config.follow_links_outside),
    );
    top.insert(
        "max_sources".into(),
        Value::Integer(i64::try_from(config.max_sources).unwrap_or(i64::MAX)),
    );
    top.insert(
        "max_open_sources".into(),
        Value::Integer(i64::try_from(config.max_open_sources).unwrap_or(i64::MAX)),
    );
    top.insert(
        "annotation_cache".into(),
        Value::String(format_size(config.annotation_cache_bytes)),
    );

    let mut pyramid = Table::new();
    let p = &config.pyramid;
    pyramid.insert("method".into(), Value::String(p.method.name().into()));
    for (key, value) in [
        ("threshold", p.threshold),
        ("downscale_factor", p.downscale_factor),
        ("pixel_budget_cubic_root", p.pixel_budget_cubic_root),
        ("plane_max_pixels", p.plane_max_pixels),
    ] {
        pyramid.insert(
            key.into(),
            Value::Integer(i64::try_from(value).unwrap_or(i64::MAX)),
        );
    }
    top.insert("pyramid".into(), Value::Table(pyramid));

    let mut cache = Table::new();
    let kind = match config.cache {
        CacheKind::File => "file",
        CacheKind::Memory => "memory",
    };
    cache.insert("kind".into(), Value::String(kind.into()));
    cache.insert("dir".into(), path_value(&config.cache_dir));
    cache.insert(
        "max_bytes".into(),
        Value::String(format_size(config.cache_max_bytes)),
    );
    cache.insert(
        "allow_network".into(),
        Value::Boolean(config.allow_network_cache),
    );
    cache.insert(
        "group_readable".into(),
        Value::Boolean(config.cache_group_readable),
    );
    top.insert("cache".into(), Value::Table(cache));

    if let Some(tls) = &config.tls {
        let mut table = Table::new();
        table.insert("cert".into(), path_value(&tls.cert));
        table.insert("key".into(), path_value(&tls.key));
        top.insert("tls".into(), Value::Table(table));
    }

    let sources: Vec<Value> = config
        .sources()
        .into_iter()
        .map(|spec| {
            let mut table = Table::new();
            table.insert("path".into(), path_value(&spec.path));
            if let Some(id) = spec.options.id {
                table.insert("id".into(), Value::String(id));
            }
            if let Some(labels) = spec.options.dim_labels {
                table.insert(
                    "dim_labels".into(),
                    Value::Array(labels.into_iter().map(Value::String).collect()),
                );
            }
            if let Some(supplied) = spec.options.supplied {
                if let Some(scale) = &supplied.physical_scale {
                    table.insert(
                        "physical_scale".into(),
                        Value::Array(scale.iter().map(|v| Value::Float(*v)).collect()),
                    );
                }
                if let Some(Ok(unit)) = supplied.physical_unit.as_ref().map(|u| match u {
                    Units::One(one) => Ok(Value::String(one.clone())),
                    Units::PerAxis(all) => Value::try_from(all),
                }) {
                    table.insert("physical_unit".into(), unit);
                }
                // JSON nulls have no TOML form: such metadata is not echoed.
                if let Some(Ok(metadata)) = supplied.metadata.as_ref().map(Value::try_from) {
                    table.insert("metadata".into(), metadata);
                }
            }
            Value::Table(table)
        })
        .collect();
    if !sources.is_empty() {
        top.insert("source".into(), Value::Array(sources));
    }
    toml::to_string(&top).unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::{ConfigFile, ServeArgs};

    #[test]
    fn output_is_a_valid_config_file_without_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(
            &path,
            "token = \"s3cret-token-0123456789\"\nwatch = true\nmetrics_listen = \"127.0.0.1:9\"\n\
             [[source]]\npath = \"/data/a.npy\"\nid = \"alpha\"\ndim_labels = [\"y\", \"x\"]\n",
        )
        .unwrap();
        let config = ServeConfig::resolve(ServeArgs {
            config: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        let text = render(&config);
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains(REDACTED), "{text}");
        std::fs::write(&path, &text).unwrap();
        let reread = ConfigFile::load(&path).unwrap();
        let source = &reread.source.unwrap()[0];
        assert_eq!(source.id.as_deref(), Some("alpha"));
        assert_eq!(reread.watch, Some(true));
        assert_eq!(reread.metrics_listen, Some("127.0.0.1:9".parse().unwrap()));
    }
}
