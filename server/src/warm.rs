//! `tessera warm LOCATION ARRAY_ID...`: fills a server's chunk cache ahead of readers.
//!
//! Each array is planned whole (GetFlightInfo); then every chunk ticket is sent to
//! `chunk_locate`, which decodes and appends cold chunks to the file cache and
//! answers at once for warm ones. When the server cannot locate a chunk (memory
//! cache, or the file cache refused it), the chunk is fetched once with `do_get`
//! instead, which fills the memory cache. A few chunks are in flight at once.

use std::io::Write as _;
use std::time::{Duration, Instant};

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Action, FlightDescriptor, Ticket};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tessera_client::human_bytes;
use tessera_proto::json::ChunkLocateReply;
use tessera_proto::pb::TensorReadOption;
use tessera_proto::{ACTION_CHUNK_LOCATE, AUTHORIZATION_HEADER, BEARER_PREFIX, flight_request};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// Chunks warmed concurrently.
pub const DEFAULT_CONCURRENCY: usize = 4;
/// Largest reply accepted: one 64 MiB chunk plus its header.
const MAX_REPLY_BYTES: usize = 80 << 20;
/// How often the progress line is redrawn.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// Why warming failed.
#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    /// The location is not a URL this command can dial.
    #[error(
        "location '{0}' is not understood: use grpc://HOST:PORT, or grpcs://HOST:PORT with --tls-ca"
    )]
    BadLocation(String),
    /// A TLS location without a CA certificate to check the server against.
    #[error("location '{0}' uses TLS: pass the server's CA certificate (PEM) with --tls-ca FILE")]
    NeedsCa(String),
    /// The CA file could not be read.
    #[error("cannot read CA certificate {path}: {source}")]
    ReadCa {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The token cannot travel in a header.
    #[error("the token holds characters that cannot travel in an HTTP header")]
    BadToken,
    /// The server could not be reached.
    #[error("cannot connect to {location}: {source}")]
    Connect {
        /// Where.
        location: String,
        /// The cause.
        source: tonic::transport::Error,
    },
    /// Planning an array failed.
    #[error("cannot plan '{array_id}': {message}")]
    Plan {
        /// The array.
        array_id: String,
        /// The server's message.
        message: String,
    },
    /// A chunk could not be warmed.
    #[error("cannot warm a chunk of '{array_id}': {message}")]
    Chunk {
        /// The array.
        array_id: String,
        /// What went wrong.
        message: String,
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
    /// Bytes of the chunk messages.
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
            "warmed {} chunks ({}) of {} arrays in {:.2} s: {} in the file cache",
            self.chunks,
            human_bytes(self.bytes),
            self.arrays,
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

/// Adds `authorization: Bearer TOKEN` to every call when a token is set.
#[derive(Clone)]
struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert(AUTHORIZATION_HEADER, value.clone());
        }
        Ok(request)
    }
}

type Client = FlightServiceClient<InterceptedService<Channel, Bearer>>;

/// How to reach the server.
#[derive(Clone, Debug, Default)]
pub struct Remote {
    /// `grpc://HOST:PORT` (or `grpcs://`, `grpc+tls://` with `tls_ca`).
    pub location: String,
    /// Bearer token, if the server requires one.
    pub token: Option<String>,
    /// PEM CA certificate for TLS locations.
    pub tls_ca: Option<std::path::PathBuf>,
}

async fn connect(remote: &Remote) -> Result<Client, WarmError> {
    let location = remote.location.as_str();
    let (scheme, rest) = location
        .split_once("://")
        .ok_or_else(|| WarmError::BadLocation(location.to_string()))?;
    let tls = match scheme {
        "grpc" | "grpc+tcp" | "http" => false,
        "grpcs" | "grpc+tls" | "https" => true,
        _ => return Err(WarmError::BadLocation(location.to_string())),
    };
    let url = format!("{}://{rest}", if tls { "https" } else { "http" });
    let connect_error = |source| WarmError::Connect {
        location: location.to_string(),
        source,
    };
    let mut endpoint = Endpoint::from_shared(url).map_err(connect_error)?;
    if tls {
        let path = remote
            .tls_ca
            .as_ref()
            .ok_or_else(|| WarmError::NeedsCa(location.to_string()))?;
        let pem = std::fs::read(path).map_err(|source| WarmError::ReadCa {
            path: path.clone(),
            source,
        })?;
        endpoint = endpoint
            .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)))
            .map_err(connect_error)?;
    }
    let channel = endpoint.connect().await.map_err(connect_error)?;
    let bearer = match &remote.token {
        Some(token) => Some(
            format!("{BEARER_PREFIX}{token}")
                .parse::<MetadataValue<Ascii>>()
                .map_err(|_| WarmError::BadToken)?,
        ),
        None => None,
    };
    Ok(
        FlightServiceClient::with_interceptor(channel, Bearer(bearer))
            .max_decoding_message_size(MAX_REPLY_BYTES),
    )
}

/// Every chunk ticket of `array_id`'s whole-tensor plan.
async fn plan(client: &mut Client, array_id: &str) -> Result<Vec<Bytes>, WarmError> {
    let read = TensorReadOption {
        array_id: array_id.to_string(),
        ..Default::default()
    };
    let descriptor = FlightDescriptor::new_cmd(flight_request(read));
    let info = client
        .get_flight_info(descriptor)
        .await
        .map_err(|status| WarmError::Plan {
            array_id: array_id.to_string(),
            message: status.message().to_string(),
        })?
        .into_inner();
    Ok(info
        .endpoint
        .into_iter()
        .filter_map(|e| e.ticket.map(|t| t.ticket))
        .collect())
}

/// How one chunk was warmed, and its message size.
enum Warmed {
    Located(u64),
    Fetched(u64, Option<String>),
}

async fn warm_chunk(mut client: Client, ticket: Bytes) -> Result<Warmed, String> {
    let results: Vec<arrow_flight::Result> = client
        .do_action(Action::new(ACTION_CHUNK_LOCATE, ticket.clone()))
        .await
        .map_err(|s| s.message().to_string())?
        .into_inner()
        .try_collect()
        .await
        .map_err(|s| s.message().to_string())?;
    let body = results
        .first()
        .ok_or("chunk_locate returned no result")?
        .body
        .clone();
    let reply: ChunkLocateReply =
        serde_json::from_slice(&body).map_err(|e| format!("bad chunk_locate reply: {e}"))?;
    match reply {
        ChunkLocateReply::Located(location) => Ok(Warmed::Located(location.byte_length)),
        ChunkLocateReply::Unavailable { reason } => {
            let mut stream = client
                .do_get(Ticket { ticket })
                .await
                .map_err(|s| s.message().to_string())?
                .into_inner();
            let mut bytes = 0u64;
            while let Some(message) = stream.next().await {
                let message = message.map_err(|s| s.message().to_string())?;
                bytes += (message.data_header.len() + message.data_body.len()) as u64;
            }
            Ok(Warmed::Fetched(bytes, reason))
        }
    }
}

/// Warms every chunk of `array_ids` on the server at `remote`, `concurrency` at a
/// time, drawing a progress line on stderr when `progress` is set.
pub async fn warm(
    remote: &Remote,
    array_ids: &[String],
    concurrency: usize,
    progress: bool,
) -> Result<WarmSummary, WarmError> {
    let started = Instant::now();
    let mut client = connect(remote).await?;
    let mut work = Vec::new();
    for array_id in array_ids {
        for ticket in plan(&mut client, array_id).await? {
            work.push((array_id.clone(), ticket));
        }
    }
    let total = work.len();
    let mut summary = WarmSummary {
        arrays: array_ids.len(),
        ..Default::default()
    };
    let mut results = futures::stream::iter(work.into_iter().map(|(array_id, ticket)| {
        let client = client.clone();
        async move {
            warm_chunk(client, ticket)
                .await
                .map_err(|message| WarmError::Chunk { array_id, message })
        }
    }))
    .buffer_unordered(concurrency.max(1));
    let mut drawn = Instant::now();
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
        if progress && (drawn.elapsed() >= PROGRESS_EVERY || summary.chunks as usize == total) {
            drawn = Instant::now();
            draw_progress(&summary, total, started.elapsed());
        }
    }
    if progress && total > 0 {
        eprintln!();
    }
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

fn draw_progress(summary: &WarmSummary, total: usize, elapsed: Duration) {
    let width = 30usize;
    let filled = (summary.chunks as usize * width)
        .checked_div(total)
        .unwrap_or(width);
    let bar: String = "#".repeat(filled) + &" ".repeat(width - filled.min(width));
    let mut err = std::io::stderr().lock();
    let _ = write!(
        err,
        "\r[{bar}] {}/{total} chunks, {}, {:.1} s ",
        summary.chunks,
        human_bytes(summary.bytes),
        elapsed.as_secs_f64()
    );
    let _ = err.flush();
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
            "warmed 2 chunks (2.0 KiB) of 1 arrays in 0.50 s: 1 in the file cache, 1 fetched over do_get (memory cache)"
        );
    }
}
