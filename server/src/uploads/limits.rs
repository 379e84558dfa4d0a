//! What uploads may cost the server: the cells of one upload's grid (each a plan endpoint and
//! a manifest row), and the bytes of chunk DoPuts received but not yet stored, per upload
//! and for the whole server. A DoPut reserves its chunk's largest size before it reads the
//! chunk's messages and holds the reservation until the bytes are stored or dropped, so the
//! buffers of unfinished DoPuts never pass the limits and are released with the stream.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::UploadError;

/// Default most cells an upload's grid may have: 262,144 (a 1 TiB upload in 4 MiB chunks).
pub const DEFAULT_MAX_UPLOAD_CELLS: u64 = 1 << 18;

/// Default most bytes of chunk DoPuts the server holds at once: 1 GiB.
pub const DEFAULT_MAX_UPLOAD_BYTES_IN_FLIGHT: u64 = 1 << 30;

/// Default most bytes of chunk DoPuts one upload holds at once: 256 MiB.
pub const DEFAULT_MAX_UPLOAD_BYTES_IN_FLIGHT_PER_UPLOAD: u64 = 256 << 20;

/// Bytes a chunk DoPut's messages may carry beyond its cell's values (the descriptor, the
/// schema, IPC metadata and padding): 64 KiB.
pub const PUT_FRAMING_SLACK: u64 = 64 << 10;

/// How long a DoPut waits for room among the bytes in flight before it is refused.
pub const PUT_ROOM_WAIT: Duration = Duration::from_secs(30);

/// The reservations count in units of this many bytes (a semaphore counts in `u32`).
const UNIT: u64 = 1024;

/// The largest in-flight limit the accounting can hold: 4 TiB.
pub const MAX_IN_FLIGHT_LIMIT: u64 = UNIT * u32::MAX as u64;

/// The configured bounds on uploads (`--max-upload-cells`, `--max-upload-bytes-in-flight`,
/// `--max-upload-bytes-in-flight-per-upload`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UploadLimits {
    /// Most cells of one upload's grid; `add_tensor` refuses more.
    pub max_cells: u64,
    /// Most bytes of chunk DoPuts held at once by the server.
    pub max_bytes_in_flight: u64,
    /// Most bytes of chunk DoPuts held at once for one upload.
    pub max_bytes_in_flight_per_upload: u64,
    /// Most uploads held at once, discarded ones included until their names free
    /// (`upload_max_count`); `add_tensor` beyond it is refused.
    pub max_uploads: usize,
    /// Most upload stores open at once (`upload_open_stores`); each holds two descriptors.
    /// The least recently used idle one is closed beyond it and reopened on demand.
    pub open_stores: usize,
}

impl Default for UploadLimits {
    fn default() -> Self {
        UploadLimits {
            max_cells: DEFAULT_MAX_UPLOAD_CELLS,
            max_bytes_in_flight: DEFAULT_MAX_UPLOAD_BYTES_IN_FLIGHT,
            max_bytes_in_flight_per_upload: DEFAULT_MAX_UPLOAD_BYTES_IN_FLIGHT_PER_UPLOAD,
            max_uploads: super::DEFAULT_MAX_UPLOADS,
            open_stores: super::DEFAULT_OPEN_STORES,
        }
    }
}

/// The bytes in flight of one scope (the server, or one upload).
pub(super) struct InFlight {
    room: Arc<Semaphore>,
    limit: u64,
    /// What the limit is, for refusals (`the server`, `upload 'x'`).
    scope: &'static str,
    /// The setting that changes it.
    setting: &'static str,
}

/// A reservation of bytes in flight; released when dropped.
pub struct PutPermit {
    _permits: Vec<OwnedSemaphorePermit>,
}

impl InFlight {
    /// Room for `limit` bytes.
    pub(super) fn new(limit: u64, scope: &'static str, setting: &'static str) -> InFlight {
        let units = limit.min(MAX_IN_FLIGHT_LIMIT) / UNIT;
        InFlight {
            room: Arc::new(Semaphore::new(units as usize)),
            limit,
            scope,
            setting,
        }
    }

    /// Waits until `deadline` for room for `bytes` (all at once, in arrival order); refused
    /// when `bytes` is over the whole limit or no room was made in time (`wait` long).
    async fn reserve(
        &self,
        array_id: &str,
        bytes: u64,
        (deadline, wait): (Instant, Duration),
    ) -> Result<OwnedSemaphorePermit, UploadError> {
        let units = bytes.div_ceil(UNIT);
        let whole = self.limit / UNIT;
        let refuse = |waited| UploadError::InFlight {
            array_id: array_id.to_string(),
            chunk: bytes,
            scope: self.scope,
            limit: self.limit,
            setting: self.setting,
            waited,
        };
        let over = || refuse(None);
        let Ok(units32) = u32::try_from(units) else {
            return Err(over());
        };
        if units > whole {
            return Err(over());
        }
        match tokio::time::timeout_at(deadline, self.room.clone().acquire_many_owned(units32)).await
        {
            Ok(Ok(permit)) => Ok(permit),
            // The semaphore is never closed; a closed one gives no room either.
            Ok(Err(_)) => Err(over()),
            Err(_) => Err(refuse(Some(wait))),
        }
    }

    /// Bytes reserved now.
    #[cfg(test)]
    fn held(&self) -> u64 {
        let free = self.room.available_permits() as u64;
        (self.limit.min(MAX_IN_FLIGHT_LIMIT) / UNIT).saturating_sub(free) * UNIT
    }
}

/// Reserves `bytes` for a chunk of `array_id` in each scope, in order (the upload's first,
/// then the server's), waiting up to `wait` for both.
pub(super) async fn reserve(
    scopes: &[&InFlight],
    array_id: &str,
    bytes: u64,
    wait: Duration,
) -> Result<PutPermit, UploadError> {
    let deadline = Instant::now() + wait;
    let mut permits = Vec::with_capacity(scopes.len());
    for scope in scopes {
        permits.push(scope.reserve(array_id, bytes, (deadline, wait)).await?);
    }
    Ok(PutPermit { _permits: permits })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn reservations_wait_for_room_and_are_released_on_drop() {
        let server = InFlight::new(10 * UNIT, "the server", "--max-upload-bytes-in-flight");
        let first = reserve(&[&server], "u", 8 * UNIT, Duration::from_millis(10))
            .await
            .unwrap();
        assert_eq!(server.held(), 8 * UNIT);
        let refused = reserve(&[&server], "u", 4 * UNIT, Duration::from_millis(10)).await;
        assert!(matches!(
            refused,
            Err(UploadError::InFlight {
                waited: Some(_),
                ..
            })
        ));
        drop(first);
        assert_eq!(server.held(), 0);
        reserve(&[&server], "u", 4 * UNIT, Duration::from_millis(10))
            .await
            .unwrap();
        let whole = reserve(&[&server], "u", 11 * UNIT, Duration::from_secs(60)).await;
        assert!(matches!(
            whole,
            Err(UploadError::InFlight { waited: None, .. })
        ));
    }
}
