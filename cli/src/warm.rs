//! `tessera warm LOCATION ARRAY_ID...`: fills a server's chunk cache ahead of readers.
//!
//! Each array is planned whole; then every chunk goes to `chunk_locate`, which decodes and
//! appends cold chunks to the file cache and answers at once for warm ones. When the server
//! cannot locate a chunk (memory cache, or the file cache refused it), the chunk is fetched
//! once over do_get instead, which fills the memory cache. A few chunks are in flight at once.

use std::time::Instant;

use futures::StreamExt;
use tessera_client::{ChunkLocateReply, Client, ClientError, Plan, PlannedChunk};
use tessera_proto::units::human_bytes;

use crate::progress::Progress;
use crate::remote::{Credentials, count, options};

/// Chunks warmed concurrently.
pub const DEFAULT_CONCURRENCY: usize = 4;

/// Why warming failed.
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    /// The server could not be reached, or refused a call. Not `transparent`: the error
    /// chain must reach the `ClientError` itself, whose message and hint are worded for
    /// users (`errors::one_line`), as `tessera get`'s are.
    #[error("{0}")]
    Client(#[from] ClientError),
    /// A chunk could not be warmed.
    #[error("cannot warm a chunk of '{array_id}': {source}")]
    Chunk {
        /// The array.
        array_id: String,
        /// What went wrong.
        #[source]
        source: ClientError,
    },
}

/// What a warm run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WarmSummary {
    /// Arrays warmed.
    pub arrays: usize,
    /// Chunks warmed (located plus fetched).
    pub chunks: u64,
    /// Chunks now in the file cache, located.
    pub located: u64,
    /// Chunks the server could not locate, fetched over do_get instead.
    pub fetched: u64,
    /// Bytes of the chunks (messages located, data fetched).
    pub bytes: u64,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Why chunks could not be located, as the server said (first reason seen).
    pub unlocated_reason: Option<String>,
}

impl std::fmt::Display for WarmSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "warmed {} ({}) of {} in {:.2} s: {} in the file cache",
            count(self.chunks, "chunk"),
            human_bytes(self.bytes),
            count(self.arrays as u64, "array"),
            self.seconds,
            self.located
        )?;
        if self.fetched > 0 {
            write!(f, ", {} fetched over do_get", self.fetched)?;
            if let Some(reason) = &self.unlocated_reason {
                write!(f, " ({reason})")?;
            }
        }
        Ok(())
    }
}

/// How one chunk was warmed, and its size.
enum Warmed {
    Located(u64),
    Fetched(u64, Option<String>),
}

async fn warm_chunk(
    client: &Client,
    plan: &Plan,
    chunk: &PlannedChunk,
) -> Result<Warmed, ClientError> {
    match client.locate(chunk).await? {
        ChunkLocateReply::Located(location) => Ok(Warmed::Located(location.byte_length)),
        ChunkLocateReply::Unavailable { reason } => {
            let view = client.fetch_chunk(plan, chunk).await?;
            Ok(Warmed::Fetched(view.bytes().len() as u64, reason))
        }
    }
}

/// Warms every chunk of `array_ids` on the server at `location`, `concurrency` at a time,
/// drawing a progress line on stderr when it is a terminal. With `levels`, warms the
/// computed pyramid levels the server advertises instead of full resolution, so a viewer's
/// first, coarse screen is a cache hit.
pub async fn warm(
    location: &str,
    creds: Credentials<'_>,
    array_ids: &[String],
    concurrency: usize,
    levels: bool,
) -> Result<WarmSummary, WarmError> {
    let started = Instant::now();
    // Fetched chunks only fill the server's memory cache: never map, never keep copies.
    let client = Client::connect(location, options(true, creds)?.with_copy_cache_bytes(0)).await?;
    let mut plans = Vec::new();
    for array_id in array_ids {
        if levels {
            for level in client.pyramid(array_id).await? {
                if level.factors.iter().any(|&f| f > 1) {
                    let plan = client.plan_scaled(array_id, None, Some(&level)).await?;
                    plans.push((array_id.clone(), plan));
                }
            }
        } else {
            plans.push((array_id.clone(), client.plan(array_id, None).await?));
        }
    }
    let work: Vec<(&str, &Plan, &PlannedChunk)> = plans
        .iter()
        .flat_map(|(id, plan)| plan.chunks.iter().map(move |c| (id.as_str(), plan, c)))
        .collect();
    let mut summary = WarmSummary {
        arrays: array_ids.len(),
        ..Default::default()
    };
    let mut progress = Progress::new("warm", work.len());
    let client = &client;
    let mut results =
        futures::stream::iter(work.into_iter().map(|(array_id, plan, chunk)| async move {
            warm_chunk(client, plan, chunk)
                .await
                .map_err(|source| WarmError::Chunk {
                    array_id: array_id.to_string(),
                    source,
                })
        }))
        .buffer_unordered(concurrency.max(1));
    while let Some(result) = results.next().await {
        match result? {
            Warmed::Located(bytes) => {
                summary.located += 1;
                summary.bytes += bytes;
            }
            Warmed::Fetched(bytes, reason) => {
                summary.fetched += 1;
                summary.bytes += bytes;
                if summary.unlocated_reason.is_none() {
                    summary.unlocated_reason = reason;
                }
            }
        }
        summary.chunks += 1;
        progress.update(summary.chunks as usize, &human_bytes(summary.bytes));
    }
    progress.finish();
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_names_the_fallback() {
        let s = WarmSummary {
            arrays: 1,
            chunks: 2,
            located: 1,
            fetched: 1,
            bytes: 2048,
            seconds: 0.5,
            unlocated_reason: Some("memory cache".to_string()),
        };
        assert_eq!(
            s.to_string(),
            "warmed 2 chunks (2.0 KiB) of 1 array in 0.50 s: 1 in the file cache, 1 fetched over do_get (memory cache)"
        );
    }
}
