//! `tessera put LOCATION ARRAY_ID FILE.npy`: uploads a `.npy` file with the biopb upload
//! calls (declare, one DoPut per chunk of the server's grid, READY), drawing a progress
//! line on a terminal.

use std::path::Path;

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use tessera_client::{Client, upload_arrow_type};
use tessera_proto::pb::TensorDescriptor;
use tessera_proto::units::human_bytes;
use tessera_server::npy::{ByteOrder, Limits, NpyFile};

use crate::progress::Progress;
use crate::remote::{Credentials, options};

/// Chunks read and sent at once.
pub const DEFAULT_CONCURRENCY: usize = 4;

/// The `UploadStatus.State` value of READY.
const READY: i32 = 2;

/// What `tessera put` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutSummary {
    /// The array id the server answered.
    pub array_id: String,
    /// Chunks sent.
    pub chunks: usize,
    /// Payload bytes sent.
    pub bytes: u64,
}

impl std::fmt::Display for PutSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "uploaded '{}': {} in {}, READY",
            self.array_id,
            human_bytes(self.bytes),
            crate::remote::count(self.chunks as u64, "chunk")
        )
    }
}

/// The id `add_tensor` takes: `ARRAY_ID` as given when it has a scheme, else `cache://`
/// in front (`scratch/@fields/x` and `cache://scratch/@fields/x` are the same upload).
fn upload_id(array_id: &str) -> String {
    if array_id.contains("://") {
        array_id.to_string()
    } else {
        format!("cache://{array_id}")
    }
}

/// Uploads `file` as `array_id` (`[cache://]<source>/@fields/<name>`), with an optional
/// lifetime, and publishes it. Big-endian files are sent as little-endian values.
pub async fn put(
    location: &str,
    array_id: &str,
    file: &Path,
    ttl_seconds: Option<u32>,
    creds: Credentials<'_>,
) -> anyhow::Result<PutSummary> {
    let npy = NpyFile::open(file, &Limits::default())
        .with_context(|| format!("cannot read {}", file.display()))?;
    let header = npy.header().clone();
    let swap = header.dtype.order == ByteOrder::Big;
    let dtype = if swap {
        format!("<{}", &header.dtype.numpy_str()[1..])
    } else {
        header.dtype.numpy_str()
    };
    upload_arrow_type(&dtype)?;
    let client = Client::connect(location, options(true, creds)?).await?;
    let request = TensorDescriptor {
        array_id: upload_id(array_id),
        shape: header.shape.iter().map(|&d| d as i64).collect(),
        dtype: dtype.clone(),
        ttl_seconds,
        ..Default::default()
    };
    let desc = client.add_tensor(&request).await?;
    let plan = client.plan(&desc.array_id, None).await?;
    let itemsize = header.dtype.itemsize;
    let total = plan.chunks.len();
    let mut progress = Progress::new(&desc.array_id, total);
    let npy = &npy;
    let client = &client;
    let dtype = dtype.as_str();
    let mut sends = futures::stream::iter(plan.chunks.iter().map(|chunk| async move {
        let (start, stop) = (&chunk.bounds.start, &chunk.bounds.stop);
        let elements: u64 = start.iter().zip(stop).map(|(a, b)| b - a).product();
        let len = usize::try_from(elements)? * itemsize;
        let mut buf = arrow_buffer::MutableBuffer::from_len_zeroed(len);
        let read = {
            let (file, start, stop) = (npy, start.clone(), stop.clone());
            tokio::task::block_in_place(|| file.read_region(&start, &stop, buf.as_slice_mut()))
        };
        read.with_context(|| format!("cannot read chunk {} of the file", chunk.bounds))?;
        if swap {
            for value in buf.as_slice_mut().chunks_exact_mut(itemsize) {
                value.reverse();
            }
        }
        client.put_chunk(&chunk.ticket, dtype, buf.into()).await?;
        anyhow::Ok(len as u64)
    }))
    .buffer_unordered(DEFAULT_CONCURRENCY);
    let (mut done, mut bytes) = (0, 0);
    while let Some(sent) = sends.next().await {
        let sent = match sent {
            Ok(sent) => sent,
            Err(err) => {
                progress.finish();
                return Err(err.context(format!(
                    "upload of '{}' stopped after {done} of {total} chunks; it stays PENDING",
                    desc.array_id
                )));
            }
        };
        done += 1;
        bytes += sent;
        progress.update(done, &human_bytes(bytes));
    }
    progress.finish();
    let status = client.set_upload_status(&desc.array_id, READY, "").await?;
    if status.state != READY {
        bail!("'{}' did not become READY: {status:?}", desc.array_id);
    }
    Ok(PutSummary {
        array_id: desc.array_id,
        chunks: total,
        bytes,
    })
}
