//! `tessera get`, `tessera ls` and `tessera stats`: commands written on
//! [`tessera_client::Client`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use tessera_client::{
    Client, ClientError, ClientOptions, ReadScale, RefusedSource, TensorInfo, parse_selection,
    write_npy,
};
use tessera_proto::json::CacheStats;
use tessera_proto::units::human_bytes;

use crate::progress::Progress;

/// What `tessera get` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetSummary {
    /// The `.npy` written.
    pub path: PathBuf,
    /// The tensor read.
    pub array_id: String,
    /// Shape of the array written.
    pub shape: Vec<u64>,
    /// Its numpy dtype string.
    pub dtype: String,
    /// Payload bytes written (after the header).
    pub bytes: u64,
    /// Chunks fetched.
    pub chunks: usize,
    /// Chunks read as zero-copy views of mapped segments.
    pub mapped_chunks: u64,
    /// Chunks read through a mapping and copied out (pin limit).
    pub mapped_copies: u64,
    /// Chunks received over the socket (DoGet).
    pub socket_chunks: u64,
}

impl std::fmt::Display for GetSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "wrote {}: '{}' {} {}, {} in {} ({} mapped, {} copied from mappings, {} over the socket)",
            self.path.display(),
            self.array_id,
            shape_text(&self.shape),
            self.dtype,
            human_bytes(self.bytes),
            count(self.chunks as u64, "chunk"),
            self.mapped_chunks,
            self.mapped_copies,
            self.socket_chunks
        )
    }
}

/// How the CLI commands reach a server: a bearer token and a CA certificate, if needed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Credentials<'a> {
    /// Bearer token, when the server requires one.
    pub token: Option<&'a str>,
    /// PEM CA certificate file for `grpc+tls://` / `grpcs://` locations.
    pub tls_ca: Option<&'a Path>,
}

/// Client options for `creds`, with the mmap fast path off when `no_mmap` is set.
pub fn options(no_mmap: bool, creds: Credentials<'_>) -> Result<ClientOptions, ClientError> {
    let mut options = ClientOptions::default();
    if let Some(path) = creds.tls_ca {
        let pem = std::fs::read(path).map_err(|source| ClientError::TlsCa {
            path: path.to_path_buf(),
            source,
        })?;
        options = options.with_tls_ca_pem(pem);
    }
    let token = creds.token;
    if no_mmap {
        options = options.with_mmap(false);
    }
    if let Some(token) = token {
        options = options.with_token(token);
    }
    Ok(options)
}

/// `tessera get LOCATION ARRAY_ID [--region R] [--scale F,F,… [--method M]] -o OUT [--no-mmap]
/// [--token T] [--tls-ca F]`: reads the tensor (or the numpy-like `region` of it, see
/// [`parse_selection`]: an integer index drops its axis, an empty slice gives an empty
/// axis), downsampled by the server when `scale` is given, and writes a version 1.0 C-order
/// `.npy` with the dtype as served. Shows a percentage on stderr when stderr is a terminal.
/// The output's folder is checked before the server is asked anything.
pub async fn get(
    location: &str,
    array_id: &str,
    region: Option<&str>,
    scale: Option<ReadScale>,
    out: &Path,
    no_mmap: bool,
    creds: Credentials<'_>,
) -> Result<GetSummary, ClientError> {
    check_output_folder(out)?;
    let client = Client::connect(location, options(no_mmap, creds)?).await?;
    let selection = match region {
        Some(text) => {
            let info = client.describe(array_id).await?;
            let selection = parse_selection(text, &info.shape)?;
            if selection.is_empty() {
                // numpy gives an empty array; there is nothing to plan or fetch.
                let shape = selection.shape();
                write_npy(out, &info.dtype, &shape, &[])?;
                return Ok(GetSummary {
                    path: out.to_path_buf(),
                    array_id: array_id.to_string(),
                    shape,
                    dtype: info.dtype,
                    bytes: 0,
                    chunks: 0,
                    mapped_chunks: 0,
                    mapped_copies: 0,
                    socket_chunks: 0,
                });
            }
            Some(selection)
        }
        None => None,
    };
    let plan = client
        .plan_scaled(
            array_id,
            selection.as_ref().map(|s| &s.region),
            scale.as_ref(),
        )
        .await?;
    let chunks = plan.needed_chunks().count();
    let mut progress = Progress::new(array_id, chunks);
    let mut report = |done: usize, _total: usize| progress.update(done, "");
    let data = client.read_plan(&plan, Some(&mut report)).await;
    progress.finish();
    let data = data?;
    // Axes an integer index selected have length 1 (also once reduced): dropping them leaves
    // the bytes as they are.
    let shape = match selection {
        Some(s) => data
            .shape
            .iter()
            .enumerate()
            .filter(|(axis, _)| !s.dropped.contains(axis))
            .map(|(_, &n)| n)
            .collect(),
        None => data.shape,
    };
    write_npy(out, &data.dtype, &shape, &data.bytes)?;
    let stats = client.local_stats();
    Ok(GetSummary {
        path: out.to_path_buf(),
        array_id: array_id.to_string(),
        shape,
        dtype: data.dtype,
        bytes: data.bytes.len() as u64,
        chunks,
        mapped_chunks: stats.mapped_chunks,
        mapped_copies: stats.mapped_copies,
        socket_chunks: stats.socket_chunks,
    })
}

/// Refuses an output path whose folder does not exist (or is not a folder), before any
/// data is read.
fn check_output_folder(out: &Path) -> Result<(), ClientError> {
    let folder = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => return Ok(()),
    };
    match std::fs::metadata(folder) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(ClientError::Io {
            what: "output folder is not a folder",
            path: folder.to_path_buf(),
            source: std::io::Error::from(std::io::ErrorKind::NotADirectory),
        }),
        Err(source) => Err(ClientError::Io {
            what: "output folder",
            path: folder.to_path_buf(),
            source,
        }),
    }
}

/// `tessera ls LOCATION [--token T] [--tls-ca F]`: one line per tensor (array id, shape,
/// dtype, chunk shape, labels) under a header line, then the files the server refused to
/// serve, each with its reason.
pub async fn ls(location: &str, creds: Credentials<'_>) -> Result<String, ClientError> {
    let client = Client::connect(location, options(false, creds)?).await?;
    let mut text = format_listing(location, &client.list().await?);
    match client.refused_sources().await {
        Ok(refused) => text.push_str(&format_refused(&refused)),
        // A server without Tessera's catalog still lists its tensors.
        Err(err) => {
            let _ = writeln!(text, "\nrefused files: unknown ({err})");
        }
    }
    Ok(text)
}

/// The refused files as a section after the tensors: nothing when there are none.
fn format_refused(refused: &[RefusedSource]) -> String {
    let mut out = String::new();
    if refused.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "\nrefused ({}, not served):",
        count(refused.len() as u64, "file")
    );
    for file in refused {
        let path = file
            .source_url
            .strip_prefix("file://")
            .unwrap_or(&file.source_url);
        // Most reasons name the file already: the path is printed once.
        if file.reason.contains(path) {
            let _ = writeln!(out, "  {}  {}", file.source_id, file.reason);
        } else {
            let _ = writeln!(out, "  {}  {path}: {}", file.source_id, file.reason);
        }
    }
    out
}

fn format_listing(location: &str, tensors: &[TensorInfo]) -> String {
    if tensors.is_empty() {
        return format!("no tensors served at {location}\n");
    }
    let rows: Vec<[String; 5]> = tensors
        .iter()
        .map(|t| {
            [
                t.array_id.clone(),
                shape_text(&t.shape),
                t.dtype.clone(),
                shape_text(&t.chunk_shape),
                t.dim_labels.join(","),
            ]
        })
        .collect();
    let header = ["ARRAY_ID", "SHAPE", "DTYPE", "CHUNK", "LABELS"].map(str::to_string);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

/// `tessera stats LOCATION [--token T] [--tls-ca F]`: the server's `cache_stats`, readably.
pub async fn stats(location: &str, creds: Credentials<'_>) -> Result<String, ClientError> {
    let client = Client::connect(location, options(false, creds)?).await?;
    Ok(format_stats(location, &client.cache_stats().await?))
}

fn format_stats(location: &str, s: &CacheStats) -> String {
    let backend = match s.backend {
        tessera_proto::json::CacheBackend::File => "file (local clients can mmap chunks)",
        tessera_proto::json::CacheBackend::Memory => "memory (every chunk goes over the socket)",
    };
    let lookups = s.hits + s.misses;
    let hit_rate = if lookups == 0 {
        "n/a".to_string()
    } else {
        format!("{:.1}%", s.hits as f64 * 100.0 / lookups as f64)
    };
    let lines = [
        format!("chunk cache of {location}"),
        format!("  backend:            {backend}"),
        format!(
            "  entries:            {}",
            if s.max_entries == 0 && s.max_bytes > 0 {
                // The byte budget bounds the entries; "no limit" beside it read as a contradiction.
                format!("{} (bounded by the size limit)", s.total_entries)
            } else {
                of_budget(s.total_entries.to_string(), s.max_entries, |n| {
                    n.to_string()
                })
            }
        ),
        format!(
            "  size:               {}",
            of_budget(human_bytes(s.total_bytes), s.max_bytes, human_bytes)
        ),
        format!(
            "  hits / misses:      {} / {} ({hit_rate} hits)",
            s.hits, s.misses
        ),
        format!(
            "  evictions:          {} ({} skipped while referenced)",
            s.evictions, s.ref_held_evictions_skipped
        ),
        format!("  waits on a fill:    {}", s.pending_waits),
        format!(
            "  waits on eviction:  {} ({} over budget)",
            s.budget_waits, s.budget_overruns
        ),
        format!("  decoded ahead:      {}", s.read_aheads),
        format!("  recut from cache:   {}", s.recuts),
        format!("  oversized skips:    {}", s.oversized_skips),
        format!(
            "  segments:           {} ({} unlinked, maybe still mapped)",
            s.segments,
            human_bytes(s.unlinked_bytes)
        ),
        format!("  served by mmap:     {} chunk_locate", s.locates),
        format!("  served by socket:   {} do_get", s.do_gets),
        format!(
            "  unread replies:     {} held ({} closed for stalling)",
            human_bytes(s.pinned_bytes),
            count(s.stalled_connections_closed, "connection")
        ),
        format!(
            "  write failures:     {} ({} disk full)",
            s.write_failures, s.disk_full_events
        ),
    ];
    let mut out = lines.join("\n");
    if let Some(ceiling) = s.disk_ceiling_bytes {
        out.push_str(&format!(
            "\n  disk full:          evicting down to {} instead of the budget",
            human_bytes(ceiling)
        ));
    }
    if let Some(paused) = &s.writes_paused {
        out.push_str(&format!("\n  writes paused:      {paused}"));
    }
    out.push('\n');
    out
}

/// `used of max max`, or `used (no limit)` when the budget is 0 (the server's "unbounded").
fn of_budget(used: String, max: u64, show: impl Fn(u64) -> String) -> String {
    if max == 0 {
        format!("{used} (no limit)")
    } else {
        format!("{used} of {} max", show(max))
    }
}

/// `1 chunk`, `2 chunks`, `0 chunks`.
pub(crate) fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `(a, b, c)` like numpy, `(n,)` for one axis.
fn shape_text(shape: &[u64]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn listing_is_aligned() {
        let tensors = vec![
            TensorInfo {
                array_id: "img".into(),
                shape: vec![64, 64],
                dtype: "|u1".into(),
                dim_labels: vec!["y".into(), "x".into()],
                chunk_shape: vec![16, 16],
            },
            TensorInfo {
                array_id: "volume_long_name".into(),
                shape: vec![5],
                dtype: "<f8".into(),
                dim_labels: vec![],
                chunk_shape: vec![5],
            },
        ];
        let text = format_listing("grpc://h:1", &tensors);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("ARRAY_ID          SHAPE"), "{text}");
        assert!(
            lines[1].starts_with("img               (64, 64)  |u1"),
            "{text}"
        );
        assert!(lines[2].contains("(5,)"), "{text}");
        assert_eq!(
            format_listing("grpc://h:1", &[]),
            "no tensors served at grpc://h:1\n"
        );
        assert_eq!(format_refused(&[]), "");
        let refused = format_refused(&[RefusedSource {
            source_id: "bad".into(),
            source_url: "file:///d/bad.npy".into(),
            reason: "not an .npy file".into(),
        }]);
        assert_eq!(
            refused,
            "\nrefused (1 file, not served):\n  bad  /d/bad.npy: not an .npy file\n"
        );
        let named = format_refused(&[RefusedSource {
            source_id: "bad".into(),
            source_url: "file:///d/bad.npy".into(),
            reason: "/d/bad.npy: header is not a dict".into(),
        }]);
        assert_eq!(named.matches("/d/bad.npy").count(), 1, "{named}");
    }

    #[test]
    fn stats_name_every_counter() {
        let stats = CacheStats {
            total_entries: 12,
            total_bytes: 3 << 20,
            max_entries: 1000,
            max_bytes: 10 << 30,
            hits: 3,
            misses: 1,
            evictions: 2,
            pending_waits: 0,
            ref_held_evictions_skipped: 1,
            oversized_skips: 0,
            unlinked_bytes: 0,
            segments: 4,
            locates: 9,
            do_gets: 5,
            budget_waits: 6,
            budget_overruns: 0,
            read_aheads: 7,
            recuts: 1,
            pinned_bytes: 2 << 20,
            stalled_connections_closed: 1,
            write_failures: 3,
            disk_full_events: 2,
            disk_ceiling_bytes: Some(1 << 30),
            writes_paused: Some("disk full".to_string()),
            backend: tessera_proto::json::CacheBackend::File,
        };
        let unbounded = CacheStats {
            max_entries: 0,
            max_bytes: 0,
            ..stats.clone()
        };
        let text = format_stats("grpc://h:1", &unbounded);
        assert!(text.contains("entries:            12 (no limit)"), "{text}");
        assert!(
            text.contains("size:               3.0 MiB (no limit)"),
            "{text}"
        );
        let by_size = CacheStats {
            max_entries: 0,
            ..stats.clone()
        };
        let text = format_stats("grpc://h:1", &by_size);
        assert!(
            text.contains("entries:            12 (bounded by the size limit)"),
            "{text}"
        );
        assert!(
            text.contains("size:               3.0 MiB of 10.0 GiB max"),
            "{text}"
        );
        let text = format_stats("grpc://h:1", &stats);
        for needle in [
            "chunk cache of grpc://h:1",
            "backend:            file",
            "entries:            12 of 1000 max",
            "size:               3.0 MiB of 10.0 GiB max",
            "hits / misses:      3 / 1 (75.0% hits)",
            "evictions:          2 (1 skipped while referenced)",
            "decoded ahead:      7",
            "segments:           4 (0 B unlinked",
            "served by mmap:     9 chunk_locate",
            "served by socket:   5 do_get",
            "waits on eviction:  6 (0 over budget)",
            "unread replies:     2.0 MiB held (1 connection closed for stalling)",
            "write failures:     3 (2 disk full)",
            "disk full:          evicting down to 1.0 GiB instead of the budget",
            "writes paused:      disk full",
        ] {
            assert!(text.contains(needle), "{needle:?} not in\n{text}");
        }
    }
}
